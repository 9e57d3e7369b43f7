#!/usr/bin/env python3
"""edgellm against llama.cpp on the same GGUF file and thread count, measured alternately in one run.

    python scripts/bench_vs_llamacpp.py smollm2-135m-instruct gemma3-270m -t 1,2 -r 3 --install-llamacpp

llama.cpp comes from the `llama-cpp-python` package (its bundled libllama), installed from PyPI into a
separate virtual environment when --install-llamacpp is given (a source build: ~10 minutes once), or
any Python that can `import llama_cpp` (--llama-python), or llama.cpp's own llama-bench binary
(--llama-bench; needed for -d DEPTHS and -ctk/-ctv cache types). Both sides run llama-bench's method
in fresh processes: ppN = N random tokens in one batch on an empty cache (or after a context of
-d tokens); tgN = N single-token decodes. For tg, edgellm's bytes read per token (weights + K/V)
and their share of a plain read loop's GB/s are printed too. Each
round runs llama.cpp then edgellm for every model and thread count; the table gives the median over
rounds and the ratio edgellm / llama.cpp. --baseline-python PY runs edgellm's side a third time in
each round with another build (PY: a Python whose `import edgellm` is, say, the code before a
change), and adds its t/s and edgellm / baseline: before and after beside llama.cpp in one run,
every side alternating with the others. --cold-start also times process start to first generated
token: `edgellm generate ... -n 1` against the same through llama-cpp-python, or against llama.cpp's
own CLI binary when --llama-cli points at one (llama-completion / llama-cli built from source).

--batched 1,4,8,16,32 --batched-bench PATH: many sequences instead. llama.cpp's llama-batched-bench
(built from the same llama.cpp source: cmake --build build --target llama-batched-bench) against
`edgellm bench --batch` on the same file, threads and sizes (-p prompt tokens, -n generated tokens
per sequence), alternately in each round; the table gives S_PP and S_TG (aggregate tokens/s) per
sequence count, medians over rounds, and the ratios. --baseline-python PY adds that build's
`edgellm bench --batch` (PY -m edgellm) to each round, the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

LLAMA_CPP_VERSION = "0.3.36"

LLAMA_WORKER = r"""
import json, random, sys, time
import llama_cpp as L
path, n_threads, n_prompt, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
L.llama_backend_init()
model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
cp = L.llama_context_default_params()
cp.n_ctx = max(n_prompt, n_gen) + 16
cp.n_batch = max(n_prompt, 1)
cp.n_ubatch = min(512, max(n_prompt, 1))
cp.n_threads = cp.n_threads_batch = n_threads
ctx = L.llama_init_from_model(model, cp)
vocab = L.llama_model_get_vocab(model)
n_vocab = L.llama_vocab_n_tokens(vocab)
mem = L.llama_get_memory(ctx)
rng = random.Random(1234)
def toks(n):
    t = [rng.randrange(n_vocab) for _ in range(n)]
    if L.llama_vocab_get_add_bos(vocab):
        t[0] = L.llama_vocab_bos(vocab)
    return t
def pp():
    L.llama_memory_clear(mem, True)
    t = toks(n_prompt); arr = (L.llama_token * n_prompt)(*t)
    t0 = time.perf_counter(); L.llama_decode(ctx, L.llama_batch_get_one(arr, n_prompt)); L.llama_synchronize(ctx)
    return n_prompt / (time.perf_counter() - t0)
def tg():
    L.llama_memory_clear(mem, True)
    t = toks(n_gen); one = (L.llama_token * 1)()
    t0 = time.perf_counter()
    for tok in t:
        one[0] = tok; L.llama_decode(ctx, L.llama_batch_get_one(one, 1)); L.llama_synchronize(ctx)
    return n_gen / (time.perf_counter() - t0)
out = {}
if n_prompt: pp(); out["pp"] = pp()
if n_gen: tg(); out["tg"] = tg()
print(json.dumps(out))
"""

EDGELLM_WORKER = r"""
import json, sys
from edgellm import bench
path, n_threads, n_prompt, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
depths = [int(x) for x in sys.argv[5].split(",")] if len(sys.argv) > 5 else [0]
ctk, ctv = (sys.argv[6], sys.argv[7]) if len(sys.argv) > 7 else ("f16", "f16")
res = bench.run(path, n_prompt=n_prompt, n_gen=n_gen, threads=[n_threads], reps=1, depths=depths,
                cache_type_k=ctk, cache_type_v=ctv)
out = {f"{r.test[:2]}@{r.depth}" if r.depth else r.test[:2]: r.samples[0] for r in res}
out["isa"] = res[0].backend
out["bytes"] = {f"{r.test[:2]}@{r.depth}" if r.depth else r.test[:2]: r.bytes_per_token for r in res}
out["read_loop_gbps"] = max((r.read_loop_gbps for r in res), default=0.0)
print(json.dumps(out))
"""

COLD_LLAMA = r"""
import sys, time
t0 = float(sys.argv[2])
import llama_cpp as L
llm = L.Llama(sys.argv[1], n_ctx=512, verbose=False)
llm.create_completion("Hello", max_tokens=1, temperature=0)
print(time.time() - t0)
"""


def llamacpp_python(args) -> str:
    if args.llama_python:
        return args.llama_python
    venv = Path(os.environ.get("EDGELLM_HOME", Path.home() / ".cache" / "edgellm")) / "llamacpp-venv"
    py = venv / "bin" / "python"
    if not py.exists():
        if not args.install_llamacpp:
            sys.exit(f"no llama.cpp to compare with: pass --install-llamacpp (creates {venv}) or --llama-python")
        print(f"installing llama-cpp-python {LLAMA_CPP_VERSION} into {venv} (builds llama.cpp; takes a while)",
              file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", f"llama-cpp-python=={LLAMA_CPP_VERSION}"],
                       check=True, env=dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2)))
    return str(py)


def run_worker(python: str, code: str, path: str, threads: int, n_prompt: int, n_gen: int, extra=()) -> dict:
    # both sides import numpy; its idle BLAS threads must not compete with the measured ones
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    r = subprocess.run([python, "-c", code, path, str(threads), str(n_prompt), str(n_gen), *extra],
                       capture_output=True, text=True, timeout=3600, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"worker failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_llama_bench(binary: str, path: str, threads: int, n_prompt: int, n_gen: int, depths: list[int],
                    ctk: str, ctv: str) -> dict:
    """llama.cpp's own llama-bench, one repetition, with -d and -ctk/-ctv; flash attention where a
    quantized V cache needs it (llama.cpp refuses one without), its default (auto) otherwise."""
    cmd = [binary, "-m", path, "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen),
           "-d", ",".join(map(str, depths)), "-ctk", ctk, "-ctv", ctv, "-r", "1", "-o", "json"]
    if ctv != "f16":
        cmd += ["-fa", "on"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=7200, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    out = {}
    for row in json.loads(r.stdout):
        kind = "pp" if row["n_prompt"] else "tg"
        d = int(row.get("n_depth", 0))
        out[f"{kind}@{d}" if d else kind] = float(row["avg_ts"])
    return out


def cold_start(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True, timeout=600)
    return time.perf_counter() - t0


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="aliases from models.toml or .gguf paths")
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--rounds", type=int, default=3, help="alternating rounds (median reported)")
    ap.add_argument("--llama-python", help="a Python that can import llama_cpp")
    ap.add_argument("--install-llamacpp", action="store_true", help="pip-install llama-cpp-python into a venv")
    ap.add_argument("--cold-start", action="store_true", help="also time process start to first token")
    ap.add_argument("--llama-cli", help="llama.cpp's CLI binary for --cold-start (llama-completion)")
    ap.add_argument("--json", help="also write the raw figures here")
    ap.add_argument("-d", "--depth", default="0", help="comma-separated context depths (llama-bench's -d)")
    ap.add_argument("-ctk", "--cache-type-k", default="f16", help="KV cache type of the keys (f16, q8_0, q4_0)")
    ap.add_argument("-ctv", "--cache-type-v", default="f16", help="KV cache type of the values")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary: the llama.cpp side runs it (needed "
                                          "for -d, -ctk, -ctv)")
    ap.add_argument("--batched", help="comma-separated sequence counts: llama-batched-bench's test instead")
    ap.add_argument("--batched-bench", help="llama.cpp's llama-batched-bench binary (with --batched)")
    ap.add_argument("--baseline-python", help="also run edgellm's side with this Python (another build, e.g. "
                                              "before a change) in each round, as 'baseline'")
    args = ap.parse_args()
    if args.batched:
        return batched(args)

    from edgellm.registry import resolve

    paths = {m: str(resolve(m)) for m in args.models}
    threads = [int(t) for t in args.threads.split(",")]
    depths = [int(d) for d in args.depth.split(",")]
    ctk, ctv = args.cache_type_k, args.cache_type_v
    tests = [("pp", d) for d in depths if args.n_prompt] + [("tg", d) for d in depths if args.n_gen]
    keys = [f"{k}@{d}" if d else k for k, d in tests]
    if not args.llama_bench and (depths != [0] or ctk != "f16" or ctv != "f16"):
        sys.exit("-d, -ctk and -ctv need --llama-bench PATH (llama.cpp's llama-bench binary)")
    py = None if args.llama_bench else llamacpp_python(args)
    raw: dict = {}
    info: dict = {}
    for rnd in range(args.rounds):
        for m, path in paths.items():
            for t in threads:
                for side in ("llama.cpp", "edgellm") + (("baseline",) if args.baseline_python else ()):
                    if side != "llama.cpp":
                        python = sys.executable if side == "edgellm" else args.baseline_python
                        res = run_worker(python, EDGELLM_WORKER, path, t, args.n_prompt, args.n_gen,
                                         extra=[",".join(map(str, depths)), ctk, ctv])
                        if side == "edgellm":
                            info.setdefault("isa", res.get("isa"))
                            info.setdefault("bytes", {})[(m, t)] = res.get("bytes", {})
                            info.setdefault("loop", {}).setdefault((m, t), []).append(res.get("read_loop_gbps", 0.0))
                    elif args.llama_bench:
                        res = run_llama_bench(args.llama_bench, path, t, args.n_prompt, args.n_gen, depths, ctk, ctv)
                    else:
                        res = run_worker(py, LLAMA_WORKER, path, t, args.n_prompt, args.n_gen)
                    for key in keys:
                        if key in res:
                            raw.setdefault((m, t, key), {}).setdefault(side, []).append(res[key])
                    print(f"round {rnd + 1}: {m} t={t} {side}: " +
                          ", ".join(f"{k} {res[k]:.1f}" for k in keys if k in res), file=sys.stderr)
    print(f"\nMachine: {machine()}; edgellm ISA path: {info.get('isa')}; KV cache {ctk}/{ctv}; "
          f"median of {args.rounds} alternating rounds\n")
    base = args.baseline_python is not None
    print("| model | threads | test | llama.cpp t/s | edgellm t/s | ratio | edgellm GB/s (bytes/token) | "
          "of read loop |" + (" baseline t/s | edgellm / baseline |" if base else ""))
    print("|---|---:|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if base else ""))
    table = []
    for (m, t, key), sides in raw.items():
        a = statistics.median(sides["llama.cpp"])
        b = statistics.median(sides["edgellm"])
        kind, _, d = key.partition("@")
        name = f"{kind}{args.n_prompt if kind == 'pp' else args.n_gen}" + (f" @ d{d}" if d else "")
        nbytes = info["bytes"].get((m, t), {}).get(key, 0)
        loop = statistics.median(info["loop"][(m, t)])
        gbps = nbytes * b / 1e9
        table.append({"model": m, "threads": t, "test": name, "llama.cpp": a, "edgellm": b, "ratio": b / a,
                      "bytes_per_token": nbytes, "read_loop_gbps": loop, "samples": sides})
        bw = f"{gbps:.1f} ({nbytes / 1e6:.0f} MB) | {gbps / loop:.0%}" if nbytes and loop else " | "
        bl = ""
        if base:
            c = table[-1]["baseline"] = statistics.median(sides["baseline"])
            bl = f" {c:.1f} | {b / c:.2f}x |"
        print(f"| {Path(paths[m]).name} | {t} | {name} | {a:.1f} | {b:.1f} | {b / a:.2f}x | {bw} |{bl}")
    if args.cold_start:
        print("\n| model | llama.cpp cold start s | edgellm cold start s | difference s |")
        print("|---|---:|---:|---:|")
        for m, path in paths.items():
            ed, ll = [], []
            for _ in range(args.rounds):
                if args.llama_cli:
                    ll.append(cold_start([args.llama_cli, "-m", path, "-p", "Hello", "-n", "1", "--temp", "0",
                                          "-no-cnv", "--no-warmup"]))
                else:
                    t0 = time.time()
                    r = subprocess.run([py, "-c", COLD_LLAMA, path, str(t0)], capture_output=True, text=True,
                                       check=True)
                    ll.append(float(r.stdout.strip().splitlines()[-1]))
                ed.append(cold_start([sys.executable, "-m", "edgellm", "generate", path, "-p", "Hello", "-n", "1",
                                      "--temp", "0"]))
            a, b = statistics.median(ll), statistics.median(ed)
            table.append({"model": m, "test": "cold_start_s", "llama.cpp": a, "edgellm": b})
            print(f"| {Path(path).name} | {a:.3f} | {b:.3f} | {b - a:+.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))


def batched(args) -> None:
    """llama-batched-bench against `edgellm bench --batch`, alternating, medians and ratios."""
    from edgellm.registry import resolve

    if not args.batched_bench:
        sys.exit("--batched needs --batched-bench PATH (llama.cpp's llama-batched-bench)")
    seqs = [int(x) for x in args.batched.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    raw: dict = {}
    for rnd in range(args.rounds):
        for m in args.models:
            path = str(resolve(m))
            for t in threads:
                n_ctx = max(seqs) * (args.n_prompt + args.n_gen) + 64
                r = subprocess.run([args.batched_bench, "-m", path, "-t", str(t), "-tb", str(t), "-c", str(n_ctx),
                                    "-b", "2048", "-ub", "512", "-npp", str(args.n_prompt), "-ntg", str(args.n_gen),
                                    "-npl", ",".join(map(str, seqs)), "--output-format", "jsonl"],
                                   capture_output=True, text=True, timeout=7200, env=env)
                if r.returncode != 0:
                    sys.exit(f"llama-batched-bench failed: {r.stderr[-2000:]}")
                for line in r.stdout.splitlines():
                    if line.startswith("{"):
                        d = json.loads(line)
                        raw.setdefault((m, t, d["pl"]), {}).setdefault("llama.cpp", []).append((d["speed_pp"], d["speed_tg"]))
                sides = [("edgellm", sys.executable)] + ([("baseline", args.baseline_python)] if args.baseline_python else [])
                for side, python in sides:
                    r = subprocess.run([python, "-m", "edgellm", "bench", path, "--batch", ",".join(map(str, seqs)),
                                        "-p", str(args.n_prompt), "-n", str(args.n_gen), "-t", str(t), "-r", "1", "-o",
                                        "json"], capture_output=True, text=True, timeout=7200, env=env)
                    if r.returncode != 0:
                        sys.exit(f"edgellm bench ({python}) failed: {r.stderr[-2000:]}")
                    for d in json.loads(r.stdout)["results"]:
                        raw.setdefault((m, t, d["n_seqs"]), {}).setdefault(side, []).append((d["s_pp"], d["s_tg"]))
                        raw.setdefault("isa", d["backend"])
                print(f"round {rnd + 1}: {m} t={t} done", file=sys.stderr)
    print(f"\nMachine: {machine()}; edgellm ISA path: {raw.get('isa')}; median of {args.rounds} alternating rounds; "
          f"pp {args.n_prompt}, tg {args.n_gen} per sequence\n")
    base = args.baseline_python is not None
    print("| model | threads | B | llama.cpp S_PP | edgellm S_PP | ratio | llama.cpp S_TG | edgellm S_TG | ratio |"
          + (" baseline S_TG | edgellm / baseline |" if base else ""))
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if base else ""))
    table = []
    for key, sides in raw.items():
        if not isinstance(key, tuple):
            continue
        m, t, b = key
        lp = statistics.median(x[0] for x in sides["llama.cpp"])
        lt = statistics.median(x[1] for x in sides["llama.cpp"])
        ep = statistics.median(x[0] for x in sides["edgellm"])
        et = statistics.median(x[1] for x in sides["edgellm"])
        table.append(dict(model=m, threads=t, n_seqs=b, llama_s_pp=lp, llama_s_tg=lt, edgellm_s_pp=ep, edgellm_s_tg=et,
                          samples=sides))
        bt = statistics.median(x[1] for x in sides["baseline"]) if base else 0.0
        if base:
            table[-1]["baseline_s_tg"] = bt
        print(f"| {Path(str(resolve(m))).name} | {t} | {b} | {lp:.1f} | {ep:.1f} | {ep / lp:.2f}x | {lt:.1f} | "
              f"{et:.1f} | {et / lt:.2f}x |" + (f" {bt:.1f} | {et / bt:.2f}x |" if base else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
