#!/usr/bin/env python3
"""Speculative decoding's speed, beside llama.cpp's lookup and speculative tools on the same files:

    python scripts/bench_speculative.py lookup [MODEL] [-t 2] [-n 256] [-r 3] [--llama-bin DIR]
    python scripts/bench_speculative.py draft [MODEL] [--target F16] [--draft-type Q4_0] [...]

lookup: greedy chat replies of MODEL (default SmolLM2-135M-Instruct Q4_1) to input-grounded
prompts (rewrite, summarise, quote or copy out a paragraph of tests/fixtures/apache-2.0.txt;
repeat a code file of this repository with one change) and to free-form prompts, decoded by
edgellm without speculation, by edgellm with prompt lookup, and by llama.cpp's llama-lookup
(its n-gram drafts, `--spec-draft-n-max` 16 and its default 3) — in alternating order, round
after round; decode tokens/s medians per prompt and their ratios. llama.cpp's tools run without
flash attention (--llama-fa, default off), whose numbers are the ones edgellm reproduces: with it
on (their default, auto) a greedy reply can be another text — on `rewrite` SmolLM2 then copies the
paragraph (87 tokens, 90% of its drafts taken) where without it it paraphrases (46 tokens, 1 of 32
taken), so speeds compared would be of different replies. Even so a llama.cpp tool's reply can
part from edgellm's where its verification steps change kernels by batch size: the "same text"
column gives, per llama.cpp tool, the characters its reply shares from the start with edgellm's
speculative one (the median over runs) out of that reply's.

draft: MODEL converted with `edgellm quantize` into a target (F16) and a draft (Q4_0) in
--work DIR; the target alone, the target with the draft model (its default: prompt lookup's
drafts taken instead where they promise more), with the draft model's drafts only
(with_lookup=False), and llama-speculative (-m target -md draft) on the same two files, same
prompts.

Each table ends with the engine's step costs by row count relative to a one-row step (what
the draft length is chosen by: speculative.StepCosts, measured at first use and as steps run).

Acceptance is drafts taken / drafts verified; "per step" is drafts taken per verification
step. The machine's load average is printed with the figures: on a shared machine compare
ratios from one run, not absolute speeds.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LICENSE = (REPO / "tests" / "fixtures" / "apache-2.0.txt").read_text()


def _section(start: str, end: str) -> str:
    i = LICENSE.index(start)
    return " ".join(LICENSE[i:LICENSE.index(end, i)].split())


def _code_file() -> str:
    return (REPO / "src" / "edgellm" / "batch.py").read_text().split('"""', 2)[2].strip()


def _typos(text: str) -> str:
    return text.replace("the ", "teh ").replace("License", "Lisence").replace("which", "wich")


GROUNDED = {
    "rewrite": lambda: "Rewrite the following paragraph in plain English, keeping every point:\n\n"
                       + _section("2. Grant of Copyright License", "3. Grant of Patent"),
    "summarise": lambda: "Summarise this section of a software license:\n\n"
                         + _section("3. Grant of Patent License", "4. Redistribution"),
    "copy-out": lambda: "Write out the following text exactly as it is:\n\n"
                        + _section("4. Redistribution.", "(b) You must"),
    "quote": lambda: 'Quote, word for word, the definitions of "Legal Entity" and "Source" form in this text:\n\n'
                     + _section('"Legal Entity" shall mean', '"Object" form'),
    "fix-typos": lambda: "Correct the spelling mistakes in this text and write out the corrected text in full:\n\n"
                         + _typos(_section("5. Submission of Contributions.", "6. Trademarks.")),
    "code-rename": lambda: "Here is a Python module. Rename the class `Step` to `Batch` and write out the whole "
                           "module with that one change:\n\n```python\n" + _code_file() + "\n```",
}
FREE = {
    "story": lambda: "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "explain": lambda: "Explain how photosynthesis works to a ten-year-old.",
    "ideas": lambda: "Give me ten ideas for a birthday party for a friend who loves astronomy.",
}


def _load():
    return os.getloadavg()[0]


def _edgellm_run(llm, ids, n, spec):
    llm.reset()
    text = llm.generate(ids, max_tokens=n, temperature=0, speculative=spec)
    s = llm.last_stats
    return dict(tps=s.decode_tps, tokens=s.generated_tokens, drafted=s.draft_tokens, accepted=s.accepted_tokens,
                steps=s.verify_steps, text=text)


_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")


def _llama_run(cmd: list[str], timeout: float):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({r.returncode}): {r.stderr[-600:]}")
    m = _DECODED.search(r.stderr)
    if m is None:
        raise RuntimeError(f"no speed line in {Path(cmd[0]).name}'s output: {r.stderr[-600:]}")
    get = lambda key: int(re.search(rf"{key}\s+=\s+(\d+)", r.stderr).group(1))  # noqa: E731
    n_pred = int(m.group(1))
    return dict(tps=float(m.group(3)), tokens=n_pred, drafted=get("n_drafted"), accepted=get("n_accept"), steps=0,
                text=r.stdout)


def _shared(prompt: str, ours: str, theirs: str) -> int:
    """The characters a llama.cpp tool's reply shares with ours from the start. Its output is the
    prompt, then the reply; llama-lookup prints two newlines before the prompt."""
    at = theirs.find(prompt)
    if at < 0:
        raise RuntimeError(f"the prompt is not in llama.cpp's output: {theirs[:200]!r}")
    reply = theirs[at + len(prompt):]
    n = 0
    while n < min(len(ours), len(reply)) and ours[n] == reply[n]:
        n += 1
    return n


def _rendered(llm, prompt: str) -> tuple[str, list[int]]:
    text = llm.template.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
    return text, llm.chat_tokens(text)


def _table(title, names, modes, base, res, loads, extra=None, prompts=None):
    print(f"\n### {title}\n")
    print(f"load average during the runs: {min(loads):.1f} - {max(loads):.1f} (2 cores: above 2 the machine is shared)\n")
    head = "| prompt | tokens | " + " | ".join(f"{m} tok/s" for m in modes) + " | " + \
        " | ".join(f"{m} / {base}" for m in modes if m != base) + " | acceptance | per step |" + \
        (" same text |" if prompts else "")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    ratios = {m: [] for m in modes if m != base}
    for name in names:
        med = {m: statistics.median(r["tps"] for r in res[m][name]) for m in modes}
        cells = [f"{med[m]:.1f}" for m in modes]
        for m in ratios:
            ratios[m].append(med[m] / med[base])
        rcells = [f"{med[m] / med[base]:.2f}x" for m in ratios]
        acc = []
        for m in modes:
            runs = res[m][name]
            d, a, st = sum(r["drafted"] for r in runs), sum(r["accepted"] for r in runs), sum(r["steps"] for r in runs)
            if d:
                acc.append(f"{m}: {a / d:.0%}" + (f" ({a / st:.2f})" if st else ""))
        tokens = res[modes[1]][name][0]["tokens"] if len(modes) > 1 else res[base][name][0]["tokens"]
        same = ""
        if prompts:
            ours = res[modes[1]][name][0]["text"]
            same = " " + "; ".join(
                f"{m}: {statistics.median(_shared(prompts[name][0], ours, r['text']) for r in res[m][name]):.0f}"
                f"/{len(ours)}" for m in modes if m.startswith("llama")) + " |"
        print(f"| {name} | {tokens} | " + " | ".join(cells) + " | " + " | ".join(rcells) + " | " +
              "; ".join(acc) + " | " + (extra(name) if extra else "") + " |" + same)
    for m, rs in ratios.items():
        print(f"\n{m} / {base}: median {statistics.median(rs):.2f}x, min {min(rs):.2f}x, max {max(rs):.2f}x")
    return ratios


def _costs(llm, label: str) -> None:
    from edgellm.speculative import costs_for

    c = costs_for(llm)
    one = c.predict(1)
    print(f"\n{label} step costs by rows (one row = {one * 1e3:.1f} ms): " +
          " ".join(f"{r}: {c.predict(r) / one:.2f}" for r in (2, 3, 4, 5, 6, 8, 9, 12, 13, 16, 17)))
    if c.per_draft:
        print(f"{label} as a draft model: {c.draft_seconds() * 1e3:.1f} ms per draft (whole drafting phases)")


def _chosen(args, names: list[str]) -> list[str]:
    """names, or those of them that --prompts lists"""
    return [n for n in names if n in args.prompts] if args.prompts else names


def bench(args, llm, modes, runners, names, prompts):
    res = {m: {n: [] for n in names} for m in modes}
    loads = [_load()]
    for rnd in range(args.rounds):
        for name in names:
            order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]  # alternate who goes first
            for m in order:
                res[m][name].append(runners[m](prompts[name]))
            loads.append(_load())
        print(f"round {rnd + 1}/{args.rounds} done (load {loads[-1]:.1f})", file=sys.stderr)
    return res, loads


def lookup(args) -> None:
    import edgellm
    from edgellm.speculative import Speculative

    llm = edgellm.LLM(args.model, n_ctx=4096, n_threads=args.threads)
    prompts = {n: _rendered(llm, f()) for n, f in {**GROUNDED, **FREE}.items()}
    runners = {"edgellm": lambda p: _edgellm_run(llm, p[1], args.n, None),
               "lookup": lambda p: _edgellm_run(llm, p[1], args.n, Speculative("lookup"))}
    modes = ["edgellm", "lookup"]
    if args.llama_bin:
        exe = str(Path(args.llama_bin) / "llama-lookup")
        for k in (16, 3):
            runners[f"llama-lookup-{k}"] = (lambda p, k=k: _llama_run(
                [exe, "-m", str(llm.path), "-p", p[0], "-n", str(args.n), "-t", str(args.threads), "--temp", "0",
                 "-c", "4096", "--spec-draft-n-max", str(k), "-fa", args.llama_fa], args.timeout))
            modes.append(f"llama-lookup-{k}")
    for names, title in ((list(GROUNDED), "input-grounded prompts"), (list(FREE), "free-form prompts")):
        names = _chosen(args, names)
        if not names:
            continue
        res, loads = bench(args, llm, modes, runners, names, prompts)
        _table(f"prompt lookup, {llm.path.name}, {args.threads} threads, {title}", names, modes, "edgellm", res,
               loads, extra=lambda n: str(len(prompts[n][1])) + " prompt tokens", prompts=prompts if args.llama_bin else None)
        _costs(llm, llm.path.name)


def draft(args) -> None:
    import edgellm
    from edgellm.registry import resolve
    from edgellm.speculative import Speculative

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = Path(resolve(args.model, progress=True))
    files = {}
    for role, ft in (("target", args.target), ("draft", args.draft_type)):
        out = work / f"{src.stem}.{ft}.gguf"
        if not out.exists():
            subprocess.run([sys.executable, "-m", "edgellm", "quantize", "-q", "--allow-requantize", str(src),
                            str(out), ft], check=True)
        files[role] = out
    llm = edgellm.LLM(files["target"], n_ctx=4096, n_threads=args.threads)
    dllm = edgellm.LLM(files["draft"], n_ctx=4096, n_threads=args.threads)
    names = _chosen(args, list(GROUNDED) + list(FREE))
    prompts = {n: _rendered(llm, f()) for n, f in {**GROUNDED, **FREE}.items() if n in names}
    runners = {"target": lambda p: _edgellm_run(llm, p[1], args.n, None),
               "draft-model": lambda p: _edgellm_run(llm, p[1], args.n, Speculative(dllm)),
               "draft-only": lambda p: _edgellm_run(llm, p[1], args.n, Speculative(dllm, with_lookup=False))}
    modes = ["target", "draft-model", "draft-only"]
    if args.llama_bin:
        exe = str(Path(args.llama_bin) / "llama-speculative")
        runners["llama-speculative"] = lambda p: _llama_run(
            [exe, "-m", str(files["target"]), "-md", str(files["draft"]), "-p", p[0], "-n", str(args.n),
             "-t", str(args.threads), "-td", str(args.threads), "--temp", "0", "-c", "4096",
             "--spec-draft-n-max", "8", "-fa", args.llama_fa], args.timeout)
        modes.append("llama-speculative")
    res, loads = bench(args, llm, modes, runners, names, prompts)
    _table(f"draft model: {files['target'].name} with {files['draft'].name}, {args.threads} threads", names, modes,
           "target", res, loads, prompts=prompts if args.llama_bin else None)
    _costs(llm, files["target"].name)
    _costs(dllm, files["draft"].name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["lookup", "draft"])
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=256, help="tokens per reply (greedy; a reply may end sooner)")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--llama-bin", default=None, help="llama.cpp's build/bin (llama-lookup, llama-speculative)")
    ap.add_argument("--target", default="F16", help="draft: the target's type (F16 or Q8_0)")
    ap.add_argument("--draft-type", default="Q4_0", help="draft: the draft model's type")
    ap.add_argument("--work", default=str(REPO / "build" / "spec-models"), help="draft: where converted files go")
    ap.add_argument("--llama-fa", choices=["off", "on", "auto"], default="off",
                    help="llama.cpp's flash attention (off: the numbers edgellm reproduces, so the same replies)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--prompts", default=None, help="only these prompts, e.g. story,explain")
    args = ap.parse_args()
    if args.prompts:
        args.prompts = args.prompts.split(",")
        unknown = sorted(set(args.prompts) - set(GROUNDED) - set(FREE))
        if unknown:
            ap.error(f"unknown prompt {unknown[0]!r} (known: {', '.join([*GROUNDED, *FREE])})")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    t = time.time()
    (lookup if args.what == "lookup" else draft)(args)
    print(f"\n({time.time() - t:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
