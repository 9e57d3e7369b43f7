"""OLMo 2 (llama.cpp's olmo2, also OLMo 3): no norms before attention or FFN; RMS norms of the
whole q and k vectors (all heads at once) before RoPE on halves; post-attention and post-FFN norms
before each residual add; SwiGLU FFN; output.weight required. With attention.sliding_window set,
layers slide except every 4th (pattern 4, il % 4 == 3 global); sliding-window layers use plain RoPE
(rope.freq_base, no scaling, no YaRN), as llama.cpp's olmo2 graph."""

from __future__ import annotations

from .base import (ACT_SILU, QK_NORM_ALL, ROPE_NEOX, Keys, LayerConfig, ModelConfig, attn_scale_default, decoder_shape,
                   rope_config, rope_params, swa_pattern)
from .llama import QKV_OPTIONAL

NAMES = ("olmo2",)
REQUIRED_TENSORS = ("wq", "wk", "wv", "wo", "attn_q_norm", "attn_k_norm", "attn_post_norm", "w_gate", "w_up", "w_down",
                    "ffn_post_norm")


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k)
    n_layer = shape["n_layer"]
    rope = rope_params(k)
    base = k.float("{arch}.rope.freq_base", 10000.0)
    n_swa = k.int("{arch}.attention.sliding_window", 0)
    swa = swa_pattern(k, n_layer, 4) if n_swa > 0 else (False,) * n_layer
    layers = tuple(LayerConfig(is_swa=s, rope_base=base, rope_scale=1.0 if s else rope["freq_scale"], rope_yarn=not s)
                   for s in swa)
    return ModelConfig(
        arch=arch,
        **shape,
        n_ctx_train=k.int("{arch}.context_length", 4096),
        rope_type=ROPE_NEOX,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        act=ACT_SILU,
        attn_scale=attn_scale_default(shape["head_dim_k"]),
        layers=layers,
        n_swa=n_swa if any(swa) else 0,
        **rope_config(rope),
        qk_norm=QK_NORM_ALL,
        output="required",
        required_tensors=REQUIRED_TENSORS,
        optional_tensors=QKV_OPTIONAL,
    )
