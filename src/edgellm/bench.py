"""`edgellm bench`: prompt processing and generation speed, measured the way llama-bench does.

- ppN: N tokens evaluated in one batch on an empty KV cache (logits of the last token only).
- tgN: N tokens decoded one at a time, each on top of the previous (logits every step).
Tokens are random ids (BOS first where the model adds one), a warm-up run precedes the timed
repetitions, and each figure is the mean +/- standard deviation over repetitions. For tg we also
report the bytes of weights read per token and the bandwidth that implies.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .api import LLM


@dataclass
class BenchResult:
    model: str
    size_bytes: int
    n_params: int
    backend: str
    threads: int
    test: str
    samples: list[float] = field(default_factory=list)  # tokens/s of each repetition
    bytes_per_token: int = 0
    read_loop_gbps: float = 0.0  # a plain read loop over the same weights, same threads

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def std(self) -> float:
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0

    @property
    def gbps(self) -> float:
        return self.bytes_per_token * self.mean / 1e9 if self.bytes_per_token else 0.0

    @property
    def read_loop_share(self) -> float:
        return self.gbps / self.read_loop_gbps if self.read_loop_gbps else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(mean=self.mean, std=self.std, gbps=self.gbps, read_loop_share=self.read_loop_share)
        return d


def weight_bytes_per_token(llm: LLM) -> int:
    """Bytes of weights one decode step reads: every matrix once, one embedding row."""
    total = 0
    w = llm._weights
    for layer in w.layers:
        total += sum(info.nbytes for info in layer.values() if info is not None)
    total += w.output.nbytes + w.output_norm.nbytes
    if w.output is not w.tok_embd:
        total += w.tok_embd.nbytes // max(1, llm.n_vocab)
    return total


def read_loop_gbps(llm: LLM, n_threads: int) -> float:
    """GB/s of a plain read loop over the model's weights (where the engine reads them)."""
    from .kernels import c_module

    mod = c_module()
    if mod is None:
        return 0.0
    ffi, lib = mod
    big = max(llm.gguf.tensors.values(), key=lambda t: t.nbytes)
    view = llm._store.tensor_bytes(big.name)  # the largest tensor: most of decode's traffic
    return float(lib.el_read_bandwidth(ffi.from_buffer(view), view.nbytes, n_threads, 5))


def _tokens(llm: LLM, n: int, rng) -> list[int]:
    ids = rng.integers(0, llm.n_vocab, size=n).tolist()
    if llm.tokenizer.add_bos and llm.tokenizer.bos_id is not None and n:
        ids[0] = llm.tokenizer.bos_id
    return ids


def run(model, *, n_prompt: int = 512, n_gen: int = 128, threads=(None,), reps: int = 5,
        seed: int = 1234, progress=None) -> list[BenchResult]:
    threads = list(threads)
    llm = LLM(model, n_ctx=max(n_prompt, n_gen) + 1, n_batch=max(1, n_prompt), n_threads=threads[0])
    engine = llm._engine  # (moves the weights to huge pages where it can, as generation does)
    session = llm.session()
    rng = np.random.default_rng(seed)
    size = sum(t.nbytes for t in llm.gguf.tensors.values())
    params = sum(t.n_elements for t in llm.gguf.tensors.values())
    results = []
    for t in threads:
        n_threads = t or llm.n_threads
        engine.set_threads(n_threads)
        tests = []
        if n_prompt > 0:
            tests.append((f"pp{n_prompt}", n_prompt))
        if n_gen > 0:
            tests.append((f"tg{n_gen}", n_gen))
        for name, n in tests:
            res = BenchResult(llm.path.name, size, params, engine.isa, n_threads, name,
                              bytes_per_token=weight_bytes_per_token(llm) if name.startswith("tg") else 0)
            for rep in range(reps + 1):  # the first run warms caches and page tables up
                ids = _tokens(llm, n, rng)
                session.reset()
                if name.startswith("pp"):
                    t0 = time.perf_counter()
                    session._feed(ids)
                    dt = time.perf_counter() - t0
                else:
                    t0 = time.perf_counter()
                    for tok in ids:
                        session._feed([tok])
                    dt = time.perf_counter() - t0
                if rep:
                    res.samples.append(n / dt)
            if name.startswith("tg"):
                res.read_loop_gbps = read_loop_gbps(llm, n_threads)
            results.append(res)
            if progress:
                progress(res)
    return results


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _human(n: float, unit: str) -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000 or prefix == "T":
            return f"{n:.2f} {prefix}{unit}" if prefix else f"{n:.0f} {unit}"
        n /= 1000
    return str(n)


def markdown(results: list[BenchResult]) -> str:
    head = "| model | size | params | backend | threads | test | t/s | bytes/token | GB/s | read loop GB/s |"
    rows = [head, "|---|---:|---:|---|---:|---|---:|---:|---:|---:|"]
    for r in results:
        bpt = f"{r.bytes_per_token / 1e6:.1f} MB" if r.bytes_per_token else ""
        gbps = f"{r.gbps:.1f}" if r.bytes_per_token else ""
        loop = f"{r.read_loop_gbps:.1f} ({r.read_loop_share:.0%})" if r.read_loop_gbps else ""
        rows.append(f"| {r.model} | {r.size_bytes / 2**20:.1f} MiB | {_human(r.n_params, '')} | {r.backend} | "
                    f"{r.threads} | {r.test} | {r.mean:.2f} ± {r.std:.2f} | {bpt} | {gbps} | {loop} |")
    return "\n".join(rows)


def to_json(results: list[BenchResult]) -> str:
    return json.dumps({"results": [r.as_dict() for r in results], "peak_rss_bytes": peak_rss_bytes()}, indent=2)
