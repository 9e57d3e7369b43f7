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
# A step's logits are made and used this many bytes at a time (run_in_groups), so that their
# memory does not grow with the sequences in a step: 32 rows of a 262k vocabulary would take 32 MB.
# Each group after the first reads the output matrix once more (Gemma-3's is 170 MB of its 235):
# 16 rows of a 262k vocabulary, 85 of a 49k one, make one group.
LOGITS_GROUP_BYTES = 16 << 20


def logits_group_rows(n_vocab: int) -> int:
    """The rows of logits a group of run_in_groups holds for a vocabulary of n_vocab."""
    return max(1, LOGITS_GROUP_BYTES // (4 * n_vocab))


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

    def _pack(self, engine) -> int:
        """Fill the engine's batch arrays with the step's rows; returns the block-table width."""
        ents = self.entries
        mb = max(-(-(e.seq.n + len(e.tokens)) // BLOCK) for e in ents)
        tokens, pos, seq, want, seq_len, tables = engine.batch.views(self.n_tokens, len(ents), mb)
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
        return mb

    def _commit(self, pool: KVPool) -> list[int]:
        """Commit every entry's new slots; returns each entry's count of logits rows."""
        counts = []
        for e in self.entries:
            pool.commit(e.seq, e.tokens)
            counts.append(len(e.tokens) if e.logits == LOGITS_ALL else int(e.logits == LOGITS_LAST))
        return counts

    def _results(self, logits, counts: list[int]) -> tuple[list, list]:
        """Per entry its rows of `logits` (which hold those of `counts`' entries, in order), and
        per entry its first row there (None: no logits)."""
        results, rows, o = [], [], 0
        for e, k in zip(self.entries, counts):
            rows.append(o if k else None)
            if e.logits == LOGITS_ALL:
                results.append(logits[o:o + k])
            elif e.logits == LOGITS_LAST:
                results.append(logits[o])
            else:
                results.append(None)
            o += k
        return results, rows

    def run(self, engine, pool: KVPool, *, llama_order: bool = False, out: np.ndarray | None = None) -> list:
        """Evaluate the step; returns per entry its logits: [n_vocab] (LOGITS_LAST),
        [len(tokens), n_vocab] (LOGITS_ALL) or None. They are views of `out` when given (rows
        in entry order), else of the engine's buffer (valid until its next step)."""
        mb = self._pack(engine)
        t = time.perf_counter_ns()
        logits = engine.decode(self.n_tokens, len(self.entries), mb, llama_order=llama_order, out=out)
        self.decode_ns = time.perf_counter_ns() - t
        counts = self._commit(pool)
        results, self.rows = self._results(logits, counts)
        self.logits = logits
        return results

    def run_in_groups(self, engine, pool: KVPool, max_rows: int):
        """Evaluate the step (batch order), then make its logits a group of entries at a time,
        so that a step of many sequences of a large vocabulary never holds all their rows: each
        group has at most max_rows rows of logits (an entry with more is a group of its own).
        Returns an iterator of (first entry, the group's logits [rows, n_vocab] in the engine's
        buffer - valid until the next group - and per entry of the group its results and its
        first row there, as `run` gives them and sets `rows`). A row's numbers are those `run` gives. The caller keeps the engine to
        itself until the iterator ends (the rows are made from the step's hidden states)."""
        mb = self._pack(engine)
        t = time.perf_counter_ns()
        engine.decode(self.n_tokens, len(self.entries), mb, defer=True)
        self.decode_ns = time.perf_counter_ns() - t
        counts = self._commit(pool)
        self.logits, self.rows = None, []
        return self._groups(engine, counts, max(1, max_rows))

    def _groups(self, engine, counts: list[int], max_rows: int):
        i, row0, n = 0, 0, len(counts)
        while i < n:
            j, rows = i, 0
            while j < n and (j == i or rows + counts[j] <= max_rows):
                rows += counts[j]
                j += 1
            if rows:
                t = time.perf_counter_ns()
                logits = engine.logits(row0, rows)
                self.decode_ns += time.perf_counter_ns() - t
            else:
                logits = None
            sub = Step()
            sub.entries = self.entries[i:j]
            yield (i, logits) + sub._results(logits, counts[i:j])
            i, row0 = j, row0 + rows
