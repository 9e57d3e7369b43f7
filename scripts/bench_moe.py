#!/usr/bin/env python3
"""Mixture-of-experts speed on a realistically shaped model, edgellm against llama.cpp.

    python scripts/bench_moe.py --llamacpp-bin /path/to/llama.cpp/build/bin [-L 8] [--type q4_0] [-r 3]

PyPI ships no MoE weights, so this builds one: a random-weight qwen3moe GGUF with Qwen3-30B-A3B's
per-layer shape (hidden 2048, 32 query heads sharing 4 key/value heads of 128, 128 experts of
which 8 are used, experts 768 wide, an untied output over the 151,936-token Qwen 2 vocabulary of
llama.cpp's tokenizer suite) but only -L layers (8: ~3 GB in Q4_0, where the real model has 48).
It is written by tests/tiny_archs.py's builder at that shape, its weight matrices as random
quantized blocks of the chosen types (scaled to about N(0, 1/fan_in), drawn straight as bytes -
nothing is quantized), deterministic from --seed and cached in $EDGELLM_HOME/bench.

Then scripts/bench_vs_llamacpp.py runs on it: `edgellm bench` against llama-bench (pp and tg at
-t threads, alternating, -r rounds, medians and the ratio), and with --batch against
llama-batched-bench (`edgellm bench --batch`; --batch-prompt / --batch-gen tokens per sequence).
--build-only prints the file's path and stops.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import tiny_archs  # noqa: E402
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from edgellm.quants import BLOCK_DTYPES, QType, type_info  # noqa: E402
from edgellm.registry import home  # noqa: E402

# Qwen3-30B-A3B's config.json (hidden_size, num_attention_heads, num_key_value_heads, head_dim,
# intermediate_size, num_experts, num_experts_per_tok, moe_intermediate_size)
A3B = tiny_archs.Shape(n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_ff=6144,
                       n_expert=128, n_expert_used=8, n_ff_shexp=0)
A3B_EXPERT_FF = 768
# tensor types: the default, and by name-part where the mix differs (llama.cpp's Q4_K_M gives
# the output, attn_v and (most) ffn_down tensors Q6_K)
MIXES = {
    "q4_0": (QType.Q4_0, {}),
    "q8_0": (QType.Q8_0, {}),
    "q4_k_m": (QType.Q4_K, {"output.": QType.Q6_K, "attn_v.": QType.Q6_K, "ffn_down_exps.": QType.Q6_K}),
}


class _Shapes(tiny_archs.Rand):
    """tiny_archs' weight source, but a matrix that would be F16 or quantized is left as its shape
    and standard deviation, for random_blocks to fill in by tensor name."""

    def matrix(self, *ne, scale=None, qtype=GT.F16):
        if qtype == GT.F32:
            return super().matrix(*ne, scale=scale, qtype=qtype)
        return ("blocks", ne, ne[0] ** -0.5 if scale is None else scale)


def _scales(t: QType, rng: np.random.Generator) -> tuple[float, float]:
    """(d, dmin) that give t's random blocks a standard deviation of 1 and a mean of 0: measured on
    sample blocks dequantized by gguf-py with d = 1, dmin = 0 and then d = 0, dmin = 1."""
    dt = BLOCK_DTYPES[t]
    raw = rng.integers(0, 256, size=256 * dt.itemsize, dtype=np.uint8)
    blocks = raw.view(dt)
    blocks["d"] = 1.0
    if "dmin" in dt.names:
        blocks["dmin"] = 0.0
    v = dequantize(raw, GT(int(t)))
    d = 1.0 / float(v.std())
    if "dmin" not in dt.names:
        return d, 0.0
    mean = float(v.mean()) * d
    blocks["d"], blocks["dmin"] = 0.0, 1.0
    return d, -mean / float(dequantize(raw, GT(int(t))).mean())


def random_blocks(t: QType, ne: tuple, std: float, rng: np.random.Generator, scales: dict) -> tuple:
    """(type, bytes) of a ggml-shape ne matrix of random t blocks with about this std and mean 0."""
    info = type_info(t)
    rows = int(np.prod(ne[1:]))
    raw = rng.integers(0, 256, size=(rows, ne[0] // info.block_size * info.type_size), dtype=np.uint8)
    blocks = raw.reshape(-1).view(BLOCK_DTYPES[t])
    d, dmin = scales[t]
    blocks["d"] = d * std
    if dmin:
        blocks["dmin"] = dmin * std
    return GT(int(t)), raw.reshape(*reversed(ne[1:]), -1)


def write_random_model(out: Path, spec: tiny_archs.Spec, shape: tiny_archs.Shape, name: str, default: QType,
                       by_name: dict, seed: int) -> Path:
    """spec's file at shape, named `name`, written to out (atomically): its matrices random blocks of
    `default`, or of by_name's type where a part of the tensor's name matches."""
    out.parent.mkdir(parents=True, exist_ok=True)
    md = tiny_archs.metadata(spec, shape=shape)
    md = [(k, t, name, s) if k == "general.name" else (k, t, v, s) for k, t, v, s in md]
    rng = np.random.default_rng(seed)
    types = {default, *by_name.values()}
    scales = {t: _scales(t, rng) for t in sorted(types)}
    tensors = tiny_archs.tensors(spec, tiny_archs.vocab_size(md), shape, _Shapes(seed))
    for tname, t in tensors.items():
        if isinstance(t, tuple) and t[0] == "blocks":
            qt = next((q for part, q in by_name.items() if part in tname), default)
            tensors[tname] = random_blocks(qt, t[1], t[2], rng, scales)
    tmp = out.with_suffix(".tmp")
    tiny_archs.write(tmp, spec.arch, md, tensors)
    os.replace(tmp, out)
    return out


def build(n_layer: int, mix: str, seed: int) -> Path:
    out = home() / "bench" / f"qwen3moe-a3b-shape-{n_layer}L-{mix}-seed{seed}.gguf"
    if out.exists():
        return out
    spec = replace(tiny_archs.SPECS["qwen3moe"], seed=seed, output=True, n_ff_exp=A3B_EXPERT_FF)
    return write_random_model(out, spec, replace(A3B, n_layer=n_layer),
                              f"qwen3moe (Qwen3-30B-A3B's shape, {n_layer} layers, random {mix})", *MIXES[mix], seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-L", "--layers", type=int, default=8)
    ap.add_argument("--type", choices=sorted(MIXES), default="q4_0")
    ap.add_argument("--seed", type=int, default=30)
    ap.add_argument("--llamacpp-bin", help="the directory of llama.cpp's llama-bench and llama-batched-bench")
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--batch", help="comma-separated sequence counts: llama-batched-bench's test too")
    ap.add_argument("--batch-prompt", type=int, default=128)
    ap.add_argument("--batch-gen", type=int, default=32)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    path = build(args.layers, args.type, args.seed)
    print(f"{path} ({path.stat().st_size / 1e9:.2f} GB)", flush=True)
    if args.build_only:
        return
    if not args.llamacpp_bin:
        sys.exit("--llamacpp-bin DIR: llama.cpp's build/bin with llama-bench and llama-batched-bench")
    bin_dir = Path(args.llamacpp_bin)
    vs = [sys.executable, str(ROOT / "scripts" / "bench_vs_llamacpp.py"), str(path), "-t", args.threads,
          "-r", str(args.rounds)]
    subprocess.run(vs + ["-p", str(args.n_prompt), "-n", str(args.n_gen), "--llama-bench",
                         str(bin_dir / "llama-bench")], check=True)
    if args.batch:
        subprocess.run(vs + ["-p", str(args.batch_prompt), "-n", str(args.batch_gen), "--batched", args.batch,
                             "--batched-bench", str(bin_dir / "llama-batched-bench")], check=True)


if __name__ == "__main__":
    main()
