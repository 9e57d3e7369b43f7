"""The KV block manager (kv_cache.KVPool) against a storage model: a fake engine that stores the
token each slot was written with, so every sequence can be read back through its block tables
after random forks, prefix matches, truncations, shifts and releases. Checks that writes only
ever land in blocks the writing sequence owns alone (copy-on-write), that every sequence reads
back exactly its tokens (within its window for sliding-window layers), and that the books
balance."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edgellm.batch import LOGITS_NONE, Step
from edgellm.kernels import BatchArrays
from edgellm.kv_cache import BLOCK, SWA_MARGIN, KVCacheFullError, KVPool


class FakeEngine:
    """Stores, per group and block, the token and position of every slot."""

    def __init__(self, n_ctx, n_batch, has_swa):
        self.has_swa = has_swa
        self.batch = BatchArrays(n_batch, -(-n_ctx // BLOCK) + 1)
        self.store = [{}, {}]
        self.n_blocks = [0, 0]
        self.pool = None  # set after the pool exists (to check ownership of written blocks)
        self.settled = [0, 0]

    def kv_reserve(self, g, n):
        self.n_blocks[g] = max(self.n_blocks[g], n)
        return self.n_blocks[g]

    def _writable(self, g, b):
        assert 0 <= b < self.n_blocks[g]
        assert self.pool.groups[g].refs[b] == 1, f"write into group {g} block {b} held {self.pool.groups[g].refs[b]}x"
        assert b not in self.pool.groups[g].owner, f"write into indexed group {g} block {b}"
        return self.store[g].setdefault(b, [None] * BLOCK)

    def kv_copy_block(self, g, src, dst):
        assert self.pool.groups[g].refs[dst] == 1
        self.store[g][dst] = list(self.store[g].get(src, [None] * BLOCK))

    def kv_clear_block(self, g, b):
        assert self.pool.groups[g].refs[b] == 1, "cleared a block someone else holds"
        self.store[g][b] = [None] * BLOCK

    def kv_settle(self, g, n):
        """The pool says blocks [0, n) hold data (the C engine then moves their full slabs into
        huge pages): each must have been written."""
        unwritten = [b for b in range(n) if b not in self.store[g]]
        assert not unwritten, f"group {g}: settled up to {n}, but blocks {unwritten[:5]} were never written"
        self.settled[g] = max(self.settled[g], n)

    def kv_shift(self, tables, n, n_keep, n_discard):
        for g in range(2 if self.has_swa else 1):
            t = tables[g]
            for s in range(n_keep, n - n_discard):
                src, dst = t[(s + n_discard) // BLOCK], t[s // BLOCK]
                if src < 0:
                    assert g == 1
                    continue
                val = self.store[g][src][(s + n_discard) % BLOCK]
                self._writable(g, dst)[s % BLOCK] = val

    def decode(self, n, n_seqs, mb, *, llama_order=False, out=None):
        tokens, pos, seq, want, seq_len, tables = self.batch.views(n, n_seqs, mb)
        count = [0] * n_seqs
        for m in range(n):
            s = seq[m]
            slot = seq_len[s] + count[s]
            count[s] += 1
            for g in range(2 if self.has_swa else 1):
                self._writable(g, tables[g, s, slot // BLOCK])[slot % BLOCK] = int(tokens[m])
        return np.zeros((int(want.sum()), 4), np.float32)


def read_back(engine, pool, seq):
    """seq's slots as the fake storage holds them: group 0 all, group 1 the window part."""
    got0 = [engine.store[0][seq.tables[0, i // BLOCK]][i % BLOCK] for i in range(seq.n)]
    assert got0 == seq.tokens, "global layers read back other tokens"
    if pool.has_swa and seq.n:
        lo = max(0, seq.n - pool.n_swa)
        got1 = [engine.store[1][seq.tables[1, i // BLOCK]][i % BLOCK] for i in range(lo, seq.n)]
        assert got1 == seq.tokens[lo:], "sliding-window layers read back other tokens"


def feed(engine, pool, seq, toks):
    pool.reserve(seq, len(toks))
    st = Step()
    st.add(seq, toks, LOGITS_NONE)
    st.run(engine, pool)


@pytest.mark.parametrize("has_swa", [False, True])
@pytest.mark.parametrize("seed", range(2))
def test_random_operations_against_a_storage_model(has_swa, seed):
    n_ctx, n_swa = 200, 24
    eng = FakeEngine(n_ctx, 64, has_swa)
    pool = KVPool(eng, n_ctx=n_ctx, n_swa=n_swa, has_swa=has_swa, limit_blocks=40)
    eng.pool = pool
    rng = random.Random(seed)
    shared = [rng.randrange(50) for _ in range(80)]
    seqs = []
    for it in range(1500):
        op = rng.random()
        try:
            if op < 0.1 and len(seqs) < 10:
                s = pool.new_sequence(cacheable=rng.random() < 0.7)
                toks = shared[:rng.randrange(1, 80)] + [rng.randrange(50) for _ in range(rng.randrange(1, 20))]
                if s.cacheable:
                    pool.match_prefix(s, toks)
                rest = toks[s.n:]
                for i in range(0, len(rest), 64):
                    feed(eng, pool, s, rest[i:i + 64])
                seqs.append(s)
            elif op < 0.18 and seqs:
                seqs.append(pool.fork(rng.choice(seqs)))
            elif op < 0.25 and seqs:
                s = seqs.pop(rng.randrange(len(seqs)))
                pool.release(s)
            elif op < 0.32 and seqs:
                s = rng.choice(seqs)
                n = rng.randrange(0, s.n + 1)
                if not pool.truncate(s, n):
                    pool.clear(s)
            elif op < 0.38 and seqs:
                s = rng.choice(seqs)
                if s.n >= 4:
                    keep = rng.randrange(0, s.n // 2)
                    if not pool.shift(s, keep, rng.randrange(1, s.n - keep)):
                        pool.clear(s)
            elif seqs:
                s = rng.choice(seqs)
                if s.n + 8 <= n_ctx:
                    feed(eng, pool, s, [rng.randrange(50) for _ in range(rng.randrange(1, 9))])
        except KVCacheFullError:
            pass
        pool.check()
        assert pool.blocks_in_use(0) <= 40
        for s in seqs:
            read_back(eng, pool, s)
            assert pool._window_held(s)
            if has_swa:  # no sliding-window block outside the window and margin
                first = max(0, s.n - n_swa - SWA_MARGIN) // BLOCK
                assert all(s.tables[1, i] < 0 for i in range(first))
    for s in seqs:
        pool.release(s)
    pool.check()
    assert pool.blocks_in_use(0) == 0 and pool.blocks_in_use(1) == 0
    for g in range(2 if has_swa else 1):  # every block ever handed out was settled
        assert eng.settled[g] == pool.groups[g].high > 0


def test_prefix_match_takes_whole_blocks_and_leaves_the_last_token():
    eng = FakeEngine(128, 64, False)
    pool = KVPool(eng, n_ctx=128, n_swa=0, has_swa=False)
    eng.pool = pool
    toks = list(range(3, 3 + 40))
    a = pool.new_sequence(cacheable=True)
    feed(eng, pool, a, toks)
    b = pool.new_sequence(cacheable=True)
    assert pool.match_prefix(b, toks) == 32  # two full blocks; the third is partial
    c = pool.new_sequence(cacheable=True)
    assert pool.match_prefix(c, toks[:32]) == 16  # the last token is always evaluated
    d = pool.new_sequence(cacheable=True)
    assert pool.match_prefix(d, [0] + toks[1:]) == 0
    for s in (a, b, c, d):
        pool.release(s)
    assert pool.blocks_cached() == 2 and pool.blocks_in_use() == 0
    e = pool.new_sequence(cacheable=True)
    assert pool.match_prefix(e, toks) == 32  # still indexed after its holders ended
    read_back(eng, pool, e)
