"""/metrics in Prometheus' text format (prometheus_client): counters and histograms the server
updates as requests finish, and gauges read from `engine.stats()` at each scrape."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "edgellm"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# engine.stats() key -> (metric name, help): levels now, and counts since the start
ENGINE_GAUGES = {
    "waiting": ("queue_depth", "Requests waiting for a sequence slot."),
    "running": ("running_sequences", "Sequences being decoded."),
    "kv_blocks_used": ("kv_blocks_used", "KV cache blocks held by sequences."),
    "kv_blocks_cached": ("kv_blocks_cached", "KV cache blocks kept only by the prefix cache (reusable, evictable)."),
    "kv_blocks_total": ("kv_blocks_total", "KV cache blocks the pool may hold."),
}
ENGINE_COUNTERS = {
    "prompt_tokens_cached": ("prompt_tokens_cached", "Prompt tokens taken from the prefix cache."),
    "preemptions": ("preemptions", "Sequences preempted (KV given to others, recomputed later)."),
    "steps": ("engine_steps", "Engine steps (one batched forward pass each)."),
    "draft_tokens": ("draft_tokens", "Speculative decoding: draft tokens verified."),
    "accepted_tokens": ("draft_tokens_accepted", "Speculative decoding: draft tokens accepted."),
}


class _EngineCollector:
    def __init__(self, engine):
        self._engine = engine

    def collect(self):
        stats = self._engine.stats()
        for table, family in ((ENGINE_GAUGES, GaugeMetricFamily), (ENGINE_COUNTERS, CounterMetricFamily)):
            for key, (name, doc) in table.items():
                if stats.get(key) is not None:
                    yield family(f"{PREFIX}_{name}", doc, value=stats[key])
        steps = CounterMetricFamily(f"{PREFIX}_engine_step_seconds", "Engine steps' wall time by phase: schedule, "
                                    "batch (arrays and slots), decode (the C engine call), sample, emit (tokens to "
                                    "text, stop strings, events).", labels=["phase"])
        for phase, seconds in stats.get("step_seconds", {}).items():
            steps.add_metric([phase], seconds)
        yield steps


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine):
        self.registry = r = CollectorRegistry()
        self.http_requests = Counter(f"{PREFIX}_http_requests", "HTTP requests answered, by route and status.",
                                     ["route", "status"], registry=r)
        self.sequences = Counter(f"{PREFIX}_sequences_finished", "Sequences finished, by finish reason.",
                                 ["reason"], registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens submitted to the engine (tokens in; once for n choices).", registry=r)
        self.completion_tokens = Counter(f"{PREFIX}_completion_tokens", "Tokens generated (tokens out).", registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "From submission to the first token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.latency = Histogram(f"{PREFIX}_request_latency_seconds", "From submission to the last token.",
                                 buckets=LATENCY_BUCKETS, registry=r)
        r.register(_EngineCollector(engine))

    def request(self, route: str, status: int) -> None:
        self.http_requests.labels(route, str(status)).inc()

    def sequence_done(self, req) -> None:
        """A sequence finished (called on the engine thread; prometheus_client is thread-safe)."""
        self.sequences.labels(req.finish_reason).inc()
        self.completion_tokens.inc(req.usage.completion_tokens)
        t = req.times
        if t.first_token is not None:
            self.ttft.observe(t.first_token - t.submitted)
        if t.finished is not None and req.finish_reason in ("stop", "length"):
            self.latency.observe(t.finished - t.submitted)

    def render(self) -> bytes:
        return generate_latest(self.registry)
