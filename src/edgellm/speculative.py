"""Speculative decoding: cheap guesses of the next tokens, verified in one step of the model.

A drafter proposes the next k tokens of a sequence: prompt lookup (the longest n-gram ending the
prompt + generated text that occurred before proposes what followed it; no second model), or a
draft model (any GGUF with the target's vocabulary, decoding k tokens ahead). The target then
evaluates the sequence's last token and the k drafts in one step, k + 1 rows with logits for
each: row i says what follows the first i drafts, so the drafts are taken up to the first one the
target does not choose, and the row of that one gives the next token instead (all taken: the last
row gives one more). A step yields 1 to k + 1 tokens; the KV slots of rejected drafts are dropped
(`KVPool.truncate`).

Exact. Verification needs a row's logits to be the same bits in a step of k + 1 rows as alone,
which the batch-invariant arithmetic (llama_order=False) gives and llama.cpp's does not (it
switches kernels with the batch size). So speculation always runs on the batch-invariant path, the
prompt too, and at temperature 0 its text is token for token what greedy decoding gives on that
path (`BatchEngine`, `generate_batch`) — not necessarily the single-stream llama.cpp-exact bits.

Sampling. With prompt lookup the draft distribution q is a point mass: each row is sampled
exactly as plain decoding samples it (the same sampler, one uniform per token) and a draft is
taken when it is the token drawn, which accepts it with probability p(d) and otherwise draws from
p without d — the standard rule for a point mass — so a seed gives the same text as without
speculation. A draft model samples d from its own distribution q (the same sampling parameters
over its logits) and the standard rule accepts d with probability min(1, p(d) / q(d)), else draws
from the normalized residual max(0, p - q): the text follows the target's distribution, but is
not the seed's text without speculation (and, with adaptive lengths, may vary between runs).

Adaptive. A `Controller` per sequence estimates the acceptance rate of a draft by what the
drafter knew when it made it (prompt lookup: the length of the context it matched, which grows
by one with each draft taken) and chooses the k that maximizes expected tokens per second,
(1 + a1 + a1 a2 + ... + a1...ak) / (seconds of the step with k more rows + k draft steps), from
this engine's step costs by row count (`StepCosts`: measured at first use, then as steps run);
k = 0 — no drafting — when nothing beats a plain step. A draft model's draft costs what its
drafting phases took per draft (its catch-up on the tokens taken, its steps, sampling: timed as
they run). Prompt lookup keeps checking its unused proposals against the tokens that come, so it
turns back on for free; a switched-off draft model is probed now and then, each probe waiting
until what the last ones cost beyond plain steps (mostly the draft model's catch-up on the tokens
it sat out, of which it evaluates only the last CATCH_UP_WINDOW) is a small share of the time
(SpecState.PROBE_BUDGET). A draft model drafts
one token at a time while its confidence in them says drafting on pays, and a step takes prompt
lookup's drafts instead when they promise more (Speculative.with_lookup): each draft is verified
by the rule of the drafter that made it. And a draft model drafts only while its drafting steps,
timed whole in this stream, give at least the tokens per second of its plain steps
(SpecState.model_pays; a plain step is timed again every REFRESH drafting steps): what no cost
model holds — two engines taking turns on the cores, a machine whose load changes — shows there.
"""

from __future__ import annotations

import bisect
import os
import time
import weakref
from collections import deque
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import numpy as np

from .batch import LOGITS_ALL, LOGITS_LAST, LOGITS_NONE, Step
from .errors import DraftModelError, UnsupportedModelError
from .kv_cache import KVCacheFullError
from .rng import Pcg64
from .sampling import Sampler, SamplingParams, StopChecker, probabilities

LOOKUP = "lookup"
MAX_DRAFT_LIMIT = 64          # KVPool's sliding-window margin (64) bounds a rollback
DEFAULT_MAX_DRAFT_LOOKUP = 16
DEFAULT_MAX_DRAFT_MODEL = 8
NGRAM_MAX = 4                 # prompt lookup matches n-grams of 1..NGRAM_MAX tokens, longest first
CATCH_UP_WINDOW = 8           # a draft model evaluates at most the last 8 tokens it missed (ModelDrafter._catch_up)


@dataclass(frozen=True)
class Speculative:
    """How to speculate. draft: "lookup" (prompt lookup) or a draft model with the target's
    vocabulary (an `LLM`, or an alias / path that `resolve` loads). max_draft: the most draft
    tokens per step (default 16 for lookup, 8 for a draft model). adaptive: the draft length
    follows the acceptance rate and the measured cost, down to no drafting (False: always
    max_draft tokens when there is a draft). with_lookup: with a draft model (adaptive), a
    step takes prompt lookup's drafts instead where they promise more tokens per second (they
    cost no draft steps), as on a reply that copies its prompt."""

    draft: object = LOOKUP
    max_draft: int | None = None
    adaptive: bool = True
    with_lookup: bool = True

    def __post_init__(self):
        m = self.max_draft
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or not 1 <= m <= MAX_DRAFT_LIMIT):
            raise ValueError(f"max_draft must be an integer in [1, {MAX_DRAFT_LIMIT}], got {m!r}")

    @property
    def is_lookup(self) -> bool:
        return isinstance(self.draft, str) and self.draft == LOOKUP

    @property
    def k_max(self) -> int:
        if self.max_draft is not None:
            return self.max_draft
        return DEFAULT_MAX_DRAFT_LOOKUP if self.is_lookup else DEFAULT_MAX_DRAFT_MODEL

    @property
    def k_max_lookup(self) -> int:
        return self.max_draft if self.max_draft is not None else DEFAULT_MAX_DRAFT_LOOKUP

    def describe(self) -> str:
        return "prompt lookup" if self.is_lookup else f"draft model {getattr(self.draft, 'path', self.draft).name}"


def resolve(llm, value) -> Speculative | None:
    """The `speculative=` argument of generate / chat / BatchEngine: None or False (off),
    "lookup", an LLM, a path or alias of a draft model, or a Speculative. A draft model given by
    path is loaded once per target (same context, batch and threads) and its vocabulary checked."""
    from .api import LLM

    if value is None or value is False:
        return None
    _check_rollback(llm)
    spec = value if isinstance(value, Speculative) else Speculative(draft=value)
    draft = spec.draft
    if spec.is_lookup:
        return spec
    if isinstance(draft, str) and draft.lower() == LOOKUP:
        return replace(spec, draft=LOOKUP)
    if not isinstance(draft, LLM):
        if not isinstance(draft, (str, os.PathLike)):
            raise TypeError(f"speculative must be 'lookup', an LLM, a model path or a Speculative, "
                            f"got {type(draft).__name__}")
        draft = _load_draft(llm, draft)
    check_vocabulary(llm, draft)
    _check_rollback(draft)
    return replace(spec, draft=draft)


def _check_rollback(llm) -> None:
    """Speculative decoding rolls rejected drafts back; a recurrent model's state cannot be."""
    from .models.base import is_recurrent

    if is_recurrent(llm.config):
        raise UnsupportedModelError(f"{llm.config.arch}: speculative decoding rolls back rejected drafts, and the "
                                    f"recurrent state of its DeltaNet layers cannot be rolled back: turn it off")


_drafts: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # target LLM -> {source: draft LLM}


def _load_draft(llm, source):
    from .api import LLM

    loaded = _drafts.setdefault(llm, {})
    key = os.fspath(source)
    if key not in loaded:
        loaded[key] = LLM(source, n_ctx=llm.n_ctx, n_batch=llm.n_batch, n_threads=llm.n_threads)
    return loaded[key]


def check_vocabulary(target, draft) -> None:
    """A draft model must speak the target's tokens: same vocabulary size, same token texts,
    same special tokens. DraftModelError (one line saying the first difference) otherwise."""
    name = getattr(draft, "path", None)
    name = name.name if name is not None else "the draft model"
    tv, dv = target.tokenizer.vocab, draft.tokenizer.vocab
    if target.n_vocab != draft.n_vocab or tv.n_vocab != dv.n_vocab:
        raise DraftModelError(f"{name} has a vocabulary of {draft.n_vocab} tokens, the target {target.n_vocab}: "
                              "a draft model needs the target's vocabulary")
    a, b = tv.tokens, dv.tokens
    la, lb = a.byte_lengths(), b.byte_lengths()
    bad = np.flatnonzero(la != lb)
    if not bad.size:
        ra = a.buffer[int(a.bounds[0]):int(a.bounds[-1]) - 8]
        rb = b.buffer[int(b.bounds[0]):int(b.bounds[-1]) - 8]
        diff = np.flatnonzero(ra != rb)
        if diff.size:
            bad = [int(np.searchsorted(a.bounds, a.bounds[0] + diff[0], side="right")) - 1]
    if len(bad):
        i = int(bad[0])
        raise DraftModelError(f"{name} has another vocabulary: token {i} is {b[i]!r} there but {a[i]!r} in the "
                              "target model")
    for key in sorted(set(tv.special) | set(dv.special)):
        if tv.special.get(key) != dv.special.get(key):
            raise DraftModelError(f"{name} has other special tokens: {key} is {dv.special.get(key)} there but "
                                  f"{tv.special.get(key)} in the target model")
    if tv.eog_ids != dv.eog_ids:
        raise DraftModelError(f"{name} ends generation on other tokens ({sorted(dv.eog_ids)}) than the target "
                              f"model ({sorted(tv.eog_ids)})")


# ---------------------------------------------------------------------------------------------
# what a step costs


class StepCosts:
    """Seconds per engine step by its row count: the seconds of a one-row step (the median of
    the last WINDOW) times the step's cost relative to one row (per row count, the median of its
    last WINDOW ratios). A ratio is a step's seconds over the mean of the one-row steps next to
    it in time (the last before it and the first after it, at most MAX_GAP steps away), as
    `calibrate` measures them at first use: a change of load between steps cancels, and a
    one-row median from another time (say, before a copying stretch of only multi-row steps)
    does not enter; steps with no one-row step near them leave the ratios as they are. So a
    change of load moves every count with the one-row steps, while the shape stays what the
    kernels make it (medians, as a shared machine stalls steps now and then). The gemm kernels
    take the rows in tiles of a few columns, so the relative cost is a staircase in the rows,
    not a line: a row count not measured is interpolated between measured ones, and continued
    past the last at the mean cost per row of the measured range. Before any measurement, a
    line of PRIOR_ROW per row (in one-row steps)."""

    PRIOR_ROW = 0.35
    WINDOW = 9
    MAX_ROWS = 96  # steps with more rows (prefill chunks) are not decode-like: not observed
    MAX_GAP = 4    # a multi-row step is timed against one-row steps at most this many steps away
    # calibration: the row counts measured, in this order (the ends of the kernels' column
    # tiles, 4, 8 and 16 on x86, and the rows just past them first) while time remains
    CALIBRATION_ROWS = (2, 4, 5, 3, 8, 9, 16, 17, 12, 13, 6, 7, 10, 11, 14, 15, 24, 25, 32, 33)
    CALIBRATION_PAIRS = 3
    CALIBRATION_SECONDS = 0.5
    CALIBRATION_ONES = 60  # ...or this many one-row steps' time, if longer (a loaded machine)

    def __init__(self):
        self.ones: deque = deque(maxlen=self.WINDOW)  # seconds of the last one-row steps
        self.ratios: dict[int, deque] = {}  # rows (> 1) -> its last steps over their one-row neighbours
        self.calibrated = False
        self._one = 0.0  # median of ones (0: none yet)
        self._shape: list[float] = []  # shape(r) = _shape[r] (a cache; [] after a change)
        self._before = 0.0  # the last one-row step's seconds (0: none within MAX_GAP steps)
        self._waiting: list[tuple[int, float]] = []  # multi-row steps since then: (rows, seconds)
        # as a draft model: the seconds of its last drafting phases per draft made (its
        # catch-up on the tokens taken, its steps, sampling, Python: observe_drafts)
        self.per_draft: deque = deque(maxlen=self.WINDOW)

    def observe(self, rows: int, seconds: float) -> None:
        if not 0 < rows <= self.MAX_ROWS or seconds <= 0:
            return
        if rows == 1:
            self.ones.append(seconds)
            self._one = _median(self.ones)
            if self._waiting:
                ref = 0.5 * (self._before + seconds)
                for r, t in self._waiting:
                    q = self.ratios.get(r)
                    if q is None:
                        q = self.ratios[r] = deque(maxlen=self.WINDOW)
                    q.append(t / ref)
                self._waiting = []
                self._shape = []
            self._before = seconds
            return
        if not self._before:
            return
        if len(self._waiting) >= self.MAX_GAP:  # too far from the one-row step before them
            self._before, self._waiting = 0.0, []
            return
        self._waiting.append((rows, seconds))

    def observe_drafts(self, seconds: float, drafts: int) -> None:
        """A drafting phase of this (draft) model: seconds for drafts tokens."""
        if drafts > 0 and seconds > 0:
            self.per_draft.append(seconds / drafts)

    def draft_seconds(self) -> float:
        """Seconds a draft costs, as drafting phases took them (the median of the last WINDOW;
        0: none measured)."""
        return _median(self.per_draft) if self.per_draft else 0.0

    @classmethod
    def known(cls, seconds: Sequence[float]) -> "StepCosts":
        """Costs taken as known (no calibration): seconds[r - 1] for a step of r rows."""
        c = cls()
        c.calibrated = True
        c.ones.append(seconds[0])
        c._one = seconds[0]
        for r, t in enumerate(seconds[1:], 2):
            c.ratios[r] = deque([t / seconds[0]], maxlen=cls.WINDOW)
        return c

    def predict(self, rows: int) -> float:
        """Seconds of a step of rows rows (in one-row steps before any is measured)."""
        return (self._one or 1.0) * self.shape(rows)

    def shape(self, rows: int) -> float:
        """The cost of a step of rows rows relative to a one-row step."""
        rows = max(1, rows)
        if rows >= len(self._shape):
            self._shape = self._build(max(rows + 1, 2 * len(self._shape), 34))
        return self._shape[rows]

    def _build(self, size: int) -> list[float]:
        t = {r: _median(q) for r, q in self.ratios.items()}
        t[1] = 1.0
        ks = sorted(t)
        hi = ks[-1]
        per_row = (t[hi] - 1.0) / (hi - 1) if hi > 1 else self.PRIOR_ROW
        out = [0.0, 1.0] + [0.0] * (size - 2)
        j = 0
        for r in range(2, size):
            if r >= hi:
                v = t[hi] + per_row * (r - hi)
            else:
                while ks[j + 1] < r:
                    j += 1
                a, b = ks[j], ks[j + 1]
                v = t[a] + (t[b] - t[a]) * (r - a) / (b - a)
            out[r] = max(v, out[r - 1])  # a step of more rows never costs less
        return out

    def calibrate(self, llm, max_rows: int, seq=None) -> None:
        """Measure steps of up to max_rows rows on llm's engine, CALIBRATION_ROWS in order
        while CALIBRATION_SECONDS (or CALIBRATION_ONES one-row steps, if longer) last: each
        CALIBRATION_PAIRS times between one-row steps and timed against the mean of its two
        neighbours (so a change of load between steps cancels); those ratios and the one-row
        steps are its first samples. Every step has logits for each row, as a verification step does. seq: the sequence whose
        context the steps follow (a fork of it is written and dropped; default: a scratch one
        from position 0). Skipped when the KV pool cannot spare the slots."""
        if self.calibrated:
            return
        self.calibrated = True
        rows_list = [r for r in self.CALIBRATION_ROWS if r <= min(max_rows, llm.n_batch)]
        if not rows_list:
            return
        pool, eng = llm._pool, llm._engine
        ratios: dict[int, list[float]] = {}
        ones: list[float] = []
        out = np.empty((max(rows_list), llm.n_vocab), dtype=np.float32)
        with llm._engine_lock:
            s = pool.fork(seq) if seq is not None else pool.new_sequence()
            n0 = s.n
            tok = [int(s.tokens[-1]) if s.tokens else 0]

            def timed(r: int) -> float:
                pool.reserve(s, r)
                step = Step()
                step.add(s, tok * r, LOGITS_ALL)
                t = time.perf_counter()
                step.run(eng, pool, out=out)
                t = time.perf_counter() - t
                if not pool.truncate(s, n0):  # (a sliding window: never within its margin of 64)
                    raise KVCacheFullError("the window moved")
                return t

            try:
                timed(1)  # warm up
                prev = timed(1)
                deadline = time.perf_counter() + max(self.CALIBRATION_SECONDS, self.CALIBRATION_ONES * prev)
                ones.append(prev)
                for r in rows_list:
                    if time.perf_counter() > deadline:
                        break
                    for _ in range(self.CALIBRATION_PAIRS):
                        tr, one = timed(r), timed(1)
                        ratios.setdefault(r, []).append(tr / (0.5 * (prev + one)))
                        ones.append(one)
                        prev = one
            except KVCacheFullError:
                pass
            finally:
                pool.release(s)
        for t in ones:
            self.observe(1, t)
        for r, x in ratios.items():
            self.ratios[r] = deque(x, maxlen=self.WINDOW)
        self._shape = []
        self._before = 0.0  # (steps after it are timed against their own neighbours)


_costs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # LLM -> StepCosts


def costs_for(llm) -> StepCosts:
    c = _costs.get(llm)
    if c is None:
        c = _costs[llm] = StepCosts()
    return c


# ---------------------------------------------------------------------------------------------
# choosing the draft length


class Controller:
    """Acceptance rates of drafts by a key the drafter gives each: prompt lookup, the length of
    the context it matched, which grows by one with each draft taken (so a long match drafts
    far); a draft model, its confidence in the draft, in tenths. Decaying counts of drafts taken
    and refused per key bucket and over all drafts. Draft lengths maximize expected tokens per
    second under the measured step costs (`StepCosts`); none when nothing beats a plain step."""

    DECAY = 0.9            # per observation of a bucket
    WEIGHT = 4.0           # a prior counts as this many observations
    MARGIN = 1.03          # drafting must promise 3% more tokens per second than a plain step
    PROBE_FIRST, PROBE_MAX = 8, 256

    def __init__(self, edges: Sequence[int], priors: Sequence[float], k_max: int, adaptive: bool, probes: bool,
                 overall: float = 0.75):
        """edges: the least key of each bucket (ascending); priors: each bucket's initial rate;
        overall: the initial rate over all drafts."""
        self.edges = list(edges)
        self.acc = [[a * self.WEIGHT, (1.0 - a) * self.WEIGHT] for a in priors]
        self.total = [overall * self.WEIGHT, (1.0 - overall) * self.WEIGHT]
        self.k_max = k_max
        self.adaptive = adaptive
        self.probes = probes
        self.off = 0
        self.probe_every = self.PROBE_FIRST

    def bucket(self, key: int) -> int:
        return max(0, bisect.bisect_right(self.edges, key) - 1)

    def alpha(self, key: int) -> float:
        a, r = self.acc[self.bucket(key)]
        return a / (a + r)

    @property
    def overall(self) -> float:
        a, r = self.total
        return a / (a + r)

    def observe(self, keys: Sequence[int], accepted: int) -> None:
        """A step's drafts, by their keys: the first `accepted` taken, the next refused (if
        any), those after it unseen."""
        d = self.DECAY
        for j in range(min(accepted + 1, len(keys))):
            hit = 0 if j < accepted else 1
            for c in (self.acc[self.bucket(keys[j])], self.total):
                c[0] *= d
                c[1] *= d
                c[hit] += 1.0

    def best(self, rates, limit: int, cost, others: int = 0) -> tuple[int, float]:
        """The draft length of the next step and the tokens per second it promises: rates(j) is
        the rate of its draft j (from 0); limit caps it (context, tokens still wanted, step
        budget); cost(k) is the step's seconds with k drafts (its rows, and a draft model's
        steps); others: tokens the step gives other sequences. 0 when no length beats a plain
        step by MARGIN (its rate, times MARGIN, then); not adaptive: the limit."""
        limit = min(limit, self.k_max)
        best_k, best = 0, (1.0 + others) / cost(0) * self.MARGIN
        e = p = 1.0
        for k in range(1, max(limit, 0) + 1):
            p *= rates(k - 1)
            e += p
            rate = (e + others) / cost(k)
            if rate > best or (not self.adaptive and k == limit):
                best_k, best = k, rate
        return best_k, best

    def choose(self, rates, limit: int, cost, others: int = 0) -> int:
        """best()'s draft length; a switched-off draft model (probes) drafts 2 now and then,
        as it learns only by trying."""
        return self.probe(self.best(rates, limit, cost, others)[0], limit)

    def probe(self, best_k: int, limit: int, min_gap: int = 0) -> int:
        """best_k, but 2 now and then where it is 0 (with probes): a switched-off draft model
        learns only by trying (after PROBE_FIRST steps, then twice as many each time, and at
        least min_gap)."""
        if best_k == 0 and self.probes and min(limit, self.k_max) > 0:
            self.off += 1
            if self.off >= max(self.probe_every, min_gap):
                self.off = 0
                self.probe_every = min(self.probe_every * 2, self.PROBE_MAX)
                return min(2, limit)
        elif best_k:
            self.off = 0
            self.probe_every = self.PROBE_FIRST
        return best_k

    def worth_more(self, rates: Sequence[float], limit: int, cost, others: int = 0) -> bool:
        """A draft model has made len(rates) drafts (rates: what each is expected to be taken
        with, knowing its confidence): whether drafting on (each next one at the overall rate)
        promises more tokens per second than verifying these. Not adaptive: until limit."""
        j, limit = len(rates), min(limit, self.k_max)
        if j >= limit or not self.adaptive:
            return j < limit
        e = p = 1.0
        for a in rates:
            p *= a
            e += p
        now = (e + others) / cost(j)
        a = self.overall
        for n in range(j + 1, limit + 1):
            p *= a
            e += p
            if (e + others) / cost(n) > now:
                return True
        return False


# ---------------------------------------------------------------------------------------------
# drafters


class LookupDrafter:
    """Prompt lookup over one sequence's tokens. The longest n-gram (n <= NGRAM_MAX) that ends
    them and occurred before gives the candidates: its last CANDIDATES occurrences. Of those the
    one whose preceding tokens match the sequence's furthest back (up to MATCH_CAP tokens; the
    latest among equals) proposes the tokens that followed it — copying on into the proposal
    itself when that occurrence is recent, so a repeating pattern repeats. The match's length m
    is what the controller judges the proposal by."""

    # acceptance by match length, measured on SmolLM2-135M's greedy replies to the benchmark's
    # prompts (scripts/bench_speculative.py): 1 token 0.17, 2 0.45, 3 0.62, 4 0.7, 5-7 0.82, ...
    edges = (1, 2, 3, 4, 5, 8, 13, 21, 33)
    priors = (0.17, 0.45, 0.62, 0.7, 0.82, 0.9, 0.94, 0.96, 0.98)
    CANDIDATES = 8
    MATCH_CAP = 64

    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        self.tokens: list[int] = []
        # occ[n][ngram] = the positions after its occurrences that have a successor, in order
        self.occ: list[dict] = [{} for _ in range(NGRAM_MAX + 1)]
        self.indexed = 0  # n-grams ending before position indexed are in `occ`

    def _sync(self, history: Sequence[int]) -> None:
        t = self.tokens
        if len(history) < len(t) or (t and history[len(t) - 1] != t[-1]):
            self._reset()  # another history (not an extension of ours): start over
            t = self.tokens
        t.extend(history[len(t):])
        occ = self.occ
        for e in range(max(self.indexed, 1), len(t)):
            for n in range(1, min(NGRAM_MAX, e) + 1):
                key = tuple(t[e - n:e])
                at = occ[n].get(key)
                if at is None:
                    occ[n][key] = [e]
                else:
                    at.append(e)
        self.indexed = max(self.indexed, len(t))

    def match(self, history: Sequence[int]) -> tuple[int, int]:
        """(m, e): the match's length and the position after the matched occurrence; (0, -1)
        when the last token never occurred before."""
        self._sync(history)
        t = self.tokens
        L = len(t)
        for n in range(min(NGRAM_MAX, L - 1), 0, -1):
            at = self.occ[n].get(tuple(t[L - n:]))
            if at is None:
                continue
            if n < NGRAM_MAX:
                return n, at[-1]
            best_m, best_e = 0, -1
            for e in reversed(at[-self.CANDIDATES:]):
                cap = min(self.MATCH_CAP, e)
                if cap > best_m and t[e - cap:e] == t[L - cap:]:  # (the common case in a repetition)
                    m = cap
                else:
                    m = n
                    while m < cap and t[e - 1 - m] == t[L - 1 - m]:
                        m += 1
                if m > best_m:
                    best_m, best_e = m, e
                    if m == self.MATCH_CAP:
                        break
            return best_m, best_e
        return 0, -1

    def draft(self, e: int, k: int) -> list[int]:
        t, L = self.tokens, len(self.tokens)
        out: list[int] = []
        for j in range(k):
            src = e + j
            out.append(t[src] if src < L else out[src - L])
        return out


class ModelDrafter:
    """A draft model's sequence for one target sequence: its KV mirrors the target's tokens (the
    same context shifts), it catches up on the tokens the target accepted and decodes drafts,
    greedily or by sampling with the target's parameters (keeping each draft's distribution q for
    the acceptance rule), one at a time while the controller finds drafting on worth it. A
    draft's key is the draft model's confidence in it, in tenths (greedy: the probability of its
    argmax; sampling: of the token drawn), whose acceptance rate starts at the confidence (a
    calibrated draft model that agrees with the target) and is then learnt."""

    edges = tuple(range(10))
    priors = tuple((i + 0.5) / 10 for i in range(10))

    def __init__(self, llm, params: SamplingParams):
        self.llm = llm
        seed = None if params.seed is None else (params.seed * 2654435761 + 97) % (1 << 63)
        self.sampler = Sampler(replace(params, seed=seed), llm.n_vocab)
        self.greedy = params.greedy
        self.seq = None
        # the sequence holds context[:base] and then, from its slot base on, context[base + skip:]:
        # a catch-up longer than CATCH_UP_WINDOW evaluates only its last CATCH_UP_WINDOW tokens
        self.base = self.skip = 0
        self.drafts: list[int] = []
        self.q: list[tuple[np.ndarray, np.ndarray] | None] = []
        self.keys: list[int] = []  # each draft's confidence in tenths

    def close(self) -> None:
        if self.seq is not None:
            with self.llm._engine_lock:
                self.llm._pool.release(self.seq)
            self.seq = None

    def shift(self, n_keep: int, n_discard: int) -> None:
        """The target's sequence dropped n_discard tokens after its first n_keep: the same here."""
        s = self.seq
        if s is None:
            return
        with self.llm._engine_lock:
            if self.skip:  # (its slots are not the target's: it starts over, from the window)
                self.llm._pool.clear(s)
                self.base = self.skip = 0
            elif s.n >= n_keep + n_discard + 1:
                self.llm._pool.shift(s, n_keep, n_discard)
            elif not self.llm._pool.truncate(s, min(s.n, n_keep)):
                self.llm._pool.clear(s)

    def _catch_up(self, context: list[int], window: bool = False) -> list[int]:
        """Keep the longest prefix of context (at most all but its last token) the sequence
        holds; the tokens still to evaluate. window: of more than CATCH_UP_WINDOW tokens to
        evaluate, only the last CATCH_UP_WINDOW (the drafts then follow a context with a gap:
        they are verified all the same, and a probe after hundreds of plain steps costs a
        short step, not a prompt's). Called with the draft engine's lock held."""
        pool = self.llm._pool
        if self.seq is None:
            self.seq = pool.new_sequence()
        s = self.seq
        held, base, skip = s.tokens, self.base, self.skip
        n = base + max(0, min(len(held) - base, len(context) - 1 - base - skip))
        i = base
        while i < n and held[i] == context[i + skip]:
            i += 1
        if i < s.n and not pool.truncate(s, i):
            pool.clear(s)
            i = self.base = self.skip = 0
        if window and len(context) - (i + self.skip) > CATCH_UP_WINDOW:
            self.base, self.skip = i, len(context) - CATCH_UP_WINDOW - i
        return context[s.n + self.skip:]

    def prefill(self, ids: list[int]) -> None:
        """Evaluate a prompt ahead of the first drafts (so it is timed with the prompt). A KV
        cache that cannot hold it leaves the rest to the drafts' catch-up."""
        pool, eng, nb = self.llm._pool, self.llm._engine, self.llm.n_batch
        with self.llm._engine_lock:
            todo = self._catch_up(list(ids) + [0])[:-1]  # (the last token of a context is never held)
            try:
                for i in range(0, len(todo), nb):
                    chunk = todo[i:i + nb]
                    pool.reserve(self.seq, len(chunk))
                    step = Step()
                    step.add(self.seq, chunk, LOGITS_NONE)
                    step.run(eng, pool)
            except KVCacheFullError:
                pass

    def choose(self, logits: np.ndarray, history: list[int]) -> int:
        if self.greedy:
            tok = self.sampler.sample(logits, history)
            x = np.asarray(logits, dtype=np.float32)
            conf = 1.0 / float(np.exp(x - x[tok]).sum(dtype=np.float64))
            self.q.append(None)
        else:
            c = self.sampler.candidates(logits, history)
            p = probabilities(c)
            i = _draw_index(p, self.sampler.rng)
            tok, conf = int(c.ids[i]), float(p[i])
            self.q.append((c.ids, p))
        self.drafts.append(tok)
        self.keys.append(min(9, int(conf * 10)))
        return tok


def _median(xs) -> float:
    """statistics.median of a non-empty collection of numbers (the middle one, or the mean of the
    two middle ones), without importing statistics (decimal, fractions, ...: ~0.5 MB resident) into
    every process that serves (issue 8)."""
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def _weight_bytes(llm) -> int:
    return max(1, sum(t.nbytes for t in llm.gguf.tensors.values()))


def _draw_index(p: np.ndarray, rng: Pcg64) -> int:
    """An index drawn from probabilities p (float64, summing to ~1) by one uniform."""
    cum = np.cumsum(p)
    i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return min(i, int(np.flatnonzero(p)[-1]))


def _run_model_drafts(dllm, jobs: list) -> None:
    """Decode every job's drafts on the draft model, the jobs' rows sharing its steps. jobs:
    (state, context, k, tail) with k the most drafts and tail the penalty window of the context;
    a job stops early when its state finds more drafts not worth it (SpecState.worth_more). A
    job whose sequence the draft model's KV cache cannot hold gets the drafts it has so far
    (maybe none)."""
    pool, eng, nb = dllm._pool, dllm._engine, dllm.n_batch
    costs = costs_for(dllm)
    t0 = time.perf_counter()
    with dllm._engine_lock:
        rows = []
        for st, ctx, k, tail in jobs:
            d = st.model
            d.drafts, d.q, d.keys = [], [], []
            todo = d._catch_up(ctx, window=True)
            try:
                while len(todo) > nb:  # (an n_batch under CATCH_UP_WINDOW: the rest first, in chunks)
                    n = min(nb, len(todo) - nb)
                    step = Step()
                    pool.reserve(d.seq, n)
                    step.add(d.seq, todo[:n], LOGITS_NONE)
                    step.run(eng, pool)
                    todo = todo[n:]
                pool.reserve(d.seq, len(todo))
            except KVCacheFullError:
                continue
            rows.append((st, todo, k, list(tail)))
        while rows:
            nxt = []
            for chunk in _packed(rows, nb):
                step = Step()
                for st, todo, _, _ in chunk:
                    step.add(st.model.seq, todo, LOGITS_LAST)
                t = time.perf_counter()
                out = step.run(eng, pool)
                if all(len(todo) == 1 for _, todo, _, _ in chunk):
                    costs.observe(step.n_tokens, time.perf_counter() - t)
                for (st, todo, k, tail), logits in zip(chunk, out):
                    d = st.model
                    tok = d.choose(logits, tail)
                    tail.append(tok)
                    if len(d.drafts) < k and st.worth_more(k):
                        try:
                            pool.reserve(d.seq, 1)
                        except KVCacheFullError:
                            continue
                        nxt.append((st, [tok], k, tail))
            rows = nxt
    costs.observe_drafts(time.perf_counter() - t0, sum(len(st.model.drafts) for st, _, _, _ in jobs))


def _packed(rows: list, n_batch: int):
    chunk, n = [], 0
    for r in rows:
        if chunk and n + len(r[1]) > n_batch:
            yield chunk
            chunk, n = [], 0
        chunk.append(r)
        n += len(r[1])
    if chunk:
        yield chunk


# ---------------------------------------------------------------------------------------------
# one sequence's speculation


class SpecState:
    """One sequence's drafting: its drafters (prompt lookup, a draft model, or both: each step
    takes the drafts that promise more), their controllers, and counts (drafted, accepted,
    steps)."""

    GUARD_WINDOW = 8   # the draft model's drafting steps model_pays judges by
    MIN_RUNS = 4       # ...at least
    PLAIN_WINDOW = 5   # plain steps it compares them with
    REFRESH = 16       # drafting steps after which a plain one is timed again (the load changes)
    PROBE_BUDGET = 0.02  # a switched-off draft model's probes cost at most this share of the time

    def __init__(self, target, spec: Speculative, params: SamplingParams):
        self.spec = spec
        self.target = target
        self.costs = costs_for(target)
        self.params = params
        self.lookup = LookupDrafter() if spec.is_lookup or (spec.with_lookup and spec.adaptive) else None
        self.model = None if spec.is_lookup else ModelDrafter(spec.draft, params)
        L, M = LookupDrafter, ModelDrafter
        self.lctl = self.mctl = None
        if self.lookup is not None:
            self.lctl = Controller(L.edges, L.priors, spec.k_max_lookup, spec.adaptive, probes=False)
        if self.model is not None:
            self.mctl = Controller(M.edges, M.priors, spec.k_max, spec.adaptive, probes=True)
        self.drafted = 0    # draft tokens verified
        self.accepted = 0   # of them, taken
        self.steps = 0      # verification steps with at least one draft
        self._by_lookup = self.model is None  # this step's drafts are prompt lookup's
        self._m = 0         # lookup: the length of this step's match
        self._e = -1        # lookup: where its proposal copies from
        self._shadow = None  # lookup: an unused proposal (tokens, m, history length), checked next
        self._cost, self._others = None, 0  # a draft model: this step's cost by drafts, others' tokens
        # what this stream's steps really took (observe_step): a draft model drafts only while
        # its steps give more tokens per second than plain ones (model_pays)
        self._model_runs: deque = deque(maxlen=self.GUARD_WINDOW)  # drafting steps: (seconds, tokens)
        self._plain_runs: deque = deque(maxlen=self.PLAIN_WINDOW)  # plain steps: seconds
        self._since_plain = 0  # the draft model's drafting steps since the last plain step
        self._probing = False  # this step's drafts are a switched-off draft model's probe
        self._probe_loss: deque = deque(maxlen=3)  # what its last probes cost beyond plain steps (s)

    def close(self) -> None:
        if self.model is not None:
            self.model.close()

    def shift(self, n_keep: int, n_discard: int) -> None:
        if self.model is not None:
            self.model.shift(n_keep, n_discard)

    def calibrate(self, seq=None, base_rows: int = 1) -> None:
        """Measure the step costs drafting decides by (once per engine; StepCosts.calibrate):
        the target's for base_rows + k_max rows, a draft model's for its one-token steps."""
        k = max(self.lctl.k_max if self.lctl else 0, self.mctl.k_max if self.mctl else 0)
        self.costs.calibrate(self.target, base_rows + k, seq)
        if self.model is not None:
            costs_for(self.model.llm).calibrate(self.model.llm, 2)

    def _plan_lookup(self, history: list[int], limit: int, cost, others: int) -> tuple[int, float]:
        """Prompt lookup's draft length and the rate it promises; checks the last unused
        proposal against the tokens that came (what drafting it would have given)."""
        d, ctl = self.lookup, self.lctl
        if self._shadow is not None:
            prop, m, n0 = self._shadow
            came = history[n0:]
            n = min(len(prop), len(came))
            taken = 0
            while taken < n and prop[taken] == came[taken]:
                taken += 1
            ctl.observe(range(m, m + n), taken)
            self._shadow = None
        m, e = d.match(history)
        if m == 0:
            return 0, 0.0
        self._m, self._e = m, e
        k, rate = ctl.best(lambda j: ctl.alpha(m + j), limit, cost, others)
        if k == 0 and limit > 0:
            self._shadow = (d.draft(e, 1), m, len(history))
        return k, rate

    def _plan(self, history: list[int], n_context: int, limit: int, base_rows: int, others: int) -> int:
        """The draft length of this step (0: none; for a draft model, the most: it stops
        earlier when worth_more says so); base_rows: the step's rows without these drafts."""
        costs = self.costs
        t_base = costs.predict(base_rows)
        rows = lambda k: costs.predict(base_rows + k) if k else t_base  # noqa: E731
        kl, rate_l = self._plan_lookup(history, limit, rows, others) if self.lookup is not None else (0, 0.0)
        d, ctl = self.model, self.mctl
        if d is None:
            return kl
        limit = min(limit, d.llm.n_ctx - n_context)  # the draft model's context holds them
        dc = costs_for(d.llm)
        t_draft = dc.draft_seconds()  # as drafting phases took them
        if not t_draft and dc.ones and costs.ones:  # none yet: the draft model's steps
            t_draft = dc.predict(1)
        elif not t_draft:  # not measured: a decode step costs what its weights take to read
            t_draft = t_base * _weight_bytes(d.llm) / _weight_bytes(self.target)
        self._cost = lambda k: rows(k) + k * t_draft  # noqa: E731
        self._others = others
        a = ctl.overall
        pays = not ctl.adaptive or self.model_pays(base_rows)
        km, rate_m = ctl.best(lambda j: a, limit, self._cost, others) if pays else (0, 0.0)
        if kl and (rate_l >= rate_m or not km):
            self._by_lookup = True
            return kl
        self._by_lookup = False
        if kl:  # unused: what it would have given is checked next step
            self._shadow = (self.lookup.draft(self._e, kl), self._m, len(history))
        if ctl.adaptive and self._since_plain >= self.REFRESH:  # time a plain step again
            return 0
        k = ctl.probe(km, limit, self._probe_gap(base_rows))
        self._probing = bool(k) and not km
        return limit if k else 0

    def _plain_seconds(self, base_rows: int) -> float:
        return _median(self._plain_runs) if self._plain_runs else self.costs.predict(base_rows)

    def _probe_gap(self, base_rows: int) -> int:
        """Plain steps a probe waits for at least: its cost beyond the plain steps it replaces
        (the median of the last probes': the draft model's catch-up, its step, a wider
        verification) within PROBE_BUDGET of theirs. 0 before a probe is measured."""
        if not self._probe_loss:
            return 0
        return int(_median(self._probe_loss) / (self.PROBE_BUDGET * self._plain_seconds(base_rows))) + 1

    def observe_step(self, seconds: float, drafted: int, tokens: int) -> None:
        """A whole generation step (drafting, the engine step, verification) took seconds and
        gave tokens: a plain one (no drafts) or one of the draft model's drafts (prompt lookup's
        are judged by the step costs alone: they cost no draft steps)."""
        if not drafted:
            self._plain_runs.append(seconds)
            self._since_plain = 0
        elif not self._by_lookup:
            self._model_runs.append((seconds, tokens))
            self._since_plain += 1
            if self._probing:
                self._probe_loss.append(max(0.0, seconds - tokens * self._plain_seconds(1)))

    def model_pays(self, base_rows: int = 1) -> bool:
        """Whether the draft model's last GUARD_WINDOW drafting steps gave at least as many
        tokens per second as plain steps (this stream's last PLAIN_WINDOW, or the engine's step
        cost before there are any). What the step costs leave out — the two engines taking turns
        on the cores, the draft model's catch-up, sampling, Python — is in these timings; the
        acceptance too. True until there are MIN_RUNS of them."""
        runs = self._model_runs
        if len(runs) < self.MIN_RUNS:
            return True
        return sum(n for _, n in runs) * self._plain_seconds(base_rows) >= sum(t for t, _ in runs)

    def draft_lookup(self, k: int) -> list[int]:
        return self.lookup.draft(self._e, k)

    def worth_more(self, limit: int) -> bool:
        """A draft model's drafts so far: whether to draft another (Controller.worth_more)."""
        ctl = self.mctl
        return ctl.worth_more([ctl.alpha(key) for key in self.model.keys], limit, self._cost, self._others)

    def verify(self, sampler: Sampler, rows: np.ndarray, history: list[int], drafts: list[int], *,
               guide=None, eog=frozenset()) -> tuple[list[int], int]:
        """The tokens a verification step gives and how many of them are drafts (whose KV slots
        stay): rows[i] are the target's logits after history and drafts[:i] (len(drafts) + 1
        rows); the drafts taken, then the target's own choice. guide (constrain.Guide): the rows
        are sampled under its grammar (the drafts must be ones it allows, Constraint.valid_prefix)
        and the tokens end where plain guided decoding would stop sampling — at a draft after
        which the grammar forces tokens (the caller's guide.advance appends them) or is finished.
        The guide is left as it was; the caller advances it by the tokens. An end-of-generation
        token in eog ends them too."""
        k = len(drafts)
        q = None if self._by_lookup else self.model.q
        w = sampler.params.repeat_last_n
        tail = list(history) if w < 0 else list(history[len(history) - w:]) if w > 0 else []
        c = None if guide is None else guide.constraint
        out: list[int] = []
        taken = consumed = 0
        try:
            for i in range(k + 1):
                if i < k and q is not None and q[i] is not None:
                    p = None if guide is None else guide.distribution(sampler, rows[i], tail)
                    tok = accept_or_resample(sampler, rows[i], tail, drafts[i], q[i], p)
                elif guide is None:
                    tok = sampler.sample(rows[i], tail)
                else:
                    tok = guide.sample(sampler, rows[i], tail)
                out.append(tok)
                if i == k or tok != drafts[i]:
                    break
                taken += 1
                if tok in eog:
                    break
                if c is not None:
                    c.accept(tok)
                    consumed += 1
                    if c.finished or (guide.jump_forward and c.forced_tokens()):
                        break
                tail.append(tok)
        finally:
            if consumed:
                c.rollback(consumed)
        if k:
            self.drafted += k
            self.accepted += taken
            self.steps += 1
            if self._by_lookup:
                self.lctl.observe(range(self._m, self._m + k), taken)
            else:
                self.mctl.observe(self.model.keys[:k], taken)
        return out, taken


def accept_or_resample(sampler: Sampler, logits: np.ndarray, history: list[int], d: int,
                       q: tuple[np.ndarray, np.ndarray], p: tuple[np.ndarray, np.ndarray] | None = None) -> int:
    """The standard speculative rule for a draft d drawn from q = (ids, probs): d with
    probability min(1, p(d) / q(d)), else a draw from max(0, p - q) normalized, p = (ids, probs)
    being what the target draws from (default: the sampler's candidates). The result is
    distributed as p."""
    if p is None:
        c = sampler.candidates(logits, history)
        p = (c.ids, probabilities(c))
    pi, pp = p
    qi, qp = q
    pd = float(pp[pi == d].sum())
    qd = float(qp[qi == d].sum())
    rng = sampler.rng
    if rng.random() * qd < pd:
        return d
    n = sampler.n_vocab
    r = np.zeros(n, dtype=np.float64)
    r[pi] = pp
    r[qi] -= qp
    np.maximum(r, 0.0, out=r)
    if not r.any():  # p == q to rounding: the rule accepted with probability ~1
        return int(pi[_draw_index(pp, rng)])
    return _draw_index(r, rng)


def propose(jobs: list, *, base_rows: int = 1, others: int = 0) -> list[list[int]]:
    """Drafts for several sequences: jobs are (state, history, context, limit) — history the
    sequence's tokens so far, context the tokens its KV holds plus the pending last one (the
    same unless a context shift dropped some), limit the most drafts the step can take. Draft
    models decode for all their jobs together."""
    out: list[list[int]] = [[] for _ in jobs]
    by_model: dict[int, list] = {}
    for i, (st, history, context, limit) in enumerate(jobs):
        if st.spec.adaptive:
            st.calibrate(base_rows=base_rows)
        k = st._plan(history, len(context), limit, base_rows, others)
        if k <= 0:
            continue
        if st._by_lookup:
            out[i] = st.draft_lookup(k)
        else:
            w = st.params.repeat_last_n
            tail = context if w < 0 else context[len(context) - w:] if w > 0 else []
            by_model.setdefault(id(st.model.llm), []).append((i, (st, list(context), k, tail)))
    for group in by_model.values():
        _run_model_drafts(group[0][1][0].model.llm, [job for _, job in group])
        for i, (st, _, _, _) in group:
            out[i] = list(st.model.drafts)
    return out


# ---------------------------------------------------------------------------------------------
# single-stream generation (LLM.generate / chat with speculative=)


def generate(llm, session, ids: list[int], params: SamplingParams, max_tokens, stops, spec: Speculative,
             stats, constraint=None, preserved: frozenset[int] = frozenset()) -> Iterator[str]:
    """The generation loop of LLM._generate_on, verifying drafts: the same text pieces, stop
    strings, limits, context shift and constraint (drafts cut to what it allows, rows sampled
    under it, the tokens it forces appended) and preserved control tokens, on the batch-invariant path."""
    pool, n_ctx = llm._pool, session.n_ctx
    sampler = Sampler(params, llm.n_vocab)
    detok = llm.tokenizer.streaming_decoder(preserved=preserved)
    checker = StopChecker(stops)
    eog = llm.tokenizer.eog_ids
    n_keep = 1 if (llm.tokenizer.bos_id is not None and ids[0] == llm.tokenizer.bos_id) else 0
    limit = max_tokens if max_tokens is not None and max_tokens >= 0 else None
    guide = None
    if constraint is not None:
        from .constrain import Guide

        guide = Guide(constraint)
    state = SpecState(llm, spec, params)
    session._set_llama_order(False)
    seq = session._seq
    t0 = time.perf_counter()
    try:
        logits = session._prefill(ids)
        if state.model is not None:
            state.model.prefill(ids)
    except BaseException:
        session.reset()
        state.close()
        raise
    finally:
        stats.prompt_seconds = time.perf_counter() - t0
    if spec.adaptive:
        state.calibrate(seq)  # (once per engine: a start-up cost, in neither timing)
    history = list(ids)
    covered = len(ids)  # history[:covered] is in the KV cache (but what a context shift dropped)
    t1 = time.perf_counter()
    stats.stop_reason = "length"
    try:
        pending = [sampler.sample(logits, history) if guide is None else guide.sample(sampler, logits, history)]
        out = np.empty((1, llm.n_vocab), dtype=np.float32)
        while True:
            done = False
            for tok in pending:
                if tok in eog:
                    stats.stop_reason, done = "eog", True
                    break
                new = [tok] if guide is None else guide.advance(
                    tok, None if limit is None else limit - stats.generated_tokens)
                for t in new:  # (advance keeps them within the limit)
                    stats.generated_tokens += 1
                    history.append(t)
                    emit, stopped = checker.feed(detok.add(t))
                    if emit:
                        yield emit
                    if stopped:
                        stats.stop_reason, done = "stop", True
                        break
                if done:
                    break
                if guide is not None and guide.constraint.finished:
                    stats.stop_reason, done = "grammar", True
                    break
                if limit is not None and stats.generated_tokens >= limit:
                    done = True
                    break
            if done:
                break
            unfed = history[covered:]
            if len(session) + len(unfed) > n_ctx:
                if limit is None and len(history) - len(ids) >= n_ctx:
                    break  # an unbounded reply as long as the whole context: stop
                before = len(session)
                session._make_room(n_keep)
                state.shift(min(max(0, n_keep), before - 2), before - len(session))
            room = n_ctx - len(session) - len(unfed)
            if limit is not None:
                room = min(room, limit - stats.generated_tokens - 1)
            context = history if spec.is_lookup else seq.tokens + unfed  # (differ after a shift)
            t_step = time.perf_counter()
            drafts = propose([(state, history, context, room)])[0]
            if guide is not None and drafts:
                drafts = drafts[:guide.constraint.valid_prefix(drafts)]
            rows = len(unfed) + len(drafts)
            if out.shape[0] < rows:
                out = np.empty((rows, llm.n_vocab), dtype=np.float32)
            n0 = len(session)
            step = Step()
            step.add(seq, unfed + drafts, LOGITS_ALL if drafts else LOGITS_LAST)
            ts = time.perf_counter()
            with llm._engine_lock:
                pool.reserve(seq, rows)
                got = step.run(llm._engine, pool, out=out)[0]
            covered = len(history)
            if drafts:
                pending, taken = state.verify(sampler, got[len(unfed) - 1:], history, drafts, guide=guide, eog=eog)
                keep = n0 + len(unfed) + taken
                covered += taken
                with llm._engine_lock:
                    held = seq.tokens[:keep]
                    if not pool.truncate(seq, keep):  # (not within KVPool's sliding-window margin)
                        pool.clear(seq)
                        session._feed(held, logits=LOGITS_NONE)
            elif guide is None:
                pending = [sampler.sample(got, history)]
            else:
                pending = [guide.sample(sampler, got, history)]
            t_end = time.perf_counter()
            state.costs.observe(rows, t_end - ts)
            if spec.adaptive:
                state.observe_step(t_end - t_step, len(drafts), len(pending))
        if stats.stop_reason != "stop":
            tail, stopped = checker.feed(detok.flush())
            if not stopped:
                tail += checker.flush()
            if tail:
                yield tail
    finally:
        stats.decode_seconds = time.perf_counter() - t1
        stats.draft_tokens, stats.accepted_tokens, stats.verify_steps = state.drafted, state.accepted, state.steps
        if guide is not None:
            stats.forced_tokens = guide.forced
        state.close()
