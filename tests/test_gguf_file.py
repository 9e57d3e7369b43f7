"""GGUF reader: agreement with gguf-py's GGUFReader on the real models and on synthetic files,
every metadata value type, versions, alignment, zero-copy views, and GGUFError on every kind of
malformed file (including truncation at many points and random header corruption)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
from gguf_builders import VT, RawGGUF, pack_kv, pack_string, write_gguf

from conftest import gguf_py_of_real_model, read_with_gguf_py

from edgellm.errors import GGUFError
from edgellm.gguf_file import GGUFFile, StringArray, TensorInfo
from edgellm.quants import QType

# --- the oracle ---------------------------------------------------------------------------


_PY_TYPES = {VT.BOOL: bool, VT.FLOAT32: float, VT.FLOAT64: float, VT.STRING: str}


def assert_field_equal(ours, field):
    """Our value for a key against GGUFReader's field (strings compared as bytes)."""
    t0 = field.types[0]
    if t0 == VT.ARRAY:
        et = field.types[1]
        if et == VT.STRING:
            assert isinstance(ours, StringArray)
            expected = [bytes(field.parts[i]) for i in field.data]
            assert [s.encode("utf-8", "surrogateescape") for s in ours] == expected, field.name
            assert [ours.encoded(i) for i in range(len(ours))] == expected, field.name
        else:
            assert isinstance(ours, np.ndarray) and not ours.flags.writeable
            expected = np.concatenate([field.parts[i] for i in field.data])
            if et == VT.BOOL:
                assert ours.dtype == np.bool_
            else:
                assert ours.dtype == expected.dtype.newbyteorder("=")
            np.testing.assert_array_equal(ours, expected)
    elif t0 == VT.STRING:
        assert isinstance(ours, str)
        assert ours.encode("utf-8", "surrogateescape") == bytes(field.parts[field.data[0]])
    else:
        expected = field.parts[field.data[0]][0]
        assert type(ours) is _PY_TYPES.get(t0, int), (field.name, type(ours))
        assert ours == expected.item(), field.name


def assert_matches_gguf_py(f: GGUFFile, check_data=True, reader=None):
    r = reader or read_with_gguf_py(f.path)
    fields = {k: v for k, v in r.fields.items() if not k.startswith("GGUF.")}
    assert list(f.metadata) == list(fields)
    for key, field in fields.items():
        assert_field_equal(f.metadata[key], field)
    assert f.data_offset == r.data_offset
    assert f.alignment == r.alignment
    assert list(f.tensors) == [t.name for t in r.tensors]
    for t in r.tensors:
        ti = f.tensors[t.name]
        assert ti.shape == tuple(int(d) for d in t.shape)
        assert ti.qtype == int(t.tensor_type)
        assert (ti.offset, ti.nbytes, ti.n_elements) == (t.data_offset, t.n_bytes, t.n_elements)
        if check_data:
            ours = f.tensor_bytes(t.name)
            assert ours.shape == (ti.rows, ti.row_bytes)
            assert np.array_equal(ours.reshape(-1), t.data.reshape(-1).view(np.uint8))
            if ti.qtype in (QType.F32, QType.F16):
                arr = f.tensor_array(t.name)
                assert arr.shape == t.data.shape and np.array_equal(arr, t.data)


# --- real models --------------------------------------------------------------------------


@pytest.mark.real
@pytest.mark.parametrize("model", ["smollm2_path", pytest.param("gemma3_path", marks=pytest.mark.slow)])
def test_real_model_matches_gguf_py(model, request):
    path = request.getfixturevalue(model)
    with GGUFFile(path) as f:
        assert f.version == 3
        assert f.file_size == os.path.getsize(f.path)
        assert_matches_gguf_py(f, reader=gguf_py_of_real_model(path))


@pytest.mark.real
def test_real_model_values(gemma3_path):
    with GGUFFile(gemma3_path) as f:
        tokens = f.require("tokenizer.ggml.tokens", StringArray)
        scores = f.require("tokenizer.ggml.scores", np.ndarray)
        assert len(tokens) == len(scores) == len(f.metadata["tokenizer.ggml.token_type"]) == 262144
        assert scores.dtype == np.float32 and not scores.flags.writeable
        assert f.require("general.architecture", str) == "gemma3"
        emb = f.tensors["token_embd.weight"]
        assert emb.shape[1] == 262144 and emb.rows == 262144


@pytest.mark.real
def test_open_maps_lazily_and_views_copy_nothing(gemma3_path):
    """Opening the 253 MB file and taking views of every tensor barely grows RSS."""
    script = r"""
import json, sys
from edgellm.gguf_file import GGUFFile
def rss_mb():
    with open("/proc/self/status") as s:
        return next(int(l.split()[1]) for l in s if l.startswith("VmRSS")) / 1024
before = rss_mb()
f = GGUFFile(sys.argv[1])
opened = rss_mb()
views = [f.tensor_bytes(n) for n in f.tensors]
print(json.dumps([before, opened, rss_mb(), sum(v.nbytes for v in views)]))
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", script, str(gemma3_path)], env=env,
                         capture_output=True, text=True, check=True).stdout
    before, opened, with_views, viewed_bytes = json.loads(out)
    assert viewed_bytes > 200e6
    assert opened - before < 60, (before, opened)
    assert with_views - before < 60, (before, with_views)


@pytest.mark.real
def test_metadata_pages_dropped_and_read_again(gemma3_path):
    """drop_metadata_pages gives back the header's resident pages (the mapping's RSS falls by the
    vocabulary's megabytes) and what is read in place afterwards reads the same."""
    def mapped_kb():
        rss, inside = 0, False
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and not head[0].endswith(":"):
                    inside = head[-1] == str(gemma3_path)
                elif inside and head[0] == "Rss:":
                    rss += int(head[1])
        return rss

    if not os.path.exists("/proc/self/smaps"):
        pytest.skip("Linux's /proc")
    with GGUFFile(gemma3_path) as f:
        tokens = f.require("tokenizer.ggml.tokens", StringArray)
        scores = f.require("tokenizer.ggml.scores", np.ndarray)
        before = (list(tokens), scores.copy())
        touched = mapped_kb()
        f.drop_metadata_pages()
        assert touched > 4096 and mapped_kb() < touched - 4096, (touched, mapped_kb())
        assert list(tokens) == before[0]
        np.testing.assert_array_equal(scores, before[1])


# --- synthetic files: values --------------------------------------------------------------

SCALARS = {
    "t.u8": (VT.UINT8, 255), "t.i8": (VT.INT8, -128), "t.u16": (VT.UINT16, 65535),
    "t.i16": (VT.INT16, -32768), "t.u32": (VT.UINT32, 2**32 - 1), "t.i32": (VT.INT32, -(2**31)),
    "t.u64": (VT.UINT64, 2**64 - 1), "t.i64": (VT.INT64, -(2**63)), "t.f32": (VT.FLOAT32, 0.1),
    "t.f64": (VT.FLOAT64, 0.1), "t.true": (VT.BOOL, True), "t.false": (VT.BOOL, False),
    "t.str": (VT.STRING, "héllo ✓ 🙂"),
}
ARRAYS = {
    "a.u8": (VT.ARRAY, [0, 1, 255], VT.UINT8), "a.i8": (VT.ARRAY, [-128, 0, 127], VT.INT8),
    "a.u16": (VT.ARRAY, [0, 65535], VT.UINT16), "a.i16": (VT.ARRAY, [-5, 5], VT.INT16),
    "a.u32": (VT.ARRAY, [1, 2**32 - 1], VT.UINT32), "a.i32": (VT.ARRAY, [-1, 2, -3], VT.INT32),
    "a.u64": (VT.ARRAY, [2**64 - 1], VT.UINT64), "a.i64": (VT.ARRAY, [-(2**63), 7], VT.INT64),
    "a.f32": (VT.ARRAY, [0.5, -1.25, 3e38], VT.FLOAT32), "a.f64": (VT.ARRAY, [1e300, -0.1], VT.FLOAT64),
    "a.bool": (VT.ARRAY, [True, False, True], VT.BOOL),
    "a.str": (VT.ARRAY, ["", "a", "✓🙂", "x" * 300], VT.STRING),
}
_NP = {VT.UINT8: "u1", VT.INT8: "i1", VT.UINT16: "u2", VT.INT16: "i2", VT.UINT32: "u4",
       VT.INT32: "i4", VT.UINT64: "u8", VT.INT64: "i8", VT.FLOAT32: "f4", VT.FLOAT64: "f8",
       VT.BOOL: "?"}


def test_every_value_type(tmp_path):
    path = write_gguf(tmp_path / "v.gguf", {**SCALARS, **ARRAYS})
    with GGUFFile(path) as f:
        assert_matches_gguf_py(f)
        assert f.get("general.architecture") == "llama"
        for key, (vt, value) in SCALARS.items():
            got = f.metadata[key]
            assert type(got) is _PY_TYPES.get(vt, int)
            assert got == (float(np.float32(value)) if vt == VT.FLOAT32 else value)
        for key, (_, values, et) in ARRAYS.items():
            got = f.metadata[key]
            if et == VT.STRING:
                assert got == values
            else:
                assert got.dtype == np.dtype(_NP[et]) and not got.flags.writeable
                np.testing.assert_array_equal(got, np.array(values, dtype=_NP[et]))


def test_nested_and_empty_arrays(tmp_path):
    g = RawGGUF()
    g.kv("n", VT.ARRAY, [(VT.INT32, [1, 2]), (VT.STRING, ["x", "yz"]), (VT.ARRAY, [(VT.UINT8, [])])],
         VT.ARRAY)
    g.kv("e.str", VT.ARRAY, [], VT.STRING)
    g.kv("e.f32", VT.ARRAY, [], VT.FLOAT32)
    with GGUFFile(g.write(tmp_path / "n.gguf")) as f:
        a, b, c = f.metadata["n"]
        assert a.tolist() == [1, 2] and a.dtype == np.int32
        assert b == ["x", "yz"]
        assert len(c) == 1 and c[0].size == 0 and c[0].dtype == np.uint8
        assert f.metadata["e.str"] == []
        assert f.metadata["e.f32"].shape == (0,) and f.metadata["e.f32"].dtype == np.float32
        assert f.tensors == {} and f.data_offset % 32 == 0
    with GGUFFile(RawGGUF().kv_bytes(_nested_kv(8)).write(tmp_path / "d.gguf")) as f:
        v = f.metadata["deep"]
        for _ in range(7):
            (v,) = v
        assert v.tolist() == [1]


def test_numeric_arrays_are_views_aligned_or_not(tmp_path):
    # header 24 + key (8 + len) + value type 4 + element type 4 + count 8: an 8-byte key puts the
    # data at offset 56, a 9-byte key at 57 (and the second array right after the first)
    g = RawGGUF().kv("k" * 8, VT.ARRAY, [1, 2, 3, 4], VT.INT32).kv("j" * 8, VT.ARRAY, [5, 6], VT.INT32)
    with GGUFFile(g.write(tmp_path / "a.gguf")) as f:
        for v in f.metadata.values():
            assert not v.flags.owndata and not v.flags.writeable
    g = RawGGUF().kv("k" * 9, VT.ARRAY, [1, 2, 3, 4], VT.INT32)
    with GGUFFile(g.write(tmp_path / "u.gguf")) as f:
        v = f.metadata["k" * 9]
        assert v.tolist() == [1, 2, 3, 4] and not v.flags.writeable
        assert not v.flags.owndata and not v.flags.aligned  # a view: no copy held with the metadata


def _random_strings(rng, n, noncharacters):
    pieces = [b"a", b"Z", b" ", b"\n", b"\x00", "é".encode(), "✓".encode(), "🙂".encode(),
              b"\x80", b"\xbf", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x99", b"\xf4\x8f", b"\xed\xa0\x80",
              b"\xfe", b"\xff"]
    if noncharacters:  # U+10FFFF, U+10FFFE: what the reader's fast path splits on
        pieces += ["\U0010ffff".encode(), "\U0010fffe".encode(), "\U0010ffff\U0010fffe".encode()]
    out = []
    for _ in range(n):
        k = int(rng.choice([0, 1, 2, 5, 20, 300]))
        out.append(b"".join(pieces[i] for i in rng.integers(0, len(pieces), k)))
    # a lead byte ending one string and continuation bytes starting the next: decoded together
    # they would make one character
    out += [b"\xe2", b"\x82\xac", b"", b"\xe2\x82", b"\xac", b"\xf4", b"\x8f\xbf\xbf"]
    return out


@pytest.mark.parametrize("noncharacters", [False, True])
def test_string_arrays_decode_each_string_alone(tmp_path, noncharacters):
    strings = _random_strings(np.random.default_rng(1 + noncharacters), 2000, noncharacters)
    assert any("\U0010ffff\U0010fffe".encode() in s for s in strings) == noncharacters
    g = RawGGUF().kv("s", VT.ARRAY, strings, VT.STRING).kv("one", VT.ARRAY, [b"\xe2\x82"], VT.STRING)
    g.kv("after", VT.UINT8, 9)
    with GGUFFile(g.write(tmp_path / "s.gguf")) as f:
        got = f.metadata["s"]
        assert got == [s.decode("utf-8", "surrogateescape") for s in strings]
        assert [s.encode("utf-8", "surrogateescape") for s in got] == strings
        assert f.metadata["one"] == ["\udce2\udc82"]
        assert f.metadata["after"] == 9


def test_string_arrays_are_read_in_place_and_outlive_close(tmp_path):
    strings = _random_strings(np.random.default_rng(3), 500, False)
    path = RawGGUF().kv("s", VT.ARRAY, strings, VT.STRING).kv("after", VT.UINT8, 9).write(tmp_path / "s.gguf")
    f = GGUFFile(path)
    got = f.metadata["s"]
    first = 24 + 8 + 1 + 4 + 4 + 8 + 8  # header, key "s", value type, element type, count, first length
    assert isinstance(got, StringArray) and got.bounds[0] == first
    f.close()  # the array's view keeps the mapping
    assert [got.encoded(i) for i in range(len(got))] == strings
    with mock.patch("edgellm.kernels.c_module", lambda: None), GGUFFile(path) as g:  # no C kernels
        assert np.array_equal(g.metadata["s"].bounds, got.bounds) and g.metadata["after"] == 9


def test_invalid_utf8_scalars_and_names_do_not_raise(tmp_path):
    g = RawGGUF().kv(b"key\xff", VT.STRING, b"val\xc3").tensor(b"t\xe2", [4], QType.F32)
    with GGUFFile(g.write(tmp_path / "u.gguf")) as f:
        assert f.metadata == {"key\udcff": "val\udcc3"}
        assert list(f.tensors) == ["t\udce2"]


@pytest.mark.parametrize("version", [2, 3])
def test_versions_2_and_3(tmp_path, version):
    path = write_gguf(tmp_path / "v.gguf", {"x.n": (VT.UINT32, 5), "x.s": (VT.ARRAY, ["a", "b"], VT.STRING)},
                      {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, version=version)
    with GGUFFile(path) as f:
        assert f.version == version
        assert f.metadata["x.n"] == 5 and f.metadata["x.s"] == ["a", "b"]
        assert f.tensor_array("w").tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()
        assert_matches_gguf_py(f)


def test_big_endian_file_is_rejected(tmp_path):
    path = write_gguf(tmp_path / "be.gguf", {"x.n": (VT.UINT32, 5)}, {"w": np.ones(4, np.float32)},
                      big_endian=True)
    with pytest.raises(GGUFError, match="big-endian"):
        GGUFFile(path)


# --- tensors ------------------------------------------------------------------------------


def _typed_tensors(rng):
    return {
        "f32": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "f16": rng.standard_normal((5, 8)).astype(np.float16),
        "f64": rng.standard_normal(7),
        "i8": rng.integers(-128, 128, (3, 3), dtype=np.int8),
        "i16": rng.integers(-999, 999, 6, dtype=np.int16),
        "i32": rng.integers(-(2**31), 2**31, (2, 2, 2, 2), dtype=np.int32),
        "i64": rng.integers(-(2**62), 2**62, 3, dtype=np.int64),
    }


@pytest.mark.parametrize("alignment", [None, 1, 8, 64, 256])
def test_tensors_alignment_and_views(tmp_path, alignment):
    rng = np.random.default_rng(0)
    typed = _typed_tensors(rng)
    bf16 = rng.integers(0, 2**16, (3, 4), dtype=np.uint16)
    q4_0 = rng.integers(0, 256, (4, 2 * 18), dtype=np.uint8)  # 4 rows of 64 values
    iq2 = rng.integers(0, 256, (2, 66), dtype=np.uint8)  # known type edgellm does not run
    tensors = {**typed, "bf16": (QType.BF16, bf16.view(np.uint8)), "q4_0": (QType.Q4_0, q4_0),
               "iq2": (QType.IQ2_XXS, iq2)}
    path = write_gguf(tmp_path / "t.gguf", {}, tensors, alignment=alignment)
    with GGUFFile(path) as f:
        a = alignment or 32
        assert f.alignment == a and f.data_offset % a == 0
        assert_matches_gguf_py(f)
        for name, arr in typed.items():
            got = f.tensor_array(name)
            assert got.dtype == arr.dtype and got.shape == arr.shape and np.array_equal(got, arr)
            ti = f.tensors[name]
            assert (ti.offset - f.data_offset) % a == 0
            assert ti.shape == arr.shape[::-1] and ti.n_elements == arr.size and ti.nbytes == arr.nbytes
        assert f.tensors["bf16"].qtype == QType.BF16 and np.array_equal(f.tensor_array("bf16"), bf16)
        q = f.tensors["q4_0"]
        assert (q.shape, q.qtype, q.rows, q.row_bytes, q.nbytes) == ((64, 4), QType.Q4_0, 4, 36, 144)
        assert np.array_equal(f.tensor_array("q4_0"), q4_0) and np.array_equal(f.tensor_bytes("q4_0"), q4_0)
        assert f.tensors["iq2"].qtype == QType.IQ2_XXS and np.array_equal(f.tensor_bytes("iq2"), iq2)

        for name in f.tensors:  # views of the mapping, never copies
            b = f.tensor_bytes(name)
            assert not b.flags.writeable and not b.flags.owndata
            assert np.shares_memory(b, f.tensor_bytes(name)) and np.shares_memory(b, f.tensor_array(name))


def test_tensor_info_properties():
    t = TensorInfo("w", (512, 3), QType.Q4_K, 4096, 3 * 288, 1536)
    assert (t.rows, t.row_bytes) == (3, 288)
    with pytest.raises(Exception):
        t.name = "x"


def test_unknown_tensor_and_closed_file(tmp_path):
    path = write_gguf(tmp_path / "c.gguf", {}, {"w": np.arange(8, dtype=np.float32)})
    f = GGUFFile(path)
    with pytest.raises(GGUFError, match="no tensor named 'nope'"):
        f.tensor_bytes("nope")
    view = f.tensor_array("w")
    f.close()
    f.close()
    assert view.tolist() == list(range(8))  # a view handed out earlier stays valid
    with pytest.raises(GGUFError, match="closed"):
        f.tensor_bytes("w")
    with GGUFFile(path) as g:
        pass
    with pytest.raises(GGUFError, match="closed"):
        g.tensor_array("w")


# --- metadata access ----------------------------------------------------------------------


def test_get_and_require(tmp_path):
    path = write_gguf(tmp_path / "r.gguf", {"n": (VT.UINT32, 3), "b": (VT.BOOL, True), "x": (VT.FLOAT32, 0.5),
                                            "s": (VT.ARRAY, ["a"], VT.STRING)})
    with GGUFFile(path) as f:
        assert f.get("missing") is None and f.get("missing", 7) == 7 and f.get("n") == 3
        assert f.require("n") == 3 and f.require("n", int) == 3 and f.require("x", (int, float)) == 0.5
        assert f.require("b", bool) is True and f.require("s", StringArray) == ["a"]
        with pytest.raises(GGUFError, match="'llama.block_count' is missing"):
            f.require("llama.block_count")
        with pytest.raises(GGUFError, match="'x' is a float, expected int"):
            f.require("x", int)
        with pytest.raises(GGUFError, match="'b' is a bool, expected int"):
            f.require("b", int)
        with pytest.raises(GGUFError, match="'s' is a StringArray, expected str"):
            f.require("s", str)


# --- opening ------------------------------------------------------------------------------


def test_missing_path_and_directory(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError, match="is a directory"):
        GGUFFile(tmp_path)


# --- malformed files ----------------------------------------------------------------------


def valid_raw() -> RawGGUF:
    g = RawGGUF()
    g.kv("general.architecture", VT.STRING, "llama").kv("a.u32", VT.UINT32, 7)
    g.kv("tok", VT.ARRAY, ["a", "bc", ""], VT.STRING)
    g.tensor("w", [32, 2], QType.Q8_0).tensor("n", [4], QType.F32)
    return g


def test_valid_raw_file_opens(tmp_path):
    with GGUFFile(valid_raw().write(tmp_path / "ok.gguf")) as f:
        assert f.metadata == {"general.architecture": "llama", "a.u32": 7, "tok": ["a", "bc", ""]}
        assert [(t.name, t.shape, t.qtype) for t in f.tensors.values()] == \
               [("w", (32, 2), QType.Q8_0), ("n", (4,), QType.F32)]
        assert_matches_gguf_py(f)


def _with(**attrs):
    def make():
        g = valid_raw()
        for k, v in attrs.items():
            setattr(g, k, v)
        return g.build()
    return make


def _kv(*args):
    return lambda: RawGGUF().kv_bytes(args[0] if len(args) == 1 else pack_kv(*args)).build()


def _tensors(*specs, alignment=32):
    def make():
        g = RawGGUF(alignment=alignment).kv("general.architecture", VT.STRING, "llama")
        for name, ne, qt, kw in specs:
            g.tensor(name, ne, qt, **kw)
        return g.build()
    return make


def _truncated(n):
    return lambda: valid_raw().build()[:n]


def _nested_kv(depth):
    """Key 'deep': `depth` levels of one-element arrays around [1]."""
    value = (VT.UINT8, [1])
    for _ in range(depth - 1):
        value = (VT.ARRAY, [value])
    return pack_kv("deep", VT.ARRAY, value[1], value[0])


def _nested(depth):
    return _kv(_nested_kv(depth))


MALFORMED = {
    "empty file": (lambda: b"", "empty file"),
    "bad magic": (_with(magic=b"GGML"), r"not a GGUF file \(magic b'GGML'"),
    "two bytes": (lambda: b"GG", "truncated: 2-byte file"),
    "header cut": (_truncated(13), r"truncated: tensor count"),
    "version 0": (_with(version=0), "unsupported version 0"),
    "version 1": (_with(version=1), "unsupported version 1"),
    "version 4": (_with(version=4), "unsupported version 4"),
    "byte-swapped version": (_with(version=0x03000000), "big-endian"),
    "absurd n_kv": (_with(n_kv=2**62), "header claims 4611686018427387904 metadata pairs"),
    "absurd n_tensors": (_with(n_tensors=10**6), "header claims 3 metadata pairs and 1000000 tensors"),
    "empty key": (lambda: RawGGUF().kv("", VT.UINT8, 1).kv("second", VT.UINT8, 1).build(),
                  "metadata pair #0 has an empty key"),
    "duplicate key": (lambda: RawGGUF().kv("k", VT.UINT8, 1).kv("k", VT.INT8, 1).build(), "duplicate metadata key 'k'"),
    "unknown value type": (_kv(pack_string("k") + struct.pack("<IQ", 13, 0)), "'k': unknown value type 13"),
    "unknown element type": (_kv(pack_string("k") + struct.pack("<IIQ", 9, 13, 0)),
                             "'k': unknown array element type 13"),
    "key longer than file": (_kv(struct.pack("<Q", 2**40) + b"abc" * 8), r"truncated: key of metadata pair #0 needs"),
    "string longer than file": (_kv(pack_string("k") + struct.pack("<IQ", 8, 2**64 - 1) + b"abc"),
                                "truncated: metadata key 'k' needs 18446744073709551615 bytes"),
    "value cut": (_kv(pack_string("k") + struct.pack("<I", 10) + b"\1\2\3"), r"truncated: metadata key 'k' needs 8"),
    "array longer than file": (_kv(pack_string("k") + struct.pack("<IIQ", 9, 6, 2**40) + b"\0" * 16),
                               r"truncated: metadata key 'k' \(1099511627776 x float32\)"),
    "string array count absurd": (_kv(pack_string("k") + struct.pack("<IIQ", 9, 8, 2**61)),
                                  r"truncated: metadata key 'k' \(2305843009213693952 strings\)"),
    "string in array past end": (_kv(pack_string("k") + struct.pack("<IIQ", 9, 8, 3) + pack_string("ab")
                                     + struct.pack("<Q", 2**63) + b"x" * 20), r"'k': string #1 of 3 runs past the end of the file"),
    "last string past end": (_kv(pack_string("k") + struct.pack("<IIQ", 9, 8, 2) + pack_string("ab")
                                 + struct.pack("<Q", 100) + b"x" * 20), r"'k': string #1 of 2 runs past the end of the file"),
    "nested arrays count absurd": (_kv(pack_string("k") + struct.pack("<IIQ", 9, 9, 2**40)), r"\(1099511627776 nested arrays\)"),
    "arrays nested too deep": (_nested(9), "'deep': arrays nested more than 8 deep"),
    "bool value 2": (_kv(pack_string("b") + struct.pack("<IB", 7, 2)), "'b': bool value is 2"),
    "bool array value 2": (_kv(pack_string("b") + struct.pack("<IIQ3B", 9, 7, 3, 1, 0, 2)), "'b': bool array holds"),
    "alignment not uint32": (_kv("general.alignment", VT.UINT64, 64), "'general.alignment' must be a uint32, not uint64"),
    "alignment 48": (_kv("general.alignment", VT.UINT32, 48), "'general.alignment' is 48, not a power of two"),
    "alignment 0": (_kv("general.alignment", VT.UINT32, 0), "'general.alignment' is 0, not a power of two"),
    "empty tensor name": (_tensors(("", [4], QType.F32, {})), "tensor #0 has an empty name"),
    "duplicate tensor": (_tensors(("t", [4], QType.F32, {}), ("t", [4], QType.F32, {})), "duplicate tensor name 't'"),
    "0 dims": (_tensors(("t", [], QType.F32, {})), "'t': 0 dimensions, expected 1 to 4"),
    "5 dims": (_tensors(("t", [1, 1, 1, 1, 1], QType.F32, {"offset": 0})), "'t': 5 dimensions"),
    "huge n_dims": (_tensors(("t", [4], QType.F32, {"n_dims": 2**31})), "'t': 2147483648 dimensions"),
    "dims cut": (lambda: RawGGUF().tensor("t", [4], QType.F32, n_dims=4, offset=0).header_and_infos(),
                 r"truncated: tensor 't' \(shape\) needs 32 bytes"),
    "dim 0": (_tensors(("t", [4, 0], QType.F32, {"offset": 0})), r"'t': shape \[4, 0\] has a dimension <= 0"),
    "dim negative": (_tensors(("t", [-4], QType.F32, {"offset": 0})), r"'t': shape \[-4\] has a dimension <= 0"),
    "elements overflow int64": (_tensors(("t", [2**32, 2**31], QType.F32, {"offset": 0})), r"more than 2\*\*63-1 elements"),
    "row not whole blocks": (_tensors(("t", [33, 2], QType.Q8_0, {"offset": 0})),
                             "'t': row length 33 is not a multiple of Q8_0's block size 32"),
    "removed type id 4": (_tensors(("t", [32], 4, {"offset": 0})), "'t': unknown ggml type id 4"),
    "type id 99": (_tensors(("t", [32], 99, {"offset": 0})), "'t': unknown ggml type id 99"),
    "offset unaligned": (_tensors(("a", [8], QType.F32, {}), ("t", [4], QType.F32, {"offset": 16})),
                         "'t': offset 16 is not a multiple of the alignment 32"),
    "offset out of file": (_tensors(("t", [4], QType.F32, {"offset": 2**40})), "truncated: tensor 't' data"),
    "offset near 2**64": (_tensors(("t", [4], QType.F32, {"offset": 2**64 - 32})), "truncated: tensor 't' data"),
    "overlap": (_tensors(("a", [64], QType.F32, {}), ("t", [4], QType.F32, {"offset": 128})),
                "tensor 't' data overlaps tensor 'a'"),
    "same offset": (_tensors(("a", [8], QType.F32, {}), ("b", [8], QType.F32, {"offset": 0})), "overlaps tensor"),
    "data cut": (lambda: valid_raw().build()[:-1], r"truncated: tensor 'n' data \[\d+, \d+\) runs past the end"),
    "infos cut": (lambda: valid_raw().header_and_infos()[:-3], r"truncated: tensor 'n' \(offset\)"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_file_raises(tmp_path, case):
    make, message = MALFORMED[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(make())
    with pytest.raises(GGUFError, match=message):
        GGUFFile(path)


# --- fuzz-ish -----------------------------------------------------------------------------


def _fuzz_base(tmp_path):
    rng = np.random.default_rng(5)
    meta = {"s": (VT.STRING, "abc"), "n": (VT.INT64, -3), "f": (VT.ARRAY, [0.5, 1.5], VT.FLOAT32),
            "tok": (VT.ARRAY, ["<s>", "a", "✓", "xyz" * 10], VT.STRING), "b": (VT.BOOL, True)}
    tensors = {"e": rng.standard_normal((3, 8)).astype(np.float32),
               "q": (QType.Q4_K, rng.integers(0, 256, (2, 144), dtype=np.uint8))}
    path = write_gguf(tmp_path / "base.gguf", meta, tensors)
    with GGUFFile(path) as f:
        need = max(t.offset + t.nbytes for t in f.tensors.values())
        header = f.data_offset
    return path.read_bytes(), need, header


def _open_and_touch(path):
    with GGUFFile(path) as f:
        for name, t in f.tensors.items():
            f.tensor_bytes(name).sum()
            assert f.tensor_array(name).nbytes == t.nbytes
        return f.metadata


def test_truncation_anywhere_raises_gguf_error(tmp_path):
    data, need, _ = _fuzz_base(tmp_path)
    for cut in list(range(0, len(data), 3)) + [need - 1, need]:
        path = tmp_path / f"cut{cut}.gguf"  # new files: rewriting one is slow on some filesystems
        path.write_bytes(data[:cut])
        if cut < need:
            with pytest.raises(GGUFError):
                GGUFFile(path)
        else:
            _open_and_touch(path)


def test_corrupted_header_bytes_raise_only_gguf_error(tmp_path):
    data, _, header = _fuzz_base(tmp_path)
    rng = np.random.default_rng(7)
    outcomes = {"ok": 0, "error": 0}
    for i in range(1500):
        buf = bytearray(data)
        for pos in rng.integers(0, header, int(rng.integers(1, 4))):
            buf[pos] = int(rng.integers(0, 256))
        path = tmp_path / f"flip{i}.gguf"
        path.write_bytes(buf)
        try:
            _open_and_touch(path)
            outcomes["ok"] += 1
        except GGUFError:
            outcomes["error"] += 1
    assert outcomes["ok"] > 0 and outcomes["error"] > 0, outcomes

