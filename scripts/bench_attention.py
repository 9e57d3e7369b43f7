"""What attention costs in one decode step at depth d, and the bandwidth it reaches on the keys and
values it reads, next to the plain read loop on the same threads.

A decode step at depth d costs the step at depth 0 (weights, norms, logits) plus attention over d
keys and values; the difference of the two, measured on forks of the same sessions, is the
attention's share, and the KV bytes a step reads divided by it the attention's bandwidth. Each
round decodes --steps tokens at depth 0 and at depth d, one after the other, and reports per-step
wall time and process CPU time (user + sys of every thread: on a shared machine, other programs
stretch wall time more than CPU time); medians over rounds. The pool runs a fixed thread count
(EDGELLM_FIXED_THREADS=1) so that the thread count does not change under a busy machine.

  python scripts/bench_attention.py MODEL [-d 8000] [-n 32] [-r 5] [-t 2] [-ctk f16] [-ctv f16]
                                   [--state FILE]

--state FILE keeps the depth-d context in a saved-session file (written when absent, loaded
otherwise), so that repeated runs skip evaluating it (minutes at d = 8000 on a busy machine).

Comparing two builds: run this script alternately on each (PYTHONPATH=OTHER/src) and compare the
medians of attention CPU ms per step.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

os.environ.setdefault("EDGELLM_FIXED_THREADS", "1")

import numpy as np  # noqa: E402

from edgellm import LLM  # noqa: E402
from edgellm.batch import LOGITS_NONE  # noqa: E402
from edgellm.bench import read_loop_gbps  # noqa: E402
from edgellm.kv_cache import read_bytes  # noqa: E402


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def decode(base, ids) -> tuple[float, float]:
    """(wall s, cpu s) per step of decoding ids one at a time on a fork of base"""
    s = base.fork()
    try:
        c0, t0 = cpu_seconds(), time.perf_counter()
        for tok in ids:
            s._feed([tok], logits=LOGITS_NONE)
        return (time.perf_counter() - t0) / len(ids), (cpu_seconds() - c0) / len(ids)
    finally:
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("-d", "--depth", type=int, default=8000)
    ap.add_argument("-n", "--steps", type=int, default=32)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-ctk", "--cache-type-k", default="f16")
    ap.add_argument("-ctv", "--cache-type-v", default="f16")
    ap.add_argument("--state", help="saved-session file of the depth-d context (made when absent)")
    ap.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    a = ap.parse_args()

    llm = LLM(a.model, n_ctx=a.depth + a.steps + 16, n_threads=a.threads, seed=0,
              cache_type_k=a.cache_type_k, cache_type_v=a.cache_type_v)
    rng = np.random.default_rng(1234)
    ctx = rng.integers(0, llm.n_vocab, size=a.depth).tolist()
    empty, deep = llm.session(), llm.session()
    if a.state and os.path.exists(a.state):
        deep.load_state(a.state)
        if len(deep) != a.depth:
            raise SystemExit(f"{a.state} holds {len(deep)} tokens, not {a.depth}")
    else:
        deep._feed(ctx, logits=LOGITS_NONE)
        if a.state:
            deep.save_state(a.state)
    kv = read_bytes(llm.config, llm._cache_types, a.depth + a.steps // 2 + 1)
    rows = []
    for rnd in range(a.rounds + 1):  # round 0 warms up
        ids = rng.integers(0, llm.n_vocab, size=a.steps).tolist()
        w0, c0 = decode(empty, ids)
        wd, cd = decode(deep, ids)
        if rnd:
            rows.append((w0, c0, wd, cd))
    med = [statistics.median(r[i] for r in rows) for i in range(4)]
    att_wall, att_cpu = med[2] - med[0], med[3] - med[1]
    res = {
        "model": llm.path.name, "threads": a.threads, "depth": a.depth, "cache": f"{a.cache_type_k}/{a.cache_type_v}",
        "step_ms_d0": med[0] * 1e3, "cpu_ms_d0": med[1] * 1e3, "step_ms": med[2] * 1e3, "cpu_ms": med[3] * 1e3,
        "attention_ms": att_wall * 1e3, "attention_cpu_ms": att_cpu * 1e3, "kv_mb": kv / 1e6,
        "attention_gbps": kv / att_wall / 1e9 if att_wall > 0 else 0.0,
        "read_loop_gbps": read_loop_gbps(llm, a.threads),
        "rounds_attention_cpu_ms": [round((r[3] - r[1]) * 1e3, 2) for r in rows],
    }
    if a.json:
        print(json.dumps(res))
        return
    print(f"{res['model']}  {a.threads} threads  depth {a.depth}  cache {res['cache']}  "
          f"({a.rounds} rounds of {a.steps} steps, medians)")
    print(f"  step at d=0      {res['step_ms_d0']:7.2f} ms wall  {res['cpu_ms_d0']:7.2f} ms cpu")
    print(f"  step at d={a.depth:<6} {res['step_ms']:7.2f} ms wall  {res['cpu_ms']:7.2f} ms cpu")
    print(f"  attention        {res['attention_ms']:7.2f} ms wall  {res['attention_cpu_ms']:7.2f} ms cpu  "
          f"over {res['kv_mb']:.1f} MB of K/V: {res['attention_gbps']:.2f} GB/s "
          f"(read loop {res['read_loop_gbps']:.2f} GB/s)")


if __name__ == "__main__":
    main()
