"""Saved sessions: a sequence's KV cache written to a file and read back into another process.

The file: MAGIC, a little-endian u32 version and u64 header length, the header (JSON: the model
file's sha256, the KV cache types, the tokens, which blocks of each layer group it holds, their
size, and the caller's metadata), the held blocks in the engines' portable layout (csrc/kv.c,
el_kv_read_block), and the sha256 of everything before it. Loading checks the digest before it
trusts a byte, then the model, cache types and context; any mismatch raises StateFileError and
leaves the session as it was (errors.StateFileError).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

from .errors import StateFileError, UnsupportedModelError
from .kv_cache import BLOCK, head_sizes, kv_rotation

MAGIC = b"EDGELLM-KVSTATE\n"
VERSION = 1
_FIXED = struct.Struct("<IQ")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _rotation(llm) -> tuple[int, int]:
    """How the engine stores keys and values (kv_cache.kv_rotation): part of what a block means."""
    return kv_rotation(*head_sizes(llm.config), llm._cache_types)


def check_saveable(llm) -> None:
    if llm._pool.recurrent:  # (the file holds KV blocks; a recurrent state is not one)
        raise UnsupportedModelError(f"{llm.config.arch}: saved sessions do not hold the recurrent state of "
                                    f"its DeltaNet layers yet")


def save(llm, seq, path, meta=None) -> None:
    """Write seq (a KVPool Sequence of llm's engine) to path; meta: JSON-able data kept with it.
    Call with llm's engine lock held."""
    check_saveable(llm)
    eng, pool = llm._engine, llm._pool
    groups = (0, 1) if pool.has_swa else (0,)
    n_blk = -(-seq.n // BLOCK)
    held = [[i for i in range(n_blk) if seq.tables[g, i] >= 0] for g in groups]
    header = {
        "model_sha256": llm.model_sha256, "cache_type_k": llm.cache_type_k, "cache_type_v": llm.cache_type_v,
        "tokens": [int(t) for t in seq.tokens], "held": held,
        "block_bytes": [eng.kv_block_bytes(g) for g in groups],
        "swa_valid": int(getattr(seq, "swa_valid", 0)), "cacheable": bool(seq.cacheable), "meta": meta,
        "kv_rotation": list(_rotation(llm)),
    }
    h = json.dumps(header, separators=(",", ":")).encode()
    digest = hashlib.sha256()
    tmp = Path(f"{path}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        def put(b: bytes) -> None:
            digest.update(b)
            f.write(b)

        put(MAGIC + _FIXED.pack(VERSION, len(h)) + h)
        for g, idx in zip(groups, held):
            for i in idx:
                put(eng.kv_read_block(g, int(seq.tables[g, i])))
        f.write(digest.digest())
    os.replace(tmp, path)  # a reader never sees half a file under the final name


def read(path) -> tuple[dict, bytes]:
    """The header and the blocks' bytes of a state file, after checking its digest."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise StateFileError(f"cannot read the state file {path}: {exc.strerror or exc}") from None
    fixed = len(MAGIC) + _FIXED.size
    if len(data) < fixed + 32 or not data.startswith(MAGIC):
        raise StateFileError(f"{path} is not an edgellm state file (or it is truncated)")
    if hashlib.sha256(data[:-32]).digest() != data[-32:]:
        raise StateFileError(f"{path} is corrupt or truncated (its checksum does not match)")
    version, hlen = _FIXED.unpack_from(data, len(MAGIC))
    if version != VERSION:
        raise StateFileError(f"{path} has state format {version}; this edgellm reads {VERSION}")
    try:
        header = json.loads(data[fixed:fixed + hlen])
    except ValueError:
        raise StateFileError(f"{path} has an unreadable header") from None
    return header, data[fixed + hlen:-32]


def _ints(value) -> list[int]:
    """A header list of integers, as save() writes it (no bools, floats or strings)."""
    if not isinstance(value, list) or any(type(v) is not int for v in value):
        raise ValueError
    return value


def load(llm, seq, path) -> dict | None:
    """Fill the empty seq from a state file; returns its metadata. Call with the engine lock held."""
    check_saveable(llm)
    header, blob = read(path)
    eng, pool = llm._engine, llm._pool
    groups = (0, 1) if pool.has_swa else (0,)
    try:
        tokens, sizes = _ints(header["tokens"]), _ints(header["block_bytes"])
        held = [_ints(header["held"][g]) for g in groups]
        if header["model_sha256"] != llm.model_sha256:
            raise StateFileError(f"{path} was saved from another model (sha256 {str(header['model_sha256'])[:12]}..., "
                                 f"this one {llm.model_sha256[:12]}...)")
        types = (header["cache_type_k"], header["cache_type_v"])
        swa_valid = header.get("swa_valid", 0)
        cacheable = header.get("cacheable", True)
        rotation = tuple(_ints(header.get("kv_rotation", [0, 0])))  # (files before the rotation: none)
        if type(swa_valid) is not int or not 0 <= swa_valid <= len(tokens) or type(cacheable) is not bool or \
                len(rotation) != 2:
            raise ValueError
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        raise StateFileError(f"{path} has an incomplete header") from None
    if types != (llm.cache_type_k, llm.cache_type_v):
        raise StateFileError(f"{path} holds a {types[0]}/{types[1]} KV cache; this model runs "
                             f"{llm.cache_type_k}/{llm.cache_type_v} (-ctk/-ctv)")
    if rotation != _rotation(llm):
        raise StateFileError(f"{path} stores its quantized keys and values unrotated (saved by an older edgellm); "
                             "this one stores them rotated: evaluate the text again" if rotation == (0, 0) else
                             f"{path} stores keys and values rotated in chunks of {rotation}, not as this engine does")
    if len(tokens) > llm.n_ctx:
        raise StateFileError(f"{path} holds {len(tokens)} tokens; the context holds {llm.n_ctx} (raise -c)")
    if sizes[:len(groups)] != [eng.kv_block_bytes(g) for g in groups] or len(sizes) != len(groups):
        raise StateFileError(f"{path} has KV blocks of another shape than this model's")
    n_blk = -(-len(tokens) // BLOCK)
    if held[0] != list(range(n_blk)) or any(not 0 <= i < n_blk for i in held[-1]) or \
            len(set(held[-1])) != len(held[-1]):
        raise StateFileError(f"{path} has an inconsistent block list")
    if len(blob) != sum(len(idx) * s for idx, s in zip(held, sizes)):
        raise StateFileError(f"{path} holds {len(blob)} bytes of blocks, not what its header says")
    if any(not 0 <= t < llm.n_vocab for t in tokens):
        raise StateFileError(f"{path} holds token ids outside the vocabulary")
    if seq.n:
        pool.clear(seq)
    if tokens:
        pool.restore(seq, tokens, held, swa_valid=swa_valid, cacheable=cacheable)
        o = 0
        for g, idx in zip(groups, held):
            for i in idx:
                blk = int(seq.tables[g, i])
                if blk >= 0:  # (a window block the restored sequence no longer needs was dropped)
                    eng.kv_write_block(g, blk, blob[o:o + sizes[g]])
                o += sizes[g]
        pool.settle()
    return header.get("meta")
