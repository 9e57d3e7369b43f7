"""The server's bridge from the engine's thread to the event loop (server/bridge.py): the events
of one engine step reach the loop in one callback, in order; those outside a step at once. No
model needed."""

from __future__ import annotations

import asyncio
import threading

from edgellm.server.bridge import Outbox


class FakeEngine:
    """What Outbox uses of BatchEngine: step listeners and in_step()."""

    def __init__(self):
        self.listeners = []
        self.stepping = None

    def add_step_listener(self, fn):
        self.listeners.append(fn)

    def in_step(self) -> bool:
        return self.stepping == threading.get_ident()

    def step(self, emit):
        self.stepping = threading.get_ident()
        try:
            emit()
        finally:
            self.stepping = None
            for fn in self.listeners:
                fn()


def test_a_steps_events_reach_the_loop_in_one_callback():
    async def main():
        loop = asyncio.get_running_loop()
        engine = FakeEngine()
        box = Outbox(engine, loop)
        wakeups = []
        schedule = loop.call_soon_threadsafe

        def counted(fn, *args):
            if fn.__module__ == Outbox.__module__:  # (run_in_executor schedules its own callback too)
                wakeups.append(fn)
            return schedule(fn, *args)

        loop.call_soon_threadsafe = counted
        a, b = asyncio.Queue(), asyncio.Queue()

        def engine_thread():
            for step in range(3):  # two requests' tokens in each step
                engine.step(lambda: (box.put(a, ("a", step)), box.put(b, ("b", step))))
            box.put(a, "closed")  # outside a step (the engine closing): at once

        await loop.run_in_executor(None, engine_thread)
        got_a = [await asyncio.wait_for(a.get(), 10) for _ in range(4)]
        got_b = [await asyncio.wait_for(b.get(), 10) for _ in range(3)]
        assert got_a == [("a", 0), ("a", 1), ("a", 2), "closed"]
        assert got_b == [("b", 0), ("b", 1), ("b", 2)]
        assert len(wakeups) == 4  # one per step, one for the event outside a step
        box.flush()  # nothing held: no wake-up
        assert len(wakeups) == 4

    asyncio.run(main())


def test_events_after_the_loop_closed_are_dropped():
    loop = asyncio.new_event_loop()
    box = Outbox(FakeEngine(), loop)
    loop.close()
    box.put(asyncio.Queue(), "late")  # no error: nobody is listening any more
