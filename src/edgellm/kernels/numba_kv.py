"""The numba engine's quantized KV cache: rows of q8_0 / q4_0 blocks per (slot, head) (csrc/kv.c
stores the same blocks as key tiles and value tiles, el_internal.h), and the attention kernels that
read them (twins of csrc's): scores against the query quantized to q8_0 (qk_q8_0 / qk_q4_0 in
csrc/dispatch.c: per block the exact integer dot product times dk * dq rounded, added with one fma,
blocks in order), and p.v in integers (pv_q8_0 / pv_q4_0, el_internal.h's contract: per tile of 16
slots and 32-dim block, the weights times the slots' scales as int16 relative to a power of two,
the quants' sums exact in integers, then converted and added times the inverse power, tiles in
order, in chunks of PV_CHUNK tiles each summed from zero and then added in order).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..kv_cache import PV_CHUNK
from ..quants import QType, type_info
from . import numba_quants as nq

_QUANTIZE = {QType.Q8_0: nq.quantize_row_q8_0, QType.Q4_0: nq.quantize_row_q4_0_ref}  # as csrc's from_float
_DEQUANTIZE = {QType.Q8_0: nq.dequantize_row_q8_0, QType.Q4_0: nq.dequantize_row_q4_0}


def fwht(x: np.ndarray, chunk: int) -> np.ndarray:
    """csrc/ops.c's el_fwht: the last axis by the orthonormal Walsh-Hadamard matrix of size
    chunk, chunk by chunk (scaled first, then butterflies of span 1, 2, 4, ...; same roundings)."""
    y = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, chunk) * (np.float32(1) / np.sqrt(np.float32(chunk)))
    span = 1
    while span < chunk:
        y = y.reshape(len(y), chunk // (2 * span), 2, span)
        y = np.stack([y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]], axis=2)
        span *= 2
    return y.reshape(x.shape)


def row_bytes(t: QType, n: int) -> int:
    return type_info(t).row_bytes(n)


def quantize(t: QType, x: np.ndarray) -> np.ndarray:
    """Rows of x (float32 [..., n]) in type t: uint8 [..., row_bytes]."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    flat = x.reshape(-1, x.shape[-1])
    out = np.empty((flat.shape[0], row_bytes(t, x.shape[-1])), dtype=np.uint8)
    _rows(_QUANTIZE[QType(t)], flat, out)
    return out.reshape(x.shape[:-1] + (out.shape[-1],))


def dequantize(t: QType, rows: np.ndarray, n: int) -> np.ndarray:
    """float32 [..., n] of rows in type t (uint8 [..., row_bytes])."""
    flat = np.ascontiguousarray(rows).reshape(-1, rows.shape[-1])
    out = np.empty((flat.shape[0], n), dtype=np.float32)
    _rows(_DEQUANTIZE[QType(t)], flat, out)
    return out.reshape(rows.shape[:-1] + (n,))


@numba.njit(cache=False)
def _rows_impl(fn, src, dst):
    for i in range(src.shape[0]):
        fn(src[i], dst[i])


def _rows(fn, src, dst):
    _rows_impl(fn, src, dst)


@numba.njit(cache=True, inline='always')
def _quant_at(row, o, i, q4):
    """Value i (0..31) of the q8_0 / q4_0 block at row[o:], as a signed integer (q4_0: value i is the
    low nibble of byte i, value i + 16 its high nibble, minus 8)."""
    if q4:
        byte = np.int64(row[o + 2 + (i & 15)])
        return ((byte & 15) if i < 16 else (byte >> 4)) - 8
    v = np.int64(row[o + 2 + i])
    return v - 256 if v > 127 else v


@numba.njit(cache=True)
def _scores(q4, k, qq, out):
    """out[j, s] = q_j . k_s: per block b, the exact integer dot product of the quants (q4_0:
    nibble - 8), times dk * dq (float32), added with one fma (csrc twin: qk_q_generic)"""
    bsz = 18 if q4 else 34
    nb = k.shape[1] // bsz
    for j in range(qq.shape[0]):
        for s in range(k.shape[0]):
            acc = np.float32(0.0)
            for b in range(nb):
                ok, oq = b * bsz, b * 34
                isum = 0
                for i in range(32):
                    isum += _quant_at(k[s], ok, i, q4) * _quant_at(qq[j], oq, i, False)
                acc = nq._fmaf(nq._get_half(k[s], ok) * nq._get_half(qq[j], oq), np.float32(isum), acc)
            out[j, s] = acc


def scores(t: QType, keys: np.ndarray, q: np.ndarray) -> np.ndarray:
    """q . k for keys in type t (uint8 [S, row_bytes]) and queries q (float32 [nq, hk]): the query
    quantized to q8_0 (csrc: the keys' vec_dot_type), then qk_q8_0 / qk_q4_0's order; float32 [nq, S]."""
    t = QType(t)
    qq = quantize(QType.Q8_0, q)
    out = np.empty((q.shape[0], keys.shape[0]), dtype=np.float32)
    _scores(t == QType.Q4_0, np.ascontiguousarray(keys), qq, out)
    return out


@numba.njit(cache=True, inline='always')
def _chunk_end(acc_row, P):
    """A chunk's sums P added to acc_row (float32: one rounding each), P zeroed."""
    for i in range(acc_row.shape[0]):
        acc_row[i] = acc_row[i] + P[i]
        P[i] = np.float32(0.0)


@numba.njit(cache=True)
def _pv(q4, rows, w, acc, chunk):
    """csrc twin (pv_q_generic with t0 = 0, ldc = 0, each 32-dim block's value tiles made from these
    rows): tiles of 16 slots in order (tile t: slots 16t..16t+15, the rows past the end weigh 0), a
    row's tile skipped when its weights are all zero; per 32-dim block the int16 weights W[l] =
    rint(w d p) saturated, p = 2^(15 - e) with m = 2^e * f (f in [0.5, 1)) the largest of 2^-48 and
    |w d|, and P[i] += float(sum_l W[l] q_l[i]) / p, P the sums of the tile's chunk (tiles chunk * k
    ..), from zero, added to acc where the chunk ends."""
    nb = acc.shape[1] // 32
    bsz = 18 if q4 else 34
    S = rows.shape[0]
    wd = np.empty(16, np.float32)
    W = np.empty(16, np.int64)
    P = np.zeros(acc.shape[1], np.float32)
    for r in range(w.shape[0]):
        kc = -1  # the chunk summed in P
        for t in range((S + 15) // 16):
            n = min(16, S - 16 * t)
            if not np.any(w[r, 16 * t:16 * t + n] != 0):
                continue
            if t // chunk != kc:
                if kc >= 0:
                    _chunk_end(acc[r], P)
                kc = t // chunk
            for b in range(nb):
                o = b * bsz
                m = np.float32(2.0 ** -48)
                for l in range(16):
                    wd[l] = w[r, 16 * t + l] * nq._get_half(rows[16 * t + l], o) if l < n else np.float32(0.0)
                    m = max(m, abs(wd[l]))
                k = 15 - math.frexp(m)[1]
                p, inv = np.float32(math.ldexp(1.0, k)), np.float32(math.ldexp(1.0, -k))
                for l in range(16):
                    W[l] = min(32767, max(-32768, np.int64(np.rint(wd[l] * p))))
                for i in range(32):
                    isum = 0
                    for l in range(n):
                        isum += W[l] * _quant_at(rows[16 * t + l], o, i, q4)
                    P[b * 32 + i] = P[b * 32 + i] + np.float32(isum) * inv
        if kc >= 0:
            _chunk_end(acc[r], P)


def pv(t: QType, rows: np.ndarray, w: np.ndarray) -> np.ndarray:
    """p.v of weights w (float32 [nh, S]) over value rows in type t (uint8 [S, row_bytes]) of
    hv = 32 * blocks dims: float32 [nh, hv]."""
    t = QType(t)
    hv = rows.shape[1] // type_info(t).type_size * 32
    acc = np.zeros((w.shape[0], hv), dtype=np.float32)
    _pv(t == QType.Q4_0, np.ascontiguousarray(rows), np.ascontiguousarray(w, dtype=np.float32), acc, PV_CHUNK)
    return acc
