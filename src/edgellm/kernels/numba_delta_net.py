"""numba twins of csrc/delta_net.c: qwen35's gated DeltaNet layers (the causal conv and its state,
the gates, the delta rule over each head's state matrix) and the attention output gate, each in the
C routine's order and roundings (so the numba engine computes the C generic path's numbers).

A sequence's recurrent state, per DeltaNet layer, as delta_net.c keeps it in a slot: the conv state
[d_conv - 1][conv_dim] (oldest input first), then the v heads' S [H][S][S], S kept transposed as
ggml keeps it (row j, a v dimension, holds S[j][i] over the k dimensions i).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .numba_ops import F32, F64, el_expf, expf, fmaf, logf, sum16


@njit(cache=True, inline="always")
def _silu(x):
    """delta_net.c's silu (ggml_v_silu): x / (1 + el_expf(-x))."""
    return x / (F32(1.0) + el_expf(-x))


@njit(cache=True)
def dot_f32(n, x, y, acc):
    """delta_net.c's dot_f32 (ggml_vec_dot_f32 on AVX-512 builds): whole 64-value chunks into four
    16-lane fma accumulators (acc: float32 [64] scratch), combined (a0 + a2) + (a1 + a3) and
    reduced by el_sum16; the rest added one by one, each product rounded."""
    whole = n & ~63
    s = F32(0.0)
    if whole:
        for i in range(64):
            acc[i] = F32(0.0)
        for i in range(0, whole, 64):
            for j in range(64):
                acc[j] = fmaf(x[i + j], y[i + j], acc[j])
        for i in range(16):
            acc[i] = (acc[i] + acc[32 + i]) + (acc[16 + i] + acc[48 + i])
        s = sum16(acc, 0)
    for i in range(whole, n):
        s = s + x[i] * y[i]
    return s


@njit(cache=True)
def conv_silu(x, state, w):
    """One sequence's causal conv, then SiLU, in place: x float32 [rows, conv_dim] (the ssm_in
    projection of its rows, in order), state [d_conv - 1, conv_dim] the inputs before them (left
    holding the last d_conv - 1 inputs), w (ssm_conv1d) [conv_dim, d_conv]. Per channel, output t
    sums input t + k times tap k, k = 0, 1, ..., by fmaf from 0 (delta_net.c's conv)."""
    rows, cd = x.shape
    taps = w.shape[1]
    keep = taps - 1
    u = np.empty(keep + rows, F32)  # a channel's inputs: the state's, then the rows'
    for ch in range(cd):
        for t in range(keep):
            u[t] = state[t, ch]
        for t in range(rows):
            u[keep + t] = x[t, ch]
        for t in range(rows):
            s = F32(0.0)
            for k in range(taps):
                s = fmaf(u[t + k], w[ch, k], s)
            x[t, ch] = _silu(s)
        for t in range(keep):
            state[t, ch] = u[rows + t]


@njit(cache=False)
def gates(beta, g, dt, a):
    """In place, per row and v head: beta = sigmoid(beta) (1 / (1 + expf(-beta))), and the decay
    g = softplus(g + dt) * a, softplus(x) = x above 20, else logf(1 + expf(x)) (delta_net.c)."""
    for m in range(beta.shape[0]):
        for h in range(beta.shape[1]):
            beta[m, h] = F32(1.0) / (F32(1.0) + expf(-beta[m, h]))
            x = g[m, h] + dt[h]
            sp = x if x > F32(20.0) else logf(F32(1.0) + expf(x))
            g[m, h] = sp * a[h]


@njit(parallel=True, cache=False)
def delta_rule(qkv, beta, g, states, n_k_heads, out):
    """One sequence's rows in order, its v heads in parallel (delta_net.c's delta rule): per row
    and v head h (q / k head h % n_k_heads), S = expf(g) S; d = (v - S k) beta; S += d k^T (fmaf
    per element); o = S q / sqrt(S). qkv float32 [rows, conv_dim] (q, k: n_k_heads heads each,
    then v), beta / g [rows, H], states [H, S, S] (updated), out [rows, H * S]."""
    H, S = states.shape[0], states.shape[1]
    KD = S * n_k_heads
    scale = F32(1.0) / F32(math.sqrt(F64(S)))
    for h in prange(H):
        hk = h % n_k_heads
        M = states[h]
        acc = np.empty(64, F32)
        dl = np.empty(S, F32)
        for m in range(qkv.shape[0]):
            q = qkv[m, hk * S:(hk + 1) * S]
            k = qkv[m, KD + hk * S:KD + (hk + 1) * S]
            v = qkv[m, 2 * KD + h * S:2 * KD + (h + 1) * S]
            b = beta[m, h]
            eg = expf(g[m, h])
            for j in range(S):
                for i in range(S):
                    M[j, i] = M[j, i] * eg
            for j in range(S):
                dl[j] = (v[j] - dot_f32(S, M[j], k, acc)) * b
            for j in range(S):
                for i in range(S):
                    M[j, i] = fmaf(k[i], dl[j], M[j, i])
            for j in range(S):
                out[m, h * S + j] = dot_f32(S, M[j], q, acc) * scale


@njit(cache=False)
def sigmoid_mul(x, g):
    """el_gate_apply, the attention output gate: x *= 1 / (1 + expf(-g)) elementwise (x, g float32
    of one 2-D shape)."""
    for m in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[m, i] = x[m, i] * (F32(1.0) / (F32(1.0) + expf(-g[m, i])))
