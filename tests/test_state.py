"""Saved sessions (edgellm/state.py): save -> load in a fresh model -> continue gives the bits of
never stopping, on every engine path, with sliding-window layers and quantized caches; the file
is portable between the C and numba engines; bad files are refused with StateFileError and leave
the session as it was."""

from __future__ import annotations

import numpy as np
import pytest

import edgellm
from edgellm.batch import LOGITS_ALL
from edgellm.errors import StateFileError
from edgellm.kv_cache import BLOCK
from edgellm.quants import QType
from tiny_models import tiny_model

from conftest import engine_paths, use_engine_path

HIST = [1] + list(range(40, 140))  # 101 tokens: several blocks, past the sliding window of 8
MORE = [200, 201, 202, 203, 7, 8]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("state")
    return {"llama": tiny_model(d / "l.gguf", "llama", QType.Q8_0),
            "gemma3": tiny_model(d / "g.gguf", "gemma3", QType.Q4_0),
            "other": tiny_model(d / "o.gguf", "llama", QType.Q8_0, seed=1),
            # head size 32: a quantized cache stored as computed (no Walsh-Hadamard rotation)
            "gemma3-hd32": tiny_model(d / "g32.gguf", "gemma3", QType.Q4_0, head_dim=32, n_head=4, n_embd=128)}


def _llm(path, n_ctx=256, **kw):
    return edgellm.LLM(path, n_ctx=n_ctx, n_batch=32, n_threads=2, **kw)


@pytest.mark.parametrize("backend", [engine_paths()[0], engine_paths()[-2], "numba"]
                         if len(engine_paths()) > 2 else engine_paths())
@pytest.mark.parametrize("arch,types", [("llama", ("f16", "f16")), ("gemma3", ("f16", "f16")),
                                        ("gemma3", ("q8_0", "q4_0"))])
def test_save_load_continue_equals_never_stopping(models, tmp_path, monkeypatch, backend, arch, types):
    use_engine_path(monkeypatch, backend)
    kw = dict(cache_type_k=types[0], cache_type_v=types[1])
    a = _llm(models[arch], **kw)
    s = a.session()
    s._feed(HIST)
    s.save_state(tmp_path / "s.state", meta={"note": "hello"})
    want = s._feed(MORE, logits=LOGITS_ALL).copy()

    b = _llm(models[arch], **kw)
    t = b.session()
    assert t.load_state(tmp_path / "s.state") == {"note": "hello"}
    assert t.tokens == HIST and len(t) == len(HIST)
    np.testing.assert_array_equal(t._feed(MORE, logits=LOGITS_ALL), want)


def _rel(a, b) -> float:
    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - b) ** 2)) / np.std(b))


@pytest.mark.skipif(len(engine_paths()) < 2, reason="C kernels not built")
def test_state_file_is_portable_between_engines(models, tmp_path, monkeypatch):
    """Saved by the C engine, loaded by numba (one layout for both): numba's continuation is the
    C engine's (measured: equal; bound 1e-5), far closer than numba's own history gives (the
    paths' prefill differs, 2.9e-3 here) - so every byte landed where numba reads it. (A head
    size whose keys are stored unrotated: a rotation mixes 64 values into each one, so the two
    paths' 1e-6 differences in a new key flip some of its q8_0 roundings, 4e-4 here.)"""
    use_engine_path(monkeypatch, "c:generic")
    a = _llm(models["gemma3-hd32"], cache_type_k="q8_0")
    s = a.session()
    s._feed(HIST)
    s.save_state(tmp_path / "s.state")
    want = s._feed(MORE, logits=LOGITS_ALL).copy()
    use_engine_path(monkeypatch, "numba")
    b = _llm(models["gemma3-hd32"], cache_type_k="q8_0")
    own = b.session()
    own._feed(HIST)
    t = b.session()
    t.load_state(tmp_path / "s.state")
    assert _rel(t._feed(MORE, logits=LOGITS_ALL), want) < 1e-5 < _rel(own._feed(MORE, logits=LOGITS_ALL), want)


def test_llm_prompt_cache_state_skips_the_prompt(models, tmp_path):
    """LLM.save_state / load_state act on generate()'s prompt cache: a fresh LLM that loads it
    holds the tokens without evaluating them, and writes the same greedy text."""
    prompt = list(HIST)
    a = _llm(models["llama"])
    text = a.generate(prompt, max_tokens=6, temperature=0)
    a.save_state(tmp_path / "p.state")
    b = _llm(models["llama"])
    b.load_state(tmp_path / "p.state")
    assert b._session.tokens == a._session.tokens and len(b._session) >= len(prompt)
    assert b.generate(prompt, max_tokens=6, temperature=0) == text


def _saved(models, tmp_path, **kw):
    a = _llm(models["gemma3"], **kw)
    s = a.session()
    s._feed(HIST)
    p = tmp_path / "s.state"
    s.save_state(p)
    return p


@pytest.mark.parametrize("damage", ["truncated", "header byte", "block byte", "empty", "not a state"])
def test_damaged_files_are_refused(models, tmp_path, damage):
    p = _saved(models, tmp_path)
    data = bytearray(p.read_bytes())
    if damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "header byte":
        data[40] ^= 0x01
    elif damage == "block byte":
        data[len(data) - 100] ^= 0x80
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"GGUF" + bytes(200))
    p.write_bytes(bytes(data))
    llm = _llm(models["gemma3"])
    s = llm.session()
    s._feed([1, 5, 6])
    with pytest.raises(StateFileError):
        s.load_state(p)
    assert s.tokens == [1, 5, 6]  # untouched


def test_other_model_cache_type_or_context_are_refused(models, tmp_path):
    p = _saved(models, tmp_path)
    with pytest.raises(StateFileError, match="another model"):
        _llm(models["other"]).session().load_state(p)
    with pytest.raises(StateFileError, match="q8_0/f16 KV cache"):
        _llm(models["gemma3"]).session().load_state(_saved(models, tmp_path / "..", cache_type_k="q8_0"))
    with pytest.raises(StateFileError, match="context holds 64"):
        _llm(models["gemma3"], n_ctx=64).session().load_state(p)
    with pytest.raises(StateFileError, match="cannot read"):
        _llm(models["gemma3"]).session().load_state(tmp_path / "missing.state")


def _resealed(path, header_edit=None, blocks_edit=None) -> None:
    """Rewrite a state file's header (a dict edit) or blocks and give it a valid checksum again,
    so the loader's own checks are what is tried (as scripts/fuzz.py's state target does)."""
    import hashlib
    import json

    from edgellm import state

    data = path.read_bytes()
    fixed = len(state.MAGIC) + state._FIXED.size
    _, hlen = state._FIXED.unpack_from(data, len(state.MAGIC))
    header, blocks = json.loads(data[fixed:fixed + hlen]), data[fixed + hlen:-32]
    if header_edit:
        header_edit(header)
    if blocks_edit:
        blocks = blocks_edit(header, blocks)
    h = json.dumps(header).encode()
    body = state.MAGIC + state._FIXED.pack(state.VERSION, len(h)) + h + blocks
    path.write_bytes(body + hashlib.sha256(body).digest())


def test_quantized_cache_saved_unrotated_is_refused(models, tmp_path):
    """A q8_0 cache saved before keys and values were stored rotated (no kv_rotation in the
    header) holds other bytes than this engine would: refused, not trusted. An f16 one is the
    same either way and still loads."""
    q = _saved(models, tmp_path, cache_type_k="q8_0", cache_type_v="q8_0")
    _resealed(q, header_edit=lambda h: h.pop("kv_rotation"))
    s = _llm(models["gemma3"], cache_type_k="q8_0", cache_type_v="q8_0").session()
    with pytest.raises(StateFileError, match="unrotated"):
        s.load_state(q)
    assert s.tokens == []
    f = _saved(models, tmp_path / "..")
    _resealed(f, header_edit=lambda h: h.pop("kv_rotation"))
    s = _llm(models["gemma3"]).session()
    s.load_state(f)
    assert s.tokens == HIST


@pytest.mark.parametrize("field,value", [("swa_valid", None), ("swa_valid", "3"), ("swa_valid", -1),
                                         ("swa_valid", 10**6), ("cacheable", 1), ("tokens", "abc"),
                                         ("tokens", [1.0, 2.0]), ("held", [["0"]]), ("block_bytes", None),
                                         ("kv_rotation", [64]), ("kv_rotation", "64")])
def test_malformed_header_fields_are_refused_and_the_session_kept(models, tmp_path, field, value):
    """Found by the state fuzz target: a swa_valid of null passed every check, then failed with a
    TypeError after the session had been emptied."""
    p = _saved(models, tmp_path)
    _resealed(p, header_edit=lambda h: h.__setitem__(field, value))
    s = _llm(models["gemma3"]).session()
    s._feed([1, 5, 6])
    with pytest.raises(StateFileError, match="incomplete header"):
        s.load_state(p)
    assert s.tokens == [1, 5, 6]


def _values_nan(header, blocks: bytes) -> bytes:
    """Every key and value of every held block NaN (f16 0x7e00); the slots' positions kept."""
    out, o, pos_bytes = bytearray(blocks), 0, 4 * BLOCK
    for idx, size in zip(header["held"], header["block_bytes"]):
        for _ in idx:
            out[o:o + size - pos_bytes] = np.full((size - pos_bytes) // 2, 0x7E00, np.uint16).tobytes()
            o += size
    assert o == len(out)
    return bytes(out)


@pytest.mark.parametrize("backend", [engine_paths()[-2] if len(engine_paths()) > 1 else "numba", "numba"])
def test_non_finite_values_stay_in_their_own_sequence(models, tmp_path, monkeypatch, backend):
    """A state whose keys and values are all NaN loads (the file says so: its own session
    computes with them); once that session ends, a new one on the same blocks computes what it
    always does. (C's p.v multiplies every slot of a tile, masked ones by 0, and 0 * NaN is NaN:
    a reused block is zeroed before another sequence writes into it - found by the state fuzz
    target; without it the C path gives NaN logits here.)"""
    use_engine_path(monkeypatch, backend)
    p = _saved(models, tmp_path)
    _resealed(p, blocks_edit=_values_nan)
    llm = _llm(models["gemma3"])
    fresh = llm.session()
    want = fresh._feed(HIST[:20]).copy()
    fresh.close()
    s = llm.session()
    s.load_state(p)
    assert len(s) == len(HIST)
    s._feed([7])
    s.close()
    for _ in range(2):  # the blocks the NaN session held are reused, partial tail block and all
        t = llm.session()
        np.testing.assert_array_equal(t._feed(HIST[:20]), want)
        t.close()
