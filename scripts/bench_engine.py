#!/usr/bin/env python3
"""Measurements of the batched engine beyond `edgellm bench --batch`:

    python scripts/bench_engine.py prefix MODEL [-t 2]     # prefix reuse: time to first token
    python scripts/bench_engine.py rss MODEL [-t 2] [--cache-types f16/f16,q8_0/q8_0,q4_0/q4_0]
    python scripts/bench_engine.py contention MODEL [--llama-bench PATH]

prefix: 16 requests sharing a 1,000-token system prompt, one after another through BatchEngine,
with and without the prefix cache; the median time to first token of requests 2..16 and the
ratio. rss: 32 sequences of 512 tokens decoded together (in a fresh process per KV cache type);
peak RSS against the file + the KV blocks in use + 64 MB. contention: 2-thread decode alone, then with a busy loop
pinned on one core, and -t 3 / -t 8 on this machine's cores (unclamped: EDGELLM_NO_CLAMP=1),
beside llama-bench's tg under the same conditions when --llama-bench is given.
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
from edgellm.batch import LOGITS_LAST, Step
path, threads, ctk, ctv = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
llm = edgellm.LLM(path, n_ctx=520, n_batch=512, n_threads=threads, cache_type_k=ctk, cache_type_v=ctv)
eng, pool = llm._engine, llm._pool
import numpy as np
rng = np.random.default_rng(0)
seqs = [pool.new_sequence() for _ in range(32)]
for s in seqs:  # 256-token prompts, then decode together to 512
    ids = rng.integers(3, llm.n_vocab, 256).tolist()
    for i in range(0, 256, 128):
        pool.reserve(s, 128); st = Step(); st.add(s, ids[i:i + 128]); st.run(eng, pool)
while seqs[0].n < 512:
    st = Step()
    for s in seqs:
        pool.reserve(s, 1); st.add(s, [int(rng.integers(3, llm.n_vocab))], LOGITS_LAST)
    st.run(eng, pool)
# a block's bytes in every layer of its group (keys and values in the cache types, positions)
blocks = sum(pool.blocks_in_use(g) * eng.kv_block_bytes(g) for g in ((0, 1) if eng.has_swa else (0,)))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, blocks, sum(t.nbytes for t in llm.gguf.tensors.values()))
"""


def rss(args) -> None:
    from edgellm.registry import resolve

    path = str(resolve(args.model))
    for types in args.cache_types.split(","):
        ctk, ctv = types.split("/")
        r = subprocess.run([sys.executable, "-c", RSS_CHILD, path, str(args.threads), ctk, ctv], capture_output=True,
                           text=True, check=True)
        peak, kv, weights = map(int, r.stdout.split())
        file_size = os.path.getsize(path)
        bound = file_size + kv + 64 * 2**20
        print(f"32 x 512 tokens, KV {ctk}/{ctv}: peak RSS {peak / 2**20:.1f} MiB; file {file_size / 2**20:.1f} MiB + "
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["prefix", "rss", "contention"])
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (contention)")
    ap.add_argument("--cache-types", default="f16/f16,q8_0/q8_0,q4_0/q4_0",
                    help="rss: comma-separated K/V cache type pairs, one fresh process each")
    args = ap.parse_args()
    {"prefix": prefix, "rss": rss, "contention": contention}[args.what](args)


if __name__ == "__main__":
    main()
