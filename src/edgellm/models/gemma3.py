"""Gemma 3 (text): interleaved sliding-window and global attention layers.

Per layer: RMS norm -> attention with RMS-normed q and k per head, RoPE on halves (rope.freq_base_swa,
default 10k, unscaled on sliding-window layers; rope.freq_base and the rope scaling on global ones),
q scaled by 1/sqrt(head_dim) -> post-attention norm -> residual; RMS norm -> GELU(tanh)-gated FFN ->
post-FFN norm -> residual. Embeddings are scaled by sqrt(n_embd); the output projection is tied to
the embeddings when `output.weight` is absent. With a sliding window, layer il is global when
il % pattern == pattern - 1 (pattern 6 by default). (Facts from llama.cpp's gemma3 loader and graph.)
"""

from __future__ import annotations

from .base import (ACT_GELU_TANH, ROPE_NEOX, Keys, LayerConfig, ModelConfig, decoder_shape, inv_sqrt_f32,
                   rope_config, rope_params, sqrt_f32, swa_pattern)
from .llama import QKV_OPTIONAL

NAMES = ("gemma3",)
REQUIRED_TENSORS = ("attn_norm", "wq", "wk", "wv", "wo", "attn_q_norm", "attn_k_norm", "attn_post_norm",
                    "ffn_norm", "w_gate", "w_up", "w_down", "ffn_post_norm")


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k)
    n_layer, n_embd, n_head = shape["n_layer"], shape["n_embd"], shape["n_head"]
    n_swa = k.int("{arch}.attention.sliding_window", 0)
    rope = rope_params(k)
    base = k.float("{arch}.rope.freq_base", 10000.0)
    base_swa = k.float("{arch}.rope.freq_base_swa", 10000.0)
    swa = swa_pattern(k, n_layer, 6) if n_swa > 0 else (False,) * n_layer
    layers = tuple(LayerConfig(is_swa=s, rope_base=base_swa if s else base, rope_scale=1.0 if s else rope["freq_scale"])
                   for s in swa)
    # 27B scales queries by 1/sqrt(n_embd / n_head); the others by 1/sqrt(head_dim). Applied to q
    # (not the scores) as llama.cpp's graph does, which matters where q * scale rounds to f16.
    scale = inv_sqrt_f32(n_embd // n_head if n_layer == 62 else shape["head_dim_k"])
    return ModelConfig(
        arch=arch,
        **shape,
        n_ctx_train=k.int("{arch}.context_length", 32768),
        rope_type=ROPE_NEOX,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        act=ACT_GELU_TANH,
        attn_scale=1.0,
        q_scale=scale,
        layers=layers,
        n_swa=n_swa if any(swa) else 0,
        embd_scale=sqrt_f32(n_embd),
        final_softcap=k.float("{arch}.final_logit_softcapping", 0.0),
        **rope_config(rope),
        required_tensors=REQUIRED_TENSORS,
        optional_tensors=QKV_OPTIONAL,
    )
