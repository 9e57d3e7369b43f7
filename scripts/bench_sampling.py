#!/usr/bin/env python3
"""Time of one Sampler.sample on random logits, per vocabulary size: what the engine thread
spends choosing each row's token (llama.cpp's default chain unless told otherwise).

    python scripts/bench_sampling.py                     # SmolLM2's 49152 and Gemma 3's 262144
    python scripts/bench_sampling.py -V 262144 --top-k 0 --top-p 1 --min-p 0 --temp 1   # OpenAI's defaults
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from edgellm.sampling import Sampler, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-V", "--vocab", default="49152,262144", help="comma-separated vocabulary sizes")
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--min-p", type=float, default=0.05)
    ap.add_argument("--scale", type=float, default=3.0, help="standard deviation of the random logits")
    ap.add_argument("-n", "--iterations", type=int, default=300)
    args = ap.parse_args()
    params = SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=1)
    rng = np.random.default_rng(0)
    for n_vocab in (int(v) for v in args.vocab.split(",")):
        rows = [(rng.standard_normal(n_vocab) * args.scale).astype(np.float32) for _ in range(16)]
        sampler = Sampler(params, n_vocab)
        history = list(range(64))
        times = []
        for i in range(args.iterations + 20):
            t = time.perf_counter()
            sampler.sample(rows[i % len(rows)], history)
            if i >= 20:  # warm-up left out
                times.append(time.perf_counter() - t)
        print(f"vocab {n_vocab}: {1e3 * statistics.median(times):.3f} ms a row (median of {len(times)}; "
              f"p90 {1e3 * sorted(times)[int(0.9 * len(times))]:.3f})")


if __name__ == "__main__":
    main()
