"""IQ4_NL / IQ4_XS reference twins (csrc/iquants_generic.c and kernels/numba_iquants.py).

Oracles: ggml's own output (fixtures/quant/reference_quants.npz: ggml_quantize_chunk's bytes,
the activations its from_float writes, and the dot products of its repacked IQ4_NL gemv and of
ggml_vec_dot_iq4_xs_q8_K, all made by scripts/make_quant_fixture.py), gguf-py's numpy
`dequantize`, and the synthetic data and error bounds of llama.cpp's tests/test-quantize-fns.cpp.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from edgellm.kernels import quant_ops
from edgellm.quants import BLOCK_DTYPES, IQ4_NL_VALUES, QType, type_info

IQ4 = [QType.IQ4_NL, QType.IQ4_XS]
ids = [t.name for t in IQ4]

# test-quantize-fns.cpp: round-trip error (sqrt(sum of squares) / n) and dot error (|dot - float dot| / n)
MAX_QUANTIZATION_TOTAL_ERROR = 0.002
MAX_DOT_PRODUCT_ERROR = 0.02
TEST_SIZE = 32 * 128


@pytest.fixture(params=quant_ops.BACKENDS)
def backend(request):
    if request.param == "c" and quant_ops.c_module() is None:
        pytest.skip("C kernels not built (python csrc/build_ffi.py)")
    return request.param


@pytest.fixture(scope="module")
def reference(fixtures_dir):
    return np.load(fixtures_dir / "quant" / "reference_quants.npz")


def synthetic(offset: float, n: int) -> np.ndarray:
    """test-quantize-fns.cpp's generate_data: 0.1 + 2 * cosf(i + offset)."""
    c = np.cos(np.arange(n, dtype=np.float32) + np.float32(offset)).astype(np.float64)
    return (0.1 + 2.0 * c).astype(np.float32)


def random_blocks(t: QType, nblocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes (every nibble and every 6-bit scale) with finite f16 scales of many sizes."""
    raw = rng.integers(0, 256, size=nblocks * type_info(t).type_size, dtype=np.uint8)
    blocks = raw.view(BLOCK_DTYPES[t])
    d = (rng.standard_normal(nblocks) * 10.0 ** rng.integers(-6, 3, nblocks)).astype(np.float16)
    d[::7] = 0.0
    d[3::11] = np.float16(2.0 ** -24) * rng.integers(1, 1024, d[3::11].size).astype(np.float16)  # subnormal
    blocks["d"] = d
    return raw


# ---- exact against ggml and gguf-py ------------------------------------------------------------

@pytest.mark.parametrize("t", IQ4, ids=ids)
def test_quantize_matches_ggml(reference, t, backend):
    got = quant_ops.quantize_rows(t, reference["input"], backend)
    want = reference[t.name]
    assert got.shape == want.shape
    bad = [r for r in range(want.shape[0]) if not np.array_equal(got[r], want[r])]
    assert not bad, f"{t.name}/{backend}: rows {bad} differ from ggml_quantize_chunk's"


@pytest.mark.parametrize("t", IQ4, ids=ids)
def test_dequantize_matches_gguf(t, backend):
    rng = np.random.default_rng(500 + int(t))
    raw = random_blocks(t, 40, rng)
    n = 40 * type_info(t).block_size
    got = quant_ops.dequantize_rows(t, raw, n, backend)[0]
    want = gguf_dequantize(raw, gguf.GGMLQuantizationType(int(t))).reshape(-1)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_value_table_is_gguf_pys():
    assert tuple(gguf.quants.IQ4_NL.kvalues) == IQ4_NL_VALUES


@pytest.mark.parametrize("t", IQ4, ids=ids)
def test_dot_products_match_ggml(reference, t, backend):
    """Activations as ggml's from_float writes them, dot products in llama.cpp's x86 order to
    the bit (IQ4_NL: its repacked gemv / gemm; IQ4_XS: its vec_dot, which it takes below 8
    activation rows, our small-batch order)."""
    acts = np.roll(reference["input"], -1, axis=0)
    want_act = reference[f"{t.name}_act"]
    got_act = np.stack([quant_ops.quantize_activation(t, row, backend) for row in acts])
    np.testing.assert_array_equal(got_act, want_act)
    w, n = reference[t.name], acts.shape[1]
    small = t == QType.IQ4_XS
    got = np.array([[quant_ops.vec_dot(t, n, w[r], want_act[c], backend, small=small) for r in range(w.shape[0])]
                    for c in range(want_act.shape[0])], dtype=np.float32)
    want = reference[f"{t.name}_dot"]
    same = got.view(np.uint32) == want.view(np.uint32)
    assert same.all(), f"{(~same).sum()} of {same.size} dot products differ from ggml's, e.g. {got[~same][:3]} vs {want[~same][:3]}"


# ---- llama.cpp's test-quantize-fns bounds ----------------------------------------------------------

@pytest.mark.parametrize("t", IQ4, ids=ids)
def test_round_trip_error(t, backend):
    x = synthetic(0.0, TEST_SIZE)
    y = quant_ops.dequantize_rows(t, quant_ops.quantize_rows(t, x, backend), TEST_SIZE, backend)[0]
    d = x.astype(np.float64) - y
    assert np.sqrt(np.sum(d * d)) / TEST_SIZE < MAX_QUANTIZATION_TOTAL_ERROR


@pytest.mark.parametrize("t", IQ4, ids=ids)
def test_dot_product_error(t, backend):
    x1, x2 = synthetic(0.0, TEST_SIZE), synthetic(1.0, TEST_SIZE)
    w = quant_ops.quantize_rows(t, x1, backend)[0]
    a = quant_ops.quantize_activation(t, x2, backend)
    got = quant_ops.vec_dot(t, TEST_SIZE, w, a, backend)
    ref = float(np.dot(x1.astype(np.float64), x2.astype(np.float64)))
    assert abs(got - ref) / TEST_SIZE < MAX_DOT_PRODUCT_ERROR


@pytest.mark.parametrize("t", IQ4, ids=ids)
def test_dot_equals_dot_of_dequantized(t, backend):
    """On random blocks (every nibble, every 6-bit scale): the dot is the dot of what the blocks
    hold, up to float32 rounding of the per-block terms and of the running sum."""
    rng = np.random.default_rng(600 + int(t))
    n = 8 * 256
    w = random_blocks(t, n // type_info(t).block_size, rng)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    a = quant_ops.quantize_activation(t, x, backend)
    got = quant_ops.vec_dot(t, n, w, a, backend)
    act = type_info(t).vec_dot_type
    av = quant_ops.dequantize_rows(act, a, n, "numba")[0].astype(np.float64)
    wv = gguf_dequantize(w, gguf.GGMLQuantizationType(int(t))).reshape(-1).astype(np.float64)
    terms = wv * av
    assert abs(got - terms.sum()) <= 1e-5 * np.abs(terms).sum() + 1e-30


# ---- C twin against numba twin -------------------------------------------------------------------

def _agreement_rows() -> np.ndarray:
    rng = np.random.default_rng(42)
    n = 2 * 256
    rows = [
        rng.standard_normal(n),
        rng.uniform(-1, 1, n) * 1e-3,
        rng.laplace(0, 0.05, n),
        np.where(rng.random(n) < 0.02, rng.standard_normal(n) * 30, rng.standard_normal(n) * 0.01),
        np.abs(rng.standard_normal(n)) + 0.5,
        -np.abs(rng.standard_normal(n)),
        np.full(n, 1e-16),  # below ggml's group threshold: scale 0
    ]
    zeros_then_data = np.zeros(n)
    zeros_then_data[256 + 40:] = rng.standard_normal(n - 256 - 40)
    rows.append(zeros_then_data)
    return np.array(rows, dtype=np.float32)


@pytest.mark.parametrize("t", IQ4, ids=ids)
def test_c_and_numba_agree(t):
    if quant_ops.c_module() is None:
        pytest.skip("C kernels not built (python csrc/build_ffi.py)")
    x = _agreement_rows()
    n = x.shape[1]
    qc, qn = quant_ops.quantize_rows(t, x, "c"), quant_ops.quantize_rows(t, x, "numba")
    np.testing.assert_array_equal(qc, qn)
    raw = random_blocks(t, n // type_info(t).block_size * 4, np.random.default_rng(9)).reshape(4, -1)
    for q in (qc, raw):
        np.testing.assert_array_equal(quant_ops.dequantize_rows(t, q, n, "c").view(np.uint32),
                                      quant_ops.dequantize_rows(t, q, n, "numba").view(np.uint32))
        for r in range(q.shape[0]):
            a = quant_ops.quantize_activation(t, x[-1 - r] + 0.25, "c")
            dc, dn = quant_ops.vec_dot(t, n, q[r], a, "c"), quant_ops.vec_dot(t, n, q[r], a, "numba")
            assert dn == pytest.approx(dc, rel=1e-6, abs=1e-30)


# ---- what the blocks hold ---------------------------------------------------------------------------

def test_iq4_xs_zero_super_block_is_negative_zero(backend):
    """ggml writes d = -max_scale / 32, a negative zero for an all-zero super-block, and all
    scales 32 (stored +32: zero)."""
    x = np.zeros(512, np.float32)
    x[256:] = synthetic(0.0, 256)
    b = quant_ops.quantize_rows(QType.IQ4_XS, x, backend)[0].view(BLOCK_DTYPES[QType.IQ4_XS])
    assert b["d"].view(np.uint16)[0] == 0x8000 and b["d"][1] != 0
    assert b["scales_h"][0] == 0xAAAA and (b["scales_l"][0] == 0).all()


# ---- bad input ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("t", IQ4, ids=ids)
def test_row_length_not_a_multiple_of_the_block(t, backend):
    with pytest.raises(ValueError, match=f"multiple of {type_info(t).block_size}"):
        quant_ops.quantize_rows(t, np.ones(type_info(t).block_size + 16, dtype=np.float32), backend)


def test_numba_twins_reject_mismatched_buffers():
    from edgellm.kernels import numba_iquants as ni

    with pytest.raises(ValueError, match="multiple of its block size"):
        ni.quantize_row_iq4_nl_ref(np.ones(40, np.float32), np.zeros(18, np.uint8))
    with pytest.raises(ValueError, match="buffer size"):
        ni.quantize_row_iq4_xs_ref(np.ones(256, np.float32), np.zeros(135, np.uint8))
    with pytest.raises(ValueError, match="buffer size"):
        ni.dequantize_row_iq4_nl(np.zeros(18, np.uint8), np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="shorter"):
        ni.vec_dot_iq4_xs_q8_K_generic(512, np.zeros(136, np.uint8), np.zeros(584, np.uint8))
