"""One engine step: rows of several sequences packed into the arrays of an el_batch.

A step lists (sequence, tokens, which logits) entries. `run` checks nothing the pool has not
already reserved: callers reserve the slots first (`KVPool.reserve`, which may refuse), then
run the step, which evaluates every row in one engine call and commits the new slots to each
sequence. Positions are slots: a sequence's i-th slot holds position i (a context shift moves
the slots, so that stays true).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence as Seq

import numpy as np

from .kv_cache import BLOCK, KVPool, Sequence

LOGITS_NONE, LOGITS_LAST, LOGITS_ALL = 0, 1, 2


@dataclass
class Entry:
    seq: Sequence
    tokens: list[int]
    logits: int = LOGITS_LAST


class Step:
    def __init__(self):
        self.entries: list[Entry] = []
        self.n_tokens = 0
        self.decode_ns = 0  # the engine call's wall time (run)
        self.logits = None  # after run: all the step's rows of logits, [rows wanted, n_vocab]
        self.rows: list[int | None] = []  # after run: each entry's first row in self.logits (None: no logits)

    def add(self, seq: Sequence, tokens: Seq[int], logits: int = LOGITS_LAST) -> None:
        self.entries.append(Entry(seq, [int(t) for t in tokens], logits))
        self.n_tokens += len(tokens)

    def __len__(self) -> int:
        return len(self.entries)

    def run(self, engine, pool: KVPool, *, llama_order: bool = False, out: np.ndarray | None = None) -> list:
        """Evaluate the step; returns per entry its logits: [n_vocab] (LOGITS_LAST),
        [len(tokens), n_vocab] (LOGITS_ALL) or None. They are views of `out` when given (rows
        in entry order), else of the engine's buffer (valid until its next step)."""
        ents = self.entries
        n = self.n_tokens
        mb = max(-(-(e.seq.n + len(e.tokens)) // BLOCK) for e in ents)
        tokens, pos, seq, want, seq_len, tables = engine.batch.views(n, len(ents), mb)
        want[:] = 0
        r = 0
        for i, e in enumerate(ents):
            k = len(e.tokens)
            if k == 1:
                tokens[r] = e.tokens[0]
                pos[r] = e.seq.n
                seq[r] = i
            else:
                tokens[r:r + k] = e.tokens
                pos[r:r + k] = range(e.seq.n, e.seq.n + k)
                seq[r:r + k] = i
            if e.logits == LOGITS_ALL:
                want[r:r + k] = 1
            elif e.logits == LOGITS_LAST:
                want[r + k - 1] = 1
            seq_len[i] = e.seq.n
            engine.batch.rs_slot[i] = e.seq.rs
            tables[:, i] = e.seq.tables[:, :mb]
            r += k
        t = time.perf_counter_ns()
        logits = engine.decode(n, len(ents), mb, llama_order=llama_order, out=out)
        self.decode_ns = time.perf_counter_ns() - t
        results, o = [], 0
        self.logits, self.rows = logits, []
        for e in ents:
            pool.commit(e.seq, e.tokens)
            self.rows.append(o if e.logits != LOGITS_NONE else None)
            if e.logits == LOGITS_ALL:
                results.append(logits[o:o + len(e.tokens)])
                o += len(e.tokens)
            elif e.logits == LOGITS_LAST:
                results.append(logits[o])
                o += 1
            else:
                results.append(None)
        return results
