"""Tokenizers from GGUF metadata: exact ids against llama.cpp's reference outputs on the two real
models, round trips, streaming decode, and small synthetic vocabularies for the rules."""

from __future__ import annotations

import contextlib
import warnings
from unittest import mock

import numpy as np
import pytest

from edgellm.gguf_file import GGUFFile
from edgellm.kernels import c_module

from edgellm.errors import TokenizerError, UnsupportedModelError
from edgellm.tokenizer import Tokenizer
from edgellm.tokenizer.pretokenize import Splitter

# -- metadata of the real models ---------------------------------------------------------------


def gguf_metadata(path) -> dict:
    """GGUF key -> value, as edgellm's loader reads them."""
    return dict(GGUFFile(path).metadata)


_META: dict = {}
_TOKENIZERS: dict = {}


def c_kernels(present: bool):
    """A context in which edgellm sees the C kernels as built (unchanged) or not."""
    return contextlib.nullcontext() if present else mock.patch("edgellm.kernels.c_module", lambda: None)


@pytest.fixture(scope="session", params=["c", "python"])
def real(real_model, request):
    """(alias, tokenizer, reference) for each real model, with the vocabulary read and indexed in C
    or, as without the C kernels, in Python; each tokenizer built once per session."""
    alias, path, ref = real_model
    key = (path, request.param)
    if key not in _TOKENIZERS:
        with c_kernels(request.param == "c"):
            _TOKENIZERS[key] = Tokenizer.from_metadata(gguf_metadata(path))
        assert _TOKENIZERS[key].vocab.token_to_id.backend == {"c": "c", "python": "dict"}[request.param]
    return alias, _TOKENIZERS[key], ref


# -- llama.cpp's ids, exactly ------------------------------------------------------------------


def test_tokenize_plain_matches_llama_cpp(real):
    _, tok, ref = real
    for case in ref["tokenize"]:
        assert tok.encode(case["text"], add_bos=False) == case["ids"], case["text"]


def test_tokenize_special_matches_llama_cpp(real):
    _, tok, ref = real
    case = ref["tokenize_special"]
    assert tok.encode(case["text"], add_bos=False, special=True) == case["ids"]
    # without parse_special the markers are plain text: more tokens, none of the control ids
    plain = tok.encode(case["text"], add_bos=False)
    control = {i for i in case["ids"] if tok.token_to_piece(i) == b""}
    assert control and not control & set(plain)


def test_prompt_ids_match_llama_cpp(real):
    _, tok, ref = real
    for g in ref["greedy"]:
        assert tok.encode(g["prompt"]) == g["prompt_ids"], g["prompt"]
        assert (g["prompt_ids"][0] == tok.bos_id) == tok.add_bos


def test_teacher_forced_ids_match_llama_cpp(real):
    _, tok, ref = real
    ids = tok.encode(ref["text"])
    assert ids[:512] == ref["teacher_forced"]["ids"]


def test_eog_contains_eos_and_end_of_turn(real):
    _, tok, ref = real
    # the chat marker closing a turn ("<|im_end|>" / "<end_of_turn>") is the 5th id of the
    # special-tokenization fixture "<start>user\nHi<end>\n"
    end_of_turn = ref["tokenize_special"]["ids"][4]
    assert tok.eos_id in tok.eog_ids and end_of_turn in tok.eog_ids
    assert not {tok.encode("Hi", add_bos=False)[0], tok.encode("\n", add_bos=False)[0]} & tok.eog_ids


# -- decoding ------------------------------------------------------------------------------------


def test_decode_continuations_match_llama_cpp(real):
    _, tok, ref = real
    for g in ref["greedy"]:
        assert tok.decode(g["continuation_ids"]) == g["continuation_text"]


def test_round_trip(real):
    _, tok, ref = real
    for text in [c["text"] for c in ref["tokenize"]] + [ref["text"]]:
        assert tok.decode(tok.encode(text)) == text
        assert tok.decode(tok.encode(text, add_bos=False)) == text
    special = ref["tokenize_special"]["text"]
    ids = tok.encode(special, special=True, add_bos=False)
    assert tok.decode(ids, special=True) == special
    hidden = special
    for i in ids:
        if tok.token_to_piece(i) == b"":  # control tokens are left out unless special=True
            hidden = hidden.replace(tok.token_bytes(i).decode(), "")
    assert hidden != special and tok.decode(ids) == hidden


def test_streaming_decode_holds_back_partial_characters(real):
    _, tok, ref = real
    texts = [c["text"] for c in ref["tokenize"] if any(ord(ch) > 0x7F for ch in c["text"])]
    held_back = 0
    for text in texts:
        ids = tok.encode(text, add_bos=False)
        stream = tok.streaming_decoder()
        chunks = [stream.add(i) for i in ids] + [stream.flush()]
        assert "".join(chunks) == tok.decode(ids) == text
        assert all("\ufffd" not in c for c in chunks)
        held_back += sum(1 for i, c in zip(ids, chunks) if c == "" and tok.token_to_piece(i))
    assert held_back > 0  # some emoji/CJK character really was split across tokens


def test_token_bytes(real):
    _, tok, ref = real
    ids = ref["tokenize_special"]["ids"]
    assert b"".join(tok.token_bytes(i) for i in ids).decode() == ref["tokenize_special"]["text"]
    assert tok.token_to_piece(ids[0]) == b"" and tok.token_bytes(ids[0]) != b""


# -- synthetic vocabularies: SentencePiece -------------------------------------------------------

BYTES = [f"<0x{b:02X}>" for b in range(256)]


def spm_meta(pieces: dict[str, float], **extra) -> dict:
    """A tiny SPM vocabulary: <unk> <s> </s>, 256 byte tokens, then `pieces` (text -> score)."""
    tokens = ["<unk>", "<s>", "</s>", *BYTES, *pieces]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * (3 + 256) + list(pieces.values())
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
    }
    for key, value in extra.items():
        meta["tokenizer.ggml." + key] = value
    return meta


def ids_of(tok: Tokenizer, *texts: str) -> list[int]:
    return [tok.vocab.tokens.index(t) for t in texts]


@pytest.fixture(params=["c", "python"])
def lookup(request):
    """Build tokenizers in the test with the vocabulary indexed (and SPM merged) in C, or in Python."""
    if request.param == "c" and c_module() is None:
        pytest.skip("the C kernels are not built")
    with c_kernels(request.param == "c"):
        yield request.param


@pytest.mark.usefixtures("lookup")
def test_spm_scores_unaligned_as_gguf_gives_them():
    # GGUFFile hands unaligned metadata arrays out as views (no copy); the SPM encoder merges by
    # the same scores and gives C an aligned copy of them
    pieces = {"▁": -1, "a": -1, "b": -1, "c": -1, "ab": -5, "bc": -2, "▁a": -3}
    meta = spm_meta(pieces)
    raw = np.zeros(meta["tokenizer.ggml.scores"].nbytes + 1, np.uint8)
    unaligned = raw[1:].view(np.float32)
    unaligned[:] = meta["tokenizer.ggml.scores"]
    assert not unaligned.flags.aligned
    aligned_tok = Tokenizer.from_metadata(meta)
    tok = Tokenizer.from_metadata({**meta, "tokenizer.ggml.scores": unaligned})
    for text in ("abc", "a bc ab", "cab abc  bca"):
        assert tok.encode(text) == aligned_tok.encode(text)
    enc = tok._encoder
    if enc._c_args is not None:
        assert enc._c_keep.flags.aligned and enc._c_keep.flags.c_contiguous


@pytest.mark.usefixtures("lookup")
def test_spm_merges_by_score_and_defaults():
    pieces = {"▁": -1, "a": -1, "b": -1, "c": -1, "ab": -5, "bc": -2, "▁a": -3}
    tok = Tokenizer.from_metadata(spm_meta(pieces))
    assert tok.add_bos and tok.bos_id == 1 and tok.eos_id == 2  # llama.cpp's SPM defaults
    # a space is prefixed (add_space_prefix defaults to true); "bc" outscores "ab"
    assert tok.encode("abc") == [1, *ids_of(tok, "▁a", "bc")]
    assert tok.encode("abc", add_bos=False) == ids_of(tok, "▁a", "bc")
    assert tok.decode(tok.encode("abc")) == "abc"
    assert tok.decode(ids_of(tok, "▁a", "bc")) == "abc"  # no BOS: the first piece loses its space
    assert tok.streaming_decoder().add(ids_of(tok, "▁a")[0]) == " a"  # streaming keeps it


@pytest.mark.usefixtures("lookup")
def test_spm_equal_scores_merge_leftmost_first():
    meta = spm_meta({"a": -1, "b": -1, "c": -1, "ab": -2, "bc": -2}, add_space_prefix=False)
    tok = Tokenizer.from_metadata(meta)
    assert tok.encode("abc", add_bos=False) == ids_of(tok, "ab", "c")


@pytest.mark.usefixtures("lookup")
def test_spm_byte_fallback_and_streaming():
    tok = Tokenizer.from_metadata(spm_meta({"▁": -1, "a": -1}))
    ids = tok.encode("aé🦙", add_bos=False)
    assert ids == ids_of(tok, "▁", "a", "<0xC3>", "<0xA9>", "<0xF0>", "<0x9F>", "<0xA6>", "<0x99>")
    assert tok.decode(ids) == "aé🦙"
    stream = tok.streaming_decoder()
    assert [stream.add(i) for i in ids] == [" ", "a", "", "é", "", "", "", "🦙"]
    assert stream.add(ids[2]) == "" and stream.flush() == "\ufffd"  # an unfinished character


@pytest.mark.usefixtures("lookup")
def test_spm_missing_byte_token_is_an_error():
    meta = spm_meta({"▁": -1, "a": -1})
    meta["tokenizer.ggml.tokens"][3 + 0xC3] = "<0xC3-missing>"
    tok = Tokenizer.from_metadata(meta)
    with pytest.raises(TokenizerError, match="0xC3"):
        tok.encode("é")


@pytest.mark.skipif(c_module() is None, reason="the C kernels are not built")
def test_spm_in_c_agrees_with_python_on_random_vocabularies():
    rng = np.random.default_rng(7)
    alphabet = ["a", "b", "c", "▁", "é", "🦙"]
    for trial in range(20):
        # pieces of 1-4 characters, scores drawn from a few values so that ties are common
        pieces = {"".join(rng.choice(alphabet, int(rng.integers(1, 5)))): float(rng.choice([-1, -2, -2.5, -3]))
                  for _ in range(40)}
        meta = spm_meta(pieces, add_space_prefix=bool(trial % 2))
        tok_c = Tokenizer.from_metadata(meta)
        with c_kernels(False):
            tok_py = Tokenizer.from_metadata(meta)
        for _ in range(50):
            text = "".join(rng.choice(alphabet + [" ", "x", "ü"], int(rng.integers(0, 30))))
            assert tok_c.encode(text) == tok_py.encode(text), (pieces, text)


@pytest.mark.usefixtures("lookup")
def test_special_tokens_partition():
    meta = spm_meta({"▁": -1, "a": -1, "<|x|>": 0, "<|x|><|y|>": 0, "\n\n": 0}, add_space_prefix=False)
    meta["tokenizer.ggml.token_type"][-3:] = [3, 3, 4]  # two control tokens, one user-defined
    tok = Tokenizer.from_metadata(meta)
    x, xy, nn = ids_of(tok, "<|x|>", "<|x|><|y|>", "\n\n")
    a = ids_of(tok, "a")[0]
    # longest special token first; user-defined tokens are split out even without special=True
    assert tok.encode("a<|x|><|y|>a<|x|>\n\n", special=True, add_bos=False) == [a, xy, a, x, nn]
    plain = tok.encode("a<|x|>\n\n", add_bos=False)
    assert x not in plain and plain[-1] == nn
    assert tok.decode([a, x, nn]) == "a\n\n"
    assert tok.decode([a, x, nn], special=True) == "a<|x|>\n\n"


@pytest.mark.usefixtures("lookup")
def test_space_prefix_after_special_token():
    meta = spm_meta({"▁": -1, "a": -1, "▁a": -0.5, "<c>": 0})
    meta["tokenizer.ggml.token_type"][-1] = 3
    tok = Tokenizer.from_metadata(meta)
    # llama.cpp prefixes a space to text that follows a special token
    assert tok.encode("<c>a", add_bos=False, special=True) == ids_of(tok, "<c>", "▁a")


@pytest.mark.usefixtures("lookup")
def test_text_that_continues_other_text_gets_no_space_prefix():
    """space_prefix=False (a grammar's forced text): the pieces spell exactly the text, also
    after a special token."""
    meta = spm_meta({"▁": -1, "a": -1, "{": -1, "▁a": -0.5, "<c>": 0})
    meta["tokenizer.ggml.token_type"][-1] = 3
    tok = Tokenizer.from_metadata(meta)
    assert tok.encode("{a", add_bos=False) == ids_of(tok, "▁", "{", "a")
    assert tok.encode("{a", add_bos=False, space_prefix=False) == ids_of(tok, "{", "a")
    assert tok.encode(" a", add_bos=False, space_prefix=False) == ids_of(tok, "▁a")
    assert tok.encode("<c>a", add_bos=False, special=True, space_prefix=False) == ids_of(tok, "<c>", "a")


def test_rstrip_attribute_for_phi3():
    meta = spm_meta({"▁": -1, "a": -1, "<|end|>": 0}, add_space_prefix=False)
    meta["tokenizer.ggml.token_type"][-1] = 3
    meta["general.name"] = "Phi-3 mini"  # llama.cpp gives phi-3's special tokens rstrip
    tok = Tokenizer.from_metadata(meta)
    end, a = ids_of(tok, "<|end|>", "a")
    assert tok.encode("a<|end|> \n a", special=True, add_bos=False) == [a, end, a]
    assert end in tok.eog_ids


# -- synthetic vocabularies: byte-level BPE -------------------------------------------------------

GPT2_BYTE_CHARS = [chr(b) for b in (*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100))]


def bpe_meta(merges: list[str], **extra) -> dict:
    """A tiny byte-level BPE vocabulary: "<|endoftext|>", the 256 byte characters, then the
    results of `merges`."""
    byte_chars = GPT2_BYTE_CHARS + [chr(0x100 + i) for i in range(256 - len(GPT2_BYTE_CHARS))]
    tokens = ["<|endoftext|>", *byte_chars, *(m.replace(" ", "") for m in merges)]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array([3] + [1] * (len(tokens) - 1), dtype=np.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
    }
    for key, value in extra.items():
        meta["tokenizer.ggml." + key] = value
    return meta


@pytest.mark.usefixtures("lookup")
def test_bpe_merge_rank_order():
    first = Tokenizer.from_metadata(bpe_meta(["a b", "b c"]))
    assert first.encode("abc") == ids_of(first, "ab", "c")  # BPE adds no BOS unless asked
    second = Tokenizer.from_metadata(bpe_meta(["b c", "a b"]))
    assert second.encode("abc") == ids_of(second, "a", "bc")


@pytest.mark.skipif(c_module() is None, reason="the C kernels are not built")
def test_bpe_in_c_agrees_with_python_on_random_merges():
    rng = np.random.default_rng(11)
    for trial in range(20):
        symbols = ["a", "b", "c", "Ġ", "Ã", "©"]  # "a", "b", "c", " " and "é" through the byte map
        merges = []
        while len(merges) < 30:
            left, right = rng.choice(symbols, 2)
            if left + right not in symbols:  # each rule makes a new token
                merges.append(f"{left} {right}")
                symbols.append(left + right)
        meta = bpe_meta(merges)
        tokens = meta["tokenizer.ggml.tokens"]
        for i in rng.choice(np.arange(257, len(tokens)), 3, replace=False):  # merged symbols that are no token
            tokens[i] = f"<gone{i}>"
        tok_c = Tokenizer.from_metadata(meta)
        with c_kernels(False):
            tok_py = Tokenizer.from_metadata(meta)
        for _ in range(50):
            text = "".join(rng.choice(["a", "b", "c", " ", "é", "x"], int(rng.integers(0, 30))))
            assert tok_c.encode(text) == tok_py.encode(text), (merges, text)


@pytest.mark.usefixtures("lookup")
def test_bpe_bytes_pretokenizer_and_round_trip():
    tok = Tokenizer.from_metadata(bpe_meta(["Ġ h", "Ġh i"]))
    # the gpt2 pre-tokenizer keeps " hi" together; é is two byte tokens
    assert tok.encode("hi hi é") == ids_of(tok, "h", "i", "Ġhi", "Ġ", "Ã", "©")
    text = "tabs\tand\nnew 🦙 lines\r\n  x"
    assert tok.decode(tok.encode(text)) == text
    assert tok.eog_ids == {0}


@pytest.mark.parametrize(
    "pre, text, words",
    [
        # contractions are case-sensitive in gpt2, not in llama3; runs of spaces leave the last one
        # to the next word; llama3 groups digits by three, qwen2 and starcoder one by one
        ("gpt2", "I'M  don't 12345", ["I", "'", "M", " ", " don", "'t", " 12345"]),
        ("llama3", "I'M  don't 12345", ["I", "'M", " ", " don", "'t", " ", "123", "45"]),
        ("qwen2", "I'M  don't 12", ["I", "'M", " ", " don", "'t", " ", "1", "2"]),
        ("starcoder", "I'M  don't 12", ["I", "'", "M", " ", " don", "'t", " ", "1", "2"]),
        # llama.cpp's tables (Unicode 15.1) do not know U+13460 (Unicode 16): not a letter there
        ("llama3", "x\U00013460", ["x", "\U00013460"]),
        # llama.cpp's std::regex does not see U+3000 as the literal U+3000 of a range, only as space
        ("deepseek-llm", "a   \u3000", ["a", "   \u3000"]),
    ],
)
def test_pretokenizers_split_as_llama_cpp(pre, text, words):
    assert Splitter(pre).split(text) == words


def test_bpe_missing_pretokenizer_warns_and_uses_default():
    meta = bpe_meta(["3 4"])
    gpt2 = Tokenizer.from_metadata(meta)
    assert gpt2.encode("12345") == ids_of(gpt2, "1", "2", "34", "5")
    del meta["tokenizer.ggml.pre"]
    with pytest.warns(UserWarning, match="tokenizer.ggml.pre"):
        tok = Tokenizer.from_metadata(meta)
    # the default pre-tokenizer cuts digits into groups of three: 123|45, so 3 and 4 cannot merge
    assert tok.encode("12345") == ids_of(tok, "1", "2", "3", "4", "5")
    assert tok.decode(tok.encode("ab 12345!")) == "ab 12345!"


def test_bpe_llama3_defaults_add_bos():
    meta = bpe_meta(["a b"], pre="llama-bpe")
    tok = Tokenizer.from_metadata(meta)
    assert tok.add_bos and tok.encode("ab") == [0, *ids_of(tok, "ab")]
    meta["tokenizer.ggml.add_bos_token"] = False
    assert Tokenizer.from_metadata(meta).encode("ab") == ids_of(tok, "ab")


# -- bad metadata and bad input --------------------------------------------------------------------


def test_unknown_tokenizer_model():
    meta = spm_meta({})
    meta["tokenizer.ggml.model"] = "bert"
    with pytest.raises(UnsupportedModelError, match="'llama'.*'gpt2'"):
        Tokenizer.from_metadata(meta)


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("model", None, "tokenizer.ggml.model"),
        ("tokens", None, "tokenizer.ggml.tokens"),
        ("tokens", "abc", "tokenizer.ggml.tokens"),
        ("tokens", [], "tokenizer.ggml.tokens"),
        ("scores", np.zeros(5, np.float32), "tokenizer.ggml.scores"),
        ("token_type", np.array(["x"] * 300), "tokenizer.ggml.token_type"),
        ("bos_token_id", "1", "tokenizer.ggml.bos_token_id"),
        ("add_bos_token", "yes", "tokenizer.ggml.add_bos_token"),
    ],
)
def test_bad_metadata_names_the_key(key, value, needle):
    meta = spm_meta({"a": -1})
    if value is None:
        del meta["tokenizer.ggml." + key]
    else:
        meta["tokenizer.ggml." + key] = value
    with pytest.raises(TokenizerError, match=needle):
        Tokenizer.from_metadata(meta)


def test_bad_token_entries():
    meta = spm_meta({"a": -1})
    meta["tokenizer.ggml.tokens"][5] = b"bytes"
    with pytest.raises(TokenizerError, match=r"tokens\[5\]"):
        Tokenizer.from_metadata(meta)
    meta = spm_meta({"a": -1, "b": -1})
    meta["tokenizer.ggml.tokens"][-1] = "a"
    with pytest.raises(TokenizerError, match="duplicate"):
        Tokenizer.from_metadata(meta).encode("a")


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.float32])
def test_token_types_map_to_attributes(dtype):
    from edgellm.tokenizer.vocab import Attr

    meta = spm_meta({c: -1.0 for c in "abcdefghij"})
    junk = -5 if np.dtype(dtype).kind != "u" else 2**31
    kinds = [junk, 0, 1, 2, 3, 4, 5, 6, 7, 99]  # llama.h llama_token_type values, and others
    meta["tokenizer.ggml.token_type"] = np.array([2, 3, 3] + [6] * 256 + kinds, dtype=dtype)
    got = Tokenizer.from_metadata(meta).vocab.attrs[-10:].tolist()
    A = Attr
    assert got == [A.UNDEFINED, A.UNDEFINED, A.NORMAL, A.UNKNOWN, A.CONTROL, A.USER_DEFINED, A.UNUSED,
                   A.BYTE, A.UNDEFINED, A.UNDEFINED]


def test_empty_tokens_are_renamed():
    meta = spm_meta({"a": -1, "b": -2})
    meta["tokenizer.ggml.tokens"][-1] = ""  # llama.cpp names it "[EMPTY_<id>]"
    tok = Tokenizer.from_metadata(meta)
    last = tok.n_vocab - 1
    assert tok.token_bytes(last) == f"[EMPTY_{last}]".encode()
    assert tok.vocab.token_to_id[f"[EMPTY_{last}]"] == last and "" not in tok.vocab.token_to_id
    assert tok.vocab.tokens[:-1] == meta["tokenizer.ggml.tokens"][:-1]


def test_bpe_without_merges():
    meta = bpe_meta(["a b"])
    del meta["tokenizer.ggml.merges"]
    with pytest.raises(TokenizerError, match="tokenizer.ggml.merges"):
        Tokenizer.from_metadata(meta)


def test_add_bos_without_a_bos_token():
    meta = bpe_meta(["a b"], pre="chatglm-bpe", add_bos_token=True)  # chatglm has no default BOS
    del meta["tokenizer.ggml.bos_token_id"]
    with pytest.raises(TokenizerError, match="bos_token_id"):
        Tokenizer.from_metadata(meta)


def test_token_text_that_is_not_utf8_decodes_to_its_bytes():
    """GGUF strings are read with surrogateescape; found by scripts/fuzz.py gguf: a token whose
    text held a byte that is not UTF-8 raised UnicodeEncodeError when decoded. Its bytes come out
    as they are in the file (llama.cpp's token_to_piece copies them)."""
    meta = spm_meta({"a\udcb2": -1.0, "<x\udcff>": 0.0})
    meta["tokenizer.ggml.token_type"][-1] = 4  # user-defined: rendered as its text
    tok = Tokenizer.from_metadata(meta)
    normal, user = tok.n_vocab - 2, tok.n_vocab - 1
    assert tok._pieces.piece(normal, False) == b"a\xb2" and tok._pieces.piece(user, False) == b"<x\xff>"
    assert tok.decode([normal, user]) == b"a\xb2<x\xff>".decode("utf-8", "replace")


def test_out_of_range_special_id_keeps_default():
    with pytest.warns(UserWarning, match="eos_token_id"):
        tok = Tokenizer.from_metadata(spm_meta({"a": -1}, eos_token_id=10**6))
    assert tok.eos_id == 2


def test_bad_input():
    tok = Tokenizer.from_metadata(spm_meta({"a": -1}))
    with pytest.raises(TokenizerError, match="str"):
        tok.encode(b"abc")
    with pytest.raises(TokenizerError, match="surrogate"):
        tok.encode("a\udc80")
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([tok.n_vocab])
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.streaming_decoder().add(-1)
    with pytest.raises(TokenizerError, match="mapping"):
        Tokenizer.from_metadata([("tokenizer.ggml.model", "llama")])


def test_no_warnings_on_real_metadata(real_model):
    _, path, _ = real_model
    if path not in _META:
        _META[path] = gguf_metadata(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Tokenizer.from_metadata(_META[path])
