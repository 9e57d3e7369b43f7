"""A plain float64 forward pass (numpy, weights dequantized by gguf-py) for every architecture
edgellm runs: the semantic oracle the engines are checked against on tiny models. It reads only
the model description (models/*: ModelConfig and the tensors bound to its roles), never an
architecture name - so agreeing with llama.cpp on the tiny model of each architecture shows that
description is right. No quantized activations, no f16 KV cache, no rounding tricks: just the math
of llama.cpp's graphs (llama-graph.cpp, src/models/*.cpp) and ggml's RoPE."""

from __future__ import annotations

import math

import numpy as np
from gguf.quants import dequantize

from edgellm import models
from edgellm.gguf_file import GGUFFile
from edgellm.models.base import ACT_GELU_TANH, QK_NORM_ALL, ROPE_NEOX
from edgellm.models.tensors import bind_weights
from edgellm.quants import QType


def _round_q8_0(x: np.ndarray) -> np.ndarray:
    """x with each row's blocks of 32 values rounded as ggml's quantize_row_q8_0 stores them."""
    b = x.reshape(-1, 32)
    d = np.abs(b).max(-1, keepdims=True) / 127.0
    q = np.round(b / np.where(d == 0, 1, d))
    return (q * d.astype(np.float16).astype(np.float64)).reshape(x.shape)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


class ReferenceModel:
    """rounded=True adds llama.cpp's roundings (CPU, no flash attention) as a noise model: activations
    rounded to f16 before products with F16 weights and to Q8_0 blocks before products with quantized
    ones, q, k, v and the softmax weights to f16 in attention. Used only to measure how large those
    roundings' effect is on a model."""

    def __init__(self, path, *, n_ctx: int = 4096, rounded: bool = False):
        self.g = GGUFFile(path)
        self.cfg = models.load_config(self.g)
        self.wt = bind_weights(self.g, self.cfg)
        self.n_ctx = n_ctx  # chooses LongRoPE's factors, as a llama.cpp context of this size
        self.rounded = rounded
        self._w = {}
        self._rounding = {}  # id of a weight's array -> how llama.cpp rounds the activations it multiplies

    def w(self, info):
        """A bound tensor as float64 in numpy order ([rows, row] / [experts, rows, row]); None stays None."""
        if info is None:
            return None
        if info.name not in self._w:
            raw = self.g.tensor_bytes(info.name)
            arr = dequantize(np.asarray(raw).reshape(-1), int(info.qtype))
            self._w[info.name] = np.asarray(arr, dtype=np.float64).reshape(tuple(reversed(info.shape)))
            if info.qtype == QType.F16:
                self._rounding[id(self._w[info.name])] = _f16
            elif info.qtype not in (QType.F32, QType.BF16):
                self._rounding[id(self._w[info.name])] = _round_q8_0
        return self._w[info.name]

    def _act_for(self, x, w):
        """x as llama.cpp multiplies it with w (rounded=True: to f16 for F16 weights, to Q8_0 blocks
        for quantized ones)."""
        fn = self._rounding.get(id(w)) if self.rounded else None
        return x if fn is None else fn(x)

    def _rms(self, x, w):
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + self.cfg.norm_eps)
        return y * w if w is not None else y

    def _rope(self, x, pos, lc, factors):
        """ggml_rope_ext (rope_yarn): x [n, heads, head_dim] at positions pos."""
        cfg = self.cfg
        nr = lc.sizes(cfg)[4]
        half = nr // 2
        ext = cfg.yarn_ext_factor if lc.rope_yarn else 0.0
        mscale = cfg.yarn_attn_factor if lc.rope_yarn else 1.0
        scale = lc.rope_scale
        i = np.arange(half)
        extrap = pos[:, None] * lc.rope_base ** (-2.0 * i / nr)[None]
        if factors is not None:
            extrap = extrap / factors[None]
        theta = scale * extrap
        if ext:
            def corr(beta):
                return nr * math.log(cfg.n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(lc.rope_base))
            lo = max(0.0, math.floor(corr(cfg.yarn_beta_fast)))
            hi = min(nr - 1.0, math.ceil(corr(cfg.yarn_beta_slow)))
            ramp = (1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)) * ext
            theta = theta * (1 - ramp) + extrap * ramp
            mscale *= 1.0 + 0.1 * math.log(1.0 / scale)
        c, s = (np.cos(theta) * mscale)[:, None], (np.sin(theta) * mscale)[:, None]
        x = x.copy()
        if cfg.rope_type == ROPE_NEOX:
            a, b = x[..., :half].copy(), x[..., half:nr].copy()
            x[..., :half], x[..., half:nr] = a * c - b * s, a * s + b * c
        else:
            a, b = x[..., 0:nr:2].copy(), x[..., 1:nr:2].copy()
            x[..., 0:nr:2], x[..., 1:nr:2] = a * c - b * s, a * s + b * c
        return x

    def _act(self, g):
        if self.cfg.act == ACT_GELU_TANH:
            return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
        return g / (1 + np.exp(-g))

    def _lin(self, x, w, b=None):
        y = self._act_for(x, w) @ w.T
        return y if b is None else y + b

    def _ffn(self, h, L):
        W = self.w
        if self.cfg.fused_gate_up:  # ggml_swiglu: SiLU of the first half times the second
            gu = self._lin(h, W(L["w_up"]), W(L["b_up"]))
            F = self.cfg.n_ff
            return self._lin(self._act(gu[:, :F]) * gu[:, F:], W(L["w_down"]), W(L["b_down"]))
        g = self._lin(h, W(L["w_gate"]), W(L["b_gate"]))
        u = self._lin(h, W(L["w_up"]), W(L["b_up"]))
        return self._lin(self._act(g) * u, W(L["w_down"]), W(L["b_down"]))

    def _moe(self, h, L):
        """llama.cpp's build_moe_ffn (softmax gating) plus the shared expert."""
        moe, W = self.cfg.moe, self.w
        logits = self._lin(h, W(L["w_gate_inp"]))              # [n, n_expert]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :moe.n_expert_used]
        wts = np.take_along_axis(probs, top, -1)
        if moe.norm_topk:
            wts = wts / np.maximum(wts.sum(-1, keepdims=True), 6.103515625e-5)
        if moe.weights_scale not in (0.0, 1.0):
            wts = wts * moe.weights_scale
        gate, up, down = W(L["w_gate_exps"]), W(L["w_up_exps"]), W(L["w_down_exps"])
        out = np.zeros_like(h)
        hx = self._act_for(h, up)
        for t in range(h.shape[0]):
            for e, wt in zip(top[t], wts[t]):
                u = up[e] @ hx[t]
                a = self._act(gate[e] @ hx[t]) * u if gate is not None else self._act(u)
                out[t] += wt * (down[e] @ self._act_for(a, down))
        if moe.n_ff_shexp:
            s = self._lin(self._act(self._lin(h, W(L["w_gate_shexp"]))) * self._lin(h, W(L["w_up_shexp"])),
                          W(L["w_down_shexp"]))
            if moe.shexp_gate:
                s = s / (1 + np.exp(-self._lin(h, W(L["w_gate_inp_shexp"])[None]))[:, 0])[:, None]
            out = out + s
        return out

    def logits(self, ids, positions=None) -> np.ndarray:
        """[n, n_vocab] for ids at positions (default 0..n-1), causal over this sequence only."""
        h = self.hidden(ids, positions)
        return np.concatenate([self.head(h[i:i + 64]) for i in range(0, len(h), 64)])

    def head(self, h):
        cfg, W = self.cfg, self.w
        out = self._lin(self._rms(h, W(self.wt.output_norm)), W(self.wt.output), W(self.wt.output_bias))
        out = out * cfg.logit_scale
        if cfg.final_softcap > 0:
            out = cfg.final_softcap * np.tanh(out / cfg.final_softcap)
        return out

    def hidden(self, ids, positions=None) -> np.ndarray:
        """The residual stream after the last layer, [n, n_embd]."""
        cfg, W = self.cfg, self.w
        n = len(ids)
        pos = np.arange(n, dtype=np.float64) if positions is None else np.asarray(positions, dtype=np.float64)
        H = cfg.n_head
        factors = W(self.wt.rope_factors(self.n_ctx, cfg.n_ctx_orig))
        x = W(self.wt.tok_embd)[ids] * cfg.embd_scale
        if cfg.delta_net is not None and not np.array_equal(pos, np.arange(n)):
            raise ValueError("a recurrent model's reference runs one whole sequence from position 0")
        per_layer = self._per_layer_inputs(ids, x) if cfg.n_embd_per_layer else None
        caches = {}  # layer -> its k, v (layers with kv_layer >= 0 attend to another's)
        for il, (lc, L) in enumerate(zip(cfg.layers, self.wt.layers)):
            hd, hv, KV, _, _ = lc.sizes(cfg)
            qd, kd = H * hd, KV * hd
            h = self._rms(x, W(L["attn_norm"])) if L["attn_norm"] is not None else x
            if lc.recurrent:
                x = self._ffn_block(x, self._delta_net(h, L), L)
                continue
            if lc.kv_layer >= 0:
                q = self._lin(h, W(L["wq"]), W(L["bq"]))
            elif L["wqkv"] is not None:
                b = W(L["bqkv"])
                if b is None and L["bq"] is not None:
                    b = np.concatenate([W(L["bq"]), W(L["bk"]), W(L["bv"])])
                qkv = self._lin(h, W(L["wqkv"]), b)
                qw = 2 * qd if cfg.attn_out_gate else qd
                q, k, v = qkv[:, :qw], qkv[:, qw:qw + kd], qkv[:, qw + kd:]
            else:
                q = self._lin(h, W(L["wq"]), W(L["bq"]))
                k = self._lin(h, W(L["wk"]), W(L["bk"]))
                v = self._lin(h, W(L["wv"]), W(L["bv"])) if L["wv"] is not None else k  # (gemma4: v is k)
            if lc.kv_layer >= 0:
                k = v = None
            if cfg.attn_out_gate:  # each head's q, then its output gate
                q, gate = q.reshape(n, H, 2, hd)[:, :, 0].reshape(n, qd), q.reshape(n, H, 2, hd)[:, :, 1]
            if L["attn_q_norm"] is not None and cfg.qk_norm == QK_NORM_ALL:
                q, k = self._rms(q, W(L["attn_q_norm"])), self._rms(k, W(L["attn_k_norm"]))
            q = q.reshape(n, H, hd)
            if k is not None:
                k, v = k.reshape(n, KV, hd), v.reshape(n, KV, hv)
            if L["attn_q_norm"] is not None and cfg.qk_norm != QK_NORM_ALL:
                q = self._rms(q, W(L["attn_q_norm"]))
                k = k if k is None else self._rms(k, W(L["attn_k_norm"]))
            if cfg.v_norm and v is not None:
                v = self._rms(v, None)
            f = factors if lc.rope_freqs else None
            if cfg.n_rot and lc.use_rope:
                q = self._rope(q, pos, lc, f)
                k = k if k is None else self._rope(k, pos, lc, f)
            q = q * cfg.q_scale
            if cfg.attn_temp_scale:
                q = q * (1 + cfg.attn_temp_scale * np.log(np.floor(pos / cfg.attn_temp_floor) + 1))[:, None, None]
            if self.rounded:  # the f16 KV cache; ggml's f16 products round q, then the softmax weights
                q = _f16(q)
                k, v = (k, v) if k is None else (_f16(k), _f16(v))
            if lc.kv_layer >= 0:
                k, v = caches[lc.kv_layer]
            caches[il] = k, v
            k, v = np.repeat(k, H // KV, 1), np.repeat(v, H // KV, 1)
            sc = np.einsum("nhd,mhd->hnm", q, k)
            if cfg.attn_softcap > 0:
                sc = cfg.attn_softcap * np.tanh(sc / cfg.attn_softcap)
            sc = sc * cfg.attn_scale
            mask = pos[None, :] <= pos[:, None]
            if lc.is_swa:
                mask &= (pos[:, None] - pos[None, :]) < cfg.n_swa
            sc = np.where(mask[None], sc, -np.inf)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            if self.rounded:
                sc = _f16(sc)
            o = np.einsum("hnm,mhd->nhd", sc, v)
            if cfg.attn_out_gate:
                o = o / (1 + np.exp(-gate))
            o = self._lin(o.reshape(n, -1), W(L["wo"]), W(L["bo"]))
            x = self._ffn_block(x, o, L)
            if per_layer is not None:  # gemma4's per-layer embedding, gated by the residual stream
                e = self._act(self._lin(x, W(L["ple_gate"]))) * per_layer[:, il]
                x = x + self._rms(self._lin(e, W(L["ple_proj"])), W(L["ple_post_norm"]))
            if L["out_scale"] is not None:
                x = x * W(L["out_scale"])
        return x

    def _per_layer_inputs(self, ids, x0):
        """Gemma 4's per-layer inputs [n, n_layer, n_embd_per_layer]: the token's rows of
        per_layer_token_embd times sqrt(P), plus the RMS-normed projection of the scaled embedding x0
        divided by sqrt(n_embd), all divided by sqrt(2) (llama.cpp's project_per_layer_inputs)."""
        cfg, W, wt = self.cfg, self.w, self.wt
        n, P = len(ids), cfg.n_embd_per_layer
        e = W(wt.ple_embd)[ids].reshape(n, cfg.n_layer, P) * np.sqrt(P)
        proj = self._lin(x0, W(wt.ple_model_proj)).reshape(n, cfg.n_layer, P) / np.sqrt(cfg.n_embd)
        return (self._rms(proj, W(wt.ple_proj_norm)) + e) / np.sqrt(2.0)

    def _ffn_block(self, x, o, L):
        """The rest of a block after its mixer's output o: (post-norm,) residual, FFN, residual."""
        cfg, W = self.cfg, self.w
        if L["attn_post_norm"] is not None:
            o = self._rms(o, W(L["attn_post_norm"]))
        x = x + o * cfg.residual_scale
        h = self._rms(x, W(L["ffn_norm"])) if L["ffn_norm"] is not None else x
        d = self._moe(h, L) if cfg.moe is not None else self._ffn(h, L)
        if L["ffn_post_norm"] is not None:
            d = self._rms(d, W(L["ffn_post_norm"]))
        return x + d * cfg.residual_scale

    def _delta_net(self, h, L):
        """A gated DeltaNet layer over the whole sequence from an empty state (models.base.DeltaNetConfig;
        llama.cpp's delta-net-base.cpp and ggml's ssm_conv / gated_delta_net)."""
        dn, W = self.cfg.delta_net, self.w
        n, S, HK, HV = len(h), dn.d_state, dn.n_k_heads, dn.n_v_heads
        qkv = self._lin(h, W(L["ssm_in"]))                          # [n, conv_dim]
        z = self._lin(h, W(L["ssm_gate"])).reshape(n, HV, S)
        beta = 1 / (1 + np.exp(-self._lin(h, W(L["ssm_beta"]))))   # [n, HV]
        a = self._lin(h, W(L["ssm_alpha"])) + W(L["ssm_dt"])
        g = np.logaddexp(0.0, a) * W(L["ssm_a"])                   # log of the decay: softplus(.) * a
        conv = W(L["ssm_conv1d"])                                   # [conv_dim, d_conv]
        xp = np.concatenate([np.zeros((dn.d_conv - 1, qkv.shape[1])), qkv])
        c = sum(xp[j:j + n] * conv[:, j] for j in range(dn.d_conv))
        c = c / (1 + np.exp(-c))                                    # SiLU
        kd = HK * S
        q, k, v = c[:, :kd].reshape(n, HK, S), c[:, kd:2 * kd].reshape(n, HK, S), c[:, 2 * kd:].reshape(n, HV, S)
        eps = self.cfg.norm_eps
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
        heads = np.arange(HV) % HK                                  # v head h reads q / k head h % HK
        q, k = q[:, heads] / np.sqrt(S), k[:, heads]
        state = np.zeros((HV, S, S))                                # [head, v dim, k dim]
        o = np.empty((n, HV, S))
        for t in range(n):
            state *= np.exp(g[t])[:, None, None]
            delta = (v[t] - np.einsum("hji,hi->hj", state, k[t])) * beta[t][:, None]
            state += delta[:, :, None] * k[t][:, None, :]
            o[t] = np.einsum("hji,hi->hj", state, q[t])
        o = self._rms(o, W(L["ssm_norm"])) * (z / (1 + np.exp(-z)))
        return self._lin(o.reshape(n, HV * S), W(L["ssm_out"]))
