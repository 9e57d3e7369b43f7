"""numba twins of csrc/iquants_generic.c: IQ4_NL and IQ4_XS quantize / dequantize / dot.

Same names as the C functions, numpy arrays in place of pointers:
`quantize_row_<t>_ref(x: float32[k], y: uint8[...])`, `dequantize_row_<t>(x: uint8[...], y:
float32[k])`, `vec_dot_iq4_nl_q8_0_generic(n, x, y)` and `vec_dot_iq4_xs_q8_K_generic(n, x, y)`
(-> float32). The quantizers write the C twin's (and ggml_quantize_chunk's) bytes: every float
operation float32 and in the C order; the dots follow the C twin's float order with its fmaf
emulated in float64 (numba_kquants._fmaf). Layouts: ggml's block_iq4_nl / block_iq4_xs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..quants import IQ4_NL_VALUES
from .numba_kquants import F32, I64, _fmaf, _nearest_int, _rd_f32, _rd_half, _s8, _wr_half

QK4_NL, QK_K = 32, 256
IQ4_NL_BYTES = 18  # f16 d, 16 nibble bytes
IQ4_XS_BYTES, IQ4_XS_SCALES_H, IQ4_XS_SCALES_L, IQ4_XS_QS = 136, 2, 4, 8
Q8_0_BYTES, Q8_K_BYTES, Q8_K_QS = 34, 292, 4
GROUP_MAX_EPS = F32(1e-15)
NTRY = 7  # trial scales on each side of the first one (ggml's quantize_iq4_nl / _xs)
_VALUES = np.array(IQ4_NL_VALUES, dtype=np.int64)


@njit(cache=True)
def _check(k, nbytes, qk, block_bytes):
    if k % qk != 0:
        raise ValueError("IQ4 row length is not a multiple of its block size")
    if nbytes != k // qk * block_bytes:
        raise ValueError("IQ4 buffer size does not match the row length")


@njit(cache=True)
def _check_dot(n, xbytes, ybytes, qk, x_bytes, y_bytes):
    if n % qk != 0:
        raise ValueError("IQ4 row length is not a multiple of its block size")
    if xbytes < n // qk * x_bytes or ybytes < n // qk * y_bytes:
        raise ValueError("IQ4 dot: a buffer is shorter than the row length needs")


@njit(cache=True)
def _nearest_index(x):
    """Index of the table value nearest x, the lower one on a tie (ggml's best_index_int8)."""
    v = _VALUES
    if x <= F32(v[0]):
        return 0
    if x >= F32(v[15]):
        return 15
    lo, hi = 0, 15
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if x < F32(v[mid]):
            hi = mid
        else:
            lo = mid
    return hi - 1 if x - F32(v[hi - 1]) < F32(v[hi]) - x else hi


@njit(cache=True)
def _group_scale(x, s):
    """x^2-weighted least-squares scale of x[s:s+32] over 2*NTRY+2 trial scales (C: group_scale)."""
    w = np.empty(32, np.float32)
    amax = F32(0)
    vmax = F32(0)
    for j in range(32):
        w[j] = x[s + j] * x[s + j]
        ax = abs(x[s + j])
        if ax > amax:
            amax = ax
            vmax = x[s + j]
    if amax < GROUP_MAX_EPS:
        return F32(0)
    v0 = F32(_VALUES[0])
    inv = F32(1) / (-vmax / v0)
    sumqx = F32(0)
    sumq2 = F32(0)
    for j in range(32):
        q = F32(_VALUES[_nearest_index(inv * x[s + j])])
        sumqx += w[j] * q * x[s + j]
        sumq2 += w[j] * q * q
    d = sumqx / sumq2 if sumq2 > 0 else F32(0)
    best = d * sumqx
    for t in range(-NTRY, NTRY + 1):
        inv = F32(t + _VALUES[0]) / vmax
        sumqx = F32(0)
        sumq2 = F32(0)
        for j in range(32):
            q = F32(_VALUES[_nearest_index(inv * x[s + j])])
            sumqx += w[j] * q * x[s + j]
            sumq2 += w[j] * q * q
        if sumq2 > 0 and sumqx * sumqx > best * sumq2:
            d = sumqx / sumq2
            best = d * sumqx
    return d


@njit(cache=True)
def _pack_group(x, s, inv, y, o):
    """x[s:s+32] scaled by inv as nearest table indices: value j low nibble of y[o+j], j+16 high."""
    for j in range(16):
        y[o + j] = _nearest_index(inv * x[s + j]) | (_nearest_index(inv * x[s + j + 16]) << 4)


@njit(cache=True)
def quantize_row_iq4_nl_ref(x, y):
    _check(x.size, y.size, QK4_NL, IQ4_NL_BYTES)
    for i in range(x.size // QK4_NL):
        s, o = i * QK4_NL, i * IQ4_NL_BYTES
        d = _group_scale(x, s)
        _wr_half(y, o, d)
        _pack_group(x, s, F32(1) / d if d != 0 else F32(0), y, o + 2)


@njit(cache=True)
def quantize_row_iq4_xs_ref(x, y):
    _check(x.size, y.size, QK_K, IQ4_XS_BYTES)
    scales = np.empty(QK_K // 32, np.float32)
    for i in range(x.size // QK_K):
        s, o = i * QK_K, i * IQ4_XS_BYTES
        max_scale = F32(0)
        amax_scale = F32(0)
        for g in range(QK_K // 32):
            scales[g] = _group_scale(x, s + 32 * g)
            if abs(scales[g]) > amax_scale:
                amax_scale = abs(scales[g])
                max_scale = scales[g]
        d = -max_scale / F32(32)  # -0.0 for an all-zero super-block, as ggml
        _wr_half(y, o, d)
        inv = F32(1) / d if d != 0 else F32(0)
        sh = 0
        for b in range(4):
            y[o + IQ4_XS_SCALES_L + b] = 0
        for g in range(QK_K // 32):
            l = min(31, max(-32, _nearest_int(inv * scales[g])))
            dl = d * F32(l)
            _pack_group(x, s + 32 * g, F32(1) / dl if dl != 0 else F32(0), y, o + IQ4_XS_QS + 16 * g)
            sl = o + IQ4_XS_SCALES_L + g // 2
            y[sl] = I64(y[sl]) | (((l + 32) & 0xF) << (4 * (g % 2)))
            sh |= ((l + 32) >> 4) << (2 * g)
        y[o + IQ4_XS_SCALES_H] = sh & 0xFF
        y[o + IQ4_XS_SCALES_H + 1] = sh >> 8


@njit(cache=True)
def _xs_scale(x, o, g):
    """6-bit scale of group g of the IQ4_XS super-block at x[o:], minus 32."""
    sh = I64(x[o + IQ4_XS_SCALES_H]) | (I64(x[o + IQ4_XS_SCALES_H + 1]) << 8)
    lo = (I64(x[o + IQ4_XS_SCALES_L + g // 2]) >> (4 * (g % 2))) & 0xF
    return (lo | (((sh >> (2 * g)) & 3) << 4)) - 32


@njit(cache=True, inline="always")
def _unpack_group(x, o, q):
    """the 32 table values of the packed group at x[o:o+16], in value order"""
    for j in range(16):
        b = I64(x[o + j])
        q[j] = _VALUES[b & 0xF]
        q[j + 16] = _VALUES[b >> 4]


@njit(cache=True)
def dequantize_row_iq4_nl(x, y):
    _check(y.size, x.size, QK4_NL, IQ4_NL_BYTES)
    q = np.empty(32, np.int64)
    for i in range(y.size // QK4_NL):
        o = i * IQ4_NL_BYTES
        d = _rd_half(x, o)
        _unpack_group(x, o + 2, q)
        for j in range(32):
            y[i * QK4_NL + j] = d * F32(q[j])


@njit(cache=True)
def dequantize_row_iq4_xs(x, y):
    _check(y.size, x.size, QK_K, IQ4_XS_BYTES)
    q = np.empty(32, np.int64)
    for i in range(y.size // QK_K):
        o = i * IQ4_XS_BYTES
        d = _rd_half(x, o)
        for g in range(QK_K // 32):
            dl = d * F32(_xs_scale(x, o, g))
            _unpack_group(x, o + IQ4_XS_QS + 16 * g, q)
            for j in range(32):
                y[i * QK_K + 32 * g + j] = dl * F32(q[j])


@njit(cache=True)
def vec_dot_iq4_nl_q8_0_generic(n, x, y):
    """per block: exact sum of the 32 products, acc = fmaf(sum, dx * dy, acc)"""
    _check_dot(n, x.size, y.size, QK4_NL, IQ4_NL_BYTES, Q8_0_BYTES)
    q = np.empty(32, np.int64)
    acc = F32(0)
    for i in range(n // QK4_NL):
        ox, oy = i * IQ4_NL_BYTES, i * Q8_0_BYTES
        _unpack_group(x, ox + 2, q)
        total = 0
        for j in range(32):
            total += q[j] * _s8(y[oy + 2 + j])
        acc = _fmaf(F32(total), _rd_half(x, ox) * _rd_half(y, oy), acc)
    return acc


@njit(cache=True)
def vec_dot_iq4_xs_q8_K_generic(n, x, y):
    """llama.cpp's tiled gemm order (8 activation rows and more): per super-block the integer
    isum = sum of scale * dot over its groups, acc = fmaf(isum * d, d_act, acc)"""
    _check_dot(n, x.size, y.size, QK_K, IQ4_XS_BYTES, Q8_K_BYTES)
    q = np.empty(32, np.int64)
    acc = F32(0)
    for i in range(n // QK_K):
        ox, oy = i * IQ4_XS_BYTES, i * Q8_K_BYTES
        isum = 0
        for g in range(QK_K // 32):
            _unpack_group(x, ox + IQ4_XS_QS + 16 * g, q)
            dot = 0
            for j in range(32):
                dot += q[j] * _s8(y[oy + Q8_K_QS + 32 * g + j])
            isum += _xs_scale(x, ox, g) * dot
        acc = _fmaf(F32(isum) * _rd_half(x, ox), _rd_f32(y, oy), acc)
    return acc


@njit(cache=True)
def vec_dot_iq4_xs_q8_K_small_generic(n, x, y):
    """The small-batch order (ggml_vec_dot_iq4_xs_q8_K): 8 integer lanes per super-block (lane l:
    scale * products of values 4l..4l+3 of each group of 32), acc[l] = fmaf(d * d_act, lane l,
    acc[l]), summed as llama.cpp's hsum_float_8"""
    _check_dot(n, x.size, y.size, QK_K, IQ4_XS_BYTES, Q8_K_BYTES)
    q = np.empty(32, np.int64)
    lane = np.zeros(8, np.int64)
    acc = np.zeros(8, np.float32)
    for i in range(n // QK_K):
        ox, oy = i * IQ4_XS_BYTES, i * Q8_K_BYTES
        lane[:] = 0
        for g in range(QK_K // 32):
            _unpack_group(x, ox + IQ4_XS_QS + 16 * g, q)
            sc = _xs_scale(x, ox, g)
            for j in range(32):
                lane[j // 4] += sc * q[j] * _s8(y[oy + Q8_K_QS + 32 * g + j])
        d = _rd_half(x, ox) * _rd_f32(y, oy)
        for l in range(8):
            acc[l] = _fmaf(d, F32(lane[l]), acc[l])
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
