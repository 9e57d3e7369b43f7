"""A plain float64 forward pass (numpy, weights dequantized by gguf-py) for llama and gemma3:
the semantic oracle the engines are checked against on tiny models. No quantized activations,
no f16 KV cache, no rounding tricks - just the math of the architectures."""

from __future__ import annotations

import numpy as np
from gguf.quants import dequantize

from edgellm import models
from edgellm.gguf_file import GGUFFile


class ReferenceModel:
    def __init__(self, path):
        self.g = GGUFFile(path)
        self.cfg = models.load_config(self.g)
        self._w = {}

    def w(self, name):
        if name not in self.g.tensors:
            return None
        if name not in self._w:
            info = self.g.tensors[name]
            raw = self.g.tensor_bytes(name)
            arr = dequantize(np.asarray(raw).reshape(-1), int(info.qtype))
            self._w[name] = np.asarray(arr, dtype=np.float64).reshape(tuple(reversed(info.shape)))
        return self._w[name]

    def _rms(self, x, w):
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + self.cfg.norm_eps)
        return y * w if w is not None else y

    def _rope(self, x, pos, base, scale):
        cfg = self.cfg
        nr, half = cfg.n_rot, cfg.n_rot // 2
        inv = base ** (-np.arange(half) * 2.0 / nr)
        ang = (pos * scale)[:, None] * inv[None]
        c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
        x = x.copy()
        if cfg.rope_type == "neox":
            a, b = x[..., :half].copy(), x[..., half:nr].copy()
            x[..., :half], x[..., half:nr] = a * c - b * s, a * s + b * c
        else:
            a, b = x[..., 0:nr:2].copy(), x[..., 1:nr:2].copy()
            x[..., 0:nr:2], x[..., 1:nr:2] = a * c - b * s, a * s + b * c
        return x

    def logits(self, ids, positions=None) -> np.ndarray:
        """[n, n_vocab] for ids at positions (default 0..n-1), causal over this sequence only."""
        cfg = self.cfg
        n = len(ids)
        pos = np.arange(n, dtype=np.float64) if positions is None else np.asarray(positions, dtype=np.float64)
        H, KV, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k
        x = self.w("token_embd.weight")[ids] * cfg.embd_scale
        for i, lc in enumerate(cfg.layers):
            p = f"blk.{i}."
            h = self._rms(x, self.w(p + "attn_norm.weight"))
            q = (h @ self.w(p + "attn_q.weight").T).reshape(n, H, hd)
            k = (h @ self.w(p + "attn_k.weight").T).reshape(n, KV, hd)
            v = (h @ self.w(p + "attn_v.weight").T).reshape(n, KV, cfg.head_dim_v)
            if self.w(p + "attn_q_norm.weight") is not None:
                q = self._rms(q, self.w(p + "attn_q_norm.weight"))
                k = self._rms(k, self.w(p + "attn_k_norm.weight"))
            q = self._rope(q, pos, lc.rope_base, lc.rope_scale)
            k = self._rope(k, pos, lc.rope_base, lc.rope_scale)
            k, v = np.repeat(k, H // KV, 1), np.repeat(v, H // KV, 1)
            sc = np.einsum("nhd,mhd->hnm", q, k) * (cfg.attn_scale * cfg.q_scale)
            mask = pos[None, :] <= pos[:, None]
            if lc.is_swa:
                mask &= (pos[:, None] - pos[None, :]) < cfg.n_swa
            sc = np.where(mask[None], sc, -np.inf)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            o = np.einsum("hnm,mhd->nhd", sc, v).reshape(n, -1) @ self.w(p + "attn_output.weight").T
            if self.w(p + "post_attention_norm.weight") is not None:
                o = self._rms(o, self.w(p + "post_attention_norm.weight"))
            x = x + o
            h = self._rms(x, self.w(p + "ffn_norm.weight"))
            g = h @ self.w(p + "ffn_gate.weight").T
            u = h @ self.w(p + "ffn_up.weight").T
            if cfg.act == "gelu_tanh":
                a = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
            else:
                a = g / (1 + np.exp(-g))
            d = (a * u) @ self.w(p + "ffn_down.weight").T
            if self.w(p + "post_ffw_norm.weight") is not None:
                d = self._rms(d, self.w(p + "post_ffw_norm.weight"))
            x = x + d
        h = self._rms(x, self.w("output_norm.weight"))
        out = self.w("output.weight")
        if out is None:
            out = self.w("token_embd.weight")
        return h @ out.T
