"""StringArray (GGUF string arrays read in place) and StringIndex (text -> position over one),
each on the C kernels and on the Python fallback, against plain lists and dicts."""

from __future__ import annotations

import contextlib
import struct
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest

from edgellm.gguf_file import StringArray
from edgellm.kernels import c_module
from edgellm.tokenizer.string_index import DuplicateStringError, StringIndex

PATHS = ["c", "python"] if c_module() is not None else ["python"]


@pytest.fixture(params=PATHS)
def path(request):
    """Run the test with the C kernels as built, or as if they were not."""
    ctx = contextlib.nullcontext() if request.param == "c" else mock.patch("edgellm.kernels.c_module", lambda: None)
    with ctx:
        yield request.param


def random_strings(rng, n: int) -> list[str]:
    """Distinct strings: ASCII, multi-byte characters, undecodable bytes (as surrogateescape
    decodes them), prefixes of one another and the empty string."""
    alphabet = ["a", "b", "▁", "é", "🙂", "\udcff", "\udc80", " ", "\n"]
    out = {""}
    while len(out) < n:
        k = int(rng.integers(1, 12))
        out.add("".join(alphabet[i] for i in rng.integers(0, len(alphabet), k)))
    return sorted(out, key=lambda s: (len(s), s))


def u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8)


def gguf_run(strings: list[bytes]) -> bytes:
    return b"".join(struct.pack("<Q", len(s)) + s for s in strings)


# -- StringArray -----------------------------------------------------------------------------------


def test_string_array_is_a_sequence_of_its_strings(path):
    strings = random_strings(np.random.default_rng(0), 5000)  # more than one iteration chunk
    arr = StringArray.from_strings(strings)
    assert len(arr) == len(strings)
    assert list(arr) == strings and arr == strings and strings == arr and arr == tuple(strings)
    assert [arr[i] for i in range(len(arr))] == strings
    assert arr[-1] == strings[-1] and arr[-len(arr)] == strings[0]
    assert arr[10:20] == strings[10:20] and arr[::-700] == strings[::-700] and arr[5:5] == []
    encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
    assert [arr.encoded(i) for i in range(len(arr))] == encoded
    assert arr.byte_lengths().tolist() == [len(b) for b in encoded]
    ids = np.array([len(arr) - 1, 0, 77, 77])
    assert arr.byte_lengths(ids).tolist() == [len(encoded[i]) for i in ids]
    assert arr.index(strings[123]) == 123 and strings[7] in arr
    for i in (len(arr), -len(arr) - 1):
        with pytest.raises(IndexError, match="out of range"):
            arr[i]
    with pytest.raises(TypeError):
        arr["0"]


def test_string_array_equality_and_repr():
    arr = StringArray.from_strings(["x", "yz", "", "w"])
    assert arr == StringArray.from_strings(["x", "yz", "", "w"])
    assert arr != ["x", "yz", "", "v"] and arr != ["x", "yz", ""] and arr != "xyzw" and arr != 4
    assert repr(arr) == "StringArray(['x', 'yz', '', 'w'], n=4)"
    assert repr(StringArray.from_strings(list("abcdef"))) == "StringArray(['a', 'b', 'c', 'd', ...], n=6)"
    assert StringArray.from_strings([]) == [] and len(StringArray.from_strings([])) == 0
    with pytest.raises(TypeError):
        hash(arr)


def test_string_array_walk_reports_the_string_past_the_end(path):
    run = gguf_run([b"ab", b"", b"cde"])
    assert StringArray._walk(u8(run), 0, 3) == ["ab", "", "cde"]
    assert StringArray._walk(u8(b"pad" + run), 3, 2) == ["ab", ""]
    for cut, bad in ((len(run) - 1, 2), (len(run) - 3, 2), (len(run) - 4, 2), (10, 1), (9, 0), (0, 0)):
        with pytest.raises(ValueError, match=f"string #{bad} of 3 runs past the end"):
            StringArray._walk(u8(run[:cut]), 0, 3)
    huge = struct.pack("<Q", 2**64 - 1) + b"x" * 16
    with pytest.raises(ValueError, match="string #0 of 1"):
        StringArray._walk(u8(huge), 0, 1)


# -- StringIndex -----------------------------------------------------------------------------------


def test_index_finds_every_string_and_nothing_else(path):
    rng = np.random.default_rng(1)
    strings = random_strings(rng, 20000)
    ix = StringIndex(StringArray.from_strings(strings))
    assert ix.backend == {"c": "c", "python": "dict"}[path]
    expected = {s: i for i, s in enumerate(strings)}
    for s, i in expected.items():
        assert ix.get(s) == i and ix[s] == i and s in ix
    for s in random_strings(np.random.default_rng(2), 3000):
        assert ix.get(s) == expected.get(s)
        assert ix.get(s, -7) == expected.get(s, -7)
    for missing in ("ab" * 40, "\udcfe", "a\x00"):
        assert missing not in ix and ix.get(missing) is None
        with pytest.raises(KeyError):
            ix[missing]


def test_index_duplicates(path):
    strings = ["p", "q r", "s", "q r", "t", "s"]
    with pytest.raises(DuplicateStringError) as e:
        StringIndex(StringArray.from_strings(strings))
    assert (e.value.text, e.value.first, e.value.second) == ("q r", 1, 3)
    ix = StringIndex(StringArray.from_strings(strings), first_wins=True)
    assert [ix.get(s) for s in ("p", "q r", "s", "t", "u")] == [0, 1, 2, 4, None]


def test_index_of_a_single_and_of_no_string(path):
    assert StringIndex(StringArray.from_strings([""])).get("") == 0
    ix = StringIndex(StringArray.from_strings([]))
    assert ix.get("") is None and ix.get("a") is None


def test_index_without_c_kernels_when_asked():
    ix = StringIndex(StringArray.from_strings(["a", "b"]), use_c=False)
    assert ix.backend == "dict" and ix["b"] == 1
    with mock.patch("edgellm.kernels.c_module", lambda: None):
        with pytest.raises(RuntimeError, match="not built"):
            StringIndex(StringArray.from_strings(["a"]), use_c=True)


_COLLECT_CYCLES = """
import sys
from edgellm.gguf_file import GGUFFile
from edgellm.tokenizer import Tokenizer
g = GGUFFile(sys.argv[1])
text = " ".join(f"word{i} {i * 7919 % 1000}" for i in range(3000))
for _ in range(5):  # each tokenizer is left in a reference cycle, for the collector to free
    tok = Tokenizer.from_metadata(g.metadata)
    tok.cycle = tok
    tok.encode(text)
print("done")
"""


@pytest.mark.real
def test_tokenizers_freed_by_the_collector_while_the_file_lives(real_model):
    # The C tables point into the file's bytes. Handing C a memoryview of the mapping crashed
    # here: the collector clears a memoryview even while exported. Run apart: a crash fails the test.
    _, path, _ = real_model
    res = subprocess.run([sys.executable, "-c", _COLLECT_CYCLES, str(path)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "done", (res.returncode, res.stderr[-2000:])
