"""Llama family: Llama 2/3.x, SmolLM2, TinyLlama, Mistral (and GGUFs that call themselves so).

Pre-norm decoder: RMS norm -> attention (GQA, RoPE on adjacent pairs) -> residual, RMS norm ->
SwiGLU FFN -> residual. Optional: attention biases, rope_freqs (Llama 3 rope scaling baked into
per-dimension factors), linear / YaRN rope scaling.
"""

from __future__ import annotations

from .base import (ACT_SILU, ROPE_NORM, Keys, LayerConfig, ModelConfig, attn_scale_default, decoder_shape,
                   rope_scaling)

NAMES = ("llama", "mistral")
REQUIRED_TENSORS = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k)
    base = k.float("{arch}.rope.freq_base", 10000.0)
    typ, factor, n_orig = rope_scaling(k)
    layer = LayerConfig(is_swa=False, rope_base=base, rope_scale=1.0 / factor)
    return ModelConfig(
        arch=arch,
        **shape,
        n_ctx_train=k.int("{arch}.context_length", 4096),
        rope_type=ROPE_NORM,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        act=ACT_SILU,
        attn_scale=attn_scale_default(shape["head_dim_k"]),
        layers=(layer,) * shape["n_layer"],
        yarn_ext_factor=1.0 if typ == "yarn" else 0.0,
        yarn_attn_factor=k.float("{arch}.rope.scaling.attn_factor", 1.0),
        n_ctx_orig=n_orig,
        required_tensors=REQUIRED_TENSORS,
    )
