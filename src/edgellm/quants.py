"""Tensor types: ids (as ggml numbers them), block layouts, and which ones edgellm runs.

Block layouts follow ggml's `block_*` structs (ggml-common.h). Every numpy dtype here asserts
its itemsize against the byte size ggml uses, so a layout mistake fails at import.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class QType(enum.IntEnum):
    """ggml type ids, as stored in GGUF tensor infos."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


@dataclass(frozen=True)
class TypeInfo:
    qtype: QType
    block_size: int  # values per block
    type_size: int  # bytes per block
    supported: bool  # edgellm has kernels for it as a weight type
    vec_dot_type: QType | None  # activation type its dot product takes

    def row_bytes(self, n: int) -> int:
        if n % self.block_size:
            raise ValueError(f"{self.qtype.name}: row length {n} is not a multiple of {self.block_size}")
        return n // self.block_size * self.type_size


_T = QType
# (block_size, type_size, supported, vec_dot_type)
_TABLE = {
    _T.F32: (1, 4, True, _T.F32),
    _T.F16: (1, 2, True, _T.F16),
    _T.BF16: (1, 2, True, _T.BF16),
    _T.Q4_0: (32, 18, True, _T.Q8_0),
    _T.Q4_1: (32, 20, True, _T.Q8_1),
    _T.Q5_0: (32, 22, True, _T.Q8_0),
    _T.Q5_1: (32, 24, True, _T.Q8_1),
    _T.Q8_0: (32, 34, True, _T.Q8_0),
    _T.Q8_1: (32, 36, False, None),  # activation type only (f16 d, f16 s, 32 x int8)
    _T.Q2_K: (256, 84, True, _T.Q8_K),
    _T.Q3_K: (256, 110, True, _T.Q8_K),
    _T.Q4_K: (256, 144, True, _T.Q8_K),
    _T.Q5_K: (256, 176, True, _T.Q8_K),
    _T.Q6_K: (256, 210, True, _T.Q8_K),
    _T.Q8_K: (256, 292, False, None),  # activation type only
    _T.IQ2_XXS: (256, 66, False, None),
    _T.IQ2_XS: (256, 74, False, None),
    _T.IQ3_XXS: (256, 98, False, None),
    _T.IQ1_S: (256, 50, False, None),
    _T.IQ4_NL: (32, 18, True, _T.Q8_0),
    _T.IQ3_S: (256, 110, False, None),
    _T.IQ2_S: (256, 82, False, None),
    _T.IQ4_XS: (256, 136, True, _T.Q8_K),
    _T.I8: (1, 1, False, None),
    _T.I16: (1, 2, False, None),
    _T.I32: (1, 4, False, None),
    _T.I64: (1, 8, False, None),
    _T.F64: (1, 8, False, None),
    _T.IQ1_M: (256, 56, False, None),
    _T.TQ1_0: (256, 54, False, None),
    _T.TQ2_0: (256, 66, False, None),
    _T.MXFP4: (32, 17, False, None),
}

TYPES: dict[QType, TypeInfo] = {t: TypeInfo(t, *v) for t, v in _TABLE.items()}

# Weight types edgellm runs, in the order tests and docs list them.
WEIGHT_TYPES = [t for t, info in TYPES.items() if info.supported]
QUANTIZED_TYPES = [t for t in WEIGHT_TYPES if TYPES[t].block_size > 1]


def type_info(t: int | QType) -> TypeInfo:
    """Look up a type by ggml id; raises KeyError for ids ggml does not define."""
    return TYPES[QType(t)]


def type_name(t: int) -> str:
    try:
        return QType(t).name
    except ValueError:
        return f"type#{t}"


# The 16 values an IQ4_NL / IQ4_XS nibble stands for (ggml's kvalues_iq4nl; the C kernels'
# el_iq4nl_values, checked against this by the tests).
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


# --- numpy views of the block structs (ggml-common.h) -------------------------------------

def _dt(fields, size):
    dt = np.dtype(fields)
    assert dt.itemsize == size, (fields, dt.itemsize, size)
    return dt


BLOCK_DTYPES = {
    _T.Q4_0: _dt([("d", "<f2"), ("qs", "u1", 16)], 18),
    _T.Q4_1: _dt([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)], 20),
    _T.Q5_0: _dt([("d", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)], 22),
    _T.Q5_1: _dt([("d", "<f2"), ("m", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)], 24),
    _T.Q8_0: _dt([("d", "<f2"), ("qs", "i1", 32)], 34),
    _T.Q8_1: _dt([("d", "<f2"), ("s", "<f2"), ("qs", "i1", 32)], 36),
    # K-quants, super-blocks of 256 values
    _T.Q2_K: _dt([("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2"), ("dmin", "<f2")], 84),
    _T.Q3_K: _dt([("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<f2")], 110),
    _T.Q4_K: _dt([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)], 144),
    _T.Q5_K: _dt([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32),
                  ("qs", "u1", 128)], 176),
    _T.Q6_K: _dt([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")], 210),
    _T.Q8_K: _dt([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)], 292),
    # non-linear 4-bit (nibbles index IQ4_NL_VALUES): IQ4_XS adds a 6-bit scale per 32 values
    _T.IQ4_NL: _dt([("d", "<f2"), ("qs", "u1", 16)], 18),
    _T.IQ4_XS: _dt([("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", 4), ("qs", "u1", 128)], 136),
}

for _t, _d in BLOCK_DTYPES.items():
    assert _d.itemsize == TYPES[_t].type_size, _t
