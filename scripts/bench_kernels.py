"""Micro-benchmark of the matmul kernels per weight type and ISA, through el_matmul (activation
quantization + the engine's gemm tiles, e.g. AVX-512's 16 rows x up to 16 tokens in the batch
order), single thread by default.

  matvec: one activation row against a matrix of about --mb MB (bigger than L2, like real
          layers) with rows of --matvec-k values; reported as GB/s of weights streamed.
  gemm:   --tokens activation rows (a comma list: one column each) against a K x N matrix;
          reported as GFLOP/s (2*K*N*tokens). --mb 0 skips the matvec.

Weights are random blocks with sane scales (speed does not depend on the values); --file puts
the matrix in a temporary file and maps it, as models are. Single-threaded runs are timed by
the thread's CPU clock (el_matmul with one thread runs on the caller), which other processes
on a shared machine do not inflate; best of --repeat.

  PYTHONPATH=src python scripts/bench_kernels.py [--types Q4_1,Q8_0] [--isas generic,avx2,avx512] [--order batch]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # no BLAS threads spinning beside the kernels

import numpy as np  # noqa: E402

from edgellm.kernels import ISA_NAMES, c_module  # noqa: E402
from edgellm.quants import BLOCK_DTYPES, QType, type_info  # noqa: E402

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS"]


def random_weights(t: QType, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    info = type_info(t)
    raw = rng.integers(0, 256, size=(rows, info.row_bytes(n)), dtype=np.uint8)
    if t in BLOCK_DTYPES:
        b = raw.reshape(-1).view(BLOCK_DTYPES[t])
        for f in ("d", "m", "dmin"):
            if f in b.dtype.names:
                b[f] = np.float16(0.01)
    elif t == QType.F32:
        raw[:] = rng.standard_normal((rows, n)).astype(np.float32).view(np.uint8)
    elif t == QType.F16:
        raw[:] = rng.standard_normal((rows, n)).astype(np.float16).view(np.uint8)
    else:
        raw[:] = (rng.standard_normal((rows, n)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return raw


class Bench:
    def __init__(self):
        mod = c_module()
        if mod is None:
            raise SystemExit("C kernels not built: python csrc/build_ffi.py")
        self.ffi, self.lib = mod

    def matmul_time(self, t: QType, w: np.ndarray, n: int, x: np.ndarray, threads: int, repeat: int,
                    llama_order: bool = True) -> float:
        ffi = self.ffi
        tensor = ffi.new("el_tensor *")
        tensor.type, tensor.data, tensor.ne0, tensor.ne1, tensor.row_bytes = int(t), ffi.from_buffer(w), n, w.shape[0], w.shape[1]
        y = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
        xp, yp = ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", y)
        clock = time.thread_time if threads == 1 else time.perf_counter
        best = float("inf")
        for _ in range(repeat):
            t0 = clock()
            if self.lib.el_matmul_order(tensor, xp, x.shape[0], yp, threads, int(llama_order)) != 0:
                raise RuntimeError(f"el_matmul failed for {t.name}")
            best = min(best, clock() - t0)
        return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--isas", default="")
    ap.add_argument("--mb", type=float, default=30.0, help="matvec matrix size in MB")
    ap.add_argument("--matvec-k", type=int, default=4096,
                    help="matvec row length (a model's own, say 576 for SmolLM2-135M: the rows a tile of the "
                         "one-column kernels spans, and so their prefetching, depend on it)")
    ap.add_argument("--k", type=int, default=2048, help="gemm row length")
    ap.add_argument("--rows", type=int, default=2048, help="gemm weight rows")
    ap.add_argument("--tokens", default="64", help="activation rows of the gemm, e.g. 1,4,5,8,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--file", action="store_true", help="map the matvec matrix from a file")
    ap.add_argument("--order", choices=["llama", "batch"], default="llama",
                    help="the kernels of llama_order steps (single stream) or of the batched engine's steps; "
                         "F32/F16/BF16 in llama order: the vec_dot kernels el_matmul takes, not the engine's "
                         "float_llama.c tiles (el_matmul keeps vec_dot's bits, which the ISA tests check)")
    args = ap.parse_args()
    names = args.types.split(",")
    for name in names:  # bad input: one line, before any work
        if name not in QType.__members__:
            raise SystemExit(f"unknown type {name!r} (known: {', '.join(QType.__members__)})")
        for opt, k in (("--k", args.k), ("--matvec-k", args.matvec_k)):
            if k <= 0 or k % type_info(QType[name]).block_size:
                raise SystemExit(f"{opt} {k} is not a positive multiple of {name}'s block size "
                                 f"{type_info(QType[name]).block_size}")

    b = Bench()
    best = b.lib.el_cpu_isa_best()
    isas = args.isas.split(",") if args.isas else [ISA_NAMES[i] for i in range(best + 1) if ISA_NAMES[i] != "neon"]
    rng = np.random.default_rng(0)
    n = args.matvec_k
    tokens = [int(v) for v in args.tokens.split(",")]
    print(f"threads={args.threads}  matvec: ~{args.mb:.0f} MB, K={n}   gemm: K={args.k} N={args.rows} (GFLOP/s per token count)")
    print(f"{'type':6} {'isa':12} {'matvec GB/s':>12} " + " ".join(f"{'m=' + str(m):>8}" for m in tokens))
    for name in names:
        t = QType[name]
        rows = max(16, int(args.mb * 1e6 / type_info(t).row_bytes(n))) if args.mb > 0 else 0
        w = random_weights(t, rows, n, rng)
        if args.file:
            with tempfile.NamedTemporaryFile(suffix=".bin") as f:
                w.tofile(f.name)
                w = np.memmap(f.name, dtype=np.uint8, mode="r", shape=w.shape)
        x1 = rng.standard_normal((1, n)).astype(np.float32)
        wg = random_weights(t, args.rows, args.k, rng)
        xgs = [rng.standard_normal((m, args.k)).astype(np.float32) for m in tokens]
        for isa in isas:
            variants = [isa] + (["avx2-novnni"] if isa == "avx2" else [])
            for v in variants:
                if v.endswith("-novnni"):
                    os.environ["EDGELLM_X86_VNNI"] = "0"
                got = ISA_NAMES[b.lib.el_set_isa(ISA_NAMES.index(v.split("-")[0]))]
                os.environ.pop("EDGELLM_X86_VNNI", None)
                if got != v.split("-")[0]:  # el_set_isa falls back to what the CPU runs
                    print(f"{name:6} {v:12} {'(this CPU runs ' + got + ')':>26}", flush=True)
                    continue
                slow = v == "generic"
                lo = args.order == "llama"
                gbs = w.nbytes / b.matmul_time(t, w, n, x1, args.threads, 2 if slow else args.repeat, lo) / 1e9 if rows else 0.0
                gflops = [2.0 * args.k * args.rows * xg.shape[0]
                          / b.matmul_time(t, wg, args.k, xg, args.threads, 1 if slow else args.repeat, lo) / 1e9
                          for xg in xgs]
                print(f"{name:6} {v:12} {gbs:12.1f} " + " ".join(f"{g:8.1f}" for g in gflops), flush=True)
    b.lib.el_set_isa(-1)


if __name__ == "__main__":
    main()
