"""x86 SIMD kernels (csrc/x86_avx2.c, x86_avx2_dots.h, x86_avx512.c) against the generic twins,
on every ISA this machine runs.

What is checked, per weight type and ISA:
- gemm is bit-identical to the same ISA's vec_dot for every (row, column), whatever the tile
  position and size (so prefill and token-by-token decode give identical logits);
- a matmul through the dispatch (el_matmul: activation quantization + gemm tiles + threads)
  agrees with the generic path within 1e-5 of the sum of |products|, and its single-row results
  equal the rows of a 17-row run bit-exactly;
- llama.cpp's test-quantize-fns dot-product bound against the float dot;
- the SIMD activation quantizers write the same bytes as the generic ones (quantize_row_q8_0,
  quantize_row_q8_1, quantize_row_q8_K_ref);
- the attention / activation helpers (el_vops) give the portable twins' bits.

The registered kernels themselves are reached through the library's `el_traits` and `el_vops`
tables (cffi in ABI mode on the same shared object; the structs mirror el_type_traits and
el_vec_ops in csrc/el_internal.h).
"""

from __future__ import annotations

import os

import cffi
import numpy as np
import pytest

from edgellm.kernels import ISA_NAMES, c_module, quant_ops
from edgellm.kv_cache import PV_CHUNK
from edgellm.quants import BLOCK_DTYPES, QType, type_info
from edgellm.quants import TYPES as TYPES_TABLE

_mod = c_module()
pytestmark = pytest.mark.skipif(_mod is None, reason="C kernels not built (python csrc/build_ffi.py)")

TYPES = [QType.F32, QType.F16, QType.BF16, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0,
         QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K, QType.IQ4_NL, QType.IQ4_XS]
WITH_MIN = {QType.Q4_1, QType.Q5_1}  # q*d + m, dotted through the activation's s

# tests/test-quantize-fns.cpp
MAX_DOT_PRODUCT_ERROR = {QType.Q2_K: 0.04}
DEFAULT_DOT_ERROR = 0.02
TEST_SIZE = 32 * 128
REL_TOL = 1e-5  # of the sum of |products|

_ABI = cffi.FFI()
_ABI.cdef("""
typedef void (*el_from_float_fn)(const float *x, void *y, int64_t k);
typedef void (*el_to_float_fn)(const void *x, float *y, int64_t k);
typedef void (*el_vec_dot_fn)(int n, float *s, const void *x, const void *y);
typedef void (*el_gemm_fn)(int n, const void *w, size_t ldw, int nr,
                           const void *a, size_t lda, int nc, float *out, size_t ldo);
typedef struct {
    int blck; int size; int vec_dot_type;
    el_from_float_fn from_float; el_to_float_fn to_float; el_vec_dot_fn vec_dot; el_gemm_fn gemm;
    el_vec_dot_fn vec_dot_small; el_gemm_fn gemm_small;
    el_vec_dot_fn vec_dot_batch; el_gemm_fn gemm_batch;
} el_type_traits;
extern el_type_traits el_traits[40];
typedef uint16_t el_half;
typedef struct {
    void (*f32_to_f16)(int n, const float *x, el_half *y);
    void (*f16_to_f32)(int n, const el_half *x, float *y);
    void (*qk_tile)(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out);
    void (*qk_tile_one)(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out, const el_half *next);
    void (*qk_q8_0)(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, const uint8_t *kt, float *out,
                    const uint8_t *next);
    void (*qk_q4_0)(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, const uint8_t *kt, float *out,
                    const uint8_t *next);
    void (*pv_tiles)(int nd, int nt, const el_half *const *vt, int nh, const float *w, int ldw, float *acc,
                     int lda, int sets, int t0, const el_half *const *next, int nn);
    void (*pv_q8_0)(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda);
    void (*pv_q4_0)(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda);
    void (*sum16_rows)(int n, const float *acc, float *out);
    void (*silu_mul)(int64_t n, float *g, const float *u);
    void (*scale_max)(int nh, const float *src, float scale, float *dst, size_t ldd, float *lmax);
    double (*exp_sums)(int n, float *x, float max, float *sums);
    void (*f16_scale)(int n, float *x, float s);
    void (*rope)(float *x, int n_heads, int head_dim, int n_rot, int rope_type, const float *cache);
    void (*rmsnorm_rows)(int rows, float *y, size_t ldy, const float *x, size_t ldx, const float *w, int n, float eps);
} el_vec_ops;
extern el_vec_ops el_vops;
void el_kq_put(int type, uint8_t *kt, int hk, int slot, const uint8_t *row);
void el_kq_get(int type, const uint8_t *kt, int hk, int slot, uint8_t *row);
void el_vq_put(int type, uint8_t *vt, int slot, const uint8_t *row);
void el_vq_get(int type, const uint8_t *vt, int slot, uint8_t *row);
""")
VOPS = ["f32_to_f16", "f16_to_f32", "qk_tile", "qk_tile_one", "qk_q8_0", "qk_q4_0", "pv_tiles", "pv_q8_0", "pv_q4_0", "sum16_rows", "silu_mul",
        "scale_max", "exp_sums", "f16_scale", "rope", "rmsnorm_rows"]


def _variants() -> list[str]:
    """ISA variants to test: avx2 with and without AVX-VNNI, avx512 (where the CPU runs them)."""
    if _mod is None:
        return []
    best = _mod[1].el_cpu_isa_best()
    out = []
    if best >= ISA_NAMES.index("avx2") and ISA_NAMES[best] != "neon":
        out += ["avx2", "avx2-novnni"]
    if ISA_NAMES[best] == "avx512":
        out.append("avx512")
    return out


VARIANTS = _variants()


class Kernels:
    """The C library with one ISA selected; restores the default on close."""

    def __init__(self, variant: str):
        self.ffi, self.lib = _mod
        self.abi = _abi_lib()
        self.variant = variant
        self.select(variant)

    def select(self, variant: str) -> None:
        isa = variant.split("-")[0]
        if variant.endswith("-novnni"):
            os.environ["EDGELLM_X86_VNNI"] = "0"
        try:
            got = self.lib.el_set_isa(ISA_NAMES.index(isa))
        finally:
            os.environ.pop("EDGELLM_X86_VNNI", None)
        assert ISA_NAMES[got] == isa

    def close(self) -> None:
        os.environ.pop("EDGELLM_X86_VNNI", None)
        self.lib.el_set_isa(-1)

    # -- the registered kernels
    def traits(self, t: QType):
        return self.abi.el_traits[int(t)]

    def quantize_act(self, t: QType, x: np.ndarray) -> np.ndarray:
        """Rows of x quantized by the registered from_float of t's activation type."""
        act = type_info(t).vec_dot_type
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
        out = np.zeros((x.shape[0], type_info(act).row_bytes(x.shape[1])), dtype=np.uint8)
        fn = self.abi.el_traits[int(act)].from_float
        for r in range(x.shape[0]):
            fn(_ABI.cast("float *", x[r].ctypes.data), _ABI.cast("void *", out[r].ctypes.data), x.shape[1])
        return out

    def vec_dot_all(self, t: QType, n: int, w: np.ndarray, a: np.ndarray, small: bool = False,
                    batch: bool = False) -> np.ndarray:
        """out[c, r] = vec_dot(w row r, a row c) (vec_dot_small with `small`, vec_dot_batch with `batch`
        where the type has one: else vec_dot serves both orders, as in the engine)."""
        tr = self.traits(t)
        fn = tr.vec_dot_small if small else tr.vec_dot_batch if batch and tr.vec_dot_batch != _ABI.NULL else tr.vec_dot
        out = np.zeros((a.shape[0], w.shape[0]), dtype=np.float32)
        s = _ABI.new("float *")
        for c in range(a.shape[0]):
            for r in range(w.shape[0]):
                fn(n, s, _ABI.cast("void *", w[r].ctypes.data), _ABI.cast("void *", a[c].ctypes.data))
                out[c, r] = s[0]
        return out

    def gemm(self, t: QType, n: int, w: np.ndarray, a: np.ndarray, out: np.ndarray, r0: int, nr: int, c0: int, nc: int,
             batch: bool = False):
        """One gemm call on rows r0..r0+nr of w and rows c0..c0+nc of a, into out[c, r] (gemm_batch
        with `batch` where the type has one, as vec_dot_all)."""
        tr = self.traits(t)
        fn = tr.gemm_batch if batch and tr.gemm_batch != _ABI.NULL else tr.gemm
        assert fn != _ABI.NULL
        ldo = out.shape[1]
        fn(n, _ABI.cast("void *", w[r0].ctypes.data), w.strides[0], nr,
           _ABI.cast("void *", a[c0].ctypes.data), a.strides[0], nc,
           _ABI.cast("float *", out.ctypes.data + (c0 * ldo + r0) * 4), ldo)

    # -- through the dispatch
    def matmul(self, t: QType, w: np.ndarray, n: int, x: np.ndarray, n_threads: int) -> np.ndarray:
        ffi = self.ffi
        tensor = ffi.new("el_tensor *")
        tensor.type = int(t)
        tensor.data = ffi.from_buffer(w)
        tensor.ne0 = n
        tensor.ne1 = w.shape[0]
        tensor.row_bytes = w.shape[1]
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.full((x.shape[0], w.shape[0]), np.nan, dtype=np.float32)
        rc = self.lib.el_matmul(tensor, ffi.from_buffer("float[]", x), x.shape[0], ffi.from_buffer("float[]", y), n_threads)
        assert rc == 0
        return y


_abi_cache: list = []


def _abi_lib():
    """The same shared object, opened in ABI mode for its el_traits table."""
    if not _abi_cache:
        from edgellm import _kernels  # type: ignore[attr-defined]

        _abi_cache.append(_ABI.dlopen(_kernels.__file__))
    return _abi_cache[0]


@pytest.fixture(params=VARIANTS)
def kern(request):
    k = Kernels(request.param)
    yield k
    k.close()


# ---------------------------------------------------------------- data

def _row_len(t: QType) -> int:
    if type_info(t).block_size == 256:
        return 3 * 256
    if type_info(t).block_size == 32:
        return 19 * 32  # an odd number of blocks, more than 16
    return 203  # float types: not a multiple of 8


def _weights(t: QType, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Rows quantized by the reference quantizer from values of varied scale per row."""
    x = rng.standard_normal((rows, n)).astype(np.float32) * np.exp(rng.uniform(-3, 3, (rows, 1))).astype(np.float32)
    x[:, :32] += rng.uniform(-2, 2, (rows, 1)).astype(np.float32)  # blocks with an offset
    return quant_ops.quantize_rows(t, x)


def _raw_weights(t: QType, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes (every bit pattern of the quants, e.g. -128 in Q8_0) with finite scales."""
    info = type_info(t)
    raw = rng.integers(0, 256, size=(rows, info.row_bytes(n)), dtype=np.uint8)
    if t in BLOCK_DTYPES:
        blocks = raw.reshape(-1).view(BLOCK_DTYPES[t])
        for field in ("d", "m", "dmin"):
            if field in blocks.dtype.names:
                blocks[field] = (rng.standard_normal(blocks.size) * 10.0 ** rng.integers(-4, 2, blocks.size)).astype(np.float16)
    elif t == QType.F32:
        raw[:] = rng.standard_normal((rows, n)).astype(np.float32).view(np.uint8)
    elif t == QType.F16:
        raw[:] = rng.standard_normal((rows, n)).astype(np.float16).view(np.uint8)
    else:  # BF16: the top halves of floats
        raw[:] = (rng.standard_normal((rows, n)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return raw


def _acts(m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((m, n)).astype(np.float32) * np.exp(rng.uniform(-2, 2, (m, 1))).astype(np.float32)
    x[:, 40:72] = 0.0  # an all-zero block for every activation type
    return x


def _dequant_acts(t: QType, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Activation values as the reference quantizes them (and the Q8_1 s per block)."""
    act = type_info(t).vec_dot_type
    q = np.stack([quant_ops.quantize_activation(t, row) for row in x])
    if act in (QType.F32, QType.F16, QType.BF16):
        return quant_ops.dequantize_rows(act, q, x.shape[1]), None
    b = q.reshape(-1).view(BLOCK_DTYPES[act])
    vals = (b["qs"].astype(np.float64) * b["d"].astype(np.float64)[:, None]).reshape(x.shape)
    s = b["s"].astype(np.float64).reshape(x.shape[0], -1) if act == QType.Q8_1 else None
    return vals, s


def _magnitude(t: QType, w: np.ndarray, n: int, x: np.ndarray) -> np.ndarray:
    """[m, rows] sum over the dot's float terms of their magnitude: sum |w_i a_i| with every part
    of a weight counted positive (q*|d| + |m| for Q4_1/Q5_1, d*sc*q + |dmin|*m for the K-quants
    with mins), plus sum |m * s| over blocks where the weight min meets the activation's s."""
    wm = w.copy()
    if t in BLOCK_DTYPES:
        b = wm.reshape(-1).view(BLOCK_DTYPES[t])
        for f in ("d", "m"):
            if f in b.dtype.names:
                b[f] = np.abs(b[f])
        if "dmin" in b.dtype.names:
            b["dmin"] = -np.abs(b["dmin"])
    wv = np.abs(quant_ops.dequantize_rows(t, wm, n).astype(np.float64))
    av, s = _dequant_acts(t, x)
    mag = np.abs(av) @ wv.T
    if t in WITH_MIN:
        mins = np.abs(w.reshape(-1).view(BLOCK_DTYPES[t])["m"].astype(np.float64)).reshape(w.shape[0], -1)
        mag += np.abs(s) @ mins.T
    return mag


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# ---------------------------------------------------------------- what each variant registers

def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _kernel_addrs(variant: str) -> dict:
    k = Kernels(variant)
    try:
        return {t: (int(_ABI.cast("intptr_t", k.traits(t).vec_dot)), int(_ABI.cast("intptr_t", k.traits(t).gemm)))
                for t in TYPES}
    finally:
        k.close()


@pytest.mark.skipif(not VARIANTS, reason="no x86 SIMD ISA on this CPU")
def test_variants_register_their_own_kernels():
    """Each variant replaces every generic kernel, with a gemm; AVX-VNNI and AVX-512 VNNI (when
    the CPU has them, per /proc/cpuinfo) bring kernels of their own for the quantized types."""
    flags = _cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags")
    generic = _kernel_addrs("generic")
    addrs = {v: _kernel_addrs(v) for v in VARIANTS}
    quantized = [t for t in TYPES if type_info(t).block_size > 1]
    for v, got in addrs.items():
        for t in TYPES:
            assert got[t][0] != generic[t][0] and got[t][1] != 0, (v, t.name)
    if "avx_vnni" in flags:
        assert all(addrs["avx2"][t] != addrs["avx2-novnni"][t] for t in quantized)
    if "avx512" in addrs and {"avx512_vnni", "avx512dq"} <= flags:
        assert all(addrs["avx512"][t] != addrs["avx2"][t] for t in quantized)


def test_type_table_matches_quants_py():
    """The C kernels' type table (el_register_generic) says what quants.TYPES says: block size,
    bytes per block and activation type of every type edgellm runs, nothing for the others."""
    k = Kernels("generic")
    try:
        for t, info in TYPES_TABLE.items():
            if int(t) >= 40:
                continue
            tr = k.traits(t)
            if info.supported:
                assert (tr.blck, tr.size, tr.vec_dot_type) == (info.block_size, info.type_size, int(info.vec_dot_type)), t.name
                assert tr.vec_dot != _ABI.NULL and tr.to_float != _ABI.NULL, t.name
            elif t not in (QType.Q8_1, QType.Q8_K):  # activation types: rows to quantize into, no dot
                assert tr.blck == 0, t.name
    finally:
        k.close()


@pytest.mark.parametrize("t", [t for t in TYPES if type_info(t).block_size > 1], ids=lambda t: t.name)
def test_quantized_vec_dot_bit_identical_to_generic(kern, t):
    """Every quantized kernel returns its generic twin's bits, on quantized and on raw blocks."""
    rng = np.random.default_rng(5000 + int(t))
    n = _row_len(t)
    for raw in (False, True):
        w = _raw_weights(t, 13, n, rng) if raw else _weights(t, 13, n, rng)
        a = kern.quantize_act(t, _acts(5, n, rng))
        got = kern.vec_dot_all(t, n, w, a)
        kern.select("generic")
        want = kern.vec_dot_all(t, n, w, a)
        kern.select(kern.variant)
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"raw={raw}")


# ---------------------------------------------------------------- gemm == vec_dot, bit for bit

@pytest.mark.parametrize("raw", [False, True], ids=["quantized", "raw"])
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_gemm_bit_identical_to_vec_dot(kern, t, raw):
    rng = np.random.default_rng(int(t) * 7 + raw)
    n, rows, cols = _row_len(t), 21, 11
    w = _raw_weights(t, rows, n, rng) if raw else _weights(t, rows, n, rng)
    a = kern.quantize_act(t, _acts(cols, n, rng))
    want = kern.vec_dot_all(t, n, w, a)
    assert np.all(np.isfinite(want))
    # one call over everything, engine-sized tiles, and odd offsets / sizes
    for tiles in ([(0, rows, 0, cols)],
                  [(r, min(16, rows - r), c, min(8, cols - c)) for r in range(0, rows, 16) for c in range(0, cols, 8)],
                  [(r, min(5, rows - r), c, min(3, cols - c)) for r in range(0, rows, 5) for c in range(0, cols, 3)],
                  [(1, rows - 1, 0, 1), (0, 1, 0, cols), (1, rows - 1, 1, cols - 1)]):
        out = np.full((cols, rows), np.nan, dtype=np.float32)
        for r0, nr, c0, nc in tiles:
            kern.gemm(t, n, w, a, out, r0, nr, c0, nc)
        covered = np.isfinite(out)
        np.testing.assert_array_equal(_bits(out)[covered], _bits(want)[covered], err_msg=f"tiles {tiles}")


@pytest.mark.parametrize("t", [t for t in TYPES if type_info(t).block_size > 1], ids=lambda t: t.name)
def test_gemm_more_columns_than_a_pass(kern, t):
    """The x86 many-column gemms take their columns 32 at a time (legacy_gemm, kquant_gemm): one
    call of 35 columns (and 6 rows: a partial 4-row panel) gives vec_dot's bits."""
    rng = np.random.default_rng(9000 + int(t))
    n, rows, cols = _row_len(t), 6, 35
    w = _raw_weights(t, rows, n, rng)
    a = kern.quantize_act(t, _acts(cols, n, rng))
    out = np.full((cols, rows), np.nan, dtype=np.float32)
    kern.gemm(t, n, w, a, out, 0, rows, 0, cols)
    np.testing.assert_array_equal(_bits(out), _bits(kern.vec_dot_all(t, n, w, a)))


@pytest.mark.parametrize("blocks", [19, 260])
@pytest.mark.parametrize("t", [t for t in TYPES if type_info(t).block_size == 32], ids=lambda t: t.name)
def test_gemm_column_groups(kern, t, blocks):
    """The AVX-512 legacy gemm takes prepared groups of 8 columns, then of 4, 3, 2 (13 columns:
    8 + 4 + 1); rows too long for 8 prepared columns on its stack (LEGACY_PREP_BYTES; 260
    blocks) take groups of 4, prepared (Q4_1, Q5_1) or not (the types with an offset). vec_dot's
    bits every way."""
    rng = np.random.default_rng(9100 + int(t) + blocks)
    n, rows, cols = blocks * 32, 5, 13
    w = _raw_weights(t, rows, n, rng)
    a = kern.quantize_act(t, _acts(cols, n, rng))
    out = np.full((cols, rows), np.nan, dtype=np.float32)
    kern.gemm(t, n, w, a, out, 0, rows, 0, cols)
    np.testing.assert_array_equal(_bits(out), _bits(kern.vec_dot_all(t, n, w, a)))


@pytest.mark.parametrize("blocks", [3, 57])
@pytest.mark.parametrize("t", [QType.Q4_K, QType.Q5_K], ids=lambda t: t.name)
def test_gemm_column_lane_groups(kern, t, blocks):
    """The AVX-512 Q4_K / Q5_K gemm takes groups of 16 columns one per int32 lane while 16 or
    more are left (rows two at a time, then one), the rest through its row-lane tiles (16 rows,
    up to 8 columns): 1-9, 15, 16, 24 = 16 + 8, 29 = 16 + 8 + 5 and 20 = 16 + 4 columns, 21 rows
    (a whole row tile and a part), on raw blocks (every quant byte and scale bit), give the
    generic twin's bits for every (row, column); so do rows too long for a group on the stack
    (KCL_PREP_BYTES: 57 super-blocks), which all take the row-lane tiles."""
    rng = np.random.default_rng(9200 + int(t) + blocks)
    n, rows = blocks * 256, 21
    w = _raw_weights(t, rows, n, rng)
    a = kern.quantize_act(t, _acts(29, n, rng))
    kern.select("generic")
    want = kern.vec_dot_all(t, n, w, a)
    kern.select(kern.variant)
    for cols in (*range(1, 10), 15, 16, 24, 29, 20):
        out = np.full((cols, rows), np.nan, dtype=np.float32)
        kern.gemm(t, n, w, a, out, 0, rows, 0, cols)
        np.testing.assert_array_equal(_bits(out), _bits(want[:cols]), err_msg=f"{cols} columns")


FLOAT_TYPES = [QType.F32, QType.F16, QType.BF16]


@pytest.mark.parametrize("n", [8, 192, 203, 1029])
@pytest.mark.parametrize("t", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_gemm_is_the_avx2_tile(kern, t, n):
    """The float types have one order on x86 (x86_float.h ft_tile: 8 float lanes flushed into
    double lanes every 64 values): every variant's gemm gives the AVX2 vec_dot's bits for every
    (row, column), whatever the column count of the call (1..9: tiles of 3 rows x 2 columns on
    AVX2 and 4 x 3 on AVX-512, a single column's tiles, odd rows included) and the row length
    (one group of 8, whole flushes, a tail, a partial flush)."""
    rng = np.random.default_rng(9300 + int(t) + n)
    rows = 11
    # values around 2^-11 with a few around 2^13: float lanes summing products of very different
    # sizes, so which values share a lane and when it restarts shows in the bits (the order of
    # the double additions hardly can: the result is rounded to float)
    def wide(shape):
        return (rng.standard_normal(shape) * np.where(rng.random(shape) < 0.05, 2.0 ** 13, 2.0 ** -11)).astype(np.float32)

    w = kern.quantize_act(t, wide((rows, n)))  # (rows of the weight type: F32 / F16 / BF16 as the activations)
    a = kern.quantize_act(t, wide((9, n)))
    kern.select("avx2")
    want = kern.vec_dot_all(t, n, w, a)
    kern.select(kern.variant)
    assert np.all(np.isfinite(want))
    for cols in range(1, 10):
        for r0, nr in ((0, rows), (3, 5), (2, 1)):
            out = np.full((cols, rows), np.nan, dtype=np.float32)
            kern.gemm(t, n, w, a, out, r0, nr, 0, cols)
            np.testing.assert_array_equal(_bits(out[:, r0:r0 + nr]), _bits(want[:cols, r0:r0 + nr]),
                                          err_msg=f"{cols} columns, rows {r0}..{r0 + nr}")


@pytest.mark.parametrize("n", [64, 576, 1536, 96, 200])
@pytest.mark.parametrize("t", [QType.F16, QType.F32], ids=lambda t: t.name)
def test_float_llama_order_matches_portable(kern, t, n):
    """F16 and F32 weights in llama.cpp's orders (float_llama.c: llama_order steps): one activation
    row in ggml_vec_dot_f16's order (on AVX2 and AVX-512 an F16 kernel of their own, the rows
    converted in registers, for rows of a multiple of 64 values; F32 the portable loops), several in
    tinyBLAS's (the ISA's tiles for both types): every variant gives the portable loops' bits,
    over row counts around the kernel's 16-row reductions and its prefetch distance, tinyBLAS's tiles
    whole and cut, and row lengths with a tail past the last 64 (added in double) or, for
    tinyBLAS, none."""
    ffi, lib = _mod
    rng = np.random.default_rng(9400 + n + int(t))
    rows = 37

    def wide(shape):  # as in test_float_gemm_is_the_avx2_tile: the lanes' grouping shows in the bits
        return (rng.standard_normal(shape) * np.where(rng.random(shape) < 0.05, 2.0 ** 13, 2.0 ** -11)).astype(np.float32)

    w = kern.quantize_act(t, wide((rows, n)))
    a = kern.quantize_act(t, wide((70, n)))

    def run(tinyblas, nr, nc):
        out = np.full((nc, nr), np.nan, dtype=np.float32)
        lib.el_float_llama_gemm(int(t), tinyblas, n, ffi.from_buffer(w), w.strides[0], nr, ffi.from_buffer(a),
                                a.strides[0], nc, ffi.cast("float *", out.ctypes.data), nr)
        return out

    cases = [(0, nr, 1) for nr in (1, 3, 9, 16, 17, rows)]
    if n % 16 == 0:  # (tiles of 4 rows x 6 columns on AVX-512, 64 columns converted at a time)
        cases += [(1, 36, 13), (1, rows, 5), (1, 8, 2), (1, 4, 70)]
    kern.select("generic")
    want = [run(*c) for c in cases]
    kern.select(kern.variant)
    for c, ref in zip(cases, want):
        assert np.all(np.isfinite(ref))
        np.testing.assert_array_equal(_bits(run(*c)), _bits(ref), err_msg=f"tinyblas, rows, columns {c}")


# ---------------------------------------------------------------- the legacy types' batch order

LEGACY = [QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0]
# Q4_0 has one order, the batch one (llama.cpp's x86 repacked order: quants_generic.c)
TWO_ORDERS = [t for t in LEGACY if t != QType.Q4_0]


def test_legacy_batch_order_registered():
    """The legacy types but Q4_0 have batch-order kernels on the generic path (the twins) and
    each SIMD variant registers its own; the other types have none (vec_dot serves both), and Q4_0's
    own vec_dot on every SIMD variant is its batch-order kernel (checked against the twin below)."""
    generic = Kernels("generic")
    try:
        gen = {t: int(_ABI.cast("intptr_t", generic.traits(t).vec_dot_batch)) for t in TYPES}
        for t in TYPES:
            assert (gen[t] != 0) == (t in TWO_ORDERS), t.name
            assert (generic.traits(t).gemm_batch == _ABI.NULL), t.name
        for v in VARIANTS:
            generic.select(v)
            for t in TWO_ORDERS:
                tr = generic.traits(t)
                assert int(_ABI.cast("intptr_t", tr.vec_dot_batch)) not in (0, gen[t]) and tr.gemm_batch != _ABI.NULL, (v, t.name)
            assert generic.traits(QType.Q4_0).gemm != _ABI.NULL, v
    finally:
        generic.close()


@pytest.mark.parametrize("t", LEGACY, ids=lambda t: t.name)
def test_batch_vec_dot_bit_identical_to_generic(kern, t):
    """vec_dot_batch returns its generic twin's bits, on quantized and on raw blocks."""
    rng = np.random.default_rng(5100 + int(t))
    n = _row_len(t)
    for raw in (False, True):
        w = _raw_weights(t, 13, n, rng) if raw else _weights(t, 13, n, rng)
        a = kern.quantize_act(t, _acts(5, n, rng))
        got = kern.vec_dot_all(t, n, w, a, batch=True)
        kern.select("generic")
        want = kern.vec_dot_all(t, n, w, a, batch=True)
        kern.select(kern.variant)
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"raw={raw}")


@pytest.mark.parametrize("blocks", [19, 380])
@pytest.mark.parametrize("t", LEGACY, ids=lambda t: t.name)
def test_batch_gemm_bit_identical_to_generic(kern, t, blocks):
    """gemm_batch gives the generic twin's bits for every (row, column) whatever the tile: one call
    over 35 columns (AVX-512: 16-row tiles of at most 16 columns, in groups as even as can be,
    11 + 12 + 12), the engine's shapes, a 16-row tile and its remainder at each column count 1..17
    (a verification step's; AVX-512 keeps the min terms of more than 8 in a pass of their own),
    odd offsets; raw blocks. At rows of 380 blocks the 28 columns are more than one chunk of
    prepared groups on the stack (AVX-512's LRT_PREP_BYTES: one group, 14 + 14) and than AVX2's
    seeds of one chunk (LB_SEEDS: 16 columns)."""
    rng = np.random.default_rng(9300 + int(t) + blocks)
    n = blocks * 32
    rows, cols = (21, 35) if blocks < 100 else (5, 28)
    w = _raw_weights(t, rows, n, rng)
    a = kern.quantize_act(t, _acts(cols, n, rng))
    kern.select("generic")
    want = kern.vec_dot_all(t, n, w, a, batch=True)
    kern.select(kern.variant)
    assert np.all(np.isfinite(want))
    shapes = [[(0, rows, 0, cols)],
              [(r, min(16, rows - r), c, min(8, cols - c)) for r in range(0, rows, 16) for c in range(0, cols, 8)],
              [(r, min(5, rows - r), c, min(3, cols - c)) for r in range(0, rows, 5) for c in range(0, cols, 3)],
              [(1, rows - 1, 0, 1), (0, 1, 0, cols), (1, rows - 1, 1, cols - 1)]]
    shapes += [[(0, rows, 0, k)] for k in range(1, 18) if k <= cols]
    for tiles in shapes:
        out = np.full((cols, rows), np.nan, dtype=np.float32)
        for r0, nr, c0, nc in tiles:
            kern.gemm(t, n, w, a, out, r0, nr, c0, nc, batch=True)
        covered = np.zeros(out.shape, dtype=bool)
        for r0, nr, c0, nc in tiles:
            covered[c0:c0 + nc, r0:r0 + nr] = True
        assert np.array_equal(np.isfinite(out), covered), f"tiles {tiles}: entries written"
        np.testing.assert_array_equal(_bits(out)[covered], _bits(want)[covered], err_msg=f"tiles {tiles}")


# ---------------------------------------------------------------- through the dispatch vs generic

@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("m", [1, 3, 8, 17])
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_matmul_matches_generic(kern, t, m, n_threads):
    rng = np.random.default_rng(1000 + int(t) * 31 + m)
    n, rows = _row_len(t), 37
    w = _weights(t, rows, n, rng)
    x = _acts(m, n, rng)
    kern.select("generic")
    want = kern.matmul(t, w, n, x, 1)
    kern.select(kern.variant)
    got = kern.matmul(t, w, n, x, n_threads)
    err = np.abs(got.astype(np.float64) - want)
    bound = REL_TOL * _magnitude(t, w, n, x) + 1e-30
    assert np.all(err <= bound), f"worst error / bound {np.max(err / bound):.3g}"


# Rows of a batch of m that llama.cpp (and so the engine) computes with its small-batch kernels,
# counted from the end (el_small_rows in csrc/el_internal.h)
SMALL_ROWS = {QType.Q3_K: lambda m: m if m < 8 else 0, QType.Q4_K: lambda m: m % 4,
              QType.Q5_K: lambda m: m if m < 8 else 0, QType.Q6_K: lambda m: m if m < 8 else 0,
              QType.IQ4_XS: lambda m: m if m < 8 else 0}


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("t", [t for t in TYPES if t not in SMALL_ROWS], ids=lambda t: t.name)
@pytest.mark.parametrize("variant", ["generic"] + VARIANTS)
def test_decode_rows_equal_batch_rows(variant, t, n_threads):
    """Each activation row alone (decode) gives the same bits as inside a batch of 17 (prefill)."""
    k = Kernels(variant)
    try:
        rng = np.random.default_rng(3000 + int(t))
        n, rows = _row_len(t), 37
        w = _weights(t, rows, n, rng)
        x = _acts(17, n, rng)
        batch = k.matmul(t, w, n, x, n_threads)
        for c in (0, 5, 8, 16):
            one = k.matmul(t, w, n, x[c:c + 1], n_threads)
            np.testing.assert_array_equal(_bits(one[0]), _bits(batch[c]), err_msg=f"row {c}")
    finally:
        k.close()


@pytest.mark.parametrize("t", list(SMALL_ROWS), ids=lambda t: t.name)
@pytest.mark.parametrize("variant", ["generic"] + VARIANTS)
def test_small_batch_kernels(variant, t):
    """Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS: a batch's rows take the batch kernel or the small-batch
    one as llama.cpp chooses, on every path with the generic twin's bits."""
    k = Kernels(variant)
    try:
        rng = np.random.default_rng(4000 + int(t))
        n, rows = _row_len(t), 37
        for raw in (False, True):
            w = _raw_weights(t, rows, n, rng) if raw else _weights(t, rows, n, rng)
            x = _acts(29, n, rng)
            a = k.quantize_act(t, x)
            main, small = k.vec_dot_all(t, n, w, a), k.vec_dot_all(t, n, w, a, small=True)
            assert np.all(np.isfinite(small))
            k.select("generic")
            np.testing.assert_array_equal(_bits(k.vec_dot_all(t, n, w, a, small=True)), _bits(small))
            np.testing.assert_array_equal(_bits(k.vec_dot_all(t, n, w, a)), _bits(main))
            k.select(variant)
            for m in (1, 3, 5, 8, 12, 17, 29):  # (12, 29: column-lane groups of fewer than 16 columns)
                got = k.matmul(t, w, n, x[:m], 2)
                split = m - SMALL_ROWS[t](m)
                np.testing.assert_array_equal(_bits(got[:split]), _bits(main[:split]), err_msg=f"m={m}")
                np.testing.assert_array_equal(_bits(got[split:]), _bits(small[split:m]), err_msg=f"m={m}")
    finally:
        k.close()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_raw_blocks_match_generic(kern, t):
    """Every bit pattern of the quants and scales of both signs and many magnitudes."""
    rng = np.random.default_rng(2000 + int(t))
    n, rows = _row_len(t), 19
    w = _raw_weights(t, rows, n, rng)
    x = _acts(9, n, rng)
    kern.select("generic")
    want = kern.matmul(t, w, n, x, 1)
    kern.select(kern.variant)
    got = kern.matmul(t, w, n, x, 2)
    err = np.abs(got.astype(np.float64) - want)
    bound = REL_TOL * _magnitude(t, w, n, x) + 1e-30
    assert np.all(err <= bound), f"worst error / bound {np.max(err / bound):.3g}"


# ---------------------------------------------------------------- llama.cpp's bound

def _synthetic(n: int, offset: float) -> np.ndarray:
    """test-quantize-fns' generate_data: 0.1 + 2 * cos(i + offset)."""
    c = np.cos(np.arange(n, dtype=np.float32) + np.float32(offset)).astype(np.float64)
    return (0.1 + 2.0 * c).astype(np.float32)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dot_product_error(kern, t):
    x = _synthetic(TEST_SIZE, 0.0)
    y = _synthetic(TEST_SIZE, 1.0)
    w = quant_ops.quantize_rows(t, x)
    got = float(kern.matmul(t, w, TEST_SIZE, y[None, :], 1)[0, 0])
    ref = float(np.dot(x.astype(np.float64), y.astype(np.float64)))
    assert abs(got - ref) / TEST_SIZE < MAX_DOT_PRODUCT_ERROR.get(t, DEFAULT_DOT_ERROR)


# ---------------------------------------------------------------- activation quantizers

def _act_data(n: int, rng: np.random.Generator) -> np.ndarray:
    rows = [rng.standard_normal(n) * 10.0 ** e for e in (-30, -3, 0, 4)]
    ties = np.zeros(n)  # max 127 -> d = 1: every x.5 is a rounding tie
    ties[:] = rng.integers(-254, 255, n) / 2.0
    ties[::32] = 127.0
    rows.append(ties)
    sym = rng.standard_normal(n)  # the largest magnitude twice with both signs: first one wins
    sym[::64] = 0.0
    sym[5::64] = -9.0
    sym[9::64] = 9.0
    rows.append(sym)
    zero = rng.standard_normal(n)
    zero[:256] = 0.0  # all-zero blocks (and a negative zero)
    zero[7] = -0.0
    rows.append(zero)
    return np.array(rows, dtype=np.float32)


@pytest.mark.parametrize("n", [1024, 1280])  # (AVX-512 takes Q8_0 / Q8_1 16 blocks at a time: 40 = 16 + 16 + 8)
@pytest.mark.parametrize("act", [QType.Q8_0, QType.Q8_1, QType.Q8_K], ids=lambda t: t.name)
def test_activation_quantizer_bytes(kern, act, n):
    rng = np.random.default_rng(int(act) + n)
    x = _act_data(n, rng)
    weight = {QType.Q8_0: QType.Q8_0, QType.Q8_1: QType.Q4_1, QType.Q8_K: QType.Q4_K}[act]
    got = kern.quantize_act(weight, x)
    want = np.stack([quant_ops.quantize_activation(weight, row) for row in x])
    for r in range(x.shape[0]):
        np.testing.assert_array_equal(got[r], want[r], err_msg=f"row {r}")


# ---------------------------------------------------------------- attention / activation helpers

def _ptr(ctype: str, a: np.ndarray):
    assert a.flags.c_contiguous
    return _ABI.cast(ctype, a.ctypes.data)


def _f16_values(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    """f16-valued floats (queries and probabilities are rounded to f16 before the tiles)."""
    return (rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)


def _special_halves(rng: np.random.Generator, shape, inf: bool) -> np.ndarray:
    """f16 bits of a tile: normal values with a share of subnormals (both signs) and of +0 / -0,
    and with inf one +inf and one -inf"""
    h = _f16_values(rng, shape).astype(np.float16).view(np.uint16).copy()
    sub = rng.uniform(size=shape) < 0.2
    h[sub] = rng.integers(1, 0x400, shape, dtype=np.uint16)[sub] | (rng.integers(0, 2, shape, dtype=np.uint16)[sub] << 15)
    h[rng.uniform(size=shape) < 0.05] = 0x0000
    h[rng.uniform(size=shape) < 0.05] = 0x8000
    if inf:
        h[3, 5], h[shape[0] - 2, 12] = 0x7C00, 0xFC00
    return h


def _exp_inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    """[-120, 90] (underflow to subnormals and zero, overflow to infinity), dense around the
    edges of the fast range and of |n| > 192, plus ordinary values."""
    parts = [rng.uniform(-120.0, 90.0, n), rng.uniform(-105.0, -85.0, n), rng.uniform(85.0, 90.0, n // 4),
             rng.uniform(-134.0, -132.0, n // 8), rng.uniform(132.0, 134.0, n // 8),
             rng.standard_normal(n) * 4.0, [0.0, -0.0, 1e-30, -1e-30, 88.72, -87.33, -103.97, -103.28]]
    x = np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])
    return x[: len(x) // 16 * 16]


def _key_tile(t: QType, rows: np.ndarray) -> np.ndarray:
    """16 key rows of q8_0 / q4_0 blocks (uint8 [16, row_bytes]) as a key tile (csrc/el_internal.h):
    the scales as [blocks][16] halves, then the quants as [blocks][groups][16][4] bytes."""
    bs, ng = (34, 8) if t == QType.Q8_0 else (18, 4)
    r = rows.reshape(16, -1, bs)
    d = r[:, :, :2].transpose(1, 0, 2)
    qs = r[:, :, 2:].reshape(16, r.shape[1], ng, 4).transpose(1, 2, 0, 3)
    return np.ascontiguousarray(np.concatenate([d.ravel(), qs.ravel()]))


def _key_queries(rng: np.random.Generator, nq: int, hk: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """nq queries quantized to q8_0 as attention does (rows of hk / 32 blocks and `pad` bytes) and the
    sums of their blocks' quants"""
    x = rng.standard_normal((nq, hk)).astype(np.float32) * np.exp(rng.uniform(-2, 2, (nq, 1))).astype(np.float32)
    q = np.stack([quant_ops.quantize_activation(QType.Q8_0, row) for row in x])
    qs = q.reshape(nq, hk // 32, 34)[:, :, 2:].view(np.int8).astype(np.int32)
    rows = np.zeros((nq, q.shape[1] + pad), np.uint8)
    rows[:, : q.shape[1]] = q
    return rows, np.ascontiguousarray(qs.sum(axis=2), dtype=np.int32)


def _key_rows(rng: np.random.Generator, t: QType, hk: int, raw: bool) -> np.ndarray:
    """16 key rows: quantized by the cache's quantizer, or (raw) random quants (-128 too) under
    finite scales"""
    x = rng.standard_normal((16, hk)).astype(np.float32) * np.exp(rng.uniform(-2, 2, (16, 1))).astype(np.float32)
    if t == QType.Q8_0:  # as kv.c stores keys: the type's from_float
        rows = np.stack([quant_ops.quantize_activation(QType.Q8_0, row) for row in x])
    else:
        rows = quant_ops.quantize_rows(t, x)
    if raw:
        bs = 34 if t == QType.Q8_0 else 18
        r = rows.reshape(16, -1, bs)
        r[:, :, 2:] = rng.integers(0, 256, r[:, :, 2:].shape, dtype=np.uint8)
    return rows


def _value_tiles(t: QType, rows: np.ndarray) -> np.ndarray:
    """Value rows of q8_0 / q4_0 blocks (uint8 [16 n, nb blocks]) as value tiles (csrc/el_internal.h),
    uint8 [nb, n, tile bytes]: tile i of block b holds rows 16 i .. 16 i + 15's block b, as the 16
    scales (halves), then 8 pairs of slots, a pair's quant bytes interleaved (slot 2p, slot 2p + 1)."""
    bs = 34 if t == QType.Q8_0 else 18
    r = rows.reshape(-1, 16, rows.shape[1] // bs, bs).transpose(2, 0, 1, 3)  # [nb, n, 16, bs]
    nb, n = r.shape[:2]
    d = r[..., :2].reshape(nb, n, 32)
    qs = r[..., 2:].reshape(nb, n, 8, 2, bs - 2).transpose(0, 1, 2, 4, 3).reshape(nb, n, 16 * (bs - 2))
    return np.ascontiguousarray(np.concatenate([d, qs], axis=2))


def _tile_ptrs(tiles: np.ndarray, absent: int | None = None):
    """vt for pv_q8_0 / pv_q4_0: tile i at tiles[i] (uint8 [n, tile bytes]), tile `absent` NULL
    (tiles must outlive it)"""
    vt = _ABI.new("uint8_t *[]", tiles.shape[0])
    for i in range(tiles.shape[0]):
        vt[i] = _ABI.NULL if i == absent else _ABI.cast("uint8_t *", tiles[i].ctypes.data)
    return vt


def _run_pv_q(vops, t: QType, rows: np.ndarray, b0: int, nh: int, w: np.ndarray, ldw: int, acc: np.ndarray, lda: int,
              t0: int, ldc: int, absent: int | None = None) -> None:
    """pv_q8_0 / pv_q4_0 over the value rows' blocks from b0 on (as value tiles, as attention's
    pv_q_tiles calls them: a value group at a time, a call a chunk of PV_CHUNK tiles, tile 0 being
    tile t0 of its sequence), block b0 + b's dims into acc + 32 b, chunk k's sums at + (k - t0 //
    PV_CHUNK) ldc (ldc 0: all into the same sums, chunk after chunk)"""
    tiles = _value_tiles(t, rows)
    fn = vops.pv_q8_0 if t == QType.Q8_0 else vops.pv_q4_0
    nt = tiles.shape[1]
    for b in range(tiles.shape[0] - b0):
        vt = _tile_ptrs(tiles[b0 + b], absent)
        c0 = 0
        while c0 < nt:
            k = (t0 + c0) // PV_CHUNK
            c1 = min(nt, (k + 1) * PV_CHUNK - t0)
            fn(c1 - c0, vt + c0, nh, _ptr("float *", w) + 16 * c0, ldw,
               _ptr("float *", acc) + 32 * b + (k - t0 // PV_CHUNK) * ldc, lda)
            c0 = c1


def _stress_pv_inputs(rng: np.random.Generator, t: QType, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """Value rows and weights that stress pv_q8_0 / pv_q4_0's integer sums: 8 tiles of 16 rows of nb
    blocks ([128, row bytes]) and 5 rows of weights ([5, 128], f16 values). Tile 0: weights from 1
    down over many orders of magnitude to f16 subnormals; tile 1: the largest quants (q8_0 -128,
    q4_0 nibble 0: -8), scales of both signs up to 1023, one slot's w * d the largest, scaled to
    just below 2^15 (rounds to 32768: saturates); tile 2: a block with all scales zero, another with f16 subnormal scales;
    tile 3: scales of both signs over many magnitudes, random quants; tile 4 absent (the caller
    passes NULL: zero weights); row 2 all zero weights; row 4 zero over tile 6."""
    bs = 34 if t == QType.Q8_0 else 18
    rows = quant_ops.quantize_rows(t, rng.standard_normal((128, 32 * nb)).astype(np.float32))
    r = rows.reshape(8, 16, nb, bs)

    def put_d(tile, slot, blk, h):  # f16 bits h as the scale of a block
        r[tile, slot, blk, 0:2] = np.array([h], dtype=np.uint16).view(np.uint8)

    w = rng.uniform(0, 1, (5, 128)).astype(np.float16).astype(np.float32)
    w[:, :16] = (2.0 ** -(1.6 * np.arange(16))).astype(np.float16).astype(np.float32)  # 1 .. 2^-24
    r[1, :, :, 2:] = 0x80 if t == QType.Q8_0 else 0x00
    w[:, 16 + 3] = 1025 / 2048  # (1025 / 1024) * (2046 / 1024) / 2: the mantissas' product 2097150 / 2^20
    for b in range(nb):
        put_d(1, 3, b, np.float16(2046 / 2048 * 1024).view(np.uint16))
        for slot in range(16):
            if slot != 3:
                put_d(1, slot, b, np.float16(rng.uniform(1, 500) * (-1) ** slot).view(np.uint16))
    for slot in range(16):
        put_d(2, slot, 0, 0)
        put_d(2, slot, nb - 1, int(rng.integers(1, 0x400)) | (0x8000 if slot % 3 == 0 else 0))
    r[3, :, :, 2:] = rng.integers(0, 256, r[3, :, :, 2:].shape, dtype=np.uint8)
    for slot in range(16):
        for b in range(nb):
            put_d(3, slot, b, np.float16(10.0 ** rng.uniform(-7, 4) * (-1) ** (slot + b)).view(np.uint16))
    w[:, 64:80] = 0.0  # tile 4: absent
    w[2] = 0.0
    w[4, 96:112] = 0.0
    return rows, w


def _run_qk_q(vops, name: str, t: QType, hk: int, rows: np.ndarray, q: np.ndarray, qsum: np.ndarray) -> np.ndarray:
    kt = _key_tile(t, rows)
    nxt = kt[::-1].copy()  # a tile to prefetch (every other call: none)
    out = np.zeros((q.shape[0], 16), np.float32)
    getattr(vops, name)(hk, _ptr("uint8_t *", q), q.shape[1], _ptr("int32_t *", qsum), q.shape[0],
                        _ptr("uint8_t *", kt), _ptr("float *", out), _ptr("uint8_t *", nxt) if q.shape[0] % 2 else _ABI.NULL)
    return out


def _run_vops(vops, rng_seed: int) -> dict:
    """Every el_vops entry of the selected table on fixed random inputs; outputs as arrays."""
    rng = np.random.default_rng(rng_seed)
    out = {}
    # conversions: many magnitudes (f16 subnormals, overflow to inf), odd length
    x = (rng.standard_normal(203) * 10.0 ** rng.integers(-9, 6, 203)).astype(np.float32)
    x[:3] = [0.0, -0.0, 65520.0]
    y = np.zeros(203, dtype=np.uint16)
    vops.f32_to_f16(203, _ptr("float *", x), _ptr("el_half *", y))
    out["f32_to_f16"] = y
    h = rng.integers(0, 0x10000, 203, dtype=np.uint16)
    h[(h & 0x7C00) == 0x7C00] &= 0xFC00  # no NaNs (infinities kept)
    f = np.zeros(203, dtype=np.float32)
    vops.f16_to_f32(203, _ptr("el_half *", h), _ptr("float *", f))
    out["f16_to_f32"] = f
    for hk in (40, 64, 80, 128, 256):
        kt = _f16_values(rng, (hk, 16)).astype(np.float16).view(np.uint16)
        for nq, ldq in ((1, hk), (3, hk + 5), (5, hk + 1), (6, hk + 2), (8, hk)):
            q = _f16_values(rng, (nq, ldq), 4.0)
            o = np.zeros((nq, 16), dtype=np.float32)
            vops.qk_tile(hk, _ptr("float *", q), nq, ldq, _ptr("el_half *", kt), _ptr("float *", o))
            out[f"qk_tile hk={hk} nq={nq}"] = o
        nxt = _f16_values(rng, (hk, 16)).astype(np.float16).view(np.uint16)  # the tile prefetched (or none)
        for nq, ldq in ((1, hk), (3, hk), (4, hk + 3), (6, hk + 1)):
            q = _f16_values(rng, (nq, ldq), 4.0)
            o = np.zeros((nq, 16), dtype=np.float32)
            vops.qk_tile_one(hk, _ptr("float *", q), nq, ldq, _ptr("el_half *", kt), _ptr("float *", o),
                             _ptr("el_half *", nxt) if nq != 3 else _ABI.NULL)
            out[f"qk_tile_one hk={hk} nq={nq}"] = o
    for name, qt in (("qk_q8_0", QType.Q8_0), ("qk_q4_0", QType.Q4_0)):  # quantized key tiles
        for hk in (32, 64, 96, 128, 256):
            for nq, raw in ((1, False), (3, True), (4, False), (7, True), (11, False)):
                q, qsum = _key_queries(rng, nq, hk, pad=nq % 3)
                rows = _key_rows(rng, qt, hk, raw)
                out[f"{name} hk={hk} nq={nq}"] = _run_qk_q(vops, name, qt, hk, rows, q, qsum)
    for hv in (64, 80, 256):
        # 11 tiles (more than one pass of 8), 9 or 3 rows (kernels may take them in groups; the 3-row
        # weights last, for the quantized p.v below); some (row, tile) pairs all zero, one tile absent
        nt = 11
        tiles = [_f16_values(rng, (hv, 16)).astype(np.float16).view(np.uint16) for _ in range(nt)]
        for nh, sets, nd, d0 in ((9, 1, hv, 0), (9, 4, hv, 0), (3, 1, hv, 0), (3, 4, hv, 0), (3, 1, hv // 2 - 8, 8)):
            w = rng.uniform(0, 1, (nh, nt * 16)).astype(np.float16).astype(np.float32)
            w[:, 3] = 0.0
            w[1, 16:32] = 0.0
            w[nh - 1, 32:48] = 0.0
            w[:, 5 * 16:6 * 16] = 0.0
            vt = _ABI.new("el_half *[]", nt)
            for t in range(nt):
                vt[t] = _ABI.NULL if t == 5 else _ABI.cast("el_half *", tiles[t].ctypes.data) + d0 * 16
            lda = sets * nd * 16 + 5
            acc = rng.standard_normal(nh * lda).astype(np.float32)
            # the tiles to prefetch (a hint: the same results): these again (one absent), or none
            nxt = (vt, nt) if sets == 4 else (_ABI.NULL, 0)
            vops.pv_tiles(nd, nt, vt, nh, _ptr("float *", w), nt * 16, _ptr("float *", acc), lda, sets, 2, *nxt)
            out[f"pv_tiles hv={hv} nh={nh} sets={sets} nd={nd}"] = acc
        if hv % 32 == 0:  # values quantized per slot row (q8_0 / q4_0 blocks; dims from block 1 on)
            for name, qt in (("pv_q8_0", QType.Q8_0), ("pv_q4_0", QType.Q4_0)):
                rows = np.concatenate([quant_ops.quantize_rows(qt, rng.standard_normal((16, hv + 32)).astype(np.float32), "c")
                                       for _ in range(nt)])
                # 3 rows, and 4 (kernels group rows: a group of 3 and one of 1), the 4th skipping tile 7;
                # the 11 tiles cut into chunks (PV_CHUNK) in different places, their sums into
                # the same sums (ldc 0) or each into its own ([chunk][row][hv])
                w4 = np.vstack([w, rng.uniform(0, 1, (1, nt * 16)).astype(np.float16).astype(np.float32)])
                w4[3, 7 * 16:8 * 16] = 0.0
                for nq, wq, t0, own in ((nh, w, 0, False), (4, w4, PV_CHUNK - 3, False), (nh, w, 61, True),
                                         (4, w4, 2 * PV_CHUNK - 6, True), (nh, w, 3, True)):
                    slots = (t0 + nt - 1) // PV_CHUNK - t0 // PV_CHUNK + 1 if own else 1
                    qacc = rng.standard_normal(slots * nq * hv).astype(np.float32)
                    _run_pv_q(vops, qt, rows, 1, nq, wq, nt * 16, qacc, hv, t0, nq * hv if own else 0, absent=5)
                    out[f"{name} hv={hv} rows={nq} t0={t0} own={own}"] = qacc
            if hv == 64:  # inputs that stress the integer sums (rows of 3 blocks, dims from block 1 on)
                for name, qt in (("pv_q8_0", QType.Q8_0), ("pv_q4_0", QType.Q4_0)):
                    rows, ws = _stress_pv_inputs(rng, qt, 3)
                    qacc = rng.standard_normal(5 * 64).astype(np.float32)
                    _run_pv_q(vops, qt, rows, 1, 5, ws, 128, qacc, 64, 4, 0, absent=4)
                    out[f"{name} stress"] = qacc
                    rows, ws = _stress_pv_inputs(rng, qt, 1)
                    qacc = rng.standard_normal(5 * 64).astype(np.float32)
                    _run_pv_q(vops, qt, rows, 0, 5, ws, 128, qacc, 64, 0, 0, absent=4)
                    out[f"{name} stress one block"] = qacc
        acc = acc[: hv * 16].copy()
        s = np.zeros(hv, dtype=np.float32)
        vops.sum16_rows(hv, _ptr("float *", acc), _ptr("float *", s))
        out[f"sum16_rows n={hv}"] = s
    e = _exp_inputs(rng, 4096)
    e[5::97] = -np.inf  # masked slots
    for mx in (0.0, float(np.max(e)), -3.5):
        xe = e.copy()
        total = vops.exp_sums(len(xe), _ptr("float *", xe), mx, _ABI.NULL)
        out[f"exp_sums max={mx} without sums"] = xe
        out[f"exp_sums max={mx} total"] = np.array([total], dtype=np.float64)
        sums = np.zeros(len(xe) // 16, dtype=np.float32)
        xs = e.copy()
        assert vops.exp_sums(len(xs), _ptr("float *", xs), mx, _ptr("float *", sums)) == total
        out[f"exp_sums max={mx}"] = xs
        out[f"exp_sums max={mx} sums"] = sums
    # softmax weights: exponentials (many f16 subnormals, some rounding to 0) times 1 / sum, odd length
    wts = xs[:4093].copy()
    vops.f16_scale(len(wts), _ptr("float *", wts), np.float32(1.0 / 3.7))
    out["f16_scale"] = wts
    # a score tile's 9 rows into rows 21 floats apart, against running maxima (ties, -0 and +0 among them)
    src = rng.standard_normal(9 * 16).astype(np.float32)
    src[::5] = 0.0
    src[1::7] = -0.0
    lm = np.where(rng.uniform(size=9 * 16) < 0.3, -np.inf, rng.standard_normal(9 * 16) * 0.1).astype(np.float32)
    lm[::5] = src[::5] * np.float32(0.125)
    dst = np.zeros(9 * 21, dtype=np.float32)
    vops.scale_max(9, _ptr("float *", src), 0.125, _ptr("float *", dst), 21, _ptr("float *", lm))
    out["scale_max dst"] = dst
    out["scale_max lmax"] = lm
    # f16 key and value tiles with subnormals and signed zeros, then also an infinity (a kernel that
    # converts halves by integer operations must give vcvtph2ps's values and notice the inf)
    for hk in (64, 128, 256):
        for inf in (False, True):
            kt = _special_halves(rng, (hk, 16), inf)
            for nq in (3, 4):
                q = _f16_values(rng, (nq, hk), 4.0)
                q[:, ::7] = 0.0
                o = np.zeros((nq, 16), dtype=np.float32)
                vops.qk_tile_one(hk, _ptr("float *", q), nq, hk, _ptr("el_half *", kt), _ptr("float *", o), _ABI.NULL)
                out[f"qk_tile_one special hk={hk} nq={nq} inf={inf}"] = o
            nt = 9
            tiles = [_special_halves(rng, (hk, 16), inf and t == 6) for t in range(nt)]
            vt = _ABI.new("el_half *[]", nt)
            for t in range(nt):
                vt[t] = _ABI.cast("el_half *", tiles[t].ctypes.data)
            for nh, sets, nd in ((3, 4, hk // 2), (4, 4, hk // 2 + 2), (3, 1, hk // 2 - 1)):
                w = rng.uniform(0, 1, (nh, nt * 16)).astype(np.float16).astype(np.float32)
                w[:, 1::5] = np.float16(2.0**-20)  # f16 subnormal weights (tiny probabilities)
                w[:, 2::9] = 0.0
                lda = sets * nd * 16 + 3
                acc = rng.standard_normal(nh * lda).astype(np.float32)
                vops.pv_tiles(nd, nt, vt, nh, _ptr("float *", w), nt * 16, _ptr("float *", acc), lda, sets, 1, _ABI.NULL, 0)
                out[f"pv_tiles special hv={hk} nh={nh} sets={sets} nd={nd} inf={inf}"] = acc
    g = np.concatenate([_exp_inputs(rng, 4096), rng.standard_normal(13).astype(np.float32)])  # odd tail
    u = rng.standard_normal(len(g)).astype(np.float32)
    vops.silu_mul(len(g), _ptr("float *", g), _ptr("float *", u))
    out["silu_mul"] = g
    # RoPE: both pair layouts, whole and partial rotations, rotations whose pairs do not fill the
    # vectors (n_rot 20: 10 pairs), values of many magnitudes with zeros of both signs
    for rope_type in (0, 2):  # EL_ROPE_NORM, EL_ROPE_NEOX
        for heads, head_dim, n_rot in ((3, 64, 64), (2, 80, 32), (4, 64, 20), (1, 128, 128)):
            xr = (rng.standard_normal(heads * head_dim) * 10.0 ** rng.integers(-4, 4, heads * head_dim)).astype(np.float32)
            xr[::11], xr[5::13] = 0.0, -0.0
            t = rng.uniform(-3000.0, 3000.0, n_rot // 2)
            cache = np.empty(n_rot, dtype=np.float32)
            cache[0::2], cache[1::2] = np.cos(t) * 1.1, np.sin(t) * 1.1
            vops.rope(_ptr("float *", xr), heads, head_dim, n_rot, rope_type, _ptr("float *", cache))
            out[f"rope type={rope_type} heads={heads} head_dim={head_dim} n_rot={n_rot}"] = xr
    # RMS norm of row sets: 1 row, 2 (a group of 8 taken short), 8, 11 (8 + 3), 17 (8 + 8 + a lone
    # row); rows of 576 and of 37 values (a tail past the 8-value steps and the 16-value vectors);
    # magnitudes 1e-20 to 1e6 within a row (the double sums round), a row of zeros; with a weight,
    # without, and in place
    for rows, n in ((1, 576), (2, 37), (8, 576), (11, 37), (17, 640)):
        ld = n + 5
        xs = (rng.standard_normal((rows, ld)) * 10.0 ** rng.integers(-20, 7, (rows, ld))).astype(np.float32)
        xs[rows // 2] = 0.0
        wn = rng.standard_normal(n).astype(np.float32)
        for weighted in (True, False):
            ys = np.full((rows, ld + 3), np.nan, dtype=np.float32)
            vops.rmsnorm_rows(rows, _ptr("float *", ys), ld + 3, _ptr("float *", xs), ld,
                              _ptr("float *", wn) if weighted else _ABI.NULL, n, np.float32(1e-5))
            out[f"rmsnorm_rows rows={rows} n={n} w={weighted}"] = ys
        xi = xs.copy()
        vops.rmsnorm_rows(rows, _ptr("float *", xi), ld, _ptr("float *", xi), ld, _ptr("float *", wn), n, np.float32(1e-6))
        out[f"rmsnorm_rows rows={rows} n={n} in place"] = xi
    return out


@pytest.mark.parametrize("variant", ["generic"] + VARIANTS)
def test_vec_ops_bit_identical_to_generic(variant):
    """Each el_vops entry the variant registers gives the portable twin's bits (dispatch.c)."""
    k = Kernels(variant)
    try:
        k.select("generic")
        generic = k.abi.el_vops
        gen_fns = {name: int(_ABI.cast("intptr_t", getattr(generic, name))) for name in VOPS}
        want = _run_vops(generic, 77)
        k.select(variant)
        vops = k.abi.el_vops
        fns = {name: int(_ABI.cast("intptr_t", getattr(vops, name))) for name in VOPS}
        if variant != "generic":  # the x86 files register every entry
            assert all(fns[name] != gen_fns[name] for name in VOPS), fns
        got = _run_vops(vops, 77)
        for key, w in want.items():
            gk = got[key]
            if w.dtype == np.float32:
                w, gk = _bits(w), _bits(gk)
            elif w.dtype == np.float64:
                w, gk = w.view(np.uint64), gk.view(np.uint64)
            np.testing.assert_array_equal(gk, w, err_msg=f"{variant}: {key}")
    finally:
        k.close()


@pytest.mark.parametrize("t", [QType.Q8_0, QType.Q4_0])
def test_quantized_key_scores_are_the_dot_products(t):
    """The generic qk_q8_0 / qk_q4_0 (the twin the SIMD kernels are held to): over a key tile built
    from 16 rows as el_internal.h lays it out, each score is the dot product of the dequantized key
    and query within float rounding (1e-6 of the sum of |products|), and el_kq_put / el_kq_get
    move a row into its slot of the tile and back."""
    k = Kernels("generic")
    try:
        rng = np.random.default_rng(5)
        name = "qk_q8_0" if t == QType.Q8_0 else "qk_q4_0"
        for hk in (32, 64, 160, 256):
            rows = _key_rows(rng, t, hk, raw=False)
            q, qsum = _key_queries(rng, 5, hk, pad=3)
            got = _run_qk_q(k.abi.el_vops, name, t, hk, rows, q, qsum)
            keys = quant_ops.dequantize_rows(t, rows, hk).astype(np.float64)
            qf = quant_ops.dequantize_rows(QType.Q8_0, q[:, : hk // 32 * 34], hk).astype(np.float64)
            want = qf @ keys.T
            mag = np.abs(qf) @ np.abs(keys).T
            assert np.all(np.abs(got - want) <= 1e-6 * mag), (hk, np.max(np.abs(got - want) / mag))
            tile = np.zeros_like(_key_tile(t, rows))
            lib = k.abi
            for slot in rng.permutation(16):
                lib.el_kq_put(int(t), _ptr("uint8_t *", tile), hk, int(slot), _ptr("uint8_t *", rows[slot].copy()))
            np.testing.assert_array_equal(tile, _key_tile(t, rows))
            back = np.zeros_like(rows[0])
            for slot in range(16):
                lib.el_kq_get(int(t), _ptr("uint8_t *", tile), hk, slot, _ptr("uint8_t *", back))
                np.testing.assert_array_equal(back, rows[slot])
    finally:
        k.close()


@pytest.mark.parametrize("t", [QType.Q8_0, QType.Q4_0])
def test_numba_key_scores_are_the_generic_twins_bits(t):
    """numba_kv.scores (the numba engine's scores over quantized key rows) gives the C generic
    qk_q8_0 / qk_q4_0's bits over the same keys as a key tile."""
    from edgellm.kernels import numba_kv

    k = Kernels("generic")
    try:
        rng = np.random.default_rng(8)
        name = "qk_q8_0" if t == QType.Q8_0 else "qk_q4_0"
        for hk, raw in ((64, False), (96, True), (256, False)):
            rows = _key_rows(rng, t, hk, raw)
            x = rng.standard_normal((6, hk)).astype(np.float32)
            q = np.stack([quant_ops.quantize_activation(QType.Q8_0, row) for row in x])
            qsum = np.ascontiguousarray(q.reshape(6, hk // 32, 34)[:, :, 2:].view(np.int8).astype(np.int32).sum(axis=2))
            want = _run_qk_q(k.abi.el_vops, name, t, hk, rows, q, qsum)
            np.testing.assert_array_equal(_bits(numba_kv.scores(t, rows, x)), _bits(want), err_msg=f"hk={hk}")
    finally:
        k.close()


@pytest.mark.parametrize("t", [QType.Q8_0, QType.Q4_0])
def test_numba_quantized_pv_is_the_generic_twins_bits(t):
    """numba_kv.pv (the numba engine's p.v over quantized value rows) gives the C generic
    pv_q8_0 / pv_q4_0's bits (integer sums per tile and block, el_internal.h), on random rows and
    on _stress_pv_inputs."""
    from edgellm.kernels import numba_kv

    k = Kernels("generic")
    try:
        rng = np.random.default_rng(9)
        for hv, nt, nh in ((64, 3, 3), (64, PV_CHUNK + 7, 4)):  # (two chunks of PV_CHUNK tiles)
            rows = quant_ops.quantize_rows(t, rng.standard_normal((nt * 16, hv)).astype(np.float32))
            w = rng.uniform(0, 1, (nh, nt * 16)).astype(np.float16).astype(np.float32)
            w[:, 5:9] = 0.0
            want = np.zeros((nh, hv), np.float32)
            _run_pv_q(k.abi.el_vops, t, rows, 0, nh, w, nt * 16, want, hv, 0, 0)
            np.testing.assert_array_equal(_bits(numba_kv.pv(t, rows, w)), _bits(want), err_msg=f"hv={hv}")
        rows, w = _stress_pv_inputs(rng, t, 2)  # (tile 4 present here, its weights zero)
        want = np.zeros((5, 64), np.float32)
        _run_pv_q(k.abi.el_vops, t, rows, 0, 5, w, 128, want, 64, 0, 0)
        np.testing.assert_array_equal(_bits(numba_kv.pv(t, rows, w)), _bits(want), err_msg="stress")
    finally:
        k.close()


@pytest.mark.parametrize("t", [QType.Q8_0, QType.Q4_0])
def test_quantized_pv_is_the_exact_sum_to_15_bits(t):
    """The generic pv_q8_0 / pv_q4_0 (the twin every path is held to) against float64 sums of w * d
    * q (gguf-py's dequantize): each (row, tile, block) adds its exact sum to within the rounding of
    the weights to 15 bits of the tile's largest |w d| (half a unit of 2^-14 m per slot, times |q|),
    plus the float roundings; skipped rows and tiles leave acc as it was, bit for bit."""
    from gguf.quants import dequantize as gguf_dequantize
    from gguf.constants import GGMLQuantizationType as G

    k = Kernels("generic")
    try:
        rng = np.random.default_rng(11)
        gt = G.Q8_0 if t == QType.Q8_0 else G.Q4_0
        rows, w = _stress_pv_inputs(rng, t, 2)
        acc0 = rng.standard_normal((5, 64)).astype(np.float32)
        got = acc0.copy()
        _run_pv_q(k.abi.el_vops, t, rows, 0, 5, w, 128, got, 64, PV_CHUNK - 3, 0, absent=4)  # (tiles of two chunks)
        x = gguf_dequantize(rows, gt).astype(np.float64).reshape(8, 16, 2, 32)  # d * q, exact
        bs = 34 if t == QType.Q8_0 else 18
        d = np.abs(rows.reshape(8, 16, 2, bs)[:, :, :, :2].copy().view(np.float16)[..., 0].astype(np.float64))
        q = np.abs(x) / np.where(d > 0, d, 1)[..., None]
        for r in range(5):
            want, bound = acc0[r].astype(np.float64), np.zeros(64)
            for ti in range(8):
                wt = w[r, 16 * ti:16 * ti + 16].astype(np.float64)
                if ti == 4 or not wt.any():
                    continue
                want = want + np.einsum("l,lbi->bi", wt, x[ti]).reshape(64)
                m = np.maximum(2.0 ** -48, (wt[:, None] * d[ti]).max(axis=0))  # per block
                bound += (2.0 ** -15 * m[:, None] * q[ti].max(axis=0) * 16).reshape(64)
                bound += 2.0 ** -23 * np.abs(want)
            if not w[r].any():
                np.testing.assert_array_equal(_bits(got[r]), _bits(acc0[r]))
            assert np.all(np.abs(got[r] - want) <= bound + 1e-30), (r, np.max(np.abs(got[r] - want) - bound))
    finally:
        k.close()


@pytest.mark.parametrize("t", [QType.Q8_0, QType.Q4_0])
def test_value_tiles_are_el_internals_layout(t):
    """el_vq_put (kv.c's store of a value slot) puts 16 rows of one q8_0 / q4_0 block, slots in any
    order, where _value_tiles (the pv tests' tiles) puts them, el_vq_get gives each row back, and
    both follow el_internal.h's layout byte for byte: scale of slot l at bytes 2l, 2l + 1; quant
    byte i of slot l at 32 + (l // 2) * 2 * (quant bytes) + 2 i + l % 2."""
    k = Kernels("generic")
    try:
        rng = np.random.default_rng(12)
        rows = rng.integers(0, 256, (16, 34 if t == QType.Q8_0 else 18), dtype=np.uint8)
        want = _value_tiles(t, rows)[0, 0]
        nq = rows.shape[1] - 2
        for l in range(16):
            np.testing.assert_array_equal(want[2 * l: 2 * l + 2], rows[l, :2])
            np.testing.assert_array_equal(want[32 + (l // 2) * 2 * nq + l % 2: 32 + (l // 2 + 1) * 2 * nq: 2], rows[l, 2:])
        tile = np.zeros_like(want)
        for slot in rng.permutation(16):
            k.abi.el_vq_put(int(t), _ptr("uint8_t *", tile), int(slot), _ptr("uint8_t *", rows[slot].copy()))
        np.testing.assert_array_equal(tile, want)
        back = np.zeros_like(rows[0])
        for slot in range(16):
            k.abi.el_vq_get(int(t), _ptr("uint8_t *", tile), slot, _ptr("uint8_t *", back))
            np.testing.assert_array_equal(back, rows[slot])
    finally:
        k.close()


@pytest.mark.skipif(c_module() is None, reason="C kernels not built")
def test_isa_label_names_the_features_of_the_path_in_use():
    """isa_label (what `generate -v` and `bench` print): the path in use plus the optional features
    its kernels use - only NEON has one (sdot: "neon+dotprod"; checked on both sides under qemu by
    tests/neon and scripts/arm64_check.sh) - and other names unchanged."""
    from edgellm import kernels

    lib = c_module()[1]
    current = kernels.isa_name()
    bits = lib.el_isa_features()
    if current != "neon":
        assert bits == 0
    assert kernels.isa_label(current) == "+".join([current] + [n for b, n in kernels.ISA_FEATURES if bits & b])
    assert kernels.isa_label("numba") == "numba"
    other = next(i for i in ISA_NAMES if i != current)
    assert kernels.isa_label(other) == other


@pytest.mark.skipif(c_module() is None, reason="C kernels not built")
def test_unset_isa_is_the_best_again_after_a_forced_one(monkeypatch):
    """Engines made after EDGELLM_ISA is unset run the CPU's best path, also when one made before
    was forced to the generic twins (the choice is process-wide in the C library: it used to stay
    generic, and every later engine in the process ran 10-20x slower)."""
    from edgellm import kernels

    best = ISA_NAMES[c_module()[1].el_cpu_isa_best()]
    monkeypatch.setenv("EDGELLM_BACKEND", "c")
    monkeypatch.setenv("EDGELLM_ISA", "generic")
    assert kernels.isa_name() == "generic"
    monkeypatch.delenv("EDGELLM_ISA")
    assert kernels.isa_name() == best
