"""Mistral 3 text models (llama.cpp's mistral3: Ministral 3, Mistral Small 3.x): llama's tensors
and block, with YaRN's beta_fast / beta_slow and mscale ratio (rope.scaling.yarn_log_multiplier)
read from the file, and optional attention temperature (attention.temperature_scale): q of the
token at position p multiplied by 1 + scale * log(floor(p / n_ctx_orig) + 1)."""

from __future__ import annotations

from ..errors import GGUFError
from .base import (ACT_SILU, ROPE_NORM, Keys, ModelConfig, attn_scale_default, decoder_shape, moe_config, rope_config,
                   rope_params, uniform_layers)
from .llama import llama_tensors

NAMES = ("mistral3",)


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k)
    rope = rope_params(k, yarn_betas=True, yarn_log_mul=True)
    temp = k.float("{arch}.attention.temperature_scale", 0.0)
    if temp and not rope["n_ctx_orig"]:
        raise GGUFError(f"{arch}.attention.temperature_scale needs the original context length "
                        f"({arch}.rope.scaling.original_context_length or {arch}.context_length)")
    # llama.cpp's mistral3 loader: experts n_ff wide, no shared expert, as llama's
    moe = moe_config(k, shape["n_layer"], shape["n_ff"], norm_topk=True, expert_width=shape["n_ff"], shared=False)
    return ModelConfig(
        arch=arch,
        **shape,
        n_ctx_train=k.int("{arch}.context_length", 32768),
        rope_type=ROPE_NORM,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        act=ACT_SILU,
        attn_scale=attn_scale_default(shape["head_dim_k"]),
        layers=uniform_layers(shape["n_layer"], k.float("{arch}.rope.freq_base", 10000.0), rope["freq_scale"]),
        **rope_config(rope),
        attn_temp_scale=temp,
        attn_temp_floor=rope["n_ctx_orig"] if temp else 0,
        moe=moe,
        **llama_tensors(moe, rope["scaling"]),
    )
