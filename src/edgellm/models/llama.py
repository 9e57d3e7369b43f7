"""Llama family: Llama 2/3.x, SmolLM2, TinyLlama, Mistral (and GGUFs that call themselves so).

Pre-norm decoder: RMS norm -> attention (GQA, RoPE on adjacent pairs) -> residual, RMS norm ->
SwiGLU FFN -> residual. Optional: attention biases, rope_freqs (Llama 3 rope scaling baked into
per-dimension factors), linear / YaRN rope scaling.
"""

from __future__ import annotations

from .base import (ACT_SILU, REQUIRED, ROPE_NORM, Keys, LayerConfig, ModelConfig, attn_scale_default,
                   check_head_counts, n_vocab_of, positive, rope_scaling)

NAMES = ("llama", "mistral")
REQUIRED_TENSORS = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    check_head_counts(k)
    n_embd = positive("n_embd", k.int("{arch}.embedding_length", REQUIRED))
    n_head = positive("n_head", k.int("{arch}.attention.head_count", REQUIRED))
    n_head_kv = positive("n_head_kv", k.int("{arch}.attention.head_count_kv", n_head))
    head_dim = positive("head_dim", k.int("{arch}.attention.key_length", n_embd // n_head))
    n_layer = positive("n_layer", k.int("{arch}.block_count", REQUIRED))
    base = k.float("{arch}.rope.freq_base", 10000.0)
    typ, factor, n_orig = rope_scaling(k)
    layer = LayerConfig(is_swa=False, rope_base=base, rope_scale=1.0 / factor)
    return ModelConfig(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim,
        head_dim_v=positive("head_dim_v", k.int("{arch}.attention.value_length", head_dim)),
        n_ff=positive("n_ff", k.int("{arch}.feed_forward_length", REQUIRED)),
        n_vocab=n_vocab_of(gguf, k),
        n_ctx_train=k.int("{arch}.context_length", 4096),
        n_rot=k.int("{arch}.rope.dimension_count", head_dim),
        rope_type=ROPE_NORM,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        act=ACT_SILU,
        attn_scale=attn_scale_default(head_dim),
        layers=(layer,) * n_layer,
        yarn_ext_factor=1.0 if typ == "yarn" else 0.0,
        yarn_attn_factor=k.float("{arch}.rope.scaling.attn_factor", 1.0),
        n_ctx_orig=n_orig,
        required_tensors=REQUIRED_TENSORS,
    )
