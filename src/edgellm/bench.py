"""`edgellm bench`: prompt processing and generation speed, measured the way llama-bench does.

- ppN: N tokens evaluated in one batch on an empty KV cache (logits of the last token only).
- tgN: N tokens decoded one at a time, each on top of the previous (logits every step).
- "@ dD" (-d D, as llama-bench's): the same after a context of D tokens (evaluated once, not
  timed; each repetition runs on a copy-on-write fork of it).
Tokens are random ids (BOS first where the model adds one), a warm-up run precedes the timed
repetitions, and each figure is the mean +/- standard deviation over repetitions. For tg we also
report the bytes a decode step reads (weights, plus the keys and values at the test's mean
depth) and the bandwidth that implies.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .api import LLM
from .batch import LOGITS_NONE
from .kernels import isa_label


@dataclass
class BenchResult:
    model: str
    size_bytes: int
    n_params: int
    backend: str
    threads: int
    test: str
    samples: list[float] = field(default_factory=list)  # tokens/s of each repetition
    bytes_per_token: int = 0     # weights + keys and values read per decode step
    read_loop_gbps: float = 0.0  # a plain read loop over the same weights, same threads
    depth: int = 0               # context before the test (-d)
    kv_bytes_per_token: int = 0  # of bytes_per_token: the keys and values
    cache_types: str = "f16/f16"
    steps: int = 0               # engine steps of the timed repetitions
    fewer_threads: int = 0       # of them: run on fewer threads (the cores were busy)

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


EXPERT_TENSORS = ("w_gate_exps", "w_up_exps", "w_down_exps")  # layer weights stacking every expert's matrix


def weight_bytes_per_token(llm: LLM) -> int:
    """Bytes of weights one decode step reads: every matrix once (of the stacked experts, the
    n_expert_used chosen ones), one embedding row."""
    total = 0
    w, moe = llm._weights, llm.config.moe
    for layer in w.layers:
        for name, info in layer.items():
            if info is not None:
                total += info.nbytes * moe.n_expert_used // moe.n_expert if name in EXPERT_TENSORS else info.nbytes
    total += w.output.nbytes + w.output_norm.nbytes
    if w.output is not w.tok_embd:
        total += w.tok_embd.nbytes // max(1, llm.n_vocab)
    return total


def read_loop_gbps(llm: LLM, n_threads: int) -> float:
    """GB/s of a plain read loop over all the model's weights, where the engine reads them: what a
    decode step streams from memory. (Not one tensor: SmolLM2's largest, 30 MB, fits in a 32 MB L3,
    and a loop over it measured the cache at 30-190 GB/s from run to run.)"""
    from .kernels import c_module

    mod = c_module()
    if mod is None:
        return 0.0
    ffi, lib = mod
    view = llm._store.data_bytes()
    if not view.nbytes:
        return 0.0
    return float(lib.el_read_bandwidth(ffi.from_buffer(view), view.nbytes, n_threads, 5))


def _thread_stats(engine) -> tuple[int, int]:
    """(steps run, steps that ran on fewer threads) so far: the C engine's adaptive pool."""
    stats = getattr(engine, "thread_stats", None)
    return (stats[1], stats[2]) if stats else (0, 0)


def _count_steps(res, engine, before: tuple[int, int]) -> None:
    """Add the engine steps since `before` (a _thread_stats) to res.steps / res.fewer_threads."""
    after = _thread_stats(engine)
    res.steps += after[0] - before[0]
    res.fewer_threads += after[1] - before[1]


def _tokens(llm: LLM, n: int, rng) -> list[int]:
    ids = rng.integers(0, llm.n_vocab, size=n).tolist()
    if llm.tokenizer.add_bos and llm.tokenizer.bos_id is not None and n:
        ids[0] = llm.tokenizer.bos_id
    return ids


def run(model, *, n_prompt: int = 512, n_gen: int = 128, threads=(None,), reps: int = 5,
        seed: int = 1234, progress=None, depths=(0,), cache_type_k: str = "f16",
        cache_type_v: str = "f16", mlock: bool = False) -> list[BenchResult]:
    from .api import DEFAULT_N_BATCH
    from .kv_cache import read_bytes

    threads, depths = list(threads), list(depths)
    dmax = max(depths)
    llm = LLM(model, n_ctx=dmax + max(n_prompt, n_gen) + 1, n_batch=max(1, n_prompt, DEFAULT_N_BATCH if dmax else 0),
              n_threads=threads[0], cache_type_k=cache_type_k, cache_type_v=cache_type_v, mlock=mlock)
    engine = llm._engine  # (moves the weights to huge pages where it can, as generation does)
    rng = np.random.default_rng(seed)
    size = sum(t.nbytes for t in llm.gguf.tensors.values())
    params = sum(t.n_elements for t in llm.gguf.tensors.values())
    types = f"{llm.cache_type_k}/{llm.cache_type_v}"
    results = []
    for d in depths:
        base = llm.session()  # the context every test at this depth starts from (its results do not
        if d:                 # depend on the thread count, so one serves them all)
            base._feed(_tokens(llm, d, rng), logits=LOGITS_NONE)
        for t in threads:
            n_threads = t or llm.n_threads
            engine.set_threads(n_threads)
            tests = []
            if n_prompt > 0:
                tests.append(("pp", n_prompt))
            if n_gen > 0:
                tests.append(("tg", n_gen))
            for kind, n in tests:
                kv = read_bytes(llm.config, llm._cache_types, d + n // 2 + 1) if kind == "tg" else 0
                res = BenchResult(llm.path.name, size, params, isa_label(engine.isa), n_threads,
                                  f"{kind}{n}" + (f" @ d{d}" if d else ""), depth=d, cache_types=types,
                                  bytes_per_token=weight_bytes_per_token(llm) + kv if kind == "tg" else 0,
                                  kv_bytes_per_token=kv)
                for rep in range(reps + 1):  # the first run warms caches and page tables up
                    ids = _tokens(llm, n, rng)
                    if d and ids and llm.tokenizer.add_bos:
                        ids[0] = int(rng.integers(0, llm.n_vocab))  # BOS only at the start
                    s = base.fork()
                    before = _thread_stats(engine)
                    try:
                        t0 = time.perf_counter()
                        if kind == "pp":
                            s._feed(ids)
                        else:
                            for tok in ids:
                                s._feed([tok])
                        dt = time.perf_counter() - t0
                    finally:
                        s.close()
                    if rep:
                        res.samples.append(n / dt)
                        _count_steps(res, engine, before)
                if kind == "tg":
                    res.read_loop_gbps = read_loop_gbps(llm, n_threads)
                results.append(res)
                if progress:
                    progress(res)
        base.close()
    return results


@dataclass
class BatchedResult:
    """One row of llama-batched-bench's table: B sequences, pp P tokens each, then tg T each."""

    model: str
    backend: str
    threads: int
    n_prompt: int
    n_gen: int
    n_seqs: int
    t_pp: list[float] = field(default_factory=list)  # seconds, per repetition
    t_tg: list[float] = field(default_factory=list)
    scheduler: bool = False
    steps: int = 0          # engine steps of the timed repetitions
    fewer_threads: int = 0  # of them: run on fewer threads (the cores were busy)

    @property
    def s_pp(self) -> float:
        return self.n_seqs * self.n_prompt / statistics.median(self.t_pp) if self.n_prompt else 0.0

    @property
    def s_tg(self) -> float:
        return self.n_seqs * self.n_gen / statistics.median(self.t_tg) if self.n_gen else 0.0

    @property
    def s_total(self) -> float:
        t = statistics.median(self.t_pp) + statistics.median(self.t_tg)
        return self.n_seqs * (self.n_prompt + self.n_gen) / t

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(s_pp=self.s_pp, s_tg=self.s_tg, s_total=self.s_total)
        return d


def run_batched(model, *, batches=(1, 4, 8, 16, 32), n_prompt: int = 128, n_gen: int = 128, threads=None,
                reps: int = 3, seed: int = 1234, scheduler: bool = False, progress=None,
                mlock: bool = False) -> list[BatchedResult]:
    """llama-batched-bench's method on the batch-invariant engine path: for each B, B sequences
    of n_prompt random tokens evaluated together (in steps of n_batch tokens), then n_gen steps
    of one token for each sequence. Without `scheduler` the steps go straight to the engine (no
    sampling, as llama-batched-bench; the logits made in BatchEngine's groups of rows); with it,
    through BatchEngine with greedy sampling, stop checks and detokenizing (what a server pays).
    Medians over reps after a warm-up."""
    from .batch import LOGITS_LAST, LOGITS_NONE, Step, logits_group_rows
    from .sampling import SamplingParams
    from .scheduler import BatchEngine

    bmax = max(batches)
    per_seq = n_prompt + n_gen + 1
    llm = LLM(model, n_ctx=per_seq, n_batch=min(512, max(bmax, bmax * n_prompt)), n_threads=threads, mlock=mlock)
    engine, pool = llm._engine, llm._pool
    pool.limit_blocks = None
    rng = np.random.default_rng(seed)
    group = logits_group_rows(llm.n_vocab)

    def evaluate(step):
        for _ in step.run_in_groups(engine, pool, group):
            pass

    out = []
    for b in batches:
        res = BatchedResult(llm.path.name, isa_label(engine.isa), llm.n_threads, n_prompt, n_gen, b, scheduler=scheduler)
        for rep in range(reps + 1):
            prompts = [_tokens(llm, n_prompt, rng) for _ in range(b)]
            before = _thread_stats(engine)
            if scheduler:
                eng = BatchEngine(llm, max_seqs=b, kv_tokens=b * per_seq, prefix_cache=False)
                reqs = [eng.submit(p, max_tokens=n_gen, sampling=SamplingParams(temperature=0), ignore_eos=True)
                        for p in prompts]
                t0 = time.perf_counter()
                while any(r.seq is None or r.seq.n < n_prompt for r in reqs):
                    eng.step()
                t1 = time.perf_counter()
                eng.run_until_done(reqs)
                t2 = time.perf_counter()
            else:
                seqs = [pool.new_sequence() for _ in range(b)]
                t0 = time.perf_counter()
                todo = [(s, p) for s, p in zip(seqs, prompts)]
                while todo:  # prompts packed into steps of n_batch tokens
                    step, room, rest = Step(), llm.n_batch, []
                    for s, p in todo:
                        k = min(room, len(p) - s.n)
                        if k > 0:
                            pool.reserve(s, k)
                            step.add(s, p[s.n:s.n + k], LOGITS_LAST if s.n + k == len(p) else LOGITS_NONE)
                            room -= k
                        if s.n + max(k, 0) < len(p):
                            rest.append((s, p))
                    evaluate(step)
                    todo = rest
                t1 = time.perf_counter()
                for i in range(n_gen):
                    step = Step()
                    for s in seqs:
                        pool.reserve(s, 1)
                        step.add(s, [int(rng.integers(3, llm.n_vocab))], LOGITS_LAST)
                    evaluate(step)
                t2 = time.perf_counter()
                for s in seqs:
                    pool.release(s)
            if rep:
                res.t_pp.append(t1 - t0)
                res.t_tg.append(t2 - t1)
                _count_steps(res, engine, before)
        out.append(res)
        if progress:
            progress(res)
    return out


def markdown_batched(results: list[BatchedResult]) -> str:
    rows = ["| model | backend | threads | PP | TG | B | S_PP t/s | S_TG t/s | S t/s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        rows.append(f"| {r.model} | {r.backend}{' (scheduler)' if r.scheduler else ''} | {r.threads} | "
                    f"{r.n_prompt} | {r.n_gen} | {r.n_seqs} | {r.s_pp:.1f} | {r.s_tg:.1f} | {r.s_total:.1f} |")
    return "\n".join(rows) + busy_note(results)


def busy_note(results) -> str:
    """A line under the table when some timed steps ran on fewer threads than asked."""
    busy = [r for r in results if r.fewer_threads]
    if not busy:
        return ""
    n, of = sum(r.fewer_threads for r in busy), sum(r.steps for r in busy)
    return (f"\n\n{n} of {of} engine steps in {len(busy)} of these tests ran on fewer threads than asked: the pool "
            "saw one thread wait long for another, as when other programs keep the cores busy "
            "(EDGELLM_FIXED_THREADS=1 keeps every thread).")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _human(n: float, unit: str) -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000 or prefix == "T":
            return f"{n:.2f} {prefix}{unit}" if prefix else f"{n:.0f} {unit}"
        n /= 1000
    return str(n)


def markdown(results: list[BenchResult]) -> str:
    """llama-bench's table, plus bytes read per token (weights + K/V), the GB/s they imply and a
    plain read loop's GB/s (with the share reached); a KV cache type column when not f16."""
    types = any(r.cache_types != "f16/f16" for r in results)
    head = "| model | size | params | backend | threads |" + (" K/V cache |" if types else "") + \
        " test | t/s | bytes/token | GB/s | read loop GB/s |"
    rows = [head, "|---|---:|---:|---|---:|" + ("---|" if types else "") + "---|---:|---:|---:|---:|"]
    for r in results:
        w = r.bytes_per_token - r.kv_bytes_per_token
        bpt = "" if not r.bytes_per_token else (f"{w / 1e6:.1f} + {r.kv_bytes_per_token / 1e6:.1f} MB"
                                                if r.kv_bytes_per_token else f"{w / 1e6:.1f} MB")
        gbps = f"{r.gbps:.1f}" if r.bytes_per_token else ""
        loop = f"{r.read_loop_gbps:.1f} ({r.read_loop_share:.0%})" if r.read_loop_gbps else ""
        rows.append(f"| {r.model} | {r.size_bytes / 2**20:.1f} MiB | {_human(r.n_params, '')} | {r.backend} | "
                    f"{r.threads} |" + (f" {r.cache_types} |" if types else "") +
                    f" {r.test} | {r.mean:.2f} ± {r.std:.2f} | {bpt} | {gbps} | {loop} |")
    return "\n".join(rows) + busy_note(results)


def to_json(results: list[BenchResult]) -> str:
    return json.dumps({"results": [r.as_dict() for r in results], "peak_rss_bytes": peak_rss_bytes()}, indent=2)
