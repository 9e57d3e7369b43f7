"""Row-level quantize / dequantize / dot product over numpy arrays, on the C twin or on numba.

Function names follow ggml's: `quantize_row_<t>_ref`, `dequantize_row_<t>`,
`vec_dot_<t>_<act>_generic`. The C functions come from the cffi module (csrc/quants_generic.c,
csrc/kquants_generic.c, csrc/iquants_generic.c); the numba ones (kernels/numba_quants.py,
numba_kquants.py, numba_iquants.py) have the same names and take numpy arrays instead of pointers.
"""

from __future__ import annotations

import numpy as np

from ..quants import QType, type_info
from . import c_module

BACKENDS = ("c", "numba")


# the types whose batch-invariant steps take an order of their own (quants_generic.c; Q4_0 has
# one order, llama.cpp's repacked one, which is the batch order)
BATCH_ORDER_TYPES = frozenset({QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0})
# the types llama.cpp sums in another order in small batches (el_small_rows, csrc/el_internal.h)
SMALL_ORDER_TYPES = frozenset({QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K, QType.IQ4_XS})


def _lname(t: QType) -> str:
    """ggml's spelling in function names: q4_0, q4_K, f16."""
    n = QType(t).name
    return n[:-2].lower() + "_K" if n.endswith("_K") else n.lower()


def _numba_module(t: QType):
    name = QType(t).name
    if name.startswith("IQ"):
        from . import numba_iquants

        return numba_iquants
    if name.endswith("_K"):
        from . import numba_kquants

        return numba_kquants
    from . import numba_quants

    return numba_quants


def _c_or_fail():
    m = c_module()
    if m is None:
        raise RuntimeError("edgellm's C kernels are not built")
    return m


def _as_f32_2d(x) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x.reshape(1, -1) if x.ndim == 1 else x


def _bytes(a, want: int, what: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != np.uint8:
        raise TypeError(f"{what}: expected uint8 bytes, got {a.dtype}")
    a = np.ascontiguousarray(a).reshape(-1)
    if a.size != want:
        raise ValueError(f"{what}: expected {want} bytes, got {a.size}")
    return a


def quantize_rows(t: QType, x, backend: str = "c") -> np.ndarray:
    """Reference-quantize float rows [rows, n] of x into uint8 [rows, row_bytes]."""
    t = QType(t)
    x = _as_f32_2d(x)
    if type_info(t).block_size > 1 and not np.all(np.isfinite(x)):
        raise ValueError(f"cannot quantize NaN or infinite values to {t.name}")
    rows, n = x.shape
    out = np.zeros((rows, type_info(t).row_bytes(n)), dtype=np.uint8)
    if t == QType.F32:
        out[:] = x.view(np.uint8)
        return out
    name = f"quantize_row_{_lname(t)}_ref"
    if backend == "c":
        ffi, lib = _c_or_fail()
        fn = getattr(lib, name)
        for r in range(rows):
            fn(ffi.from_buffer("float[]", x[r]), ffi.from_buffer(out[r]), n)
    else:
        fn = getattr(_numba_module(t), name)
        for r in range(rows):
            fn(x[r], out[r])
    return out


def dequantize_rows(t: QType, data, n: int, backend: str = "c") -> np.ndarray:
    """uint8 [rows, row_bytes] (or flat) holding rows of n values -> float32 [rows, n]."""
    t = QType(t)
    data = np.ascontiguousarray(data, dtype=np.uint8)
    rb = type_info(t).row_bytes(n)
    data = data.reshape(-1, rb)
    out = np.empty((data.shape[0], n), dtype=np.float32)
    if t == QType.F32:
        out[:] = data.view(np.float32)
        return out
    name = f"dequantize_row_{_lname(t)}"
    if backend == "c":
        ffi, lib = _c_or_fail()
        fn = getattr(lib, name)
        for r in range(data.shape[0]):
            fn(ffi.from_buffer(data[r]), ffi.from_buffer("float[]", out[r]), n)
    else:
        fn = getattr(_numba_module(t), name)
        for r in range(data.shape[0]):
            fn(data[r], out[r])
    return out


def vec_dot(t: QType, n: int, w_row, act_row, backend: str = "c", *, batch: bool = False,
            small: bool = False) -> float:
    """Dot product of one weight row of type t with one activation row of its vec_dot_type; with
    `batch`, in the batch order of the types that have one (the legacy types); with `small`, in
    the small-batch order of the types that have one (SMALL_ORDER_TYPES)."""
    t = QType(t)
    act = type_info(t).vec_dot_type
    if small and t not in SMALL_ORDER_TYPES:
        raise ValueError(f"{t.name} has no small-batch order")
    name = (f"vec_dot_{_lname(t)}_{_lname(act)}" + ("_batch" if batch and t in BATCH_ORDER_TYPES else "")
            + ("_small" if small else "") + "_generic")
    w_row = _bytes(w_row, type_info(t).row_bytes(n), "weight row")
    act_row = _bytes(act_row, type_info(act).row_bytes(n), "activation row")
    if backend == "c":
        ffi, lib = _c_or_fail()
        s = ffi.new("float *")
        getattr(lib, name)(n, s, ffi.from_buffer(w_row), ffi.from_buffer(act_row))
        return float(s[0])
    return float(getattr(_numba_module(t), name)(n, w_row, act_row))


def quantize_activation(t: QType, x, backend: str = "c") -> np.ndarray:
    """Quantize a float row as the engines do for weight type t's dot product: Q8_0 / Q8_1 with
    the activation quantizers (quantize_row_q8_0 / _q8_1), other types with their reference one."""
    act = type_info(QType(t)).vec_dot_type
    if act not in (QType.Q8_0, QType.Q8_1):
        return quantize_rows(act, x, backend)[0]
    x = _as_f32_2d(x)[0]
    out = np.zeros(type_info(act).row_bytes(x.size), dtype=np.uint8)
    name = f"quantize_row_{_lname(act)}"
    if backend == "c":
        ffi, lib = _c_or_fail()
        getattr(lib, name)(ffi.from_buffer("float[]", x), ffi.from_buffer(out), x.size)
    else:
        getattr(_numba_module(act), name)(x, out)
    return out
