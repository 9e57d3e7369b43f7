"""Reference twins of the float and legacy quant types (csrc/quants_generic.c and
kernels/numba_quants.py), through kernels.quant_ops on both backends.

Oracles: ggml's own quantizer output (fixtures/quant/reference_quants.npz), gguf-py's numpy
dequantize / bf16 quantize, numpy's float16, and the error bounds of llama.cpp's
tests/test-quantize-fns.cpp on its synthetic data.
"""

from __future__ import annotations


import gguf
import numpy as np
import pytest

from edgellm.quants import BLOCK_DTYPES, QType, type_info

from edgellm.kernels import numba_quants
from edgellm.kernels import quant_ops

LEGACY = [QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0]
FLOATS = [QType.F16, QType.BF16]
BACKENDS = quant_ops.BACKENDS

# tests/test-quantize-fns.cpp
MAX_QUANTIZATION_REFERENCE_ERROR = 0.0001
MAX_QUANTIZATION_TOTAL_ERROR = 0.002
MAX_DOT_PRODUCT_ERROR = 0.02
TEST_SIZE = 32 * 128


def _ggml_type(t: QType) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType(int(t))


def _synthetic(n: int, offset: float, amplitude: float = 2.0) -> np.ndarray:
    """test-quantize-fns' generate_data: 0.1 + amplitude * cosf(i + offset), stored as float."""
    c = np.cos(np.arange(n, dtype=np.float32) + np.float32(offset)).astype(np.float64)
    return (0.1 + amplitude * c).astype(np.float32)


def _rmse_over_n(a: np.ndarray, b: np.ndarray) -> float:
    """test-quantize-fns' array_rmse: sqrt(sum of squared differences) / n."""
    diff = a.astype(np.float64) - b.astype(np.float64)
    return float(np.sqrt(np.sum(diff * diff)) / a.size)


def _random_blocks(t: QType, nblocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes for nblocks blocks of t, with finite f16 scales of every kind
    (normal, negative, subnormal, zero). Returns uint8 [nblocks * type_size]."""
    dt = BLOCK_DTYPES[t]
    raw = rng.integers(0, 256, size=nblocks * dt.itemsize, dtype=np.uint8)
    blocks = raw.view(dt)
    for field in ("d", "m"):
        if field in dt.names:
            v = (rng.standard_normal(nblocks) * 10.0 ** rng.integers(-6, 3, nblocks)).astype(np.float16)
            v[::7] = np.float16(0.0)
            v[3::11] = np.float16(2.0**-24) * rng.integers(1, 1024, v[3::11].size).astype(np.float16)
            blocks[field] = v
    return raw


@pytest.fixture(scope="module")
def reference(fixtures_dir):
    return np.load(fixtures_dir / "quant" / "reference_quants.npz")


# ---------------------------------------------------------------- exactness against oracles


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", LEGACY, ids=lambda t: t.name)
def test_quantize_matches_ggml_bytes(reference, t, backend):
    got = quant_ops.quantize_rows(t, reference["input"], backend)
    want = reference[t.name]
    assert got.shape == want.shape
    for r in range(want.shape[0]):
        np.testing.assert_array_equal(got[r], want[r], err_msg=f"{t.name} row {r}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", LEGACY, ids=lambda t: t.name)
def test_quantize_ties_match_gguf(t, backend):
    """Blocks of multiples of 0.5 holding both +127 and -127 (times a power of two): scaled values
    land exactly on halves and the largest magnitude is tied, so the rounding rule (roundf, trunc
    of x + 0.5) and which maximum sets the sign of d both show. gguf-py's quantizers follow
    ggml's reference here, the fixture rows do not exercise this."""
    rng = np.random.default_rng(3)
    blocks = rng.integers(-254, 255, size=(64, 32)) / 2.0
    rows = np.arange(64)
    blocks[rows, rng.integers(0, 32, 64)] = 127.0
    blocks[rows, rng.integers(0, 32, 64)] = -127.0
    x = (blocks * 2.0 ** rng.integers(-3, 4, size=(64, 1))).astype(np.float32).reshape(1, -1)
    got = quant_ops.quantize_rows(t, x, backend)
    want = gguf.quants.quantize(x, _ggml_type(t))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", LEGACY, ids=lambda t: t.name)
def test_dequantize_matches_gguf(t, backend):
    rng = np.random.default_rng(int(t))
    n = 32 * 64
    data = _random_blocks(t, n // 32, rng)
    got = quant_ops.dequantize_rows(t, data, n, backend)[0]
    want = gguf.quants.dequantize(data, _ggml_type(t))
    np.testing.assert_array_equal(got, want)


def _special_floats(rng: np.random.Generator) -> np.ndarray:
    """Values where half / bfloat16 rounding is delicate, plus random bit patterns of every exponent."""
    f16_max = 65504.0
    specials = [0.0, -0.0, 1.0, -1.0, f16_max, 65519.99, 65520.0, -65520.0, 1e10, np.inf, -np.inf,
                np.nan, -np.nan, 2.0**-24, 2.0**-25, 3 * 2.0**-25, 2.0**-26, 2.0**-14, 2.0**-14 - 2.0**-25,
                1 + 2.0**-11, 1 + 3 * 2.0**-11, 1e-40, -1e-45, 3.4028235e38, 1.00390625, 1.01171875]
    x = np.array(specials, dtype=np.float32)
    rand_bits = rng.integers(0, 2**32, size=2048, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # halfway cases between adjacent halves, normal and subnormal
    h = np.arange(0, 0x7BFF, 37, dtype=np.uint16).view(np.float16).astype(np.float32)
    h_next = (np.arange(0, 0x7BFF, 37, dtype=np.uint16) + 1).view(np.float16).astype(np.float32)
    halfway = ((h.astype(np.float64) + h_next.astype(np.float64)) / 2).astype(np.float32)
    x = np.concatenate([x, rand_bits, halfway, -halfway])
    return x[: x.size // 32 * 32]


@pytest.mark.parametrize("backend", BACKENDS)
def test_f16_matches_numpy(backend):
    x = _special_floats(np.random.default_rng(1))
    got = quant_ops.quantize_rows(QType.F16, x, backend)[0].view(np.uint16)
    with np.errstate(over="ignore"):  # values beyond the half range become inf, as intended
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    # NaN stays NaN with its sign (ggml writes the quiet NaN 0x7e00 | sign)
    assert np.all(np.isnan(got[nan].view(np.float16)))
    np.testing.assert_array_equal(got[nan] & 0x8000, want[nan] & 0x8000)

    halves = np.arange(2**16, dtype=np.uint16)  # every half, inf and NaN payloads included
    back = quant_ops.dequantize_rows(QType.F16, halves.view(np.uint8), halves.size, backend)[0]
    want_back = halves.view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(back.view(np.uint32), want_back.view(np.uint32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_matches_gguf(backend):
    x = _special_floats(np.random.default_rng(2))
    got = quant_ops.quantize_rows(QType.BF16, x, backend)[0]
    want = gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16)
    np.testing.assert_array_equal(got, want)

    bf = np.arange(2**16, dtype=np.uint16)  # every bfloat16, subnormals, inf and NaN included
    back = quant_ops.dequantize_rows(QType.BF16, bf.view(np.uint8), bf.size, backend)[0]
    np.testing.assert_array_equal(back.view(np.uint32), bf.astype(np.uint32) << 16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_q8_1_block_fields(backend):
    """Q8_1 (the activation type of Q4_1 / Q5_1): qs as Q8_0 writes them, s = half(d * sum(qs))."""
    x = _synthetic(256, 5.0)
    q81 = quant_ops.quantize_rows(QType.Q8_1, x, backend)[0].view(BLOCK_DTYPES[QType.Q8_1])
    q80 = quant_ops.quantize_rows(QType.Q8_0, x, backend)[0].view(BLOCK_DTYPES[QType.Q8_0])
    np.testing.assert_array_equal(q81["d"], q80["d"])
    np.testing.assert_array_equal(q81["qs"], q80["qs"])
    # d of the block before rounding to half: max|x| / 127 in float
    d_float = (np.abs(x.reshape(-1, 32)).max(axis=1) / np.float32(127)).astype(np.float32)
    sums = q81["qs"].astype(np.int32).sum(axis=1).astype(np.float32)
    np.testing.assert_array_equal(q81["s"], (sums * d_float).astype(np.float16))


# ---------------------------------------------------------------- llama.cpp's error bounds


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", LEGACY + FLOATS, ids=lambda t: t.name)
def test_round_trip_error(t, backend):
    x = _synthetic(TEST_SIZE, 0.0)
    q = quant_ops.quantize_rows(t, x, backend)
    y = quant_ops.dequantize_rows(t, q, TEST_SIZE, backend)[0]
    assert _rmse_over_n(x, y) < MAX_QUANTIZATION_TOTAL_ERROR


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", LEGACY + FLOATS + [QType.F32], ids=lambda t: t.name)
def test_dot_product_error(t, backend):
    x = _synthetic(TEST_SIZE, 0.0)
    y = _synthetic(TEST_SIZE, 1.0)
    w = quant_ops.quantize_rows(t, x, backend)[0]
    a = quant_ops.quantize_activation(t, y, backend)
    got = quant_ops.vec_dot(t, TEST_SIZE, w, a, backend)
    ref = float(np.sum((x * y).astype(np.float64)))
    assert abs(got - ref) / TEST_SIZE < MAX_DOT_PRODUCT_ERROR


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 67, 127, 129, 193, 255, 1023])
def test_f32_dot(n, backend):
    a = _synthetic(n, 0.0)
    b = _synthetic(n, 1.0)
    got = quant_ops.vec_dot(QType.F32, n, a.view(np.uint8), b.view(np.uint8), backend)  # rows as raw bytes
    ref = float(np.sum((a * b).astype(np.float64)))
    assert abs(got - ref) / n < MAX_QUANTIZATION_REFERENCE_ERROR


def _dequant_act(act_type: QType, a: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Dequantized activation row, and for Q8_1 also its stored per-block s (d * sum(qs) as a half)."""
    if act_type == QType.Q8_1:
        b = a.view(BLOCK_DTYPES[QType.Q8_1])
        vals = b["qs"].astype(np.float32) * b["d"].astype(np.float32)[:, None]
        return vals.reshape(-1), b["s"].astype(np.float64)
    return gguf.quants.dequantize(a, _ggml_type(act_type)).reshape(-1), None


@pytest.mark.parametrize("batch", [False, True], ids=["llama-order", "batch-order"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", LEGACY, ids=lambda t: t.name)
def test_dot_equals_dot_of_dequantized(t, backend, batch):
    """The integer block dot is the dot of what the blocks hold: weights as gguf dequantizes them,
    activation values d * q, and for Q8_1 the stored s standing in for d * sum(q). Both orders."""
    rng = np.random.default_rng(100 + int(t))
    n = 32 * 16
    w = _random_blocks(t, n // 32, rng)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    act_type = type_info(t).vec_dot_type
    a = quant_ops.quantize_activation(t, x, backend)
    got = quant_ops.vec_dot(t, n, w, a, backend, batch=batch)

    wv = gguf.quants.dequantize(w, _ggml_type(t)).astype(np.float64)
    av, s = _dequant_act(act_type, a)
    av = av.astype(np.float64)
    terms = wv * av
    want = float(terms.sum())
    magnitude = float(np.abs(terms).sum())
    if s is not None:
        # weight = q*d + m: the m part enters through the stored s, not through sum(m * a)
        m = w.view(BLOCK_DTYPES[t])["m"].astype(np.float64)
        m_exact = (m[:, None] * av.reshape(-1, 32)).sum(axis=1)
        want += float((m * s).sum() - m_exact.sum())
        magnitude += float(np.abs(m * s).sum())
    # float32 rounding of per-block products and of the running sum over 16 blocks
    assert abs(got - want) <= 1e-5 * magnitude + 1e-30


# ---------------------------------------------------------------- C twin vs numba twin


@pytest.fixture(scope="module")
def agreement_data():
    rng = np.random.default_rng(7)
    rows = (rng.standard_normal((4, 256)) * np.array([[1e-3], [1.0], [50.0], [1e4]])).astype(np.float32)
    rows[0, :32] = 0.0  # an all-zero block
    rows[1, 32:64] = -0.75  # a constant block
    rows[2, 64:96] = rng.laplace(size=32).astype(np.float32) * 1e-6  # tiny values
    return rows


@pytest.mark.parametrize("t", LEGACY + FLOATS + [QType.Q8_1], ids=lambda t: t.name)
def test_c_and_numba_quantize_alike(agreement_data, t):
    c = quant_ops.quantize_rows(t, agreement_data, "c")
    nb = quant_ops.quantize_rows(t, agreement_data, "numba")
    np.testing.assert_array_equal(c, nb)


@pytest.mark.parametrize("t", LEGACY + FLOATS, ids=lambda t: t.name)
def test_c_and_numba_dequantize_alike(t):
    rng = np.random.default_rng(50 + int(t))
    n = 32 * 32
    if t in FLOATS:
        data = rng.integers(0, 256, size=type_info(t).row_bytes(n), dtype=np.uint8)
    else:
        data = _random_blocks(t, n // 32, rng)
    c = quant_ops.dequantize_rows(t, data, n, "c")
    nb = quant_ops.dequantize_rows(t, data, n, "numba")
    np.testing.assert_array_equal(c.view(np.uint32), nb.view(np.uint32))


@pytest.mark.parametrize("t", LEGACY + FLOATS + [QType.F32], ids=lambda t: t.name)
def test_c_and_numba_dot_alike(agreement_data, t):
    w = quant_ops.quantize_rows(t, agreement_data, "c")
    for batch in (False, True) if t in LEGACY else (False,):
        for r in range(agreement_data.shape[0]):
            act = quant_ops.quantize_activation(t, agreement_data[(r + 1) % 4] + 0.5, "c")
            c = quant_ops.vec_dot(t, 256, w[r], act, "c", batch=batch)
            nb = quant_ops.vec_dot(t, 256, w[r], act, "numba", batch=batch)
            np.testing.assert_allclose(nb, c, rtol=1e-4, atol=0)


# ---------------------------------------------------------------- the batch order, from its definition

def _fma_f32(a: float, b: float, c: float) -> np.float32:
    """fmaf(a, b, c) on float32 values, rounded once (to nearest, ties to even), from exact
    rationals (a float64 sum rounded again to float32 could round twice)."""
    from fractions import Fraction

    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    near = np.float32(float(exact))
    cands = [near, np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(-np.inf))]
    best = min(cands, key=lambda v: (abs(Fraction(float(v)) - exact), int(np.float32(v).view(np.uint32)) & 1))
    return np.float32(best)


def _block_ints(t: QType, wb: np.ndarray) -> np.ndarray:
    """[blocks, 32] the integers a block's values are d times (plus m): ggml's block layouts read
    with numpy (value j and j + 16 share nibble byte j; bit j of qh is value j's fifth bit)."""
    if t == QType.Q8_0:
        return wb["qs"].astype(np.int64)
    qs = wb["qs"].astype(np.int64)
    q = np.concatenate([qs & 15, qs >> 4], axis=1)
    if t in (QType.Q5_0, QType.Q5_1):
        qh = wb["qh"].astype(np.int64) @ (256 ** np.arange(4))
        q |= ((qh[:, None] >> np.arange(32)) & 1) << 4
    return q - {QType.Q4_0: 8, QType.Q5_0: 16}.get(t, 0)


def _batch_order_model(t: QType, w: np.ndarray, a: np.ndarray) -> np.float32:
    """quants_generic.c's batch order spelled out: per block the integer sum of the products,
    acc = fma(isum, dx * dy, acc) block after block; with a min, summs = fma(m, y.s, summs)
    block after block, then acc + summs."""
    wb = w.view(BLOCK_DTYPES[t])
    ab = a.view(BLOCK_DTYPES[type_info(t).vec_dot_type])
    qw = _block_ints(t, wb)
    d = wb["d"].astype(np.float32)
    acc = np.float32(0.0)
    summs = np.float32(0.0)
    for i in range(wb.size):
        isum = int(np.dot(qw[i], ab["qs"][i].astype(np.int64)))
        acc = _fma_f32(np.float32(isum), np.float32(d[i]) * np.float32(ab["d"][i]), acc)
        if "m" in wb.dtype.names:
            summs = _fma_f32(np.float32(wb["m"][i]), np.float32(ab["s"][i]), summs)
    return np.float32(acc + summs) if "m" in wb.dtype.names else acc


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", LEGACY, ids=lambda t: t.name)
def test_batch_order_is_one_fma_per_block(t, backend):
    """vec_dot_*_batch_generic gives the bits of its definition (one rounding per block, the min
    chain added last), on random blocks (scales of every kind) against quantized activations;
    and it is another order than the llama one (they differ somewhere) but for Q4_0, whose only
    order it is (llama.cpp's x86 repacked one: quants_generic.c)."""
    rng = np.random.default_rng(300 + int(t))
    n = 32 * 24
    differ = 0
    for _ in range(6):
        w = _random_blocks(t, n // 32, rng)
        a = quant_ops.quantize_activation(t, (rng.standard_normal(n) * 3).astype(np.float32), "c")
        got = np.float32(quant_ops.vec_dot(t, n, w, a, backend, batch=True))
        want = _batch_order_model(t, w, a)
        if backend == "numba":  # its fmaf rounds a float64 sum to float32: ties may differ by an ulp
            np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)
        else:
            assert got.view(np.uint32) == want.view(np.uint32), (got, want)
        differ += got != np.float32(quant_ops.vec_dot(t, n, w, a, backend))
    assert differ if t != QType.Q4_0 else not differ


@pytest.mark.parametrize("backend", BACKENDS)
def test_q4_0_dots_are_llamacpps_repacked_ones(reference, backend):
    """Q4_0's one order is llama.cpp's on x86: it repacks Q4_0 matrices of 8k rows and its gemv
    and gemm over them give, bit for bit, these dot products (the fixture: ggml's own repacked
    kernels on its own activation quantizer's rows; scripts/make_quant_fixture.py)."""
    acts = np.roll(reference["input"], -1, axis=0)
    want_act = reference["Q4_0_act"]
    got_act = np.stack([quant_ops.quantize_activation(QType.Q4_0, row, backend) for row in acts])
    np.testing.assert_array_equal(got_act, want_act)
    w, n = reference["Q4_0"], acts.shape[1]
    got = np.array([[quant_ops.vec_dot(QType.Q4_0, n, w[r], want_act[c], backend) for r in range(w.shape[0])]
                    for c in range(want_act.shape[0])], dtype=np.float32)
    want = reference["Q4_0_dot"]
    same = got.view(np.uint32) == want.view(np.uint32)
    assert same.all(), f"{(~same).sum()} of {same.size} dot products differ from ggml's repacked ones"


# ---------------------------------------------------------------- bad input


def test_numba_twins_reject_short_buffers():
    x = np.zeros(64, dtype=np.float32)
    with pytest.raises(ValueError, match="smaller"):
        numba_quants.quantize_row_q4_0_ref(x, np.zeros(18, dtype=np.uint8))  # 64 values need 36 bytes
    with pytest.raises(ValueError, match="multiple of the block size"):
        numba_quants.dequantize_row_q8_0(np.zeros(68, dtype=np.uint8), np.zeros(48, dtype=np.float32))
    with pytest.raises(ValueError, match="smaller"):
        numba_quants.vec_dot_q4_1_q8_1_generic(64, np.zeros(40, dtype=np.uint8), np.zeros(36, dtype=np.uint8))
    with pytest.raises(ValueError, match="smaller"):
        numba_quants.vec_dot_f16_f16_generic(10, np.zeros(20, dtype=np.uint8), np.zeros(18, dtype=np.uint8))


def _act_oracle(x: np.ndarray, with_sum: bool) -> np.ndarray:
    """numpy: d = max/127 (to half), q = round-half-even(x * (127/max)), s = half(d * sum(q))."""
    xb = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(xb).max(1)
    safe = np.where(amax == 0, np.float32(1), amax)
    inv = np.where(amax != 0, np.float32(127) / safe, np.float32(0)).astype(np.float32)
    q = np.rint((xb * inv[:, None]).astype(np.float32)).astype(np.int8)
    d = (amax / np.float32(127)).astype(np.float32)
    parts = [d.astype(np.float16).view(np.uint8).reshape(-1, 2)]
    if with_sum:
        s = (q.astype(np.int32).sum(1).astype(np.float32) * d).astype(np.float16)
        parts.append(s.view(np.uint8).reshape(-1, 2))
    parts.append(q.view(np.uint8))
    return np.concatenate(parts, axis=1).reshape(-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", [QType.Q8_0, QType.Q8_1], ids=lambda t: t.name)
def test_activation_quantizers(t, backend):
    """The activation quantizers (x * 127/max, ties to even) against a numpy oracle, including
    values placed exactly on .5 after scaling and an all-zero block."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(256) * 3).astype(np.float32)
    x[:32] = 0.0
    x[32:64] = (np.arange(32) - 16 + 0.5).astype(np.float32) * (127 / 127)  # max 15.5 -> ties after scaling
    x[64] = 127.0
    x[65:96] = np.arange(31, dtype=np.float32) + 0.5
    w = QType.Q4_0 if t == QType.Q8_0 else QType.Q4_1  # a weight type whose dot takes t
    got = quant_ops.quantize_activation(w, x, backend)
    assert np.array_equal(got, _act_oracle(x, t == QType.Q8_1))


@pytest.mark.parametrize("t", [QType.F32, QType.F16, QType.BF16])
def test_numba_float_matmul_equals_its_dot_products(t):
    """The numba engine's matmul of a float type converts each row once; every output is still
    the bits of vec_dot_<t>_<t>_generic on that weight row and activation row (specials too)."""
    from edgellm.kernels.numba_engine import _kernels_for

    rng = np.random.default_rng(7)
    k, n, m = 96, 37, 5
    w = rng.standard_normal((n, k)).astype(np.float32) * 3
    x = rng.standard_normal((m, k)).astype(np.float32)
    w[0, 5], w[1, 7], w[2, 9], x[3, 11] = np.inf, np.nan, 1e-6, -np.inf  # inf, nan, an f16 subnormal
    w[4, :] = 60000.0  # products and sums past f16's range
    wb = quant_ops.quantize_rows(t, w, backend="numba")
    xb = quant_ops.quantize_rows(t, x, backend="numba")
    assert wb.shape == (n, type_info(t).row_bytes(k))
    act, _, matmul = _kernels_for(t)
    assert act == t
    out = np.empty((m, n), np.float32)
    matmul(k, wb, xb, out)
    dot = getattr(numba_quants, f"vec_dot_{t.name.lower()}_{t.name.lower()}_generic")
    want = np.array([[dot(k, wb[r], xb[i]) for r in range(n)] for i in range(m)], np.float32)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
