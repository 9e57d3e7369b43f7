"""`edgellm info`: what a GGUF model file holds, from its header alone (no weights are read).

Keys read (gguf-py constants.py / llama.cpp llama-arch.cpp): general.architecture, general.name,
general.file_type (a LLAMA_FTYPE number), {arch}.context_length, .embedding_length, .block_count,
.attention.head_count(_kv); tokenizer.ggml.model ("llama" is SentencePiece, "gpt2" byte-level BPE,
as llama-vocab.cpp maps them), .tokens, .bos_token_id, .eos_token_id, .add_bos_token;
tokenizer.chat_template (and tokenizer.chat_template.<name> variants).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..gguf_file import GGUFFile, StringArray
from ..quants import type_name

# LLAMA_FTYPE numbers (include/llama.h) -> names, for display
FTYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}
TOKENIZER_KINDS = {"llama": "SPM (SentencePiece)", "gpt2": "BPE (byte-level)", "bert": "WPM (WordPiece)",
                   "t5": "UGM (Unigram)", "rwkv": "RWKV", "plamo2": "PLaMo-2", "none": "none"}
_ARRAY_PREVIEW = 8  # elements of a long array shown


def _plain(v: Any, full: bool) -> Any:
    """A JSON-able metadata value; long arrays summarized unless `full`."""
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, StringArray)):
        if full or len(v) <= _ARRAY_PREVIEW:
            return [_plain(x, full) for x in v]
        return {"array_length": len(v), "first": [_plain(x, full) for x in v[:_ARRAY_PREVIEW]]}
    return v


def _first(v: Any) -> Any:
    if isinstance(v, (list, np.ndarray)):
        return int(v[0]) if len(v) else None
    return v


def model_info(path: str | Path, *, all_keys: bool = False, tensors: bool = False) -> dict:
    """Everything `edgellm info` shows, as plain data. Without all_keys, metadata lists the
    general.* and architecture keys (the tokenizer's tables and templates are summarized apart)."""
    with GGUFFile(path) as g:
        meta = g.metadata
        arch = str(meta.get("general.architecture", ""))
        params = sum(t.n_elements for t in g.tensors.values())
        nbytes = sum(t.nbytes for t in g.tensors.values())
        mix: dict[str, dict[str, int]] = {}
        for t in g.tensors.values():
            m = mix.setdefault(type_name(t.qtype), {"tensors": 0, "bytes": 0, "parameters": 0})
            m["tensors"] += 1
            m["bytes"] += t.nbytes
            m["parameters"] += t.n_elements
        mix = dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"]))
        ft = meta.get("general.file_type")
        tok_model = meta.get("tokenizer.ggml.model")
        templates = sorted(k[len("tokenizer.chat_template."):] for k in meta
                           if k.startswith("tokenizer.chat_template."))
        shown = {k: v for k, v in meta.items()
                 if all_keys or k.startswith("general.") or (arch and k.startswith(arch + "."))}
        info = {
            "path": str(g.path),
            "file_size": g.file_size,
            "gguf_version": g.version,
            "architecture": arch or None,
            "name": meta.get("general.name"),
            "parameters": params,
            "tensor_bytes": nbytes,
            "bits_per_weight": 8 * nbytes / params if params else 0.0,
            "file_type": None if ft is None else FTYPE_NAMES.get(int(ft), f"unknown ({ft})"),
            "context_length": meta.get(f"{arch}.context_length"),
            "embedding_length": meta.get(f"{arch}.embedding_length"),
            "layers": meta.get(f"{arch}.block_count"),
            "heads": _first(meta.get(f"{arch}.attention.head_count")),
            "kv_heads": _first(meta.get(f"{arch}.attention.head_count_kv")),
            "quant_mix": mix,
            "tokenizer": {
                "model": tok_model,
                "kind": TOKENIZER_KINDS.get(tok_model, tok_model),
                "vocab_size": len(meta.get("tokenizer.ggml.tokens", ())),
                "bos_id": meta.get("tokenizer.ggml.bos_token_id"),
                "eos_id": meta.get("tokenizer.ggml.eos_token_id"),
                "add_bos": meta.get("tokenizer.ggml.add_bos_token"),
            },
            "chat_template": "tokenizer.chat_template" in meta,
            "named_chat_templates": templates,
            "metadata_keys": len(meta),
            "metadata": {k: _plain(v, False) for k, v in shown.items()},
        }
        if tensors:
            info["tensors"] = [{"name": t.name, "type": type_name(t.qtype), "shape": list(t.shape),
                                "bytes": t.nbytes, "offset": t.offset} for t in g.tensors.values()]
        return info


def _size(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def _count(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return str(n)


def _value_text(v: Any) -> str:
    if isinstance(v, dict) and "array_length" in v:
        head = ", ".join(repr(x) for x in v["first"])
        return f"[{head}, ...] ({v['array_length']} items)"
    s = repr(v)
    return s if len(s) <= 120 else s[:117] + "..."


def format_text(info: dict) -> str:
    tok = info["tokenizer"]
    lines = [
        f"file:            {info['path']} ({_size(info['file_size'])}, GGUF v{info['gguf_version']})",
        f"architecture:    {info['architecture']}",
        f"name:            {info['name']}",
        f"parameters:      {_count(info['parameters'])} ({info['parameters']:,})",
        f"size:            {_size(info['tensor_bytes'])} of tensors, {info['bits_per_weight']:.2f} bits per weight",
        f"file type:       {info['file_type']}",
        f"context length:  {info['context_length']}",
        f"layers:          {info['layers']} (embedding {info['embedding_length']}, "
        f"heads {info['heads']}, kv heads {info['kv_heads']})",
        f"tokenizer:       {tok['kind']}, {tok['vocab_size']} tokens (bos {tok['bos_id']}, eos {tok['eos_id']}, "
        f"add bos {tok['add_bos']})",
        "chat template:   " + ("yes" if info["chat_template"] else "no")
        + (f" (+ named: {', '.join(info['named_chat_templates'])})" if info["named_chat_templates"] else ""),
        "",
        "quant mix:",
    ]
    for t, m in info["quant_mix"].items():
        share = 100 * m["bytes"] / info["tensor_bytes"] if info["tensor_bytes"] else 0.0
        lines.append(f"  {t:<8} {m['tensors']:5d} tensors  {_size(m['bytes']):>12}  {share:5.1f}%")
    lines += ["", f"metadata ({len(info['metadata'])} of {info['metadata_keys']} keys):"]
    lines += [f"  {k} = {_value_text(v)}" for k, v in info["metadata"].items()]
    if "tensors" in info:
        lines += ["", f"tensors ({len(info['tensors'])}):"]
        w = max(len(t["name"]) for t in info["tensors"]) if info["tensors"] else 0
        for t in info["tensors"]:
            shape = "x".join(map(str, t["shape"]))
            lines.append(f"  {t['name']:<{w}}  {t['type']:<6} {shape:>14}  {_size(t['bytes']):>12}")
    return "\n".join(lines)
