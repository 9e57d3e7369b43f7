"""The engine thread and the event loop: a `Submission` is the engine requests one HTTP request
started (n choices, or several prompts), with their events delivered to the loop in order.

The engine calls `on_event(req, event)` on its own thread, and `on_event(req, None)` when `req`
has finished; the loop's `Outbox` collects a step's events and hands them to the loop in one
`call_soon_threadsafe` after the step, so the engine never waits for a client and wakes the loop
once per step, not once per token. What a slow client has not read yet waits in the submission's
queue (bounded by max_tokens), and the response writes it as fast as the socket takes it (uvicorn
pauses the writer when the socket's buffer is full). Leaving a submission (client gone, error, shutdown)
cancels whatever is still running, and the engine frees its KV on its next step.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import AsyncIterator, Sequence

from ..sampling import SamplingParams


class Outbox:
    """Events from the engine's thread to one event loop's queues. Those emitted during a step
    wait for its end and go in one loop callback (each call_soon_threadsafe writes to the loop's
    self-pipe and wakes it: one per step instead of one per running request); those emitted
    outside a step (a cancellation, the engine closing) go at once."""

    def __init__(self, engine, loop: asyncio.AbstractEventLoop):
        self._engine = engine
        self._loop = loop
        self._items: list = []
        self._lock = threading.Lock()
        engine.add_step_listener(self.flush)

    def put(self, queue: asyncio.Queue, item) -> None:  # any thread
        with self._lock:
            self._items.append((queue, item))
        if not self._engine.in_step():
            self.flush()

    def flush(self) -> None:
        with self._lock:  # held while scheduling: two flushes reach the loop in the order they took their items
            if not self._items:
                return
            items, self._items = self._items, []
            try:
                self._loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass


def _deliver(items: list) -> None:  # on the loop
    for queue, item in items:
        queue.put_nowait(item)


class Submission:
    def __init__(self, engine, metrics, outbox: Outbox):
        self._engine = engine
        self._metrics = metrics
        self._outbox = outbox
        self._queue: asyncio.Queue = asyncio.Queue()
        self.requests: list = []  # choice index -> engine request
        self._index: dict[int, int] = {}  # id(request) -> choice index
        self.prompt_starts: list[int] = []  # the first choice of each prompt
        self._open = 0

    def _on_event(self, req, event) -> None:  # engine thread
        if event is None:  # counted here, so a choice whose client has left is counted too
            self._metrics.sequence_done(req)
        self._outbox.put(self._queue, (req, event))

    def submit(self, ids: Sequence[int], *, n: int, max_tokens: int, sampling: SamplingParams, stop: list[str],
               logprobs: int | None, logit_bias: dict[int, float] | None, grammar=None,
               preserved: frozenset[int] = frozenset(), **speculative) -> None:
        """Start n choices for one prompt (raises what engine.submit raises). More choices than
        the engine runs at once go in groups of max_seqs, all queued now: each group's first
        choice takes the seed its index gives (seed + i, as the engine seeds forked siblings), so
        choice i is the same in any grouping, and the prefix cache spares the later groups most
        of the prompt. preserved: the control tokens the text keeps (engine.submit's). speculative:
        the engine's submit(speculative=) if given."""
        self.prompt_starts.append(len(self.requests))
        self._metrics.prompt_tokens.inc(len(ids))
        group = self._engine.max_seqs
        for first in range(0, n, group):
            params = sampling
            if first and sampling.seed is not None:
                params = replace(sampling, seed=sampling.seed + first)
            out = self._engine.submit(list(ids), max_tokens=max_tokens, sampling=params, stop=stop, logprobs=logprobs,
                                      logit_bias=logit_bias, n=min(group, n - first), on_event=self._on_event,
                                      grammar=grammar, preserved=preserved, **speculative)
            reqs = out if isinstance(out, list) else [out]
            for req in reqs:
                self._index[id(req)] = len(self.requests)
                self.requests.append(req)
            self._open += len(reqs)

    async def events(self) -> AsyncIterator[tuple[int, object, object]]:
        """(choice index, request, event) as they come; event None: that choice has finished."""
        while self._open:
            req, event = await self._queue.get()
            if event is None:
                self._open -= 1
            yield self._index[id(req)], req, event

    def cancel(self) -> None:
        """Cancel every choice still running (finished ones are left alone)."""
        for req in self.requests:
            if req.finish_reason is None:
                self._engine.cancel(req)
