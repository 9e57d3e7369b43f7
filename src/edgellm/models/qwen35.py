"""Qwen 3.5 (dense; llama.cpp's qwen35): a hybrid of gated DeltaNet linear-attention layers and, every
full_attention_interval-th layer (default 4: layers 3, 7, ...; or as attention.recurrent_layers flags
them), full attention. Facts from llama.cpp's loader and graph (src/models/qwen35.cpp,
delta-net-base.cpp):

- every layer: RMS norm (attn_norm) -> mixer -> residual; RMS norm (post_attention_norm.weight, which
  is the FFN's pre-norm) -> SwiGLU FFN -> residual. The output is tied to token_embd when absent.
- full attention: attn_q gives each head's q then its output gate (2 x head_dim per head); q and k
  RMS-normed per head; RoPE on halves over rope.dimension_count dims (multi-section "imrope", which
  for text positions - the same position in every section - rotates as plain NeoX RoPE); scores
  scaled by 1/sqrt(head_dim); the heads' output times sigmoid(gate), then attn_output.
- DeltaNet layers: models.base.DeltaNetConfig.
- nextn_predict_layers blocks after the trunk (the multi-token-prediction head) are not run.
"""

from __future__ import annotations

from ..errors import GGUFError, UnsupportedModelError
from .base import (ACT_SILU, REQUIRED, ROPE_NEOX, DeltaNetConfig, Keys, LayerConfig, ModelConfig, attn_scale_default,
                   decoder_shape, positive, rope_config, rope_params)

NAMES = ("qwen35",)
ATTENTION = ("attn_norm", "wq", "wk", "wv", "wo", "attn_q_norm", "attn_k_norm")
FFN = ("ffn_norm", "w_gate", "w_up", "w_down")
DELTA_NET = ("attn_norm", "ssm_in", "ssm_gate", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_beta", "ssm_alpha",
             "ssm_norm", "ssm_out")
QKV_OPTIONAL = ("wqkv", "bqkv", "bq", "bk", "bv")  # llama.cpp's create_tensor_qkv
FULL_ATTENTION_INTERVAL = 4  # llama.cpp's default


def recurrent_layers(k: Keys, n_layer: int, n_layer_all: int) -> tuple[bool, ...]:
    """Which trunk layers are DeltaNet: {arch}.attention.recurrent_layers (one flag per block), else
    all but every full_attention_interval-th."""
    flags = k.raw("{arch}.attention.recurrent_layers")
    if flags is not None:
        if isinstance(flags, (str, bytes)) or not hasattr(flags, "__len__") or len(flags) != n_layer_all:
            raise GGUFError(f"{k.arch}.attention.recurrent_layers must have one flag per block ({n_layer_all})")
        return tuple(bool(f) for f in flags[:n_layer])
    n = positive("full_attention_interval", k.int("{arch}.full_attention_interval", FULL_ATTENTION_INTERVAL))
    return tuple((i + 1) % n != 0 for i in range(n_layer))


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    shape = decoder_shape(gguf, k)
    n_all = shape["n_layer"]
    n_nextn = k.int("{arch}.nextn_predict_layers", 0)
    if not 0 <= n_nextn < n_all:
        raise GGUFError(f"{arch}.nextn_predict_layers is {n_nextn}, for {n_all} blocks")
    if n_nextn and "blk.0.attn_norm.weight" not in gguf.tensors:
        raise UnsupportedModelError(f"{arch}: the file holds only the multi-token-prediction head, not the model")
    n_layer = n_all - n_nextn
    if shape["head_dim_k"] != shape["head_dim_v"]:
        raise GGUFError(f"{arch}: attention key and value head sizes differ ({shape['head_dim_k']} and "
                        f"{shape['head_dim_v']})")
    sections = k.raw("{arch}.rope.dimension_sections")
    if sections is None:
        raise GGUFError(f"required metadata key '{arch}.rope.dimension_sections' is missing")
    sections = [int(x) for x in (sections if hasattr(sections, "__len__") else [sections])]
    if len(sections) > 4 or not any(sections[:3]) or sum(sections) > shape["head_dim_k"]:
        raise GGUFError(f"{arch}.rope.dimension_sections {sections} do not fit heads of {shape['head_dim_k']}")
    dn = DeltaNetConfig(
        d_conv=positive("ssm.conv_kernel", k.int("{arch}.ssm.conv_kernel", REQUIRED)),
        d_state=positive("ssm.state_size", k.int("{arch}.ssm.state_size", REQUIRED)),
        n_k_heads=positive("ssm.group_count", k.int("{arch}.ssm.group_count", REQUIRED)),
        n_v_heads=positive("ssm.time_step_rank", k.int("{arch}.ssm.time_step_rank", REQUIRED)))
    d_inner = positive("ssm.inner_size", k.int("{arch}.ssm.inner_size", REQUIRED))
    if d_inner != dn.d_inner:
        raise GGUFError(f"{arch}.ssm.inner_size is {d_inner}, not ssm.state_size x ssm.time_step_rank "
                        f"({dn.d_state} x {dn.n_v_heads})")
    if dn.n_v_heads % dn.n_k_heads:
        raise GGUFError(f"{arch}.ssm.time_step_rank ({dn.n_v_heads}) is not a multiple of ssm.group_count "
                        f"({dn.n_k_heads})")
    rope = rope_params(k)
    base = k.float("{arch}.rope.freq_base", 10000.0)
    layers = tuple(LayerConfig(is_swa=False, rope_base=base, rope_scale=rope["freq_scale"], recurrent=r)
                   for r in recurrent_layers(k, n_layer, n_all))
    return ModelConfig(
        arch=arch,
        **{**shape, "n_layer": n_layer},
        n_ctx_train=k.int("{arch}.context_length", 32768),
        rope_type=ROPE_NEOX,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", REQUIRED),
        act=ACT_SILU,
        attn_scale=attn_scale_default(shape["head_dim_k"]),
        layers=layers,
        **rope_config(rope),
        attn_out_gate=True,
        delta_net=dn,
        required_tensors=ATTENTION + FFN,
        optional_tensors=QKV_OPTIONAL,
        recurrent_tensors=DELTA_NET + FFN,
        role_names=(("ffn_norm", "post_attention_norm.weight"),),
        n_layer_skip=n_nextn,
        extra={"rope_sections": tuple(sections)},
    )
