"""The C engine (csrc/engine.c, kv.c) behind a small Python class: one C call per batch."""

from __future__ import annotations

import os

import numpy as np

from ..errors import EdgeLLMError
from ..kv_cache import BLOCK, PV_CHUNK, head_sizes, kv_rotation
from . import BatchArrays, out_rows as _out_rows
from ..models.base import ACT_GELU_TANH, QK_NORM_ALL, ROPE_NEOX, ModelConfig, ModelWeights
from ..models.tensors import DELTA_NET_TENSORS, Part, engine_tensors
from ..quants import QType
from ..weights import huge_pages_wanted

ISA_NAMES = ("generic", "avx2", "avx512", "neon")


class CEngine:
    backend = "c"

    def __init__(self, store, cfg: ModelConfig, weights: ModelWeights, *, n_ctx: int, n_batch: int,
                 n_threads: int, lib, ffi, cache_types=(QType.F16, QType.F16)):
        self.lib, self.ffi = lib, ffi
        if lib.EL_KV_BLOCK != BLOCK:
            raise EdgeLLMError(f"the C kernels use KV blocks of {lib.EL_KV_BLOCK} slots, edgellm {BLOCK}: reinstall")
        if lib.EL_PV_CHUNK != PV_CHUNK:
            raise EdgeLLMError(f"the C kernels sum p.v in chunks of {lib.EL_PV_CHUNK} blocks, edgellm {PV_CHUNK}: "
                               "reinstall")
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
        for f in ("attn_softcap", "final_softcap", "residual_scale", "logit_scale", "attn_temp_scale",
                  "attn_temp_floor"):
            setattr(d, f, getattr(cfg, f))
        d.qk_norm_all = int(cfg.qk_norm == QK_NORM_ALL)
        d.rot_k, d.rot_v = kv_rotation(*head_sizes(cfg), cache_types)
        if cfg.moe is not None:
            m = cfg.moe
            d.n_expert, d.n_expert_used, d.n_ff_exp, d.n_ff_shexp = m.n_expert, m.n_expert_used, m.n_ff_exp, m.n_ff_shexp
            d.moe_norm_w, d.shexp_gate, d.moe_w_scale = int(m.norm_topk), int(m.shexp_gate), m.weights_scale
        d.attn_out_gate = int(cfg.attn_out_gate)
        if cfg.delta_net is not None:
            dn = cfg.delta_net
            d.dn_conv, d.dn_state, d.dn_k_heads, d.dn_v_heads = dn.d_conv, dn.d_state, dn.n_k_heads, dn.n_v_heads
        d.rope_type = lib.EL_ROPE_NEOX if cfg.rope_type == ROPE_NEOX else lib.EL_ROPE_NORM
        d.act = lib.EL_ACT_GELU_TANH if cfg.act == ACT_GELU_TANH else lib.EL_ACT_SILU
        self._fill(d.tok_embd, weights.tok_embd)
        self._fill(d.output, weights.output)
        self._fill(d.output_norm, weights.output_norm)
        self._fill(d.output_bias, weights.output_bias)
        self._fill(d.rope_freqs, weights.rope_factors(n_ctx, cfg.n_ctx_orig))
        d.v_norm, d.n_embd_per_layer = int(cfg.v_norm), cfg.n_embd_per_layer
        for fld in ("ple_embd", "ple_model_proj", "ple_proj_norm"):
            self._fill(getattr(d, fld), getattr(weights, fld))
        layers = ffi.new("el_layer[]", cfg.n_layer)
        self._keep.append(layers)
        for i, (lc, lw) in enumerate(zip(cfg.layers, weights.layers)):
            L = layers[i]
            L.is_swa = int(lc.is_swa)
            L.rope_base = lc.rope_base
            L.rope_scale = lc.rope_scale
            L.use_rope = int(lc.use_rope)
            L.head_dim_k, L.head_dim_v, L.n_head_kv, L.n_ff, L.n_rot = lc.sizes(cfg)
            L.rope_freqs = int(lc.rope_freqs)
            L.kv_share = lc.kv_layer + 1 if lc.kv_layer >= 0 else 0
            L.recurrent = int(lc.recurrent)
            for fld in ("out_scale", "ple_gate", "ple_proj", "ple_post_norm"):
                self._fill(getattr(L, fld), lw[fld])
            for fld, part in engine_tensors(cfg, lw).items():
                self._fill(getattr(L, fld), part)
            for fld in DELTA_NET_TENSORS:
                self._fill(getattr(L, fld), lw[fld])
        d.layers = layers
        self.cache_types = tuple(QType(t) for t in cache_types)
        eng = lib.el_engine_new(d, n_ctx, n_batch, n_threads, int(self.cache_types[0]), int(self.cache_types[1]))
        if eng == ffi.NULL:
            raise EdgeLLMError(f"cannot create the model engine: {ffi.string(lib.el_last_error()).decode()}")
        self._eng = ffi.gc(eng, lib.el_engine_free)
        self.set_threads(n_threads)
        self._huge = huge_pages_wanted()
        self.n_batch = min(n_batch, n_ctx)
        self.has_swa = bool(lib.el_engine_has_swa(eng))
        self.n_swa = cfg.n_swa
        self._out = self._new_out(0)
        self.batch = BatchArrays(self.n_batch, -(-n_ctx // BLOCK) + 1)
        b = self._batch = ffi.new("el_batch *")
        self._batch_bufs = [ffi.from_buffer(t, a) for t, a in (
            ("int32_t[]", self.batch.token), ("int32_t[]", self.batch.pos), ("int32_t[]", self.batch.seq),
            ("int8_t[]", self.batch.want), ("int32_t[]", self.batch.seq_len), ("int32_t[]", self.batch.tables),
            ("int32_t[]", self.batch.rs_slot))]
        b.token, b.pos, b.seq, b.logits, b.seq_len, b.tables, b.rs_slot = self._batch_bufs
        self.recurrent = cfg.delta_net is not None and any(lc.recurrent for lc in cfg.layers)

    def _new_out(self, rows: int) -> np.ndarray:
        """The engine's logits buffer, float32 [>= rows, n_vocab], which is also its step scratch
        (el_engine_set_scratch): a step's logits rows take the memory of the activations the step
        is done with, not memory of their own (16 MB for 16 rows of a 262k vocabulary)."""
        row = 4 * self.n_vocab
        nbytes = max(rows * row, self.lib.el_engine_scratch_bytes(self._eng))
        raw = np.empty(nbytes + 64, np.uint8)
        buf = raw[-raw.ctypes.data % 64:][:nbytes]  # at a multiple of 64 bytes, as the engine wants
        if self.lib.el_engine_set_scratch(self._eng, self.ffi.from_buffer(buf), nbytes) != 0:
            raise EdgeLLMError(f"scratch: {self.ffi.string(self.lib.el_last_error()).decode()}")
        self._scratch = buf  # the engine's from now on
        return buf[:nbytes // row * row].view(np.float32).reshape(-1, self.n_vocab)

    def _fill(self, t, part) -> None:
        """Point t at a tensor (a TensorInfo) or a Part of one (None: absent)."""
        if part is None:
            t.data = self.ffi.NULL
            return
        part = part if isinstance(part, Part) else Part(part)
        info = part.info
        view = part.rows(self.store.tensor_bytes(info.name))
        buf = self.ffi.from_buffer(view)
        self._keep.append(buf)
        t.type = int(info.qtype)
        t.data = buf
        vector = len(info.shape) == 1
        t.ne0 = view.shape[1] // 4 if vector else info.shape[0]
        t.ne1 = 1 if vector else view.shape[0]
        t.row_bytes = view.shape[1]

    # -- the engine protocol (shared with the numba engine) --

    def kv_reserve(self, group: int, n_blocks: int) -> int:
        got = self.lib.el_kv_reserve(self._eng, group, n_blocks)
        if got < 0:
            raise MemoryError(f"out of memory for {n_blocks} KV blocks")
        return got

    def kv_settle(self, group: int, n_written: int) -> int:
        """Blocks [0, n_written) hold data: their full slabs go into 2 MB pages (kv.c). Bytes moved."""
        if not self._huge:
            return 0
        return max(0, int(self.lib.el_kv_settle(self._eng, group, n_written)))

    def kv_copy_block(self, group: int, src: int, dst: int) -> None:
        if self.lib.el_kv_copy_block(self._eng, group, src, dst) != 0:
            raise EdgeLLMError(f"bad KV block copy {src} -> {dst}")

    def kv_clear_block(self, group: int, blk: int) -> None:
        if self.lib.el_kv_clear_block(self._eng, group, blk) != 0:
            raise EdgeLLMError(f"bad KV block {blk}")

    def kv_shift(self, tables: np.ndarray, n_slots: int, n_keep: int, n_discard: int) -> None:
        t = np.ascontiguousarray(tables, dtype=np.int32)
        rc = self.lib.el_kv_shift(self._eng, self.ffi.from_buffer("int32_t[]", t), t.shape[1], n_slots, n_keep,
                                  n_discard)
        if rc != 0:
            raise EdgeLLMError(f"context shift failed ({rc})")

    def rs_reserve(self, n_slots: int) -> None:
        """At least n_slots recurrent state slots (models with DeltaNet layers)."""
        if self.lib.el_rs_reserve(self._eng, n_slots) < n_slots:
            raise MemoryError(f"out of memory for {n_slots} recurrent states")

    def rs_clear(self, slot: int) -> None:
        if self.lib.el_rs_clear(self._eng, slot) != 0:
            raise EdgeLLMError(f"bad recurrent state slot {slot}")

    def rs_copy(self, src: int, dst: int) -> None:
        if self.lib.el_rs_copy(self._eng, src, dst) != 0:
            raise EdgeLLMError(f"bad recurrent state copy {src} -> {dst}")

    def kv_block_bytes(self, group: int) -> int:
        """Bytes of one block of group's keys, values and positions in the portable layout."""
        return int(self.lib.el_kv_block_bytes(self._eng, group))

    def kv_read_block(self, group: int, blk: int) -> bytes:
        out = bytearray(self.kv_block_bytes(group))
        if self.lib.el_kv_read_block(self._eng, group, blk, self.ffi.from_buffer("uint8_t[]", out)) != 0:
            raise EdgeLLMError(f"bad KV block {blk}")
        return bytes(out)

    def kv_write_block(self, group: int, blk: int, data: bytes) -> None:
        if len(data) != self.kv_block_bytes(group):
            raise ValueError(f"a KV block holds {self.kv_block_bytes(group)} bytes, not {len(data)}")
        if self.lib.el_kv_write_block(self._eng, group, blk, self.ffi.from_buffer("uint8_t[]", data)) != 0:
            raise EdgeLLMError(f"bad KV block {blk}")

    def kv_positions(self, group: int, table: np.ndarray, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.int32)
        t = np.ascontiguousarray(table, dtype=np.int32)
        self.lib.el_kv_positions(self._eng, group, self.ffi.from_buffer("int32_t[]", t), n,
                                 self.ffi.from_buffer("int32_t[]", out))
        return out

    def decode(self, n: int, n_seqs: int, mb: int, *, llama_order: bool = False, out=None, defer: bool = False):
        """Evaluate the step held by self.batch.views(n, n_seqs, mb) (see el_batch in
        csrc/api/engine.h). Returns the logits of the rows that want them, float32 [n_out,
        n_vocab]: `out` when given (C-contiguous, at least n_out rows), else the engine's buffer,
        valid until the next call. With defer, returns None and leaves the logits rows to
        `logits`, which makes them a few at a time."""
        b = self._batch
        n_out = int(np.count_nonzero(self.batch.want[:n]))
        b.n_tokens = n
        b.n_seqs = n_seqs
        b.max_blocks = mb
        b.llama_order = int(llama_order)
        if defer or not n_out:
            ptr = self.ffi.NULL
        else:
            out = _out_rows(self, out, n_out)
            ptr = self.ffi.from_buffer("float[]", out)
        rc = self.lib.el_engine_decode(self._eng, b, ptr)
        if rc != 0:
            raise EdgeLLMError(f"bad batch: {self.ffi.string(self.lib.el_last_error()).decode()}")
        return None if defer else _out_rows(self, out, n_out)

    def logits(self, row0: int, n_rows: int, out=None):
        """Logits rows [row0, row0 + n_rows) of the last step, decoded with defer: float32
        [n_rows, n_vocab], into `out` or the engine's buffer (valid until the next call). A row's
        numbers do not depend on which rows are made with it (a llama_order step makes all its
        rows in one call)."""
        out = _out_rows(self, out, n_rows)
        if self.lib.el_engine_logits(self._eng, row0, n_rows, self.ffi.from_buffer("float[]", out)) != 0:
            raise EdgeLLMError(f"logits: {self.ffi.string(self.lib.el_last_error()).decode()}")
        return out

    def set_threads(self, n: int, adaptive: bool | None = None) -> None:
        """n threads; adaptive (default unless EDGELLM_FIXED_THREADS=1): while other programs
        keep the cores busy, steps may run on fewer of them (csrc/pool.c; results do not change)."""
        if adaptive is None:
            adaptive = os.environ.get("EDGELLM_FIXED_THREADS") != "1"
        if self.lib.el_engine_set_threads(self._eng, n, int(adaptive)) != 0:
            raise EdgeLLMError(f"cannot start {n} threads")

    @property
    def thread_stats(self) -> tuple[int, int, int]:
        """(threads the next step uses, steps run, steps that used fewer than asked)."""
        active, runs, reduced = self.ffi.new("int *"), self.ffi.new("long long *"), self.ffi.new("long long *")
        self.lib.el_engine_thread_stats(self._eng, active, runs, reduced)
        return active[0], runs[0], reduced[0]

    def set_ffn_chunk(self, rows: int) -> None:
        """Rows of a batch-order step's FFN evaluated at a time (0: whole steps); the default
        bounds the FFN's activations' memory. Changes no result (tests)."""
        self.lib.el_engine_set_ffn_chunk(self._eng, rows)

    @property
    def attention_split(self) -> int:
        """Bit g set: the last step's attention split group g's keys across threads; bit 2 + g: and
        p.v over quantized values by keys, not value dimensions (tests)."""
        return int(self.lib.el_engine_attention_split(self._eng))

    @property
    def attention_runs(self) -> int:
        """Runs of rows the last step's attention took (jobs: runs x kv heads; tests)."""
        return int(self.lib.el_engine_attention_runs(self._eng))

    @property
    def attention_parts(self) -> int:
        """The most runs of their query heads the last step's whole attention jobs were cut
        into (1: none; fewer jobs than threads; tests)."""
        return int(self.lib.el_engine_attention_parts(self._eng))

    @property
    def isa(self) -> str:
        """The kernel path this engine runs (fixed when it was made)."""
        return ISA_NAMES[self.lib.el_engine_isa(self._eng)]
