"""K-quant reference twins (csrc/kquants_generic.c and kernels/numba_kquants.py).

Oracles: ggml's own quantizer output (fixtures/quant/reference_quants.npz), gguf-py's numpy
`dequantize`, and the synthetic data and error thresholds of llama.cpp's
tests/test-quantize-fns.cpp.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from edgellm.kernels import quant_ops
from edgellm.quants import BLOCK_DTYPES, QType, type_info

K_TYPES = [QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K]
QK_K = 256

# test-quantize-fns.cpp: round-trip error (its array_rmse: sqrt(sum of squares) / n) and
# dot product error (|dot - float dot| / n); looser for 2 and 3 bits
MAX_QUANTIZATION_TOTAL_ERROR = {QType.Q2_K: 0.0075, QType.Q3_K: 0.0040}
DEFAULT_TOTAL_ERROR = 0.002
MAX_DOT_PRODUCT_ERROR = {QType.Q2_K: 0.04}
DEFAULT_DOT_ERROR = 0.02
TEST_SIZE = 32 * 128  # test-quantize-fns.cpp's test_size


@pytest.fixture(params=quant_ops.BACKENDS)
def backend(request):
    if request.param == "c" and quant_ops.c_module() is None:
        pytest.skip("C kernels not built (python csrc/build_ffi.py)")
    return request.param


def synthetic(offset: float, n: int, amplitude: float = 2.0) -> np.ndarray:
    """test-quantize-fns.cpp's generate_data: 0.1 + amplitude * cos(i + offset)."""
    i = np.arange(n, dtype=np.float32)
    return (0.1 + amplitude * np.cos(i + np.float32(offset)).astype(np.float64)).astype(np.float32)


def array_rmse(a: np.ndarray, b: np.ndarray) -> float:
    d = a.astype(np.float64) - b.astype(np.float64)
    return float(np.sqrt(np.sum(d * d)) / a.size)


def random_blocks(t: QType, nblocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes for nblocks blocks of type t, with every half-float field finite."""
    raw = rng.integers(0, 256, size=nblocks * type_info(t).type_size, dtype=np.uint8)
    blocks = raw.view(BLOCK_DTYPES[t])
    for field in ("d", "dmin"):
        if field in blocks.dtype.names:
            bits = rng.integers(0, 0x10000, size=nblocks, dtype=np.uint16)
            bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # exponent 31 (inf / nan) -> finite
            blocks[field] = bits.view(np.float16)
    return raw


# ---- quantizers: byte-exact against ggml ------------------------------------------------

@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml(fixtures_dir, t, backend):
    ref = np.load(fixtures_dir / "quant" / "reference_quants.npz")
    x = ref["input"]
    got = quant_ops.quantize_rows(t, x, backend)
    expected = ref[t.name]
    assert got.shape == expected.shape
    bad = [r for r in range(x.shape[0]) if not np.array_equal(got[r], expected[r])]
    assert not bad, f"{t.name}/{backend}: rows {bad} differ from ggml's quantize_row_{t.name}_ref"


# ---- dequantizers: exact against gguf-py -----------------------------------------------

@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf(t, backend):
    rng = np.random.default_rng(1000 + int(t))
    nblocks = 24
    raw = random_blocks(t, nblocks, rng)
    got = quant_ops.dequantize_rows(t, raw, nblocks * QK_K, backend)[0]
    expected = gguf_dequantize(raw, int(t)).reshape(-1)
    assert np.isfinite(expected).all()
    np.testing.assert_array_equal(got, expected)


def test_dequantize_q8_K(backend):
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=3 * 292, dtype=np.uint8)
    blocks = raw.view(BLOCK_DTYPES[QType.Q8_K])
    blocks["d"] = rng.standard_normal(3).astype(np.float32)
    got = quant_ops.dequantize_rows(QType.Q8_K, raw, 3 * QK_K, backend)[0]
    expected = (blocks["d"][:, None] * blocks["qs"].astype(np.float32)).reshape(-1)
    np.testing.assert_array_equal(got, expected)


# ---- llama.cpp's test-quantize-fns bounds ------------------------------------------------

@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_round_trip_error(t, backend):
    x = synthetic(0.0, TEST_SIZE)
    q = quant_ops.quantize_rows(t, x, backend)
    y = quant_ops.dequantize_rows(t, q, TEST_SIZE, backend)[0]
    err = array_rmse(x, y)
    assert err < MAX_QUANTIZATION_TOTAL_ERROR.get(t, DEFAULT_TOTAL_ERROR), err


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_dot_product_error(t, backend):
    x1 = synthetic(0.0, TEST_SIZE)
    x2 = synthetic(1.0, TEST_SIZE)
    w = quant_ops.quantize_rows(t, x1, backend)[0]
    a = quant_ops.quantize_activation(t, x2, backend)
    result = quant_ops.vec_dot(t, TEST_SIZE, w, a, backend)
    ref = float(np.dot(x1.astype(np.float64), x2.astype(np.float64)))
    err = abs(result - ref) / TEST_SIZE
    assert err < MAX_DOT_PRODUCT_ERROR.get(t, DEFAULT_DOT_ERROR), (result, ref, err)


# ---- Q8_K activations ----------------------------------------------------------------------

def test_q8_K_quantize(backend):
    x = synthetic(1.0, TEST_SIZE)
    x[:QK_K] *= 1e-3  # one block of small values: d scales with the block
    raw = quant_ops.quantize_rows(QType.Q8_K, x, backend)[0]
    blocks = raw.view(BLOCK_DTYPES[QType.Q8_K])
    qs = blocks["qs"].astype(np.int32)
    np.testing.assert_array_equal(blocks["bsums"], qs.reshape(-1, 16, 16).sum(axis=-1))
    assert np.abs(qs).max() <= 127
    amax = np.abs(x.reshape(-1, QK_K)).max(axis=1)
    np.testing.assert_allclose(np.abs(blocks["d"]), amax / 127, rtol=1e-6)
    y = quant_ops.dequantize_rows(QType.Q8_K, raw, TEST_SIZE, backend)[0]
    # rounding to the nearest multiple of d: within half a step (plus float rounding)
    half_step = np.repeat(np.abs(blocks["d"]), QK_K) * 0.5
    assert (np.abs(y - x) <= half_step * (1 + 1e-4)).all()
    assert array_rmse(x, y) < DEFAULT_TOTAL_ERROR


def test_q8_K_zero_block(backend):
    x = np.zeros(2 * QK_K, dtype=np.float32)
    x[QK_K:] = synthetic(0.0, QK_K)
    raw = quant_ops.quantize_rows(QType.Q8_K, x, backend)[0]
    assert not raw[:292].any()  # d, qs and bsums all zero
    assert raw[292:].any()


# ---- C twin against numba twin -------------------------------------------------------------

def _agreement_rows() -> np.ndarray:
    rng = np.random.default_rng(42)
    n = 2 * QK_K
    rows = [
        rng.standard_normal(n),
        rng.uniform(-1, 1, n) * 1e-3,
        rng.laplace(0, 0.05, n),
        np.where(rng.random(n) < 0.02, rng.standard_normal(n) * 30, rng.standard_normal(n) * 0.01),
        np.abs(rng.standard_normal(n)) + 0.5,  # all positive: min is clamped to 0
        -np.abs(rng.standard_normal(n)),
    ]
    zeros_then_data = np.zeros(n)
    zeros_then_data[QK_K + 16:] = rng.standard_normal(n - QK_K - 16)
    rows.append(zeros_then_data)
    return np.array(rows, dtype=np.float32)


@pytest.mark.parametrize("t", K_TYPES + [QType.Q8_K], ids=lambda t: t.name)
def test_c_and_numba_agree(t):
    if quant_ops.c_module() is None:
        pytest.skip("C kernels not built (python csrc/build_ffi.py)")
    x = _agreement_rows()
    n = x.shape[1]
    qc = quant_ops.quantize_rows(t, x, "c")
    qn = quant_ops.quantize_rows(t, x, "numba")
    np.testing.assert_array_equal(qc, qn)
    np.testing.assert_array_equal(quant_ops.dequantize_rows(t, qc, n, "c"),
                                  quant_ops.dequantize_rows(t, qc, n, "numba"))
    if t == QType.Q8_K:
        return
    act = quant_ops.quantize_rows(QType.Q8_K, x[::-1], "c")
    for w, a in zip(qc, act):
        dc = quant_ops.vec_dot(t, n, w, a, "c")
        dn = quant_ops.vec_dot(t, n, w, a, "numba")
        assert dn == pytest.approx(dc, rel=1e-4, abs=1e-30)


@pytest.mark.parametrize("t", [QType.Q3_K, QType.Q5_K, QType.Q6_K], ids=lambda t: t.name)
def test_small_batch_order_is_llamacpps_vec_dot(fixtures_dir, t, backend):
    """Below 8 activation rows llama.cpp takes ggml_vec_dot_q3_K_q8_K / _q5_K / _q6_K (from 8 on its
    tiled gemm, whose order the main twins follow): the small-batch twins give its bits, on its own
    activation quantizer's rows (the fixture: scripts/make_quant_fixture.py). numba's fmaf rounds a
    float64 sum to float32, so it may differ by an ulp in a tie."""
    ref = np.load(fixtures_dir / "quant" / "reference_quants.npz")
    acts = np.roll(ref["input"], -1, axis=0)
    a = ref[f"{t.name}_act"]
    np.testing.assert_array_equal(np.stack([quant_ops.quantize_activation(t, r, backend) for r in acts]), a)
    w, n = ref[t.name], acts.shape[1]
    got = np.array([[quant_ops.vec_dot(t, n, w[r], a[c], backend, small=True) for r in range(w.shape[0])]
                    for c in range(a.shape[0])], dtype=np.float32)
    want = ref[f"{t.name}_vec_dot"]
    if backend == "numba":
        np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)
    else:
        same = got.view(np.uint32) == want.view(np.uint32)
        assert same.all(), f"{(~same).sum()} of {same.size} dot products differ from ggml's vec_dot"


# ---- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_row_length_not_multiple_of_256(t, backend):
    with pytest.raises(ValueError, match="multiple of 256"):
        quant_ops.quantize_rows(t, np.ones(300, dtype=np.float32), backend)


def test_numba_rejects_mismatched_buffers():
    from edgellm.kernels import numba_kquants as nk

    x = np.ones(QK_K, dtype=np.float32)
    with pytest.raises(ValueError, match="multiple of 256"):
        nk.quantize_row_q4_K_ref(np.ones(100, dtype=np.float32), np.zeros(144, dtype=np.uint8))
    with pytest.raises(ValueError, match="buffer size"):
        nk.quantize_row_q4_K_ref(x, np.zeros(143, dtype=np.uint8))
    with pytest.raises(ValueError, match="buffer size"):
        nk.dequantize_row_q6_K(np.zeros(210, dtype=np.uint8), np.zeros(2 * QK_K, dtype=np.float32))
    with pytest.raises(ValueError, match="shorter"):
        nk.vec_dot_q5_K_q8_K_generic(2 * QK_K, np.zeros(176, dtype=np.uint8), np.zeros(584, dtype=np.uint8))


# ---- numba's half conversion (numba has no float16 casts) ------------------------------------

def test_numba_half_conversion():
    from edgellm.kernels import numba_kquants as nk

    halves = np.arange(0x10000, dtype=np.uint32).astype(np.uint16)
    as_float = halves.view(np.float16).astype(np.float32)
    finite = np.isfinite(as_float)
    for h in halves[finite][::37]:  # a spread over every exponent, both signs, subnormals
        assert nk._half_to_f32(int(h)) == as_float[h]
        assert nk._f32_to_half(as_float[h]) == h
    rng = np.random.default_rng(3)
    # float32 values between halves, including exact ties, subnormal range and overflow
    lo = as_float[0x0001:0x7BFF]
    hi = as_float[0x0002:0x7C00]
    samples = np.concatenate([
        (lo + (hi - lo) * np.float32(0.5))[::29],  # ties: round to even
        rng.uniform(-70000, 70000, 200).astype(np.float32),
        (rng.standard_normal(200) * 1e-6).astype(np.float32),
        np.array([65504, 65519.99, 65520, 1e-8, -0.0, 0.0, 6.1e-5], dtype=np.float32),
    ])
    with np.errstate(over="ignore"):  # numpy warns when a value rounds to infinity
        expected = samples.astype(np.float16).view(np.uint16)
    for f, h in zip(samples, expected):
        assert nk._f32_to_half(f) == h, f
