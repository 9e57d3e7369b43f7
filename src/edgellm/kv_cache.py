"""The KV cache's block manager: which blocks of the engine's KV storage each sequence holds.

The engine (csrc/kv.c, or the numba engine) stores keys and values in blocks of ``BLOCK`` slots,
per layer group: group 0 holds the global-attention layers, group 1 the sliding-window layers.
This module decides which block ids a sequence's slots live in (a block table per group, as
vLLM's PagedAttention), and passes the tables with every batch:

- blocks come from a shared pool, allocated as a sequence grows and returned when it shrinks or
  ends (low ids first, so the touched part of the storage stays as small as what is in use);
  in the sliding-window group a sequence keeps only the blocks its window (plus a margin for
  rollbacks) still needs;
- a block is shared by reference counting: a fork (n > 1 completions of a prompt) shares every
  block, and a write into a shared block first copies it (copy-on-write);
- prefix reuse (SGLang's RadixAttention, vLLM's automatic prefix caching): every full block of a
  cacheable sequence is indexed by the tokens of its whole prefix; a new sequence whose tokens
  start with indexed blocks takes them instead of recomputing them. Blocks nobody holds stay
  indexed until the pool needs them back, least recently used first;
- a model with recurrent layers (models.base.is_recurrent: qwen35's DeltaNet) also keeps a state
  per sequence beside its blocks, in a slot of the engine's: allocated (zeroed) with the sequence,
  copied on fork, zeroed when it is emptied, returned when it ends. That state cannot be cut back:
  such a pool indexes no prefix, and truncating or shifting a sequence to anything but empty
  answers False (the caller clears it and evaluates its tokens again).

Everything here is bookkeeping on small Python objects; the storage itself is the engine's.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .errors import EdgeLLMError
from .quants import QType

BLOCK = 16  # slots per block: csrc/api/engine.h's EL_KV_BLOCK (checked when the C engine loads)
PV_CHUNK = 64  # blocks per chunk of p.v over quantized values: engine.h's EL_PV_CHUNK (checked the same way)
GROUPS = 2  # 0: global-attention layers, 1: sliding-window layers
# Sliding-window blocks a sequence keeps beyond its window, so a rollback of this many tokens
# (speculative decoding's rejected drafts, a regenerated reply) still finds its keys.
SWA_MARGIN = 64


# KV cache types (keys and values separately), by the names llama.cpp's -ctk / -ctv use. A
# quantized type stores each head's row of a slot in its 32-value blocks (head sizes must be
# multiples of 32); f16 is the default and what llama.cpp's reference numbers use.
CACHE_TYPES = {"f16": QType.F16, "q8_0": QType.Q8_0, "q4_0": QType.Q4_0}
DEFAULT_CACHE_TYPE = "f16"


def cache_type(name: str, head_dim: int, what: str) -> QType:
    """The QType of a cache type name, checked against the head size it must store."""
    t = CACHE_TYPES.get(str(name).lower())
    if t is None:
        raise ValueError(f"{what}: unknown KV cache type {name!r} (expected {', '.join(CACHE_TYPES)})")
    if t != QType.F16 and head_dim % 32:
        raise ValueError(f"{what} {name}: the model's head size {head_dim} is not a multiple of 32 (use f16)")
    return t


# A quantized cache stores keys and values rotated by an orthonormal Walsh-Hadamard matrix (as
# llama.cpp does since its build b8400-ish, attn_rot_k / attn_rot_v): the rotation spreads an
# outlier channel over the whole chunk, so the 32-value blocks round every value by a step of the
# chunk's spread, not the outlier's. Queries are rotated with the keys (q.k is unchanged) and the
# attention output is rotated back (the matrix is its own inverse). Keys rotate in chunks of the
# largest power of two (>= 64) dividing the head size, values in chunks of 64.
ROT_MIN = 64


def head_sizes(cfg) -> tuple[int, int]:
    """(keys, values) head size every layer's is a multiple of (gemma4's layers differ): what the
    cache types and the rotation chunks must fit."""
    sizes = [lc.sizes(cfg) for lc in cfg.layers] or [(cfg.head_dim_k, cfg.head_dim_v)]
    return math.gcd(*(s[0] for s in sizes)), math.gcd(*(s[1] for s in sizes))


def kv_rotation(head_dim_k: int, head_dim_v: int, types) -> tuple[int, int]:
    """(keys, values) rotation chunk sizes for cache types (QTypes); 0 = stored as computed (f16,
    or a head size that is not a multiple of 64)."""
    rk = 0
    if types[0] != QType.F16 and head_dim_k % ROT_MIN == 0:
        rk = ROT_MIN
        while head_dim_k % (2 * rk) == 0:
            rk *= 2
    rv = ROT_MIN if types[1] != QType.F16 and head_dim_v % ROT_MIN == 0 else 0
    return rk, rv


def slot_bytes(cfg, types) -> tuple[int, int]:
    """Bytes one slot of a sequence takes in all global-attention layers together and in all
    sliding-window layers, for cache types (keys, values) as QTypes."""
    from .quants import type_info

    out = [0, 0]
    for lc in cfg.layers:
        if lc.kv_layer >= 0:  # reads another layer's cache, holds none
            continue
        hk, hv, n_kv, _, _ = lc.sizes(cfg)
        out[lc.is_swa] += n_kv * (type_info(types[0]).row_bytes(hk) + type_info(types[1]).row_bytes(hv))
    return out[0], out[1]


def read_bytes(cfg, types, n_slots: int) -> int:
    """Bytes of keys and values a query at slot n_slots - 1 reads (sliding-window layers: their
    window only)."""
    g, w = slot_bytes(cfg, types)
    return g * n_slots + w * min(n_slots, cfg.n_swa or n_slots)


class KVCacheFullError(EdgeLLMError):
    """The KV pool has no free block left (every block is held by a live sequence)."""


@dataclass(eq=False)
class _Node:
    """A full block in the prefix index: the tokens of its whole prefix are its key."""

    key: tuple
    block: int                  # group-0 block
    swa_block: int = -1         # group-1 block of the same slots, while it is kept
    parent: "_Node | None" = None
    children: set = field(default_factory=set)
    uid: int = 0


class Sequence:
    """One sequence's share of the cache: slots held, their tokens, a block table per group."""

    def __init__(self, max_blocks: int, cacheable: bool):
        self.n = 0                                      # slots held
        self.tokens: list[int] = []                     # the token in each slot
        self.tables = np.full((GROUPS, max_blocks), -1, dtype=np.int32)
        self.nodes: list[_Node] = []                    # prefix-index nodes of its full blocks, in order
        self.swa_from = 0                               # sliding-window blocks below this are dropped
        self.swa_valid = 0                              # sliding-window slots below this hold nothing
        self.rs = -1                                    # recurrent state slot (recurrent models)
        self.cacheable = cacheable
        self.alive = True

    def __len__(self) -> int:
        return self.n


class _Group:
    """Reference counts, free blocks and evictable (indexed, unheld) blocks of one layer group."""

    def __init__(self):
        self.refs: list[int] = []
        self.free: list[int] = []            # min-heap: low ids first
        self.evictable: OrderedDict = OrderedDict()  # block -> node, least recently used first
        self.owner: dict[int, _Node] = {}    # block -> the index node that names it
        self.written: set[int] = set()       # blocks handed out before (new ones are all zeros)
        self.settled = 0                     # `high` when the engine last settled the group

    @property
    def size(self) -> int:
        return len(self.refs)

    @property
    def high(self) -> int:
        """Blocks handed out so far: low ids first, so they are blocks [0, high)."""
        return len(self.written)

    @property
    def used(self) -> int:
        return self.size - len(self.free) - len(self.evictable)


class KVPool:
    """The block manager over one engine's KV storage (see the module docstring).

    ``limit_blocks``: the most group-0 blocks in use at once (None: grow as needed, as far as
    memory goes). The sliding-window group is bounded by its windows and needs no limit."""

    def __init__(self, engine, *, n_ctx: int, n_swa: int, has_swa: bool, limit_blocks: int | None = None,
                 recurrent: bool = False):
        self.engine = engine
        self.recurrent = recurrent
        self._rs_free: list[int] = []  # recurrent state slots (min-heap) and how many the engine has
        self._rs_size = 0
        self.n_ctx = n_ctx
        self.n_swa = n_swa
        self.has_swa = has_swa
        self.max_blocks = -(-n_ctx // BLOCK) + 1
        self.limit_blocks = limit_blocks
        self.groups = [_Group(), _Group()]
        self.index: dict[tuple, _Node] = {}
        self._uids = itertools.count(1)
        self.hits = 0          # slots taken from the prefix index
        self.cow_copies = 0

    # -- blocks --

    def blocks_in_use(self, g: int = 0) -> int:
        return self.groups[g].used

    def blocks_cached(self, g: int = 0) -> int:
        return len(self.groups[g].evictable)

    def blocks_free(self, g: int = 0) -> int:
        """Blocks a sequence could get now: free, evictable, or not yet made (up to the limit)."""
        grp = self.groups[g]
        if g == 0 and self.limit_blocks is not None:
            return max(0, self.limit_blocks - grp.used)
        return 1 << 30  # grows as far as memory goes

    def _grow(self, g: int, want: int) -> None:
        grp = self.groups[g]
        if g == 0 and self.limit_blocks is not None:
            want = min(want, self.limit_blocks)
        if want <= grp.size:
            return
        got = self.engine.kv_reserve(g, want)
        if got < want:
            raise MemoryError(f"cannot grow the KV cache to {want} blocks of {BLOCK} tokens")
        for b in range(grp.size, got):
            grp.refs.append(0)
            heapq.heappush(grp.free, b)

    def claim(self, blocks: tuple[int, int]) -> None:
        """Take the memory of blocks[g] blocks of each group now (grown and written once), not
        as sequences first write them: a server's memory then stays what it was at startup
        while its prefix cache fills (as llama-server's, whose KV buffer is cleared at start).
        Group 1 may still grow past its claim; group 0 is bounded by limit_blocks anyway."""
        for g in range(GROUPS if self.has_swa else 1):
            grp = self.groups[g]
            before = grp.size
            self._grow(g, blocks[g])
            for b in range(before, grp.size):
                self.engine.kv_clear_block(g, b)  # writes the block: its pages become resident
            if grp.size > before:
                self.engine.kv_settle(g, grp.size)

    def _alloc(self, g: int, *, clear: bool = True) -> int:
        """A block for a sequence to write: zeroed if another sequence wrote it before (the
        slots it has not written yet must hold finite values: el_kv_clear_block), unless the
        caller overwrites it whole (clear=False)."""
        grp = self.groups[g]
        if not grp.free and not grp.evictable:
            self._grow(g, max(grp.size + 1, grp.size * 2 if grp.size else 4 * 64))
        if grp.free:
            b = heapq.heappop(grp.free)
        elif grp.evictable:
            b, node = grp.evictable.popitem(last=False)
            self._forget(g, b)
        else:
            raise KVCacheFullError(f"the KV cache is full ({grp.size} blocks of {BLOCK} tokens in use)")
        grp.refs[b] = 1
        if clear and b in grp.written:
            self.engine.kv_clear_block(g, b)
        grp.written.add(b)
        return b

    def _ref(self, g: int, b: int) -> None:
        grp = self.groups[g]
        if grp.refs[b] == 0:
            grp.evictable.pop(b, None)
        grp.refs[b] += 1

    def _unref(self, g: int, b: int) -> None:
        grp = self.groups[g]
        grp.refs[b] -= 1
        assert grp.refs[b] >= 0, "block released twice"
        if grp.refs[b] == 0:
            if b in grp.owner:
                grp.evictable[b] = grp.owner[b]
            else:
                heapq.heappush(grp.free, b)

    # -- the prefix index --

    def _forget(self, g: int, b: int) -> None:
        """Block b (of group g) stops being named by the index: in group 0 the node and every
        node below it go (their keys run through this block); in group 1 the node keeps its
        global block and loses only its sliding-window copy."""
        grp = self.groups[g]
        node = grp.owner.pop(b, None)
        if node is None:
            return
        if g == 1:
            node.swa_block = -1
            return
        stack = [node]
        while stack:
            nd = stack.pop()
            stack.extend(nd.children)
            self.index.pop(nd.key, None)
            if nd.parent is not None:
                nd.parent.children.discard(nd)
            for gg, blk in ((0, nd.block), (1, nd.swa_block)):
                if blk < 0:
                    continue
                gp = self.groups[gg]
                if gp.owner.get(blk) is nd:
                    del gp.owner[blk]
                    if blk in gp.evictable:
                        del gp.evictable[blk]
                        heapq.heappush(gp.free, blk)

    def _register(self, seq: Sequence, i: int) -> None:
        """Index seq's full block i (its tokens and all before them name it)."""
        parent = seq.nodes[i - 1] if i else None
        key = (parent.uid if parent else 0, tuple(seq.tokens[i * BLOCK:(i + 1) * BLOCK]))
        node = self.index.get(key)
        if node is not None and node.block != int(seq.tables[0, i]):
            seq.nodes.append(node)  # another sequence indexed the same prefix first
            return
        if node is None:
            b = int(seq.tables[0, i])
            if b in self.groups[0].owner:  # cannot happen: a written block is not indexed
                self._forget(0, b)
            node = _Node(key=key, block=b, parent=parent, uid=next(self._uids))
            if parent is not None:
                parent.children.add(node)
            self.index[key] = node
            self.groups[0].owner[b] = node
        sb = int(seq.tables[1, i]) if self.has_swa else -1
        if sb >= 0 and node.swa_block < 0 and sb not in self.groups[1].owner:
            node.swa_block = sb
            self.groups[1].owner[sb] = node
        seq.nodes.append(node)

    def match_prefix(self, seq: Sequence, tokens) -> int:
        """Give an empty cacheable sequence the indexed blocks its tokens start with; returns
        the slots it now holds (a multiple of BLOCK, and less than len(tokens) so the last
        token is always evaluated)."""
        assert seq.n == 0 and seq.cacheable
        chain: list[_Node] = []
        parent = 0
        for i in range((len(tokens) - 1) // BLOCK):
            node = self.index.get((parent, tuple(tokens[i * BLOCK:(i + 1) * BLOCK])))
            if node is None:
                break
            chain.append(node)
            parent = node.uid
        # sliding-window layers need the window before the first new token
        while chain and self.has_swa:
            n = len(chain) * BLOCK
            first = max(0, n - self.n_swa) // BLOCK
            if all(nd.swa_block >= 0 for nd in chain[first:]):
                break
            chain.pop()
        if not chain:
            return 0
        n = len(chain) * BLOCK
        first_swa = max(0, n - self.n_swa) // BLOCK
        for i, nd in enumerate(chain):
            self._ref(0, nd.block)
            seq.tables[0, i] = nd.block
            self._touch(0, nd.block)
            if self.has_swa and i >= first_swa:
                self._ref(1, nd.swa_block)
                seq.tables[1, i] = nd.swa_block
        seq.nodes = list(chain)
        seq.tokens = list(tokens[:n])
        seq.n = n
        seq.swa_from = first_swa
        seq.swa_valid = first_swa * BLOCK
        self.hits += n
        return n

    def _touch(self, g: int, b: int) -> None:
        grp = self.groups[g]
        if b in grp.evictable:
            grp.evictable.move_to_end(b)

    def cached_prefix(self, tokens) -> int:
        """How many of tokens' leading slots the index would give (no side effects)."""
        n, parent = 0, 0
        for i in range((len(tokens) - 1) // BLOCK):
            node = self.index.get((parent, tuple(tokens[i * BLOCK:(i + 1) * BLOCK])))
            if node is None:
                break
            n, parent = n + BLOCK, node.uid
        return n

    # -- sequences --

    def new_sequence(self, *, cacheable: bool = False) -> Sequence:
        seq = Sequence(self.max_blocks, cacheable and not self.recurrent)
        if self.recurrent:
            seq.rs = self._rs_alloc()
        return seq

    def _rs_alloc(self) -> int:
        """A zeroed recurrent state slot."""
        if not self._rs_free:
            want = max(1, 2 * self._rs_size)  # (a slot is the states of every recurrent layer: MBs)
            self.engine.rs_reserve(want)
            for s in range(self._rs_size, want):
                heapq.heappush(self._rs_free, s)
            self._rs_size = want
        slot = heapq.heappop(self._rs_free)
        self.engine.rs_clear(slot)
        return slot

    def blocks_needed(self, seq: Sequence, n_new: int) -> int:
        """Group-0 blocks reserve(seq, n_new) would take from the pool (new ones and copies)."""
        lo, hi = seq.n, seq.n + n_new
        need = -(-hi // BLOCK) - -(-lo // BLOCK)
        if lo % BLOCK and self._must_copy(0, seq, lo // BLOCK):
            need += 1
        return need

    def _must_copy(self, g: int, seq: Sequence, i: int) -> bool:
        b = int(seq.tables[g, i])
        return b >= 0 and self.groups[g].refs[b] > 1

    def reserve(self, seq: Sequence, n_new: int, *, swa_only: set[int] | None = None) -> None:
        """Make slots [seq.n, seq.n + n_new) writable: blocks allocated, a shared or indexed
        partial block copied first. Raises KVCacheFullError (nothing changed) when the pool
        cannot give them. swa_only (restore): the sliding-window group's block indices to
        allocate; the others stay absent (never handed out, so blocks [0, high) stay written)."""
        if seq.n + n_new > self.n_ctx:
            raise KVCacheFullError(f"a sequence holds at most {self.n_ctx} tokens")
        if self.blocks_needed(seq, n_new) > self.blocks_free(0):
            raise KVCacheFullError(f"the KV cache is full ({self.blocks_in_use()} blocks of {BLOCK} tokens in use)")
        lo, hi = seq.n, seq.n + n_new
        groups = (0, 1) if self.has_swa else (0,)
        for g in groups:
            if lo % BLOCK:
                self._own(g, seq, lo // BLOCK)
            for i in range(-(-lo // BLOCK), -(-hi // BLOCK)):
                if seq.tables[g, i] < 0 and (g == 0 or swa_only is None or i in swa_only):
                    seq.tables[g, i] = self._alloc(g)

    def _own(self, g: int, seq: Sequence, i: int) -> None:
        """Seq is about to write into its block i of group g: copy it if it is shared; stop
        indexing it if it is indexed (its contents will change)."""
        b = int(seq.tables[g, i])
        if b < 0:
            seq.tables[g, i] = self._alloc(g)
            return
        grp = self.groups[g]
        if grp.refs[b] > 1:
            nb = self._alloc(g, clear=False)
            self.engine.kv_copy_block(g, b, nb)
            self._unref(g, b)
            seq.tables[g, i] = nb
            self.cow_copies += 1
        elif b in grp.owner:
            self._forget(g, b)
        if g == 0 and i < len(seq.nodes):
            del seq.nodes[i:]

    def commit(self, seq: Sequence, tokens, *, written: bool = True) -> None:
        """The engine wrote len(tokens) slots after seq.n (reserved before); written=False: the
        caller writes them next, and calls settle() then."""
        seq.tokens.extend(tokens)
        seq.n += len(tokens)
        if seq.cacheable:
            for i in range(len(seq.nodes), seq.n // BLOCK):
                self._register(seq, i)
        if self.has_swa:
            self._drop_swa(seq)
        if written:
            self.settle()

    def settle(self) -> None:
        """Blocks are handed out low ids first, so once those handed out are written, blocks
        [0, high) all hold data: the engine may move the memory of the slabs they fill into huge
        pages (kv.c, el_kv_settle; a range it would have to fill with zeros it leaves alone)."""
        for g in range(GROUPS if self.has_swa else 1):
            grp = self.groups[g]
            if grp.high > grp.settled:
                grp.settled = grp.high
                self.engine.kv_settle(g, grp.high)

    def restore(self, seq: Sequence, tokens, held, *, swa_valid: int = 0, cacheable: bool = True) -> None:
        """Make the empty seq hold tokens whose blocks a saved state gives (state.py): blocks
        allocated (the caller then writes each held one into seq.tables[g, i]); sliding-window
        blocks the saved sequence had dropped (not in held[1]) stay absent, and so do the slots
        its window validity says hold nothing. The caller calls settle() once it wrote them."""
        if seq.n:
            raise ValueError("restore needs an empty sequence")
        self.reserve(seq, len(tokens), swa_only=set(held[1]) if self.has_swa else None)
        seq.cacheable = seq.cacheable and cacheable
        self.commit(seq, [int(t) for t in tokens], written=False)
        if self.has_swa:
            seq.swa_valid = max(seq.swa_valid, swa_valid)

    def _drop_swa(self, seq: Sequence) -> None:
        """Release sliding-window blocks no future query of seq can see (beyond the margin)."""
        keep_from = max(0, seq.n - self.n_swa - SWA_MARGIN) // BLOCK
        row = seq.tables[1]
        for i in range(seq.swa_from, keep_from):
            if row[i] >= 0:
                self._unref(1, int(row[i]))
                row[i] = -1
        seq.swa_from = max(seq.swa_from, keep_from)
        seq.swa_valid = max(seq.swa_valid, keep_from * BLOCK)

    def truncate(self, seq: Sequence, n: int) -> bool:
        """Forget slots from n on. False when sliding-window layers no longer hold the window
        before n (the caller must clear the sequence and evaluate it again)."""
        n = max(0, n)
        if n >= seq.n:
            return True
        keep = -(-n // BLOCK)
        for g in range(GROUPS if self.has_swa else 1):
            row = seq.tables[g]
            for i in range(keep, self.max_blocks):
                if row[i] >= 0:
                    self._unref(g, int(row[i]))
                    row[i] = -1
        del seq.nodes[n // BLOCK:]
        del seq.tokens[n:]
        seq.n = n
        if n == 0:
            seq.swa_from = seq.swa_valid = 0
            if seq.rs >= 0:
                self.engine.rs_clear(seq.rs)
        elif self.recurrent:
            return False  # the state holds what the dropped slots added
        return self._window_held(seq)

    def _window_held(self, seq: Sequence) -> bool:
        """Whether the sliding-window layers hold every slot the next query can see."""
        return not self.has_swa or max(0, seq.n - self.n_swa) >= seq.swa_valid

    def clear(self, seq: Sequence) -> None:
        self.truncate(seq, 0)

    def release(self, seq: Sequence) -> None:
        """The sequence ends: its blocks go back (indexed ones stay findable until reused)."""
        if seq.alive:
            self.truncate(seq, 0)
            seq.alive = False
            if seq.rs >= 0:
                heapq.heappush(self._rs_free, seq.rs)
                seq.rs = -1

    def fork(self, seq: Sequence) -> Sequence:
        """A new sequence holding the same slots (every block shared)."""
        child = Sequence(self.max_blocks, seq.cacheable)
        child.tables[:] = seq.tables
        for g in range(GROUPS if self.has_swa else 1):
            for b in seq.tables[g]:
                if b >= 0:
                    self._ref(g, int(b))
        child.n, child.tokens, child.nodes = seq.n, list(seq.tokens), list(seq.nodes)
        child.swa_from, child.swa_valid = seq.swa_from, seq.swa_valid
        if self.recurrent:
            child.rs = self._rs_alloc()
            self.engine.rs_copy(seq.rs, child.rs)
        return child

    def shift(self, seq: Sequence, n_keep: int, n_discard: int) -> bool:
        """Context shift: drop n_discard slots after the first n_keep, slide the rest down.
        False when the sliding-window layers then miss part of the window (kept slots they
        had already dropped come back into view): the caller must clear and evaluate again."""
        n = seq.n
        if n_keep < 0 or n_discard <= 0 or n_keep + n_discard > n:
            raise ValueError(f"cannot shift {n_discard} tokens after {n_keep} of {n}")
        new_n = n - n_discard
        for i in range(n_keep // BLOCK, -(-new_n // BLOCK)):
            self._own(0, seq, i)
        if self.has_swa:
            # a destination block is needed where any of its slots' sources is still held
            src = seq.tables[1]
            for i in range(n_keep // BLOCK, -(-new_n // BLOCK)):
                lo, hi = max(i * BLOCK, n_keep) + n_discard, min((i + 1) * BLOCK, new_n) + n_discard
                if src[lo // BLOCK] >= 0 or src[(hi - 1) // BLOCK] >= 0:
                    self._own(1, seq, i)
        self.engine.kv_shift(seq.tables, n, n_keep, n_discard)
        tokens = seq.tokens[:n_keep] + seq.tokens[n_keep + n_discard:]
        self.truncate(seq, new_n)
        seq.tokens = tokens
        del seq.nodes[n_keep // BLOCK:]
        # the moved slots' keys and values were computed with the dropped tokens in view: they are
        # not what these tokens alone give, so nothing from here on may enter the prefix index
        seq.cacheable = False
        if self.has_swa:
            v = seq.swa_valid  # kept slots stay as they were; moved ones come from v on
            seq.swa_valid = v if v <= n_keep else max(n_keep, v - n_discard)
            seq.swa_from = 0  # the tables moved: look at every block once
            self._drop_swa(seq)
        # a recurrent state saw the dropped tokens: the kept ones must be evaluated again
        return self._window_held(seq) and not self.recurrent

    def check(self) -> None:
        """Consistency of the books (tests): every reference accounted for."""
        for g, grp in enumerate(self.groups):
            free = set(grp.free)
            assert len(free) == len(grp.free), "a block is free twice"
            for b, r in enumerate(grp.refs):
                assert r >= 0
                if r == 0:
                    assert (b in free) != (b in grp.evictable), f"group {g} block {b} lost"
                else:
                    assert b not in free and b not in grp.evictable
            for b in grp.evictable:
                assert grp.owner.get(b) is not None
