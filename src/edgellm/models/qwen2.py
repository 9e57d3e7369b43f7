"""Qwen 2 / 2.5 (llama.cpp's qwen2): a llama block with RoPE on halves and, as the files have
them, biases on q, k and v (or a fused attn_qkv with its bias); optional output bias."""

from __future__ import annotations

from .base import (ACT_SILU, ROPE_NEOX, Keys, ModelConfig, attn_scale_default, decoder_shape, rope_config, rope_params,
                   uniform_layers)
from .llama import ATTENTION, DENSE, QKV_OPTIONAL

NAMES = ("qwen2",)


def attention_config(gguf, arch: str, *, need_ff: bool = True) -> dict:
    """What the Qwen architectures share: shapes, RoPE on halves, 1/sqrt(head_dim) scores."""
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k, need_ff=need_ff)
    rope = rope_params(k)
    return dict(
        arch=arch,
        **shape,
        n_ctx_train=k.int("{arch}.context_length", 32768),
        rope_type=ROPE_NEOX,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        act=ACT_SILU,
        attn_scale=attn_scale_default(shape["head_dim_k"]),
        layers=uniform_layers(shape["n_layer"], k.float("{arch}.rope.freq_base", 10000.0), rope["freq_scale"]),
        **rope_config(rope),
    )


def load_config(gguf, arch: str) -> ModelConfig:
    return ModelConfig(**attention_config(gguf, arch), required_tensors=ATTENTION + DENSE,
                       optional_tensors=QKV_OPTIONAL, global_tensors=("output_bias",))
