"""Choosing the next token: logit processors, then a seeded draw; and stop strings over streamed text.

The chain follows llama.cpp's common sampler (src/llama-sampler.cpp, common/sampling.cpp) in its
default order:

    penalties -> top_k -> top_p -> min_p -> temperature -> draw from the softmax

so top_p and min_p judge probabilities at temperature 1, and temperature only reshapes what they
kept. Temperature 0 means greedy: argmax of the penalized logits, no random numbers used.

Each step is a plain function. The filters map a candidate set, ``Candidates(ids, logits)``, to a
subset, and touch the whole vocabulary only with O(n) vectorized passes (max, exp, partition,
masks); only top_p sorts, and only a pool of best tokens big enough to hold its nucleus. Ties
are always broken by position, never by sort internals, so a seed fixes the outcome.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from .rng import Pcg64, fresh_seed

# Defaults as llama.cpp's common_params_sampling (common/common.h).
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05
DEFAULT_REPEAT_PENALTY = 1.0
DEFAULT_REPEAT_LAST_N = 64

# top_p looks for its nucleus among the best 256 tokens first (llama.cpp's top_p tries the same
# 256 on large vocabularies), then among 8x as many at a time, before sorting everything.
_TOP_P_FIRST_POOL = 256
_TOP_P_POOL_GROWTH = 8
# draw() walks the candidates' probabilities in blocks of this many
_DRAW_BLOCK = 1024
# top_k on a large set first narrows it by column maxima over this many rows (_top_k_contenders),
# when there are at least this many columns per token kept
_TOP_K_ROWS = 64
_TOP_K_MIN_COLUMNS = 4


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to choose tokens. ``temperature=0`` is greedy; ``top_k<=0``, ``top_p=1`` and ``min_p=0``
    switch those filters off; ``repeat_last_n=0`` switches penalties off, ``-1`` looks at the whole
    history. ``seed=None`` draws a fresh random seed."""

    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    min_p: float = DEFAULT_MIN_P
    repeat_penalty: float = DEFAULT_REPEAT_PENALTY
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("top_k", "repeat_last_n"):
            value = getattr(self, name)
            if not _is_int(value):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p}")
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty must be > 0 (1 disables it), got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise ValueError(
                f"repeat_last_n must be >= -1 (-1: whole history, 0: no penalties), got {self.repeat_last_n}"
            )
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# ---------------------------------------------------------------------------------------------
# logit processors


def apply_penalties(
    logits: np.ndarray,
    history: Sequence[int],
    *,
    repeat_penalty: float = 1.0,
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
) -> np.ndarray:
    """Penalize the tokens seen in the last ``repeat_last_n`` ids of ``history`` (-1: all of it).

    As llama.cpp's penalties sampler: a seen token's logit is divided by ``repeat_penalty`` when
    positive and multiplied by it when <= 0, then lowered by ``count * frequency_penalty +
    presence_penalty`` (count = occurrences in the window). Returns a new array when anything
    changes; ``logits`` itself is never modified."""
    disabled = repeat_penalty == 1.0 and frequency_penalty == 0.0 and presence_penalty == 0.0
    if disabled or repeat_last_n == 0 or len(history) == 0:
        return logits
    window = history if repeat_last_n < 0 else history[-repeat_last_n:]
    ids = np.asarray(window)
    if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
        raise ValueError("history must be a sequence of integer token ids")
    if ids.size == 0:
        return logits
    if ids.min() < 0 or ids.max() >= logits.shape[0]:
        bad = ids[(ids < 0) | (ids >= logits.shape[0])][0]
        raise ValueError(f"history holds token id {int(bad)}, outside the vocabulary [0, {logits.shape[0]})")
    tokens, counts = np.unique(ids, return_counts=True)
    seen = logits[tokens]
    seen = np.where(seen <= 0, seen * repeat_penalty, seen / repeat_penalty)
    seen = seen - (counts * frequency_penalty + presence_penalty)
    out = logits.copy()
    out[tokens] = seen
    return out


# ---------------------------------------------------------------------------------------------
# candidate filters: (ids, logits) -> (ids, logits), a subset


class Candidates(NamedTuple):
    ids: np.ndarray  # (n,) int64 token ids
    logits: np.ndarray  # (n,) float32 logits of those ids


def all_candidates(logits: np.ndarray) -> Candidates:
    """The whole vocabulary."""
    return Candidates(np.arange(logits.shape[0], dtype=np.int64), logits)


def top_k(c: Candidates, k: int) -> Candidates:
    """The ``k`` largest logits, in their original order; ``k <= 0`` or ``k >= n`` keeps
    everything. Among tokens tied at the cut, the earliest are kept."""
    n = c.ids.shape[0]
    if k <= 0 or k >= n:
        return c
    if _narrows(n, k):
        pos = _top_k_contenders(c.logits, k)
        c = Candidates(c.ids[pos], c.logits[pos])
    return _top_k_among(c, k)


def _narrows(n: int, k: int) -> bool:
    """Whether top_k over n tokens first narrows them to contenders (0 < k < n)."""
    return n // _TOP_K_ROWS >= _TOP_K_MIN_COLUMNS * k


def _top_k_among(c: Candidates, k: int) -> Candidates:
    """top_k once c holds the k best and their ties (the contenders, or everything)."""
    n = c.ids.shape[0]
    cut = np.partition(c.logits, n - k)[n - k]  # O(n) selection: the k-th largest value
    best = np.flatnonzero(c.logits >= cut)
    extra = best.shape[0] - k
    if extra > 0:  # more ties at the cut than slots: drop the latest of them
        tied = np.flatnonzero(c.logits[best] == cut)
        best = np.delete(best, tied[-extra:])
    return Candidates(c.ids[best], c.logits[best])


def _top_k_contenders(x: np.ndarray, k: int) -> np.ndarray:
    """The positions in x (int64, ascending) of the logits at least a floor no larger than the
    k-th largest: all k best and their ties, usually a few thousand of a large vocabulary.

    The logits are laid out as _TOP_K_ROWS rows and each column's maximum taken (one pass, vectorized
    across columns). The k-th largest of those maxima is the floor: k columns reach it, so at
    least k logits do, so the k-th largest logit is at least the floor. Selecting among the
    column maxima and the few columns that reach the floor costs a small fraction of
    np.partition over the whole vocabulary (about 0.1 ms instead of 1-4 ms on Gemma's 262k)."""
    cols = x.shape[0] // _TOP_K_ROWS
    body = cols * _TOP_K_ROWS
    grid = x[:body].reshape(_TOP_K_ROWS, cols)  # column j: logits j, cols + j, 2 cols + j, ...
    col_max = grid.max(axis=0)
    tail = x[body:]  # fewer than _TOP_K_ROWS logits, each its own column
    maxima = np.concatenate((col_max, tail))
    floor = np.partition(maxima, maxima.shape[0] - k)[maxima.shape[0] - k]
    hit = np.flatnonzero(col_max >= floor)
    rows, j = np.nonzero(grid[:, hit] >= floor)
    idx = np.concatenate((rows * cols + hit[j], body + np.flatnonzero(tail >= floor)))
    idx.sort()
    return idx


def _contenders_of_rows(x: np.ndarray, members: list[int], k: int) -> list[Candidates]:
    """top_k's contenders of all_candidates(x[r]) for each row r of members, exactly (the
    same floors: an order statistic has one value), with the column maxima of all of x's rows
    taken in one numpy call and the floors in another, instead of one of each per row."""
    n = x.shape[1]
    cols = n // _TOP_K_ROWS
    body = cols * _TOP_K_ROWS
    grid = x[:, :body].reshape(x.shape[0], _TOP_K_ROWS, cols)  # (a view when n is a multiple of 64)
    col_max = grid.max(axis=1)
    tail = x[:, body:]
    maxima = np.concatenate((col_max[members], tail[members]), axis=1)
    m = maxima.shape[1]
    floors = np.partition(maxima, m - k, axis=1)[:, m - k]
    out = []
    for r, floor in zip(members, floors):
        hit = np.flatnonzero(col_max[r] >= floor)
        rr, j = np.nonzero(grid[r][:, hit] >= floor)
        idx = np.concatenate((rr * cols + hit[j], body + np.flatnonzero(tail[r] >= floor)))
        idx.sort()
        out.append(Candidates(idx, x[r][idx]))  # a whole row: token ids are positions
    return out


def sample_rows(samplers: list, x: np.ndarray, rows: list[int], histories: list) -> list:
    """[samplers[i].sample(x[rows[i]], histories[i]) for each i]: the same tokens (and random
    draws), with the passes over the vocabulary made once for all rows where they can be. Rows
    whose sampler draws (temperature > 0) with no penalties and a top_k that narrows, and whose
    logits are finite, share one call each for the maxima, the minima and the top-k contenders
    (_contenders_of_rows); the rest are sampled one by one. x: float32 [rows, n_vocab] (the
    step's logits; the rows between the first and the last of `rows` are read). A row whose
    sampler raises ValueError gets the exception in its place."""
    out: list = [None] * len(rows)
    if len(rows) > 1 and x.dtype == np.float32 and x.ndim == 2:
        lo = min(rows)
        xs = x[lo:max(rows) + 1]
        best, worst = xs.max(axis=1), xs.min(axis=1)
        finite = np.isfinite(best) & np.isfinite(worst)
        groups: dict[int, list[int]] = {}  # top_k -> positions in rows
        for i, s in enumerate(samplers):
            if finite[rows[i] - lo] and s._batchable(x.shape[1], histories[i]):
                groups.setdefault(s.params.top_k, []).append(i)
        for k, members in groups.items():
            if len(members) > 1:
                cands = _contenders_of_rows(xs, [rows[i] - lo for i in members], k)
                for i, c in zip(members, cands):
                    out[i] = samplers[i]._draw_top_k(c)
    for i, s in enumerate(samplers):
        if out[i] is None:
            try:
                out[i] = s.sample(x[rows[i]], histories[i])
            except ValueError as exc:
                out[i] = exc
    return out


def _softmax_weights(logits: np.ndarray) -> np.ndarray:
    """exp(logit - max): unnormalized probabilities in (0, 1], -inf -> 0. Float32 like the logits
    (half the memory traffic of float64); callers accumulate sums in float64."""
    w = logits - logits.max()
    return np.exp(w, out=w)


def probabilities(c: Candidates) -> np.ndarray:
    """The distribution a draw from candidates c follows, float64 (speculative decoding's
    acceptance rule compares such distributions)."""
    w = np.exp(c.logits.astype(np.float64) - float(np.max(c.logits)))
    return w / w.sum()


def _best_first(logits: np.ndarray) -> np.ndarray:
    """Indices ordering float32 ``logits`` (no NaN) from largest to smallest, ties by index.

    One in-place sort of 64-bit keys instead of a two-key lexsort (about 8x faster on 256k
    values): the high half is the float's bits mapped so that unsigned order is descending value
    order (IEEE 754 floats order like sign-magnitude integers), the low half is the index."""
    bits = (logits + np.float32(0)).view(np.uint32)  # a copy; + 0 turns -0.0 into +0.0
    # non-negative: flip the 31 value bits (bigger value -> smaller key, sign bit 0 sorts first);
    # negative: keep (bigger magnitude -> bigger key, sign bit 1 sorts after the non-negatives)
    bits ^= (np.uint32(1) - (bits >> np.uint32(31))) * np.uint32(0x7FFFFFFF)
    keys = bits.astype(np.uint64)
    keys <<= np.uint64(32)
    keys |= np.arange(logits.shape[0], dtype=np.uint64)
    keys.sort()
    return keys.astype(np.uint32)  # the low halves: indices


def top_p(c: Candidates, p: float, *, mass: float | None = None) -> Candidates:
    """Nucleus: the fewest best tokens whose probabilities (softmax over ``c``) sum to >= ``p``.
    Returned sorted, best first (ties by original order). ``p >= 1`` keeps everything.

    ``mass``: when ``c`` is the best part of a larger set (what min_p keeps of it), the larger
    set's sum of exp(logit - max), so probabilities are those of the larger set."""
    n = c.ids.shape[0]
    if p >= 1.0 or n <= 1:
        return c
    w = _softmax_weights(c.logits)
    target = p * (w.sum(dtype=np.float64) if mass is None else mass)
    # Sort only a pool of the best tokens (the best `size`, with all ties of the last) that holds
    # the nucleus, trying size = 256, 2048, ... A float32 dot product estimates a pool's mass so
    # pools too light are skipped unsorted; the float64 running sum has the last word.
    size = _TOP_P_FIRST_POOL
    while True:
        if size >= n:
            pool = np.arange(n)
        else:
            floor = np.partition(w, n - size)[n - size]
            inside = w >= floor
            if np.dot(w, inside) < target:
                size *= _TOP_P_POOL_GROWTH
                continue
            pool = np.flatnonzero(inside)
        order = pool[_best_first(c.logits[pool])]
        cum = np.cumsum(w[order].astype(np.float64))
        if cum[-1] >= target or pool.shape[0] == n:
            break
        size *= _TOP_P_POOL_GROWTH
    # the first position whose running sum reaches the target is the last one kept
    keep = min(int(np.searchsorted(cum, target, side="left")) + 1, order.shape[0])
    chosen = order[:keep]
    return Candidates(c.ids[chosen], c.logits[chosen])


def min_p(c: Candidates, p: float) -> Candidates:
    """Keep tokens whose probability is at least ``p`` times the best one's, i.e. logit >=
    max + ln(p) (llama.cpp's min_p). Always keeps the best token; ``p <= 0`` keeps everything."""
    if p <= 0.0 or c.ids.shape[0] <= 1:
        return c
    keep = c.logits >= c.logits.max() + math.log(p)
    return Candidates(c.ids[keep], c.logits[keep])


def apply_temperature(c: Candidates, temperature: float) -> Candidates:
    """Divide logits by ``temperature`` (> 0), shifted first so the best is 0: the softmax is
    the same, and a tiny temperature sends logits to -inf instead of overflowing to +inf."""
    return Candidates(c.ids, (c.logits - c.logits.max()) / np.float32(temperature))


def draw(c: Candidates, rng: Pcg64) -> int:
    """One token from the softmax of the candidates, by inverse CDF of one uniform draw over the
    candidates in their given order (deterministic, so a seed fixes the outcome).

    Two levels, so no running sum spans the whole vocabulary (that alone costs ~1-2 ms at 256k):
    pick a block of _DRAW_BLOCK candidates by the running sums of block masses, then the token
    inside it by its own running sum."""
    w = _softmax_weights(c.logits)
    starts = np.arange(0, w.shape[0], _DRAW_BLOCK)
    block_mass = np.add.reduceat(w, starts, dtype=np.float64)
    block_cum = np.cumsum(block_mass)
    r = rng.random() * block_cum[-1]
    b = int(np.searchsorted(block_cum, r, side="right"))
    if b >= starts.shape[0]:  # r rounded up to the total: the last block with mass
        b = int(np.flatnonzero(block_mass)[-1])
    r -= block_cum[b - 1] if b else 0.0
    seg = w[starts[b] : starts[b] + _DRAW_BLOCK]  # a block with mass > 0, as r fell inside it
    i = int(np.searchsorted(np.cumsum(seg.astype(np.float64)), r, side="right"))
    if i >= seg.shape[0]:  # rounding again: the last token of the block with weight
        i = int(np.flatnonzero(seg)[-1])
    return int(c.ids[starts[b] + i])


# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _vocab_ids(n_vocab: int) -> np.ndarray:
    """0 .. n_vocab - 1, one read-only array for the samplers that keep whole vocabularies (no
    top-k: 2 MB for Gemma's 262k, made once instead of on every draw); the others never make it."""
    ids = np.arange(n_vocab, dtype=np.int64)
    ids.flags.writeable = False
    return ids


class Sampler:
    """Chooses token ids from logits with ``params``; owns its random generator (numpy's PCG64
    stream, `rng.Pcg64`), so the same seed, logits and history give the same ids."""

    def __init__(self, params: SamplingParams, n_vocab: int):
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if not _is_int(n_vocab) or n_vocab <= 0:
            raise ValueError(f"n_vocab must be a positive integer, got {n_vocab!r}")
        self.params = params
        self.n_vocab = int(n_vocab)
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        """Restart the random stream from ``seed``, else from ``params.seed``, else a fresh random
        seed (kept in ``self.seed`` so a run can be repeated)."""
        if seed is None:
            seed = self.params.seed
        if seed is None:
            seed = fresh_seed()
        elif not _is_int(seed) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
        self.seed = int(seed)
        self._rng = Pcg64(self.seed)

    def _check_logits(self, logits) -> np.ndarray:
        x = np.asarray(logits)
        if x.shape != (self.n_vocab,):
            raise ValueError(f"logits must have shape ({self.n_vocab},), got {x.shape}")
        if not np.issubdtype(x.dtype, np.floating):
            raise ValueError(f"logits must be floating point, got dtype {x.dtype}")
        return x if x.dtype == np.float32 else x.astype(np.float32)

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """Next token id in [0, n_vocab) given this step's logits and the ids so far (prompt and
        generated, the window penalties look at)."""
        x, best = self._penalized(logits, history)
        if self.params.greedy:
            return int(np.argmax(x))  # first of the tied maxima, as llama.cpp's greedy
        return draw(self._filtered(x, best), self._rng)

    @property
    def rng(self) -> Pcg64:
        """The generator draws come from (speculative decoding's acceptance tests use it too)."""
        return self._rng

    def candidates(self, logits: np.ndarray, history: Sequence[int]) -> Candidates:
        """What sample() draws from (temperature > 0): the tokens the filters keep and their
        logits after temperature, whose softmax is the distribution of the draw."""
        return self._filtered(*self._penalized(logits, history))

    def _penalized(self, logits, history) -> tuple[np.ndarray, np.float32]:
        """The logits after penalties, and their maximum (the filters reuse it: one pass fewer
        over the vocabulary)."""
        p = self.params
        x = apply_penalties(
            self._check_logits(logits),
            history,
            repeat_penalty=p.repeat_penalty,
            repeat_last_n=p.repeat_last_n,
            frequency_penalty=p.frequency_penalty,
            presence_penalty=p.presence_penalty,
        )
        best = x.max()
        if np.isnan(best):
            raise ValueError("logits contain NaN")
        if best == -np.inf:
            raise ValueError("every logit is -inf: no token can be chosen")
        return x, best

    def _top_k_skips_masked(self, x: np.ndarray) -> bool:
        """Whether top-k over all of ``x`` keeps exactly what it keeps over the tokens not at
        -inf: when at least k tokens are live, the k best are all live, in the same order. Only
        taken when few are masked (a logit_bias banning some tokens), where gathering the live
        ones (two 262k-entry copies on Gemma) costs more than the whole filter chain."""
        k, n = self.params.top_k, x.shape[0]
        if k <= 0:
            return False
        masked = int(np.count_nonzero(x == -np.inf))
        return 2 * masked < n and n - masked >= k

    def _filtered(self, x: np.ndarray, best) -> Candidates:
        p = self.params
        if best == np.inf:  # +inf tokens take all the probability, shared equally
            x = np.where(x == np.inf, np.float32(0), np.float32(-np.inf))
        # The whole vocabulary's token ids are positions in x: the candidates a filter keeps take
        # theirs from where they are, with no vocabulary-sized id array (2 MB on Gemma's 262k).
        if x.min() == -np.inf and not self._top_k_skips_masked(x):
            # masked logits (a grammar's mask): the filters run on the tokens left. The draw is
            # the same (a -inf token weighs 0), and np.partition over a vocabulary of equal -inf
            # values is ~16x slower (9 ms instead of 0.6 on Gemma's 262k).
            live = np.flatnonzero(x != -np.inf)
            c = Candidates(live, x[live])
        elif 0 < p.top_k < x.shape[0] and _narrows(x.shape[0], p.top_k):  # top_k's steps over all of x
            pos = _top_k_contenders(x, p.top_k)
            return self._nucleus(_top_k_among(Candidates(pos, x[pos]), p.top_k))
        else:  # no top-k cut: the filters keep ids of the whole vocabulary
            c = Candidates(_vocab_ids(x.shape[0]), x)
        return self._nucleus(top_k(c, p.top_k))

    def _batchable(self, n_vocab: int, history) -> bool:
        """Whether sample() on finite float32 logits of this vocabulary is _draw_top_k of their
        top-k contenders: a draw, no penalties, a top_k that narrows (sample_rows)."""
        p = self.params
        no_penalties = (p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0) \
            or p.repeat_last_n == 0 or len(history) == 0
        return (not p.greedy and no_penalties and n_vocab == self.n_vocab and 0 < p.top_k < n_vocab
                and _narrows(n_vocab, p.top_k))

    def _draw_top_k(self, contenders: Candidates) -> int:
        """sample()'s token given the top-k contenders of its logits (sample_rows)."""
        return draw(self._nucleus(_top_k_among(contenders, self.params.top_k)), self._rng)

    def _nucleus(self, c: Candidates) -> Candidates:
        """min_p and top_p, then temperature: the filters after top_k."""
        p = self.params
        if p.min_p > 0 and p.top_p < 1:
            # min_p(top_p(c)): both keep a best-first prefix of c, so this is the shorter prefix,
            # found faster by cutting with min_p first (one mask) and running top_p on the few
            # tokens left, with the probabilities of all of c.
            mass = _softmax_weights(c.logits).sum(dtype=np.float64)
            c = top_p(min_p(c, p.min_p), p.top_p, mass=mass)
        else:
            c = min_p(top_p(c, p.top_p), p.min_p)
        return apply_temperature(c, p.temperature)


# ---------------------------------------------------------------------------------------------
# stop strings over streamed text


class StopMatch(NamedTuple):
    safe: int  # text[:safe] can be shown now (all of it is final when stopped)
    stopped: bool  # a stop string occurs at text[safe:]


def find_stop(text: str, stops: Sequence[str]) -> StopMatch:
    """Where ``text`` must end for ``stops``: at the earliest stop string if one occurs (stopped),
    else before the longest tail of ``text`` that could still grow into a stop string."""
    first = -1
    for s in stops:
        i = text.find(s)
        if i >= 0 and (first < 0 or i < first):
            first = i
    if first >= 0:
        return StopMatch(first, True)
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:n]):
                hold = n
                break
    return StopMatch(len(text) - hold, False)


class StopChecker:
    """Feed streamed text pieces; get back the text that is safe to show. Text that might be the
    start of a stop string is held back until it is ruled out (or the stream ends: ``flush``)."""

    def __init__(self, stops: Sequence[str] = ()):
        if isinstance(stops, str):
            raise ValueError("stops must be a list of strings, not a single string")
        stops = list(stops)
        for s in stops:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty str, got {s!r}")
        self.stops = stops
        self.stopped = False
        # Not yet shown. Nothing shown can begin a stop string: a shown tail that was a prefix of
        # one would have been held back, so searching the pending text alone suffices.
        self._pending = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add a piece; return (text to show now, whether a stop string was reached). After a
        stop, the text before it has been returned and further pieces are ignored."""
        if self.stopped:
            return "", True
        self._pending += piece
        safe, self.stopped = find_stop(self._pending, self.stops)
        out, self._pending = self._pending[:safe], ("" if self.stopped else self._pending[safe:])
        return out, self.stopped

    def flush(self) -> str:
        """The stream ended without a stop: release what was held back."""
        out, self._pending = self._pending, ""
        return out
