"""Write GGUF files as a stream: header, metadata and tensor infos first, then each tensor's data.

Only one tensor (or a slab of one) needs to be in memory at a time. Format facts as in
gguf_file.py; in addition, as ggml's gguf writer does (ggml/src/gguf.cpp): a tensor info stores
ggml_n_dims dimensions (trailing 1s dropped), tensor offsets are relative to the data section and
each tensor's data is zero-padded to the alignment.

`open_atomic` gives the write-to-a-temporary-then-rename discipline: a failed or interrupted
write never leaves a half-written file under the final name.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np

from .errors import GGUFError
from .gguf_file import DEFAULT_ALIGNMENT, MAGIC, ValueType
from .quants import QType, type_info

VERSION = 3

_V = ValueType
_SCALAR_FORMATS = {
    _V.UINT8: "<B", _V.INT8: "<b", _V.UINT16: "<H", _V.INT16: "<h", _V.UINT32: "<I", _V.INT32: "<i",
    _V.FLOAT32: "<f", _V.BOOL: "<B", _V.UINT64: "<Q", _V.INT64: "<q", _V.FLOAT64: "<d",
}
_SCALAR_SIZES = {t: struct.calcsize(f) for t, f in _SCALAR_FORMATS.items()}


# --- metadata -----------------------------------------------------------------------------------

def _string(s: str) -> bytes:
    b = s.encode("utf-8", "surrogateescape")  # the reader decodes with surrogateescape too
    return struct.pack("<Q", len(b)) + b


def _value(vtype: ValueType, value: Any, element_type: ValueType | None) -> bytes:
    if vtype in _SCALAR_FORMATS:
        return struct.pack(_SCALAR_FORMATS[vtype], value)
    if vtype == _V.STRING:
        return _string(value)
    if vtype == _V.ARRAY:
        if element_type is None or element_type == _V.ARRAY:
            raise ValueError("an array needs a scalar or string element type")
        head = struct.pack("<IQ", element_type, len(value))
        if element_type == _V.STRING:
            return head + b"".join(_string(s) for s in value)
        return head + np.asarray(value, dtype=_SCALAR_FORMATS[element_type]).tobytes()
    raise ValueError(f"unknown GGUF value type {vtype}")


def encode_kv(key: str, vtype: ValueType, value: Any, element_type: ValueType | None = None) -> bytes:
    """The bytes of one metadata pair: key, value type, value."""
    return _string(key) + struct.pack("<I", vtype) + _value(vtype, value, element_type)


def _skip_value(buf, pos: int, vtype: int) -> int:
    size = _SCALAR_SIZES.get(vtype)
    if size is not None:
        return pos + size
    if vtype == _V.STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    if vtype == _V.ARRAY:
        etype, n = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        size = _SCALAR_SIZES.get(etype)
        if size is not None:
            return pos + n * size
        for _ in range(n):
            pos = _skip_value(buf, pos, etype)
        return pos
    raise GGUFError(f"unknown GGUF value type {vtype}")


def read_raw_kv(path: str | os.PathLike) -> dict[str, bytes]:
    """Every metadata pair of a GGUF file as its exact bytes, in file order.

    Copying pairs byte for byte keeps each value's type (u32 vs i32, f32 vs f64), which parsed
    values no longer carry. The file must already have passed GGUFFile's validation.
    """
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != MAGIC:
            raise GGUFError(f"{path}: not a GGUF file")
        _, _, n_kv = struct.unpack_from("<IQQ", mm, 4)
        pos = 24
        out: dict[str, bytes] = {}
        for _ in range(n_kv):
            start = pos
            n = struct.unpack_from("<Q", mm, pos)[0]
            key = str(mm[pos + 8 : pos + 8 + n], "utf-8", "surrogateescape")
            pos += 8 + n
            (vtype,) = struct.unpack_from("<I", mm, pos)
            pos = _skip_value(mm, pos + 4, vtype)
            out[key] = bytes(mm[start:pos])
        return out


# --- tensors ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    qtype: QType

    @property
    def nbytes(self) -> int:
        n_rows = 1
        for d in self.shape[1:]:
            n_rows *= d
        return n_rows * type_info(self.qtype).row_bytes(self.shape[0])


def _n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: the dimensions up to the last one that is not 1."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


class GGUFStreamWriter:
    """Writes the header at construction, then the tensors' data in the order given.

    kv: encoded metadata pairs (encode_kv / read_raw_kv). `alignment` must match the
    general.alignment pair if kv holds one (32 otherwise).
    """

    def __init__(self, f: BinaryIO, kv: list[bytes], tensors: list[TensorSpec], *,
                 alignment: int = DEFAULT_ALIGNMENT):
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment} is not a power of two")
        self._f = f
        self._alignment = alignment
        self._tensors = list(tensors)
        head = [MAGIC, struct.pack("<IQQ", VERSION, len(self._tensors), len(kv)), *kv]
        offset = 0
        for t in self._tensors:
            nd = _n_dims(t.shape)
            head.append(_string(t.name) + struct.pack(f"<I{nd}qIQ", nd, *t.shape[:nd], int(t.qtype), offset))
            offset += t.nbytes + _pad(t.nbytes, alignment)
        header = b"".join(head)
        f.write(header + bytes(_pad(len(header), alignment)))
        self._index = 0  # tensor being written
        self._written = 0  # its bytes written so far

    @property
    def current(self) -> TensorSpec | None:
        return self._tensors[self._index] if self._index < len(self._tensors) else None

    def write(self, data) -> None:
        """Append bytes of the current tensor; the tensor is closed (and padded) when complete."""
        t = self.current
        mv = memoryview(data).cast("B")
        if t is None or self._written + mv.nbytes > t.nbytes:
            raise ValueError("more tensor data than the tensor infos announced")
        self._f.write(mv)
        self._written += mv.nbytes
        if self._written == t.nbytes:
            self._f.write(bytes(_pad(t.nbytes, self._alignment)))
            self._index += 1
            self._written = 0

    def close(self) -> None:
        if self.current is not None:
            raise ValueError(f"tensor {self.current.name!r} was not written completely")


# --- atomic output ------------------------------------------------------------------------------

def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def open_atomic(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A new file that appears at `path` only if the block completes; a temporary file in the same
    directory (so the final rename stays on one file system) is removed on any error."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it private; a finished file gets the usual mode
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
