"""Regenerate tests/fixtures/quant/reference_quants.npz with ggml's own code (read the fixture's
README for what each array is).

ggml's libraries (libggml-base.so and libggml-cpu.so of llama.cpp build 0c1e570, built for this
CPU) are loaded with ctypes:
- every quantized type: ggml_quantize_chunk without an importance matrix on the fixture's 16
  input rows (the rows themselves are kept as they are);
- the IQ4 and Q4_0 dot products: the input rows as activations, quantized by ggml's CPU
  from_float of the activation type (Q8_0, Q8_K), and the weights' dot products with them as
  llama.cpp's x86 build computes them: IQ4_NL and Q4_0 through their repacked 8-row gemv and
  gemm (ggml repacks IQ4_NL and Q4_0 matrices of 8k rows on AVX2 machines; the script checks that
  both give the same bits), IQ4_XS through ggml_vec_dot_iq4_xs_q8_K;
- Q3_K, Q5_K and Q6_K through ggml_vec_dot_q3_K_q8_K / _q5_K_q8_K / _q6_K_q8_K, the order llama.cpp takes for
  fewer than 8 activation rows (the small-batch order).

    python scripts/make_quant_fixture.py [--lib-dir /work/llamacpp/build/bin]

Arrays already in the file are compared with what ggml writes now and reported if they differ.
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "quant" / "reference_quants.npz"

# ggml type ids (ggml.h) and bytes per block (ggml-common.h)
TYPES = {"Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24),
         "Q8_0": (8, 32, 34), "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144),
         "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "IQ4_NL": (20, 32, 18), "IQ4_XS": (23, 256, 136)}
Q8_0, Q8_K = (8, 32, 34), (15, 256, 292)

# mangled names of ggml-cpu's repack templates for IQ4_NL and Q4_0 interleaved by 8 with Q8_0
# activations (ggml::cpu::repack::gemv / gemm<block_iq4_nl or block_q4_0, 8, 8, GGML_TYPE_Q8_0>)
# and of the quantizer of 4 activation rows the gemm reads (ggml_quantize_mat_t<8, GGML_TYPE_Q8_0>)
REPACKED = {name: tuple(f"_ZN4ggml3cpu6repack4{f}I{len(block)}{block}Ll8ELl8EL9ggml_type8EEEviPfmPKvS7_ii"
                        for f in ("gemv", "gemm"))
            for name, block in (("IQ4_NL", "block_iq4_nl"), ("Q4_0", "block_q4_0"))}
QUANT_MAT_Q8_0 = "_Z19ggml_quantize_mat_tILl8EL9ggml_type8EEvPKfPvll"


class TypeTraitsCpu(ctypes.Structure):  # ggml-cpu.h struct ggml_type_traits_cpu
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    assert a.flags.c_contiguous
    return ctypes.c_void_p(a.ctypes.data)


class Ggml:
    def __init__(self, lib_dir: Path):
        self.base = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
        self.cpu = ctypes.CDLL(str(lib_dir / "libggml-cpu.so"))
        self.cpu.ggml_cpu_init()
        self.base.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                  ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self.cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
        self.cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        for name in (f for pair in REPACKED.values() for f in pair):
            fn = getattr(self.cpu, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_int, ctypes.c_int]
        qm = getattr(self.cpu, QUANT_MAT_Q8_0)
        qm.restype = None
        qm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]

    def quantize(self, name: str, x: np.ndarray) -> np.ndarray:
        tid, blck, size = TYPES[name]
        rows, n = x.shape
        out = np.zeros((rows, n // blck * size), np.uint8)
        got = self.base.ggml_quantize_chunk(tid, ptr(x), ptr(out), 0, rows, n, None)
        assert got == out.nbytes, (name, got, out.nbytes)
        return out

    def traits(self, tid: int) -> TypeTraitsCpu:
        return self.cpu.ggml_get_type_traits_cpu(tid).contents

    def from_float(self, act: tuple, x: np.ndarray) -> np.ndarray:
        tid, blck, size = act
        fn = FROM_FLOAT(self.traits(tid).from_float)
        out = np.zeros((x.shape[0], x.shape[1] // blck * size), np.uint8)
        for r in range(x.shape[0]):
            fn(ptr(x[r]), ptr(out[r]), x.shape[1])
        return out

    def vec_dot(self, name: str, n: int, w: np.ndarray, a: np.ndarray) -> np.ndarray:
        """out[c, r] = ggml's vec_dot(weight row r, activation row c)"""
        fn = VEC_DOT(self.traits(TYPES[name][0]).vec_dot)
        out = np.zeros((a.shape[0], w.shape[0]), np.float32)
        s = np.zeros(1, np.float32)
        for c in range(a.shape[0]):
            for r in range(w.shape[0]):
                fn(n, ptr(s), 0, ptr(w[r]), 0, ptr(a[c]), 0, 1)
                out[c, r] = s[0]
        return out

    def repacked(self, name: str, n: int, w: np.ndarray, x: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """IQ4_NL or Q4_0 weights [8k rows] against activations (x: float rows, a: their Q8_0
        rows), through ggml's repacked gemv (one activation row at a time) and gemm (four at a
        time, from ggml's own 4-row activation quantizer): both out[c, r]."""
        rows, nb = w.shape[0], n // 32
        assert rows % 8 == 0 and x.shape[0] % 4 == 0
        blocks = w.reshape(rows, nb, 18)
        # block_iq4_nlx8 / block_q4_0x8 (repack.cpp make_block_iq4_nlx8 / make_block_q4_0x8): 8
        # rows' d, then their nibbles in 8-byte pieces, piece i from row i % 8 at byte 8 * (i // 8);
        # Q4_0's nibbles xor 0x88 (value - 8 as a signed nibble)
        flip = 0x88 if name == "Q4_0" else 0
        packed = np.zeros((rows // 8, nb, 16 + 128), np.uint8)
        for g in range(rows // 8):
            for b in range(nb):
                src = blocks[8 * g:8 * g + 8, b]
                packed[g, b, :16] = src[:, :2].reshape(-1)
                for i in range(16):
                    packed[g, b, 16 + 8 * i:24 + 8 * i] = src[i % 8, 2 + 8 * (i // 8):10 + 8 * (i // 8)] ^ flip
        gemv, gemm = (getattr(self.cpu, f) for f in REPACKED[name])
        out_v = np.zeros((a.shape[0], rows), np.float32)
        for c in range(a.shape[0]):
            gemv(n, ptr(out_v[c]), 0, ptr(packed), ptr(a[c]), 1, rows)
        out_m = np.zeros((x.shape[0], rows), np.float32)
        qm = getattr(self.cpu, QUANT_MAT_Q8_0)
        for c in range(0, x.shape[0], 4):
            a4 = np.zeros(4 * nb * 34, np.uint8)  # block_q8_0x4 rows
            qm(ptr(np.ascontiguousarray(x[c:c + 4])), ptr(a4), 4, n)
            gemm(n, ptr(out_m[c:c + 4]), rows, ptr(packed), ptr(a4), 4, rows)
        return out_v, out_m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib-dir", type=Path, default=Path("/work/llamacpp/build/bin"))
    ap.add_argument("--out", type=Path, default=FIXTURE)
    args = ap.parse_args()

    old = dict(np.load(FIXTURE)) if FIXTURE.exists() else {}
    x = old["input"]  # float32 [16, 512]: see the README
    g = Ggml(args.lib_dir)
    new = {"input": x}
    for name in TYPES:
        new[name] = g.quantize(name, x)

    acts = np.ascontiguousarray(np.roll(x, -1, axis=0))  # row c + 1 against weight row c
    n = x.shape[1]
    for name in REPACKED:
        new[f"{name}_act"] = g.from_float(Q8_0, acts)
        by_gemv, by_gemm = g.repacked(name, n, new[name], acts, new[f"{name}_act"])
        if not np.array_equal(by_gemv.view(np.uint32), by_gemm.view(np.uint32)):
            raise SystemExit(f"ggml's {name} gemv and gemm disagree: the fixture cannot hold one order")
        new[f"{name}_dot"] = by_gemv
    new["IQ4_XS_act"] = g.from_float(Q8_K, acts)
    new["IQ4_XS_dot"] = g.vec_dot("IQ4_XS", n, new["IQ4_XS"], new["IQ4_XS_act"])
    for name in ("Q3_K", "Q5_K", "Q6_K"):  # what llama.cpp takes below 8 activation rows (its tiled gemm from 8)
        new[f"{name}_act"] = g.from_float(Q8_K, acts)
        new[f"{name}_vec_dot"] = g.vec_dot(name, n, new[name], new[f"{name}_act"])

    for k, v in old.items():
        if k in new and not np.array_equal(v, new[k]):
            print(f"note: {k} differs from the array the file held")
    np.savez_compressed(args.out, **new)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {v.shape}" for k, v in new.items()))


if __name__ == "__main__":
    main()
