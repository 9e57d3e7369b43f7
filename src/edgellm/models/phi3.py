"""Phi-3 / Phi-3.5 / Phi-4-mini (llama.cpp's phi3): fused attn_qkv (or separate q/k/v), RoPE on
halves with LongRoPE - per-dimension factors rope_factors_long when the context exceeds the original
one (rope.scaling.original_context_length), rope_factors_short otherwise, and the attention factor
rope.scaling.attn_factor on cos/sin - q scaled by 1/sqrt(head_dim); a fused gate/up FFN (ffn_up of
2 * n_ff rows, SiLU of the first half times the second). llama.cpp reads
attention.sliding_window but turns the window off (all layers global); so does edgellm."""

from __future__ import annotations

from .base import (ACT_SILU, ROPE_NEOX, Keys, ModelConfig, decoder_shape, inv_sqrt_f32, rope_config, rope_params,
                   uniform_layers)

NAMES = ("phi3",)


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k)
    rope = rope_params(k)
    k.int("{arch}.attention.sliding_window", 0)  # read (and checked) as llama.cpp does, then not used
    return ModelConfig(
        arch=arch,
        **shape,
        n_ctx_train=k.int("{arch}.context_length", 4096),
        rope_type=ROPE_NEOX,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        act=ACT_SILU,
        attn_scale=1.0,
        q_scale=inv_sqrt_f32(shape["head_dim_k"]),
        layers=uniform_layers(shape["n_layer"], k.float("{arch}.rope.freq_base", 10000.0), rope["freq_scale"]),
        **rope_config(rope),
        fused_gate_up=True,
        required_tensors=("attn_norm", "wo", "ffn_norm", "w_up", "w_down"),
        optional_tensors=("wqkv", "bqkv", "wq", "wk", "wv", "bq", "bk", "bv"),
        global_tensors=("rope_long", "rope_short"),
    )
