"""What every architecture module shares: the typed config, GGUF key/tensor naming, binding.

An architecture module reads hyperparameters from GGUF keys into a `ModelConfig` and names the
tensors each layer needs; it never parses bytes (gguf_file does) and never computes (the
engines in `kernels/` do). Tensor names follow llama.cpp's `blk.{i}.attn_q.weight` scheme.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import GGUFError, UnsupportedModelError
from ..quants import QType, TYPES, type_name

ACT_SILU = "silu"
ACT_GELU_TANH = "gelu_tanh"
ROPE_NORM = "norm"  # rotate adjacent pairs (2i, 2i+1): llama
ROPE_NEOX = "neox"  # rotate halves (i, i + n_rot/2): gemma, qwen, ...

# per-layer tensors: field name -> GGUF suffix after "blk.{i}."
LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight",
    "wk": "attn_k.weight",
    "wv": "attn_v.weight",
    "wo": "attn_output.weight",
    "bq": "attn_q.bias",
    "bk": "attn_k.bias",
    "bv": "attn_v.bias",
    "bo": "attn_output.bias",
    "attn_q_norm": "attn_q_norm.weight",
    "attn_k_norm": "attn_k_norm.weight",
    "attn_post_norm": "post_attention_norm.weight",
    "ffn_norm": "ffn_norm.weight",
    "w_gate": "ffn_gate.weight",
    "w_up": "ffn_up.weight",
    "w_down": "ffn_down.weight",
    "ffn_post_norm": "post_ffw_norm.weight",
}
NORM_FIELDS = ("attn_norm", "attn_q_norm", "attn_k_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm",
               "bq", "bk", "bv", "bo")


@dataclass(frozen=True)
class LayerConfig:
    is_swa: bool
    rope_base: float
    rope_scale: float  # multiplies positions (1 / linear scaling factor)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    n_rot: int
    rope_type: str
    norm_eps: float
    act: str
    attn_scale: float           # multiplies the scores q.k
    layers: tuple[LayerConfig, ...]
    n_swa: int = 0
    embd_scale: float = 1.0
    attn_softcap: float = 0.0
    q_scale: float = 1.0        # multiplies q after RoPE, before its f16 rounding (llama.cpp's gemma3 graph)
    final_softcap: float = 0.0
    yarn_ext_factor: float = 0.0
    yarn_attn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    n_ctx_orig: int = 0
    required_tensors: tuple[str, ...] = ()   # layer fields that must be present
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def n_params_hint(self) -> str:
        return f"{self.n_layer} layers, {self.n_embd} embd, {self.n_head}/{self.n_head_kv} heads"


class Keys:
    """Typed access to `{arch}.*` keys with errors that name the key."""

    def __init__(self, gguf, arch: str):
        self.g = gguf
        self.arch = arch

    def _get(self, key: str, default, kind):
        full = key.replace("{arch}", self.arch)
        v = self.g.metadata.get(full, None)
        if v is None:
            if default is _REQUIRED:
                raise GGUFError(f"required metadata key {full!r} is missing")
            return default
        try:
            if kind is int:
                if isinstance(v, bool) or not float(v).is_integer():
                    raise ValueError
                return int(v)
            if kind is float:
                return float(v)
            if kind is str:
                if not isinstance(v, str):
                    raise ValueError
                return v
        except (TypeError, ValueError):
            raise GGUFError(f"metadata key {full!r} has an unexpected value {v!r} (want {kind.__name__})") from None
        return v

    def int(self, key, default=None):
        return self._get(key, default, int)

    def float(self, key, default=None):
        return self._get(key, default, float)

    def str(self, key, default=None):
        return self._get(key, default, str)

    def raw(self, key, default=None):
        return self.g.metadata.get(key.replace("{arch}", self.arch), default)


_REQUIRED = object()
REQUIRED = _REQUIRED


MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS: a larger block_count is refused there too


def positive(name: str, v: int) -> int:
    if v is None or v <= 0:
        raise GGUFError(f"hyperparameter {name} must be positive (got {v})")
    return v


def n_vocab_of(gguf, k: Keys) -> int:
    n = k.int("{arch}.vocab_size", None)
    if n is None:
        toks = gguf.metadata.get("tokenizer.ggml.tokens")
        if toks is None:
            raise GGUFError("cannot tell the vocabulary size: no {arch}.vocab_size and no tokenizer.ggml.tokens")
        n = len(toks)
    return positive("n_vocab", n)


def decoder_shape(gguf, k: Keys) -> dict:
    """The shape keys every decoder shares: layers, widths, heads, head sizes, vocabulary, rotated dims."""
    check_head_counts(k)
    n_embd = positive("n_embd", k.int("{arch}.embedding_length", REQUIRED))
    n_head = positive("n_head", k.int("{arch}.attention.head_count", REQUIRED))
    head_dim = positive("head_dim", k.int("{arch}.attention.key_length", n_embd // n_head))
    return dict(
        n_layer=_layer_count(k),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=positive("n_head_kv", k.int("{arch}.attention.head_count_kv", n_head)),
        head_dim_k=head_dim,
        head_dim_v=positive("head_dim_v", k.int("{arch}.attention.value_length", head_dim)),
        n_ff=positive("n_ff", k.int("{arch}.feed_forward_length", REQUIRED)),
        n_vocab=n_vocab_of(gguf, k),
        n_rot=k.int("{arch}.rope.dimension_count", head_dim),
    )


def _layer_count(k: Keys) -> int:
    n = positive("n_layer", k.int("{arch}.block_count", REQUIRED))
    if n > MAX_LAYERS:  # before anything makes per-layer tables of that size
        raise GGUFError(f"hyperparameter n_layer is {n}, more than the {MAX_LAYERS} layers supported")
    return n


def rope_scaling(k: Keys) -> tuple[str, float, int]:
    """(type, factor, original context) from rope.scaling.* (or the legacy rope.scale_linear)."""
    typ = k.str("{arch}.rope.scaling.type", "none")
    factor = k.float("{arch}.rope.scaling.factor", 0.0)
    legacy = k.float("{arch}.rope.scale_linear", 0.0)
    if legacy and not factor:
        typ, factor = "linear", legacy
    if typ not in ("none", "linear", "yarn"):
        raise UnsupportedModelError(f"rope scaling type {typ!r} is not supported (none, linear, yarn)")
    if factor <= 0 or typ == "none":
        factor = 1.0
    n_orig = k.int("{arch}.rope.scaling.original_context_length", 0) or k.int("{arch}.context_length", 0)
    return typ, factor, n_orig


def check_head_counts(k: Keys) -> None:
    for key in ("{arch}.attention.head_count", "{arch}.attention.head_count_kv"):
        v = k.raw(key)
        if v is not None and not isinstance(v, (int,)) and hasattr(v, "__len__"):
            raise UnsupportedModelError(f"per-layer head counts ({key.replace('{arch}', k.arch)}) are not supported")


def attn_scale_default(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def check_tensor_type(name: str, qtype: QType) -> None:
    info = TYPES.get(qtype)
    if info is None or not info.supported:
        raise UnsupportedModelError(
            f"tensor {name!r} has type {type_name(int(qtype))}, which edgellm does not run "
            f"(supported: {', '.join(t.name for t in TYPES if TYPES[t].supported)})")


# --- binding tensors to the config ----------------------------------------------------------

@dataclass
class ModelWeights:
    """Tensor infos by role; the engines turn them into views of the mmap."""

    tok_embd: Any
    output: Any
    output_norm: Any
    rope_freqs: Any
    layers: list[dict[str, Any]]  # field (LAYER_TENSORS keys) -> TensorInfo or None


def bind_weights(gguf, cfg: ModelConfig) -> ModelWeights:
    t = gguf.tensors

    def need(name, shape):
        info = t.get(name)
        if info is None:
            raise GGUFError(f"required tensor {name!r} is missing")
        return check(name, info, shape)

    def check(name, info, shape):
        if tuple(info.shape) != tuple(shape):
            raise GGUFError(f"tensor {name!r} has shape {list(info.shape)}, expected {list(shape)}")
        check_tensor_type(name, info.qtype)
        return info

    def opt(name, shape):
        info = t.get(name)
        return None if info is None else check(name, info, shape)

    E, F = cfg.n_embd, cfg.n_ff
    qd, kd = cfg.n_head * cfg.head_dim_k, cfg.n_head_kv * cfg.head_dim_k
    vd, od = cfg.n_head_kv * cfg.head_dim_v, cfg.n_head * cfg.head_dim_v
    shapes = {
        "attn_norm": (E,), "wq": (E, qd), "wk": (E, kd), "wv": (E, vd), "wo": (od, E),
        "bq": (qd,), "bk": (kd,), "bv": (vd,), "bo": (E,),
        "attn_q_norm": (cfg.head_dim_k,), "attn_k_norm": (cfg.head_dim_k,), "attn_post_norm": (E,),
        "ffn_norm": (E,), "w_gate": (E, F), "w_up": (E, F), "w_down": (F, E), "ffn_post_norm": (E,),
    }
    layers = []
    for i in range(cfg.n_layer):
        layer = {}
        for fld, suffix in LAYER_TENSORS.items():
            name = f"blk.{i}.{suffix}"
            layer[fld] = need(name, shapes[fld]) if fld in cfg.required_tensors else opt(name, shapes[fld])
            if fld in NORM_FIELDS and layer[fld] is not None and layer[fld].qtype != QType.F32:
                raise UnsupportedModelError(f"tensor {name!r}: norms and biases must be F32")
        layers.append(layer)
    tok = need("token_embd.weight", (E, cfg.n_vocab))
    out = opt("output.weight", (E, cfg.n_vocab)) or tok  # tied embeddings
    norm = need("output_norm.weight", (E,))
    rope_freqs = opt("rope_freqs.weight", (cfg.n_rot // 2,))
    for name, info in (("output_norm.weight", norm), ("rope_freqs.weight", rope_freqs)):
        if info is not None and info.qtype != QType.F32:
            raise UnsupportedModelError(f"tensor {name!r} must be F32")
    return ModelWeights(tok_embd=tok, output=out, output_norm=norm, rope_freqs=rope_freqs, layers=layers)
