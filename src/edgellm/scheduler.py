"""Many sequences in one step: `BatchEngine`, the scheduler over one LLM's engine.

Each step packs the next token of every running request together with chunks of prompts still
being evaluated (chunked prefill under a per-step token budget, so a long new prompt does not
freeze the running streams), evaluates them in one engine call, and samples every request that
got logits with its own sampler, seed, stop strings and streaming detokenizer (mlx-lm's
BatchGenerator and vLLM's scheduler are the models).

    engine = BatchEngine(llm, max_seqs=16)
    engine.start()                                 # or drive it with engine.step()
    req = engine.submit(ids, max_tokens=64, sampling=SamplingParams(temperature=0))
    for ev in req:                                 # Event(text, token, logprob, top_logprobs)
        print(ev.text, end="")

A request's tokens are a function of its own prompt and sampling parameters only: the engine's
arithmetic is batch-invariant (csrc/engine.c), so at temperature 0 or with a seed a request
gives the same tokens alone or among 31 others, and after a preemption (its blocks given to
others, its tokens evaluated again later) as if it had never been interrupted.

KV memory: requests draw blocks from the LLM's pool (kv_cache.KVPool), limited to `kv_tokens`.
A new request starts from the longest indexed prefix (its system prompt, a previous turn, a
sibling's prompt); n > 1 completions of one prompt fork it after one evaluation. When the pool
is full, admission waits; when running requests cannot grow, the most recently admitted one is
preempted and recomputed later. Submitting and cancelling are safe from any thread.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from .batch import LOGITS_ALL, LOGITS_LAST, LOGITS_NONE, Step, logits_group_rows
from .errors import ContextOverflowError, EdgeLLMError
from .kv_cache import BLOCK, SWA_MARGIN, KVCacheFullError
from .sampling import Sampler, SamplingParams, StopChecker, sample_rows
from .speculative import SpecState, costs_for
from .speculative import propose as propose_drafts
from .speculative import resolve as resolve_speculative
from .weights import mem_available

_ENGINE_DEFAULT = object()  # submit(speculative=): the engine's setting
DEFAULT_MAX_SEQS = 16
DEFAULT_MAX_TOKENS = 256
MAX_TOP_LOGPROBS = 20  # as OpenAI's API
# a step's wall time, in the order it runs: cancellations, admissions and planning; filling the
# batch arrays and committing slots; the engine call (C, the GIL released); logit_bias and the
# samplers; the rest of handling each new token (detokenizing, stop strings, events to listeners;
# speculative rows' verification)
STEP_PHASES = ("schedule", "batch", "decode", "sample", "emit")


class QueueFullError(EdgeLLMError):
    """The engine's queue of waiting requests is full (try again later)."""


@dataclass(frozen=True, slots=True)  # (slots: 64 bytes an event, not 350; a request queues one per token)
class Event:
    """One generated token (token None: the text held back until the end, at the finish)."""

    text: str
    token: int | None
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache
    draft_tokens: int = 0     # speculative decoding: draft tokens verified
    accepted_tokens: int = 0  # of them, taken

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Times:
    submitted: float = 0.0
    first_token: float | None = None
    finished: float | None = None


_DONE = object()


class Request:
    """A submitted completion: iterate it for its events (blocking), or give submit() an
    on_event callback (called on the engine's thread; then the events are not also queued for
    iteration, which ends at once when the request is done)."""

    _ids = itertools.count(1)

    def __init__(self, engine: "BatchEngine", prompt: list[int], *, max_tokens: int | None,
                 sampling: SamplingParams, stop: Sequence[str], logprobs: int | None,
                 logit_bias: dict[int, float] | None, on_event: Callable | None, grammar=None,
                 preserved: frozenset[int] = frozenset()):
        self.id = next(self._ids)
        self.engine = engine
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.logprobs = logprobs
        self.logit_bias = logit_bias
        self._bias = None  # logit_bias as arrays (ids, biases): x[ids] += biases adds each as `x[tok] += bias` would
        if logit_bias:
            values = list(logit_bias.values())
            self._bias = (np.fromiter(logit_bias, dtype=np.int64, count=len(values)),
                          np.array(values, dtype=np.result_type(np.float32, *values)))
        self.on_event = on_event
        llm = engine.llm
        self.sampler = Sampler(sampling, llm.n_vocab)
        self.guide = None  # constrain.Guide: samples under the grammar, appends what it forces
        if grammar is not None:
            from .constrain import Guide

            # jump-forward appends tokens the model never scores: not when their log-probs are asked for
            self.guide = Guide(grammar.constraint(llm.tokenizer), jump_forward=logprobs is None)
        self.detok = llm.tokenizer.streaming_decoder(preserved=preserved)
        self.checker = StopChecker(list(stop))
        self.history: list[int] = list(prompt)  # what the KV must hold before the next sample
        self.generated: list[int] = []
        self.seq = None
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self.usage = Usage(prompt_tokens=len(prompt))
        self.times = Times(submitted=time.monotonic())
        self.group: list[Request] | None = None  # n > 1: the siblings forked after the prompt
        self.leader: Request | None = None       # for a sibling: the request it forks from
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._cancel = False
        self._admitted = 0  # admission order (preemption takes the latest)
        self.ignore_eos = False
        self.spec: SpecState | None = None  # speculative decoding (submit(speculative=))
        self._draft: list[int] = []        # the drafts in the current step
        self.text = ""

    # -- for users --

    def __iter__(self) -> Iterator[Event]:
        while True:
            ev = self._events.get()
            if ev is _DONE:
                self._events.put(_DONE)  # a second iteration, or result() after one, ends too
                return
            yield ev

    def cancel(self) -> None:
        self.engine.cancel(self)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def result(self) -> str:
        """Wait for the end; the whole text."""
        for _ in self:
            pass
        if self.error is not None:
            raise self.error
        return self.text

    # -- for the engine --

    def _emit(self, ev: Event) -> None:
        self.text += ev.text
        if self.on_event is not None:
            self.on_event(self, ev)
        else:
            self._events.put(ev)

    def _finish(self, reason: str, error: BaseException | None = None) -> None:
        if self.finish_reason is not None:
            return
        if reason != "cancelled" and error is None:
            tail = ""
            if not self.checker.stopped:
                tail, stopped = self.checker.feed(self.detok.flush())
                if not stopped:
                    tail += self.checker.flush()
            if tail:
                self._emit(Event(tail, None))
        self.finish_reason = reason
        self.error = error
        self.times.finished = time.monotonic()
        if self.on_event is not None:
            self.on_event(self, None)
            # the callback's owner (the server's Submission) holds this request: without the
            # cycle, a finished request is freed when its last user lets go, not by a full
            # garbage collection much later (a soak grew the server's heap by ~6 MiB a minute)
            self.on_event = None
        self._events.put(_DONE)


class BatchEngine:
    """The scheduler over one LLM's engine (see the module docstring).

    max_seqs: requests decoded together at most; kv_tokens: KV tokens all requests may hold
    together (default: the LLM's n_ctx); step_tokens: tokens evaluated per step (default and
    maximum: the LLM's n_batch); prefix_cache: reuse indexed prefixes; max_queue: waiting
    requests accepted before submit() raises QueueFullError (None: no bound); speculative: the
    requests' default speculative decoding ("lookup", a draft model, a Speculative; None: off),
    which submit(speculative=) overrides per request (edgellm.speculative says how)."""

    def __init__(self, llm, *, max_seqs: int = DEFAULT_MAX_SEQS, kv_tokens: int | None = None,
                 step_tokens: int | None = None, prefix_cache: bool = True, max_queue: int | None = None,
                 speculative=None):
        if max_seqs <= 0:
            raise ValueError(f"max_seqs must be positive, got {max_seqs}")
        if kv_tokens is not None and kv_tokens < BLOCK:
            raise ValueError(f"kv_tokens must be at least {BLOCK}, got {kv_tokens}")
        if step_tokens is not None and step_tokens <= 0:
            raise ValueError(f"step_tokens must be positive, got {step_tokens}")
        if max_queue is not None and max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.llm = llm
        self.max_seqs = max_seqs
        self.step_tokens = min(step_tokens or llm.n_batch, llm.n_batch)
        self._logits_rows = logits_group_rows(llm.n_vocab)
        # a recurrent model's state is not in the blocks a prefix shares (kv_cache.KVPool): no prefix cache
        self.prefix_cache = prefix_cache and not llm._pool.recurrent
        self.max_queue = max_queue
        self.kv_tokens = kv_tokens or llm.n_ctx
        pool = llm._pool
        with llm._engine_lock:
            pool.limit_blocks = max(pool.limit_blocks or 0, -(-self.kv_tokens // BLOCK))
        self.speculative = self._speculative(speculative)
        self._lock = threading.Condition()
        self._waiting: list[Request] = []
        self._running: list[Request] = []
        self._admissions = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._step_lock = threading.Lock()
        self._closing = False
        self.steps = 0
        self.tokens_generated = 0
        self.preemptions = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self._decode_rows = 0  # rows of the planned step that decode (the rest: prompt chunks)
        self._spec_rows: list = []  # its speculating requests: (request, drafts, tokens generated before)
        # where steps' wall time went (ns, see STEP_PHASES); _sample_ns: this step's sampler calls
        self.phase_ns = dict.fromkeys(STEP_PHASES, 0)
        self._sample_ns = 0
        self._step_listeners: list[Callable[[], None]] = []
        self._stepping: int | None = None  # the thread running a step

    # -- the public interface --

    def submit(self, prompt: Sequence[int] | str, *, max_tokens: int | None = DEFAULT_MAX_TOKENS,
               sampling: SamplingParams | None = None, stop: Sequence[str] | str | None = None,
               logprobs: int | None = None, logit_bias: dict[int, float] | None = None, n: int = 1,
               on_event: Callable | None = None, ignore_eos: bool = False, grammar=None,
               speculative=_ENGINE_DEFAULT, preserved: frozenset[int] = frozenset()):
        """Queue a completion of prompt (text, or token ids as given); a Request, or a list of
        n Requests forked after one evaluation of the prompt when n > 1. ignore_eos: go on
        past end-of-generation tokens (as llama-server's ignore_eos; for benchmarks). grammar:
        a constrain.Grammar the completion follows (tokens it forces are evaluated in one
        batch); finish_reason "stop" when it is complete, "length" when cut short.
        speculative: this request's speculative decoding (default: the engine's; None: off);
        with a grammar, drafts are cut to what it allows and verified under it. preserved: ids of
        control tokens the text keeps (Tokenizer.preserved_ids: a chat format's markers)."""
        llm = self.llm
        ids = llm.tokenize(prompt) if isinstance(prompt, str) else llm._check_ids(prompt)
        if not ids:
            raise ValueError("the prompt is empty (and the model adds no BOS token)")
        if len(ids) > llm.n_ctx or len(ids) > self.kv_tokens:
            raise ContextOverflowError(f"the prompt has {len(ids)} tokens; the context holds "
                                       f"{min(llm.n_ctx, self.kv_tokens)}")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
            raise ValueError(f"max_tokens must be a non-negative integer or None, got {max_tokens!r}")
        if not isinstance(n, int) or not 1 <= n <= self.max_seqs:
            raise ValueError(f"n must be an integer in [1, {self.max_seqs}] (max_seqs), got {n!r}")
        if logprobs is not None and (not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}] or None, got {logprobs!r}")
        if logit_bias:
            for tok, bias in logit_bias.items():
                if not isinstance(tok, (int, np.integer)) or not 0 <= tok < llm.n_vocab:
                    raise ValueError(f"logit_bias: token id {tok!r} is outside the vocabulary [0, {llm.n_vocab})")
                if not isinstance(bias, (int, float)) or not math.isfinite(bias):
                    raise ValueError(f"logit_bias: the bias of token {tok} must be a finite number")
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
        sampling = sampling or SamplingParams()
        spec = self.speculative if speculative is _ENGINE_DEFAULT else self._speculative(speculative)
        reqs = []
        for i in range(n):
            params = sampling
            if i and sampling.seed is not None:  # siblings draw different samples, reproducibly
                params = SamplingParams(**{**sampling.__dict__, "seed": sampling.seed + i})
            reqs.append(Request(self, ids, max_tokens=max_tokens, sampling=params, stop=stops,
                                logprobs=logprobs, logit_bias=logit_bias, on_event=on_event, grammar=grammar,
                                preserved=preserved))
            reqs[-1].ignore_eos = bool(ignore_eos)
            if spec is not None:
                reqs[-1].spec = SpecState(llm, spec, params)
        if n > 1:
            for r in reqs:
                r.group = reqs
            for r in reqs[1:]:
                r.leader = reqs[0]
        if max_tokens == 0:  # nothing to generate: done at once
            for r in reqs:
                r.leader = None
                r._finish("length")
            return reqs[0] if n == 1 else reqs
        with self._lock:
            if self._closing:
                raise EdgeLLMError("the engine is closed")
            if self.max_queue is not None and len(self._waiting) + n > self.max_queue:
                raise QueueFullError(f"{len(self._waiting)} requests are waiting (max_queue {self.max_queue})")
            self._waiting.extend(reqs)
            self._lock.notify_all()
        return reqs[0] if n == 1 else reqs

    def cancel(self, req: Request) -> None:
        """Stop a request (from any thread): it ends with finish_reason "cancelled", and its KV
        blocks are free after the next step."""
        with self._lock:
            req._cancel = True
            self._lock.notify_all()

    def save_state(self, path, tokens: Sequence[int], meta=None) -> int:
        """Write the KV cache the prefix cache holds for tokens (a finished request's `history`:
        its prompt and what it generated) to path, in Session.save_state's format; meta: JSON-able
        data kept with it. Returns the tokens saved: the whole blocks of tokens still cached.
        Raises EdgeLLMError when none are (prefix_cache off, evicted, or never evaluated)."""
        from . import state

        ids = self.llm._check_ids(tokens)
        with self._cache_sequence("save_state") as seq:
            n = self.llm._pool.match_prefix(seq, list(ids) + [0])  # (+1: the last whole block of ids may match)
            if not n:
                raise EdgeLLMError(f"the prefix cache holds none of these {len(ids)} tokens' blocks")
            state.save(self.llm, seq, path, meta)
        return n

    def load_state(self, path):
        """Put a saved state (Session.save_state's or save_state's) into the prefix cache: a later
        request whose prompt starts with its tokens evaluates only the rest. Returns its meta;
        raises state.StateFileError for a file that is truncated, corrupt or of another model."""
        from . import state

        with self._cache_sequence("load_state") as seq:
            return state.load(self.llm, seq, path)

    @contextlib.contextmanager
    def _cache_sequence(self, what: str):
        """A cacheable sequence of the pool for the block, between steps; released after it (its
        whole blocks stay indexed, least recently used first to go)."""
        from . import state

        state.check_saveable(self.llm)  # a recurrent model: say why, not only that the prefix cache is off
        if not self.prefix_cache:
            raise EdgeLLMError(f"{what} needs the prefix cache (BatchEngine(prefix_cache=True))")
        llm = self.llm
        with self._step_lock, llm._engine_lock:
            seq = llm._pool.new_sequence(cacheable=True)
            try:
                yield seq
            finally:
                llm._pool.release(seq)

    def stats(self) -> dict:
        pool = self.llm._pool
        with self._lock:
            running, waiting = len(self._running), len(self._waiting)
        return dict(running=running, waiting=waiting, kv_blocks_used=pool.blocks_in_use(),
                    kv_blocks_cached=pool.blocks_cached(), kv_blocks_total=pool.limit_blocks,
                    kv_block_tokens=BLOCK, prompt_tokens_cached=pool.hits, steps=self.steps,
                    tokens_generated=self.tokens_generated, preemptions=self.preemptions,
                    draft_tokens=self.draft_tokens, accepted_tokens=self.accepted_tokens,
                    step_seconds={k: v * 1e-9 for k, v in self.phase_ns.items()})

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._running and not self._waiting

    def claim_kv(self) -> int:
        """Take the KV cache's memory now, all kv_tokens of it (and the sliding-window blocks
        max_seqs sequences hold at once), instead of as it is first written; its bytes. Refused
        with EdgeLLMError when that is more than the memory available, before touching it."""
        pool, eng = self.llm._pool, self.llm._engine
        g0 = pool.limit_blocks
        g1 = 0
        if pool.has_swa:  # a window, its rollback margin, a step's chunk and two partial blocks
            g1 = min(g0, self.max_seqs * (-(-(pool.n_swa + SWA_MARGIN + self.step_tokens) // BLOCK) + 2))
        need = g0 * eng.kv_block_bytes(0) + (g1 * eng.kv_block_bytes(1) if g1 else 0)
        avail = mem_available()
        if avail and need > avail:
            raise EdgeLLMError(f"the KV cache of {self.kv_tokens} tokens needs {need / 2**20:.0f} MiB and "
                               f"{avail / 2**20:.0f} MiB of memory is available: fewer parallel sequences, a "
                               f"shorter context or fewer KV tokens would fit")
        with self.llm._engine_lock:
            pool.claim((g0, g1))
        return need

    def start(self) -> "BatchEngine":
        """Step on a background thread while there is work."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="edgellm-engine", daemon=True)
                self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread; requests still running or waiting end as "cancelled"."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            reqs = self._running + self._waiting
            self._running, self._waiting = [], []
        for r in reqs:
            self._end(r, "cancelled")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def run_until_done(self, reqs: Sequence[Request]) -> None:
        """Step on this thread until every one of reqs has finished (no background thread)."""
        while not all(r.done for r in reqs):
            if not self.step():
                raise EdgeLLMError("the engine has nothing to do but requests are unfinished")

    # -- the loop --

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._closing and not self._running and not self._waiting:
                    self._lock.wait()
                if self._closing:
                    return
            try:
                self.step()
            except BaseException as exc:  # a failed step fails its requests, not the server
                with self._lock:
                    reqs = self._running
                    self._running = []
                for r in reqs:
                    self._end(r, "error", exc)

    def step(self) -> bool:
        """One scheduling step: cancellations, admissions, one engine call, sampling. Returns
        False when there was nothing to do."""
        with self._step_lock:
            self._stepping = threading.get_ident()
            try:
                return self._step()
            finally:
                self._stepping = None
                for fn in self._step_listeners:
                    fn()

    def add_step_listener(self, fn: Callable[[], None]) -> None:
        """Call fn() after every step, on the thread that ran it, when the step's events have all
        been emitted: a listener that holds events back during a step (in_step) hands them on."""
        self._step_listeners.append(fn)

    def in_step(self) -> bool:
        """Whether the calling thread is running a step (step listeners will run after it)."""
        return self._stepping == threading.get_ident()

    def _step(self) -> bool:
        llm = self.llm
        t0 = time.perf_counter_ns()
        with self._lock:
            for r in [r for r in self._running + self._waiting if r._cancel]:
                self._drop(r)
                self._end(r, "cancelled")
            self._admit()
            running = list(self._running)
        if not running:
            return False
        for r in running:  # a sibling whose leader ended before forking runs on its own
            if r.seq is None and r.leader is None and r.finish_reason is None:
                self._start(r)
        # the engine stays ours until every group of the step's logits is made and used
        with llm._engine_lock:
            step, fed = self._plan(running)
            if not len(step):
                return False
            t1 = time.perf_counter_ns()
            groups = step.run_in_groups(llm._engine, llm._pool, self._logits_rows)
            t2 = time.perf_counter_ns()
            decode0 = step.decode_ns  # the groups' logits add theirs
            self.steps += 1
            for first, x, results, rows in groups:
                plain, plain_rows = [], []  # requests that only draw a token (sampled together), their rows
                for (req, sample), logits, row in zip(fed[first:first + len(results)], results, rows):
                    if not sample or req.finish_reason is not None:
                        continue
                    if req._draft:
                        self._verify(req, logits)
                    elif req.group is None and req.guide is None:
                        plain.append(req)
                        plain_rows.append(row)
                    else:  # forks to make (n > 1), a grammar to follow
                        self._sample(req, logits)
                self._sample_rows(x, plain, plain_rows)
        t3 = time.perf_counter_ns()
        logits_ns = step.decode_ns - decode0
        if self._decode_rows == step.n_tokens:  # the cost line speculation decides by
            costs_for(llm).observe(step.n_tokens, (t2 - t1 + logits_ns) * 1e-9)
        for r, nd, g0 in self._spec_rows:  # whole steps, drafting to sampling: SpecState.model_pays
            if r.spec.spec.adaptive:
                r.spec.observe_step((t3 - t0) * 1e-9, nd, len(r.generated) - g0)
        self._spec_rows = []
        ph = self.phase_ns
        ph["schedule"] += t1 - t0
        ph["batch"] += t2 - t1 - decode0
        ph["decode"] += step.decode_ns
        ph["emit"] += t3 - t2 - logits_ns - self._sample_ns
        ph["sample"] += self._sample_ns
        self._sample_ns = 0
        return True

    # -- inside a step --

    def _admit(self) -> None:
        """Move waiting requests to running while there are places (and, for n > 1, places for
        the whole group). Called with _lock held."""
        pool = self.llm._pool
        for req in list(self._waiting):
            if req.leader is not None:  # a sibling waits for its leader to be admitted
                break
            group = [req] + [s for s in (req.group or []) if s.leader is req and s in self._waiting]
            if len(self._running) + len(group) > self.max_seqs:
                break
            cached = pool.cached_prefix(req.history) if self.prefix_cache else 0
            if self.prefix_cache and self._evaluated_by_another(req, cached):
                continue  # takes those blocks from the index once they are there
            # enough blocks for the prompt's first chunk (or for what the cache does not hold)
            first = min(len(req.history) - cached, self.step_tokens)
            if -(-first // BLOCK) + 1 > pool.blocks_free() and self._running:
                break
            self._waiting.remove(req)
            self._start(req)
            req._admitted = next(self._admissions)
            self._running.append(req)
            for sib in group[1:]:  # places kept for the siblings
                self._waiting.remove(sib)
                self._running.append(sib)
                sib._admitted = req._admitted

    def _evaluated_by_another(self, req: Request, cached: int) -> bool:
        """A running request is evaluating the prompt block req would evaluate first (the one
        after its indexed prefix: a shared system prompt, the same prompt sent by many clients at
        once). req then waits, and takes the block from the index when it is there instead of
        computing it again: identical prompts cost one prefill, not one each."""
        end = cached + BLOCK
        if len(req.history) <= end:  # (the last token is always evaluated, never taken)
            return False
        block = req.history[cached:end]
        return any(r.seq is not None and r.seq.cacheable and r.finish_reason is None and r.seq.n < end
                   and len(r.history) - r.seq.n > 1 and r.history[cached:end] == block for r in self._running)

    def _start(self, req: Request) -> None:
        """Give req a sequence, holding the longest indexed prefix of its tokens."""
        pool = self.llm._pool
        with self.llm._engine_lock:
            req.seq = pool.new_sequence(cacheable=self.prefix_cache)
            if self.prefix_cache:
                got = pool.match_prefix(req.seq, req.history)
                req.usage.cached_tokens = max(req.usage.cached_tokens, min(got, len(req.prompt)))

    def _plan(self, running: list[Request]):
        """The step: one token for each decoding request, then prompt chunks within the token
        budget. Reserves the slots; preempts the latest request when the pool cannot give them."""
        pool = self.llm._pool
        step = Step()
        fed = []
        budget = self.step_tokens
        decoding = [r for r in running if r.seq is not None and len(r.history) - r.seq.n == 1]
        prefilling = [r for r in running if r.seq is not None and len(r.history) - r.seq.n > 1]
        in_step: set[int] = set()
        drafts = self._drafts(decoding, budget)
        self._decode_rows = 0
        self._spec_rows = []
        for r in decoding:
            if r.finish_reason is not None or r.seq is None:
                continue
            d = drafts.get(id(r), [])
            if d:
                try:
                    pool.reserve(r.seq, 1 + len(d))
                except KVCacheFullError:
                    d = []
            while not d:
                try:
                    pool.reserve(r.seq, 1)
                    break
                except KVCacheFullError:
                    # preempt the latest admitted request not already in this step (r itself last)
                    others = [v for v in running if v.seq is not None and v.finish_reason is None
                              and id(v) not in in_step and v is not r]
                    victim = max(others, key=lambda v: v._admitted, default=None)
                    if victim is None:
                        if not in_step:
                            self._fail(r, "the KV cache cannot hold this request")
                        else:
                            self._preempt(r)
                        break
                    self._preempt(victim)
            if r.seq is None or r.finish_reason is not None:
                continue
            step.add(r.seq, [r.history[-1]] + d, LOGITS_ALL if d else LOGITS_LAST)
            r._draft = d
            if r.spec is not None:
                self._spec_rows.append((r, len(d), len(r.generated)))
            fed.append((r, True))
            in_step.add(id(r))
            budget -= 1 + len(d)
            self._decode_rows += 1 + len(d)
        for r in prefilling:
            if budget <= 0:
                break
            if r.seq is None or r.finish_reason is not None:
                continue
            todo = r.history[r.seq.n:]
            chunk = todo[:budget]
            try:
                pool.reserve(r.seq, len(chunk))
            except KVCacheFullError:
                if not step.entries and all(v is r for v in running if v.seq is not None):
                    self._fail(r, "the KV cache cannot hold this request")
                elif not step.entries:
                    self._preempt(r)  # let the others finish first
                continue  # waits for blocks to come back
            last = len(chunk) == len(todo)
            step.add(r.seq, chunk, LOGITS_LAST if last else LOGITS_NONE)
            fed.append((r, last))
            budget -= len(chunk)
        return step, fed

    def _speculative(self, value):
        """resolve_speculative, and a draft model's KV cache made as large as the engine's (its
        sequences mirror the requests')."""
        spec = resolve_speculative(self.llm, value)
        if spec is not None and not spec.is_lookup:
            dllm = spec.draft
            with dllm._engine_lock:
                dllm._pool.limit_blocks = max(dllm._pool.limit_blocks or 0, self.llm._pool.limit_blocks)
        return spec

    def _drafts(self, decoding: list[Request], budget: int) -> dict[int, list[int]]:
        """Draft tokens of the speculating requests among the decoding ones (id -> drafts),
        within the step's token budget, the context and the tokens each still wants."""
        jobs = [r for r in decoding if r.spec is not None and r.seq is not None and r.finish_reason is None]
        if not jobs:
            return {}
        share = max(0, budget - len(decoding)) // len(jobs)
        items = []
        for r in jobs:
            limit = min(share, self.llm.n_ctx - len(r.history))
            if r.max_tokens is not None:
                limit = min(limit, r.max_tokens - len(r.generated) - 1)
            items.append((r.spec, r.history, r.history, limit))
        out = propose_drafts(items, base_rows=len(decoding), others=len(decoding) - 1)
        for i, (r, d) in enumerate(zip(jobs, out)):
            if d and r.guide is not None:  # only drafts the grammar allows are worth a row
                out[i] = d[:r.guide.constraint.valid_prefix(d)]
        return {id(r): d for r, d in zip(jobs, out) if d}

    def _verify(self, req: Request, rows: np.ndarray) -> None:
        """A speculating request's rows: its drafts checked (SpecState.verify, under the request's
        grammar if it has one), the tokens taken handled one by one as sampled ones (the last may
        bring the tokens the grammar forces), the slots of rejected drafts dropped."""
        drafts, req._draft = req._draft, []
        if req.finish_reason is not None:
            return
        x = rows
        if req._bias is not None:
            ids, vals = req._bias
            x = np.array(rows)
            x[:, ids] += vals
        eog = frozenset() if req.ignore_eos else self.llm.tokenizer.eog_ids
        try:
            toks, taken = req.spec.verify(req.sampler, x, req.history, drafts, guide=req.guide, eog=eog)
        except (ValueError, EdgeLLMError) as exc:
            self._fail(req, str(exc))
            return
        req.usage.draft_tokens += len(drafts)
        req.usage.accepted_tokens += taken
        self.draft_tokens += len(drafts)
        self.accepted_tokens += taken
        with self.llm._engine_lock:
            if not self.llm._pool.truncate(req.seq, req.seq.n - len(drafts) + taken):
                self._preempt(req)  # (not within KVPool's sliding-window margin): evaluated again
        for i, tok in enumerate(toks):
            self._take(req, tok, x[i])
            if req.finish_reason is not None:
                break

    def _preempt(self, req: Request) -> None:
        """Give req's blocks back; it waits at the front and is evaluated again (its sampler
        state and tokens kept, so it goes on exactly where it stopped)."""
        with self._lock:
            if req in self._running:
                self._running.remove(req)
            self._release(req)
            self._waiting.insert(0, req)
            self.preemptions += 1

    def _sample(self, req: Request, logits: np.ndarray, shared: bool = False) -> None:
        """Sample req's next token from its row of the step's logits, which it may change in
        place (logit_bias) unless shared (a sibling's row, sampled before its leader's)."""
        if req.finish_reason is not None:
            return
        siblings = [s for s in (req.group or []) if s.leader is req and s.seq is None and s.finish_reason is None]
        for sib in siblings:  # fork the evaluated prompt for each sibling, sample it too
            with self.llm._engine_lock:
                sib.seq = self.llm._pool.fork(req.seq)
            sib.usage.cached_tokens = req.usage.cached_tokens
            sib.leader = None
            self._sample(sib, logits, shared=True)
        t = time.perf_counter_ns()
        try:
            tok, x = self._draw(req, logits, shared)
        except (ValueError, EdgeLLMError) as exc:
            self._fail(req, str(exc))
            return
        finally:
            self._sample_ns += time.perf_counter_ns() - t
        self._take(req, tok, x)

    def _sample_rows(self, x: np.ndarray, reqs: list[Request], rows: list[int]) -> None:
        """Sample reqs, whose logits are rows of x (their logit_bias added in place), in one
        sampling.sample_rows call, then hand each its token."""
        if not reqs:
            return
        t = time.perf_counter_ns()
        for req, r in zip(reqs, rows):
            if req._bias is not None:
                ids, vals = req._bias
                x[r, ids] += vals
        got = sample_rows([r.sampler for r in reqs], x, rows, [r.history for r in reqs])
        self._sample_ns += time.perf_counter_ns() - t
        for req, r, tok in zip(reqs, rows, got):
            if isinstance(tok, BaseException):
                self._fail(req, str(tok))
            else:
                self._take(req, tok, x[r])

    @staticmethod
    def _draw(req: Request, logits: np.ndarray, shared: bool = False) -> tuple[int, np.ndarray]:
        """req's next token from its row of logits, and the logits it came from (with its
        logit_bias, added in place unless the row is shared)."""
        x = logits
        if req._bias is not None:
            if shared:
                x = np.array(logits)
            ids, vals = req._bias
            x[ids] += vals
        tok = req.sampler.sample(x, req.history) if req.guide is None else req.guide.sample(req.sampler, x, req.history)
        return tok, x

    def _take(self, req: Request, tok: int, x: np.ndarray) -> None:
        """req's next token is tok (x: the logits it came from)."""
        if req.times.first_token is None:
            req.times.first_token = time.monotonic()
        llm = self.llm
        if tok in llm.tokenizer.eog_ids and not req.ignore_eos:
            self._end(req, "stop")
            return
        lp, top = self._logprobs(req, x, tok)
        # with a grammar, the tokens it forces follow tok; the next step evaluates them together
        new = [tok] if req.guide is None else req.guide.advance(
            tok, None if req.max_tokens is None else req.max_tokens - len(req.generated))
        for i, t in enumerate(new):
            req.generated.append(t)
            req.history.append(t)
            req.usage.completion_tokens += 1
            self.tokens_generated += 1
            emit, stopped = req.checker.feed(req.detok.add(t))
            req._emit(Event(emit, t, lp if i == 0 else None, top if i == 0 else None))
            if stopped:
                break
        if stopped or (req.guide is not None and req.guide.constraint.finished):
            self._end(req, "stop")
        elif req.max_tokens is not None and len(req.generated) >= req.max_tokens:
            self._end(req, "length")
        elif len(req.history) > llm.n_ctx:
            self._end(req, "length")

    @staticmethod
    def _logprobs(req: Request, x: np.ndarray, tok: int):
        if req.logprobs is None:
            return None, None
        mx = float(x.max())
        lse = mx + math.log(float(np.exp(x - mx, dtype=np.float64).sum()))
        lp = float(x[tok]) - lse
        top = None
        if req.logprobs > 0:
            k = req.logprobs
            idx = np.argpartition(-x, k - 1)[:k]
            idx = idx[np.lexsort((idx, -x[idx]))]
            top = [(int(i), float(x[i]) - lse) for i in idx]
        return lp, top

    def _fail(self, req: Request, why: str) -> None:
        self._end(req, "error", EdgeLLMError(why))

    def _release(self, req: Request) -> None:
        if req.seq is not None:
            with self.llm._engine_lock:
                self.llm._pool.release(req.seq)
            req.seq = None

    def _drop(self, req: Request) -> None:
        """Take req out of the queues (with _lock held)."""
        if req in self._running:
            self._running.remove(req)
        if req in self._waiting:
            self._waiting.remove(req)

    def _end(self, req: Request, reason: str, error: BaseException | None = None) -> None:
        with self._lock:
            self._drop(req)
            for sib in req.group or []:
                if sib.leader is req:
                    sib.leader = None  # the leader ended before its prompt was done: run alone
            req.group = None  # siblings name each other: no cycle once each has ended
        self._release(req)
        if req.spec is not None:
            req.spec.close()
        req._finish(reason, error)
