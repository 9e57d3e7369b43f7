"""Write small GGUF files for tests.

- `write_gguf`: valid files through gguf-py's `GGUFWriter` (an implementation nobody here wrote).
- `RawGGUF`: a byte-level writer where every field is explicit and nothing is checked, for
  malformed files (bad counts, offsets, dims, types, lengths) and for layouts GGUFWriter cannot
  produce (empty arrays, invalid UTF-8 strings).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.constants import GGUFEndian

from edgellm.quants import QType, type_info

VT = GGUFValueType

SCALAR_FORMATS = {
    VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h",
    VT.UINT32: "<I", VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<B",
    VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d",
}


def write_gguf(
    path: str | Path,
    metadata: dict[str, tuple] | None = None,
    tensors: dict[str, np.ndarray | tuple[QType, np.ndarray]] | None = None,
    *,
    arch: str = "llama",
    alignment: int | None = None,
    version: int = 3,
    big_endian: bool = False,
) -> Path:
    """Write a valid GGUF file with GGUFWriter.

    metadata: {key: (GGUFValueType, value)} or, for arrays, {key: (ARRAY, values, element type)}.
    tensors: {name: array} for F32/F16/F64/I8/I16/I32/I64 numpy arrays (numpy order), or
    {name: (qtype, uint8 array [..., row_bytes])} for any ggml type, written as raw bytes.
    version: GGUFWriter writes v3; v2 has the same layout, so only the version field changes.
    """
    path = Path(path)
    w = GGUFWriter(path, arch, endianess=GGUFEndian.BIG if big_endian else GGUFEndian.LITTLE)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, spec in (metadata or {}).items():
        vtype, value, *sub = spec
        w.add_key_value(key, value, vtype, sub_type=sub[0] if sub else None)
    for name, t in (tensors or {}).items():
        if isinstance(t, tuple):
            qtype, raw = t
            w.add_tensor(name, np.ascontiguousarray(raw, dtype=np.uint8),
                         raw_dtype=GGMLQuantizationType(int(qtype)))
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version != 3:
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(struct.pack(">I" if big_endian else "<I", version))
    return path


def pack_string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def pack_value(vtype: int, value: Any, sub_type: int | None = None) -> bytes:
    """The bytes of one value (without its type), as GGUF stores it. Array elements that are
    themselves arrays are given as (element type, values)."""
    if vtype in SCALAR_FORMATS:
        return struct.pack(SCALAR_FORMATS[vtype], value)
    if vtype == VT.STRING:
        return pack_string(value)
    if vtype == VT.ARRAY:
        out = struct.pack("<IQ", sub_type, len(value))
        for item in value:
            if sub_type == VT.ARRAY:
                out += pack_value(VT.ARRAY, item[1], item[0])
            else:
                out += pack_value(sub_type, item)
        return out
    raise ValueError(f"pack_value: no encoding for value type {vtype}")


def pack_kv(key: str | bytes, vtype: int, value: Any, sub_type: int | None = None) -> bytes:
    return pack_string(key) + struct.pack("<I", vtype) + pack_value(vtype, value, sub_type)


class RawGGUF:
    """Assemble a GGUF file field by field. Nothing is validated; counts default to the number
    of entries added and tensor data is placed (aligned, zero-filled) unless given explicitly."""

    def __init__(self, *, magic: bytes = b"GGUF", version: int = 3, alignment: int = 32):
        self.magic = magic
        self.version = version
        self.alignment = alignment  # where build() places the data section and tensor data
        self.n_kv: int | None = None
        self.n_tensors: int | None = None
        self.kvs: list[bytes] = []
        self.infos: list[bytes] = []
        self.data = bytearray()

    def kv(self, key: str | bytes, vtype: int, value: Any, sub_type: int | None = None) -> RawGGUF:
        self.kvs.append(pack_kv(key, vtype, value, sub_type))
        return self

    def kv_bytes(self, raw: bytes) -> RawGGUF:
        self.kvs.append(raw)
        return self

    def tensor(self, name: str | bytes, ne: list[int], qtype: int, *, offset: int | None = None,
               data: bytes | None = None, n_dims: int | None = None) -> RawGGUF:
        """A tensor info with shape `ne` (ggml order). Without `offset`, `data` (default: zeros of
        the size the type table gives) is appended to the data section at the next aligned spot."""
        if offset is None:
            if data is None:
                info = type_info(qtype)
                n = int(np.prod(ne, dtype=object))
                data = bytes(n // info.block_size * info.type_size)
            self.data += bytes(-len(self.data) % self.alignment)
            offset = len(self.data)
            self.data += data
        self.infos.append(pack_string(name)
                          + struct.pack("<I", len(ne) if n_dims is None else n_dims)
                          + b"".join(struct.pack("<q", d) for d in ne)
                          + struct.pack("<IQ", qtype, offset))
        return self

    def header_and_infos(self) -> bytes:
        n_kv = len(self.kvs) if self.n_kv is None else self.n_kv
        n_tensors = len(self.infos) if self.n_tensors is None else self.n_tensors
        return (self.magic + struct.pack("<IQQ", self.version, n_tensors, n_kv)
                + b"".join(self.kvs) + b"".join(self.infos))

    def build(self) -> bytes:
        head = self.header_and_infos()
        if not self.infos and not self.data:
            return head
        return head + bytes(-len(head) % self.alignment) + bytes(self.data)

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_bytes(self.build())
        return path
