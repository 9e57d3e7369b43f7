"""SmolLM3 (llama.cpp's smollm3): a llama block (RoPE on adjacent pairs) in which every 4th layer
(il % 4 == 3) skips RoPE (llama.cpp's n_no_rope_layer_step, fixed at 4)."""

from __future__ import annotations

from .base import (ACT_SILU, ROPE_NORM, Keys, LayerConfig, ModelConfig, attn_scale_default, decoder_shape, rope_config,
                   rope_params)
from .llama import ATTENTION, DENSE, QKV_OPTIONAL

NAMES = ("smollm3",)
NO_ROPE_STEP = 4


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k)
    rope = rope_params(k)
    base = k.float("{arch}.rope.freq_base", 10000.0)
    layers = tuple(LayerConfig(is_swa=False, rope_base=base, rope_scale=rope["freq_scale"],
                               use_rope=(il + 1) % NO_ROPE_STEP != 0) for il in range(shape["n_layer"]))
    return ModelConfig(
        arch=arch,
        **shape,
        n_ctx_train=k.int("{arch}.context_length", 65536),
        rope_type=ROPE_NORM,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        act=ACT_SILU,
        attn_scale=attn_scale_default(shape["head_dim_k"]),
        layers=layers,
        **rope_config(rope),
        required_tensors=ATTENTION + DENSE,
        optional_tensors=QKV_OPTIONAL,
    )
