"""GGUF files: header, metadata and tensor infos, validated up front; tensors as views of one mmap.

Format facts relied on (ggml/include/gguf.h, ggml/src/gguf.cpp, gguf-py constants.py):
- little-endian; "GGUF", u32 version, u64 tensor count, u64 KV count;
- a KV pair is a string key, a u32 value type and the value; a string is a u64 byte length and
  that many UTF-8 bytes (no NUL); an array is a u32 element type, a u64 count and the elements;
- a tensor info is a string name, u32 n_dims (<= 4), n_dims x i64 ne (ne[0] is the row length,
  the fastest-varying dimension), u32 ggml type and a u64 offset relative to the data section;
- the data section starts at the first multiple of `general.alignment` (a u32, default 32) after
  the tensor infos, and every tensor offset is a multiple of it;
- versions 2 and 3 share this layout (v1 had 32-bit counts and lengths); a big-endian file (a v3
  feature) reads back here as a version with its low 16 bits zero.
"""

from __future__ import annotations

import enum
import mmap
import operator
import os
import stat
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import GGUFError
from .quants import QType, type_info

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8  # gguf-py writes arrays of arrays; llama.cpp reads none, so a few levels suffice

_HEADER_BYTES = 24  # magic, version, n_tensors, n_kv
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # non-empty key, value type, smallest value (one byte)
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # non-empty name, n_dims, one dim, type, offset
_INT64_MAX = 2**63 - 1


class ValueType(enum.IntEnum):
    """GGUF metadata value types (gguf_type in gguf.h)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_V = ValueType
_SCALAR_STRUCTS = {
    _V.UINT8: struct.Struct("<B"),
    _V.INT8: struct.Struct("<b"),
    _V.UINT16: struct.Struct("<H"),
    _V.INT16: struct.Struct("<h"),
    _V.UINT32: struct.Struct("<I"),
    _V.INT32: struct.Struct("<i"),
    _V.FLOAT32: struct.Struct("<f"),
    _V.BOOL: struct.Struct("<B"),  # one byte, 0 or 1
    _V.UINT64: struct.Struct("<Q"),
    _V.INT64: struct.Struct("<q"),
    _V.FLOAT64: struct.Struct("<d"),
}
_ARRAY_DTYPES = {t: np.dtype(s.format) for t, s in _SCALAR_STRUCTS.items()}
_U32 = _SCALAR_STRUCTS[_V.UINT32]
_U64 = _SCALAR_STRUCTS[_V.UINT64]

# Tensor types tensor_array() returns with their element dtype (bf16 as its raw 16 bits).
_TENSOR_DTYPES = {
    QType.F32: np.dtype("<f4"),
    QType.F16: np.dtype("<f2"),
    QType.BF16: np.dtype("<u2"),
    QType.F64: np.dtype("<f8"),
    QType.I8: np.dtype("i1"),
    QType.I16: np.dtype("<i2"),
    QType.I32: np.dtype("<i4"),
    QType.I64: np.dtype("<i8"),
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] = ne[0] = row length
    qtype: QType
    offset: int  # absolute byte offset in the file
    nbytes: int
    n_elements: int

    @property
    def rows(self) -> int:
        return self.n_elements // self.shape[0]

    @property
    def row_bytes(self) -> int:
        return type_info(self.qtype).row_bytes(self.shape[0])


class _Reader:
    """Bounds-checked little-endian reads from the mapped file; every error names what was read."""

    def __init__(self, buf: mmap.mmap, where: str):
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.where = where
        self.u8: np.ndarray | None = None  # one view of the file shared by the string arrays read

    def fail(self, msg: str) -> GGUFError:
        return GGUFError(f"{self.where}: {msg}")

    def need(self, n: int, what: str) -> None:
        left = self.size - self.pos
        if n > left:
            raise self.fail(f"truncated: {what} needs {n} bytes at offset {self.pos}, "
                            f"the file has {left} left")

    def scalar(self, st: struct.Struct, what: str):
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def string(self, what: str) -> str:
        n = self.scalar(_U64, f"{what} (length)")
        self.need(n, what)
        s = str(self.buf[self.pos : self.pos + n], "utf-8", "surrogateescape")
        self.pos += n
        return s

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        st = _SCALAR_STRUCTS.get(vtype)
        if st is not None:
            v = self.scalar(st, what)
            if vtype == _V.BOOL:
                if v > 1:
                    raise self.fail(f"{what}: bool value is {v}, not 0 or 1")
                return bool(v)
            return v
        if vtype == _V.STRING:
            return self.string(what)
        if vtype == _V.ARRAY:
            return self.array(what, depth)
        raise self.fail(f"{what}: unknown value type {vtype}")

    def array(self, what: str, depth: int) -> Any:
        etype = self.scalar(_U32, f"{what} (array element type)")
        n = self.scalar(_U64, f"{what} (array length)")
        dtype = _ARRAY_DTYPES.get(etype)
        if dtype is not None:
            return self.numeric_array(dtype, etype == _V.BOOL, n, what)
        if etype == _V.STRING:
            return self.string_array(n, what)
        if etype == _V.ARRAY:
            if depth + 1 >= MAX_ARRAY_NESTING:
                raise self.fail(f"{what}: arrays nested more than {MAX_ARRAY_NESTING} deep")
            self.need(n * 12, f"{what} ({n} nested arrays)")  # each: element type + count
            return [self.array(what, depth + 1) for _ in range(n)]
        raise self.fail(f"{what}: unknown array element type {etype}")

    def numeric_array(self, dtype: np.dtype, is_bool: bool, n: int, what: str) -> np.ndarray:
        nbytes = n * dtype.itemsize
        self.need(nbytes, f"{what} ({n} x {dtype.name})")
        # A read-only mmap gives read-only views, aligned or not: a copy of an unaligned one would
        # stay resident as long as the metadata (a 262k vocabulary's token types: 1 MB nothing
        # reads after loading), where the view's pages go back with the header's
        # (drop_metadata_pages). Whoever computes much with an array, or hands it to C, makes
        # the aligned copy it needs (the SPM tokenizer's scores).
        arr = np.frombuffer(self.buf, dtype, count=n, offset=self.pos)
        self.pos += nbytes
        if is_bool:
            if n and arr.max() > 1:
                raise self.fail(f"{what}: bool array holds a value other than 0 or 1")
            arr = arr.view(np.bool_)
        return arr

    def string_array(self, n: int, what: str) -> StringArray:
        self.need(n * 8, f"{what} ({n} strings)")  # each string has at least its 8-byte length
        if self.u8 is None:
            self.u8 = np.frombuffer(self.buf, np.uint8)
        try:
            arr = StringArray._walk(self.u8, self.pos, n)
        except ValueError as e:
            raise self.fail(f"truncated: {what}: {e} of the file") from None
        self.pos = int(arr.bounds[-1]) - 8
        return arr


class StringArray(Sequence):
    """A GGUF string array read in place: the strings stay in the file's bytes (u64 length, then
    UTF-8) and each is decoded when asked for, with surrogateescape as every GGUF string here.
    A 262k-token vocabulary costs its bounds array (8 bytes a string), not 262k str objects.

    `buffer` is a uint8 array (a view of the file's mapping, which it keeps mapped); bounds[i] is
    where string i's bytes start in it, bounds[n] is 8 bytes past the end of the last one, so
    string i is buffer[bounds[i] : bounds[i+1] - 8] (the layout of csrc/api/vocab.h). Indexing by
    int gives a str, by slice a list[str]; it compares equal to a list or tuple of the same strings.

    C code is handed `buffer` (ffi.from_buffer), never a memoryview: the garbage collector may
    clear a memoryview in a reference cycle while it is still exported, which frees what the
    export points to.
    """

    __slots__ = ("buffer", "bounds", "_bytes")

    def __init__(self, buffer: np.ndarray, bounds: np.ndarray):
        self.buffer = buffer  # uint8 [file or run size]
        self.bounds = bounds  # int64 [n + 1]
        self._bytes = memoryview(buffer)  # sliced to decode (slicing an array costs more)

    @classmethod
    def from_strings(cls, strings: Iterable[str]) -> StringArray:
        """The strings laid out as a GGUF string array in memory."""
        parts = []
        for s in strings:
            b = s.encode("utf-8", "surrogateescape")
            parts += (_U64.pack(len(b)), b)
        return cls._walk(np.frombuffer(b"".join(parts), np.uint8), 0, len(parts) // 2)

    @classmethod
    def _walk(cls, buffer: np.ndarray, pos: int, n: int) -> StringArray:
        """The n strings whose first length field is at buffer[pos]; ValueError naming the first
        one that runs past the end. The lengths chain the positions, so this is a serial walk
        (in C when built)."""
        bounds = np.empty(n + 1, np.int64)
        c = _c_module()
        if c is not None:
            ffi, lib = c
            bad = lib.el_str_bounds(ffi.from_buffer(buffer), len(buffer), pos, n,
                                    ffi.from_buffer("int64_t[]", bounds))
        else:
            bad = _walk_python(buffer, pos, n, bounds)
        if bad:
            raise ValueError(f"string #{bad - 1} of {n} runs past the end")
        return cls(buffer, bounds)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def encoded(self, i: int) -> bytes:
        """String i's bytes, as stored."""
        i = self._index(i)
        return bytes(self._bytes[int(self.bounds[i]) : int(self.bounds[i + 1]) - 8])

    def byte_lengths(self, ids: np.ndarray | None = None) -> np.ndarray:
        """int64: the length in bytes of each string, or of strings `ids` (an integer array)."""
        if ids is None:
            return np.diff(self.bounds) - 8
        return self.bounds[ids + 1] - self.bounds[ids] - 8

    def _index(self, i) -> int:
        n = len(self.bounds) - 1
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"string array index {i} out of range (length {n})")
        return i

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = self._index(i)
        b = self.bounds
        return str(self._bytes[int(b[i]) : int(b[i + 1]) - 8], "utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        buffer, bounds = self._bytes, self.bounds
        for c in range(0, len(bounds) - 1, _ITER_CHUNK):  # a chunk of bounds as ints at a time
            pos = bounds[c : c + _ITER_CHUNK + 1].tolist()
            for s, e in zip(pos, pos[1:]):
                yield str(buffer[s : e - 8], "utf-8", "surrogateescape")

    def __eq__(self, other) -> bool:
        if not isinstance(other, (StringArray, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(map(operator.eq, self, other))

    __hash__ = None  # like a list

    def __repr__(self) -> str:
        n = len(self)
        head = ", ".join(map(repr, self[:_REPR_ITEMS]))
        return f"StringArray([{head}{', ...' if n > _REPR_ITEMS else ''}], n={n})"


_ITER_CHUNK = 4096
_REPR_ITEMS = 4


def _walk_python(buffer, pos: int, n: int, bounds: np.ndarray) -> int:
    """el_str_bounds without the C kernels."""
    walk = memoryview(bounds)
    unpack = _U64.unpack_from
    size = len(buffer)
    for i in range(n):
        if size - pos < 8:
            return i + 1
        length = unpack(buffer, pos)[0]
        pos += 8
        walk[i] = pos
        if length > size - pos:
            return i + 1
        pos += length
    walk[n] = pos + 8
    return 0


def _c_module():
    from .kernels import c_module  # imported here: reading a file needs no kernels package state

    return c_module()


def _map_file(path: Path) -> mmap.mmap:
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise GGUFError(f"{path}: is a directory, not a GGUF file")
        if not stat.S_ISREG(st.st_mode):
            raise GGUFError(f"{path}: not a regular file")
        if st.st_size == 0:
            raise GGUFError(f"{path}: empty file, not a GGUF file")
        with open(path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except OSError as e:
        raise GGUFError(f"{path}: cannot open: {e.strerror or e}") from None


class GGUFFile:
    """A GGUF file, parsed and checked when opened; tensor data stays in the read-only mapping.

    `metadata` maps each key to its value: int, float, bool or str for scalars; a read-only numpy
    array for a numeric array (a view into the mapping when aligned); a StringArray (a
    Sequence[str] decoded on demand) for a string array; a list for an array of arrays.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._mm: mmap.mmap | None = None
        self._u8: np.ndarray | None = None
        mm = _map_file(self.path)
        try:
            self._parse(mm)
        except BaseException:
            _release(mm)
            raise
        self._mm = mm
        self._u8 = np.frombuffer(mm, np.uint8)

    def _parse(self, mm: mmap.mmap) -> None:
        r = _Reader(mm, str(self.path))
        self.file_size = r.size
        magic = mm[:4]
        if magic != MAGIC:
            if len(magic) < 4 and MAGIC.startswith(magic):
                raise r.fail(f"truncated: {len(magic)}-byte file")
            raise r.fail(f"not a GGUF file (magic {magic!r}, expected {MAGIC!r})")
        r.pos = 4
        version = r.scalar(_U32, "version")
        if version not in SUPPORTED_VERSIONS:
            if version and version & 0xFFFF == 0:
                raise r.fail(f"big-endian GGUF file (version field {version:#010x}); "
                             "only little-endian is supported")
            supported = ", ".join(map(str, SUPPORTED_VERSIONS))
            raise r.fail(f"unsupported version {version} (supported: {supported})")
        self.version = version
        n_tensors = r.scalar(_U64, "tensor count")
        n_kv = r.scalar(_U64, "metadata KV count")
        if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > r.size - _HEADER_BYTES:
            raise r.fail(f"header claims {n_kv} metadata pairs and {n_tensors} tensors, "
                         f"more than a {r.size}-byte file can hold")

        self.metadata: dict[str, Any] = {}
        alignment_type = None
        for i in range(n_kv):
            key = r.string(f"key of metadata pair #{i}")
            if not key:
                raise r.fail(f"metadata pair #{i} has an empty key")
            if key in self.metadata:
                raise r.fail(f"duplicate metadata key {key!r}")
            what = f"metadata key {key!r}"
            vtype = r.scalar(_U32, f"{what} (value type)")
            self.metadata[key] = r.value(vtype, what)
            if key == ALIGNMENT_KEY:
                alignment_type = vtype

        self.alignment = DEFAULT_ALIGNMENT
        if alignment_type is not None:
            a = self.metadata[ALIGNMENT_KEY]
            if alignment_type != _V.UINT32:
                raise r.fail(f"metadata key {ALIGNMENT_KEY!r} must be a uint32, "
                             f"not {_type_name(alignment_type)}")
            if a <= 0 or a & (a - 1):
                raise r.fail(f"metadata key {ALIGNMENT_KEY!r} is {a}, not a power of two")
            self.alignment = a

        raw = [self._tensor_info(r, i) for i in range(n_tensors)]
        self.data_offset = -(-r.pos // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, qtype, rel, nbytes, n_el in raw:
            if name in self.tensors:
                raise r.fail(f"duplicate tensor name {name!r}")
            if rel % self.alignment:
                raise r.fail(f"tensor {name!r}: offset {rel} is not a multiple of "
                             f"the alignment {self.alignment}")
            offset = self.data_offset + rel
            if offset + nbytes > r.size:
                raise r.fail(f"truncated: tensor {name!r} data [{offset}, {offset + nbytes}) "
                             f"runs past the end of the {r.size}-byte file")
            self.tensors[name] = TensorInfo(name, shape, qtype, offset, nbytes, n_el)
        by_offset = sorted(self.tensors.values(), key=lambda t: t.offset)
        for prev, t in zip(by_offset, by_offset[1:]):
            if t.offset < prev.offset + prev.nbytes:
                raise r.fail(f"tensor {t.name!r} data overlaps tensor {prev.name!r}")

    @staticmethod
    def _tensor_info(r: _Reader, i: int) -> tuple:
        name = r.string(f"name of tensor #{i}")
        if not name:
            raise r.fail(f"tensor #{i} has an empty name")
        what = f"tensor {name!r}"
        n_dims = r.scalar(_U32, f"{what} (n_dims)")
        if not 1 <= n_dims <= MAX_DIMS:
            raise r.fail(f"{what}: {n_dims} dimensions, expected 1 to {MAX_DIMS}")
        r.need(8 * n_dims, f"{what} (shape)")
        shape = struct.unpack_from(f"<{n_dims}q", r.buf, r.pos)
        r.pos += 8 * n_dims
        tid = r.scalar(_U32, f"{what} (type)")
        rel = r.scalar(_U64, f"{what} (offset)")
        if min(shape) <= 0:
            raise r.fail(f"{what}: shape {list(shape)} has a dimension <= 0")
        n_el = 1
        for d in shape:
            n_el *= d
        if n_el > _INT64_MAX:
            raise r.fail(f"{what}: shape {list(shape)} has more than 2**63-1 elements")
        try:
            info = type_info(tid)
        except (ValueError, KeyError):
            raise r.fail(f"{what}: unknown ggml type id {tid}") from None
        if shape[0] % info.block_size:
            raise r.fail(f"{what}: row length {shape[0]} is not a multiple of "
                         f"{info.qtype.name}'s block size {info.block_size}")
        return name, shape, info.qtype, rel, n_el // info.block_size * info.type_size, n_el

    # --- metadata ---------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str, types: type | tuple[type, ...] | None = None) -> Any:
        """The value of `key`; GGUFError if it is missing or (given `types`) of another type.

        bool does not pass for int: a flag stored where a count belongs is an error.
        """
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: required metadata key {key!r} is missing")
        v = self.metadata[key]
        if types is not None:
            types = types if isinstance(types, tuple) else (types,)
            if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
                expected = " or ".join(t.__name__ for t in types)
                raise GGUFError(f"{self.path}: metadata key {key!r} is a {type(v).__name__}, "
                                f"expected {expected}")
        return v

    # --- tensors ----------------------------------------------------------------------------

    def _data(self, name: str) -> tuple[TensorInfo, np.ndarray]:
        t = self.tensors.get(name)
        if t is None:
            raise GGUFError(f"{self.path}: no tensor named {name!r}")
        if self._u8 is None:
            raise GGUFError(f"{self.path}: file is closed")
        return t, self._u8[t.offset : t.offset + t.nbytes]

    def tensor_bytes(self, name: str) -> np.ndarray:
        """uint8 [rows, row_bytes], a read-only view into the mapping (no copy)."""
        t, raw = self._data(name)
        return raw.reshape(t.rows, t.row_bytes)

    def tensor_array(self, name: str) -> np.ndarray:
        """Float/int tensors as typed views in numpy order [..., ne1, ne0] (bf16 as uint16);
        quantized tensors as tensor_bytes."""
        t, raw = self._data(name)
        dtype = _TENSOR_DTYPES.get(t.qtype)
        if dtype is None:
            return raw.reshape(t.rows, t.row_bytes)
        return raw.view(dtype).reshape(t.shape[::-1])

    # --- lifetime ---------------------------------------------------------------------------

    def drop_metadata_pages(self) -> None:
        """Give the resident pages of the file's header (metadata and tensor infos) back to the
        page cache (MADV_DONTNEED): what was parsed from them is held elsewhere, and what is read in
        place (a vocabulary's strings, its scores) faults its pages back in when used. A 262k-token
        vocabulary's are 6 MB of resident memory that decoding mostly leaves alone. Nothing happens
        where madvise is missing or refuses (pages locked by mlock)."""
        n = self.data_offset // mmap.PAGESIZE * mmap.PAGESIZE
        if self._mm is None or not n or not hasattr(mmap, "MADV_DONTNEED"):
            return
        try:
            self._mm.madvise(mmap.MADV_DONTNEED, 0, n)
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        """Drop the mapping. Views already handed out keep it alive until they are gone."""
        mm, self._mm, self._u8 = self._mm, None, None
        if mm is not None:
            _release(mm)

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, version={self.version}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")


def _release(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass  # numpy views (metadata arrays, tensors) still use it; it unmaps when they go


def _type_name(vtype: int) -> str:
    try:
        return ValueType(vtype).name.lower()
    except ValueError:
        return f"type#{vtype}"
