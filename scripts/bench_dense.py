#!/usr/bin/env python3
"""The weight types people download, at a real model's shape, edgellm against llama.cpp.

    python scripts/bench_dense.py --type Q5_K --llamacpp-bin /path/to/llama.cpp/build/bin [-L 8] [-r 3]

The two models PyPI ships are SmolLM2 Q4_1 and Gemma-3 270M Q4_K_M, whose rows (576 and 640 values)
are too short for most K-quants, so the formats of 1B-8B downloads (Q4_K_M, Q5_K, Q6_K, Q3_K,
IQ4_XS, Q4_0, ...) would otherwise be measured only by kernel benchmarks. This builds a random-weight
llama GGUF with Llama-3.2-1B's layer shape (hidden 2048, 32 query heads sharing 8 key/value heads of
64, FFN 8192, the output tied to the embeddings) but only -L layers, every matrix of one --type (a
GGML type name) or of the q4_k_m mix (Q4_K, with attn_v and ffn_down in Q6_K as llama.cpp's Q4_K_M
gives most of them), the way scripts/bench_moe.py builds its model (random quantized blocks with
sane scales, nothing quantized; deterministic from --seed, cached in $EDGELLM_HOME/bench).

Then scripts/bench_vs_llamacpp.py runs on it: pp and tg against llama-bench at -t threads,
alternating, -r rounds. --build-only prints the file's path and stops.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

import bench_moe  # noqa: E402
import tiny_archs  # noqa: E402

from edgellm.quants import QType  # noqa: E402
from edgellm.registry import home  # noqa: E402

# Llama-3.2-1B's config.json (hidden_size, num_attention_heads, num_key_value_heads, head_dim,
# intermediate_size)
LLAMA_1B = tiny_archs.Shape(n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192)
MIXES = {"q4_k_m": (QType.Q4_K, {"attn_v.": QType.Q6_K, "ffn_down.": QType.Q6_K})}


def build(n_layer: int, mix: str, seed: int) -> Path:
    out = home() / "bench" / f"llama-1b-shape-{n_layer}L-{mix}-seed{seed}.gguf"
    if out.exists():
        return out
    default, by_name = MIXES.get(mix) or (QType[mix], {})  # (mix: a MIXES key or a QType name, as main spells it)
    return bench_moe.write_random_model(out, tiny_archs.Spec("llama", "llama-bpe", seed, output=False),
                                        replace(LLAMA_1B, n_layer=n_layer),
                                        f"llama (Llama-3.2-1B's shape, {n_layer} layers, random {mix})", default,
                                        by_name, seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-L", "--layers", type=int, default=8)
    ap.add_argument("--type", default="q4_k_m", help="a GGML type name (Q5_K, IQ4_XS, ...) or q4_k_m")
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--llamacpp-bin", help="the directory of llama.cpp's llama-bench")
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-p", "--n-prompt", type=int, default=128)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    if args.type.lower() not in MIXES and args.type.upper() not in QType.__members__:
        sys.exit(f"--type {args.type}: not a GGML type name nor one of {', '.join(MIXES)}")
    path = build(args.layers, args.type.lower() if args.type.lower() in MIXES else args.type.upper(), args.seed)
    print(f"{path} ({path.stat().st_size / 1e9:.2f} GB)", flush=True)
    if args.build_only:
        return
    if not args.llamacpp_bin:
        sys.exit("--llamacpp-bin DIR: llama.cpp's build/bin with llama-bench")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_vs_llamacpp.py"), str(path), "-t", args.threads,
                    "-r", str(args.rounds), "-p", str(args.n_prompt), "-n", str(args.n_gen), "--llama-bench",
                    str(Path(args.llamacpp_bin) / "llama-bench")], check=True)


if __name__ == "__main__":
    main()
