"""Gemma 2 (llama.cpp's gemma2): Gemma 3's block without q/k norms: embeddings scaled by
sqrt(n_embd); alternating sliding-window (window default 4096, even layers: pattern 2) and global
layers, both with rope.freq_base unless rope.freq_base_swa is set; q scaled by 1/sqrt(head_dim)
(27B: 1/sqrt(n_embd / n_head)); attention scores soft-capped at attn_logit_softcapping (default 50)
and the logits at final_logit_softcapping (default 30, always); post-attention and post-FFN norms;
GELU-gated FFN. The output is always the embedding matrix (an output.weight is not used)."""

from __future__ import annotations

from .base import (ACT_GELU_TANH, ROPE_NEOX, Keys, LayerConfig, ModelConfig, decoder_shape, inv_sqrt_f32,
                   rope_config, rope_params, sqrt_f32, swa_pattern)
from .llama import QKV_OPTIONAL

NAMES = ("gemma2",)
REQUIRED_TENSORS = ("attn_norm", "wq", "wk", "wv", "wo", "attn_post_norm", "ffn_norm", "w_gate", "w_up", "w_down",
                    "ffn_post_norm")


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k)
    n_layer, n_embd, n_head = shape["n_layer"], shape["n_embd"], shape["n_head"]
    rope = rope_params(k)
    base = k.float("{arch}.rope.freq_base", 10000.0)
    base_swa = k.float("{arch}.rope.freq_base_swa", base)
    swa = swa_pattern(k, n_layer, 2)
    layers = tuple(LayerConfig(is_swa=s, rope_base=base_swa if s else base, rope_scale=rope["freq_scale"]) for s in swa)
    scale = inv_sqrt_f32(n_embd // n_head if n_layer == 46 else shape["head_dim_k"])
    return ModelConfig(
        arch=arch,
        **shape,
        n_ctx_train=k.int("{arch}.context_length", 8192),
        rope_type=ROPE_NEOX,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        act=ACT_GELU_TANH,
        attn_scale=1.0,
        q_scale=scale,
        layers=layers,
        n_swa=k.int("{arch}.attention.sliding_window", 4096) if any(swa) else 0,
        embd_scale=sqrt_f32(n_embd),
        attn_softcap=k.float("{arch}.attn_logit_softcapping", 50.0),
        final_softcap=k.float("{arch}.final_logit_softcapping", 30.0),
        **rope_config(rope),
        output="tied",
        required_tensors=REQUIRED_TENSORS,
        optional_tensors=QKV_OPTIONAL,
    )
