"""The vocabulary read from GGUF metadata, with the defaults and fix-ups llama.cpp applies when it
loads one (llama_vocab::impl::load in llama.cpp's src/llama-vocab.cpp): token texts and scores,
per-token attributes, special token ids, add_bos / add_eos / add_space_prefix and the set of
end-of-generation tokens."""

from __future__ import annotations

import enum
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TokenizerError, UnsupportedModelError
from ..gguf_file import StringArray
from . import pretokenize
from .string_index import DuplicateStringError, StringIndex

K = "tokenizer.ggml."


class Attr(enum.IntFlag):
    """Per-token attribute bits, as llama.h's llama_token_attr."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


# GGUF token_type value (llama.h llama_token_type: 0 undefined, 1 normal, 2 unknown, 3 control,
# 4 user-defined, 5 unused, 6 byte) -> attribute; any other value is UNDEFINED, as in llama.cpp.
_TYPE_TO_ATTR = np.array(
    [Attr.UNDEFINED, Attr.NORMAL, Attr.UNKNOWN, Attr.CONTROL, Attr.USER_DEFINED, Attr.UNUSED, Attr.BYTE,
     Attr.UNDEFINED],
    dtype=np.uint16,
)

# tokenizer.ggml.model -> our tokenizer kind. llama.cpp knows more (bert, t5, rwkv, ...).
# "gemma4" is BPE over raw UTF-8 with spaces written as ▁ (llama.cpp's "SPM-style BPE").
SUPPORTED_MODELS = {"llama": "spm", "gpt2": "bpe", "gemma4": "bpe"}

# Special-token keys in the order llama.cpp reads them; a later key overrides an earlier one
# (the deprecated prefix/suffix/middle keys come last).
_SPECIAL_KEYS = (
    ("bos", "bos_token_id"),
    ("eos", "eos_token_id"),
    ("eot", "eot_token_id"),
    ("eom", "eom_token_id"),
    ("unk", "unknown_token_id"),
    ("sep", "seperator_token_id"),  # sic: the GGUF key is spelled this way
    ("pad", "padding_token_id"),
    ("mask", "mask_token_id"),
    ("fim_pre", "fim_pre_token_id"),
    ("fim_suf", "fim_suf_token_id"),
    ("fim_mid", "fim_mid_token_id"),
    ("fim_pad", "fim_pad_token_id"),
    ("fim_rep", "fim_rep_token_id"),
    ("fim_sep", "fim_sep_token_id"),
    ("fim_pre", "prefix_token_id"),
    ("fim_suf", "suffix_token_id"),
    ("fim_mid", "middle_token_id"),
)

# Token texts llama.cpp recognises when the metadata does not name the token (llama-vocab.cpp,
# "auto-detect special tokens by text"). The first name present in the vocabulary is taken.
_EOT_NAMES = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)
_EOM_NAMES = ("<|eom_id|>",)
_FIM_NAMES = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# Every token with one of these texts ends generation (and is made a control token).
_EOG_NAMES = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
)
# gpt-oss: always rendered, so made user-defined (llama.cpp's "quick hack for gpt-oss").
_FORCE_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

_SPECIAL_MASK = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN


@dataclass
class Vocab:
    kind: str                       # "spm" | "bpe"
    tokens: StringArray             # id -> text (as stored: SPM uses ▁ for space, BPE the byte map)
    token_to_id: StringIndex        # text -> id
    scores: np.ndarray | None       # float32 [n], SPM merge priorities
    attrs: np.ndarray               # uint16 [n], Attr bits
    special: dict[str, int | None]  # bos, eos, eot, eom, unk, sep, pad, mask, fim_*
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    pre: str                        # BPE pre-tokenizer type (a key of pretokenize.PATTERNS)
    byte_map: bool                  # BPE: token texts use GPT-2's byte map (else raw UTF-8, ▁ for space,
                                    # <0xAB> byte tokens)
    ignore_merges: bool             # BPE: a pre-token that is a whole token skips the merges
    merges: StringArray | None      # BPE merge rules "left right", rank = index
    eog_ids: frozenset[int]

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def attr(self, token_id: int) -> int:
        return int(self.attrs[token_id])

    def special_token_order(self) -> list[int]:
        """Ids of control, user-defined and unknown tokens, longest text (in UTF-8 bytes) first:
        the order in which llama.cpp's tokenizer_st_partition tries them. Ties keep id order."""
        ids = np.flatnonzero(self.attrs & int(_SPECIAL_MASK))
        lengths = self.tokens.byte_lengths(ids)
        return ids[np.argsort(-lengths, kind="stable")].tolist()


def _get(meta: Mapping[str, Any], name: str) -> Any:
    return meta.get(K + name)


def _as_bool(meta: Mapping[str, Any], name: str, default: bool) -> bool:
    v = _get(meta, name)
    if v is None:
        return default
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    raise TokenizerError(f"{K}{name} must be a bool, got {type(v).__name__} {v!r}")


def _as_id(meta: Mapping[str, Any], name: str) -> int | None:
    v = _get(meta, name)
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TokenizerError(f"{K}{name} must be an integer token id, got {type(v).__name__} {v!r}")
    return int(v)


def _as_str(meta: Mapping[str, Any], name: str) -> str | None:
    v = _get(meta, name)
    if v is not None and not isinstance(v, str):
        raise TokenizerError(f"{K}{name} must be a string, got {type(v).__name__}")
    return v


def _numeric_array(meta: Mapping[str, Any], name: str, n: int, dtype) -> np.ndarray | None:
    v = _get(meta, name)
    if v is None:
        return None
    try:
        arr = np.asarray(v)
    except (TypeError, ValueError) as e:
        raise TokenizerError(f"{K}{name} is not a numeric array: {e}") from None
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TokenizerError(
            f"{K}{name} must be a 1-D numeric array, got dtype {arr.dtype} shape {arr.shape}"
        )
    if len(arr) < n:  # llama.cpp: "Index out of array bounds"
        raise TokenizerError(f"{K}{name} has {len(arr)} entries but {K}tokens has {n}")
    return arr[:n] if dtype is None else arr[:n].astype(dtype, copy=False)


def _string_array(meta: Mapping[str, Any], name: str) -> StringArray:
    """A string array from the metadata: GGUFFile's StringArray as is, a list of str laid out as one."""
    v = _get(meta, name)
    if isinstance(v, StringArray):
        return v
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
        raise TokenizerError(f"{K}{name} must be a list of strings, got {type(v).__name__}")
    bad = next((i for i, t in enumerate(v) if type(t) is not str), None)
    if bad is not None:
        raise TokenizerError(f"{K}{name}[{bad}] is {type(v[bad]).__name__}, not a string")
    return StringArray.from_strings(v)


def _token_list(meta: Mapping[str, Any]) -> StringArray:
    if _get(meta, "tokens") is None:
        raise TokenizerError(f"{K}tokens is missing: the file has no vocabulary")
    tokens = _string_array(meta, "tokens")
    if not len(tokens):
        raise TokenizerError(f"{K}tokens is empty")
    empty = np.flatnonzero(tokens.byte_lengths() == 0)
    if len(empty):  # llama.cpp renames empty tokens rather than dropping them
        renamed = set(empty.tolist())
        tokens = StringArray.from_strings(f"[EMPTY_{i}]" if i in renamed else t for i, t in enumerate(tokens))
    return tokens


def _index(tokens: StringArray) -> StringIndex:
    try:
        return StringIndex(tokens)
    except DuplicateStringError as e:  # llama.cpp asserts that every token text is unique
        raise TokenizerError(f"{K}tokens has a duplicate: {e.text!r} at ids {e.first} and {e.second}") from None


def _find(index: StringIndex, names: set[str]) -> dict[str, int]:
    """Ids of those `names` that are tokens."""
    return {t: i for t in names if (i := index.get(t)) is not None}


_NAMES_LOOKED_UP = {
    *_EOT_NAMES, *_EOM_NAMES, *(t for names in _FIM_NAMES.values() for t in names), *_EOG_NAMES,
    *_FORCE_USER_DEFINED, "<mask>", "</s>", "<unk>", "<s>", "<|endoftext|>", "[MASK]",
}


def load_vocab(meta: Mapping[str, Any]) -> Vocab:
    model = _as_str(meta, "model")
    if model is None:
        raise TokenizerError(f"{K}model is missing: cannot tell which tokenizer the file uses")
    kind = SUPPORTED_MODELS.get(model)
    if kind is None:
        supported = ", ".join(f"{m!r}" for m in SUPPORTED_MODELS)
        raise UnsupportedModelError(
            f"tokenizer model {model!r} ({K}model) is not supported; supported: {supported}"
        )

    tokens = _token_list(meta)
    n = len(tokens)
    token_to_id = _index(tokens)
    named = _find(token_to_id, _NAMES_LOOKED_UP)
    scores = _numeric_array(meta, "scores", n, np.float32)
    types = _numeric_array(meta, "token_type", n, None)  # int32 in GGUF files: no wider copy
    if types is None:
        attrs = np.full(n, Attr.NORMAL, dtype=np.uint16)
    else:
        if types.dtype.kind != "i":  # unsigned or float: signed, for the clip below
            types = types.astype(np.int64)
        # the table's last entry is UNDEFINED, so negative types (clipped to -1) map to it too
        attrs = _TYPE_TO_ATTR[np.clip(types, -1, len(_TYPE_TO_ATTR) - 1)]

    # Defaults per model type (llama_vocab::impl::load)
    merges = None
    ignore_merges = False
    pre = ""
    flags = pretokenize.PreFlags()
    if kind == "spm":
        special: dict[str, int | None] = {"bos": 1, "eos": 2, "unk": 0}
        add_bos, add_space_prefix = True, True
    else:
        merges = _merges(meta)
        add_space_prefix = False
        # llama.cpp: a "gemma4" vocabulary has no default special ids and the pre-tokenizer
        # "gemma4" whatever tokenizer.ggml.pre says
        special = {} if model == "gemma4" else {"bos": 11, "eos": 11}
        pre_name = "gemma4" if model == "gemma4" else (_as_str(meta, "pre") or "")
        pre, flags = pretokenize.resolve(pre_name)
        ignore_merges = flags.ignore_merges
        add_bos = flags.add_bos
        if flags.no_bos:
            special["bos"] = None
    for name, _ in _SPECIAL_KEYS:
        special.setdefault(name, None)
        if special[name] is not None and special[name] >= n:
            special[name] = None

    for name, key in _SPECIAL_KEYS:
        v = _as_id(meta, key)
        if v is None:
            continue
        if not 0 <= v < n:  # llama.cpp keeps the default with a warning
            warnings.warn(
                f"{K}{key} = {v} is outside the vocabulary (size {n}); using {special[name]}", stacklevel=3
            )
            continue
        special[name] = v

    add_bos = _as_bool(meta, "add_bos_token", add_bos) or flags.force_bos
    add_eos = _as_bool(meta, "add_eos_token", False)
    add_space_prefix = _as_bool(meta, "add_space_prefix", add_space_prefix)
    if add_bos and special["bos"] is None:
        raise TokenizerError(f"{K}add_bos_token is set but the vocabulary has no BOS token ({K}bos_token_id)")
    if add_eos and special["eos"] is None:
        raise TokenizerError(f"{K}add_eos_token is set but the vocabulary has no EOS token ({K}eos_token_id)")

    eog = _detect_special(tokens, named, attrs, special)
    _per_model_attrs(meta, named, attrs)

    return Vocab(
        kind=kind, tokens=tokens, token_to_id=token_to_id, scores=scores, attrs=attrs, special=special,
        add_bos=add_bos, add_eos=add_eos, add_space_prefix=add_space_prefix, pre=pre,
        byte_map=kind == "bpe" and flags.byte_map,
        ignore_merges=ignore_merges, merges=merges, eog_ids=frozenset(eog),
    )


def _merges(meta: Mapping[str, Any]) -> StringArray:
    if _get(meta, "merges") is None:
        raise TokenizerError(f"{K}merges is missing: a BPE ({_get(meta, 'model')!r}) tokenizer needs its merge rules")
    return _string_array(meta, "merges")


def _detect_special(tokens: StringArray, named: dict[str, int], attrs: np.ndarray,
                    special: dict[str, int | None]) -> set[int]:
    """Fill unnamed eot/eom/fim ids from token texts and build the end-of-generation set, with
    llama.cpp's fix-ups. Mutates `attrs` and `special`."""

    def first_present(names):
        return next((named[t] for t in names if t in named), None)

    for name, names in (("eot", _EOT_NAMES), ("eom", _EOM_NAMES), *_FIM_NAMES.items()):
        if special[name] is None:
            found = first_present(names)
            if found is not None:
                special[name] = found
                attrs[found] |= int(Attr.CONTROL)

    eog = {special[k] for k in ("fim_pad", "fim_rep", "fim_sep") if special[k] is not None}
    for t in _EOG_NAMES:
        i = named.get(t)
        if i is not None:
            eog.add(i)
            attrs[i] |= int(Attr.CONTROL)
    for t in _FORCE_USER_DEFINED:
        if t in named:
            attrs[named[t]] = int(Attr.USER_DEFINED)
    eog.update(special[k] for k in ("eos", "eot", "eom") if special[k] is not None)

    texts = {tokens[i]: i for i in eog}
    # o200k_harmony / solar-open: "<|end|>" is not an end of generation there
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = int(Attr.USER_DEFINED)
    # gemma4 / plamo: "</s>" is an ordinary token
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = int(Attr.NORMAL)
    return eog


def _per_model_attrs(meta: Mapping[str, Any], named: dict[str, int], attrs: np.ndarray) -> None:
    """lstrip/rstrip attributes llama.cpp sets by model name, pre-tokenizer or architecture."""
    name = (meta.get("general.name") or "").lower() if isinstance(meta.get("general.name"), str) else ""
    arch = meta.get("general.architecture") if isinstance(meta.get("general.architecture"), str) else ""
    pre = _get(meta, "pre") if isinstance(_get(meta, "pre"), str) else ""

    def set_attr(text, bit, on):
        i = named.get(text)
        if i is not None:
            attrs[i] = (int(attrs[i]) | bit) if on else (int(attrs[i]) & ~int(bit))

    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        set_attr("<mask>", Attr.LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        attrs[(attrs & int(_SPECIAL_MASK)) != 0] |= int(Attr.RSTRIP)
        set_attr("</s>", Attr.RSTRIP, True)
        for t in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(t, Attr.RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", Attr.LSTRIP, True)
