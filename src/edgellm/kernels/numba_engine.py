"""The numba engine: the same forward pass and KV-cache semantics as csrc/engine.c (batches of
many sequences over paged KV blocks), in numpy with numba kernels for the quantized matmuls. It
is the path for installs without a C compiler and the reference the C engine is tested against.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..errors import EdgeLLMError
from ..kv_cache import BLOCK, head_sizes, kv_rotation
from ..models.base import ACT_GELU_TANH, QK_NORM_ALL, ROPE_NEOX, ModelConfig, ModelWeights
from ..models.tensors import DELTA_NET_TENSORS, Part, engine_tensors
from ..quants import QType, type_info
from . import BatchArrays, numba_delta_net, numba_float_llama, numba_kv, numba_ops as ops, out_rows as _out_rows
from .numba_quants import SCRATCH_INTS
from .quant_ops import _lname, _numba_module as _module

_MATMULS: dict = {}
_CHUNK = 256  # weight rows per scratch allocation


def _kernels_for(t: QType, llama_order: bool = True):
    """(quantize activation row, matmul) numba functions for weight type t; the legacy types'
    dots in the llama order or in the batch order (numba_quants: one float update per block)."""
    t = QType(t)
    batch = not llama_order and hasattr(_module(t), f"_dot_{_lname(t)}_{_lname(type_info(t).vec_dot_type)}_batch")
    if (t, batch) in _MATMULS:
        return _MATMULS[t, batch]
    act = type_info(t).vec_dot_type
    vec_dot = getattr(_module(t), f"vec_dot_{_lname(t)}_{_lname(act)}_generic")
    # activations: Q8_0 / Q8_1 have their own quantizers (kernels/numba_quants), the rest the reference one
    qname = f"quantize_row_{_lname(act)}" + ("" if act in (QType.Q8_0, QType.Q8_1) else "_ref")
    quant = getattr(_module(act), qname) if act != QType.F32 else None

    dot = getattr(_module(t), f"_dot_{_lname(t)}_{_lname(act)}" + ("_batch" if batch else ""), None)  # takes its scratch
    floats = getattr(_module(t), f"{_lname(t)}_row_floats", None) if act == t else None
    if floats is not None:
        @numba.njit(parallel=True, cache=False)
        def matmul(k, w, a, out):  # float types: each row converted once, then vec_dot's products and sums
            m_rows = a.shape[0]
            af = np.empty((m_rows, k), np.float32)
            for m in range(m_rows):
                floats(k, a[m], af[m])
            n_rows = w.shape[0]
            for c in numba.prange((n_rows + _CHUNK - 1) // _CHUNK):
                wf = np.empty(k, np.float32)
                for r in range(c * _CHUNK, min(n_rows, (c + 1) * _CHUNK)):
                    floats(k, w[r], wf)
                    for m in range(m_rows):
                        total = 0.0
                        for i in range(k):
                            total += float(wf[i] * af[m, i])
                        out[m, r] = np.float32(total)
    elif dot is None:
        @numba.njit(parallel=True, cache=False)
        def matmul(k, w, a, out):  # w uint8 [N, rb]; a uint8 [M, rba]; out float32 [M, N]
            n_rows = w.shape[0]
            for r in numba.prange(n_rows):
                for m in range(a.shape[0]):
                    out[m, r] = vec_dot(k, w[r], a[m])
    else:
        @numba.njit(parallel=True, cache=False)
        def matmul(k, w, a, out):  # the same, scratch allocated once per chunk of rows
            n_rows = w.shape[0]
            for c in numba.prange((n_rows + _CHUNK - 1) // _CHUNK):
                acc = np.zeros(8, np.float32)
                iw = np.zeros(SCRATCH_INTS, np.int64)
                for r in range(c * _CHUNK, min(n_rows, (c + 1) * _CHUNK)):
                    for m in range(a.shape[0]):
                        out[m, r] = dot(k, w[r], a[m], acc, iw)

    _MATMULS[t, batch] = (act, quant, matmul)
    return _MATMULS[t, batch]


def _small_rows(t: QType, m: int) -> int:
    """el_small_rows: how many of a llama_order matmul's m activation rows (from the end) llama.cpp
    takes through its small-batch kernels for weights of type t."""
    if t == QType.Q4_K:
        return m % 4
    if t in (QType.Q3_K, QType.Q5_K, QType.Q6_K, QType.IQ4_XS):
        return m if m < 8 else 0
    return 0


def _small_matmul(t: QType):
    """The matmul of _kernels_for with type t's small-batch dot (vec_dot_<t>_q8_K_small_generic)."""
    t = QType(t)
    if ("small", t) not in _MATMULS:
        vec_dot = getattr(_module(t), f"vec_dot_{_lname(t)}_{_lname(type_info(t).vec_dot_type)}_small_generic")

        @numba.njit(parallel=True, cache=False)
        def matmul(k, w, a, out):
            for r in numba.prange(w.shape[0]):
                for m in range(a.shape[0]):
                    out[m, r] = vec_dot(k, w[r], a[m])

        _MATMULS["small", t] = matmul
    return _MATMULS["small", t]


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
    """A weight (a TensorInfo or a tensors.Part of one) as numba needs it: uint8 rows, type, row length."""

    def __init__(self, gguf, part):
        part = part if isinstance(part, Part) else Part(part)
        info = part.info
        self.qtype = QType(info.qtype)
        self.k = info.shape[0]
        self.rows = part.rows(gguf.tensor_bytes(info.name).reshape(info.n_elements // self.k, -1))

    def floats(self) -> np.ndarray:
        return self.rows.view(np.float32).reshape(-1)

    def expert(self, e: int, n_rows: int) -> "_W":
        """Expert e's matrix of a stacked expert tensor: its n_rows rows, in place."""
        w = object.__new__(_W)
        w.qtype, w.k, w.rows = self.qtype, self.k, self.rows[e * n_rows:(e + 1) * n_rows]
        return w


def _rmsnorm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """el_rmsnorm over the last axis of x (a new array)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x)
    n = x.shape[-1]
    ops.rmsnorm(x.reshape(-1, n), _NO_WEIGHT if w is None else w, np.float32(eps), y.reshape(-1, n))
    return y


_NO_WEIGHT = np.zeros(0, np.float32)
_NO_UP = np.zeros((0, 0), np.float32)  # ops.geglu without its up: GELU alone


def _rope_cache(cfg: ModelConfig, n_rot: int, positions: np.ndarray, base: float, scale: float,
                freq_factors, shift: bool = False) -> np.ndarray:
    """el_rope_cache of each position: [n_pos, n_rot], (cos, sin) of pair i at 2i, 2i + 1. With
    shift, a context shift's rotation (el_kv_shift: no YaRN magnitude term)."""
    out = np.empty((len(positions), n_rot), np.float32)
    ops.rope_cache(n_rot, np.asarray(positions).astype(np.float32), np.float32(base), np.float32(scale),
                   _NO_WEIGHT if freq_factors is None else freq_factors, np.float32(cfg.yarn_ext_factor),
                   np.float32(1.0 if shift else cfg.yarn_attn_factor), int(cfg.n_ctx_orig),
                   np.float32(cfg.yarn_beta_fast), np.float32(cfg.yarn_beta_slow), shift, out)
    return out


def _rope(x: np.ndarray, cache: np.ndarray, n_rot: int, neox: bool) -> np.ndarray:
    """el_rope of x [n, heads, head_dim] (a new array) by cache [n, n_rot] (_rope_cache)."""
    x = np.array(x, dtype=np.float32, order="C")
    ops.rope(x, np.ascontiguousarray(cache), n_rot, neox)
    return x


def _scaled(x, s: float):
    return x if s == 1.0 else x * np.float32(s)


class NumbaEngine:
    """The engine protocol of kernels/cengine.py (KV blocks, batches of many sequences) in numpy.
    KV storage per layer that holds a cache: f16 [n_blocks, n_head_kv, BLOCK, head_dim] in the
    layer's own sizes (or rows of a quantized type's bytes); per group, the position each slot holds."""

    backend = "numba"
    isa = "numba"

    def __init__(self, gguf, cfg: ModelConfig, weights: ModelWeights, *, n_ctx: int, n_batch: int,
                 n_threads: int, cache_types=(QType.F16, QType.F16)):
        self.gguf = gguf
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.n_batch = min(n_batch, n_ctx)
        self._llama_order = True  # set by each decode
        self.trace = None  # debugging: called (name, layer, rows) with each intermediate, as el_set_trace's
        self.n_vocab = cfg.n_vocab
        self.n_swa = cfg.n_swa
        self.set_threads(n_threads)

        def w(info):
            return None if info is None else _W(gguf, info)

        def f32(part):
            return None if part is None else w(part).floats()

        self.tok_embd = w(weights.tok_embd)
        self.output = w(weights.output)
        self.output_norm = f32(weights.output_norm)
        self.output_bias = f32(weights.output_bias)
        self.rope_freqs = f32(weights.rope_factors(n_ctx, cfg.n_ctx_orig))
        # per-layer input embeddings (gemma4; csrc/gemma4.c)
        self.ple_embd = w(weights.ple_embd)
        self.ple_model_proj = w(weights.ple_model_proj)
        self.ple_proj_norm = f32(weights.ple_proj_norm)
        self.layers = []
        for lw in weights.layers:
            L = {k: (f32(v) if k in ("attn_norm", "attn_q_norm", "attn_k_norm", "attn_post_norm",
                                     "ffn_norm", "ffn_post_norm", "bq", "bk", "bv", "bo") else w(v))
                 for k, v in engine_tensors(cfg, lw).items()}
            L.update(out_scale=f32(lw["out_scale"]), ple_gate=w(lw["ple_gate"]), ple_proj=w(lw["ple_proj"]),
                     ple_post_norm=f32(lw["ple_post_norm"]))
            L.update({k: (f32(lw[k]) if k in ("ssm_conv1d", "ssm_dt", "ssm_a", "ssm_norm") else w(lw[k]))
                      for k in DELTA_NET_TENSORS})
            self.layers.append(L)
        self.has_swa = any(lc.is_swa for lc in cfg.layers)
        # each layer's KV group (engine_internal.h's layer_group): 0 global, 1 sliding window, -1 none
        # (a DeltaNet layer keeps a recurrent state instead)
        self.group = [-1 if lc.recurrent else int(lc.is_swa) for lc in cfg.layers]
        self._init_recurrent()
        # each layer's (head_dim_k, head_dim_v, n_head_kv, n_ff, n_rot), and the layer whose cache it
        # reads (its own, or an earlier one's: gemma4's last layers hold none)
        self.sizes = [lc.sizes(cfg) for lc in cfg.layers]
        self.owner = [lc.kv_layer if lc.kv_layer >= 0 else l for l, lc in enumerate(cfg.layers)]
        self.cache_types = tuple(QType(t) for t in cache_types)
        self.rot_k, self.rot_v = kv_rotation(*head_sizes(cfg), self.cache_types)

        def store(t, kv, n):  # f16 values, or rows of the quantized type's bytes
            return np.zeros((0, kv, BLOCK, n), np.float16) if t == QType.F16 else \
                np.zeros((0, kv, BLOCK, numba_kv.row_bytes(t, n)), np.uint8)

        holds = [self.owner[l] == l and self.group[l] >= 0 for l in range(cfg.n_layer)]  # kv.c's holds
        self.k = [store(self.cache_types[0], kv, hk) if holds[l] else None
                  for l, (hk, _, kv, _, _) in enumerate(self.sizes)]
        self.v = [store(self.cache_types[1], kv, hv) if holds[l] else None
                  for l, (_, hv, kv, _, _) in enumerate(self.sizes)]
        self.pos = [np.zeros((0, BLOCK), dtype=np.int32) for _ in range(2)]
        self._out = self._new_out(0)
        self._pending = None  # a deferred step's hidden states of the rows that want logits
        self.batch = BatchArrays(self.n_batch, -(-n_ctx // BLOCK) + 1)

    def _init_recurrent(self) -> None:
        """delta_net.c's dn_state: per slot, each DeltaNet layer's conv state then its v heads' S."""
        dn = self.cfg.delta_net
        rec = [l for l, g in enumerate(self.group) if g < 0]
        self.rec_index = {l: i for i, l in enumerate(rec)}
        self.rs = np.zeros((0, 0), np.float32)  # [slots, floats per slot]
        if not rec:
            return
        self._conv_shape = (dn.d_conv - 1, dn.conv_dim)
        self._s_shape = (dn.n_v_heads, dn.d_state, dn.d_state)
        self._layer_floats = int(np.prod(self._conv_shape)) + int(np.prod(self._s_shape))
        self.rs = np.zeros((0, len(rec) * self._layer_floats), np.float32)

    def _rs_views(self, slot: int, l: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer l's conv state [d_conv - 1, conv_dim] and S [H, S, S] in slot (views)."""
        off = self.rec_index[l] * self._layer_floats
        nc = int(np.prod(self._conv_shape))
        st = self.rs[slot]
        return (st[off:off + nc].reshape(self._conv_shape),
                st[off + nc:off + self._layer_floats].reshape(self._s_shape))

    def _rs_ok(self, *slots: int) -> bool:
        return bool(self.rec_index) and all(0 <= s < len(self.rs) for s in slots)

    def _new_out(self, rows: int) -> np.ndarray:
        """The engine's logits buffer (out_rows), [rows, n_vocab]."""
        return np.empty((rows, self.n_vocab), dtype=np.float32)

    # -- protocol --

    def rs_reserve(self, n_slots: int) -> None:
        """As CEngine.rs_reserve (el_rs_reserve): at least n_slots zeroed recurrent state slots."""
        if not self.rec_index:
            if n_slots > 0:
                raise MemoryError(f"out of memory for {n_slots} recurrent states")
            return
        if n_slots > len(self.rs):
            self.rs = np.concatenate([self.rs, np.zeros((n_slots - len(self.rs), self.rs.shape[1]), np.float32)])

    def rs_clear(self, slot: int) -> None:
        if not self._rs_ok(slot):
            raise EdgeLLMError(f"bad recurrent state slot {slot}")
        self.rs[slot] = 0

    def rs_copy(self, src: int, dst: int) -> None:
        if not self._rs_ok(src, dst):
            raise EdgeLLMError(f"bad recurrent state copy {src} -> {dst}")
        self.rs[dst] = self.rs[src]

    def set_threads(self, n: int, adaptive: bool | None = None) -> None:
        """n threads (numba's own pool: it does not adapt to busy cores)."""
        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))

    def kv_reserve(self, group: int, n_blocks: int) -> int:
        if group == 1 and not self.has_swa:
            return 0
        have = self.pos[group].shape[0]
        if n_blocks > have:
            extra = n_blocks - have
            for l in self._group_layers(group):
                self.k[l] = np.concatenate([self.k[l], np.zeros((extra,) + self.k[l].shape[1:], self.k[l].dtype)])
                self.v[l] = np.concatenate([self.v[l], np.zeros((extra,) + self.v[l].shape[1:], self.v[l].dtype)])
            self.pos[group] = np.concatenate([self.pos[group], np.zeros((extra, BLOCK), np.int32)])
        return self.pos[group].shape[0]

    def kv_settle(self, group: int, n_written: int) -> int:
        """(The C engine moves full slabs into huge pages; numpy arrays stay as they are.)"""
        return 0

    def kv_copy_block(self, group: int, src: int, dst: int) -> None:
        for l in self._group_layers(group):
            self.k[l][dst] = self.k[l][src]
            self.v[l][dst] = self.v[l][src]
        self.pos[group][dst] = self.pos[group][src]

    def kv_clear_block(self, group: int, blk: int) -> None:
        for l in self._group_layers(group):
            self.k[l][blk] = 0
            self.v[l][blk] = 0

    def kv_positions(self, group: int, table: np.ndarray, n: int) -> np.ndarray:
        slots = np.arange(n)
        blk = table[slots // BLOCK]
        return np.where(blk >= 0, self.pos[group][np.maximum(blk, 0), slots % BLOCK], -1).astype(np.int32)

    def _freqs(self, lc):
        """The RoPE frequency factors of a layer (gemma4's window layers take none)."""
        return self.rope_freqs if lc.rope_freqs else None

    def _group_layers(self, group: int) -> list[int]:
        """The layers of the group that hold a cache (kv.c's holds)."""
        return [l for l, g in enumerate(self.group) if g == group and self.owner[l] == l]

    def kv_block_bytes(self, group: int) -> int:
        """As CEngine's: per layer of the group, keys then values as [heads][BLOCK] rows; then
        the positions (the portable layout of csrc/kv.c)."""
        def per_block(a):
            return a.dtype.itemsize * int(np.prod(a.shape[1:]))

        return sum(per_block(self.k[l]) + per_block(self.v[l]) for l in self._group_layers(group)) + 4 * BLOCK

    def kv_read_block(self, group: int, blk: int) -> bytes:
        parts = [p for l in self._group_layers(group) for p in (self.k[l][blk], self.v[l][blk])]
        return b"".join(np.ascontiguousarray(p).tobytes() for p in parts + [self.pos[group][blk]])

    def kv_write_block(self, group: int, blk: int, data: bytes) -> None:
        if len(data) != self.kv_block_bytes(group):
            raise ValueError(f"a KV block holds {self.kv_block_bytes(group)} bytes, not {len(data)}")
        o = 0
        for a in [x for l in self._group_layers(group) for x in (self.k[l], self.v[l])] + [self.pos[group]]:
            n = a[blk].nbytes
            a[blk] = np.frombuffer(data, a.dtype, a[blk].size, o).reshape(a[blk].shape)
            o += n

    def kv_shift(self, tables: np.ndarray, n_slots: int, n_keep: int, n_discard: int) -> None:
        """As el_kv_shift: slots [n_keep + n_discard, n_slots) move down by n_discard, their
        positions drop by as much and their keys are rotated back."""
        cfg = self.cfg
        if n_keep < 0 or n_discard <= 0 or n_keep + n_discard > n_slots:
            raise ValueError("bad context shift")
        dst = np.arange(n_keep, n_slots - n_discard)
        src = dst + n_discard
        for l, (lc, g) in enumerate(zip(cfg.layers, self.group)):
            if self.k[l] is None:  # its keys are another layer's, or it keeps none (DeltaNet)
                continue
            hk, _, _, _, n_rot = self.sizes[l]
            t = tables[g]
            sb, db = t[src // BLOCK], t[dst // BLOCK]
            ok = sb >= 0
            s_idx, d_idx = (sb[ok], src[ok] % BLOCK), (db[ok], dst[ok] % BLOCK)
            k = self.k[l][s_idx[0], :, s_idx[1]].copy()  # [n, heads, hd] (or their quantized rows)
            self.v[l][d_idx[0], :, d_idx[1]] = self.v[l][s_idx[0], :, s_idx[1]].copy()
            if n_rot and lc.use_rope and len(k):  # dequantized, rotated, quantized again
                rc = _rope_cache(cfg, n_rot, np.array([-n_discard]), lc.rope_base, lc.rope_scale,
                                 self._freqs(lc), shift=True)
                k = self._kv_floats(0, k, hk)
                if self.rot_k:  # stored rotated: back, RoPE, and rotated again
                    k = numba_kv.fwht(k, self.rot_k)
                k = _rope(k, np.repeat(rc, len(k), 0), n_rot, cfg.rope_type == ROPE_NEOX)
                if self.rot_k:
                    k = numba_kv.fwht(k, self.rot_k)
                k = self._kv_stored(0, k)
            self.k[l][d_idx[0], :, d_idx[1]] = k
        for g in range(2 if self.has_swa else 1):
            t = tables[g]
            sb, db = t[src // BLOCK], t[dst // BLOCK]
            have = (db >= 0) & (sb >= 0)  # an absent source: the slot is out of every window
            self.pos[g][db[have], dst[have] % BLOCK] = self.pos[g][sb[have], src[have] % BLOCK] - n_discard

    def decode(self, n: int, n_seqs: int, mb: int, *, llama_order: bool = False, out=None, defer: bool = False):
        """As CEngine.decode. llama_order (a batch of one sequence): the C engine's numbers for
        it - llama.cpp's orders of the float and K-quant dot products and of one-token attention;
        else the batch-invariant arithmetic (a row's numbers independent of its company)."""
        self._llama_order = bool(llama_order)
        tokens, pos, seq, want, seq_len, tables = self.batch.views(n, n_seqs, mb)
        tokens, pos, seq, seq_len = (a.astype(np.int64) for a in (tokens, pos, seq, seq_len))
        if not 0 < n <= self.n_batch:
            raise ValueError(f"a batch holds 1 to {self.n_batch} tokens, not {n}")
        if np.any((tokens < 0) | (tokens >= self.n_vocab)):
            raise ValueError(f"token ids must be in [0, {self.n_vocab})")
        rs_slot = self.batch.rs_slot[:n_seqs].astype(np.int64)
        if self.rec_index:  # el_dn_check_batch
            for s in range(n_seqs):
                if not 0 <= rs_slot[s] < len(self.rs):
                    raise EdgeLLMError(f"bad batch: sequence {s}: recurrent state slot {rs_slot[s]} of {len(self.rs)}")
                for t in range(s):
                    if rs_slot[t] == rs_slot[s]:
                        raise EdgeLLMError(f"bad batch: sequences {t} and {s} share recurrent state slot {rs_slot[s]}")
        starts = np.searchsorted(seq, np.arange(len(seq_len)))
        slots = np.empty(n, dtype=np.int64)
        for s in range(len(seq_len)):
            r0, r1 = starts[s], (starts[s + 1] if s + 1 < len(seq_len) else n)
            slots[r0:r1] = seq_len[s] + np.arange(r1 - r0)
            if seq_len[s] + (r1 - r0) > self.n_ctx:
                raise ValueError(f"sequence {s} exceeds the context of {self.n_ctx}")
        for g in range(2 if self.has_swa else 1):
            blk = tables[g][seq, slots // BLOCK]
            if np.any(blk < 0):
                raise ValueError("a row's KV block is missing")
            self.pos[g][blk, slots % BLOCK] = pos
        rows = np.flatnonzero(want)
        self._pending = None
        x = self._forward(tokens, pos, seq, slots, seq_len, tables, starts, rs_slot, len(rows))
        if defer:
            self._pending = x[rows] if len(rows) else None
            return None
        res = _out_rows(self, out, len(rows))
        if len(rows):
            res[:] = self._logits(x[rows])
        return res

    def logits(self, row0: int, n_rows: int, out=None):
        """As CEngine.logits."""
        x = self._pending
        if x is None:
            raise EdgeLLMError("logits: no step's logits are waiting (decode with defer first)")
        if row0 < 0 or n_rows <= 0 or row0 + n_rows > len(x):
            raise EdgeLLMError(f"logits: rows [{row0}, {row0 + n_rows}) are not within the step's {len(x)}")
        if self._llama_order and (row0 or n_rows != len(x)):
            raise EdgeLLMError("logits: a llama_order step makes its logits rows all at once")
        res = _out_rows(self, out, n_rows)
        res[:] = self._logits(x[row0:row0 + n_rows])
        return res

    # -- the forward pass --

    def _matmul(self, w: _W, x: np.ndarray, cols: int | None = None) -> np.ndarray:
        """w . each row of x. In a llama_order step, float weights take llama.cpp's order for
        `cols` columns (default: x's rows; 0 for the experts, whose mul_mat_id takes vec_dot's
        order at any batch size), and Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS take their small-batch dot for the last rows,
        as csrc/engine.c's el_matmul_acts."""
        m = x.shape[0]
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((m, w.rows.shape[0]), dtype=np.float32)
        if self._llama_order and w.qtype in (QType.F16, QType.F32):
            tb = numba_float_llama.tinyblas(w.rows.shape[0], w.k, m if cols is None else cols)
            a = ops.f16_round(x) if w.qtype == QType.F16 else x
            numba_float_llama.gemm(w.qtype == QType.F16, tb)(w.k, w.rows, a, out)
            return out
        act, quant, mm = _kernels_for(w.qtype, self._llama_order)
        if act == QType.F32:
            a = x.view(np.uint8).reshape(m, -1)
        else:
            a = np.empty((m, type_info(act).row_bytes(w.k)), dtype=np.uint8)
            for r in range(m):
                quant(x[r], a[r])
        split = m - _small_rows(w.qtype, m) if self._llama_order else m
        if split:
            mm(w.k, w.rows, a[:split], out[:split])
        if split < m:
            _small_matmul(w.qtype)(w.k, w.rows, a[split:], out[split:])
        return out

    def _forward(self, toks, positions, seq, slots, seq_len, tables, starts, rs_slot, n_out) -> np.ndarray:
        cfg = self.cfg
        n = len(toks)
        E = cfg.n_embd
        trace = self.trace or (lambda *a: None)
        x = _dequant_rows(self.tok_embd.qtype, self.tok_embd.rows[toks], E)
        if cfg.embd_scale != 1.0:
            x = x * np.float32(cfg.embd_scale)
        ple = self._ple_inputs(toks, x) if cfg.n_embd_per_layer else None
        for l, (lc, L) in enumerate(zip(cfg.layers, self.layers)):
            h = _rmsnorm(x, L["attn_norm"], cfg.norm_eps) if L["attn_norm"] is not None else x
            trace("attn_norm", l, h)
            if lc.recurrent:  # a gated DeltaNet layer in place of attention
                o = self._delta_net(l, L, h, starts, rs_slot)
            else:
                o = self._self_attention(l, lc, L, h, positions, seq, slots, seq_len, tables, starts)
            if L["bo"] is not None:
                o += L["bo"]
            if L["attn_post_norm"] is not None:
                o = _rmsnorm(o, L["attn_post_norm"], cfg.norm_eps)
            x = x + _scaled(o, cfg.residual_scale)
            h = _rmsnorm(x, L["ffn_norm"], cfg.norm_eps) if L["ffn_norm"] is not None else x
            trace("ffn_inp", l, x)
            trace("ffn_norm", l, h)
            # llama.cpp's last layer keeps only the rows that want logits before the feed-forward
            # block, so its matmuls see that many columns (their order)
            cols = n_out if self._llama_order and l == cfg.n_layer - 1 and n_out else None
            d = self._moe(L, h, cols) if cfg.moe is not None else \
                self._ffn(L["w_gate"], L["w_up"], L["w_down"], h, cfg.act, cols)
            trace("ffn_out", l, d)
            if L["ffn_post_norm"] is not None:
                d = _rmsnorm(d, L["ffn_post_norm"], cfg.norm_eps)
            x = (x + _scaled(d, cfg.residual_scale)).astype(np.float32)
            if ple is not None or L["out_scale"] is not None:
                x = self._layer_end(L, x, None if ple is None else ple[:, l])
            trace("l_out", l, x)
        return x

    def _self_attention(self, l, lc, L, h, positions, seq, slots, seq_len, tables, starts) -> np.ndarray:
        """Layer l's attention block on its normed input h [n, E]: the output after wo."""
        cfg = self.cfg
        n, H = len(h), cfg.n_head
        trace = self.trace or (lambda *a: None)
        neox = cfg.rope_type == ROPE_NEOX
        g = self.group[l]
        hk, hv, KV, _, n_rot = self.sizes[l]
        own_kv = self.owner[l] == l  # else it attends to an earlier layer's cache
        q = self._matmul(L["wq"], h)
        k = self._matmul(L["wk"], h) if own_kv else None
        v = (self._matmul(L["wv"], h) if L["wv"] is not None else k.copy()) if own_kv else None  # else v = k
        trace("q_mm", l, q)
        if own_kv:
            trace("k_mm", l, k)
            trace("v_mm", l, v)
        for b, t in (("bq", q), ("bk", k), ("bv", v)):
            if L[b] is not None and t is not None:
                t += L[b]
        gate = None
        if cfg.attn_out_gate:  # wq's rows: each head's q then its output gate (el_gate_split)
            qg = q.reshape(n, H, 2, hk)
            q, gate = np.ascontiguousarray(qg[:, :, 0]).reshape(n, H * hk), np.ascontiguousarray(qg[:, :, 1])
        qn_all = cfg.qk_norm == QK_NORM_ALL  # one norm over all heads, else one per head
        if qn_all and L["attn_q_norm"] is not None:
            q = _rmsnorm(q, L["attn_q_norm"], cfg.norm_eps)
        if qn_all and L["attn_k_norm"] is not None and own_kv:
            k = _rmsnorm(k, L["attn_k_norm"], cfg.norm_eps)
        q = q.reshape(n, H, hk)
        if not qn_all and L["attn_q_norm"] is not None:
            q = _rmsnorm(q, L["attn_q_norm"], cfg.norm_eps)
        if own_kv:
            k = k.reshape(n, KV, hk)
            v = v.reshape(n, KV, hv)
            if not qn_all and L["attn_k_norm"] is not None:
                k = _rmsnorm(k, L["attn_k_norm"], cfg.norm_eps)
            if cfg.v_norm:
                v = _rmsnorm(v, None, cfg.norm_eps)
        if n_rot and lc.use_rope:
            rc = _rope_cache(cfg, n_rot, positions, lc.rope_base, lc.rope_scale, self._freqs(lc))
            q = _rope(q, rc, n_rot, neox)
            k = _rope(k, rc, n_rot, neox) if own_kv else None
        if cfg.q_scale != 1.0:
            q = q * np.float32(cfg.q_scale)
        if cfg.attn_temp_scale != 0.0:  # in double (the C library's log), as llama.cpp's input
            fl = np.floor(positions.astype(np.float32) / np.float32(cfg.attn_temp_floor))
            t = [math.log(float(f) + 1.0) * float(np.float32(cfg.attn_temp_scale)) + 1.0 for f in fl]
            q = q * np.array(t, dtype=np.float32)[:, None, None]
        if self.rot_k:
            q = numba_kv.fwht(q, self.rot_k)
        if own_kv:
            if self.rot_k:
                k = numba_kv.fwht(k, self.rot_k)
            if self.rot_v:
                v = numba_kv.fwht(v, self.rot_v)
            blk = tables[g][seq, slots // BLOCK]
            self.k[l][blk, :, slots % BLOCK] = self._kv_stored(0, k)
            self.v[l][blk, :, slots % BLOCK] = self._kv_stored(1, v)
        trace("Qcur", l, q.reshape(n, -1))
        if own_kv:
            trace("Kcur", l, k.reshape(n, -1))
        att = np.empty((n, H, hv), dtype=np.float32)
        for s in range(len(seq_len)):
            r0, r1 = starts[s], (starts[s + 1] if s + 1 < len(seq_len) else n)
            att[r0:r1] = self._attention(l, g, tables[g][s], int(slots[r1 - 1]) + 1, q[r0:r1], positions[r0:r1],
                                         n == 1)
        if self.rot_v:  # the values were stored rotated: rotate their mix back
            att = numba_kv.fwht(att, self.rot_v)
        if gate is not None:  # el_gate_apply
            numba_delta_net.sigmoid_mul(att.reshape(n, -1), gate.reshape(n, -1))
        trace("kqv_out", l, att.reshape(n, -1))
        o = self._matmul(L["wo"], att.reshape(n, H * hv))
        trace("attn_out", l, o)
        return o

    def _delta_net(self, l, L, h, starts, rs_slot) -> np.ndarray:
        """csrc/delta_net.c's el_delta_net: DeltaNet layer l on its normed input h [n, E], each
        sequence's rows continuing the state in its slot (rs_slot); the output after ssm_out."""
        cfg, dn = self.cfg, self.cfg.delta_net
        n, S = len(h), dn.d_state
        KD = S * dn.n_k_heads
        trace = self.trace or (lambda *a: None)
        qkv = self._matmul(L["ssm_in"], h)  # [n, conv_dim]: q, k, v
        z = self._matmul(L["ssm_gate"], h)  # [n, d_inner]
        beta = self._matmul(L["ssm_beta"], h)  # [n, H]
        g = self._matmul(L["ssm_alpha"], h)  # [n, H]
        for name, a in (("linear_attn_qkv_mixed", qkv), ("z", z), ("beta", beta), ("alpha", g)):
            trace(name, l, a)
        bounds = list(zip(starts, list(starts[1:]) + [n]))  # each sequence's rows
        conv_w = L["ssm_conv1d"].reshape(dn.conv_dim, dn.d_conv)
        for s, (r0, r1) in enumerate(bounds):
            numba_delta_net.conv_silu(qkv[r0:r1], self._rs_views(int(rs_slot[s]), l)[0], conv_w)
        trace("conv_output_silu", l, qkv)
        # q and k L2-normed per head: el_rmsnorm with eps / S, times 1 / sqrt(S)
        qk = np.ascontiguousarray(qkv[:, :2 * KD]).reshape(-1, S)
        ops.rmsnorm(qk, _NO_WEIGHT, np.float32(cfg.norm_eps) / np.float32(S), qk)
        qkv[:, :2 * KD] = (qk * (np.float32(1) / np.sqrt(np.float32(S)))).reshape(n, 2 * KD)
        numba_delta_net.gates(beta, g, L["ssm_dt"], L["ssm_a"])
        o = np.empty((n, dn.d_inner), np.float32)
        for s, (r0, r1) in enumerate(bounds):
            numba_delta_net.delta_rule(qkv[r0:r1], beta[r0:r1], g[r0:r1], self._rs_views(int(rs_slot[s]), l)[1],
                                       dn.n_k_heads, o[r0:r1])
        heads = o.reshape(-1, S)  # each head's output RMS-normed (ssm_norm), times SiLU(z)
        ops.rmsnorm(heads, L["ssm_norm"], np.float32(cfg.norm_eps), heads)
        ops.silu_mul(z, o)  # z = silu(z) * o
        for name, a in (("final_output", z), ("gate", g), ("beta_sigmoid", beta)):
            trace(name, l, a)
        return self._matmul(L["ssm_out"], z)

    def _ple_inputs(self, toks: np.ndarray, x0: np.ndarray) -> np.ndarray:
        """el_ple_inputs (csrc/gemma4.c): every layer's per-layer input of each row, [n, n_layer, P],
        from the token's per-layer embedding and the projection of its scaled embedding x0."""
        cfg = self.cfg
        n, P, LP = len(toks), cfg.n_embd_per_layer, cfg.n_layer * cfg.n_embd_per_layer
        proj = self._matmul(self.ple_model_proj, x0)
        e = _dequant_rows(self.ple_embd.qtype, self.ple_embd.rows[toks], LP) * np.sqrt(np.float32(P))
        proj = proj * (np.float32(1.0) / np.sqrt(np.float32(cfg.n_embd)))
        proj = _rmsnorm(proj.reshape(n, cfg.n_layer, P), self.ple_proj_norm, cfg.norm_eps)
        return (proj + e.reshape(n, cfg.n_layer, P)) * (np.float32(1.0) / np.sqrt(np.float32(2.0)))

    def _layer_end(self, L: dict, x: np.ndarray, ple: np.ndarray | None) -> np.ndarray:
        """el_layer_end (csrc/gemma4.c): x plus the layer's per-layer input block (ple: its inputs
        [n, P]), then times the layer's output scale."""
        if ple is not None:
            gt = self._matmul(L["ple_gate"], x)
            ops.geglu(gt, _NO_UP, ops.gelu_table())  # GELU alone
            t = self._matmul(L["ple_proj"], gt * ple)
            x = x + _rmsnorm(t, L["ple_post_norm"], self.cfg.norm_eps)
        if L["out_scale"] is not None:
            x = x * L["out_scale"][0]
        return x.astype(np.float32)

    def _ffn(self, w_gate: _W, w_up: _W, w_down: _W, h: np.ndarray, act: str, cols: int | None) -> np.ndarray:
        gt, u = self._matmul(w_gate, h, cols), self._matmul(w_up, h, cols)
        if act == ACT_GELU_TANH:
            ops.geglu(gt, u, ops.gelu_table())
        else:
            ops.silu_mul(gt, u)
        return self._matmul(w_down, gt, cols)

    def _moe(self, L: dict, h: np.ndarray, cols: int | None) -> np.ndarray:
        """As csrc/moe.c: the router's top experts per token; each chosen expert's gated FFN over
        just its tokens (weights read in place, once per step); the weighted outputs summed in the
        order chosen, then the shared expert's (times its sigmoid gate)."""
        moe = self.cfg.moe
        n = h.shape[0]
        sel = np.empty((n, moe.n_expert_used), np.int64)
        wt = np.empty((n, moe.n_expert_used), np.float32)
        ops.route(self._matmul(L["w_gate_inp"], h, cols), moe.n_expert_used, bool(moe.norm_topk),
                  np.float32(moe.weights_scale), sel, wt)
        F, E = moe.n_ff_exp, self.cfg.n_embd
        o = np.empty(sel.shape + (E,), dtype=np.float32)  # [n, n_used, E] each pair's expert output
        for e in np.unique(sel):
            tok, k = np.nonzero(sel == e)
            o[tok, k] = self._ffn(L["w_gate_exps"].expert(e, F), L["w_up_exps"].expert(e, F),
                                  L["w_down_exps"].expert(e, E), h[tok], "silu", 0)
        out = o[:, 0] * wt[:, :1]
        for k in range(1, sel.shape[1]):
            out = out + o[:, k] * wt[:, k:k + 1]
        if moe.n_ff_shexp:
            s = self._ffn(L["w_gate_shexp"], L["w_up_shexp"], L["w_down_shexp"], h, "silu", cols)
            if moe.shexp_gate:
                g = np.ascontiguousarray(self._matmul(L["w_gate_inp_shexp"], h, cols)[:, 0])
                ops.sigmoid_gate(g)
                s = s * g[:, None]
            out = out + s
        return out.astype(np.float32)

    def _kv_stored(self, which: int, x: np.ndarray) -> np.ndarray:
        """Keys (0) or values (1) [..., head_dim] as the cache stores them."""
        t = self.cache_types[which]
        return x.astype(np.float16) if t == QType.F16 else numba_kv.quantize(t, x)

    def _kv_floats(self, which: int, x: np.ndarray, n: int) -> np.ndarray:
        t = self.cache_types[which]
        return x.astype(np.float32) if t == QType.F16 else numba_kv.dequantize(t, x, n)

    def _attention(self, l: int, g: int, table: np.ndarray, n_slots: int, q: np.ndarray,
                   positions: np.ndarray, one_token: bool) -> np.ndarray:
        """One sequence's queries q [n, H, hk] at positions against its slots [0, n_slots);
        one_token: the step holds one token (a llama_order one takes llama.cpp's vec_dot order)."""
        cfg = self.cfg
        tk, tv = self.cache_types
        _, hv, n_kv, _, _ = self.sizes[l]
        group = cfg.n_head // n_kv
        keys, values = self.k[self.owner[l]], self.v[self.owner[l]]  # the cache the layer reads
        if tk == QType.F16 and tv == QType.F16:  # csrc/attention.c's numbers (numba_ops.attention_f16)
            slots = np.arange(-(-n_slots // BLOCK) * BLOCK)
            blk = table[slots // BLOCK]
            bi, li = np.maximum(blk, 0), slots % BLOCK
            pos = np.where((blk >= 0) & (slots < n_slots), self.pos[g][bi, li], -1)
            out = np.empty(q.shape[:2] + (hv,), np.float32)
            ops.attention_f16(ops.f16_round(q), keys[bi, :, li].astype(np.float32),
                              values[bi, :, li].astype(np.float32), pos.astype(np.int64),
                              np.asarray(positions, np.int64), group,
                              np.float32(cfg.attn_scale), np.float32(cfg.attn_softcap), g == 1, int(cfg.n_swa),
                              self._llama_order and one_token, out)
            return out
        slots = np.arange(n_slots)
        blk = table[slots // BLOCK]
        have = blk >= 0
        bi, li = np.maximum(blk, 0), slots % BLOCK
        pos = np.where(have, self.pos[g][bi, li], -1)
        K = keys[bi, :, li].transpose(1, 0, 2)  # [KV, S, hk] (or [KV, S, row bytes])
        V = values[bi, :, li].transpose(1, 0, 2)
        if tk == QType.F16:  # (with quantized values) q and the weights rounded to f16
            Kh = np.repeat(K.astype(np.float32), group, axis=0)  # [H, S, hk]
            q = q.astype(np.float16).astype(np.float32)
            scores = np.einsum("nhd,hsd->nhs", q, Kh)
        else:  # the type's dot products, queries quantized to q8_0
            scores = np.stack([numba_kv.scores(tk, K[h // group], q[:, h]) for h in range(cfg.n_head)], axis=1)
        scores = scores * np.float32(cfg.attn_scale)
        if cfg.attn_softcap > 0:
            scores = cfg.attn_softcap * np.tanh(scores / cfg.attn_softcap)
        p = positions[:, None]
        visible = (pos[None, :] >= 0) & (pos[None, :] <= p)
        if g == 1:
            visible &= (p - pos[None, :]) < cfg.n_swa
        scores = np.where(visible[:, None, :], scores, -np.inf)
        mx = scores.max(axis=-1, keepdims=True)
        e = np.exp(scores - mx).astype(np.float32)
        inv = (1.0 / e.astype(np.float64).sum(axis=-1, keepdims=True)).astype(np.float32)
        if tv == QType.F16:
            p = (e * inv).astype(np.float16).astype(np.float32)
            Vh = np.repeat(V.astype(np.float32), group, axis=0)
            return np.einsum("nhs,hsd->nhd", p, Vh).astype(np.float32)
        # quantized values: p.v of the exponentials as they are, times 1 / sum at the end (attention.c)
        return np.stack([numba_kv.pv(tv, V[h // group], e[:, h]) for h in range(cfg.n_head)], axis=1) * inv

    def _logits(self, x: np.ndarray) -> np.ndarray:
        h = _rmsnorm(x, self.output_norm, self.cfg.norm_eps)
        out = self._matmul(self.output, h)
        if self.output_bias is not None:
            out = out + self.output_bias
        out = _scaled(out, self.cfg.logit_scale)
        if self.cfg.final_softcap > 0:
            ops.softcap(out, np.float32(self.cfg.final_softcap))
        return out
