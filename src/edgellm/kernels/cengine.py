"""The C engine (csrc/engine.c) behind a small Python class: one C call per decode step."""

from __future__ import annotations

import numpy as np

from ..errors import ContextOverflowError, EdgeLLMError
from ..models.base import ACT_GELU_TANH, LAYER_TENSORS, ROPE_NEOX, ModelConfig, ModelWeights

ISA_NAMES = ("generic", "avx2", "avx512", "neon")


class CEngine:
    backend = "c"

    def __init__(self, store, cfg: ModelConfig, weights: ModelWeights, *, n_ctx: int, n_batch: int,
                 n_threads: int, lib, ffi):
        self.lib, self.ffi = lib, ffi
        self.store = store  # weights.WeightStore: the bytes must outlive the context
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.n_vocab = cfg.n_vocab
        self._keep = []  # cffi buffers the descriptor points into
        d = ffi.new("el_model_desc *")
        for f in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim_k", "head_dim_v", "n_ff", "n_vocab",
                  "n_rot", "n_swa", "norm_eps", "attn_scale", "q_scale", "embd_scale", "yarn_ext_factor",
                  "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "n_ctx_orig"):
            setattr(d, f, getattr(cfg, f))
        d.attn_softcap = cfg.attn_softcap
        d.final_softcap = cfg.final_softcap
        d.rope_type = lib.EL_ROPE_NEOX if cfg.rope_type == ROPE_NEOX else lib.EL_ROPE_NORM
        d.act = lib.EL_ACT_GELU_TANH if cfg.act == ACT_GELU_TANH else lib.EL_ACT_SILU
        self._fill(d.tok_embd, weights.tok_embd)
        self._fill(d.output, weights.output)
        self._fill(d.output_norm, weights.output_norm)
        self._fill(d.rope_freqs, weights.rope_freqs)
        layers = ffi.new("el_layer[]", cfg.n_layer)
        self._keep.append(layers)
        for i, (lc, lw) in enumerate(zip(cfg.layers, weights.layers)):
            L = layers[i]
            L.is_swa = int(lc.is_swa)
            L.rope_base = lc.rope_base
            L.rope_scale = lc.rope_scale
            for fld in LAYER_TENSORS:
                self._fill(getattr(L, fld), lw[fld])
        d.layers = layers
        ctx = lib.el_ctx_new(d, n_ctx, n_batch, n_threads)
        if ctx == ffi.NULL:
            raise EdgeLLMError(f"cannot create the model context: {ffi.string(lib.el_last_error()).decode()}")
        self._ctx = ffi.gc(ctx, lib.el_ctx_free)
        self._logits_last = np.empty(cfg.n_vocab, dtype=np.float32)

    def _fill(self, t, info) -> None:
        if info is None:
            t.data = self.ffi.NULL
            return
        view = self.store.tensor_bytes(info.name)
        buf = self.ffi.from_buffer(view)
        self._keep.append(buf)
        t.type = int(info.qtype)
        t.data = buf
        t.ne0 = info.shape[0]
        t.ne1 = info.n_elements // info.shape[0]
        t.row_bytes = view.shape[1] if view.ndim == 2 else view.nbytes

    # -- the engine protocol (shared with the numba engine) --

    @property
    def n_past(self) -> int:
        return self.lib.el_kv_next_pos(self._ctx)

    def decode(self, tokens, *, all_logits: bool = False, want_logits: bool = True) -> np.ndarray | None:
        """Logits [n, n_vocab] with all_logits, else [n_vocab] of the last token (a buffer reused
        by the next call), or None without want_logits."""
        toks = np.ascontiguousarray(tokens, dtype=np.int32)
        n = len(toks)
        if n == 0:
            raise ValueError("no tokens to evaluate")
        if self.n_past + n > self.n_ctx:
            raise ContextOverflowError(
                f"{self.n_past + n} tokens do not fit in the context of {self.n_ctx} tokens")
        out = None
        if want_logits:
            out = np.empty((n, self.n_vocab), dtype=np.float32) if all_logits else self._logits_last
        rc = self.lib.el_decode(self._ctx, self.ffi.from_buffer("int32_t[]", toks),
                                n, self.ffi.NULL if out is None else self.ffi.from_buffer("float[]", out),
                                int(all_logits))
        if rc == -2:
            raise ValueError(f"token ids must be in [0, {self.n_vocab})")
        if rc != 0:
            raise ContextOverflowError(f"context of {self.n_ctx} tokens is full")
        return out  # last-token logits: the context's own buffer, valid until the next decode

    def clear(self) -> None:
        self.lib.el_kv_clear(self._ctx)

    def truncate(self, n: int) -> bool:
        """Forget everything from position n on; False when the caller must clear and refeed."""
        return self.lib.el_kv_truncate(self._ctx, n) == 0

    def shift(self, n_keep: int, n_discard: int) -> None:
        rc = self.lib.el_kv_shift(self._ctx, n_keep, n_discard)
        if rc != 0:
            raise EdgeLLMError(f"context shift failed ({rc})")

    def set_threads(self, n: int) -> None:
        if self.lib.el_ctx_set_threads(self._ctx, n) != 0:
            raise EdgeLLMError(f"cannot start {n} threads")

    @property
    def isa(self) -> str:
        """The kernel path this context runs (fixed when it was made)."""
        return ISA_NAMES[self.lib.el_ctx_isa(self._ctx)]
