#!/usr/bin/env python3
"""Measurements of the batched engine beyond `edgellm bench --batch`:

    python scripts/bench_engine.py prefix MODEL [-t 2]     # prefix reuse: time to first token
    python scripts/bench_engine.py rss MODEL [-t 2] [--cache-types f16/f16,q8_0/q8_0,q4_0/q4_0] [--engine]
    python scripts/bench_engine.py contention MODEL [--llama-bench PATH]
    python scripts/bench_engine.py ffn-chunk MODEL [-t 2] [-r 9]

prefix: 16 requests sharing a 1,000-token system prompt, one after another through BatchEngine,
with and without the prefix cache; the median time to first token of requests 2..16 and the
ratio. rss: 32 sequences of 512 tokens decoded together (in a fresh process per KV cache type):
256-token prompts in chunks of 128, then one-token steps; with --engine, through BatchEngine (its
512-token steps, sampling); peak RSS against the file + the KV blocks in use + 64 MB. contention: 2-thread decode alone, then with a busy loop
pinned on one core, and -t 3 / -t 8 on this machine's cores (unclamped: EDGELLM_NO_CLAMP=1),
beside llama-bench's tg under the same conditions when --llama-bench is given. ffn-chunk: the
time of a 512-token batch-order step (4 prompts of 128) with its FFN in chunks of rows (the
default, or --chunk) and whole (el_engine_set_ffn_chunk 0), alternated in one process, medians of -r runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def prefix(args) -> None:
    import edgellm
    from edgellm.sampling import SamplingParams

    llm = edgellm.LLM(args.model, n_ctx=2048, n_batch=256, n_threads=args.threads)
    text = open(os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "apache-2.0.txt")).read()
    system = llm.tokenize(text)[:1000]
    questions = [f" Question {i}: what does section {i} say?" for i in range(16)]
    res = {}
    for cache in (False, True):
        eng = edgellm.BatchEngine(llm, max_seqs=4, kv_tokens=4096, prefix_cache=cache)
        ttft = []
        for q in questions:
            req = eng.submit(system + llm.tokenize(q, add_bos=False), max_tokens=1,
                             sampling=SamplingParams(temperature=0))
            eng.run_until_done([req])
            ttft.append(req.times.first_token - req.times.submitted)
        res[cache] = statistics.median(ttft[1:])
        print(f"prefix cache {'on ' if cache else 'off'}: TTFT median {res[cache] * 1000:.1f} ms "
              f"(first {ttft[0] * 1000:.1f} ms; cached tokens {eng.stats()['prompt_tokens_cached']})")
    print(f"ratio off / on: {res[False] / res[True]:.1f}x")


RSS_CHILD = r"""
import resource, sys, edgellm
from edgellm.batch import LOGITS_LAST, Step, logits_group_rows
path, threads, ctk, ctv = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
llm = edgellm.LLM(path, n_ctx=520, n_batch=512, n_threads=threads, cache_type_k=ctk, cache_type_v=ctv)
eng, pool = llm._engine, llm._pool
import random
rng = random.Random(0)  # (not numpy.random: the library does not load it)
group = logits_group_rows(llm.n_vocab)  # the step's logits made as BatchEngine makes them
seqs = [pool.new_sequence() for _ in range(32)]
for s in seqs:  # 256-token prompts, then decode together to 512
    ids = [rng.randrange(3, llm.n_vocab) for _ in range(256)]
    for i in range(0, 256, 128):
        pool.reserve(s, 128); st = Step(); st.add(s, ids[i:i + 128]); st.run(eng, pool)
while seqs[0].n < 512:
    st = Step()
    for s in seqs:
        pool.reserve(s, 1); st.add(s, [rng.randrange(3, llm.n_vocab)], LOGITS_LAST)
    for _ in st.run_in_groups(eng, pool, group):
        pass
# a block's bytes in every layer of its group (keys and values in the cache types, positions)
blocks = sum(pool.blocks_in_use(g) * eng.kv_block_bytes(g) for g in ((0, 1) if eng.has_swa else (0,)))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, blocks, sum(t.nbytes for t in llm.gguf.tensors.values()))
"""

# the same 32 sequences through BatchEngine as a server runs them: its own steps (prompts in steps of
# n_batch tokens), sampling at llama.cpp's default temperature, stop checks, detokenizing
RSS_ENGINE_CHILD = r"""
import random, resource, sys, edgellm
from edgellm.sampling import SamplingParams
from edgellm.scheduler import BatchEngine
path, threads, ctk, ctv = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
llm = edgellm.LLM(path, n_ctx=520, n_batch=512, n_threads=threads, cache_type_k=ctk, cache_type_v=ctv)
eng, pool, e = BatchEngine(llm, max_seqs=32, kv_tokens=32 * 520, prefix_cache=False), llm._pool, llm._engine
rng = random.Random(0)  # (not numpy.random: the library does not load it, so neither does its measurement)
reqs = [eng.submit([rng.randrange(3, llm.n_vocab) for _ in range(256)], max_tokens=256, ignore_eos=True,
                   sampling=SamplingParams(temperature=0.8, seed=i)) for i in range(32)]
most = [0]
eng.add_step_listener(lambda: most.__setitem__(0, max(most[0], sum(
    pool.blocks_in_use(g) * e.kv_block_bytes(g) for g in ((0, 1) if e.has_swa else (0,))))))
eng.run_until_done(reqs)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, most[0], 0)
"""


def rss(args) -> None:
    from edgellm.registry import resolve

    path = str(resolve(args.model))
    for types in args.cache_types.split(","):
        ctk, ctv = types.split("/")
        child = RSS_ENGINE_CHILD if args.engine else RSS_CHILD
        r = subprocess.run([sys.executable, "-c", child, path, str(args.threads), ctk, ctv], capture_output=True,
                           text=True, check=True)
        peak, kv, weights = map(int, r.stdout.split())
        file_size = os.path.getsize(path)
        bound = file_size + kv + 64 * 2**20
        print(f"32 x 512 tokens{' through BatchEngine' if args.engine else ''}, KV {ctk}/{ctv}: peak RSS {peak / 2**20:.1f} MiB; file {file_size / 2**20:.1f} MiB + "
              f"KV blocks in use {kv / 2**20:.1f} MiB + 64 MiB = {bound / 2**20:.1f} MiB: "
              f"{'within' if peak <= bound else 'ABOVE'}")


def _tg(cmd, env=None) -> float:
    r = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    if "llama-bench" in cmd[0]:
        return float([json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")][-1]["avg_ts"])
    return json.loads(r.stdout)["results"][-1]["mean"]


def contention(args) -> None:
    from edgellm.registry import resolve

    path = str(resolve(args.model))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", EDGELLM_NO_CLAMP="1")

    def ours(t):
        return _tg([sys.executable, "-m", "edgellm", "bench", path, "-p", "0", "-n", "64", "-t", str(t), "-r", "3",
                    "-o", "json"], env)

    def theirs(t):
        return _tg([args.llama_bench, "-m", path, "-p", "0", "-n", "64", "-t", str(t), "-r", "3", "-o", "jsonl"], env)

    sides = [("edgellm", ours)] + ([("llama.cpp", theirs)] if args.llama_bench else [])
    for name, fn in sides:
        base = fn(2)
        hog = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.5)
            loaded = fn(2)
        finally:
            hog.kill()
        t3, t8 = fn(3), fn(8)
        print(f"{name}: tg64 -t 2 {base:.1f} t/s; with a busy loop on core 1 {loaded:.1f} ({loaded / base:.0%}); "
              f"-t 3 {t3:.1f} ({t3 / base:.2f}x); -t 8 {t8:.1f} ({t8 / base:.2f}x)")


def ffn_chunk(args) -> None:
    import numpy as np

    import edgellm
    from edgellm.batch import LOGITS_LAST, Step

    llm = edgellm.LLM(args.model, n_ctx=512, n_batch=512, n_threads=args.threads)
    eng, pool = llm._engine, llm._pool
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, llm.n_vocab, 128).tolist() for _ in range(4)]
    times = {args.chunk: [], 0: []}

    def step():
        seqs = [pool.new_sequence() for _ in prompts]
        st = Step()
        for s, p in zip(seqs, prompts):
            pool.reserve(s, len(p))
            st.add(s, p, LOGITS_LAST)
        t = time.perf_counter()
        st.run(eng, pool)
        dt = time.perf_counter() - t
        for s in seqs:
            pool.release(s)
        return dt

    step()  # warm-up
    for _ in range(args.repetitions):
        for chunk in times:
            eng.set_ffn_chunk(chunk)
            times[chunk].append(step())
    for chunk, ts in times.items():
        print(f"FFN {f'in chunks of {chunk} rows' if chunk else 'whole'}: 512-token step median {statistics.median(ts) * 1000:.1f} ms "
              f"({512 / statistics.median(ts):.1f} tok/s) over {len(ts)} runs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["prefix", "rss", "contention", "ffn-chunk"])
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=9, help="ffn-chunk: runs of each")
    ap.add_argument("--chunk", type=int, default=256, help="ffn-chunk: the rows of a chunk (the engine's default: 256)")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (contention)")
    ap.add_argument("--engine", action="store_true",
                    help="rss: through BatchEngine (its steps, sampling) instead of bare engine steps")
    ap.add_argument("--cache-types", default="f16/f16,q8_0/q8_0,q4_0/q4_0",
                    help="rss: comma-separated K/V cache type pairs, one fresh process each")
    args = ap.parse_args()
    {"prefix": prefix, "rss": rss, "contention": contention, "ffn-chunk": ffn_chunk}[args.what](args)


if __name__ == "__main__":
    main()
