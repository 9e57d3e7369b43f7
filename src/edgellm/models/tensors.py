"""Binding a file's tensors to a config: the table of tensor roles (GGUF name, shape, kind), and
`bind_weights`, which checks every tensor a config needs is there with its shape and a type edgellm
runs, and that the file has no tensor the architecture does not use (llama.cpp refuses those too).

Names and shapes follow llama.cpp's loader (llama-arch.cpp, llama-model.cpp): shapes in ggml order,
shape[0] the row length, e.g. attn_q {n_embd, n_head * head_dim}.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import GGUFError, UnsupportedModelError
from ..quants import TYPES, QType, type_name
from .base import QK_NORM_ALL, LayerConfig, ModelConfig


@dataclass(frozen=True)
class Role:
    name: str                                 # GGUF name; layer roles after "blk.{i}."
    shape: Callable[[dict], tuple[int, ...]]  # from dims()
    f32: bool = False                         # a norm / bias vector: must be F32


def dims(cfg: ModelConfig, layer: LayerConfig | None = None) -> dict[str, int]:
    """The sizes tensor shapes are made of, for one layer (its own sizes, LayerConfig.sizes) or the model."""
    hk, hv, n_kv, n_ff, _ = (layer or LayerConfig(False, 0.0, 1.0)).sizes(cfg)
    qd, kd = cfg.n_head * hk, n_kv * hk
    vd, od = n_kv * hv, cfg.n_head * hv
    moe, dn = cfg.moe, cfg.delta_net
    return dict(E=cfg.n_embd, F=n_ff, qd=qd, kd=kd, vd=vd, od=od, V=cfg.n_vocab, R=cfg.n_rot // 2,
                qw=2 * qd if cfg.attn_out_gate else qd,  # attn_q's rows: q, or q and the output gate
                CD=dn.conv_dim if dn else 0, VI=dn.d_inner if dn else 0, HV=dn.n_v_heads if dn else 0,
                SK=dn.d_state if dn else 0, KC=dn.d_conv if dn else 0,
                qn=qd if cfg.qk_norm == QK_NORM_ALL else hk,
                kn=kd if cfg.qk_norm == QK_NORM_ALL else hk,
                up=2 * n_ff if cfg.fused_gate_up else n_ff,
                X=moe.n_expert if moe else 0, FX=moe.n_ff_exp if moe else 0, FS=moe.n_ff_shexp if moe else 0,
                P=cfg.n_embd_per_layer, LP=cfg.n_layer * cfg.n_embd_per_layer)


# per-layer roles: field -> role (the name after "blk.{i}.")
LAYER_ROLES: dict[str, Role] = {
    "attn_norm": Role("attn_norm.weight", lambda d: (d["E"],), True),
    "wq": Role("attn_q.weight", lambda d: (d["E"], d["qw"])),
    "wk": Role("attn_k.weight", lambda d: (d["E"], d["kd"])),
    "wv": Role("attn_v.weight", lambda d: (d["E"], d["vd"])),
    "wqkv": Role("attn_qkv.weight", lambda d: (d["E"], d["qw"] + d["kd"] + d["vd"])),
    "wo": Role("attn_output.weight", lambda d: (d["od"], d["E"])),
    "bq": Role("attn_q.bias", lambda d: (d["qw"],), True),
    "bk": Role("attn_k.bias", lambda d: (d["kd"],), True),
    "bv": Role("attn_v.bias", lambda d: (d["vd"],), True),
    "bqkv": Role("attn_qkv.bias", lambda d: (d["qw"] + d["kd"] + d["vd"],), True),
    "bo": Role("attn_output.bias", lambda d: (d["E"],), True),
    "attn_q_norm": Role("attn_q_norm.weight", lambda d: (d["qn"],), True),
    "attn_k_norm": Role("attn_k_norm.weight", lambda d: (d["kn"],), True),
    "attn_post_norm": Role("post_attention_norm.weight", lambda d: (d["E"],), True),
    "ffn_norm": Role("ffn_norm.weight", lambda d: (d["E"],), True),
    "w_gate": Role("ffn_gate.weight", lambda d: (d["E"], d["F"])),
    "w_up": Role("ffn_up.weight", lambda d: (d["E"], d["up"])),
    "w_down": Role("ffn_down.weight", lambda d: (d["F"], d["E"])),
    "b_gate": Role("ffn_gate.bias", lambda d: (d["F"],), True),
    "b_up": Role("ffn_up.bias", lambda d: (d["F"],), True),
    "b_down": Role("ffn_down.bias", lambda d: (d["E"],), True),
    "ffn_post_norm": Role("post_ffw_norm.weight", lambda d: (d["E"],), True),
    # routed experts: the router, then each expert's matrices stacked along the last dimension
    "w_gate_inp": Role("ffn_gate_inp.weight", lambda d: (d["E"], d["X"])),
    "w_gate_exps": Role("ffn_gate_exps.weight", lambda d: (d["E"], d["FX"], d["X"])),
    "w_up_exps": Role("ffn_up_exps.weight", lambda d: (d["E"], d["FX"], d["X"])),
    "w_down_exps": Role("ffn_down_exps.weight", lambda d: (d["FX"], d["E"], d["X"])),
    # the shared expert and its gate (one row: a scalar per token)
    "w_gate_inp_shexp": Role("ffn_gate_inp_shexp.weight", lambda d: (d["E"],), True),
    "w_gate_shexp": Role("ffn_gate_shexp.weight", lambda d: (d["E"], d["FS"])),
    "w_up_shexp": Role("ffn_up_shexp.weight", lambda d: (d["E"], d["FS"])),
    "w_down_shexp": Role("ffn_down_shexp.weight", lambda d: (d["FS"], d["E"])),
    # a scalar the layer's output is multiplied by (gemma4)
    "out_scale": Role("layer_output_scale.weight", lambda d: (1,), True),
    # per-layer input embeddings (gemma4): gate from the residual, projection back, its norm
    "ple_gate": Role("inp_gate.weight", lambda d: (d["E"], d["P"])),
    "ple_proj": Role("proj.weight", lambda d: (d["P"], d["E"])),
    "ple_post_norm": Role("post_norm.weight", lambda d: (d["E"],), True),
    # gated DeltaNet layers (models.base.DeltaNetConfig; llama.cpp's qwen35 loader)
    "ssm_in": Role("attn_qkv.weight", lambda d: (d["E"], d["CD"])),       # q, k, v before the conv
    "ssm_gate": Role("attn_gate.weight", lambda d: (d["E"], d["VI"])),    # z, the output norm's gate
    "ssm_conv1d": Role("ssm_conv1d.weight", lambda d: (d["KC"], d["CD"]), True),
    "ssm_dt": Role("ssm_dt.bias", lambda d: (d["HV"],), True),
    "ssm_a": Role("ssm_a", lambda d: (d["HV"],), True),                   # -exp(A_log), per v head
    "ssm_beta": Role("ssm_beta.weight", lambda d: (d["E"], d["HV"])),
    "ssm_alpha": Role("ssm_alpha.weight", lambda d: (d["E"], d["HV"])),
    "ssm_norm": Role("ssm_norm.weight", lambda d: (d["SK"],), True),
    "ssm_out": Role("ssm_out.weight", lambda d: (d["VI"], d["E"])),
}

# roles a fused tensor stands in for (llama.cpp's create_tensor_qkv)
FUSED = {"wqkv": ("wq", "wk", "wv"), "bqkv": ("bq", "bk", "bv")}

# The tensor fields of the C engine's layer descriptor (el_layer in csrc/api/engine.h), which
# kernels/cengine.py fills by these names; the engines refuse, by feature, models that need others.
LAYER_TENSORS = {f: LAYER_ROLES[f].name for f in (
    "attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "attn_q_norm", "attn_k_norm", "attn_post_norm",
    "ffn_norm", "w_gate", "w_up", "w_down", "ffn_post_norm", "w_gate_inp", "w_gate_exps", "w_up_exps", "w_down_exps",
    "w_gate_inp_shexp", "w_gate_shexp", "w_up_shexp", "w_down_shexp")}

# ... and its gated DeltaNet fields (layers with LayerConfig.recurrent)
DELTA_NET_TENSORS = ("ssm_in", "ssm_gate", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_beta", "ssm_alpha", "ssm_norm",
                     "ssm_out")


@dataclass(frozen=True)
class Part:
    """Rows [start, start + count) of a matrix, or elements of a vector (count None: all of it):
    what an engine multiplies by for one projection, a fused tensor's slice or a whole tensor."""

    info: Any
    start: int = 0
    count: int | None = None

    def rows(self, raw):
        """The part of raw, the tensor's uint8 [rows, row_bytes] (a vector: one row of values)."""
        if self.count is None:
            return raw
        if raw.shape[0] == 1 and len(self.info.shape) == 1:  # a vector: slice its f32 values
            return raw[:, 4 * self.start:4 * (self.start + self.count)]
        return raw[self.start:self.start + self.count]


def engine_tensors(cfg: ModelConfig, layer: dict[str, Any]) -> dict[str, Part | None]:
    """A bound layer's LAYER_TENSORS fields as the engines read them: a fused attn_qkv (and its
    bias) becomes its q, k and v rows, a fused gate/up ffn_up its two halves (gate first)."""
    d = dims(cfg)
    out = {f: None if layer[f] is None else Part(layer[f]) for f in LAYER_TENSORS}
    for w, b in (("wqkv", "bqkv"),):
        if layer[w] is None:
            continue
        starts = (0, d["qw"], d["qw"] + d["kd"])
        for fld, start, count in zip(FUSED[w], starts, (d["qw"], d["kd"], d["vd"])):
            out[fld] = Part(layer[w], start, count)
        if layer[b] is not None:
            for fld, start, count in zip(FUSED[b], starts, (d["qw"], d["kd"], d["vd"])):
                out[fld] = Part(layer[b], start, count)
    if cfg.fused_gate_up:
        out["w_gate"] = Part(layer["w_up"], 0, cfg.n_ff)
        out["w_up"] = Part(layer["w_up"], cfg.n_ff, cfg.n_ff)
    return out


# global roles besides token_embd, output_norm and output
GLOBAL_ROLES: dict[str, Role] = {
    "output_bias": Role("output.bias", lambda d: (d["V"],), True),
    "rope_freqs": Role("rope_freqs.weight", lambda d: (d["R"],), True),
    "rope_long": Role("rope_factors_long.weight", lambda d: (d["R"],), True),
    "rope_short": Role("rope_factors_short.weight", lambda d: (d["R"],), True),
    # per-layer input embeddings (gemma4): n_layer rows of n_embd_per_layer per token, the projection
    # of the token's embedding to the same, and that projection's norm
    "ple_embd": Role("per_layer_token_embd.weight", lambda d: (d["LP"], d["V"])),
    "ple_model_proj": Role("per_layer_model_proj.weight", lambda d: (d["E"], d["LP"])),
    "ple_proj_norm": Role("per_layer_proj_norm.weight", lambda d: (d["P"],), True),
}


def check_tensor_type(name: str, qtype: QType) -> None:
    info = TYPES.get(qtype)
    if info is None or not info.supported:
        raise UnsupportedModelError(
            f"tensor {name!r} has type {type_name(int(qtype))}, which edgellm does not run "
            f"(supported: {', '.join(t.name for t in TYPES if TYPES[t].supported)})")


@dataclass
class ModelWeights:
    """Tensor infos by role; the engines turn them into views of the mmap."""

    tok_embd: Any
    output: Any
    output_norm: Any
    rope_freqs: Any
    layers: list[dict[str, Any]]  # field (LAYER_ROLES keys) -> TensorInfo or None
    output_bias: Any = None
    rope_long: Any = None   # LongRoPE factors, used when the context exceeds the original one
    rope_short: Any = None
    ple_embd: Any = None        # per-layer input embeddings (GLOBAL_ROLES)
    ple_model_proj: Any = None
    ple_proj_norm: Any = None

    def rope_factors(self, n_ctx: int, n_ctx_orig: int):
        """The RoPE frequency factors a context of n_ctx tokens uses (llama.cpp's get_rope_factors):
        rope_freqs, else LongRoPE's long factors beyond the original context, else the short ones."""
        if self.rope_freqs is not None:
            return self.rope_freqs
        return self.rope_long if n_ctx > n_ctx_orig else self.rope_short


def bind_weights(gguf, cfg: ModelConfig) -> ModelWeights:
    t = gguf.tensors
    d = dims(cfg)
    bound: set[str] = set()

    def check(name, role: Role, d=d):
        info = t[name]
        shape = role.shape(d)
        if tuple(info.shape) != shape:
            raise GGUFError(f"tensor {name!r} has shape {list(info.shape)}, expected {list(shape)}")
        check_tensor_type(name, info.qtype)
        if role.f32 and info.qtype != QType.F32:
            raise UnsupportedModelError(f"tensor {name!r}: norms and biases must be F32")
        bound.add(name)
        return info

    def need(name, role: Role, d=d):
        if name not in t:
            raise GGUFError(f"required tensor {name!r} is missing")
        return check(name, role, d)

    def opt(name, role: Role, d=d):
        return check(name, role, d) if name in t else None

    names = dict(cfg.role_names)
    layers = []
    for i, lc in enumerate(cfg.layers):
        required = cfg.recurrent_tensors if lc.recurrent else cfg.required_tensors
        allowed = set(required) | (set() if lc.recurrent else set(cfg.optional_tensors))
        layer: dict[str, Any] = dict.fromkeys(LAYER_ROLES)
        di = dims(cfg, cfg.layers[i])
        fused = {f for f in FUSED if f in allowed and f"blk.{i}.{LAYER_ROLES[f].name}" in t}
        replaced = {r for f in fused for r in FUSED[f]}
        for fld in LAYER_ROLES:
            if fld not in allowed or fld in replaced:
                continue  # the fused tensor stands in; a separate one beside it is left over
            role = LAYER_ROLES[fld]
            if fld in names:
                role = Role(names[fld], role.shape, role.f32)
            name = f"blk.{i}.{role.name}"
            layer[fld] = (need if fld in required else opt)(name, role, di)
        if layer["bqkv"] is not None and layer["wqkv"] is None:
            raise GGUFError(f"tensor 'blk.{i}.attn_qkv.bias' has no attn_qkv.weight beside it")
        if not lc.recurrent and layer["wqkv"] is None and layer["wq"] is None:
            raise GGUFError(f"required tensor 'blk.{i}.attn_q.weight' (or attn_qkv.weight) is missing")
        if not lc.recurrent and lc.kv_layer < 0:  # a layer with a KV cache of its own (gemma4's others borrow one)
            if layer["wqkv"] is None and layer["wk"] is None:
                raise GGUFError(f"required tensor 'blk.{i}.attn_k.weight' is missing")
            if layer["attn_q_norm"] is not None and layer["attn_k_norm"] is None:
                raise GGUFError(f"required tensor 'blk.{i}.attn_k_norm.weight' is missing")
        layers.append(layer)
    # blocks the forward pass does not run (a qwen35 file's multi-token-prediction head, which
    # llama.cpp also loads only to draft with): their tensors are the file's, not left over
    skipped = tuple(f"blk.{i}." for i in range(cfg.n_layer, cfg.n_layer + cfg.n_layer_skip))
    bound.update(n for n in t if n.startswith(skipped))
    E, V = cfg.n_embd, cfg.n_vocab
    tok = need("token_embd.weight", Role("token_embd.weight", lambda _: (E, V)))
    out_role = Role("output.weight", lambda _: (E, V))
    if cfg.output == "required":
        out = need("output.weight", out_role)
    elif cfg.output == "optional":
        out = opt("output.weight", out_role) or tok
    else:  # "tied": the architecture always uses the embeddings
        out = tok
    norm = need("output_norm.weight", Role("output_norm.weight", lambda _: (E,), True))
    glob = {r: opt(GLOBAL_ROLES[r].name, GLOBAL_ROLES[r])
            for r in dict.fromkeys(cfg.global_tensors + cfg.required_global_tensors)}
    for r in cfg.required_global_tensors:
        if glob.get(r) is None:
            raise GGUFError(f"required tensor {GLOBAL_ROLES[r].name!r} is missing")
    left = [n for n in t if n not in bound]
    if left:
        more = f" and {len(left) - 3} more" if len(left) > 3 else ""
        raise UnsupportedModelError(
            f"{cfg.arch}: the file has tensor{'s' if len(left) > 1 else ''} {', '.join(map(repr, left[:3]))}{more}, "
            f"which edgellm's {cfg.arch} model does not use")
    return ModelWeights(tok_embd=tok, output=out, output_norm=norm, rope_freqs=glob.get("rope_freqs"),
                        layers=layers, output_bias=glob.get("output_bias"), rope_long=glob.get("rope_long"),
                        rope_short=glob.get("rope_short"), ple_embd=glob.get("ple_embd"),
                        ple_model_proj=glob.get("ple_model_proj"), ple_proj_norm=glob.get("ple_proj_norm"))
