"""INTERIM single-stream backend for `edgellm serve`, used only until the batched engine lands.

It offers the BatchEngine interface the server is written against (submit / Request / events /
cancel / stats, see the batched engine's design) over one `LLM.session()`, running the requests
one at a time in arrival order on its own thread. Nothing here batches, forks or caches
prefixes: it exists so the HTTP layer can be built and tested now, and is deleted when the
server switches to the real BatchEngine.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..errors import ContextOverflowError, EdgeLLMError
from ..sampling import Sampler, SamplingParams, StopChecker

KV_BLOCK_TOKENS = 16  # the unit stats() counts the running sequence's KV in


class QueueFullError(EdgeLLMError):
    """max_queue requests are already waiting (the batched engine's errors module will own this)."""


class Event(NamedTuple):
    text: str  # may be "" (held back for a stop string or an incomplete UTF-8 character)
    token: int
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None


class Usage(NamedTuple):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass
class Times:
    submitted: float
    first_token: float | None = None
    finished: float | None = None


class Request:
    def __init__(self, engine: "InterimSingleStreamEngine", ids: list[int], max_tokens: int, sampling: SamplingParams,
                 stop: list[str], logprobs: int | None, logit_bias: dict[int, float] | None, on_event):
        self._engine = engine
        self.prompt_ids = ids
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.stop = stop
        self.logprobs = logprobs
        self.logit_bias = logit_bias
        self._on_event = on_event
        self._events: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._cancelled = threading.Event()
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self.usage = Usage(len(ids), 0, 0)
        self.times = Times(time.monotonic())

    def cancel(self) -> None:
        self._cancelled.set()
        self._engine._wake()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __iter__(self):
        while True:
            with self._cond:
                while not self._events:
                    self._cond.wait()
                ev = self._events.popleft()
            if ev is None:
                return
            yield ev

    # -- engine thread --
    def _push(self, ev: Event | None) -> None:
        with self._cond:
            self._events.append(ev)
            self._cond.notify_all()
        if self._on_event is not None:
            self._on_event(self, ev)

    def _finish(self, reason: str, error: BaseException | None = None) -> None:
        self.finish_reason = reason
        self.error = error
        self.times.finished = time.monotonic()
        self._push(None)  # None after the last event: the request is over


class InterimSingleStreamEngine:
    """One request at a time over one session; `max_seqs` is accepted and reported, never used."""

    def __init__(self, llm, *, max_seqs: int = 1, max_queue: int | None = None, **_batch_options):
        self.llm = llm
        self.max_seqs = max_seqs
        self.max_queue = max_queue
        self._session = llm.session()
        self._waiting: collections.deque[Request] = collections.deque()
        self._running: Request | None = None
        self._cv = threading.Condition()
        self._closed = False
        self._steps = 0
        self._thread: threading.Thread | None = None

    # -- the BatchEngine interface --
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="edgellm-interim-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: Sequence[int], *, max_tokens: int = 128, sampling: SamplingParams | None = None,
               stop: Sequence[str] | None = None, logprobs: int | None = None,
               logit_bias: dict[int, float] | None = None, n: int = 1,
               on_event: Callable | None = None):
        ids = self.llm._check_ids(prompt_ids)
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) > self.llm.n_ctx:
            raise ContextOverflowError(f"the prompt has {len(ids)} tokens; the context holds {self.llm.n_ctx}")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        sampling = sampling or SamplingParams()
        reqs = []
        for i in range(n):  # the forks of n > 1 get seeds seed, seed + 1, ... (a fixed seed stays reproducible)
            params = sampling
            if i and sampling.seed is not None:
                params = SamplingParams(**{**sampling.__dict__, "seed": sampling.seed + i})
            reqs.append(Request(self, ids, max_tokens, params, [s for s in (stop or []) if s], logprobs,
                                logit_bias, on_event))
        with self._cv:
            if self._closed:
                raise RuntimeError("the engine is closed")
            if self.max_queue is not None and len(self._waiting) + n > self.max_queue:
                raise QueueFullError(f"{len(self._waiting)} requests are waiting (the queue holds {self.max_queue})")
            self._waiting.extend(reqs)
            self._cv.notify_all()
        return reqs if n > 1 else reqs[0]

    def cancel(self, req: Request) -> None:
        req.cancel()

    def stats(self) -> dict:
        running = self._running
        used = math.ceil(len(self._session) / KV_BLOCK_TOKENS) if running is not None else 0
        return {"running": int(running is not None), "waiting": len(self._waiting), "kv_blocks_used": used,
                "kv_blocks_total": math.ceil(self.llm.n_ctx / KV_BLOCK_TOKENS), "kv_block_tokens": KV_BLOCK_TOKENS,
                "prompt_tokens_cached": 0, "steps": self._steps}

    def close(self) -> None:
        with self._cv:
            self._closed = True
            running = self._running
            self._cv.notify_all()
        if running is not None:
            running.cancel()
        if self._thread is not None:
            self._thread.join()
        while self._waiting:
            self._waiting.popleft()._finish("cancelled")

    # -- the engine thread --
    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                req = self._running = self._waiting.popleft()
            try:
                if req._cancelled.is_set():
                    req._finish("cancelled")
                else:
                    req._finish(self._generate(req))
            except Exception as exc:  # noqa: BLE001 - reported to the request's owner
                req._finish("error", exc)
            finally:
                self._session.reset()  # the sequence's KV is free
                self._running = None

    def _generate(self, req: Request) -> str:
        llm, s = self.llm, self._session
        tok_ = llm.tokenizer
        sampler = Sampler(req.sampling, llm.n_vocab)
        detok = tok_.streaming_decoder()
        checker = StopChecker(req.stop)
        s.reset()
        logits = s.feed(req.prompt_ids)
        self._steps += 1
        history = list(req.prompt_ids)
        bias_ids = np.array(list((req.logit_bias or {}).keys()), dtype=np.int64)
        bias = np.array(list((req.logit_bias or {}).values()), dtype=np.float32)
        generated = 0
        while generated < req.max_tokens:
            if req._cancelled.is_set():
                return "cancelled"
            if bias_ids.size:
                logits[bias_ids] += bias
            tok = sampler.sample(logits, history)
            if tok_.is_eog(tok):
                break
            generated += 1
            req.usage = Usage(len(req.prompt_ids), generated, 0)
            if req.times.first_token is None:
                req.times.first_token = time.monotonic()
            history.append(tok)
            text, stopped = checker.feed(detok.add(tok))
            lp, top = _logprobs(logits, tok, req.logprobs)
            req._push(Event(text, tok, lp, top))
            if stopped:
                return "stop"
            if generated >= req.max_tokens or len(s) >= s.n_ctx:
                break
            logits = s.feed([tok])
            self._steps += 1
        tail, stopped = checker.feed(detok.flush())
        tail += "" if stopped else checker.flush()
        if tail:  # text held back until the end: no token of its own
            req._push(Event(tail, -1, None, None))
        return "length" if generated >= req.max_tokens or len(s) >= s.n_ctx else "stop"


def _logprobs(logits: np.ndarray, tok: int, k: int | None):
    if k is None:
        return None, None
    x = logits.astype(np.float64)
    m = x.max()
    lse = m + math.log(np.exp(x - m).sum())
    top = None
    if k > 0:
        best = np.argpartition(-x, k)[:k] if k < x.shape[0] else np.arange(x.shape[0])
        best = best[np.lexsort((best, -x[best]))]
        top = [(int(i), float(x[i] - lse)) for i in best]
    return float(x[tok] - lse), top
