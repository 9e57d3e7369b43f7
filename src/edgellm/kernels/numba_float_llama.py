"""numba twin of csrc/float_llama.c: float weights (F32, F16) times their activation rows in
llama.cpp's orders, for llama_order steps (the single-stream API).

- ggml_vec_dot's order (one activation column, and the experts' matmuls at any batch size): 64
  float accumulators over each whole chunk of 64 values, combined (a0 + a2) + (a1 + a3) by
  16-lane quarters, reduced by el_sum16; the values past the last multiple of 64 added after it, in
  double for F16, by fmaf in float for F32.
- tinyBLAS's order (two or more columns, when the weight has a multiple of 4 rows and of 16 values
  per row): 16 lanes, lane i taking values i, i + 16, ..., reduced by el_sum16.

An F16 weight meets activations rounded to halves, so its products are exact in float and each
step is one rounded add; F32 steps are fmaf.
"""

from __future__ import annotations

import numba
import numpy as np

from .numba_ops import F32, F64, fmaf, sum16
from .numba_quants import f16_row_floats, f32_row_floats

_CHUNK = 64  # weight rows per parallel work item
_GEMMS: dict = {}


def tinyblas(rows: int, k: int, cols: int) -> bool:
    """el_float_llama_tinyblas: whether llama.cpp takes tinyBLAS for this product."""
    return cols >= 2 and rows % 4 == 0 and k % 16 == 0


def gemm(f16: bool, tb: bool):
    """The matmul (k, w uint8 [N, row bytes], a float32 [M, k] activation values, out float32
    [M, N]) of F16 (f16) or F32 weights in tinyBLAS's order (tb) or ggml_vec_dot's."""
    if (f16, tb) in _GEMMS:
        return _GEMMS[f16, tb]
    row_floats = f16_row_floats if f16 else f32_row_floats

    @numba.njit(inline="always")
    def madd(x, y, acc):
        return acc + x * y if f16 else fmaf(x, y, acc)

    @numba.njit(inline="always")
    def dot(k, x, y, acc):
        if tb:
            for i in range(16):
                acc[i] = F32(0.0)
            for i in range(0, k, 16):
                for l in range(16):
                    acc[l] = madd(x[i + l], y[i + l], acc[l])
            return sum16(acc, 0)
        for i in range(64):
            acc[i] = F32(0.0)
        k64 = k // 64 * 64
        for i in range(0, k64, 64):
            for l in range(64):
                acc[l] = madd(x[i + l], y[i + l], acc[l])
        for l in range(16):
            acc[l] = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l])
        r = sum16(acc, 0)
        if k64 == k:
            return r
        if f16:
            s = F64(r)
            for i in range(k64, k):
                s += F64(x[i] * y[i])
            return F32(s)
        for i in range(k64, k):
            r = fmaf(x[i], y[i], r)
        return r

    @numba.njit(parallel=True, cache=False)
    def matmul(k, w, a, out):
        n_rows, m_rows = w.shape[0], a.shape[0]
        for c in numba.prange((n_rows + _CHUNK - 1) // _CHUNK):
            wf = np.empty(k, np.float32)
            acc = np.empty(64, np.float32)
            for r in range(c * _CHUNK, min(n_rows, (c + 1) * _CHUNK)):
                row_floats(k, w[r], wf)
                for m in range(m_rows):
                    out[m, r] = dot(k, wf, a[m], acc)

    _GEMMS[f16, tb] = matmul
    return matmul
