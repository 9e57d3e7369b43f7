"""numba twins of the C engine's float operations: csrc/ops.c (RMS norm, RoPE and its cache, the
f16 GELU table), the generic vector helpers of csrc/dispatch.c (SiLU), el_sum16 / el_expf
(csrc/el_internal.h), moe.c's routing and engine.c's final soft-cap.

Every operation is the C one in float32, in the C order, one rounding each: fmaf where C calls it
(LLVM's fma intrinsic: one rounding, as C's), and the C library's own expf / tanhf / cosf / sinf /
logf / powf where C calls them (through ctypes; numpy's float32 SIMD math gives other bits). numba
does not fuse a*b+c, and an operation between two float32 values stays float32; a float64 literal
would widen the expression, so constants are float32 here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np
from numba import njit, prange
from numba.core import types
from numba.extending import intrinsic

from .numba_quants import float_to_half, half_to_float

F32 = np.float32
F64 = np.float64


# ---------------------------------------------------------------- fmaf, the C library's functions

@intrinsic
def _fma32(typingctx, a, b, c):
    if not all(isinstance(t, types.Float) and t.bitwidth == 32 for t in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        return builder.fma(args[0], args[1], args[2])

    return types.float32(types.float32, types.float32, types.float32), codegen


@njit(cache=True, inline="always")
def fmaf(a, b, c):
    """C's fmaf: a * b + c rounded once."""
    return _fma32(F32(a), F32(b), F32(c))


def _libm():
    for name in (ctypes.util.find_library("m"), "libm.so.6", ctypes.util.find_library("c"), "ucrtbase", "msvcrt"):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if hasattr(lib, "expf") and hasattr(lib, "tanhf"):
            return lib
    raise ImportError("no C math library (expf, tanhf, ...) found for the numba kernels")


_LIBM = _libm()


def _cfun(name: str, n_args: int):
    fn = getattr(_LIBM, name)
    fn.restype = ctypes.c_float
    fn.argtypes = (ctypes.c_float,) * n_args
    return fn


expf, tanhf, cosf, sinf, logf = (_cfun(n, 1) for n in ("expf", "tanhf", "cosf", "sinf", "logf"))
powf = _cfun("powf", 2)


# ---------------------------------------------------------------- el_sum16, el_expf

@njit(cache=True, inline="always")
def sum16(v, o):
    """el_sum16 of v[o:o + 16] (float32): _mm512_reduce_add_ps's tree."""
    t0, t1, t2, t3 = v[o + 8] + v[o], v[o + 9] + v[o + 1], v[o + 10] + v[o + 2], v[o + 11] + v[o + 3]
    t4, t5, t6, t7 = v[o + 12] + v[o + 4], v[o + 13] + v[o + 5], v[o + 14] + v[o + 6], v[o + 15] + v[o + 7]
    u0, u1, u2, u3 = t4 + t0, t5 + t1, t6 + t2, t7 + t3
    return (u0 + u2) + (u1 + u3)


_X_R = F32(float.fromhex("0x1.8p23"))
_X_LOG2E = F32(float.fromhex("0x1.715476p+0"))
_X_LN2_HI = F32(float.fromhex("0x1.62e4p-1"))
_X_LN2_LO = F32(float.fromhex("0x1.7f7d1cp-20"))
_X_C5 = F32(float.fromhex("0x1.0e4020p-7"))
_X_C4 = F32(float.fromhex("0x1.573e2ep-5"))
_X_C3 = F32(float.fromhex("0x1.555e66p-3"))
_X_C2 = F32(float.fromhex("0x1.fffdb6p-2"))
_X_C1 = F32(float.fromhex("0x1.ffffecp-1"))


@njit(cache=True, inline="always")
def el_expf(x):
    """ggml_v_expf for one float32 value (el_expf)."""
    n = fmaf(x, _X_LOG2E, _X_R) - _X_R
    if abs(n) > F32(192.0):
        return F32(0.0) if n <= F32(0.0) else F32(np.inf)
    b = fmaf(-n, _X_LN2_LO, fmaf(-n, _X_LN2_HI, x))
    u = b * b
    j = fmaf(fmaf(fmaf(_X_C5, b, _X_C4), u, fmaf(_X_C3, b, _X_C2)), u, fmaf(_X_C1, b, F32(1.0)))
    return F32(math.ldexp(F64(j), int(n)))  # j * 2^n exact in float64, rounded once


# ---------------------------------------------------------------- norms, activations

@njit(cache=True)
def rmsnorm(x, w, eps, y):
    """el_rmsnorm of each row of x [rows, n] into y (may be x); w float32 [n], or empty for none;
    eps float32. The squares' sum in double, the scale in float."""
    rows, n = x.shape
    for r in range(rows):
        ss = 0.0
        for i in range(n):
            ss += F64(x[r, i] * x[r, i])
        scale = F32(1.0) / F32(math.sqrt(F64(F32(ss / n) + eps)))
        if w.size:
            for i in range(n):
                y[r, i] = x[r, i] * scale * w[i]
        else:
            for i in range(n):
                y[r, i] = x[r, i] * scale


@njit(cache=True)
def silu_mul(g, u):
    """g = silu(g) * u elementwise (float32, same shape, 2-D), silu(x) = x / (1 + el_expf(-x))."""
    for r in range(g.shape[0]):
        for i in range(g.shape[1]):
            x = g[r, i]
            g[r, i] = x / (F32(1.0) + el_expf(F32(0.0) - x)) * u[r, i]


@njit(cache=False)
def _gelu_exact(x, out):
    k = F32(0.79788456080286535588)
    for i in range(x.size):
        v = x[i]
        out[i] = F32(0.5) * v * (F32(1.0) + tanhf(k * v * fmaf(F32(0.044715) * v, v, F32(1.0))))


_GELU_TABLE = None


def gelu_table() -> np.ndarray:
    """el_gelu_init's table as floats: GELU (tanh form) of every half, rounded to a half."""
    global _GELU_TABLE
    if _GELU_TABLE is None:
        x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
        g = np.empty_like(x)
        _gelu_exact(x, g)
        with np.errstate(over="ignore", invalid="ignore"):
            _GELU_TABLE = g.astype(np.float16).astype(np.float32)
    return _GELU_TABLE


@njit(cache=True)
def geglu(g, u, table):
    """el_geglu: g = gelu(g) * u (2-D float32; u empty: gelu(g) alone), GELU looked up at g rounded
    to a half; |g| >= 10 passes through (x or 0)."""
    up = u.size > 0
    for r in range(g.shape[0]):
        for i in range(g.shape[1]):
            x = g[r, i]
            y = table[float_to_half(x)]
            if x <= F32(-10.0):
                y = F32(0.0)
            elif x >= F32(10.0):
                y = x
            g[r, i] = y * u[r, i] if up else y


@njit(cache=False)
def softcap(z, cap):
    """engine.c's final soft-cap of logits z (2-D, in place): tanhf(z * (1 / cap)) * cap."""
    uncap = F32(1.0) / cap
    for r in range(z.shape[0]):
        for i in range(z.shape[1]):
            z[r, i] = tanhf(z[r, i] * uncap) * cap


def f16_round(x: np.ndarray) -> np.ndarray:
    """x rounded to halves (to nearest even, as el_float_to_half), as float32."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


# ---------------------------------------------------------------- RoPE

@njit(cache=False)
def _corr_dim(n_dims, n_ctx_orig, beta, base):
    return F32(n_dims) * logf(F32(n_ctx_orig) / (beta * F32(2.0) * F32(math.pi))) / (F32(2.0) * logf(base))


@njit(cache=False)
def rope_cache(n_rot, pos, base, scale, ff, ext, attn_factor, n_ctx_orig, beta_fast, beta_slow, undo_mscale, out):
    """el_rope_cache for each position of pos (float32): out [len(pos), n_rot] holds (cos, sin) of
    rotation pair i at 2i, 2i+1. ff: the frequency factors (float32 [n_rot / 2]) or empty. With
    undo_mscale (a context shift's rotation, attn_factor 1), the YaRN magnitude term divided out
    again, as el_kv_shift does."""
    theta_scale = powf(base, F32(-2.0) / F32(n_rot))
    mscale = attn_factor if attn_factor > F32(0.0) else F32(1.0)
    lo = F32(0.0)
    hi = F32(0.0)
    ms = F32(1.0)
    if ext != F32(0.0):
        lo = F32(math.floor(F64(_corr_dim(n_rot, n_ctx_orig, beta_fast, base))))
        hi = F32(math.ceil(F64(_corr_dim(n_rot, n_ctx_orig, beta_slow, base))))
        lo = F32(0.0) if F32(0.0) > lo else lo
        hi = F32(n_rot - 1) if F32(n_rot - 1) < hi else hi
        ms = fmaf(F32(0.1), logf(F32(1.0) / scale), F32(1.0))
        mscale = mscale * ms
    span = hi - lo
    span = F32(0.001) if F32(0.001) > span else span
    for p in range(pos.size):
        theta = pos[p]
        for i in range(n_rot // 2):
            extrap = theta / ff[i] if ff.size else theta
            t = scale * extrap
            if ext != F32(0.0):
                y = (F32(i) - lo) / span
                y = F32(0.0) if F32(0.0) > y else y
                y = F32(1.0) if F32(1.0) < y else y
                ramp = (F32(1.0) - y) * ext
                t = fmaf(t, F32(1.0) - ramp, extrap * ramp)
            c = cosf(t) * mscale
            s = sinf(t) * mscale
            if undo_mscale and ext != F32(0.0):
                c = c / ms
                s = s / ms
            out[p, 2 * i] = c
            out[p, 2 * i + 1] = s
            theta = theta * theta_scale


@njit(cache=True)
def rope(x, cache, n_rot, neox):
    """el_rope on x [n, heads, head_dim] in place, row m by cache[m]: NORM pairs (2i, 2i+1), NEOX
    pairs (i, i + n_rot / 2); the first product of each result fused."""
    half = n_rot // 2
    for m in range(x.shape[0]):
        for h in range(x.shape[1]):
            for i in range(half):
                c, s = cache[m, 2 * i], cache[m, 2 * i + 1]
                a = i if neox else 2 * i
                b = i + half if neox else 2 * i + 1
                x0, x1 = x[m, h, a], x[m, h, b]
                x[m, h, a] = fmaf(x0, c, -(x1 * s))
                x[m, h, b] = fmaf(x0, s, x1 * c)


# ---------------------------------------------------------------- MoE routing

@njit(cache=False)
def route(logits, n_used, norm, scale, sel, wt):
    """moe.c's route for each row of the router's logits [n, n_expert]: the softmax (exp by
    el_expf 16 at a time, each 16 summed by el_sum16 into a double; the rest by expf; times the
    float 1 / sum), the n_used most probable experts (lowest id on a tie) into sel [n, n_used],
    their probabilities into wt - divided by their (double) sum clamped at 2^-14 when norm, times
    scale unless it is 0 or 1."""
    n, X = logits.shape
    p = np.empty(X, F32)
    taken = np.empty(X, np.bool_)
    for m in range(n):
        mx = F32(-np.inf)
        for e in range(X):
            mx = mx if mx > logits[m, e] else logits[m, e]
        total = 0.0
        e = 0
        while e + 15 < X:
            for j in range(16):
                p[e + j] = el_expf(logits[m, e + j] - mx)
            total += F64(sum16(p, e))
            e += 16
        while e < X:
            p[e] = expf(logits[m, e] - mx)
            total += F64(p[e])
            e += 1
        inv = F32(1.0 / total)
        for e in range(X):
            p[e] = p[e] * inv
            taken[e] = False
        for k in range(n_used):
            best = -1
            for e in range(X):
                if not taken[e] and (best < 0 or p[e] > p[best]):
                    best = e
            taken[best] = True
            sel[m, k] = best
            wt[m, k] = p[best]
        if norm:
            s = 0.0
            for k in range(n_used):
                s += F64(wt[m, k])
            sf = F32(s)
            if not sf >= F32(6.103515625e-5):
                sf = F32(6.103515625e-5)
            for k in range(n_used):
                wt[m, k] = wt[m, k] / sf
        if scale != F32(0.0) and scale != F32(1.0):
            for k in range(n_used):
                wt[m, k] = wt[m, k] * scale


@njit(cache=False)
def sigmoid_gate(g):
    """moe.c's shared-expert gate of each logit in g (in place): silu(x) / x by expf, 1/2 at 0."""
    for i in range(g.size):
        x = g[i]
        g[i] = F32(0.5) if x == F32(0.0) else x / (F32(1.0) + expf(-x)) / x


# ---------------------------------------------------------------- attention (f16 cache)

@njit(cache=True, inline="always")
def _score_tinyblas(hk, q, k, lane):
    """qk_tile's order: lane d % 16 sums its products in order, then el_sum16"""
    for i in range(16):
        lane[i] = F32(0.0)
    for d in range(hk):
        lane[d % 16] = lane[d % 16] + q[d] * k[d]
    return sum16(lane, 0)


@njit(cache=True, inline="always")
def _score_one(hk, q, k, a):
    """qk_tile_one's order (ggml_vec_dot_f16): 64 accumulators over whole 64-dim chunks,
    combined (a0 + a2) + (a1 + a3), el_sum16, the rest added in double"""
    h64 = hk // 64 * 64
    for i in range(64):
        a[i] = F32(0.0)
    for d in range(h64):
        a[d % 64] = a[d % 64] + q[d] * k[d]
    for i in range(16):
        a[i] = (a[i] + a[32 + i]) + (a[16 + i] + a[48 + i])
    s = F64(sum16(a, 0))
    for d in range(h64, hk):
        s += F64(q[d] * k[d])
    return F32(s)


@njit(parallel=True, cache=False)
def attention_f16(q, K, V, pos, qpos, G, scale, cap, swa, n_swa, one, out):
    """csrc/attention.c over one sequence's slots, with an f16 cache: q [n, H, hk] (rounded to
    halves), K [S, KV, hk] and V [S, KV, hv] the slots' keys and values as floats, pos [S] the
    position each holds (-1: none; S a multiple of 16, a tile per 16 slots), qpos [n] the
    queries' positions; out [n, H, hv]. Scores in qk_tile's order (`one`: a one-token llama_order
    step, qk_tile_one's), scaled or soft-capped (tanhf(s * (1 / cap)) * cap * scale), masked;
    exponentials by el_expf with each tile's el_sum16 added in double; weights x * (float)(1 / sum)
    rounded to halves; p.v in 16 slot lanes per dimension over the tiles in order (`one`: four
    sets of lanes by tile index mod 4, combined (s0 + s2) + (s1 + s3)), then el_sum16."""
    n, H, hk = q.shape
    S, hv = K.shape[0], V.shape[2]
    n_tiles = S // 16
    capped = cap > F32(0.0)
    uncap = F32(1.0) / cap if capped else F32(0.0)
    sets = 4 if one else 1
    for job in prange(n * H):
        j, h = job // H, job % H
        kvh, p = h // G, qpos[j]
        sc = np.empty(S, F32)
        scratch = np.empty(64, F32)
        acc = np.zeros((sets, hv, 16), F32)
        lanes = np.empty(16, F32)
        mx = F32(-np.inf)
        for s in range(S):
            ps = pos[s]
            if ps < 0 or ps > p or (swa and p - ps >= n_swa):
                sc[s] = F32(-np.inf)
                continue
            v = _score_one(hk, q[j, h], K[s, kvh], scratch) if one else _score_tinyblas(hk, q[j, h], K[s, kvh], scratch)
            v = tanhf(v * uncap) * cap * scale if capped else v * scale
            sc[s] = v
            mx = v if v > mx else mx
        total = 0.0
        for t in range(n_tiles):
            for u in range(16):
                sc[16 * t + u] = el_expf(sc[16 * t + u] - mx)
            total += F64(sum16(sc, 16 * t))
        inv = F32(1.0 / total) if total > 0.0 else F32(0.0)
        for s in range(S):
            sc[s] = half_to_float(float_to_half(sc[s] * inv))
        for t in range(n_tiles):
            nonzero = False
            for u in range(16):
                nonzero = nonzero or sc[16 * t + u] != F32(0.0)
            if not nonzero:
                continue
            st = t % 4 if one else 0
            for d in range(hv):
                for u in range(16):
                    acc[st, d, u] = acc[st, d, u] + sc[16 * t + u] * V[16 * t + u, kvh, d]
        for d in range(hv):
            if one:
                for u in range(16):
                    lanes[u] = (acc[0, d, u] + acc[2, d, u]) + (acc[1, d, u] + acc[3, d, u])
            else:
                for u in range(16):
                    lanes[u] = acc[0, d, u]
            out[j, h, d] = sum16(lanes, 0)
