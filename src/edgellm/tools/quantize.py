"""`edgellm quantize`: convert a GGUF model's tensors to another type mix, streaming.

What llama.cpp's llama_model_quantize does (src/llama-quant.cpp), in our own code:
- every metadata pair is copied byte for byte, general.quantization_version (2, GGML_QNT_VERSION)
  and general.file_type (the LLAMA_FTYPE number) are set last, split keys are dropped;
- tensors are written in llama.cpp's order (quant_mix.tensor_order) with the types quant_mix
  picks; a tensor whose type does not change is copied, the others are converted to float32
  (exactly: ggml's dequantize_row_* / f16 / bf16 widening) and quantized with the reference
  quantizers (quantize_row_*_ref: ggml_quantize_chunk's bytes without an importance matrix);
- requantizing an already quantized tensor needs allow_requantize.
Memory stays bounded: the input is read and converted in slabs of at most SLAB_VALUES values, the
slab split across threads (the C kernels release the GIL). The output appears only when complete.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import EdgeLLMError, UnsupportedModelError
from ..gguf_file import GGUFFile, ValueType
from ..gguf_writer import GGUFStreamWriter, TensorSpec, encode_kv, open_atomic, read_raw_kv
from ..kernels import c_module
from ..quants import QType, type_info
from .quant_mix import Decision, FileType, plan, tensor_order

QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION
SLAB_VALUES = 1 << 22  # values converted per slab: 16 MiB of float32
_DROPPED_KEYS = ("general.quantization_version", "general.file_type",
                 "split.no", "split.count", "split.tensors.count")

# Source types we can widen to float32 (F32 needs nothing).
_READABLE = (QType.F32, QType.F16, QType.BF16, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0,
             QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K, QType.IQ4_NL, QType.IQ4_XS)


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _ggml_name(t: QType) -> str:
    """ggml's spelling in function names: q4_0, q4_K, f16."""
    n = t.name
    return n[:-2].lower() + "_K" if n.endswith("_K") else n.lower()


class _Converter:
    """float32 <-> one tensor type over whole slabs through the C reference kernels."""

    def __init__(self):
        mod = c_module()
        if mod is None:
            raise EdgeLLMError("quantizing needs edgellm's C kernels, which are not built")
        self.ffi, self.lib = mod

    def to_float(self, t: QType, src: np.ndarray, dst: np.ndarray) -> None:
        """src: uint8 bytes of dst.size values of type t; dst: float32."""
        if t == QType.F32:
            dst[:] = src.view(np.float32)
        elif t == QType.F16:
            dst[:] = src.view(np.float16)  # exact widening
        else:
            fn = getattr(self.lib, f"dequantize_row_{_ggml_name(t)}")
            fn(self.ffi.from_buffer(src), self.ffi.from_buffer("float[]", dst), dst.size)

    def from_float(self, t: QType, src: np.ndarray, dst: np.ndarray) -> None:
        if t == QType.F32:
            dst[:] = src.view(np.uint8)
        else:
            fn = getattr(self.lib, f"quantize_row_{_ggml_name(t)}_ref")
            fn(self.ffi.from_buffer("float[]", src), self.ffi.from_buffer(dst), src.size)


@dataclass
class QuantizeResult:
    decisions: list[Decision]
    bytes_in: int = 0
    bytes_out: int = 0
    n_elements: int = 0


@dataclass
class Progress:
    """Callbacks while quantizing: a tensor starts (index, count, decision, bytes in, bytes out);
    input bytes done."""
    tensor: Callable[[int, int, Decision, int, int], None] = lambda *a: None
    advance: Callable[[int], None] = lambda n: None


def plan_quantization(src: GGUFFile, ft: FileType, *, pure: bool = False,
                      overrides: Sequence[tuple[re.Pattern, QType]] = (),
                      allow_requantize: bool = False) -> list[Decision]:
    """The decision for every tensor, in output order; raises before anything is written when the
    input cannot be converted as asked."""
    names = tensor_order(src.tensors)
    infos = [src.tensors[n] for n in names]
    decisions = plan(src.metadata, [(t.name, t.shape, t.qtype) for t in infos], ft, pure=pure, overrides=overrides)
    requant = [d for d in decisions if d.converts and type_info(d.source).block_size > 1]
    if requant and not allow_requantize:
        d = requant[0]
        raise EdgeLLMError(f"{src.path}: tensor {d.name} is already quantized ({d.source.name}); "
                           f"requantizing {len(requant)} tensor(s) loses precision - pass --allow-requantize to do it anyway")
    for d in decisions:
        if d.converts and d.source not in _READABLE:
            raise UnsupportedModelError(f"{src.path}: tensor {d.name} has type {d.source.name}, "
                                        f"which cannot be converted to {d.target.name}")
    return decisions


def _same_file(a: Path, b: Path) -> bool:
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def quantize_model(src_path: str | os.PathLike, dst_path: str | os.PathLike, ft: FileType, *,
                   pure: bool = False, overrides: Sequence[tuple[re.Pattern, QType]] = (),
                   allow_requantize: bool = False, n_threads: int | None = None,
                   progress: Progress | None = None) -> QuantizeResult:
    src_path, dst_path = Path(src_path), Path(dst_path)
    if src_path.resolve() == dst_path.resolve() or _same_file(src_path, dst_path):
        raise EdgeLLMError(f"the output file is the input file ({dst_path}); choose another name")
    if dst_path.is_dir():
        raise EdgeLLMError(f"{dst_path} is a directory; give the output file name")
    progress = progress or Progress()
    n_threads = max(1, n_threads or default_threads())
    with GGUFFile(src_path) as src:
        decisions = plan_quantization(src, ft, pure=pure, overrides=overrides, allow_requantize=allow_requantize)
        kv = [raw for key, raw in read_raw_kv(src_path).items() if key not in _DROPPED_KEYS]
        kv.append(encode_kv("general.quantization_version", ValueType.UINT32, QUANTIZATION_VERSION))
        kv.append(encode_kv("general.file_type", ValueType.UINT32, ft.ftype))
        specs = [TensorSpec(d.name, src.tensors[d.name].shape, d.target) for d in decisions]
        result = QuantizeResult(decisions)
        try:
            with open_atomic(dst_path) as out, open(src_path, "rb", buffering=0) as fin, \
                    ThreadPoolExecutor(n_threads) as pool:
                writer = GGUFStreamWriter(out, kv, specs, alignment=src.alignment)
                conv = _Converter()
                for i, (d, spec) in enumerate(zip(decisions, specs)):
                    info = src.tensors[d.name]
                    progress.tensor(i, len(decisions), d, info.nbytes, spec.nbytes)
                    if d.converts:
                        _convert_tensor(fin, info, d.target, writer, conv, pool, n_threads, progress)
                    else:
                        _copy_tensor(fin, info, writer, progress)
                    result.bytes_in += info.nbytes
                    result.bytes_out += spec.nbytes
                    result.n_elements += info.n_elements
                writer.close()
        except OSError as e:
            raise EdgeLLMError(f"quantizing to {dst_path} failed: {e.strerror or e} (nothing was written)") from None
    return result


def _read(fin, offset: int, buf: np.ndarray) -> None:
    fin.seek(offset)
    mv = memoryview(buf).cast("B")
    got = 0
    while got < len(mv):
        n = fin.readinto(mv[got:])
        if not n:
            raise EdgeLLMError(f"{fin.name}: unexpected end of file at offset {offset + got}")
        got += n


def _copy_tensor(fin, info, writer: GGUFStreamWriter, progress: Progress) -> None:
    step = max(info.row_bytes, SLAB_VALUES * 4 // info.row_bytes * info.row_bytes)
    buf = np.empty(min(step, info.nbytes), np.uint8)
    for off in range(0, info.nbytes, step):
        part = buf[: min(step, info.nbytes - off)]
        _read(fin, info.offset + off, part)
        writer.write(part)
        progress.advance(part.size)


def _convert_tensor(fin, info, target: QType, writer: GGUFStreamWriter, conv: _Converter,
                    pool: ThreadPoolExecutor, n_threads: int, progress: Progress) -> None:
    ne0, n_rows = info.shape[0], info.rows
    rb_in, rb_out = info.row_bytes, type_info(target).row_bytes(ne0)
    slab_rows = max(1, min(n_rows, SLAB_VALUES // ne0))
    src_buf = np.empty((slab_rows, rb_in), np.uint8)
    f32_buf = np.empty((slab_rows, ne0), np.float32)
    out_buf = np.empty((slab_rows, rb_out), np.uint8)

    def work(lo: int, hi: int) -> bool:
        x = f32_buf[lo:hi].reshape(-1)
        conv.to_float(info.qtype, src_buf[lo:hi].reshape(-1), x)
        if not np.isfinite(x).all():
            return False
        conv.from_float(target, x, out_buf[lo:hi].reshape(-1))
        return True

    for r0 in range(0, n_rows, slab_rows):
        n = min(slab_rows, n_rows - r0)
        _read(fin, info.offset + r0 * rb_in, src_buf[:n])
        bounds = np.linspace(0, n, min(n_threads, n) + 1).astype(int)
        if not all(pool.map(work, bounds[:-1], bounds[1:])):
            raise EdgeLLMError(f"tensor {info.name} holds NaN or infinite values (rows {r0}..{r0 + n - 1}); "
                               "refusing to quantize it")
        writer.write(out_buf[:n])
        progress.advance(n * rb_in)
