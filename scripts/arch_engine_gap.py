"""How far each engine path is from llama.cpp on the tiny model of every architecture
(tests/tiny_archs.py against tests/fixtures/arch/*.json): per model, the largest and mean
|Δ log-prob| of the teacher-forced top-8 tokens, top-1 agreement, the greedy steps where the path
picks another token than llama.cpp, and how far its logits are from the C generic path's.

    python scripts/arch_engine_gap.py                     # numba and c:generic, every model
    python scripts/arch_engine_gap.py --paths numba qwen2 gemma2
    python scripts/arch_engine_gap.py --trace qwen2       # the first intermediate where numba and
                                                          # c:generic part (a prompt step, then one token)

Uses the installed edgellm (and tests/ for the tiny models); n_batch 64, 2 threads, as
tests/test_arch_engines.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import tiny_archs  # noqa: E402

import edgellm  # noqa: E402
from edgellm.batch import LOGITS_ALL  # noqa: E402

REFS = {p.stem: json.loads(p.read_text()) for p in sorted((REPO / "tests/fixtures/arch").glob("*.json"))}


def use(path: str) -> None:
    if path == "numba":
        os.environ["EDGELLM_BACKEND"] = "numba"
        os.environ.pop("EDGELLM_ISA", None)
    else:
        os.environ["EDGELLM_BACKEND"] = "c"
        os.environ["EDGELLM_ISA"] = path.split(":", 1)[1]


def load(name: str, path: str, directory: Path):
    use(path)
    spec = REFS[name]["spec"]
    file = directory / f"tiny-{spec}.gguf"
    if not file.exists():
        file = tiny_archs.build(spec, directory)
    return edgellm.LLM(file, n_ctx=REFS[name]["n_ctx"], n_batch=64, n_threads=2)


def log_probs_at(z: np.ndarray, cols: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z -= z.max(-1, keepdims=True)
    return np.take_along_axis(z, cols, -1) - np.log(np.exp(z).sum(-1, keepdims=True))


def measure(llm, ref) -> dict:
    tf, g = ref["teacher_forced"], ref["greedy"]
    z = np.array(llm.session()._feed(tf["ids"], logits=LOGITS_ALL))
    top = np.array(tf["top_ids"])
    diff = np.abs(log_probs_at(z, top) - np.array(tf["top_logprobs"]))
    s, differ = llm.session(), []
    last = np.array(s._feed(g["prompt_ids"]))
    steps = [last]
    for i, want in enumerate(g["ids"]):
        if int(np.argmax(last)) != want:
            differ.append(i)
        last = np.array(s._feed([want]))
        steps.append(last)
    return {"max": float(diff.max()), "mean": float(diff.mean()), "top1": float(np.mean(z.argmax(-1) == top[:, 0])),
            "differ": differ, "batch": z, "steps": np.stack(steps)}


def gap(names, paths) -> None:
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            got = {p: measure(load(name, p, Path(d)), REFS[name]) for p in paths}
            base = got.get("c:generic")
            for p, r in got.items():
                vs = ""
                if base is not None and p != "c:generic":
                    vs = (f"  vs c:generic: batch max |Δz| {np.abs(r['batch'] - base['batch']).max():.2e}"
                          f" ({np.mean(r['batch'] == base['batch']):.4f} equal), steps max |Δz| "
                          f"{np.abs(r['steps'] - base['steps']).max():.2e}")
                print(f"{name:22s} {p:10s} max |Δ| {r['max']:.6f} mean {r['mean']:.6f} top-1 {r['top1']:.4f}"
                      f" greedy differing {r['differ']}{vs}", flush=True)


def trace(name: str) -> None:
    """numba against c:generic, intermediate by intermediate: a prompt step of 20 tokens (all
    logits) then one token (llama_order, as the single-stream API)."""
    from edgellm import kernels

    ffi, lib = kernels.c_module()
    ids = REFS[name]["teacher_forced"]["ids"]
    with tempfile.TemporaryDirectory() as d:
        runs = {}
        for path in ("c:generic", "numba"):
            events: list = []
            llm = load(name, path, Path(d))
            if path == "numba":
                llm._engine.trace = lambda nm, l, a: events.append((nm, l, np.array(a, np.float32)))
                cb = None
            else:
                @ffi.callback("el_trace_fn")
                def cb(nm, l, p, rows, cols, ld):
                    a = np.frombuffer(ffi.buffer(p, 4 * ((rows - 1) * ld + cols)), np.float32)
                    events.append((ffi.string(nm).decode(), l,
                                   np.lib.stride_tricks.as_strided(a, (rows, cols), (4 * ld, 4)).copy()))
                lib.el_set_trace(cb)
            s = llm.session()
            s._feed(ids[:20], logits=LOGITS_ALL)
            events.append(("STEP", -1, None))
            s._feed(ids[20:21])
            if cb is not None:
                lib.el_set_trace(ffi.NULL)
            runs[path] = events
    c_ev, n_ev = runs["c:generic"], runs["numba"]
    nb = {}
    st = 0
    for nm, l, a in n_ev:
        if nm == "STEP":
            st += 1
            continue
        nb.setdefault((st, nm, l), a)
    st = 0
    for nm, l, a in c_ev:
        if nm == "STEP":
            st += 1
            continue
        b = nb.get((st, nm, l))
        if b is None:
            continue
        d = float(np.abs(a.reshape(b.shape) - b).max()) if a.size == b.size else float("nan")
        print(f"step {st} layer {l:2d} {nm:12s} max |Δ| {d:.3e}", flush=True)
        if d != 0:
            print("  first difference above")
            return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="models (default: every reference)")
    ap.add_argument("--paths", nargs="+", default=["numba", "c:generic"])
    ap.add_argument("--trace", metavar="NAME")
    a = ap.parse_args()
    if a.trace:
        trace(a.trace)
    else:
        gap(a.names or sorted(REFS), a.paths)


if __name__ == "__main__":
    main()
