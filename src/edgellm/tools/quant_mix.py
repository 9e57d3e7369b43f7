"""Which type each tensor gets when a model is quantized to a file type ("Q4_K_M" ...).

The rules are llama.cpp's (src/llama-quant.cpp: tensor_allows_quantization, llama_tensor_get_type,
llama_tensor_get_type_impl, tensor_type_fallback), so a name here means what it means there:
- file types are LLAMA_FTYPE numbers (include/llama.h) with a default tensor type each;
- 1-D tensors, norms and a few small tables keep their type;
- the output matrix (and the token embeddings when the model ties them to it) get Q6_K, or Q8_0
  when the row length is not a multiple of the default type's block;
- attn_v / ffn_down / attn_output get more bits in the _M/_L mixes, on the layers
  use_more_bits picks;
- IQ4_NL / IQ4_XS: attn_v gets Q5_K with grouped-query attention (n_gqa >= 4), ffn_down Q5_K on
  the first eighth of the layers (no importance matrix);
- a row length that is not a multiple of the target's block size falls back
  (Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL, else F16).
Tensors are visited in llama.cpp's order (layer number, then name), which the per-layer counters
of the mixes depend on. No importance matrix is involved, so the mixes that need one (IQ1/IQ2/IQ3,
Q2_K_S) are absent; IQ4_NL and IQ4_XS need none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..quants import QType, type_info

_T = QType


@dataclass(frozen=True)
class FileType:
    name: str
    ftype: int  # LLAMA_FTYPE_* (include/llama.h), stored as general.file_type
    default: QType  # llama_ftype_get_default_type

    @property
    def is_quantized(self) -> bool:
        return type_info(self.default).block_size > 1


FILE_TYPES: dict[str, FileType] = {ft.name: ft for ft in (
    FileType("F32", 0, _T.F32),
    FileType("F16", 1, _T.F16),
    FileType("Q4_0", 2, _T.Q4_0),
    FileType("Q4_1", 3, _T.Q4_1),
    FileType("Q8_0", 7, _T.Q8_0),
    FileType("Q5_0", 8, _T.Q5_0),
    FileType("Q5_1", 9, _T.Q5_1),
    FileType("Q2_K", 10, _T.Q2_K),
    FileType("Q3_K_S", 11, _T.Q3_K),
    FileType("Q3_K_M", 12, _T.Q3_K),
    FileType("Q3_K_L", 13, _T.Q3_K),
    FileType("Q4_K_S", 14, _T.Q4_K),
    FileType("Q4_K_M", 15, _T.Q4_K),
    FileType("Q5_K_S", 16, _T.Q5_K),
    FileType("Q5_K_M", 17, _T.Q5_K),
    FileType("Q6_K", 18, _T.Q6_K),
    FileType("IQ4_NL", 25, _T.IQ4_NL),
    FileType("IQ4_XS", 30, _T.IQ4_XS),
    FileType("BF16", 32, _T.BF16),
)}
# llama-quantize's aliases
FILE_TYPE_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}

# Types a tensor can be converted to (explicit --tensor-type targets included).
TARGET_TYPES = (_T.F32, _T.F16, _T.BF16, _T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0,
                _T.Q2_K, _T.Q3_K, _T.Q4_K, _T.Q5_K, _T.Q6_K, _T.IQ4_NL, _T.IQ4_XS)

_FALLBACK = {_T.Q2_K: _T.Q4_0, _T.Q3_K: _T.Q4_0, _T.Q4_K: _T.Q5_0, _T.Q5_K: _T.Q5_1, _T.Q6_K: _T.Q8_0,
             _T.IQ4_XS: _T.IQ4_NL}

# name parts of tensors that are never quantized (tensor_allows_quantization)
_KEEP_PARTS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
    "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
    "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")
# block counts at which an architecture calls itself LLM_TYPE_70B (src/models/<arch>.cpp; llama
# only with grouped-query attention, 80 layers without it being LLaMA-1 65B)
_70B_LAYERS = {"llama": 80, "deci": 80, "olmo": 80, "qwen2": 80, "jais2": 68}


def parse_file_type(text: str) -> FileType:
    """A file type by name (any case, llama-quantize's aliases) or LLAMA_FTYPE number."""
    key = text.strip().upper()
    key = FILE_TYPE_ALIASES.get(key, key)
    if key in FILE_TYPES:
        return FILE_TYPES[key]
    if key.isdigit():
        for ft in FILE_TYPES.values():
            if ft.ftype == int(key):
                return ft
    raise ValueError(f"unknown quantization type {text!r}; expected one of "
                     f"{', '.join(FILE_TYPES)} (or {', '.join(FILE_TYPE_ALIASES)})")


def parse_tensor_type(text: str) -> QType:
    """A ggml type name (any case) that tensors can be converted to."""
    for t in TARGET_TYPES:
        if t.name.lower() == text.strip().lower():
            return t
    raise ValueError(f"unknown tensor type {text!r}; expected one of {', '.join(t.name for t in TARGET_TYPES)}")


def parse_override(text: str) -> tuple[re.Pattern, QType]:
    """PATTERN=TYPE as llama-quantize's --tensor-type takes it: the pattern is lower-cased and
    searched for (a regular expression) in tensor names."""
    pattern, sep, type_name = text.partition("=")
    if not sep or not pattern or not type_name:
        raise ValueError(f"--tensor-type {text!r}: expected PATTERN=TYPE, e.g. attn_v=q8_0")
    try:
        rx = re.compile(pattern.lower())
    except re.error as e:
        raise ValueError(f"--tensor-type {text!r}: bad pattern: {e}") from None
    return rx, parse_tensor_type(type_name)


def _layer_of(name: str) -> int:
    m = re.match(r"blk\.([+-]?\d+)", name)
    return int(m.group(1)) if m else -1


def tensor_order(names: Iterable[str]) -> list[str]:
    """llama.cpp's weight order: by layer number (non-layer tensors first), then by name."""
    return sorted(names, key=lambda n: (_layer_of(n), n))


def n_dims(shape: Sequence[int]) -> int:
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n


def allows_quantization(name: str, shape: Sequence[int]) -> bool:
    """Whether llama.cpp would give this tensor a new type (2-D/3-D weights that are not norms,
    position tables or a few small special matrices)."""
    if n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    return not any(p in name for p in _KEEP_PARTS) and name not in _KEEP_NAMES


# tensor_get_category
_CATEGORIES = (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"),
               ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
               ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
               ("ffn_down", "ffn_down"))
_ATTN_V_LIKE = ("attn_v", "attn_qkv", "attn_kv_b")


def category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in _CATEGORIES:
        if part in name:
            return cat
    return "other"


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@dataclass(frozen=True)
class Decision:
    name: str
    source: QType
    target: QType
    note: str = ""  # fallback or override, said to the user

    @property
    def converts(self) -> bool:
        return self.source != self.target


def _first(v: Any) -> int:
    """A per-layer array (some models store head counts per layer) or a number: its first value."""
    if isinstance(v, (list, tuple)) or hasattr(v, "shape"):
        return int(v[0]) if len(v) else 0
    return int(v)


class _Planner:
    """llama_tensor_get_type with its per-file counters (quantize_state_impl)."""

    def __init__(self, metadata: Mapping[str, Any], names: Sequence[str], ft: FileType):
        self.ft = ft.name
        self.arch = str(metadata.get("general.architecture", ""))
        a = self.arch
        n_head = _first(metadata.get(f"{a}.attention.head_count", 0))
        n_head_kv = _first(metadata.get(f"{a}.attention.head_count_kv", n_head))
        self.n_gqa = n_head // n_head_kv if n_head_kv else 0
        self.n_expert = int(metadata.get(f"{a}.expert_count", 0))
        n_layer = metadata.get(f"{a}.block_count")
        if n_layer is None:
            n_layer = max((_layer_of(n) for n in names), default=-1) + 1
        self.n_layer = int(n_layer)
        # LLM_TYPE_70B, the one model size the rules look at, as the architectures assign it
        self.is_70b = (self.n_layer == _70B_LAYERS.get(a) and (a != "llama" or n_head != n_head_kv))
        cats = [category(n) for n in names]
        self.n_attention_wv = sum(c in _ATTN_V_LIKE for c in cats)
        self.tied_embeddings = "output" not in cats
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0

    def _layer(self, counter: int, name: str) -> tuple[int, int]:
        if self.n_expert > 1:  # expert tensors are not in layer order: read the layer from the name
            m = re.match(r"blk\.(\d+)\.", name)
            if not m:
                raise ValueError(f"cannot tell the layer of tensor {name!r}")
            i = int(m.group(1))
            if i >= self.n_layer:
                raise ValueError(f"tensor {name!r}: layer {i} is not below the block count {self.n_layer}")
            return i, self.n_layer
        return counter, self.n_layer

    def mix(self, new: QType, name: str, ne0: int, cat: str) -> QType:
        """llama_tensor_get_type_impl for the file types listed in FILE_TYPES."""
        ft = self.ft
        if cat == "output" or (self.tied_embeddings and cat == "token_embd"):
            if self.arch == "falcon" or ne0 % type_info(new).block_size:
                return _T.Q8_0
            return new if new == _T.Q8_0 else _T.Q6_K
        if cat == "token_embd":
            return new
        if cat in _ATTN_V_LIKE:
            if ft == "Q2_K":
                new = _T.Q4_K if self.n_gqa >= 4 else _T.Q3_K
            elif ft == "Q3_K_M":
                new = _T.Q5_K if self.i_attention_wv < 2 else _T.Q4_K
            elif ft == "Q3_K_L":
                new = _T.Q5_K
            elif ft in ("IQ4_NL", "IQ4_XS") and self.n_gqa >= 4:
                new = _T.Q5_K
            elif ft in ("Q4_K_M", "Q5_K_M") and _use_more_bits(self.i_attention_wv, self.n_attention_wv):
                new = _T.Q6_K
            elif ft == "Q4_K_S" and self.i_attention_wv < 4:
                new = _T.Q5_K
            if self.is_70b and new in (_T.Q3_K, _T.Q4_K):
                new = _T.Q5_K
            if self.n_expert == 8:
                new = _T.Q8_0
            self.i_attention_wv += 1
        elif cat == "attn_k":
            if self.n_expert == 8:
                new = _T.Q8_0
        elif cat == "ffn_down":
            i, n = self._layer(self.i_ffn_down, name)
            falcon = self.arch == "falcon"
            if ft == "Q2_K":
                new = _T.Q3_K
            elif ft == "Q3_K_M":
                new = (_T.Q5_K if i < n // 16 else
                       _T.Q4_K if not falcon or _use_more_bits(i, n) else _T.Q3_K)
            elif ft == "Q3_K_L":
                new = _T.Q4_K if falcon else _T.Q5_K
            elif ft == "Q4_K_M":
                if falcon:
                    new = _T.Q6_K if i < n // 16 else _T.Q5_K if _use_more_bits(i, n) else _T.Q4_K
                elif _use_more_bits(i, n):
                    new = _T.Q6_K
            elif ft in ("IQ4_NL", "IQ4_XS") and i < n // 8:  # without an importance matrix
                new = _T.Q5_K
            elif ft == "Q5_K_M" and _use_more_bits(i, n):
                new = _T.Q6_K
            elif ft == "Q4_K_S" and not falcon and i < n // 8:
                new = _T.Q5_K
            self.i_ffn_down += 1
        elif cat == "attn_output":
            if self.arch != "falcon":
                if self.n_expert == 8:
                    if ft in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS"):
                        new = _T.Q5_K
                else:
                    new = {"Q2_K": _T.Q3_K, "Q3_K_M": _T.Q4_K, "Q3_K_L": _T.Q5_K}.get(ft, new)
            elif ft == "Q3_K_L":
                new = _T.Q4_K
        elif cat == "ffn_gate":
            self._layer(self.i_ffn_gate, name)
            self.i_ffn_gate += 1
        elif cat == "ffn_up":
            self._layer(self.i_ffn_up, name)
            self.i_ffn_up += 1
        return new


def _fallback(name: str, ne0: int, t: QType) -> tuple[QType, str]:
    """tensor_type_fallback: a type whose block divides the row length."""
    qk = type_info(t).block_size
    if ne0 % qk == 0:
        return t, ""
    new = _FALLBACK.get(t, t)
    if ne0 % type_info(new).block_size:
        new = _T.F16
    return new, f"row length {ne0} is not a multiple of {qk} (required for {t.name}): falling back to {new.name}"


def plan(metadata: Mapping[str, Any], tensors: Sequence[tuple[str, Sequence[int], QType]], ft: FileType, *,
         pure: bool = False, overrides: Sequence[tuple[re.Pattern, QType]] = ()) -> list[Decision]:
    """The target type of every tensor; `tensors` as (name, shape in ggml order, type), in
    tensor_order. Overrides apply, as in llama.cpp, only when the file type is a quantized one."""
    planner = _Planner(metadata, [n for n, _, _ in tensors], ft)
    out = []
    for name, shape, src in tensors:
        if not allows_quantization(name, shape):
            out.append(Decision(name, src, src))
            continue
        new, note = ft.default, ""
        if ft.is_quantized:
            manual = False
            for rx, t in overrides:
                if rx.search(name):
                    if t != new:
                        note = f"override: {new.name} -> {t.name}"
                        new = t
                    manual = True
                    break
            if not manual and not pure:
                new = planner.mix(new, name, shape[0], category(name))
            new, fb = _fallback(name, shape[0], new)
            note = "; ".join(x for x in (note, fb) if x)
        out.append(Decision(name, src, new, note))
    return out
