#!/usr/bin/env python3
"""Run llama.cpp on the tiny model of every architecture (tests/tiny_archs.py) and write what it
computes to tests/fixtures/arch/<name>.json, with the sha256 of the file it ran.

    python scripts/make_arch_references.py [NAME ...] --llama-python /path/to/venv/bin/python

The tiny files are built here (edgellm's environment, with the test extra and llama.cpp's source
fetched by tests/llamacpp_source.py); llama.cpp runs in a separate interpreter that has
llama-cpp-python 0.3.36 (build 0c1e570; set LLAMA_CPP_LIB_PATH if its libllama lives elsewhere),
one fresh process per file, on the CPU with 2 threads and llama-cpp-python's defaults otherwise
(no flash attention, f16 KV cache) but for YaRN's parameters, which are left to the model as
llama.cpp's own defaults do. For each file it records:
- teacher_forced: the first N_TF tokens of tests/fixtures/apache-2.0.txt as llama.cpp tokenizes it
  (BOS first where the model's metadata asks for one), evaluated in one batch: for every position the
  top-8 token ids with their log-probabilities and the log-probability of the next token of the text;
- batch_envelope: how far llama.cpp's own token-by-token evaluation (n_batch 1) of the same tokens
  is from its batch one: max and mean |difference| of those log-probabilities, and the top-1 agreement;
- greedy: the first 16 tokens as a prompt, then 32 tokens chosen by argmax one at a time;
- tokenize: the ids of each text of llama.cpp's own tokenizer test (models/ggml-vocab-llama-bpe.gguf.inp)
  and of TEXTS, tokenized without BOS and without special tokens - where a file's vocabulary is
  not one of llama.cpp's suite (tiny_archs.VOCABS), this is what checks edgellm's tokenizer on it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "arch"
TEXT = ROOT / "tests" / "fixtures" / "apache-2.0.txt"
N_TF, TOP_K, N_PROMPT, N_GREEDY = 320, 8, 16, 32
# besides llama.cpp's test texts: case changes inside words, contractions after capitals, runs of
# digits, slashes and marks (what the gpt-4o pre-tokenizer splits differently)
TEXTS = ["CamelCaseWords and HTTPServer2Go, XMLHttpRequest", "DON'T, Won'T, they'RE o'clock",
         "1234567 12.5% $1,000,000", "path/to/file.txt//x\\y", "Ẓ̈ḁ́l̴g̶o é e\u0301 ÉCOLE Straße",
         "tab\tsep\r\nline  two   spaces\n\n\n"]
# the context each reference is made with: phi3's LongRoPE picks its short factors up to the
# original context (600 tokens in the tiny file), its long ones beyond
RUNS = {"phi3": ("phi3", 512), "phi3-long": ("phi3", 1024)}
DEFAULT_N_CTX = 512


def runs() -> dict[str, tuple[str, int]]:
    sys.path.insert(0, str(ROOT / "tests"))
    import tiny_archs

    out = {name: (name, DEFAULT_N_CTX) for name in tiny_archs.SPECS if name != "phi3"}
    out.update(RUNS)
    return dict(sorted(out.items()))


def worker(model: str, n_ctx: int, text: str, probes: list[str]) -> dict:
    """In llama.cpp's interpreter: everything the JSON holds for one file."""
    import numpy as np
    from llama_cpp import Llama

    def load(n_batch):
        # YaRN's parameters as llama.cpp's defaults leave them (-1: the model's), not the fixed
        # 32 / 1 / 1 llama-cpp-python passes
        return Llama(model_path=model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=2,
                     n_threads_batch=2, logits_all=True, verbose=False, seed=0, yarn_ext_factor=-1.0,
                     yarn_attn_factor=-1.0, yarn_beta_fast=-1.0, yarn_beta_slow=-1.0)

    def log_softmax(x):
        x = np.asarray(x, dtype=np.float64)
        m = x.max(-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

    llm = load(512)
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)[:N_TF]
    assert len(ids) == N_TF
    llm.eval(ids)
    lp = log_softmax(llm.scores[:N_TF])
    top = np.argsort(-lp, axis=-1, kind="stable")[:, :TOP_K]
    tf = {"ids": ids, "top_ids": top.tolist(),
          "top_logprobs": np.round(np.take_along_axis(lp, top, -1), 5).tolist(),
          "next_logprobs": np.round(lp[np.arange(N_TF - 1), ids[1:]], 5).tolist()}

    one = load(1)
    one.eval(ids)
    lp1 = log_softmax(one.scores[:N_TF])
    d = np.abs(np.take_along_axis(lp1, top, -1) - np.take_along_axis(lp, top, -1))
    envelope = {"max_abs": float(d.max()), "mean_abs": float(d.mean()),
                "top1_agreement": float(np.mean(lp1.argmax(-1) == top[:, 0]))}
    del one

    llm.reset()
    prompt = ids[:N_PROMPT]
    llm.eval(prompt)
    out = []
    for _ in range(N_GREEDY):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(t)
        llm.eval([t])
    tokenized = [{"text": t, "ids": llm.tokenize(t.encode("utf-8"), add_bos=False, special=False)} for t in probes]
    return {"n_ctx": n_ctx, "teacher_forced": tf, "batch_envelope": envelope,
            "greedy": {"prompt_ids": prompt, "ids": out}, "tokenize": tokenized}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="references to make (default: all)")
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", ""),
                    help="a Python interpreter with llama-cpp-python 0.3.36")
    ap.add_argument("--worker", nargs=4, metavar=("MODEL", "N_CTX", "PROBES", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        model, n_ctx, probes, out = args.worker
        result = worker(model, int(n_ctx), TEXT.read_text(encoding="utf-8"), json.loads(Path(probes).read_text()))
        Path(out).write_text(json.dumps(result))
        return
    if not args.llama_python:
        sys.exit("say which interpreter has llama-cpp-python: --llama-python PATH (or LLAMA_PYTHON)")
    from importlib.metadata import version

    todo = runs()
    import llamacpp_source  # runs() put tests/ on the path
    import tiny_archs

    probes = [text for text, _ in llamacpp_source.vocab_cases(llamacpp_source.vocab_file("llama-bpe"))] + TEXTS

    names = args.names or list(todo)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "probes.json").write_text(json.dumps(probes))
        for name in names:
            spec, n_ctx = todo[name]
            path = tiny_archs.build(spec, Path(tmp))
            res = Path(tmp) / "out.json"
            subprocess.run([args.llama_python, __file__, "--worker", str(path), str(n_ctx), str(Path(tmp) / "probes.json"),
                            str(res)], check=True)
            ref = {"name": name, "spec": spec, "file": path.name, "sha256": tiny_archs.sha256(path),
                   "file_size": path.stat().st_size, "written_with": f"gguf-py {version('gguf')}",
                   "llama_cpp": "llama-cpp-python 0.3.36 (llama.cpp 0c1e570), CPU, 2 threads",
                   **json.loads(res.read_text())}
            (OUT / f"{name}.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
            env = ref["batch_envelope"]
            print(f"{name}: {ref['sha256'][:12]} greedy {ref['greedy']['ids'][:8]}... "
                  f"batch vs 1-by-1: max {env['max_abs']:.2e} mean {env['mean_abs']:.2e}", flush=True)


if __name__ == "__main__":
    main()
