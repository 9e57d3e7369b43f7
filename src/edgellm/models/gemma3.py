"""Gemma 3 (text): interleaved sliding-window and global attention layers.

Per layer: RMS norm -> attention with RMS-normed q and k per head, RoPE on halves (base 10k on
local layers, rope.freq_base on global ones), q scaled by 1/sqrt(head_dim) -> post-attention
norm -> residual; RMS norm -> GELU(tanh)-gated FFN -> post-FFN norm -> residual. Embeddings are
scaled by sqrt(n_embd); the output projection is tied to the embeddings when `output.weight`
is absent. Layer il is global when il % pattern == pattern - 1 (pattern 6 by default).
(Facts from llama.cpp's gemma3 graph and hparams loading.)
"""

from __future__ import annotations

import math

from ..errors import GGUFError
from .base import ACT_GELU_TANH, ROPE_NEOX, Keys, LayerConfig, ModelConfig, decoder_shape, rope_scaling

NAMES = ("gemma3",)
REQUIRED_TENSORS = ("attn_norm", "wq", "wk", "wv", "wo", "attn_q_norm", "attn_k_norm", "attn_post_norm",
                    "ffn_norm", "w_gate", "w_up", "w_down", "ffn_post_norm")


def _swa_layers(k: Keys, n_layer: int, n_swa: int) -> tuple[bool, ...]:
    if n_swa <= 0:
        return (False,) * n_layer
    pat = k.raw("{arch}.attention.sliding_window_pattern", 6)
    if hasattr(pat, "__len__") and not isinstance(pat, str):
        if len(pat) != n_layer:
            raise GGUFError(f"{k.arch}.attention.sliding_window_pattern has {len(pat)} entries for {n_layer} layers")
        return tuple(bool(x) for x in pat)
    n = int(pat)
    return tuple(n == 0 or (il % n) < n - 1 for il in range(n_layer))


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k)
    n_layer, n_embd, n_head = shape["n_layer"], shape["n_embd"], shape["n_head"]
    n_swa = k.int("{arch}.attention.sliding_window", 0)
    typ, factor, n_orig = rope_scaling(k)
    base = k.float("{arch}.rope.freq_base", 1000000.0)
    base_swa = k.float("{arch}.rope.freq_base_swa", 10000.0)
    swa = _swa_layers(k, n_layer, n_swa)
    layers = tuple(LayerConfig(is_swa=s, rope_base=base_swa if s else base, rope_scale=1.0 if s else 1.0 / factor)
                   for s in swa)
    # 27B scales queries by 1/sqrt(n_embd / n_head); the others by 1/sqrt(head_dim). Applied to q
    # (not the scores) as llama.cpp's graph does, which matters where q * scale rounds to f16.
    scale = 1.0 / math.sqrt(n_embd / n_head if n_layer == 62 else shape["head_dim_k"])
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
        n_swa=n_swa,
        embd_scale=math.sqrt(n_embd),
        final_softcap=k.float("{arch}.final_logit_softcapping", 0.0),
        yarn_ext_factor=1.0 if typ == "yarn" else 0.0,
        n_ctx_orig=n_orig,
        required_tensors=REQUIRED_TENSORS,
    )
