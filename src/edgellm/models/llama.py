"""Llama family: Llama 2/3.x, SmolLM2, TinyLlama, Mixtral (and GGUFs that call themselves so).

Pre-norm decoder: RMS norm -> attention (GQA, RoPE on adjacent pairs) -> residual, RMS norm ->
SwiGLU FFN (or routed experts) -> residual. Optional, as llama.cpp's loader reads them: fused
attn_qkv, q/k/v and output biases, FFN biases, rope_freqs (Llama 3 rope scaling baked into
per-dimension factors) or LongRoPE factors, linear / YaRN rope scaling, experts n_ff wide with
top-k weights renormalised (Mixtral; no shared expert: llama.cpp's llama loader reads none, so a
file with one is refused as having tensors llama does not use). granite (which adds a shared
expert) and mistral3 load the same tensors.
"""

from __future__ import annotations

from ..errors import GGUFError
from .base import (ACT_SILU, ROPE_NORM, Keys, ModelConfig, attn_scale_default, decoder_shape, moe_config, rope_config,
                   rope_params, uniform_layers)

NAMES = ("llama", "mistral")

ATTENTION = ("attn_norm", "wq", "wk", "wv", "wo")
QKV_OPTIONAL = ("wqkv", "bqkv", "bq", "bk", "bv")  # llama.cpp's create_tensor_qkv
DENSE = ("ffn_norm", "w_gate", "w_up", "w_down")
EXPERTS = ("ffn_norm", "w_gate_inp", "w_up_exps", "w_down_exps")
SHARED_EXPERT = ("w_gate_shexp", "w_up_shexp", "w_down_shexp")


def llama_tensors(moe, scaling: str) -> dict:
    """required / optional / global tensor roles of llama.cpp's llama loader (also granite's and
    mistral3's): dense layers with optional FFN biases, or experts with an optional gate and an
    optional shared expert; LongRoPE factors when the scaling type is longrope, else rope_freqs."""
    if moe is None:
        required, optional = ATTENTION + DENSE, QKV_OPTIONAL + ("bo", "b_gate", "b_up", "b_down")
    else:
        required = ATTENTION + EXPERTS + (SHARED_EXPERT if moe.n_ff_shexp else ())
        optional = QKV_OPTIONAL + ("bo", "w_gate_exps")
    glob = ("rope_long", "rope_short") if scaling == "longrope" else ("rope_freqs",)
    return dict(required_tensors=required, optional_tensors=optional, global_tensors=glob)


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k)
    if shape["n_rot"] != shape["head_dim_k"]:
        raise GGUFError(f"invalid n_rot: {shape['n_rot']}, expected {shape['head_dim_k']} "
                        f"({arch}.rope.dimension_count)")
    rope = rope_params(k)
    moe = moe_config(k, shape["n_layer"], shape["n_ff"], norm_topk=True, expert_width=shape["n_ff"], shared=False)
    return ModelConfig(
        arch=arch,
        **shape,
        n_ctx_train=k.int("{arch}.context_length", 4096),
        rope_type=ROPE_NORM,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        act=ACT_SILU,
        attn_scale=attn_scale_default(shape["head_dim_k"]),
        layers=uniform_layers(shape["n_layer"], k.float("{arch}.rope.freq_base", 10000.0), rope["freq_scale"]),
        **rope_config(rope),
        moe=moe,
        **llama_tensors(moe, rope["scaling"]),
    )
