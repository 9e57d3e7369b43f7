"""KV cache types (f16, q8_0, q4_0 for keys and values separately) on every engine path: tiny
models against the float64 reference within bounds derived from each type's rounding, a context
shift on quantized keys, the C and numba twins agreeing, and clear errors for what cannot work.

The bounds: a q8_0 / q4_0 value is rounded to a step of amax / 127 (amax / 8) of its 32-value
block, an RMS error of step / sqrt(12) ~ 2.5 sigma / (127 sqrt 12) = 0.0057 sigma (0.090 sigma for
q4_0) for normal values (amax ~ 2.5 sigma). Keys' and values' errors are independent (they add
in quadrature), and a logit moves by at most about as much relative to its spread (measured 0.5
to 0.7 times that on these models); f16's own rounding and the f32 weights' activations are the
1e-3 of test_engine_tiny's F32 bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

import edgellm
from edgellm.batch import LOGITS_ALL
from edgellm.kernels import c_module
from edgellm.quants import QType
from reference_forward import ReferenceModel
from tiny_models import tiny_model

from conftest import engine_paths, use_engine_path

BACKENDS = engine_paths()
EPS = {"f16": 0.0, "q8_0": 2.5 / (127 * math.sqrt(12)), "q4_0": 2.5 / (8 * math.sqrt(12))}
BASE = 1e-3
PROMPT = [1, 70, 260, 261, 262, 45, 46, 47, 263, 264, 80, 81, 265, 266, 90, 91, 92, 93, 267, 259] * 2
TYPES = [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16"), ("f16", "q4_0")]


def bound(tk: str, tv: str) -> float:
    return BASE + math.hypot(EPS[tk], EPS[tv])


def rel_err(a, b) -> float:
    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - b) ** 2)) / np.std(b))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("kvtypes")
    return {arch: tiny_model(d / f"{arch}.gguf", arch, QType.F32) for arch in ("llama", "gemma3")} | {
        "shift": tiny_model(d / "shift.gguf", "llama", QType.F32, n_layer=1),
        "hd40": tiny_model(d / "hd40.gguf", "llama", QType.F32, head_dim=40, n_head=4, n_embd=256)}


def feed(path, tk, tv, ids, *, n_batch=16, n_threads=2, shift=None, more=()):
    llm = edgellm.LLM(path, n_ctx=128, n_batch=n_batch, n_threads=n_threads, cache_type_k=tk, cache_type_v=tv)
    s = llm.session()
    out = s._feed(ids, logits=LOGITS_ALL).copy()
    if shift:
        with llm._engine_lock:
            llm._pool.shift(s._seq, *shift)
        out = s._feed(list(more), logits=LOGITS_ALL).copy()
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("tk,tv", TYPES, ids=[f"{k}-{v}" for k, v in TYPES])
def test_cache_type_matches_float_reference(models, monkeypatch, backend, arch, tk, tv):
    use_engine_path(monkeypatch, backend)
    got = feed(models[arch], tk, tv, PROMPT)
    ref = ReferenceModel(models[arch]).logits(PROMPT)
    err = rel_err(got, ref)
    assert err < bound(tk, tv), f"{tk}/{tv}: error {err:.2e} >= {bound(tk, tv):.2e}"
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 0.1 * np.std(ref)
    assert np.array_equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])


@pytest.mark.parametrize("backend", [BACKENDS[-2] if len(BACKENDS) > 1 else BACKENDS[0], "numba"])
@pytest.mark.parametrize("tk", ["q8_0", "q4_0"])
def test_context_shift_on_quantized_keys(models, monkeypatch, backend, tk):
    """After dropping 8 slots behind the first 4, the moved keys (dequantized, rotated back,
    quantized again: two roundings) give what a fresh evaluation of the kept tokens would."""
    use_engine_path(monkeypatch, backend)
    ids = PROMPT[:30]
    got = feed(models["shift"], tk, "f16", ids, n_batch=8, shift=(4, 8), more=[268])[-1]
    ref = ReferenceModel(models["shift"]).logits(ids[:4] + ids[12:] + [268])[-1]
    assert rel_err(got, ref) < 5e-3 + math.sqrt(2) * EPS[tk]


@pytest.mark.skipif(c_module() is None, reason="C kernels not built")
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_c_and_numba_twins_agree(models, monkeypatch, arch):
    """Same stored bytes and kernels (the numba twins of the quantizers, dot products and p.v):
    the C generic path and numba differ only by their matmul and f16 attention orders."""
    out = []
    for backend in ("c:generic", "numba"):
        use_engine_path(monkeypatch, backend)
        out.append(feed(models[arch], "q8_0", "q4_0", PROMPT))
    assert rel_err(out[0], out[1]) < 1e-3


@pytest.mark.skipif(c_module() is None, reason="C kernels not built")
def test_thread_count_does_not_change_quantized_results(models, monkeypatch):
    use_engine_path(monkeypatch, BACKENDS[-2])
    one = feed(models["gemma3"], "q4_0", "q8_0", PROMPT, n_threads=1)
    two = feed(models["gemma3"], "q4_0", "q8_0", PROMPT, n_threads=2)
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("hk,hv,tk,tv,want", [
    (64, 64, "q8_0", "q8_0", (64, 64)), (256, 256, "q4_0", "q8_0", (256, 64)), (192, 128, "q8_0", "q4_0", (64, 64)),
    (128, 128, "f16", "q8_0", (0, 64)), (96, 64, "q8_0", "f16", (0, 0)), (64, 64, "f16", "f16", (0, 0))])
def test_kv_rotation_chunks(hk, hv, tk, tv, want):
    """Quantized keys rotate in the largest power-of-two chunk (>= 64) dividing the head size,
    values in chunks of 64 (llama.cpp's attn_rot_k / attn_rot_v); f16 and other sizes not at all."""
    from edgellm.kv_cache import CACHE_TYPES, kv_rotation

    assert kv_rotation(hk, hv, (CACHE_TYPES[tk], CACHE_TYPES[tv])) == want


def test_fwht_is_the_orthonormal_hadamard_matrix():
    """numba_kv.fwht (the twin of csrc/ops.c's el_fwht, whose bits test_c_and_numba_twins_agree
    and the shift test hold it to) multiplies each chunk by Sylvester's Hadamard matrix / sqrt(n)
    and is its own inverse."""
    from edgellm.kernels.numba_kv import fwht

    h = np.array([[1.0]])
    while len(h) < 64:
        h = np.block([[h, h], [h, -h]])
    x = np.random.default_rng(0).standard_normal((3, 2, 128)).astype(np.float32)
    want = (x.reshape(-1, 64).astype(np.float64) @ h / 8).reshape(x.shape)
    got = fwht(x, 64)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(fwht(got, 64), x, rtol=0, atol=1e-5)


def test_bad_cache_types_are_refused(models):
    with pytest.raises(ValueError, match="unknown KV cache type 'q5_9'"):
        edgellm.LLM(models["llama"], cache_type_k="q5_9")
    with pytest.raises(ValueError, match="head size 40 is not a multiple of 32"):
        edgellm.LLM(models["hd40"], cache_type_v="q8_0")
    llm = edgellm.LLM(models["hd40"], n_ctx=64, cache_type_k="F16")  # names are case-insensitive
    assert llm.cache_type_k == "f16" and isinstance(llm.generate(PROMPT[:5], max_tokens=2, temperature=0), str)


def test_server_takes_cache_types(models):
    """`edgellm serve -ctk q8_0 -ctv q4_0` serves with that cache; a bad type is one line."""
    import subprocess
    import sys

    pytest.importorskip("starlette")
    from server_process import ServerProcess

    srv = ServerProcess(models["llama"], "-c", "128", "--parallel", "1", "-t", "1", "-ctk", "q8_0", "-ctv", "q4_0")
    try:
        req = {"model": "llama", "prompt": "the cat", "max_tokens": 4, "temperature": 0}
        status, _, body = srv.request("POST", "/v1/completions", req)
        assert status == 200 and isinstance(body["choices"][0]["text"], str), body
    finally:
        assert srv.stop() == 0
    r = subprocess.run([sys.executable, "-m", "edgellm", "serve", str(models["llama"]), "-ctv", "q5_9"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "q5_9" in r.stderr and "Traceback" not in r.stderr
