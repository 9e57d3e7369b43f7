"""llama.cpp's tokenizer suite (test-tokenizer-0): every models/ggml-vocab-*.gguf that has .inp/.out
files, from llama.cpp's source (tests/llamacpp_source.py fetches it), tokenized by edgellm with
add_special=False, parse_special=False as the suite does. Exact ids on every vocabulary whose
tokenizer edgellm supports, with the vocabulary indexed in C and in Python; the others are skipped
with the reason."""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest

import llamacpp_source
from edgellm.errors import UnsupportedModelError
from edgellm.gguf_file import GGUFFile
from edgellm.tokenizer import Tokenizer

# vocabularies of the suite whose tokenizer model edgellm does not implement (llama.cpp's WPM for
# BERT encoders); the test checks that loading them says so
UNSUPPORTED = {"bert-bge": "tokenizer model 'bert'"}


def _suite() -> list[str]:
    names = sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")]
                   for p in llamacpp_source.models_dir().glob("ggml-vocab-*.gguf.inp"))
    assert len(names) >= 15, names  # the suite of build 0c1e570 has 16
    return names


@pytest.fixture(scope="module", params=["c", "python"])
def backend(request):
    return request.param


def _tokenizer(name: str, backend: str) -> Tokenizer:
    meta = dict(GGUFFile(llamacpp_source.vocab_file(name)).metadata)
    ctx = contextlib.nullcontext() if backend == "c" else mock.patch("edgellm.kernels.c_module", lambda: None)
    with ctx:
        tok = Tokenizer.from_metadata(meta)
    assert tok.vocab.token_to_id.backend == {"c": "c", "python": "dict"}[backend]
    return tok


def pytest_generate_tests(metafunc):
    if "vocab_name" in metafunc.fixturenames:
        metafunc.parametrize("vocab_name", _suite())


def test_vocab_matches_llama_cpp(vocab_name, backend):
    path = llamacpp_source.vocab_file(vocab_name)
    if vocab_name in UNSUPPORTED:
        with pytest.raises(UnsupportedModelError, match=UNSUPPORTED[vocab_name]):
            Tokenizer.from_metadata(dict(GGUFFile(path).metadata))
        pytest.skip(f"{vocab_name}: {UNSUPPORTED[vocab_name]} is not supported by edgellm")
    tok = _tokenizer(vocab_name, backend)
    cases = llamacpp_source.vocab_cases(path)
    wrong = [(text, got, ids) for text, ids in cases
             if (got := tok.encode(text, add_bos=False, special=False)) != ids]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, first: {wrong[0]!r}"
