"""The numba engine: the same forward pass and KV-cache semantics as csrc/engine.c, in numpy
with numba kernels for the quantized matmuls. It is the path for installs without a C compiler
and the reference the C engine is tested against.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..errors import ContextOverflowError
from ..models.base import ACT_GELU_TANH, ROPE_NEOX, ModelConfig, ModelWeights
from ..quants import QType, type_info
from .quant_ops import _lname, _numba_module as _module

_MATMULS: dict = {}


def _kernels_for(t: QType):
    """(quantize activation row, matmul) numba functions for weight type t."""
    t = QType(t)
    if t in _MATMULS:
        return _MATMULS[t]
    act = type_info(t).vec_dot_type
    vec_dot = getattr(_module(t), f"vec_dot_{_lname(t)}_{_lname(act)}_generic")
    # activations: Q8_0 / Q8_1 have their own quantizers (kernels/numba_quants), the rest the reference one
    qname = f"quantize_row_{_lname(act)}" + ("" if act in (QType.Q8_0, QType.Q8_1) else "_ref")
    quant = getattr(_module(act), qname) if act != QType.F32 else None

    @numba.njit(parallel=True, cache=False)
    def matmul(k, w, a, out):  # w uint8 [N, rb]; a uint8 [M, rba]; out float32 [M, N]
        n_rows = w.shape[0]
        for r in numba.prange(n_rows):
            for m in range(a.shape[0]):
                out[m, r] = vec_dot(k, w[r], a[m])

    _MATMULS[t] = (act, quant, matmul)
    return _MATMULS[t]


def _dequant_rows(t: QType, data: np.ndarray, n: int) -> np.ndarray:
    t = QType(t)
    if t == QType.F32:
        return data.view(np.float32).reshape(-1, n).copy()
    fn = getattr(_module(t), f"dequantize_row_{_lname(t)}")
    out = np.empty((data.shape[0], n), dtype=np.float32)
    for r in range(data.shape[0]):
        fn(data[r], out[r])
    return out


class _W:
    """A weight as numba needs it: uint8 rows, type, row length."""

    def __init__(self, gguf, info):
        self.qtype = QType(info.qtype)
        self.k = info.shape[0]
        self.rows = gguf.tensor_bytes(info.name)
        self.rows = self.rows.reshape(info.n_elements // self.k, -1)

    def floats(self) -> np.ndarray:
        return self.rows.view(np.float32).reshape(-1)


def _rmsnorm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    y = (x * (1.0 / np.sqrt(ms.astype(np.float32) + np.float32(eps)))).astype(np.float32)
    return y * w if w is not None else y


def _rope_cache(cfg: ModelConfig, n_rot: int, positions: np.ndarray, base: float, scale: float,
                freq_factors, mscale_fold: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n_pos, n_rot/2], as el_rope_cache computes them (float32 arithmetic)."""
    half = n_rot // 2
    theta_scale = np.float32(base) ** np.float32(-2.0 / n_rot)
    powers = np.empty(half, dtype=np.float32)
    acc = np.float32(1.0)
    for i in range(half):  # repeated multiplication, as ggml
        powers[i] = acc
        acc = np.float32(acc * theta_scale)
    theta = positions.astype(np.float32)[:, None] * powers[None, :]
    extrap = theta / freq_factors[None, :] if freq_factors is not None else theta
    t = np.float32(scale) * extrap
    mscale = np.float32(cfg.yarn_attn_factor if cfg.yarn_attn_factor > 0 else 1.0)
    if cfg.yarn_ext_factor != 0.0:
        def corr(beta):
            return n_rot * math.log(cfg.n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))
        lo = max(0.0, math.floor(corr(cfg.yarn_beta_fast)))
        hi = min(n_rot - 1.0, math.ceil(corr(cfg.yarn_beta_slow)))
        y = (np.arange(half, dtype=np.float32) - lo) / max(0.001, hi - lo)
        ramp = (1.0 - np.clip(y, 0.0, 1.0)) * cfg.yarn_ext_factor
        t = t * (1.0 - ramp) + extrap * ramp
        if mscale_fold:
            mscale = np.float32(mscale * (1.0 + 0.1 * math.log(1.0 / scale)))
    if not mscale_fold:
        mscale = np.float32(1.0)
    return (np.cos(t) * mscale).astype(np.float32), (np.sin(t) * mscale).astype(np.float32)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool) -> np.ndarray:
    """x [n, heads, head_dim]; cos/sin [n, n_rot/2]."""
    x = x.copy()
    half = n_rot // 2
    if neox:
        a, b = x[..., :half].copy(), x[..., half:n_rot].copy()
        c, s = cos[:, None, :], sin[:, None, :]
        x[..., :half] = a * c - b * s
        x[..., half:n_rot] = a * s + b * c
    else:
        a, b = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
        c, s = cos[:, None, :], sin[:, None, :]
        x[..., 0:n_rot:2] = a * c - b * s
        x[..., 1:n_rot:2] = a * s + b * c
    return x


def _gelu_tanh(x):
    """GELU (tanh form) at half precision, as csrc/ops.c (and ggml) compute it: input rounded to
    f16, result rounded to f16, |x| >= 10 passing through."""
    h = x.astype(np.float16).astype(np.float32)
    g = 0.5 * h * (1.0 + np.tanh(np.float32(0.7978845608028654) * h * (1.0 + np.float32(0.044715) * h * h)))
    g = g.astype(np.float32).astype(np.float16).astype(np.float32)
    return np.where(x <= -10.0, np.float32(0.0), np.where(x >= 10.0, x, g)).astype(np.float32)


def _silu(x):
    return x / (1.0 + np.exp(-x))


class NumbaEngine:
    backend = "numba"
    isa = "numba"

    def __init__(self, gguf, cfg: ModelConfig, weights: ModelWeights, *, n_ctx: int, n_batch: int,
                 n_threads: int):
        self.gguf = gguf
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.n_batch = min(n_batch, n_ctx)
        self.n_vocab = cfg.n_vocab
        self.set_threads(n_threads)

        def w(info):
            return None if info is None else _W(gguf, info)

        def f32(info):
            return None if info is None else gguf.tensor_bytes(info.name).view(np.float32).reshape(-1)

        self.tok_embd = w(weights.tok_embd)
        self.output = w(weights.output)
        self.output_norm = f32(weights.output_norm)
        self.rope_freqs = f32(weights.rope_freqs)
        self.layers = []
        for lw in weights.layers:
            self.layers.append({k: (f32(v) if k in ("attn_norm", "attn_q_norm", "attn_k_norm", "attn_post_norm",
                                                    "ffn_norm", "ffn_post_norm", "bq", "bk", "bv", "bo") else w(v))
                                for k, v in lw.items()})
        any_swa = any(lc.is_swa for lc in cfg.layers)
        self.cap = {False: n_ctx, True: min(n_ctx, cfg.n_swa + self.n_batch) if any_swa else 0}
        self.pos = {s: np.full(c, -1, dtype=np.int64) for s, c in self.cap.items()}
        hk, hv = cfg.head_dim_k, cfg.head_dim_v
        self.k = [np.zeros((cfg.n_head_kv, self.cap[lc.is_swa], hk), dtype=np.float16) for lc in cfg.layers]
        self.v = [np.zeros((cfg.n_head_kv, self.cap[lc.is_swa], hv), dtype=np.float16) for lc in cfg.layers]
        self._n_past = 0

    # -- protocol --

    @property
    def n_past(self) -> int:
        return self._n_past

    def set_threads(self, n: int) -> None:
        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))

    def clear(self) -> None:
        for p in self.pos.values():
            p[:] = -1
        self._n_past = 0

    def truncate(self, n: int) -> bool:
        n = max(0, n)
        if n >= self._n_past:
            return True
        for p in self.pos.values():
            p[p >= n] = -1
        self._n_past = n
        if self.cap[True]:
            cap = self.cap[True]
            for q in range(max(0, n - self.cfg.n_swa + 1), n):
                if self.pos[True][q % cap] != q:
                    return False
        return True

    def shift(self, n_keep: int, n_discard: int) -> None:
        cfg = self.cfg
        n_used = self._n_past
        if n_keep < 0 or n_discard <= 0 or n_keep + n_discard > n_used:
            raise ValueError("bad context shift")
        for l, lc in enumerate(cfg.layers):
            cos, sin = _rope_cache(cfg, cfg.n_rot, np.array([-n_discard]), lc.rope_base, lc.rope_scale,
                                   self.rope_freqs, mscale_fold=False)
            if not lc.is_swa:
                src = slice(n_keep + n_discard, n_used)
                dst = slice(n_keep, n_used - n_discard)
                self.k[l][:, dst] = self.k[l][:, src].copy()
                self.v[l][:, dst] = self.v[l][:, src].copy()
                moved = np.arange(n_keep, n_used - n_discard)
            else:
                cap = self.cap[True]
                pos = self.pos[True]
                k2, v2 = self.k[l].copy(), self.v[l].copy()
                moved = []
                for s in range(cap):
                    if pos[s] >= n_keep + n_discard:
                        ns = (pos[s] - n_discard) % cap
                        self.k[l][:, ns] = k2[:, s]
                        self.v[l][:, ns] = v2[:, s]
                        moved.append(ns)
                moved = np.array(moved, dtype=np.int64)
            if cfg.n_rot and len(moved):
                kk = self.k[l][:, moved].astype(np.float32).transpose(1, 0, 2)  # [n, heads, hd]
                kk = _rope(kk, np.repeat(cos, len(moved), 0), np.repeat(sin, len(moved), 0), cfg.n_rot,
                           cfg.rope_type == ROPE_NEOX)
                self.k[l][:, moved] = kk.transpose(1, 0, 2).astype(np.float16)
        g = self.pos[False]
        g[:] = -1
        g[:n_used - n_discard] = np.arange(n_used - n_discard)
        if self.cap[True]:
            cap = self.cap[True]
            old = self.pos[True].copy()
            new = np.full(cap, -1, dtype=np.int64)
            for s in range(cap):
                ps = old[s]
                if 0 <= ps < n_keep:
                    new[s] = ps
                elif ps >= n_keep + n_discard:
                    new[(ps - n_discard) % cap] = ps - n_discard
            self.pos[True][:] = new
        self._n_past = n_used - n_discard

    def decode(self, tokens, *, all_logits: bool = False, want_logits: bool = True):
        toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = len(toks)
        if n == 0:
            raise ValueError("no tokens to evaluate")
        if np.any((toks < 0) | (toks >= self.n_vocab)):
            raise ValueError(f"token ids must be in [0, {self.n_vocab})")
        if self._n_past + n > self.n_ctx:
            raise ContextOverflowError(f"{self._n_past + n} tokens do not fit in the context of {self.n_ctx} tokens")
        outs = []
        for i in range(0, n, self.n_batch):
            chunk = toks[i:i + self.n_batch]
            last = i + self.n_batch >= n
            x = self._forward(chunk)
            if want_logits and (all_logits or last):
                rows = x if all_logits else x[-1:]
                outs.append(self._logits(rows))
        if not want_logits:
            return None
        out = np.concatenate(outs, axis=0)
        return out if all_logits else out[-1].copy()

    # -- the forward pass --

    def _matmul(self, w: _W, x: np.ndarray) -> np.ndarray:
        act, quant, mm = _kernels_for(w.qtype)
        m = x.shape[0]
        x = np.ascontiguousarray(x, dtype=np.float32)
        if act == QType.F32:
            a = x.view(np.uint8).reshape(m, -1)
        else:
            a = np.empty((m, type_info(act).row_bytes(w.k)), dtype=np.uint8)
            for r in range(m):
                quant(x[r], a[r])
        out = np.empty((m, w.rows.shape[0]), dtype=np.float32)
        mm(w.k, w.rows, a, out)
        return out

    def _forward(self, toks: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        n = len(toks)
        pos0 = self._n_past
        positions = np.arange(pos0, pos0 + n)
        for s, cap in self.cap.items():
            if cap:
                self.pos[s][positions if not s else positions % cap] = positions
        E, H, KV = cfg.n_embd, cfg.n_head, cfg.n_head_kv
        hk, hv = cfg.head_dim_k, cfg.head_dim_v
        x = _dequant_rows(self.tok_embd.qtype, self.tok_embd.rows[toks], E)
        if cfg.embd_scale != 1.0:
            x = x * np.float32(cfg.embd_scale)
        neox = cfg.rope_type == ROPE_NEOX
        for l, (lc, L) in enumerate(zip(cfg.layers, self.layers)):
            h = _rmsnorm(x, L["attn_norm"], cfg.norm_eps)
            q, k, v = self._matmul(L["wq"], h), self._matmul(L["wk"], h), self._matmul(L["wv"], h)
            for b, t in (("bq", q), ("bk", k), ("bv", v)):
                if L[b] is not None:
                    t += L[b]
            q = q.reshape(n, H, hk)
            k = k.reshape(n, KV, hk)
            v = v.reshape(n, KV, hv)
            if L["attn_q_norm"] is not None:
                q = _rmsnorm(q, L["attn_q_norm"], cfg.norm_eps)
            if L["attn_k_norm"] is not None:
                k = _rmsnorm(k, L["attn_k_norm"], cfg.norm_eps)
            if cfg.n_rot:
                cos, sin = _rope_cache(cfg, cfg.n_rot, positions, lc.rope_base, lc.rope_scale, self.rope_freqs)
                q = _rope(q, cos, sin, cfg.n_rot, neox)
                k = _rope(k, cos, sin, cfg.n_rot, neox)
            if cfg.q_scale != 1.0:
                q = q * np.float32(cfg.q_scale)
            cap = self.cap[lc.is_swa]
            slots = positions % cap if lc.is_swa else positions
            self.k[l][:, slots] = k.transpose(1, 0, 2).astype(np.float16)
            self.v[l][:, slots] = v.transpose(1, 0, 2).astype(np.float16)
            att = self._attention(l, lc.is_swa, q, positions)
            o = self._matmul(L["wo"], att.reshape(n, H * hv))
            if L["bo"] is not None:
                o += L["bo"]
            if L["attn_post_norm"] is not None:
                o = _rmsnorm(o, L["attn_post_norm"], cfg.norm_eps)
            x = x + o
            h = _rmsnorm(x, L["ffn_norm"], cfg.norm_eps)
            g, u = self._matmul(L["w_gate"], h), self._matmul(L["w_up"], h)
            g = (_gelu_tanh(g) if cfg.act == ACT_GELU_TANH else _silu(g)) * u
            d = self._matmul(L["w_down"], g.astype(np.float32))
            if L["ffn_post_norm"] is not None:
                d = _rmsnorm(d, L["ffn_post_norm"], cfg.norm_eps)
            x = (x + d).astype(np.float32)
        self._n_past += n
        return x

    def _attention(self, l: int, is_swa: bool, q: np.ndarray, positions: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        n_slots = self.cap[True] if is_swa else int(positions[-1]) + 1
        pos = self.pos[is_swa][:n_slots]
        K = self.k[l][:, :n_slots].astype(np.float32)  # [KV, S, hk]
        V = self.v[l][:, :n_slots].astype(np.float32)
        group = cfg.n_head // cfg.n_head_kv
        Kh = np.repeat(K, group, axis=0)  # [H, S, hk]
        Vh = np.repeat(V, group, axis=0)
        # q and the softmax weights are rounded to f16, as in csrc/engine.c's attention()
        q = q.astype(np.float16).astype(np.float32)
        scores = np.einsum("nhd,hsd->nhs", q, Kh) * np.float32(cfg.attn_scale)
        if cfg.attn_softcap > 0:
            scores = cfg.attn_softcap * np.tanh(scores / cfg.attn_softcap)
        p = positions[:, None]
        visible = (pos[None, :] >= 0) & (pos[None, :] <= p)
        if is_swa:
            visible &= (p - pos[None, :]) < cfg.n_swa
        scores = np.where(visible[:, None, :], scores, -np.inf)
        mx = scores.max(axis=-1, keepdims=True)
        e = np.exp(scores - mx).astype(np.float32)
        inv = (1.0 / e.astype(np.float64).sum(axis=-1, keepdims=True)).astype(np.float32)
        p = (e * inv).astype(np.float16).astype(np.float32)
        return np.einsum("nhs,hsd->nhd", p, Vh).astype(np.float32)

    def _logits(self, x: np.ndarray) -> np.ndarray:
        h = _rmsnorm(x, self.output_norm, self.cfg.norm_eps)
        out = self._matmul(self.output, h)
        if self.cfg.final_softcap > 0:
            c = np.float32(self.cfg.final_softcap)
            out = c * np.tanh(out / c)
        return out.astype(np.float32)
