"""IBM Granite 3.x (llama.cpp's granite): llama's tensors with four multipliers - embeddings times
embedding_scale, attention and FFN outputs times residual_scale before each residual add, scores
times attention.scale (default 1/sqrt(head_dim)), logits divided by logit_scale (required); RoPE
on every layer unless rope.scaling.finetuned is false (then on none). Experts as llama's (n_ff
wide), with an ungated shared expert of expert_shared_feed_forward_length. granitemoe (Granite 3.x
MoE) is the same model to llama.cpp's loader, but for rope.scaling.finetuned, which it does not read."""

from __future__ import annotations

import numpy as np

from ..errors import GGUFError
from .base import (ACT_SILU, REQUIRED, ROPE_NORM, Keys, ModelConfig, attn_scale_default, decoder_shape, moe_config,
                   rope_config, rope_params, uniform_layers)
from .llama import llama_tensors

NAMES = ("granite", "granitemoe")


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k)
    rope = rope_params(k)
    logit_scale = k.float("{arch}.logit_scale", REQUIRED)
    if logit_scale == 0.0:
        raise GGUFError(f"{arch}.logit_scale must not be 0")
    if k.raw("{arch}.deepstack_mapping") is not None:
        raise GGUFError(f"{arch}.deepstack_mapping (Granite Vision) is not supported")
    moe = moe_config(k, shape["n_layer"], shape["n_ff"], norm_topk=True, expert_width=shape["n_ff"])
    return ModelConfig(
        arch=arch,
        **shape,
        n_ctx_train=k.int("{arch}.context_length", 4096),
        rope_type=ROPE_NORM,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        act=ACT_SILU,
        attn_scale=k.float("{arch}.attention.scale", 0.0) or attn_scale_default(shape["head_dim_k"]),
        layers=uniform_layers(shape["n_layer"], k.float("{arch}.rope.freq_base", 10000.0), rope["freq_scale"],
                              use_rope=arch != "granite" or k.bool("{arch}.rope.scaling.finetuned", True)),
        **rope_config(rope),
        embd_scale=k.float("{arch}.embedding_scale", 0.0) or 1.0,
        residual_scale=k.float("{arch}.residual_scale", 0.0) or 1.0,
        logit_scale=float(np.float32(1.0) / np.float32(logit_scale)),
        moe=moe,
        **llama_tensors(moe, rope["scaling"]),
    )
