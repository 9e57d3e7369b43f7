"""numba twins of csrc/quants_generic.c: float and legacy (32-value block) row functions.

Same names as the C functions (ggml's), numpy arrays instead of pointers:
`quantize_row_<t>_ref(x: float32[k], y: uint8[row_bytes])`, `dequantize_row_<t>(x: uint8[row_bytes],
y: float32[k])`, `vec_dot_<t>_<act>_generic(n, x: uint8[...], y: uint8[...]) -> float32` (and
`vec_dot_<t>_<act>_batch_generic`, the batch order).
Arrays are 1-D and contiguous. The quantizers write the C twin's (and ggml's) bytes: every float
operation is done in float32 in the C order (numba does not fuse a*b+c), rounding as C does.
Block layouts as in ggml's block_q4_0 ... block_q8_1 (ggml-common.h), little-endian.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

QK = 32  # values per block for every type here (ggml's QK4_0 ... QK8_1)

# bytes per block, as in ggml-common.h
Q4_0_BYTES = 18  # f16 d, 16 nibble bytes
Q4_1_BYTES = 20  # f16 d, f16 m, 16 nibble bytes
Q5_0_BYTES = 22  # f16 d, u32 fifth bits, 16 nibble bytes
Q5_1_BYTES = 24  # f16 d, f16 m, u32 fifth bits, 16 nibble bytes
Q8_0_BYTES = 34  # f16 d, 32 int8
Q8_1_BYTES = 36  # f16 d, f16 s = d * sum(qs), 32 int8

_FLT_MAX = float(np.finfo(np.float32).max)  # the start of ggml's min/max scan


# ---------------------------------------------------------------- scalar helpers


@njit(cache=True)
def _rne(v):
    """v >= 0 (float64, exact) rounded to the nearest integer, ties to even."""
    fl = math.floor(v)
    r = v - fl
    n = int(fl)
    if r > 0.5 or (r == 0.5 and n % 2 == 1):
        n += 1
    return n


@njit(cache=True)
def _roundf(v):
    """C's roundf (halves away from zero) of a float32, as an int. float32 + 0.5 is exact in
    float64, so floor(|v| + 0.5) rounds correctly."""
    r = int(math.floor(abs(float(v)) + 0.5))
    return -r if v < 0 else r


@njit(cache=True)
def float_to_half(f):
    """IEEE binary16 bits of float f, round to nearest even; NaN -> quiet NaN 0x7e00 with f's sign
    (as el_float_to_half in csrc/common.h and ggml's GGML_FP32_TO_FP16)."""
    sign = 0x8000 if math.copysign(1.0, f) < 0 else 0
    if math.isnan(f):
        return sign | 0x7E00
    a = abs(float(f))
    if a >= 65520.0:  # halfway between the largest half 65504 and 2^16: ties to even go up
        return sign | 0x7C00
    if a < 2.0**-14:  # subnormal half: a multiple of 2^-24 (0x400 is the smallest normal, correctly)
        return sign | _rne(a * 2.0**24)
    m, e = math.frexp(a)  # a = m * 2^e, 0.5 <= m < 1: 11 significant bits are m * 2^11
    sig = _rne(m * 2048.0)  # 1024..2048; 2048 carries into the exponent through the addition below
    return sign | (((e - 1 + 15) << 10) + sig - 1024)


_HALF_SCALES = tuple(2.0 ** (e - 25) for e in range(32))  # a normal half is (m + 1024) * 2^(e - 25)


@njit(cache=True)
def half_to_float(h):
    """float32 value of IEEE binary16 bits h (NaN payloads are not kept; dequantize_row_f16 keeps them).
    Exact: an 11-bit integer times a power of two (a multiplication, several times faster than ldexp)."""
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        v = math.inf if m == 0 else math.nan
    elif e == 0:
        v = float(m) * 5.9604644775390625e-08  # subnormal: m * 2^-24
    else:
        v = float(m + 1024) * _HALF_SCALES[e]
    return np.float32(-v if h & 0x8000 else v)


@njit(cache=True)
def _bf16_to_float(h):
    """float32 value of bfloat16 bits h: the upper half of a float32 (NaN payloads not kept)."""
    e = (h >> 7) & 0xFF
    m = h & 0x7F
    if e == 0xFF:
        v = math.inf if m == 0 else math.nan
    elif e == 0:
        v = math.ldexp(float(m), -133)
    else:
        v = math.ldexp(float(m + 128), e - 134)
    return np.float32(-v if h & 0x8000 else v)


@njit(cache=True)
def _get_u16(b, o):
    return int(b[o]) | (int(b[o + 1]) << 8)


@njit(cache=True)
def _put_u16(b, o, v):
    b[o] = v & 0xFF
    b[o + 1] = (v >> 8) & 0xFF


@njit(cache=True)
def _get_half(b, o):
    return half_to_float(_get_u16(b, o))


@njit(cache=True)
def _put_half(b, o, f):
    _put_u16(b, o, float_to_half(f))


@njit(cache=True)
def _get_u32(b, o):
    return int(b[o]) | (int(b[o + 1]) << 8) | (int(b[o + 2]) << 16) | (int(b[o + 3]) << 24)


@njit(cache=True)
def _blocks(k, nbytes, block_bytes):
    """Blocks in a row of k values, checking that its quantized buffer of nbytes holds them."""
    if k % QK != 0:
        raise ValueError("row length is not a multiple of the block size 32")
    if nbytes < k // QK * block_bytes:
        raise ValueError("quantized row buffer is smaller than the row length needs")
    return k // QK


@njit(cache=True)
def _dot_blocks(n, xbytes, ybytes, x_block_bytes, y_block_bytes):
    if n % QK != 0:
        raise ValueError("dot product length is not a multiple of the block size 32")
    nb = n // QK
    if xbytes < nb * x_block_bytes or ybytes < nb * y_block_bytes:
        raise ValueError("dot product operand is smaller than its length needs")
    return nb


@njit(cache=True)
def _check_float_dot(n, xbytes, ybytes, elem_bytes):
    if n < 0 or xbytes < n * elem_bytes or ybytes < n * elem_bytes:
        raise ValueError("dot product operand is smaller than its length needs")


# ---------------------------------------------------------------- block statistics


@njit(cache=True)
def _signed_absmax(x, start):
    """Value of largest magnitude in x[start:start+32], sign kept; the first wins a tie (ggml)."""
    amax = np.float32(0.0)
    vmax = np.float32(0.0)
    for j in range(QK):
        v = x[start + j]
        if amax < abs(v):
            amax = abs(v)
            vmax = v
    return vmax


@njit(cache=True)
def _absmax(x, start):
    amax = np.float32(0.0)
    for j in range(QK):
        amax = max(amax, abs(x[start + j]))
    return amax


@njit(cache=True)
def _min_max(x, start):
    lo = np.float32(_FLT_MAX)
    hi = -lo
    for j in range(QK):
        v = x[start + j]
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    return lo, hi


@njit(cache=True)
def _inverse(d):
    return np.float32(1.0) / d if d != 0 else np.float32(0.0)


@njit(cache=True)
def _pack_5bit(q, y, o_qh, o_qs):
    """32 values 0..31 -> low nibbles at o_qs (value j and j+16 share byte j), fifth bits as a
    little-endian u32 at o_qh (bit j for value j), as in ggml's block_q5_0."""
    qh = 0
    for j in range(16):
        y[o_qs + j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4)
        qh |= ((q[j] >> 4) & 1) << j
        qh |= ((q[j + 16] >> 4) & 1) << (j + 16)
    for b in range(4):
        y[o_qh + b] = (qh >> (8 * b)) & 0xFF


@njit(cache=True)
def _unpack_5bit(x, o_qh, o_qs, q):
    qh = _get_u32(x, o_qh)
    for j in range(16):
        b = int(x[o_qs + j])
        q[j] = (b & 0x0F) | (((qh >> j) & 1) << 4)
        q[j + 16] = (b >> 4) | (((qh >> (j + 16)) & 1) << 4)


# ---------------------------------------------------------------- F16 / BF16


@njit(cache=True)
def quantize_row_f16_ref(x, y):
    if y.size < 2 * x.size:
        raise ValueError("f16 row buffer is smaller than the row length needs")
    for i in range(x.size):
        _put_u16(y, 2 * i, float_to_half(x[i]))


@njit(cache=True)
def dequantize_row_f16(x, y):
    if x.size < 2 * y.size:
        raise ValueError("f16 row buffer is smaller than the row length needs")
    bits = y.view(np.uint32)
    for i in range(y.size):
        h = _get_u16(x, 2 * i)
        if (h & 0x7C00) == 0x7C00:  # inf / nan: exponent all ones, mantissa (payload) kept
            bits[i] = ((h & 0x8000) << 16) | 0x7F800000 | ((h & 0x3FF) << 13)
        else:
            y[i] = half_to_float(h)


@njit(cache=True)
def quantize_row_bf16_ref(x, y):
    """Round to nearest even on the float bits; NaN kept quiet (ggml's ggml_compute_fp32_to_bf16)."""
    if y.size < 2 * x.size:
        raise ValueError("bf16 row buffer is smaller than the row length needs")
    bits = x.view(np.uint32)
    for i in range(x.size):
        u = int(bits[i])
        if (u & 0x7FFFFFFF) > 0x7F800000:
            h = (u >> 16) | 64
        else:
            h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        _put_u16(y, 2 * i, h)


@njit(cache=True)
def dequantize_row_bf16(x, y):
    if x.size < 2 * y.size:
        raise ValueError("bf16 row buffer is smaller than the row length needs")
    bits = y.view(np.uint32)
    for i in range(y.size):
        bits[i] = _get_u16(x, 2 * i) << 16


# ---------------------------------------------------------------- quantizers


@njit(cache=True)
def quantize_row_q4_0_ref(x, y):
    """d = (value of largest magnitude) / -8, q = min(15, trunc(x/d + 8.5))."""
    nb = _blocks(x.size, y.size, Q4_0_BYTES)
    for i in range(nb):
        s = i * QK
        o = i * Q4_0_BYTES
        d = _signed_absmax(x, s) / np.float32(-8.0)
        inv = _inverse(d)
        _put_half(y, o, d)
        for j in range(16):
            q0 = min(15, int(x[s + j] * inv + np.float32(8.5)))
            q1 = min(15, int(x[s + j + 16] * inv + np.float32(8.5)))
            y[o + 2 + j] = q0 | (q1 << 4)


@njit(cache=True)
def quantize_row_q4_1_ref(x, y):
    """d = (max - min) / 15, m = min, q = min(15, trunc((x - min)/d + 0.5))."""
    nb = _blocks(x.size, y.size, Q4_1_BYTES)
    for i in range(nb):
        s = i * QK
        o = i * Q4_1_BYTES
        lo, hi = _min_max(x, s)
        d = (hi - lo) / np.float32(15.0)
        inv = _inverse(d)
        _put_half(y, o, d)
        _put_half(y, o + 2, lo)
        for j in range(16):
            q0 = min(15, int((x[s + j] - lo) * inv + np.float32(0.5)))
            q1 = min(15, int((x[s + j + 16] - lo) * inv + np.float32(0.5)))
            y[o + 4 + j] = q0 | (q1 << 4)


@njit(cache=True)
def quantize_row_q5_0_ref(x, y):
    """d = (value of largest magnitude) / -16, q = min(31, trunc(x/d + 16.5))."""
    nb = _blocks(x.size, y.size, Q5_0_BYTES)
    q = np.empty(QK, dtype=np.int64)
    for i in range(nb):
        s = i * QK
        o = i * Q5_0_BYTES
        d = _signed_absmax(x, s) / np.float32(-16.0)
        inv = _inverse(d)
        _put_half(y, o, d)
        for j in range(QK):
            q[j] = min(31, int(x[s + j] * inv + np.float32(16.5)))
        _pack_5bit(q, y, o + 2, o + 6)


@njit(cache=True)
def quantize_row_q5_1_ref(x, y):
    """d = (max - min) / 31, m = min, q = trunc((x - min)/d + 0.5) (<= 31 by construction)."""
    nb = _blocks(x.size, y.size, Q5_1_BYTES)
    q = np.empty(QK, dtype=np.int64)
    for i in range(nb):
        s = i * QK
        o = i * Q5_1_BYTES
        lo, hi = _min_max(x, s)
        d = (hi - lo) / np.float32(31.0)
        inv = _inverse(d)
        _put_half(y, o, d)
        _put_half(y, o + 2, lo)
        for j in range(QK):
            q[j] = min(31, int((x[s + j] - lo) * inv + np.float32(0.5)))
        _pack_5bit(q, y, o + 4, o + 8)


@njit(cache=True)
def quantize_row_q8_0_ref(x, y):
    """d = max|x| / 127, q = roundf(x/d)."""
    nb = _blocks(x.size, y.size, Q8_0_BYTES)
    yi = y.view(np.int8)
    for i in range(nb):
        s = i * QK
        o = i * Q8_0_BYTES
        d = _absmax(x, s) / np.float32(127.0)
        inv = _inverse(d)
        _put_half(y, o, d)
        for j in range(QK):
            yi[o + 2 + j] = _roundf(x[s + j] * inv)


@njit(cache=True)
def quantize_row_q8_1_ref(x, y):
    """Q8_0 plus s = half(float(sum(q)) * d)."""
    nb = _blocks(x.size, y.size, Q8_1_BYTES)
    yi = y.view(np.int8)
    for i in range(nb):
        s = i * QK
        o = i * Q8_1_BYTES
        d = _absmax(x, s) / np.float32(127.0)
        inv = _inverse(d)
        _put_half(y, o, d)
        total = 0
        for j in range(QK):
            v = _roundf(x[s + j] * inv)
            yi[o + 4 + j] = v
            total += v
        _put_half(y, o + 2, np.float32(total) * d)


@njit(cache=True)
def quantize_row_q8_0(x, y):
    """Activation quantizer: q = round-half-even(x * 127/max), d = max/127 (csrc twin)."""
    nb = _blocks(x.size, y.size, Q8_0_BYTES)
    yi = y.view(np.int8)
    for i in range(nb):
        s = i * QK
        o = i * Q8_0_BYTES
        amax = _absmax(x, s)
        inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
        _put_half(y, o, amax / np.float32(127.0))
        for j in range(QK):
            yi[o + 2 + j] = np.int32(np.rint(np.float32(x[s + j] * inv)))


@njit(cache=True)
def quantize_row_q8_1(x, y):
    """Activation quantizer: as quantize_row_q8_0, plus s = half(float(sum(q)) * d)."""
    nb = _blocks(x.size, y.size, Q8_1_BYTES)
    yi = y.view(np.int8)
    for i in range(nb):
        s = i * QK
        o = i * Q8_1_BYTES
        amax = _absmax(x, s)
        d = amax / np.float32(127.0)
        inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
        _put_half(y, o, d)
        total = 0
        for j in range(QK):
            v = np.int32(np.rint(np.float32(x[s + j] * inv)))
            yi[o + 4 + j] = v
            total += v
        _put_half(y, o + 2, np.float32(total) * d)


# ---------------------------------------------------------------- dequantizers


@njit(cache=True)
def dequantize_row_q4_0(x, y):
    nb = _blocks(y.size, x.size, Q4_0_BYTES)
    for i in range(nb):
        o = i * Q4_0_BYTES
        s = i * QK
        d = _get_half(x, o)
        for j in range(16):
            b = int(x[o + 2 + j])
            y[s + j] = np.float32((b & 0x0F) - 8) * d
            y[s + j + 16] = np.float32((b >> 4) - 8) * d


@njit(cache=True)
def dequantize_row_q4_1(x, y):
    nb = _blocks(y.size, x.size, Q4_1_BYTES)
    for i in range(nb):
        o = i * Q4_1_BYTES
        s = i * QK
        d = _get_half(x, o)
        m = _get_half(x, o + 2)
        for j in range(16):
            b = int(x[o + 4 + j])
            y[s + j] = np.float32(b & 0x0F) * d + m
            y[s + j + 16] = np.float32(b >> 4) * d + m


@njit(cache=True)
def dequantize_row_q5_0(x, y):
    nb = _blocks(y.size, x.size, Q5_0_BYTES)
    q = np.empty(QK, dtype=np.int64)
    for i in range(nb):
        o = i * Q5_0_BYTES
        s = i * QK
        d = _get_half(x, o)
        _unpack_5bit(x, o + 2, o + 6, q)
        for j in range(QK):
            y[s + j] = np.float32(q[j] - 16) * d


@njit(cache=True)
def dequantize_row_q5_1(x, y):
    nb = _blocks(y.size, x.size, Q5_1_BYTES)
    q = np.empty(QK, dtype=np.int64)
    for i in range(nb):
        o = i * Q5_1_BYTES
        s = i * QK
        d = _get_half(x, o)
        m = _get_half(x, o + 2)
        _unpack_5bit(x, o + 4, o + 8, q)
        for j in range(QK):
            y[s + j] = np.float32(q[j]) * d + m


@njit(cache=True)
def dequantize_row_q8_0(x, y):
    nb = _blocks(y.size, x.size, Q8_0_BYTES)
    xi = x.view(np.int8)
    for i in range(nb):
        o = i * Q8_0_BYTES
        s = i * QK
        d = _get_half(x, o)
        for j in range(QK):
            y[s + j] = np.float32(xi[o + 2 + j]) * d


# ---------------------------------------------------------------- dot products
# Float types: products in float32, summed in float64 (ggml's scalar ggml_vec_dot_f32/f16/bf16).
# Quantized types: the C twins' orders, every float operation in float32. The llama order
# (llama.cpp's x86 one; the batch order is at the end of this file, and Q4_0's only one is
# there too): per block, 8 float lanes:
# lane i adds the exact integer sum of the products of values 4i..4i+3 times d = dx * dy with
# one fma; the lanes are summed at the end by _hsum8. Types with a min add sum(m * y.s) through a
# separate chain of fmas, added last.


@njit(cache=True)
def _fmaf(a, b, c):
    """C's fmaf(a, b, c) for float32 operands: the product is exact in float64, so only the sum
    rounds twice (float64, then float32), which differs from one rounding only in rare ties."""
    # np.float64, not float(): numba's float() of a float32 stays float32
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


@njit(cache=True)
def _hsum8(acc):
    """legacy_hsum8: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), in float32."""
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))


@njit(cache=True, inline='always')
def _lanes_acc(acc, d, lane):
    """acc[i] = fmaf(d, (float)lane[i], acc[i]) for the 8 lanes"""
    for i in range(8):
        acc[i] = _fmaf(d, np.float32(lane[i]), acc[i])


@njit(cache=True, inline='always')
def _lanes(lane, q, yi, oy):
    """lane[i] = sum(q[4i+t] * y[4i+t], t < 4) for the 32 int8 y at yi[oy:]."""
    for i in range(8):
        acc = np.int64(0)
        for t in range(4 * i, 4 * i + 4):
            acc += q[t] * np.int64(yi[oy + t])
        lane[i] = acc


@njit(cache=True, inline='always')
def _lanes_4bit(lane, x, ox, offset, yi, oy):
    """_lanes for 16 nibble bytes at x[ox:] (value j: low nibble of byte j, value j+16: its high
    nibble), each minus offset: lanes 0..3 take low nibbles, lanes 4..7 high ones."""
    for i in range(4):
        lo = np.int64(0)
        hi = np.int64(0)
        for t in range(4 * i, 4 * i + 4):
            b = np.int64(x[ox + t])
            lo += ((b & 0x0F) - offset) * np.int64(yi[oy + t])
            hi += ((b >> 4) - offset) * np.int64(yi[oy + t + 16])
        lane[i] = lo
        lane[4 + i] = hi


@njit(cache=True)
def vec_dot_f32_f32_generic(n, x, y):
    _check_float_dot(n, x.size, y.size, 4)
    xf = x.view(np.float32)
    yf = y.view(np.float32)
    total = 0.0
    for i in range(n):
        total += float(xf[i] * yf[i])
    return np.float32(total)


@njit(cache=True)
def vec_dot_f16_f16_generic(n, x, y):
    _check_float_dot(n, x.size, y.size, 2)
    total = 0.0
    for i in range(n):
        total += float(_get_half(x, 2 * i) * _get_half(y, 2 * i))
    return np.float32(total)


@njit(cache=True)
def vec_dot_bf16_bf16_generic(n, x, y):
    _check_float_dot(n, x.size, y.size, 2)
    total = 0.0
    for i in range(n):
        total += float(_bf16_to_float(_get_u16(x, 2 * i)) * _bf16_to_float(_get_u16(y, 2 * i)))
    return np.float32(total)


# Float rows as float32, each value converted as the dot products above convert it (for a matmul
# that converts every row once instead of once per product: numba_engine; same products, same sums)


@njit(cache=True)
def f32_row_floats(n, x, out):
    _check_float_dot(n, x.size, 4 * n, 4)
    xf = x.view(np.float32)
    for i in range(n):
        out[i] = xf[i]


@njit(cache=True)
def f16_row_floats(n, x, out):
    _check_float_dot(n, x.size, 2 * n, 2)
    for i in range(n):
        out[i] = _get_half(x, 2 * i)


@njit(cache=True)
def bf16_row_floats(n, x, out):
    _check_float_dot(n, x.size, 2 * n, 2)
    for i in range(n):
        out[i] = _bf16_to_float(_get_u16(x, 2 * i))


# The legacy dot products take their scratch (acc: float32[8], iw: int64[SCRATCH_INTS]) from the
# caller, so a matmul allocates it once per chunk of rows instead of once per row (numba_engine);
# vec_dot_<t>_<act>_generic is the same with its own.
SCRATCH_INTS = 8 + QK  # 8 lanes, then a block's 32 unpacked values


@njit(cache=True, inline='always')
def _dot_q4_1_q8_1(n, x, y, acc, iw):
    """dot(q*dx + mx, qy*dy) over a block = dx*dy*sum(q*qy) + mx*sy, sy = dy*sum(qy) stored in
    the Q8_1 block: lanes for the first term, a chain of fmas for the second, added last."""
    nb = _dot_blocks(n, x.size, y.size, Q4_1_BYTES, Q8_1_BYTES)
    yi = y.view(np.int8)
    lane = iw[:8]
    acc[:] = 0
    summs = np.float32(0.0)
    for i in range(nb):
        ox = i * Q4_1_BYTES
        oy = i * Q8_1_BYTES
        _lanes_4bit(lane, x, ox + 4, 0, yi, oy + 4)
        _lanes_acc(acc, _get_half(x, ox) * _get_half(y, oy), lane)
        summs = _fmaf(_get_half(x, ox + 2), _get_half(y, oy + 2), summs)
    return _hsum8(acc) + summs


@njit(cache=True, inline='always')
def _dot_q5_0_q8_0(n, x, y, acc, iw):
    nb = _dot_blocks(n, x.size, y.size, Q5_0_BYTES, Q8_0_BYTES)
    yi = y.view(np.int8)
    lane, q = iw[:8], iw[8:8 + QK]
    acc[:] = 0
    for i in range(nb):
        ox = i * Q5_0_BYTES
        oy = i * Q8_0_BYTES
        _unpack_5bit(x, ox + 2, ox + 6, q)
        for j in range(QK):
            q[j] -= 16
        _lanes(lane, q, yi, oy + 2)
        _lanes_acc(acc, _get_half(x, ox) * _get_half(y, oy), lane)
    return _hsum8(acc)


@njit(cache=True, inline='always')
def _dot_q5_1_q8_1(n, x, y, acc, iw):
    nb = _dot_blocks(n, x.size, y.size, Q5_1_BYTES, Q8_1_BYTES)
    yi = y.view(np.int8)
    lane, q = iw[:8], iw[8:8 + QK]
    acc[:] = 0
    summs = np.float32(0.0)
    for i in range(nb):
        ox = i * Q5_1_BYTES
        oy = i * Q8_1_BYTES
        _unpack_5bit(x, ox + 4, ox + 8, q)
        _lanes(lane, q, yi, oy + 4)
        _lanes_acc(acc, _get_half(x, ox) * _get_half(y, oy), lane)
        summs = _fmaf(_get_half(x, ox + 2), _get_half(y, oy + 2), summs)
    return _hsum8(acc) + summs


@njit(cache=True, inline='always')
def _dot_q8_0_q8_0(n, x, y, acc, iw):
    nb = _dot_blocks(n, x.size, y.size, Q8_0_BYTES, Q8_0_BYTES)
    xi = x.view(np.int8)
    yi = y.view(np.int8)
    lane = iw[:8]
    acc[:] = 0
    for i in range(nb):
        ox = i * Q8_0_BYTES
        oy = i * Q8_0_BYTES
        for j in range(8):
            s = np.int64(0)
            for t in range(4 * j, 4 * j + 4):
                s += np.int64(xi[ox + 2 + t]) * np.int64(yi[oy + 2 + t])
            lane[j] = s
        _lanes_acc(acc, _get_half(x, ox) * _get_half(y, oy), lane)
    return _hsum8(acc)


@njit(cache=True)
def vec_dot_q4_0_q8_0_generic(n, x, y):
    return _dot_q4_0_q8_0(n, x, y, np.zeros(8, np.float32), np.zeros(SCRATCH_INTS, np.int64))


@njit(cache=True)
def vec_dot_q4_1_q8_1_generic(n, x, y):
    return _dot_q4_1_q8_1(n, x, y, np.zeros(8, np.float32), np.zeros(SCRATCH_INTS, np.int64))


@njit(cache=True)
def vec_dot_q5_0_q8_0_generic(n, x, y):
    return _dot_q5_0_q8_0(n, x, y, np.zeros(8, np.float32), np.zeros(SCRATCH_INTS, np.int64))


@njit(cache=True)
def vec_dot_q5_1_q8_1_generic(n, x, y):
    return _dot_q5_1_q8_1(n, x, y, np.zeros(8, np.float32), np.zeros(SCRATCH_INTS, np.int64))


@njit(cache=True)
def vec_dot_q8_0_q8_0_generic(n, x, y):
    return _dot_q8_0_q8_0(n, x, y, np.zeros(8, np.float32), np.zeros(SCRATCH_INTS, np.int64))


# ---------------------------------------------------------------- the batch order
# The batched engine's order (quants_generic.c vec_dot_*_batch_generic): per block the exact
# integer sum of its 32 products, then acc = fmaf(isum, dx * dy, acc) block after block; types
# with a min: summs = fmaf(m, y.s, summs) block after block, the result acc + summs. Same
# scratch as the dots above (iw[8:8 + QK] holds a block's values).


@njit(cache=True, inline='always')
def _isum(q, yi, oy):
    s = np.int64(0)
    for j in range(QK):
        s += q[j] * np.int64(yi[oy + j])
    return s


@njit(cache=True, inline='always')
def _nibbles(q, x, ox, offset):
    for j in range(16):
        b = np.int64(x[ox + j])
        q[j] = (b & 0x0F) - offset
        q[j + 16] = (b >> 4) - offset


@njit(cache=True, inline='always')
def _dot_q4_0_q8_0(n, x, y, acc, iw):
    """Q4_0 has this order only (llama.cpp's x86 repacked one: quants_generic.c)."""
    nb = _dot_blocks(n, x.size, y.size, Q4_0_BYTES, Q8_0_BYTES)
    yi = y.view(np.int8)
    q = iw[8:8 + QK]
    s = np.float32(0.0)
    for i in range(nb):
        ox = i * Q4_0_BYTES
        oy = i * Q8_0_BYTES
        _nibbles(q, x, ox + 2, 8)
        s = _fmaf(np.float32(_isum(q, yi, oy + 2)), _get_half(x, ox) * _get_half(y, oy), s)
    return s


@njit(cache=True, inline='always')
def _dot_q4_1_q8_1_batch(n, x, y, acc, iw):
    nb = _dot_blocks(n, x.size, y.size, Q4_1_BYTES, Q8_1_BYTES)
    yi = y.view(np.int8)
    q = iw[8:8 + QK]
    s = np.float32(0.0)
    summs = np.float32(0.0)
    for i in range(nb):
        ox = i * Q4_1_BYTES
        oy = i * Q8_1_BYTES
        _nibbles(q, x, ox + 4, 0)
        s = _fmaf(np.float32(_isum(q, yi, oy + 4)), _get_half(x, ox) * _get_half(y, oy), s)
        summs = _fmaf(_get_half(x, ox + 2), _get_half(y, oy + 2), summs)
    return s + summs


@njit(cache=True, inline='always')
def _dot_q5_0_q8_0_batch(n, x, y, acc, iw):
    nb = _dot_blocks(n, x.size, y.size, Q5_0_BYTES, Q8_0_BYTES)
    yi = y.view(np.int8)
    q = iw[8:8 + QK]
    s = np.float32(0.0)
    for i in range(nb):
        ox = i * Q5_0_BYTES
        oy = i * Q8_0_BYTES
        _unpack_5bit(x, ox + 2, ox + 6, q)
        for j in range(QK):
            q[j] -= 16
        s = _fmaf(np.float32(_isum(q, yi, oy + 2)), _get_half(x, ox) * _get_half(y, oy), s)
    return s


@njit(cache=True, inline='always')
def _dot_q5_1_q8_1_batch(n, x, y, acc, iw):
    nb = _dot_blocks(n, x.size, y.size, Q5_1_BYTES, Q8_1_BYTES)
    yi = y.view(np.int8)
    q = iw[8:8 + QK]
    s = np.float32(0.0)
    summs = np.float32(0.0)
    for i in range(nb):
        ox = i * Q5_1_BYTES
        oy = i * Q8_1_BYTES
        _unpack_5bit(x, ox + 4, ox + 8, q)
        s = _fmaf(np.float32(_isum(q, yi, oy + 4)), _get_half(x, ox) * _get_half(y, oy), s)
        summs = _fmaf(_get_half(x, ox + 2), _get_half(y, oy + 2), summs)
    return s + summs


@njit(cache=True, inline='always')
def _dot_q8_0_q8_0_batch(n, x, y, acc, iw):
    nb = _dot_blocks(n, x.size, y.size, Q8_0_BYTES, Q8_0_BYTES)
    xi = x.view(np.int8)
    yi = y.view(np.int8)
    s = np.float32(0.0)
    for i in range(nb):
        ox = i * Q8_0_BYTES
        oy = i * Q8_0_BYTES
        isum = np.int64(0)
        for j in range(QK):
            isum += np.int64(xi[ox + 2 + j]) * np.int64(yi[oy + 2 + j])
        s = _fmaf(np.float32(isum), _get_half(x, ox) * _get_half(y, oy), s)
    return s


@njit(cache=True)
def vec_dot_q4_1_q8_1_batch_generic(n, x, y):
    return _dot_q4_1_q8_1_batch(n, x, y, np.zeros(8, np.float32), np.zeros(SCRATCH_INTS, np.int64))


@njit(cache=True)
def vec_dot_q5_0_q8_0_batch_generic(n, x, y):
    return _dot_q5_0_q8_0_batch(n, x, y, np.zeros(8, np.float32), np.zeros(SCRATCH_INTS, np.int64))


@njit(cache=True)
def vec_dot_q5_1_q8_1_batch_generic(n, x, y):
    return _dot_q5_1_q8_1_batch(n, x, y, np.zeros(8, np.float32), np.zeros(SCRATCH_INTS, np.int64))


@njit(cache=True)
def vec_dot_q8_0_q8_0_batch_generic(n, x, y):
    return _dot_q8_0_q8_0_batch(n, x, y, np.zeros(8, np.float32), np.zeros(SCRATCH_INTS, np.int64))
