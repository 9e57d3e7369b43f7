#!/usr/bin/env python3
"""Fuzz edgellm's parsers of untrusted input.

    scripts/fuzz.py TARGET N [--seed S] [--engine mutator|atheris] [--timeout SECONDS] [--seconds LIMIT]
    scripts/fuzz.py TARGET --replay I [--seed S]        # run input I of the mutator again, with its traceback
    scripts/fuzz.py --list

Targets live in fuzz_targets.py (gguf, tokenizer, template, reply, http, state). An input passes when it returns or raises one of
edgellm's own errors (edgellm.errors.EdgeLLMError). Anything else is a finding: another exception (a failed property
such as a round trip is an AssertionError), a crash of the process, or an input still running
after --timeout seconds (a hang).

Engines:
- mutator (default): input i is made by the target's generator from random.Random(f"{seed}/{i}")
  alone, so every input can be replayed from its number. Not coverage-guided; the generators know
  each format (structure, interesting values, then byte mutations).
- atheris: coverage-guided libFuzzer on edgellm's code (`pip install atheris`), its corpus seeded
  with the mutator's first inputs; findings are saved as files.

Inputs run in a worker process with a capped address space (a memory bomb is a MemoryError, not a
dead machine); the driver restarts the worker after a crash or a hang and goes on with the next
input. Prints inputs, findings by kind (crash / hang / exception type), the edgellm errors raised
by type, and the slowest input; exit status 1 when anything was found. --seconds ends the run
early (after the input running at that moment) with the figures so far.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import mmap
import os
import random
import resource
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
MEMORY_LIMIT = 4 << 30  # bytes of address space a worker may map (models are mapped, not read)
SLOW_SECONDS = 5.0  # inputs slower than this are listed (machine-dependent; not findings)


def _targets():
    """fuzz_targets, plus the targets of the file $EDGELLM_FUZZ_EXTRA_TARGETS names (the tests use
    it to check that this driver reports what planted bugs do)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import fuzz_targets

    extra = os.environ.get("EDGELLM_FUZZ_EXTRA_TARGETS")
    if extra and not getattr(fuzz_targets, "_extra_loaded", False):
        import runpy

        runpy.run_path(extra)
        fuzz_targets._extra_loaded = True
    return fuzz_targets


# --------------------------------------------------------------------------------------- worker


class _Worker:
    """Runs inputs [start, stop) of one target; reports findings and a summary as JSON lines."""

    def __init__(self, target, ctx, progress_path: str, timeout: float, findings: Path):
        self.target, self.ctx, self.timeout, self.findings = target, ctx, timeout, findings
        fd = os.open(progress_path, os.O_RDWR)
        self.progress = mmap.mmap(fd, 8)
        os.close(fd)
        self.n = 0
        self.slow: list[tuple[float, int]] = []

    def one(self, index: int, data: bytes, *, show: bool = False) -> str:
        """Run one input; returns "passed", the edgellm errors it raised, or the finding."""
        from edgellm.errors import EdgeLLMError

        struct.pack_into("<q", self.progress, 0, index)
        expected, outcome = collections.Counter(), "passed"
        faulthandler.dump_traceback_later(self.timeout, exit=True)
        t0 = time.perf_counter()
        try:
            self.target.run(data, self.ctx)
        except EdgeLLMError as e:
            expected[type(e).__name__] += 1
        except Exception as e:  # noqa: BLE001 - everything else is what we are looking for
            if show:
                traceback.print_exc()
            self.report(index, data, type(e).__name__, f"{e}"[:300])
            outcome = f"finding: {type(e).__name__}: {e}"[:300]
        finally:
            faulthandler.cancel_dump_traceback_later()
        expected.update(self.target.drain_expected())
        if expected:  # reported as they happen, so a later crash of this worker loses none
            _emit(event="expected", counts=expected)
            if outcome == "passed":
                outcome = f"edgellm errors (expected): {dict(expected)}"
        dt = time.perf_counter() - t0
        if dt > SLOW_SECONDS:
            self.slow.append((round(dt, 2), index))
        self.n += 1
        return outcome

    def report(self, index: int, data: bytes, kind: str, message: str) -> None:
        path = self.findings / f"{self.target.name}-{kind}-{index}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        _emit(event="finding", index=index, kind=kind, message=message, input=str(path))

    def summary(self) -> None:
        _emit(event="summary", inputs=self.n, slow=sorted(self.slow, reverse=True)[:10])


def _emit(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _limit_memory() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = MEMORY_LIMIT if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def worker_main(args) -> None:
    import warnings

    warnings.simplefilter("ignore")  # edgellm warns about odd metadata; warnings are not findings
    _limit_memory()
    if args.engine == "atheris":
        return _atheris_worker(args)
    ft = _targets()
    target = ft.TARGETS[args.target]
    w = _Worker(target, target.setup(), args.progress, args.timeout, Path(args.findings))
    for i in range(args.start, args.stop):
        if args.deadline and time.time() > args.deadline:
            break
        try:
            data = target.generate(random.Random(f"{args.seed}/{i}"), w.ctx)
        except Exception:  # a bug in the fuzzer itself, not a finding
            _emit(event="harness_error", index=i, message=traceback.format_exc())
            sys.exit(3)
        w.one(i, data)
    w.summary()


def _atheris_worker(args) -> None:
    import atheris

    with atheris.instrument_imports(include=["edgellm"]):
        ft = _targets()
        import edgellm.chat, edgellm.gguf_file, edgellm.models, edgellm.server, edgellm.tokenizer  # noqa: E401,F401
    target = ft.TARGETS[args.target]
    ctx = target.setup()
    corpus = Path(args.findings) / "corpus" / target.name
    if not corpus.is_dir():  # seed the corpus with the mutator's inputs
        corpus.mkdir(parents=True)
        for i in range(200):
            data = target.generate(random.Random(f"{args.seed}/{i}"), ctx)
            if len(data) <= target.max_len:
                (corpus / f"seed-{i}").write_bytes(data)
    w = _Worker(target, ctx, args.progress, args.timeout, Path(args.findings))
    state = {"i": args.start}

    def test_one_input(data: bytes) -> None:
        w.one(state["i"], data)
        state["i"] += 1
        if state["i"] >= args.stop or (args.deadline and time.time() > args.deadline):
            w.summary()
            os._exit(0)

    atheris.Setup([sys.argv[0], str(corpus), f"-seed={args.seed + args.start}", f"-max_len={target.max_len}",
                   f"-timeout={int(args.timeout) * 2}", "-rss_limit_mb=0", "-malloc_limit_mb=0",
                   f"-artifact_prefix={Path(args.findings)}/{target.name}-", "-print_final_stats=0"],
                  test_one_input)
    atheris.Fuzz()


# --------------------------------------------------------------------------------------- driver


def fuzz(name: str, n: int, *, seed: int = 0, engine: str = "mutator", timeout: float = 60.0,
         findings: Path | None = None, quiet: bool = False, seconds: float | None = None) -> dict:
    """Run n inputs of target `name` in worker processes (fewer when `seconds` run out first);
    returns the summary (see main)."""
    ft = _targets()
    target = ft.TARGETS[name]
    findings = Path(findings or "fuzz-findings").resolve()  # created when something is found
    result = {"target": name, "engine": engine, "seed": seed, "inputs": 0, "findings": [],
              "expected": collections.Counter(), "slow": [], "workers": 0}
    t0 = time.perf_counter()
    deadline = time.time() + seconds if seconds else 0.0
    with tempfile.TemporaryDirectory(prefix="edgellm-fuzz-") as work:  # the workers' TMPDIR
        progress = Path(work) / "progress"
        progress.write_bytes(b"\0" * 8)
        start = 0
        while start < n and not (deadline and time.time() > deadline):
            result["workers"] += 1
            summary, stderr, rc = _run_worker(name, engine, seed, start, n, timeout, work, findings, result, quiet,
                                              deadline)
            if summary is not None:
                result["inputs"] += summary["inputs"]
                result["slow"] += summary["slow"]
                break
            (index,) = struct.unpack("<q", progress.read_bytes())
            kind = "hang" if "Timeout (" in stderr or "ALARM" in stderr else f"crash (exit status {rc})"
            last = [ln for ln in stderr.splitlines() if ln.strip()][-12:]
            finding = {"index": index, "kind": kind, "message": " | ".join(last)[-600:]}
            result["findings"].append(finding)
            if not quiet:
                print(f"  finding at input {index}: {kind}\n    " + "\n    ".join(last), file=sys.stderr)
            result["inputs"] += index - start + 1
            start = index + 1
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["expected"] = dict(sorted(result["expected"].items(), key=lambda kv: -kv[1]))
    result["slow"] = sorted(result["slow"], reverse=True)[:10]
    result["findings_dir"] = str(findings)
    return result


def _run_worker(name, engine, seed, start, stop, timeout, work, findings, result, quiet, deadline):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--engine", engine, "--seed", str(seed),
           "--start", str(start), "--stop", str(stop), "--timeout", str(timeout), "--deadline", str(deadline),
           "--progress", str(Path(work) / "progress"), "--findings", str(findings)]
    with tempfile.TemporaryFile("w+", dir=work) as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=dict(os.environ, TMPDIR=work))
        summary = None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # libFuzzer writes its own lines too
            if event.get("event") == "expected":
                result["expected"].update(event["counts"])
            elif event.get("event") == "finding":
                result["findings"].append({k: event[k] for k in ("index", "kind", "message", "input")})
                if not quiet:
                    print(f"  finding at input {event['index']}: {event['kind']}: {event['message']}", file=sys.stderr)
            elif event.get("event") == "summary":
                summary = event
            elif event.get("event") == "harness_error":
                proc.kill()
                raise RuntimeError(f"the {name} target's generator failed on input {event['index']}:\n"
                                   f"{event['message']}")
        rc = proc.wait()
        err.seek(0)
        stderr = err.read()
    if summary is None and rc == 0:
        raise RuntimeError(f"fuzz worker ended without a summary:\n{stderr[-2000:]}")
    return summary, stderr, rc


def replay(name: str, index: int, seed: int) -> None:
    """Input `index` of the mutator, in this process, with the traceback of anything unexpected."""
    ft = _targets()
    target = ft.TARGETS[name]
    ctx = target.setup()
    data = target.generate(random.Random(f"{seed}/{index}"), ctx)
    print(f"input {index}: {len(data)} bytes: {data[:200]!r}{'...' if len(data) > 200 else ''}")
    with tempfile.TemporaryDirectory(prefix="edgellm-fuzz-") as work:
        progress = Path(work) / "progress"
        progress.write_bytes(b"\0" * 8)
        w = _Worker(target, ctx, str(progress), 3600, Path(work))
        print(w.one(index, data, show=True))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target", nargs="?")
    p.add_argument("n", nargs="?", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine", choices=["mutator", "atheris"], default="mutator")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds one input may take before it is a hang")
    p.add_argument("--findings", type=Path, default=None,
                   help="where inputs that found something are saved (default ./fuzz-findings)")
    p.add_argument("--replay", type=int, default=None, metavar="I")
    p.add_argument("--list", action="store_true")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--stop", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--progress", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=None, help="stop after this many seconds (and report)")
    args = p.parse_args(argv)
    if args.worker:
        args.target = args.worker
        worker_main(args)
        return 0
    ft = _targets()
    if args.list or not args.target:
        for t in ft.TARGETS.values():
            print(f"{t.name:<10} {t.doc}")
        return 0
    if args.target not in ft.TARGETS:
        p.error(f"unknown target {args.target!r}; --list shows them")
    if args.replay is not None:
        replay(args.target, args.replay, args.seed)
        return 0
    if not args.n or args.n <= 0:
        p.error("give the number of inputs to run")
    r = fuzz(args.target, args.n, seed=args.seed, engine=args.engine, timeout=args.timeout, findings=args.findings,
             seconds=args.seconds)
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        kinds = collections.Counter(f["kind"] for f in r["findings"])
        print(f"{r['target']} ({r['engine']}, seed {r['seed']}): {r['inputs']} inputs in {r['seconds']} s, "
              f"{len(r['findings'])} findings {dict(kinds) or ''}")
        print(f"  edgellm errors raised: {sum(r['expected'].values())} of {len(r['expected'])} types {r['expected']}")
        if r["slow"]:
            print(f"  slowest inputs (seconds, index): {r['slow']}")
        if r["findings"]:
            print(f"  inputs saved in {r['findings_dir']}")
    return 1 if r["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
