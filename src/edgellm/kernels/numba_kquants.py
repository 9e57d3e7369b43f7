"""numba twins of csrc/kquants_generic.c: K-quant quantize / dequantize / dot with Q8_K.

Same names as the C functions (ggml's), numpy arrays in place of pointers:
`quantize_row_<t>_ref(x: float32[k], y: uint8[k/256*block_bytes])`,
`dequantize_row_<t>(x: uint8[...], y: float32[k])`,
`vec_dot_<t>_q8_K_generic(n, x: uint8[...], y: uint8[...]) -> float32` (and the C twin's
`vec_dot_q3_K_q8_K_small_generic` / `vec_dot_q4_K_q8_K_small_generic` / `vec_dot_q5_K_q8_K_small_generic` /
`vec_dot_q6_K_q8_K_small_generic`). The dots follow the C
twin's float order; its fmaf is emulated in float64 (_fmaf).

The quantizers write the same bytes as the C twin (and ggml's quantize_row_*_ref), so every
float operation is float32 and in the C order. numba widens float32 to float64 when it meets a
Python int or float, so each constant and each int taking part in float arithmetic is wrapped
in np.float32. Block layouts as ggml's block_q*_K (ggml-common.h), little-endian.
"""

from __future__ import annotations


import numpy as np
from numba import njit

from .numba_quants import float_to_half as _f32_to_half  # exact binary16 conversions, shared
from .numba_quants import half_to_float as _half_to_f32
from .numba_quants import _hsum8, _lanes_acc  # the 8 float lanes of the small-batch orders, as the legacy types'

QK_K = 256
F32 = np.float32
I64 = np.int64  # numba keeps int() of a uint8 as uint8; bit operations need a signed int
GROUP_MAX_EPS = np.float32(1e-15)  # ggml-quants.c: groups below this are all zero

# bytes per super-block (ggml-common.h) and field offsets inside one
Q2_K_BYTES, Q2_K_SCALES, Q2_K_QS, Q2_K_D, Q2_K_DMIN = 84, 0, 16, 80, 82
Q3_K_BYTES, Q3_K_HMASK, Q3_K_QS, Q3_K_SCALES, Q3_K_D = 110, 0, 32, 96, 108
Q4_K_BYTES, Q4_K_D, Q4_K_DMIN, Q4_K_SCALES, Q4_K_QS = 144, 0, 2, 4, 16
Q5_K_BYTES, Q5_K_D, Q5_K_DMIN, Q5_K_SCALES, Q5_K_QH, Q5_K_QS = 176, 0, 2, 4, 16, 48
Q6_K_BYTES, Q6_K_QL, Q6_K_QH, Q6_K_SCALES, Q6_K_D = 210, 0, 128, 192, 208
Q8_K_BYTES, Q8_K_D, Q8_K_QS, Q8_K_BSUMS = 292, 0, 4, 260


# ---- scalar helpers --------------------------------------------------------------------

@njit(cache=True)
def _nearest_int(v):
    """Round half to even, as lrintf / ggml's nearest_int."""
    return I64(np.rint(v))


@njit(cache=True)
def _clamp(v, lo, hi):
    return lo if v < lo else (hi if v > hi else v)


@njit(cache=True)
def _rd_half(buf, o):
    return _half_to_f32(I64(buf[o]) | (I64(buf[o + 1]) << 8))


@njit(cache=True)
def _wr_half(buf, o, f):
    h = _f32_to_half(f)
    buf[o] = h & 0xFF
    buf[o + 1] = h >> 8


@njit(cache=True)
def _rd_f32(buf, o):
    tmp = np.empty(4, np.uint8)
    for i in range(4):
        tmp[i] = buf[o + i]
    return tmp.view(np.float32)[0]


@njit(cache=True)
def _wr_f32(buf, o, f):
    tmp = np.empty(1, np.float32)
    tmp[0] = f
    b = tmp.view(np.uint8)
    for i in range(4):
        buf[o + i] = b[i]


@njit(cache=True)
def _s8(b):
    v = I64(b)
    return v - 256 if v >= 128 else v


@njit(cache=True)
def _rd_i16(buf, o):
    v = I64(buf[o]) | (I64(buf[o + 1]) << 8)
    return v - 65536 if v >= 32768 else v


@njit(cache=True)
def _check(k, nbytes, block_bytes):
    if k % QK_K != 0:
        raise ValueError("K-quant row length is not a multiple of 256")
    if nbytes != k // QK_K * block_bytes:
        raise ValueError("K-quant buffer size does not match the row length")


@njit(cache=True)
def _check_dot(n, xbytes, ybytes, block_bytes):
    if n % QK_K != 0:
        raise ValueError("K-quant row length is not a multiple of 256")
    if xbytes < n // QK_K * block_bytes or ybytes < n // QK_K * Q8_K_BYTES:
        raise ValueError("K-quant dot: a buffer is shorter than the row length needs")


# ---- float part of the dot products (C's k_term / k_term_min) ----------------------------

@njit(cache=True)
def _fmaf(a, b, c):
    """C's fmaf(a, b, c) for float32 operands: the product is exact in float64, so only the sum
    rounds twice (float64, then float32), which differs from one rounding only in rare ties."""
    # np.float64, not float(): numba's float() of a float32 stays float32
    return F32(np.float64(a) * np.float64(b) + np.float64(c))


@njit(cache=True)
def _k_term(acc, isum, d, d_act):
    """fmaf((float)isum * d, d_act, acc)"""
    return _fmaf(F32(isum) * d, d_act, acc)


@njit(cache=True)
def _k_term_min(acc, isum, summs, d, dmin, d_act):
    """fmaf(fmaf(-dmin, (float)summs, (float)isum * d), d_act, acc)"""
    return _fmaf(_fmaf(-dmin, F32(summs), F32(isum) * d), d_act, acc)


# ---- scale search (ggml-quants.c make_qx_quants / make_q3_quants / make_qkx2_quants) ----

@njit(cache=True)
def _qx_quants_rmse1(n, nmax, x, L):
    """Symmetric, x^2-weighted, 18 trial scales; L[i] = l + nmax. As the C twin."""
    vmax = F32(0)
    amax = F32(0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            vmax = x[i]
    if amax < GROUP_MAX_EPS:
        L[:n] = 0
        return F32(0)
    iscale = F32(-nmax) / vmax
    sumlx = F32(0)
    suml2 = F32(0)
    for i in range(n):
        l = _clamp(_nearest_int(iscale * x[i]), -nmax, nmax - 1)
        L[i] = l + nmax
        w = x[i] * x[i]
        sumlx += w * x[i] * F32(l)
        suml2 += w * F32(l) * F32(l)
    scale = sumlx / suml2 if suml2 != 0 else F32(0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F32(nmax) + F32(0.1) * F32(step)) / vmax
        sumlx = F32(0)
        suml2 = F32(0)
        for i in range(n):
            l = _clamp(_nearest_int(iscale * x[i]), -nmax, nmax - 1)
            w = x[i] * x[i]
            sumlx += w * x[i] * F32(l)
            suml2 += w * F32(l) * F32(l)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + _clamp(_nearest_int(iscale * x[i]), -nmax, nmax - 1)
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True)
def _q3_quants_rmse(n, nmax, x, L):
    """Symmetric, refined by coordinate descent on the x^2-weighted error; L[i] = l + nmax."""
    vmax = F32(0)
    amax = F32(0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            vmax = x[i]
    if amax < GROUP_MAX_EPS:
        L[:n] = 0
        return F32(0)
    iscale = F32(-nmax) / vmax
    sumlx = F32(0)
    suml2 = F32(0)
    for i in range(n):
        l = _clamp(_nearest_int(iscale * x[i]), -nmax, nmax - 1)
        L[i] = l
        w = x[i] * x[i]
        sumlx += w * x[i] * F32(l)
        suml2 += w * F32(l) * F32(l)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = x[i] * x[i]
            li = F32(L[i])
            slx = sumlx - w * x[i] * li
            if slx > 0:
                sl2 = suml2 - w * li * li
                new_l = _clamp(_nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1)
                if new_l != L[i]:
                    slx += w * x[i] * F32(new_l)
                    sl2 += w * F32(new_l) * F32(new_l)
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > 0 else F32(0)


@njit(cache=True)
def _qkx2_quants(n, nmax, x, weights, L, Laux, rmin, rdelta, nstep, use_mad):
    """Asymmetric x ~ scale*L - min with a search over nstep+1 scales. Returns (scale, min >= 0)."""
    vmin = x[0]
    vmax = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < vmin:
            vmin = x[i]
        if x[i] > vmax:
            vmax = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if vmin > 0:
        vmin = F32(0)
    if vmax == vmin:
        L[:n] = 0
        return F32(0), -vmin
    iscale = F32(nmax) / (vmax - vmin)
    scale = F32(1) / iscale
    best_error = F32(0)
    for i in range(n):
        L[i] = _clamp(_nearest_int(iscale * (x[i] - vmin)), 0, nmax)
        diff = scale * F32(L[i]) + vmin - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best_error += weights[i] * diff
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * F32(step) + F32(nmax)) / (vmax - vmin)
        sum_l = F32(0)
        sum_l2 = F32(0)
        sum_xl = F32(0)
        for i in range(n):
            l = _clamp(_nearest_int(iscale * (x[i] - vmin)), 0, nmax)
            Laux[i] = l
            w = weights[i]
            sum_l += w * F32(l)
            sum_l2 += w * F32(l) * F32(l)
            sum_xl += w * F32(l) * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = F32(0)
                this_scale = sum_xl / sum_l2
            cur_error = F32(0)
            for i in range(n):
                diff = this_scale * F32(Laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                cur_error += weights[i] * diff
            if cur_error < best_error:
                L[:n] = Laux[:n]
                best_error = cur_error
                scale = this_scale
                vmin = this_min
    return scale, -vmin


# ---- packing helpers (layouts as in ggml's quantize/dequantize_row_q*_K) -----------------

@njit(cache=True)
def _get_scale_min_k4(j, buf, o):
    """Q4_K/Q5_K 6-bit (scale, min) pair j from the 12 scale bytes at buf[o:]."""
    if j < 4:
        return I64(buf[o + j]) & 63, I64(buf[o + j + 4]) & 63
    sc = (I64(buf[o + j + 4]) & 0xF) | ((I64(buf[o + j - 4]) >> 6) << 4)
    m = (I64(buf[o + j + 4]) >> 4) | ((I64(buf[o + j]) >> 6) << 4)
    return sc, m


@njit(cache=True)
def _set_scale_min_k4(j, buf, o, ls, lm):
    if j < 4:
        buf[o + j] = ls
        buf[o + j + 4] = lm
    else:
        buf[o + j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
        buf[o + j - 4] = I64(buf[o + j - 4]) | ((ls >> 4) << 6)
        buf[o + j] = I64(buf[o + j]) | ((lm >> 4) << 6)


@njit(cache=True)
def _q3_K_scale(buf, o, j):
    """Q3_K 6-bit scale j (minus 32) from the 12 scale bytes at buf[o:]."""
    lo = (I64(buf[o + j]) & 0xF) if j < 8 else (I64(buf[o + j - 8]) >> 4)
    hi = (I64(buf[o + 8 + j % 4]) >> (2 * (j // 4))) & 3
    return (lo | (hi << 4)) - 32


@njit(cache=True)
def _pack_2bit(L, buf, o):
    """byte l of each 32-byte chunk holds values l, l+32, l+64, l+96 of its 128 (bits 0,2,4,6)"""
    for j in range(0, QK_K, 128):
        for l in range(32):
            buf[o + j // 4 + l] = (I64(L[j + l]) | (I64(L[j + l + 32]) << 2)
                                   | (I64(L[j + l + 64]) << 4) | (I64(L[j + l + 96]) << 6))


@njit(cache=True)
def _unpack_2bit(buf, o, v):
    return (I64(buf[o + (v // 128) * 32 + v % 32]) >> (2 * ((v % 128) // 32))) & 3


@njit(cache=True)
def _unpack_4bit(buf, o, v):
    b = I64(buf[o + (v // 64) * 32 + v % 32])
    return (b & 0xF) if v % 64 < 32 else (b >> 4)


@njit(cache=True)
def _unpack_q6(buf, o, v):
    """value v of the Q6_K block at buf[o:], minus 32"""
    half = v // 128
    r = v % 128
    quarter = r // 32
    l = r % 32
    lo = I64(buf[o + Q6_K_QL + 64 * half + 32 * (quarter & 1) + l])
    low4 = (lo & 0xF) if quarter < 2 else (lo >> 4)
    high2 = (I64(buf[o + Q6_K_QH + 32 * half + l]) >> (2 * quarter)) & 3
    return (low4 | (high2 << 4)) - 32


# ---- Q2_K ----------------------------------------------------------------------------------

@njit(cache=True)
def quantize_row_q2_K_ref(x, y):
    k = x.size
    _check(k, y.size, Q2_K_BYTES)
    q4scale = F32(15)
    L = np.zeros(QK_K, np.uint8)
    Laux = np.zeros(16, np.uint8)
    weights = np.zeros(16, np.float32)
    mins = np.zeros(16, np.float32)
    scales = np.zeros(16, np.float32)
    for i in range(k // QK_K):
        xb = x[i * QK_K:(i + 1) * QK_K]
        o = i * Q2_K_BYTES
        max_scale = F32(0)
        max_min = F32(0)
        for j in range(16):
            for l in range(16):
                weights[l] = abs(xb[16 * j + l])
            s, m = _qkx2_quants(16, 3, xb[16 * j:16 * j + 16], weights, L[16 * j:16 * j + 16],
                                Laux, F32(-0.5), F32(0.1), 15, True)
            scales[j] = s
            mins[j] = m
            if s > max_scale:
                max_scale = s
            if m > max_min:
                max_min = m
        if max_scale > 0:
            iscale = q4scale / max_scale
            for j in range(16):
                y[o + Q2_K_SCALES + j] = _nearest_int(iscale * scales[j]) & 0xFF
            _wr_half(y, o + Q2_K_D, max_scale / q4scale)
        else:
            y[o + Q2_K_SCALES:o + Q2_K_SCALES + 16] = 0
            _wr_half(y, o + Q2_K_D, F32(0))
        if max_min > 0:
            iscale = q4scale / max_min
            for j in range(16):
                y[o + Q2_K_SCALES + j] = (I64(y[o + Q2_K_SCALES + j])
                                          | (_nearest_int(iscale * mins[j]) << 4)) & 0xFF
            _wr_half(y, o + Q2_K_DMIN, max_min / q4scale)
        else:
            _wr_half(y, o + Q2_K_DMIN, F32(0))
        dd = _rd_half(y, o + Q2_K_D)
        ddmin = _rd_half(y, o + Q2_K_DMIN)
        for j in range(16):
            sc = I64(y[o + Q2_K_SCALES + j])
            d = dd * F32(sc & 0xF)
            if d == 0:
                continue
            dm = ddmin * F32(sc >> 4)
            for ii in range(16):
                L[16 * j + ii] = _clamp(_nearest_int((xb[16 * j + ii] + dm) / d), 0, 3)
        _pack_2bit(L, y, o + Q2_K_QS)


@njit(cache=True)
def dequantize_row_q2_K(x, y):
    k = y.size
    _check(k, x.size, Q2_K_BYTES)
    for i in range(k // QK_K):
        o = i * Q2_K_BYTES
        d = _rd_half(x, o + Q2_K_D)
        dmin = _rd_half(x, o + Q2_K_DMIN)
        for j in range(16):
            sc = I64(x[o + Q2_K_SCALES + j])
            dl = d * F32(sc & 0xF)
            ml = dmin * F32(sc >> 4)
            for l in range(16):
                v = 16 * j + l
                y[i * QK_K + v] = dl * F32(_unpack_2bit(x, o + Q2_K_QS, v)) - ml


@njit(cache=True)
def vec_dot_q2_K_q8_K_generic(n, x, y):
    _check_dot(n, x.size, y.size, Q2_K_BYTES)
    sumf = F32(0)
    for i in range(n // QK_K):
        o = i * Q2_K_BYTES
        oy = i * Q8_K_BYTES
        isum = 0
        summs = 0
        for g in range(16):
            sc = I64(x[o + Q2_K_SCALES + g])
            s = 0
            for l in range(16 * g, 16 * g + 16):
                s += _s8(y[oy + Q8_K_QS + l]) * _unpack_2bit(x, o + Q2_K_QS, l)
            isum += (sc & 0xF) * s
            summs += _rd_i16(y, oy + Q8_K_BSUMS + 2 * g) * (sc >> 4)
        sumf = _k_term_min(sumf, isum, summs, _rd_half(x, o + Q2_K_D), _rd_half(x, o + Q2_K_DMIN),
                           _rd_f32(y, oy + Q8_K_D))
    return sumf


# ---- Q3_K ----------------------------------------------------------------------------------

@njit(cache=True)
def quantize_row_q3_K_ref(x, y):
    k = x.size
    _check(k, y.size, Q3_K_BYTES)
    L = np.zeros(QK_K, np.int8)
    low = np.zeros(QK_K, np.uint8)
    scales = np.zeros(16, np.float32)
    for i in range(k // QK_K):
        xb = x[i * QK_K:(i + 1) * QK_K]
        o = i * Q3_K_BYTES
        max_scale = F32(0)
        amax = F32(0)
        for j in range(16):
            s = _q3_quants_rmse(16, 4, xb[16 * j:16 * j + 16], L[16 * j:16 * j + 16])
            scales[j] = s
            if abs(s) > amax:
                amax = abs(s)
                max_scale = s
        y[o + Q3_K_SCALES:o + Q3_K_SCALES + 12] = 0
        if max_scale != 0:
            iscale = F32(-32) / max_scale
            for j in range(16):
                l8 = ((_nearest_int(iscale * scales[j]) + 128) & 0xFF) - 128  # C stores an int8_t
                l = _clamp(l8, -32, 31) + 32
                if j < 8:
                    y[o + Q3_K_SCALES + j] = l & 0xF
                else:
                    y[o + Q3_K_SCALES + j - 8] = I64(y[o + Q3_K_SCALES + j - 8]) | ((l & 0xF) << 4)
                hs = o + Q3_K_SCALES + 8 + j % 4
                y[hs] = I64(y[hs]) | ((l >> 4) << (2 * (j // 4)))
            _wr_half(y, o + Q3_K_D, F32(1) / iscale)
        else:
            _wr_half(y, o + Q3_K_D, F32(0))
        dd = _rd_half(y, o + Q3_K_D)
        for j in range(16):
            d = dd * F32(_q3_K_scale(y, o + Q3_K_SCALES, j))
            if d == 0:
                continue
            for ii in range(16):
                L[16 * j + ii] = _clamp(_nearest_int(xb[16 * j + ii] / d), -4, 3) + 4
        y[o + Q3_K_HMASK:o + Q3_K_HMASK + 32] = 0
        for j in range(QK_K):
            l = I64(L[j])
            if l > 3:
                y[o + Q3_K_HMASK + j % 32] = I64(y[o + Q3_K_HMASK + j % 32]) | (1 << (j // 32))
                l -= 4
            low[j] = l
        _pack_2bit(low, y, o + Q3_K_QS)


@njit(cache=True)
def _q3_K_value(x, o, v):
    """value v of the Q3_K block at x[o:]: 2 low bits, minus 4 unless its hmask bit is set"""
    hbit = (I64(x[o + Q3_K_HMASK + v % 32]) >> (v // 32)) & 1
    return _unpack_2bit(x, o + Q3_K_QS, v) - (0 if hbit else 4)


@njit(cache=True)
def dequantize_row_q3_K(x, y):
    k = y.size
    _check(k, x.size, Q3_K_BYTES)
    for i in range(k // QK_K):
        o = i * Q3_K_BYTES
        d_all = _rd_half(x, o + Q3_K_D)
        for j in range(16):
            dl = d_all * F32(_q3_K_scale(x, o + Q3_K_SCALES, j))
            for l in range(16):
                v = 16 * j + l
                y[i * QK_K + v] = dl * F32(_q3_K_value(x, o, v))


@njit(cache=True)
def vec_dot_q3_K_q8_K_generic(n, x, y):
    _check_dot(n, x.size, y.size, Q3_K_BYTES)
    sumf = F32(0)
    for i in range(n // QK_K):
        o = i * Q3_K_BYTES
        oy = i * Q8_K_BYTES
        isum = 0
        for g in range(16):
            s = 0
            for l in range(16 * g, 16 * g + 16):
                s += _s8(y[oy + Q8_K_QS + l]) * _q3_K_value(x, o, l)
            isum += _q3_K_scale(x, o + Q3_K_SCALES, g) * s
        sumf = _k_term(sumf, isum, _rd_half(x, o + Q3_K_D), _rd_f32(y, oy + Q8_K_D))
    return sumf


@njit(cache=True)
def vec_dot_q3_K_q8_K_small_generic(n, x, y):
    """llama.cpp's x86 vec_dot for Q3_K (the C twin's small-batch order): 8 integer lanes per
    super-block, lane k over the values v with (v % 32) // 4 == k of scale * q * q8 (q signed);
    acc[k] = fmaf(d_act * d, lane, acc[k]); the lanes summed as ((l0 + l4) + (l2 + l6)) +
    ((l1 + l5) + (l3 + l7))."""
    _check_dot(n, x.size, y.size, Q3_K_BYTES)
    acc = np.zeros(8, np.float32)
    lane = np.zeros(8, np.int64)
    for i in range(n // QK_K):
        o = i * Q3_K_BYTES
        oy = i * Q8_K_BYTES
        lane[:] = 0
        for v in range(QK_K):
            lane[(v % 32) // 4] += (_q3_K_scale(x, o + Q3_K_SCALES, v // 16) * _q3_K_value(x, o, v)
                                    * _s8(y[oy + Q8_K_QS + v]))
        d = _rd_f32(y, oy + Q8_K_D) * _rd_half(x, o + Q3_K_D)
        _lanes_acc(acc, d, lane)
    return _hsum8(acc)


# ---- Q4_K / Q5_K ---------------------------------------------------------------------------

@njit(cache=True)
def _quantize_k4_scales(xb, nmax, rmin, nstep, L, y, o_d, o_dmin, o_scales):
    """Group scales/mins, their 6-bit packing, d and dmin, then requantize into L (0..nmax)."""
    Laux = np.zeros(32, np.uint8)
    weights = np.zeros(32, np.float32)
    mins = np.zeros(8, np.float32)
    scales = np.zeros(8, np.float32)
    max_scale = F32(0)
    max_min = F32(0)
    for j in range(8):
        sum_x2 = F32(0)
        for l in range(32):
            sum_x2 += xb[32 * j + l] * xb[32 * j + l]
        av_x = np.sqrt(sum_x2 / F32(32))
        for l in range(32):
            weights[l] = av_x + abs(xb[32 * j + l])
        s, m = _qkx2_quants(32, nmax, xb[32 * j:32 * j + 32], weights, L[32 * j:32 * j + 32],
                            Laux, rmin, F32(0.1), nstep, False)
        scales[j] = s
        mins[j] = m
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    inv_scale = F32(63) / max_scale if max_scale > 0 else F32(0)
    inv_min = F32(63) / max_min if max_min > 0 else F32(0)
    for j in range(8):
        ls = min(63, _nearest_int(inv_scale * scales[j]) & 0xFF)  # C rounds into a uint8_t
        lm = min(63, _nearest_int(inv_min * mins[j]) & 0xFF)
        _set_scale_min_k4(j, y, o_scales, ls, lm)
    _wr_half(y, o_d, max_scale / F32(63))
    _wr_half(y, o_dmin, max_min / F32(63))
    dd = _rd_half(y, o_d)
    ddmin = _rd_half(y, o_dmin)
    for j in range(8):
        sc, m = _get_scale_min_k4(j, y, o_scales)
        d = dd * F32(sc)
        if d == 0:
            continue
        dm = ddmin * F32(m)
        for ii in range(32):
            L[32 * j + ii] = _clamp(_nearest_int((xb[32 * j + ii] + dm) / d), 0, nmax)


@njit(cache=True)
def quantize_row_q4_K_ref(x, y):
    k = x.size
    _check(k, y.size, Q4_K_BYTES)
    L = np.zeros(QK_K, np.uint8)
    for i in range(k // QK_K):
        o = i * Q4_K_BYTES
        _quantize_k4_scales(x[i * QK_K:(i + 1) * QK_K], 15, F32(-1), 20, L, y,
                            o + Q4_K_D, o + Q4_K_DMIN, o + Q4_K_SCALES)
        for j in range(0, QK_K, 64):
            for l in range(32):
                y[o + Q4_K_QS + j // 2 + l] = I64(L[j + l]) | (I64(L[j + l + 32]) << 4)


@njit(cache=True)
def quantize_row_q5_K_ref(x, y):
    k = x.size
    _check(k, y.size, Q5_K_BYTES)
    L = np.zeros(QK_K, np.uint8)
    for i in range(k // QK_K):
        o = i * Q5_K_BYTES
        _quantize_k4_scales(x[i * QK_K:(i + 1) * QK_K], 31, F32(-0.5), 15, L, y,
                            o + Q5_K_D, o + Q5_K_DMIN, o + Q5_K_SCALES)
        y[o + Q5_K_QH:o + Q5_K_QH + 32] = 0
        for v in range(QK_K):
            if L[v] > 15:
                y[o + Q5_K_QH + v % 32] = I64(y[o + Q5_K_QH + v % 32]) | (1 << (v // 32))
        for j in range(0, QK_K, 64):
            for l in range(32):
                y[o + Q5_K_QS + j // 2 + l] = (I64(L[j + l]) & 0xF) | ((I64(L[j + l + 32]) & 0xF) << 4)


@njit(cache=True)
def _q5_K_value(x, o, v):
    return _unpack_4bit(x, o + Q5_K_QS, v) | (((I64(x[o + Q5_K_QH + v % 32]) >> (v // 32)) & 1) << 4)


@njit(cache=True)
def dequantize_row_q4_K(x, y):
    k = y.size
    _check(k, x.size, Q4_K_BYTES)
    for i in range(k // QK_K):
        o = i * Q4_K_BYTES
        d = _rd_half(x, o + Q4_K_D)
        dmin = _rd_half(x, o + Q4_K_DMIN)
        for j in range(8):
            sc, m = _get_scale_min_k4(j, x, o + Q4_K_SCALES)
            dl = d * F32(sc)
            ml = dmin * F32(m)
            for l in range(32):
                v = 32 * j + l
                y[i * QK_K + v] = dl * F32(_unpack_4bit(x, o + Q4_K_QS, v)) - ml


@njit(cache=True)
def dequantize_row_q5_K(x, y):
    k = y.size
    _check(k, x.size, Q5_K_BYTES)
    for i in range(k // QK_K):
        o = i * Q5_K_BYTES
        d = _rd_half(x, o + Q5_K_D)
        dmin = _rd_half(x, o + Q5_K_DMIN)
        for j in range(8):
            sc, m = _get_scale_min_k4(j, x, o + Q5_K_SCALES)
            dl = d * F32(sc)
            ml = dmin * F32(m)
            for l in range(32):
                v = 32 * j + l
                y[i * QK_K + v] = dl * F32(_q5_K_value(x, o, v)) - ml


@njit(cache=True)
def _dot_k4_ints(x, o, o_scales, o_qs, o_qh, y, oy, j0, j1):
    """Integer parts of sub-blocks j0..j1-1 (32 values each) of a Q4_K (o_qh < 0) or Q5_K
    super-block against a Q8_K block: (sum of sc * dot, sum of m * bsum)."""
    isum = 0
    summs = 0
    for j in range(j0, j1):
        sc, m = _get_scale_min_k4(j, x, o + o_scales)
        s = 0
        for v in range(32 * j, 32 * j + 32):
            q = _unpack_4bit(x, o + o_qs, v)
            if o_qh >= 0:
                q |= ((I64(x[o + o_qh + v % 32]) >> (v // 32)) & 1) << 4
            s += _s8(y[oy + Q8_K_QS + v]) * q
        isum += I64(sc) * s
        summs += I64(m) * (_rd_i16(y, oy + Q8_K_BSUMS + 4 * j) + _rd_i16(y, oy + Q8_K_BSUMS + 4 * j + 2))
    return isum, summs


@njit(cache=True)
def _q4_K_dot(n, x, y, span):
    """The C twin's order (llama.cpp's x86 gemm over repacked Q4_K with span 2 sub-blocks, its
    gemv with span 8): per span the integers I and M, acc = fmaf(I, d * d_act, acc),
    accm = fmaf(M, dmin * d_act, accm); the result is acc - accm."""
    _check_dot(n, x.size, y.size, Q4_K_BYTES)
    acc = F32(0)
    accm = F32(0)
    for i in range(n // QK_K):
        o = i * Q4_K_BYTES
        oy = i * Q8_K_BYTES
        yd = _rd_f32(y, oy + Q8_K_D)
        dd = _rd_half(x, o + Q4_K_D) * yd
        dm = _rd_half(x, o + Q4_K_DMIN) * yd
        for j in range(0, 8, span):
            isum, summs = _dot_k4_ints(x, o, Q4_K_SCALES, Q4_K_QS, -1, y, oy, j, j + span)
            acc = _fmaf(F32(isum), dd, acc)
            accm = _fmaf(F32(summs), dm, accm)
    return acc - accm


@njit(cache=True)
def vec_dot_q4_K_q8_K_generic(n, x, y):
    return _q4_K_dot(n, x, y, 2)


@njit(cache=True)
def vec_dot_q4_K_q8_K_small_generic(n, x, y):
    return _q4_K_dot(n, x, y, 8)


@njit(cache=True)
def vec_dot_q5_K_q8_K_generic(n, x, y):
    _check_dot(n, x.size, y.size, Q5_K_BYTES)
    sumf = F32(0)
    for i in range(n // QK_K):
        o = i * Q5_K_BYTES
        oy = i * Q8_K_BYTES
        isum, summs = _dot_k4_ints(x, o, Q5_K_SCALES, Q5_K_QS, Q5_K_QH, y, oy, 0, 8)
        sumf = _k_term_min(sumf, isum, summs, _rd_half(x, o + Q5_K_D), _rd_half(x, o + Q5_K_DMIN),
                           _rd_f32(y, oy + Q8_K_D))
    return sumf


@njit(cache=True)
def vec_dot_q5_K_q8_K_small_generic(n, x, y):
    """llama.cpp's x86 vec_dot for Q5_K (the C twin's small-batch order): 8 integer lanes per
    super-block, lane k over the values v with (v % 32) // 4 == k of sc * q * q8; acc[k] =
    fmaf(d_act * d, lane, acc[k]); the mins a chain summs = fmaf(-d_act * dmin, sum m * bsum,
    summs); the lanes summed as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), plus summs."""
    _check_dot(n, x.size, y.size, Q5_K_BYTES)
    acc = np.zeros(8, np.float32)
    lane = np.zeros(8, np.int64)
    summs = F32(0)
    for i in range(n // QK_K):
        o = i * Q5_K_BYTES
        oy = i * Q8_K_BYTES
        lane[:] = 0
        mins = 0
        for j in range(8):
            sc, m = _get_scale_min_k4(j, x, o + Q5_K_SCALES)
            mins += I64(m) * (_rd_i16(y, oy + Q8_K_BSUMS + 4 * j) + _rd_i16(y, oy + Q8_K_BSUMS + 4 * j + 2))
            for v in range(32 * j, 32 * j + 32):
                q = _unpack_4bit(x, o + Q5_K_QS, v) | (((I64(x[o + Q5_K_QH + v % 32]) >> j) & 1) << 4)
                lane[(v % 32) // 4] += I64(sc) * q * _s8(y[oy + Q8_K_QS + v])
        d_act = _rd_f32(y, oy + Q8_K_D)
        d = d_act * _rd_half(x, o + Q5_K_D)
        dmin = -d_act * _rd_half(x, o + Q5_K_DMIN)
        summs = _fmaf(dmin, F32(mins), summs)
        _lanes_acc(acc, d, lane)
    return _hsum8(acc) + summs


# ---- Q6_K ----------------------------------------------------------------------------------

@njit(cache=True)
def quantize_row_q6_K_ref(x, y):
    k = x.size
    _check(k, y.size, Q6_K_BYTES)
    L = np.zeros(QK_K, np.int8)
    scales = np.zeros(16, np.float32)
    for i in range(k // QK_K):
        xb = x[i * QK_K:(i + 1) * QK_K]
        o = i * Q6_K_BYTES
        max_scale = F32(0)
        max_abs_scale = F32(0)
        for ib in range(16):
            s = _qx_quants_rmse1(16, 32, xb[16 * ib:16 * ib + 16], L[16 * ib:16 * ib + 16])
            scales[ib] = s
            if abs(s) > max_abs_scale:
                max_abs_scale = abs(s)
                max_scale = s
        if max_abs_scale < GROUP_MAX_EPS:
            y[o:o + Q6_K_BYTES] = 0
            continue
        iscale = F32(-128) / max_scale
        _wr_half(y, o + Q6_K_D, F32(1) / iscale)
        for ib in range(16):
            y[o + Q6_K_SCALES + ib] = min(127, _nearest_int(iscale * scales[ib])) & 0xFF
        dd = _rd_half(y, o + Q6_K_D)
        for j in range(16):
            d = dd * F32(_s8(y[o + Q6_K_SCALES + j]))
            if d == 0:
                continue
            for ii in range(16):
                L[16 * j + ii] = _clamp(_nearest_int(xb[16 * j + ii] / d), -32, 31) + 32
        for j in range(0, QK_K, 128):
            ql = o + Q6_K_QL + j // 2
            qh = o + Q6_K_QH + j // 4
            for l in range(32):
                v0 = I64(L[j + l])
                v1 = I64(L[j + l + 32])
                v2 = I64(L[j + l + 64])
                v3 = I64(L[j + l + 96])
                y[ql + l] = (v0 & 0xF) | ((v2 & 0xF) << 4)
                y[ql + l + 32] = (v1 & 0xF) | ((v3 & 0xF) << 4)
                y[qh + l] = (v0 >> 4) | ((v1 >> 4) << 2) | ((v2 >> 4) << 4) | ((v3 >> 4) << 6)


@njit(cache=True)
def dequantize_row_q6_K(x, y):
    k = y.size
    _check(k, x.size, Q6_K_BYTES)
    for i in range(k // QK_K):
        o = i * Q6_K_BYTES
        d = _rd_half(x, o + Q6_K_D)
        for v in range(QK_K):
            sc = F32(_s8(x[o + Q6_K_SCALES + v // 16]))
            y[i * QK_K + v] = d * sc * F32(_unpack_q6(x, o, v))


@njit(cache=True)
def vec_dot_q6_K_q8_K_generic(n, x, y):
    _check_dot(n, x.size, y.size, Q6_K_BYTES)
    sumf = F32(0)
    for i in range(n // QK_K):
        o = i * Q6_K_BYTES
        oy = i * Q8_K_BYTES
        isum = 0
        for g in range(16):
            s = 0
            for l in range(16 * g, 16 * g + 16):
                s += _s8(y[oy + Q8_K_QS + l]) * _unpack_q6(x, o, l)
            isum += _s8(x[o + Q6_K_SCALES + g]) * s
        sumf = _k_term(sumf, isum, _rd_half(x, o + Q6_K_D), _rd_f32(y, oy + Q8_K_D))
    return sumf


@njit(cache=True)
def vec_dot_q6_K_q8_K_small_generic(n, x, y):
    """llama.cpp's x86 vec_dot for Q6_K (the C twin's small-batch order): 8 integer lanes per
    super-block, lane k over values v with (v % 32) // 4 == k, of sc * (q + 32) * q8, minus
    32 * (sc[2k] * bsum[2k] + sc[2k+1] * bsum[2k+1]); acc[k] = fmaf(d_act * d, lane, acc[k]);
    the lanes summed as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) at the end."""
    _check_dot(n, x.size, y.size, Q6_K_BYTES)
    acc = np.zeros(8, np.float32)
    lane = np.zeros(8, np.int64)
    for i in range(n // QK_K):
        o = i * Q6_K_BYTES
        oy = i * Q8_K_BYTES
        lane[:] = 0
        for v in range(QK_K):
            lane[(v % 32) // 4] += (_s8(x[o + Q6_K_SCALES + v // 16]) * (_unpack_q6(x, o, v) + 32)
                                    * _s8(y[oy + Q8_K_QS + v]))
        for k in range(8):
            lane[k] -= 32 * (_s8(x[o + Q6_K_SCALES + 2 * k]) * _rd_i16(y, oy + Q8_K_BSUMS + 4 * k)
                             + _s8(x[o + Q6_K_SCALES + 2 * k + 1]) * _rd_i16(y, oy + Q8_K_BSUMS + 4 * k + 2))
        d = _rd_f32(y, oy + Q8_K_D) * _rd_half(x, o + Q6_K_D)
        _lanes_acc(acc, d, lane)
    return _hsum8(acc)


# ---- Q8_K (activations) --------------------------------------------------------------------

@njit(cache=True)
def quantize_row_q8_K_ref(x, y):
    k = x.size
    _check(k, y.size, Q8_K_BYTES)
    for i in range(k // QK_K):
        xb = x[i * QK_K:(i + 1) * QK_K]
        o = i * Q8_K_BYTES
        vmax = F32(0)
        amax = F32(0)
        for j in range(QK_K):
            if abs(xb[j]) > amax:
                amax = abs(xb[j])
                vmax = xb[j]
        if amax == 0:
            y[o:o + Q8_K_BYTES] = 0
            continue
        iscale = F32(-127) / vmax  # -127 as ggml: every q in [-127, 127]
        for j in range(QK_K):
            y[o + Q8_K_QS + j] = min(127, _nearest_int(iscale * xb[j])) & 0xFF
        for j in range(16):
            s = 0
            for ii in range(16):
                s += _s8(y[o + Q8_K_QS + 16 * j + ii])
            y[o + Q8_K_BSUMS + 2 * j] = s & 0xFF
            y[o + Q8_K_BSUMS + 2 * j + 1] = (s >> 8) & 0xFF
        _wr_f32(y, o + Q8_K_D, F32(1) / iscale)


@njit(cache=True)
def dequantize_row_q8_K(x, y):
    k = y.size
    _check(k, x.size, Q8_K_BYTES)
    for i in range(k // QK_K):
        o = i * Q8_K_BYTES
        d = _rd_f32(x, o + Q8_K_D)
        for j in range(QK_K):
            y[i * QK_K + j] = d * F32(_s8(x[o + Q8_K_QS + j]))
