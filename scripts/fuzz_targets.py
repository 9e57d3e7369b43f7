"""What scripts/fuzz.py fuzzes. A target is one function, `run(data, ctx)`, registered with
@target: it feeds the bytes `data` to edgellm and checks what must hold; edgellm's own errors
(EdgeLLMError) are expected, anything else is a finding. A target may also give `setup()` (built
once per worker, passed as ctx) and `generate(rng, ctx) -> bytes`, the structure-aware input
maker of the mutator engine (it also seeds atheris' corpus).

    gguf       GGUF files: header, metadata of every type (nested arrays too), tensor infos,
               alignment, string lengths; then what loading does with them (model config, weight
               binding, tokenizer and chat template from the metadata)
    tokenizer  encode/decode on tiny SPM and byte-level BPE vocabularies and the two real models'
               (when cached): random Unicode, lone surrogates, 1 MiB texts, special-token soup,
               random ids; round trips where the tokenizer is lossless
    template   chat templates: Jinja sandbox-escape payloads and resource bombs, random Jinja,
               the real templates with random messages
    reply      a reply's reading (tool_calls.Reply) in every tool-call format: pieces of its calls,
               markers, reasoning and text spliced at random; read whole, a character at a time
               and in two pieces, it says the same (content, reasoning, calls), and parse never fails
    http       the server: request bodies, headers and routes against its ASGI app, in-process on a
               tiny model; every answer a 2xx or a 4xx with OpenAI's error JSON
    state      saved session files (Session.load_state) on a tiny llama and a tiny Gemma-3
               (sliding-window layers: two block groups): raw byte damage, and headers and block
               data rewritten then sealed with a valid checksum, so the loader's own checks are
               what is tried; a refused file leaves the session as it was, a loaded one continues
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import random
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgellm.errors import EdgeLLMError

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Target:
    name: str
    run: Callable[[bytes, Any], None]
    doc: str = ""
    setup: Callable[[], Any] = lambda: None
    generate: Callable[[random.Random, Any], bytes] = field(default=lambda rng, ctx: rng.randbytes(rng.randrange(64)))
    max_len: int = 1 << 16  # longest input atheris may make

    def drain_expected(self) -> collections.Counter:
        """edgellm errors that `expect` caught during the last input (fuzz.py counts them)."""
        out = collections.Counter(_EXPECTED)
        _EXPECTED.clear()
        return out


TARGETS: dict[str, Target] = {}
_EXPECTED: collections.Counter = collections.Counter()


def target(name: str, **kw):
    def register(fn):
        TARGETS[name] = Target(name, fn, doc=(fn.__doc__ or "").strip().split("\n")[0], **kw)
        return fn

    return register


def expect(fn, *args, **kwargs):
    """fn(*args, **kwargs), or None when it raises one of edgellm's errors (counted by type), so a
    target can go on to its next stage."""
    try:
        return fn(*args, **kwargs)
    except EdgeLLMError as e:
        _EXPECTED[type(e).__name__] += 1
        return None


# ------------------------------------------------------------------------------ shared makers

INTERESTING_INTS = [0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 63, 64, 255, 256, 257, 4095, 4096, 65535, 65536,
                    2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63 - 1, 2**63, 2**64 - 1]
INTERESTING_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-6, 1e30, -1e30, 3.4e38, float("inf"), float("-inf"),
                      float("nan"), 5e-324, 1e308]


def mutate_bytes(rng: random.Random, data: bytes, rounds: int | None = None) -> bytes:
    """A few byte-level mutations: bit flips, interesting integers written over fields, cuts,
    insertions, deletions, duplicated and spliced ranges."""
    b = bytearray(data)
    for _ in range(rounds or rng.randint(1, 6)):
        if not b:
            b += rng.randbytes(rng.randint(1, 16))
            continue
        op = rng.randrange(8)
        at = rng.randrange(len(b))
        if op == 0:
            b[at] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[at] = rng.randrange(256)
        elif op == 2:  # an interesting integer over a 4- or 8-byte field
            width = rng.choice((4, 8))
            v = rng.choice(INTERESTING_INTS) % (1 << (8 * width))
            b[at:at + width] = v.to_bytes(width, "little")
        elif op == 3:
            del b[rng.randrange(len(b)):]
        elif op == 4:
            b[at:at] = rng.randbytes(rng.randint(1, 32))
        elif op == 5:
            del b[at:at + rng.randint(1, 32)]
        elif op == 6:
            n = rng.randint(1, 64)
            b[at:at] = b[rng.randrange(len(b)):][:n]
        else:
            n = rng.randint(1, 64)
            src = rng.randrange(len(b))
            b[at:at + n] = b[src:src + n]
    return bytes(b)


# Unicode the tokenizers must survive: by block, with the odd ones (controls, combining marks,
# joiners, BOM, noncharacters, private use, the replacement character).
_RANGES = [(0x20, 0x7E), (0x00, 0x1F), (0x80, 0xFF), (0x100, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF),
           (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
           (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF), (0x0300, 0x036F), (0x2000, 0x206F), (0xFE00, 0xFE0F),
           (0xE000, 0xF8FF), (0xFFF0, 0xFFFF), (0x10000, 0x10FFFF)]
_ODD = ["\u200d", "\ufeff", "\ufffd", "\u2581", "\u0120", "\u010a", "\r\n", "\t", " ", "  ", "\n\n", "\x00"]


def random_text(rng: random.Random, n: int) -> str:
    out = []
    while len(out) < n:
        r = rng.random()
        if r < 0.55:
            lo, hi = _RANGES[0] if rng.random() < 0.5 else rng.choice(_RANGES)
            out.extend(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12)))
        elif r < 0.8:
            out.append(rng.choice(["the", " cat", " sat", "Hello", " world", "123", " 4567", "'s", "'ll", "...",
                                   "def", "()", " {", "}\n", "        ", "ü", "é", "日本", "🦙"]))
        else:
            out.append(rng.choice(_ODD))
    return "".join(out)[:n]


def random_utf8(rng: random.Random, n: int) -> bytes:
    """Mostly UTF-8 text, sometimes with invalid bytes or encoded lone surrogates in it."""
    data = random_text(rng, n).encode("utf-8", "surrogatepass")
    r = rng.random()
    if r < 0.1:
        data = mutate_bytes(rng, data)
    elif r < 0.2:
        at = rng.randrange(len(data) + 1)
        data = data[:at] + chr(rng.randint(0xD800, 0xDFFF)).encode("utf-8", "surrogatepass") + data[at:]
    return data


def text_of(data: bytes) -> str:
    """Bytes to a str the way a caller could hand it to us: invalid bytes become lone surrogates."""
    return data.decode("utf-8", "surrogateescape")


# ------------------------------------------------------------------------------ tiny vocabularies

_BYTE_PIECES = [f"<0x{i:02X}>" for i in range(256)]
_WORDS = ["the", "cat", "sat", "on", "mat", "hello", "world", "dog", "and", "of", "to", "in", "is"]


def tiny_spm_metadata() -> dict:
    """<unk> <s> </s>, 256 byte tokens, pieces for a few words (with ▁), two chat markers."""
    import numpy as np

    pieces = sorted({"\u2581"} | set("abcdefghijklmnopqrstuvwxyz")
                    | {("\u2581" + w)[:i] for w in _WORDS for i in range(2, len(w) + 2)}, key=lambda p: (len(p), p))
    tokens = ["<unk>", "<s>", "</s>", *_BYTE_PIECES, *pieces, "<|im_start|>", "<|im_end|>"]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces) + [3, 3]
    scores = [0.0] * 259 + [float(len(p)) for p in pieces] + [0.0, 0.0]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's byte -> printable character map, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def tiny_bpe_metadata() -> dict:
    """A byte-level BPE vocabulary: <|endoftext|>, the 256 byte characters, merges for the words."""
    import numpy as np

    chars = _gpt2_byte_chars()
    space = chars[ord(" ")]
    merges, tokens = [], ["<|endoftext|>", *chars]
    seen = set(tokens)
    for w in _WORDS:
        word = space + w
        cur = word[0]
        for ch in word[1:]:
            if cur + ch not in seen:
                merges.append(f"{cur} {ch}")
                tokens.append(cur + ch)
                seen.add(cur + ch)
            cur += ch
    tokens += ["<|im_start|>", "<|im_end|>"]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array([3] + [1] * (len(tokens) - 3) + [3, 3], dtype=np.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
    }


def real_model_metadata() -> dict[str, dict]:
    """alias -> GGUF metadata of the real models that are in the cache (none are fetched here)."""
    from edgellm.errors import ModelNotFoundError
    from edgellm.gguf_file import GGUFFile
    from edgellm.registry import resolve

    out = {}
    for alias in ("smollm2-135m-instruct", "gemma3-270m"):
        try:
            path = resolve(alias, progress=False, download=False)
        except ModelNotFoundError:
            continue
        out[alias] = dict(GGUFFile(path).metadata)
    return out


# ------------------------------------------------------------------------------ gguf

_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q",
                   12: "<d"}
_STRING, _ARRAY = 8, 9


def _gstr(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _scalar(rng: random.Random, vtype: int) -> bytes:
    fmt = _SCALAR_FORMATS[vtype]
    if vtype in (6, 12):
        v = rng.choice(INTERESTING_FLOATS) if rng.random() < 0.5 else rng.uniform(-1e6, 1e6)
        if vtype == 6 and abs(v) > 3.4e38 and v == v:
            v = v * float("inf")  # beyond float32: its infinity
        return struct.pack(fmt, v)
    if vtype == 7:
        return bytes([rng.choice((0, 1, 1, 0, 2, 255))])
    bits = struct.calcsize(fmt) * 8
    v = rng.choice(INTERESTING_INTS) if rng.random() < 0.6 else rng.getrandbits(bits)
    return (v % (1 << bits)).to_bytes(bits // 8, "little")


def _value(rng: random.Random, vtype: int, depth: int = 0) -> bytes:
    """The bytes of a random value of GGUF type vtype (arrays nested, sometimes past the limit)."""
    if vtype in _SCALAR_FORMATS:
        return _scalar(rng, vtype)
    if vtype == _STRING:
        return _gstr(random_utf8(rng, rng.choice((0, 1, 5, 40))))
    if vtype == _ARRAY:
        etype = rng.choice(list(range(13)) * 4 + [13, 2**31, 2**32 - 1])
        if etype == _ARRAY and depth > rng.randint(2, 10):
            etype = 4
        n = rng.choice((0, 1, 2, 3, 17)) if rng.random() < 0.9 else rng.choice(INTERESTING_INTS)
        body = b"".join(_value(rng, etype, depth + 1) for _ in range(min(n, 20))) if etype <= 12 else b""
        return struct.pack("<IQ", etype % 2**32, n % 2**64) + body
    return rng.randbytes(rng.randrange(9))


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _gstr(key.encode()) + struct.pack("<I", vtype) + payload


def _string_array(items: list[str]) -> bytes:
    return struct.pack("<IQ", _STRING, len(items)) + b"".join(_gstr(s.encode("utf-8", "surrogatepass")) for s in items)


def _numeric_array(vtype: int, values) -> bytes:
    return struct.pack("<IQ", vtype, len(values)) + b"".join(struct.pack(_SCALAR_FORMATS[vtype], v) for v in values)


def _tokenizer_kvs(meta: dict) -> list[bytes]:
    kvs = [_kv("tokenizer.ggml.model", _STRING, _gstr(meta["tokenizer.ggml.model"].encode())),
           _kv("tokenizer.ggml.tokens", _ARRAY, _string_array(list(meta["tokenizer.ggml.tokens"]))),
           _kv("tokenizer.ggml.token_type", _ARRAY, _numeric_array(5, [int(t) for t in meta["tokenizer.ggml.token_type"]])),
           _kv("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", meta["tokenizer.ggml.bos_token_id"])),
           _kv("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", meta["tokenizer.ggml.eos_token_id"]))]
    if "tokenizer.ggml.scores" in meta:
        kvs.append(_kv("tokenizer.ggml.scores", _ARRAY, _numeric_array(6, [float(s) for s in meta["tokenizer.ggml.scores"]])))
    if "tokenizer.ggml.merges" in meta:
        kvs.append(_kv("tokenizer.ggml.merges", _ARRAY, _string_array(meta["tokenizer.ggml.merges"])))
        kvs.append(_kv("tokenizer.ggml.pre", _STRING, _gstr(meta["tokenizer.ggml.pre"].encode())))
    return kvs


# ggml types and their (block elements, block bytes) for the tensors of the model maker
_GGML = {0: (1, 4), 1: (1, 2), 8: (32, 34), 2: (32, 18), 12: (256, 144)}


def _model_file(rng: random.Random, ctx: dict) -> bytes:
    """A tiny, nearly consistent llama / gemma3 model (so loading gets far), with random twists:
    odd hyperparameters, missing or extra keys and tensors, odd alignment, version, counts."""
    odd = 0.0 if rng.random() < 0.5 else rng.choice((0.01, 0.05, 0.2))  # how often to twist a field
    arch = rng.choice(("llama", "gemma3")) if rng.random() >= odd else rng.choice(("mistral", "qwen9", ""))
    tok = rng.choice(ctx["vocabs"])
    n_vocab = len(tok["tokenizer.ggml.tokens"])

    def dim(v):
        return v if rng.random() >= odd else rng.choice(INTERESTING_INTS)

    E, H, HKV, D, F, L = dim(32), dim(2), dim(1), dim(16), dim(64), dim(1)
    kvs = [_kv("general.architecture", _STRING, _gstr(arch.encode()))]
    for key, v in (("block_count", L), ("context_length", dim(128)), ("embedding_length", E),
                   ("feed_forward_length", F), ("attention.head_count", H), ("attention.head_count_kv", HKV),
                   ("attention.key_length", D), ("attention.value_length", D),
                   ("attention.sliding_window", dim(8)), ("rope.dimension_count", dim(16))):
        if rng.random() >= odd:
            vtype = 4 if rng.random() >= odd else rng.choice((0, 5, 6, 8, 10, 11))
            payload = struct.pack("<I", v % 2**32) if vtype == 4 else _value(rng, vtype)
            kvs.append(_kv(f"{arch}.{key}", vtype, payload))
    for key in ("attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.scaling.factor",
                "final_logit_softcapping"):
        if rng.random() < 0.5:
            kvs.append(_kv(f"{arch}.{key}", 6, _scalar(rng, 6)))
    if rng.random() < odd:
        kvs.append(_kv(f"{arch}.rope.scaling.type", _STRING, _gstr(rng.choice([b"linear", b"yarn", b"none", b"x"]))))
    kvs += _tokenizer_kvs(tok)
    if rng.random() < 0.3:
        kvs.append(_kv("tokenizer.chat_template", _STRING, _gstr(rng.choice(ctx["templates"]).encode())))
    for _ in range(rng.choice((0, 0, 1, 3, 8))):  # values of every type
        vtype = rng.randrange(13)
        kvs.append(_kv(f"fuzz.{rng.randrange(1000)}", vtype, _value(rng, vtype)))
    alignment = 32
    if rng.random() < 0.2:
        alignment = rng.choice((1, 2, 8, 64, 4096)) if rng.random() >= odd else rng.choice((0, 3, 48, 2**31))
        wide = rng.random() < odd
        kvs.append(_kv("general.alignment", 10 if wide else 4, struct.pack("<Q" if wide else "<I", alignment % 2**32)))
    rng.shuffle(kvs)

    names = {"token_embd.weight": (E, n_vocab), "output_norm.weight": (E,)}
    for i in range(min(L, 2) if L < 10**6 else 1):
        p = f"blk.{i}."
        names.update({p + "attn_norm.weight": (E,), p + "attn_q.weight": (E, H * D), p + "attn_k.weight": (E, HKV * D),
                      p + "attn_v.weight": (E, HKV * D), p + "attn_output.weight": (H * D, E),
                      p + "ffn_norm.weight": (E,), p + "ffn_gate.weight": (E, F), p + "ffn_up.weight": (E, F),
                      p + "ffn_down.weight": (F, E)})
        if arch == "gemma3":
            names.update({p + "attn_q_norm.weight": (D,), p + "attn_k_norm.weight": (D,),
                          p + "post_attention_norm.weight": (E,), p + "post_ffw_norm.weight": (E,)})
    infos, offset = [], 0
    for name, shape in names.items():
        if rng.random() < odd:
            continue
        fits = [t for t, (blk, _) in _GGML.items() if shape[0] % blk == 0]
        ttype = 0 if len(shape) == 1 else rng.choice(fits)
        if rng.random() < odd:
            ttype = rng.choice((3, 4, 14, 29, 39, 40, 2**31))
        shape = list(shape)
        if rng.random() < odd:
            shape = [rng.choice(INTERESTING_INTS + [2**64 - 1]) for _ in range(rng.randint(0, 5))]
        n_el = 1
        for s in shape:
            n_el *= max(s, 0)
        blk, nb = _GGML.get(ttype, (1, 1))
        nbytes = min(n_el // blk * nb, 1 << 20) if shape and shape[0] % blk == 0 else 64
        infos.append((name.encode(), shape, ttype, offset))
        a = alignment if alignment and alignment & (alignment - 1) == 0 and alignment < 4096 else 32
        offset += -(-nbytes // a) * a
        if rng.random() < odd:
            offset += rng.choice((1, 2, 31, -64))
    header = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(kvs))
    tinfo = b"".join(_gstr(n) + struct.pack("<I", len(s)) + b"".join(struct.pack("<Q", d % 2**64) for d in s)
                     + struct.pack("<IQ", t % 2**32, o % 2**64) for n, s, t, o in infos)
    body = header + b"".join(kvs) + tinfo
    a = alignment if alignment and alignment & (alignment - 1) == 0 and alignment < 4096 else 32
    body += b"\0" * (-len(body) % a)
    data_len = min(max(offset, 0), 4 << 20)
    return body + (b"\0" * data_len if rng.random() < 0.7 else rng.randbytes(data_len))


def _header_soup(rng: random.Random) -> bytes:
    """A header of random counts, metadata of random types and tensor infos of random fields."""
    version = 3 if rng.random() < 0.8 else rng.choice((2, 1, 4, 0, 0x03000000, rng.getrandbits(32)))
    n_kv = rng.choice((0, 1, 2, 5, 12))
    kvs = []
    for _ in range(n_kv):
        vtype = rng.choice(list(range(13)) + [13, 99])
        key = rng.choice(["general.architecture", "general.alignment", "tokenizer.ggml.tokens",
                          "general.name", "", "a" * 300, random_text(rng, 8)])
        kvs.append(_gstr(key.encode("utf-8", "surrogatepass")) + struct.pack("<I", vtype) + _value(rng, vtype))
    n_t = rng.choice((0, 1, 2, 4))
    tis = []
    for i in range(n_t):
        nd = rng.choice((1, 2, 2, 3, 4, 0, 5, 2**32 - 1))
        dims = b"".join(struct.pack("<Q", rng.choice(INTERESTING_INTS) % 2**64) for _ in range(min(nd, 6)))
        tis.append(_gstr(f"t{i}".encode()) + struct.pack("<I", nd) + dims
                   + struct.pack("<IQ", rng.choice((0, 1, 2, 8, 12, 14, 30, 41, 2**32 - 1)),
                                 rng.choice(INTERESTING_INTS) % 2**64))
    n_kv_claim = n_kv if rng.random() < 0.8 else rng.choice(INTERESTING_INTS) % 2**64
    n_t_claim = n_t if rng.random() < 0.8 else rng.choice(INTERESTING_INTS) % 2**64
    out = b"GGUF" + struct.pack("<IQQ", version, n_t_claim, n_kv_claim) + b"".join(kvs) + b"".join(tis)
    return out + rng.randbytes(rng.choice((0, 0, 7, 64, 300)))


def _gguf_setup() -> dict:
    from edgellm.chat import CHATML_TEMPLATE, GEMMA_TEMPLATE

    d = Path(tempfile.mkdtemp(prefix="edgellm-fuzz-gguf-"))
    return {"path": d / "input.gguf", "vocabs": [tiny_spm_metadata(), tiny_bpe_metadata()],
            "templates": [CHATML_TEMPLATE, GEMMA_TEMPLATE, "{{ messages[0]['content'] }}", "{% for %}"]}


def _gguf_generate(rng: random.Random, ctx: dict) -> bytes:
    r = rng.random()
    if r < 0.45:
        data = _model_file(rng, ctx)
        return mutate_bytes(rng, data) if rng.random() < 0.6 else data
    if r < 0.9:
        data = _header_soup(rng)
        return mutate_bytes(rng, data) if rng.random() < 0.3 else data
    return rng.choice((b"", b"GGUF", b"GGUF\x03\x00\x00\x00", b"GGML", rng.randbytes(rng.randrange(200))))


def _touch(value, depth: int = 0) -> None:
    """Read a metadata value the way users of it do: scalars, elements, lengths."""
    if not hasattr(value, "__len__") or isinstance(value, (str, bytes)) or depth > 10:
        return
    n = len(value)
    for i in list(range(min(n, 8))) + ([n - 1] if n else []):
        _touch(value[i], depth + 1)


@target("gguf", setup=_gguf_setup, generate=_gguf_generate, max_len=1 << 16)
def fuzz_gguf(data: bytes, ctx: dict) -> None:
    """GGUF header, metadata, tensor infos, and loading a model's config, weights, tokenizer, template."""
    from edgellm import models
    from edgellm.chat import ChatTemplate
    from edgellm.gguf_file import GGUFFile
    from edgellm.models.base import bind_weights
    from edgellm.tokenizer import Tokenizer

    ctx["path"].write_bytes(data)
    with GGUFFile(ctx["path"]) as g:
        for value in g.metadata.values():
            _touch(value)
        for name, info in g.tensors.items():
            assert g.tensor_bytes(name).nbytes == info.nbytes
            if info.qtype.name in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"):
                assert g.tensor_array(name).size == info.n_elements
        cfg = expect(models.load_config, g)
        if cfg is not None:
            expect(bind_weights, g, cfg)
        tok = expect(Tokenizer.from_metadata, g.metadata)
        if tok is not None:
            ids = expect(tok.encode, "Hello world <|im_start|> \u00e9\U0001f999", special=True)
            if ids is not None:
                assert all(0 <= i < tok.n_vocab for i in ids)
                tok.decode(ids, special=True)
        tmpl = expect(ChatTemplate.from_metadata, g.metadata)
        if tmpl is not None:
            expect(tmpl.render, [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}])


# ------------------------------------------------------------------------------ tokenizer

OPS = ("encode", "encode_special", "decode", "stream")


def _tokenizer_setup() -> dict:
    from edgellm.tokenizer import Tokenizer
    from edgellm.tokenizer.vocab import Attr

    metas = {"tiny-spm": tiny_spm_metadata(), "tiny-bpe": tiny_bpe_metadata(), **real_model_metadata()}
    toks = []
    for name, meta in metas.items():
        tok = Tokenizer.from_metadata(meta)
        v = tok.vocab
        attrs = [v.attr(i) for i in range(v.n_vocab)]
        specials = [v.tokens[i] for i in range(v.n_vocab) if attrs[i] & (Attr.CONTROL | Attr.USER_DEFINED)]
        # Bytes with no token of their own are dropped, as llama.cpp drops them (a BPE vocabulary
        # without some rare lead bytes; an SPM one without byte fallback): round trips are checked on
        # texts whose bytes all have one.
        if v.kind == "bpe":
            chars = _gpt2_byte_chars()
            missing = {b for b in range(256) if v.token_to_id.get(chars[b]) is None}
        else:
            have = {int(v.tokens[i][3:5], 16) for i in range(v.n_vocab) if attrs[i] & Attr.BYTE}
            missing = set(range(256)) - have
        toks.append({"name": name, "tok": tok, "specials": specials or ["<s>"], "missing_bytes": missing})
    return {"toks": toks}


def _tokenizer_generate(rng: random.Random, ctx: dict) -> bytes:
    which = rng.randrange(len(ctx["toks"]))
    op = rng.randrange(len(OPS))
    specials = ctx["toks"][which]["specials"]
    if OPS[op] in ("decode", "stream"):
        n_vocab = ctx["toks"][which]["tok"].n_vocab
        ids = [rng.randrange(n_vocab) if rng.random() < 0.995 else rng.choice((-1, n_vocab, 2**31 - 1, -2**31))
               for _ in range(rng.randint(0, 64))]
        return bytes([which, op]) + struct.pack(f"<{len(ids)}i", *ids)
    r = rng.random()
    if r < 0.001:  # about a MiB, of one kind
        unit = rng.choice(["a", " ", "1", "\n", "🦙", "日本語", " the cat", "\u0301", "<|im_start|>",
                           random_text(rng, 100), "ab" * 3 + " "])
        text = (unit * ((1 << 20) // max(len(unit.encode()), 1) + 1)).encode("utf-8", "surrogatepass")[:1 << 20]
    elif r < 0.3:  # special-token soup
        parts = []
        for _ in range(rng.randint(1, 20)):
            s = rng.choice(specials)
            parts.append(rng.choice([s, s, s[:-1], s[1:], " ", "\n", random_text(rng, 5), s.upper()]))
        text = "".join(parts).encode("utf-8", "surrogatepass")
    else:
        text = random_utf8(rng, rng.choice((1, 4, 16, 64, 256, 2048)))
    return bytes([which, op]) + text


@target("tokenizer", setup=_tokenizer_setup, generate=_tokenizer_generate, max_len=1 << 16)
def fuzz_tokenizer(data: bytes, ctx: dict) -> None:
    """encode / decode / streaming decode; round trips where lossless."""
    if len(data) < 2:
        return
    t = ctx["toks"][data[0] % len(ctx["toks"])]
    tok, op = t["tok"], OPS[data[1] % len(OPS)]
    if op in ("decode", "stream"):
        ids = list(struct.unpack(f"<{(len(data) - 2) // 4}i", data[2:2 + (len(data) - 2) // 4 * 4]))
        special = bool(data[1] & 0x80)
        if op == "decode":
            assert isinstance(tok.decode(ids, special=special), str)
        else:
            s = tok.streaming_decoder(special=special)
            streamed = "".join(s.add(i) for i in ids) + s.flush()
            if t["tok"].vocab.kind == "bpe":  # no space prefix to remove: the same text
                assert streamed == tok.decode(ids, special=special), (ids, streamed)
        return
    text = text_of(data[2:])
    special = op == "encode_special"
    ids = tok.encode(text, add_bos=bool(data[1] & 0x80), special=special)
    assert all(type(i) is int and 0 <= i < tok.n_vocab for i in ids), "id outside the vocabulary"
    plain = tok.encode(text, add_bos=False, special=special) if data[1] & 0x80 else ids
    back = tok.decode(plain, special=special)
    # Lossless: plain text (parsed special tokens may strip or prefix spaces) whose bytes all have
    # tokens, on SPM also without U+2581 (the character SPM writes spaces as).
    lossless = not special and not (set(text.encode("utf-8")) & t["missing_bytes"])
    if tok.vocab.kind == "spm":
        lossless = lossless and "\u2581" not in text
    if lossless:
        assert back == text, f"round trip on {t['name']}: {text[:60]!r} -> {back[:60]!r}"


# ------------------------------------------------------------------------------ template

CANARY = Path(tempfile.gettempdir()) / "edgellm-fuzz-template-canary"
# What a template could only print after getting hold of Python's internals.
_LEAKS = ("<module '", "__builtins__", "<class 'os", "<class 'subprocess", "posix.", "<built-in function",
          "<frame ", "<code object", "<cell ")

# Known ways out of Jinja sandboxes, and resource bombs (CTF write-ups, HackTricks' SSTI page,
# Jinja's own sandbox tests), written for this target.
PAYLOADS = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__base__.__subclasses__()[40]('/etc/passwd').read() }}",
    "{{ cycler.__init__.__globals__.os.system('touch CANARY') }}",
    "{{ joiner.__init__.__globals__.os.popen('touch CANARY').read() }}",
    "{{ namespace.__init__.__globals__.os.popen('id').read() }}",
    "{{ lipsum.__globals__['os'].popen('touch CANARY') }}",
    "{{ range.__globals__ }}", "{{ raise_exception.__globals__ }}", "{{ strftime_now.__globals__['datetime'] }}",
    "{{ self._TemplateReference__context }}", "{{ self.__init__.__globals__ }}",
    "{{ messages.__class__.__init__.__globals__ }}", "{{ messages[0].__class__.__subclasses__() }}",
    "{{ ''|attr('__class__')|attr('__mro__') }}", "{{ ''|attr('\\x5f\\x5fclass\\x5f\\x5f') }}",
    "{{ request.application.__globals__.__builtins__.__import__('os').popen('id').read() }}",
    "{{ config.__class__.__init__.__globals__['os'].popen('id').read() }}",
    "{{ '{0.__class__.__mro__}'.format('') }}", "{{ '{0.__init__.__globals__}'.format(cycler) }}",
    "{{ '%s'.format_map(messages) }}", "{{ ''.format_map.__self__ }}",
    "{% set x = messages.append(1) %}{{ messages }}", "{% set _ = messages[0].update({'role': 1}) %}",
    "{{ messages.pop() }}", "{{ tojson.__globals__ }}", "{{ (messages|first).items.__self__ }}",
    "{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "{{ dict.__base__.__subclasses__() }}", "{{ ().__class__.__bases__[0].__subclasses__() }}",
    "{{ x.__class__ }}", "{{ loop.__class__ }}", "{% for m in messages %}{{ loop.__class__.__mro__ }}{% endfor %}",
    "{{ getattr }}", "{{ __import__('os') }}", "{{ eval('1') }}", "{{ exec }}", "{{ open('/etc/passwd') }}",
    "{% include '/etc/passwd' %}", "{% import 'os' as os %}", "{% extends '/etc/passwd' %}",
    "{% from 'x' import y %}",
    # resource bombs
    "{{ 'a' * 10**9 }}", "{{ [1] * 2**40 }}", "{{ 9**9**9 }}", "{{ 2**100000 }}", "{{ 10 ** 10 ** 10 }}",
    "{% for i in range(10**9) %}{% endfor %}", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for c in 'a' * 1000000 %}{% for d in 'a' * 1000000 %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% macro f() %}{{ f() ~ f() }}{% endmacro %}{{ f() }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
    "{{ 'x'|center(10**9) }}", "{{ 'x'|indent(10**9) }}", "{{ 'x'|indent(10**9, true) }}",
    "{{ ('x' * 1000000)|replace('x', 'x' * 1000000) }}", "{{ ('x' * 1000)|replace('', 'y' * 1000000) }}",
    "{{ '%999999999s'|format('x') }}", "{{ '%.999999999f'|format(1.0) }}", "{{ '%*s'|format(999999999, 'x') }}",
    "{{ '%999999999s' % 'x' }}", "{{ '{:>999999999}'.format('x') }}", "{{ '{:0999999999d}'.format(1) }}",
    "{{ '{:{w}}'.format('x', w=999999999) }}", "{{ 'x'.ljust(10**9) }}", "{{ 'x'.center(10**9) }}",
    "{{ 'x'.zfill(10**9) }}", "{{ 'x'.expandtabs(10**9) }}", "{{ ('\\t' * 100000).expandtabs(100000) }}",
    "{{ 'x'|wordwrap(1) }}", "{{ range(100000)|list|batch(100000)|list }}", "{{ range(100000)|join(',' * 100000) }}",
    "{{ ('x' * 1000000).split('') }}", "{{ ('a' * 1000000)|list|sort|unique|list|length }}",
    "{{ 'x' * 1000000 ~ 'y' * 1000000 ~ 'z' * 1000000 }}", "{{ [[1] * 1000000] * 1000000 }}",
    "{{ (range(1000000)|list) * 1000000 }}", "{{ {'a': 1}|dictsort * 10**9 }}", "{{ 1e308 * 10 }}",
    "{{ 1 / 0 }}", "{{ 1 // 0 }}", "{{ 1 % 0 }}", "{{ (2**63)|int }}", "{{ 'x'|int(base=99) }}",
    "{{ range(1, 10, 0) }}", "{{ range(-10**18, 10**18) }}", "{{ range(10**18)|length }}",
    "{{ range(10**18)|last }}", "{{ range(10**8)|sum }}", "{{ range(10**8)|max }}",
    "{{ ''.join(['x'] * 1000000) * 1000 }}", "{{ 'x' * (10**6) * (10**6) }}", "{{ ('x' * 10**6) * 10**6 }}",
    "{% set a = 'x' * 1000000 %}{% for i in range(1000000) %}{{ a }}{% endfor %}",
    "{{ messages * 10**8 }}", "{{ messages[0]['content'] * 10**8 }}",
    "{% set d = {} %}{% for i in range(10**7) %}{% set _ = d.__setitem__(i, i) %}{% endfor %}",
    "{{ 'a'|truncate(10**18) }}", "{{ 'x'|urlize(10**9) }}", "{{ 'x'|filesizeformat(10**400) }}",
    "{{ '%c'|format(2**40) }}", "{{ '%s' % (('x',) * 10**6) }}",
]


def _template_setup() -> dict:
    from edgellm.chat import CHATML_TEMPLATE, GEMMA_TEMPLATE

    real = [m["tokenizer.chat_template"] for m in real_model_metadata().values() if "tokenizer.chat_template" in m]
    return {"templates": [CHATML_TEMPLATE, GEMMA_TEMPLATE, *real]}


_FRAGMENTS = ["{{ ", " }}", "{% ", " %}", "{%- ", " -%}", "for m in messages", "endfor", "if ", "endif", "else",
              "set x = ", "macro f()", "endmacro", "m['content']", "messages[0]", "loop.index", "namespace(a=1)",
              "'a' * ", "10**9", "range(", ")", "|join", "|length", "|trim", "|tojson", "~", "+", "*", "**", "(",
              "[", "]", "'", '"', "raise_exception('x')", "bos_token", "add_generation_prompt", "__class__",
              ".__globals__", "|attr(", "|format(", "|center(", "|replace(", "{#", "#}", "\n", "x", "9"]


def _messages(rng: random.Random) -> list:
    roles = ["system", "user", "assistant", "tool", "", "model", None, 7, "x" * 100]
    contents = ["hi", "", "<|im_end|>", "{{ 1 }}", "x" * 10000, None, 3, ["a"], [{"type": "text", "text": "t"}],
                [{"type": "image"}], {"a": 1}, "\ud800", random_text(rng, 20)]
    odd = 0.0 if rng.random() < 0.7 else 0.2  # most conversations are well formed
    out = []
    for _ in range(rng.choice((1, 1, 2, 3, 5, 20) if not odd else (0, 1, 3))):
        m = {"role": rng.choice(roles) if rng.random() < odd else rng.choice(roles[:3]),
             "content": rng.choice(contents) if rng.random() < odd else rng.choice(contents[:3] + [random_text(rng, 30)])}
        if rng.random() < odd / 4:
            del m["content"]
        if rng.random() < 0.05:
            m["tool_calls"] = [{"function": {"name": "f", "arguments": {"a": 1}}}]
        out.append(m)
    return out if rng.random() >= odd / 4 else rng.choice(["text", None, [1, 2], {"role": "user"}])


def _template_generate(rng: random.Random, ctx: dict) -> bytes:
    r = rng.random()
    if r < 0.35:
        src = rng.choice(PAYLOADS)
        if rng.random() < 0.3:
            src = src.replace("10**9", str(rng.choice((10**6, 10**7, 2**31)))).replace("1000000", str(rng.choice((10**5, 10**7))))
        if rng.random() < 0.2:
            src = rng.choice(PAYLOADS) + src
    elif r < 0.65:
        src = rng.choice(ctx["templates"])
        if rng.random() < 0.3:
            src = mutate_bytes(rng, src.encode(), 2).decode("utf-8", "replace")
    else:
        src = "".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(1, 30)))
    return rng.randbytes(4) + src.replace("CANARY", str(CANARY)).encode("utf-8", "surrogatepass")


@target("template", setup=_template_setup, generate=_template_generate, max_len=1 << 14)
def fuzz_template(data: bytes, ctx: dict) -> None:
    """Chat templates: sandbox escapes, resource bombs, random Jinja, random messages."""
    from edgellm.chat import ChatTemplate

    src = data[4:].decode("utf-8", "replace")
    messages = _messages(random.Random(data[:4]))
    t = ChatTemplate(src, bos_token="<s>", eos_token="</s>", add_bos=bool(data[0] & 1))
    out = t.render(messages, add_generation_prompt=bool(data[0] & 2))
    assert isinstance(out, str)
    leaked = [m for m in _LEAKS if m in out and m not in src]
    assert not leaked, f"the template printed {leaked[0]!r}: Python internals escaped the sandbox"
    assert not CANARY.exists(), "a template ran a shell command"


# ------------------------------------------------------------------------------ reply

_REPLY_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]


def _reply_setup() -> dict:
    """Per format: what its replies are made of - its calls as it writes them, its markers,
    reasoning tags and answer marks, bits of JSON and text."""
    from edgellm.tool_calls import FORMATS, ToolFormat, preserved_markers, write_calls

    calls = [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
             {"name": "get_time", "arguments": {"zone": 'C"E}T\n'}}]
    out = []
    for name in sorted(FORMATS):
        fmt = ToolFormat(name, name != "generic")
        written = [write_calls(fmt, calls[:1]), write_calls(fmt, calls)]
        pieces = list(preserved_markers(fmt, True)) + ["{", "}", "[", "]", '"', ":", ",", "\n", "\n\n", " ", "<", "|",
                                                       "Sunny.", '"name": "g", ', '"arguments": ', '{"name": "f", "arguments": {}}',
                                                       "<think>", "</think>"]
        out.append({"fmt": fmt, "written": written, "pieces": pieces})
    return {"formats": out}


def _reply_generate(rng: random.Random, ctx: dict) -> bytes:
    which = rng.randrange(len(ctx["formats"]))
    f = ctx["formats"][which]
    parts = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.25:  # a call with something put in where its parts meet (a key, an element, a marker)
            t = rng.choice(f["written"])
            at = [i + 1 for i, c in enumerate(t) if c in ",{>\n|"] or [0]
            k = rng.choice(at)
            parts.append(t[:k] + rng.choice(f["pieces"]) + t[k:])
        elif r < 0.5:
            t = rng.choice(f["written"])
            a = rng.randrange(len(t) + 1)
            parts.append(t[a:rng.randint(a, len(t))] if rng.random() < 0.6 else t)
        elif r < 0.85:
            parts.append(rng.choice(f["pieces"]))
        else:
            parts.append(random_text(rng, rng.randint(1, 12)))
    flags = rng.randrange(8)
    return bytes([which, flags]) + "".join(parts).encode("utf-8", "surrogatepass")


def _reply_message(fmt, pieces, **kw) -> tuple:
    from edgellm.tool_calls import Reply

    reply = Reply(fmt, tools=_REPLY_TOOLS, **kw)
    deltas = [d for p in pieces for d in reply.feed(p)] + reply.close()
    msg = reply.message()
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls", [])]
    added: dict = {}
    for d in deltas:  # what a client adds up from the deltas is the message
        for key in ("content", "reasoning_content"):
            added[key] = added.get(key, "") + d.get(key, "")
        for tc in d.get("tool_calls", []):
            added.setdefault(tc["index"], "")
            added[tc["index"]] += tc["function"]["arguments"]
    assert added.get("content", "") == (msg["content"] or ""), "the content deltas add up to another content"
    assert added.get("reasoning_content", "") == msg.get("reasoning_content", ""), "the reasoning deltas differ"
    assert [added.get(i) for i in range(len(calls))] == [a for _, a in calls], "the argument deltas differ"
    return msg["content"] or None, msg.get("reasoning_content"), calls


@target("reply", setup=_reply_setup, generate=_reply_generate, max_len=1 << 12)
def fuzz_reply(data: bytes, ctx: dict) -> None:
    """A reply's reading: the same whole, a character at a time and in two pieces; parse never fails."""
    from edgellm.tool_calls import parse

    if len(data) < 2:
        return
    fmt = ctx["formats"][data[0] % len(ctx["formats"])]["fmt"]
    text = text_of(data[2:])
    kw = dict(calls=bool(data[1] & 1), thinking=bool(data[1] & 2), parallel=not data[1] & 4)
    whole = _reply_message(fmt, [text], **kw)
    k = len(text) // 2
    for pieces in (list(text), [text[:k], text[k:]]):
        assert _reply_message(fmt, pieces, **kw) == whole, (fmt.name, text[:200], pieces[:2])
    content, calls = parse(fmt, text, _REPLY_TOOLS)
    assert isinstance(content, str) and all(json.loads(c["function"]["arguments"]) is not None for c in calls)


# ------------------------------------------------------------------------------ http

HTTP_MODEL = "tiny-llama"
HTTP_KEY = "sk-fuzz"
HTTP_N_CTX = 64  # every generation ends within 64 tokens
HTTP_MAX_BODY = 64 * 1024  # bodies above this get 413 (the server's default is 8 MiB)
HTTP_ROUTES = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/tokenize"),
               ("POST", "/detokenize"), ("GET", "/v1/models"), ("GET", "/v1/models/" + HTTP_MODEL),
               ("GET", "/health"), ("GET", "/metrics"), ("GET", "/v1/chat/completions"), ("POST", "/v1/models"),
               ("DELETE", "/v1/completions"), ("POST", "/v1/embeddings"), ("GET", "/v1/models/x%00y%2F..%2F"),
               ("PUT", "/tokenize"), ("POST", "/v1/chat/completions/"), ("GET", "/%FF%FE")]
_ERROR_KEYS = {"message", "type", "param", "code"}


class _Logged(logging.Handler):
    """Keeps what the server logs at ERROR: its own bugs (answered with a 500, or a stream cut)."""

    def __init__(self):
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def _http_setup() -> dict:
    import sys

    from edgellm.api import LLM
    from edgellm.scheduler import BatchEngine
    from edgellm.server.app import Context, create_app

    sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import tiny_model

    path = tiny_model(Path(tempfile.mkdtemp(prefix="edgellm-fuzz-http-")) / f"{HTTP_MODEL}.gguf", "llama",
                      n_layer=1, n_embd=64, n_head=2, n_head_kv=1, head_dim=32, n_ff=128)
    llm = LLM(str(path), n_ctx=HTTP_N_CTX, n_threads=1)
    engine = BatchEngine(llm, max_seqs=2, kv_tokens=2 * HTTP_N_CTX, prefix_cache=True, max_queue=4).start()
    app_ctx = Context(llm=llm, engine=engine, model_id=HTTP_MODEL, api_key=HTTP_KEY, max_seqs=2,
                      max_body=HTTP_MAX_BODY)
    errors = _Logged()
    logger = logging.getLogger("edgellm.server")
    logger.addHandler(errors)
    logger.propagate = False  # the records are findings; nothing to print
    return {"app": create_app(app_ctx), "loop": asyncio.new_event_loop(), "errors": errors, "n_vocab": llm.n_vocab}


@dataclass
class _Response:
    status: int
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)


async def _asgi_call(app, method: str, path: str, headers: dict, body: bytes) -> _Response:
    """One request as uvicorn hands it to the application (an http scope, the body in one message,
    a client that stays connected); an exception the application lets out propagates."""
    from urllib.parse import unquote

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": unquote(path), "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080)}
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    start, chunks = {}, []

    async def receive():
        if pending:
            return pending.pop()
        await asyncio.Event().wait()  # no disconnect: waits until the app stops listening

    async def send(message):
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    assert start, f"{method} {path}: the application returned without starting a response"
    return _Response(start["status"], {k.decode().lower(): v.decode("latin-1") for k, v in start.get("headers", [])},
                     b"".join(chunks))


def _json_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if r < 0.2:
        return rng.choice(INTERESTING_INTS) * rng.choice((1, -1))
    if r < 0.35:
        return rng.choice(INTERESTING_FLOATS)
    if r < 0.6:
        return random_text(rng, rng.choice((0, 1, 8, 64)))
    if r < 0.7:
        return rng.choice((True, False, None))
    if r < 0.85 and depth < 4:
        return [_json_value(rng, depth + 1) for _ in range(rng.choice((0, 1, 2, 5)))]
    if depth < 4:
        return {random_text(rng, rng.choice((1, 5))): _json_value(rng, depth + 1) for _ in range(rng.choice((0, 1, 3)))}
    return rng.randrange(100)


def _http_message(rng: random.Random):
    if rng.random() < 0.9:
        role = rng.choice(("system", "developer", "user", "assistant", "user", "user"))
        content = rng.choice((random_text(rng, rng.choice((1, 10, 60))), "hi", "",
                              [{"type": "text", "text": random_text(rng, 10)}]))
        m = {"role": role, "content": content}
        if rng.random() < 0.1:
            m["name"] = random_text(rng, 5)
        return m
    return rng.choice(({"role": "tool", "content": "x"}, {"role": "user"}, {"content": "x"}, "hi", None, [],
                       {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]},
                       {"role": "user", "content": [{"type": "text"}]}, {"role": 1, "content": 2}))


# Fields and values that make a valid request, each sometimes replaced by a random JSON value.
def _http_fields(rng: random.Random, route: str, n_vocab: int) -> dict:
    common = {"model": HTTP_MODEL, "max_tokens": rng.choice((1, 2, 4, 8, 16)),
              "temperature": rng.choice((0, 0.7, 1, 2)),
              "top_p": rng.choice((0.5, 1)), "top_k": rng.choice((0, 1, 40)), "min_p": rng.choice((0, 0.1)),
              "repeat_penalty": rng.choice((1, 1.1)), "frequency_penalty": rng.choice((-2, 0, 1)),
              "presence_penalty": rng.choice((0, 2)), "seed": rng.choice((0, 1, -1, 2**63 - 1)),
              "stop": rng.choice(("\n", ["a", "b"], [], "the")), "n": rng.choice((1, 2)),
              "stream": rng.random() < 0.3, "logit_bias": {str(rng.randrange(n_vocab)): rng.choice((-100, 5, 100))},
              "user": "fuzz"}
    if route == "/v1/chat/completions":
        body = {**common, "messages": [_http_message(rng) for _ in range(rng.choice((1, 1, 2, 3, 6)))],
                "logprobs": rng.random() < 0.3, "top_logprobs": rng.choice((0, 2, 20)),
                "max_completion_tokens": rng.choice((1, 4)), "stream_options": {"include_usage": True},
                "response_format": rng.choice(({"type": "text"}, {"type": "json_object"}))}
    elif route == "/v1/completions":
        prompt = rng.choice((random_text(rng, rng.choice((1, 20, 200))), "the cat",
                             [rng.randrange(n_vocab) for _ in range(rng.randint(1, 8))],
                             ["a", "b"], [[1, 2], [3]], ""))
        body = {**common, "prompt": prompt, "logprobs": rng.choice((0, 1, 5)), "echo": rng.random() < 0.3,
                "best_of": 1, "suffix": None}
    elif route == "/tokenize":
        body = {"content": random_text(rng, rng.choice((1, 30, 300))), "add_special": rng.random() < 0.5,
                "parse_special": rng.random() < 0.5, "with_pieces": rng.random() < 0.5}
    elif route == "/detokenize":
        body = {"tokens": [rng.randrange(n_vocab) for _ in range(rng.randint(0, 16))]}
    else:
        body = {"model": HTTP_MODEL}
    keep = rng.random()
    required = ("model", "messages", "prompt", "content", "tokens")
    out = {k: v for k, v in body.items() if k in required or rng.random() < keep}
    if rng.random() < 0.5:  # replace some values with random JSON
        for k in rng.sample(sorted(out), min(len(out), rng.randint(1, 3))):
            out[k] = _json_value(rng)
    if rng.random() < 0.1:
        del out[rng.choice(sorted(out))]
    if rng.random() < 0.1:
        out[rng.choice(("functions", "tools", "x", "max_tokens", "prompt", "\ud800"))] = _json_value(rng)
    return out


def _http_generate(rng: random.Random, ctx: dict) -> bytes:
    """Route byte, header byte, then the body: mostly a near-valid JSON request for the route."""
    route = rng.randrange(len(HTTP_ROUTES)) if rng.random() < 0.15 else rng.randrange(4)
    headers = (1 if rng.random() < 0.93 else rng.randrange(256)) | (rng.random() < 0.05) << 7
    path = HTTP_ROUTES[route][1]
    r = rng.random()
    if r < 0.75:
        body = json.dumps(_http_fields(rng, path, ctx["n_vocab"]), ensure_ascii=rng.random() < 0.5).encode(
            "utf-8", "surrogatepass")
        if rng.random() < 0.15:
            body = mutate_bytes(rng, body, rng.randint(1, 3))
    elif r < 0.85:
        body = json.dumps(_json_value(rng)).encode()
    elif r < 0.95:
        body = random_utf8(rng, rng.choice((0, 1, 10, 100)))
    else:  # past the body limit, or deep nesting
        body = rng.choice((b"[" * 100000 + b"]" * 100000, b'{"a":' * 50000 + b"1" + b"}" * 50000,
                           b'"' + b"x" * (HTTP_MAX_BODY + 10) + b'"', b"{" + b" " * (HTTP_MAX_BODY // 2) + b"}"))
    return bytes([route, headers]) + body


def _http_headers(flags: int, body: bytes) -> dict:
    """Bit 0: the right API key (else none); 1: a wrong one; 2: a text/plain content type;
    3: another auth scheme; 4: a content-length of 10**12; 5: a content-length of 0; 6: a long
    header; 7: Accept-Encoding and an odd Content-Encoding."""
    h = {"content-type": "text/plain" if flags & 4 else "application/json"}
    if flags & 1:
        h["authorization"] = f"Bearer {HTTP_KEY}"
    if flags & 2:
        h["authorization"] = f"Bearer {HTTP_KEY}x"
    if flags & 8:
        h["authorization"] = f"Basic {HTTP_KEY}"
    if flags & 16:
        h["content-length"] = str(10**12)
    elif flags & 32:
        h["content-length"] = "0"
    if flags & 64:
        h["x-fuzz"] = "a" * 10000
    if flags & 128:
        h["content-encoding"] = "gzip"
        h["accept-encoding"] = "gzip, br"
    return h


def _check_error_body(resp, what: str) -> str:
    """The error's code, once the body is checked to be OpenAI's error JSON."""
    body = resp.json()
    assert isinstance(body, dict) and set(body) == {"error"}, f"{what}: not OpenAI's error JSON: {resp.body[:200]!r}"
    err = body["error"]
    assert isinstance(err, dict) and set(err) == _ERROR_KEYS, f"{what}: error fields {sorted(err)}"
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), what
    return err["code"]


@target("http", setup=_http_setup, generate=_http_generate, max_len=1 << 17)
def fuzz_http(data: bytes, ctx: dict) -> None:
    """The server's requests (bodies, headers, routes) against its ASGI app in-process on a tiny
    model: every answer a 2xx, or a 4xx with OpenAI's error JSON; streams end with [DONE]."""
    if len(data) < 2:
        return
    method, path = HTTP_ROUTES[data[0] % len(HTTP_ROUTES)]
    body = data[2:]
    errors = ctx["errors"].records
    errors.clear()
    resp = ctx["loop"].run_until_complete(_asgi_call(ctx["app"], method, path, _http_headers(data[1], body),
                                                     body if method != "GET" else b""))
    what = f"{method} {path} -> {resp.status}"
    if errors:  # the server logged a bug of its own (answered 500, or died mid-stream)
        rec = errors[0]
        if rec.exc_info and not isinstance(rec.exc_info[1], EdgeLLMError):
            raise rec.exc_info[1]
        raise AssertionError(f"{what}: the server logged {rec.getMessage()!r} {rec.exc_info and rec.exc_info[1]!r}")
    assert 200 <= resp.status < 300 or 400 <= resp.status < 500, f"{what}: {resp.body[:200]!r}"
    if resp.status >= 400:  # counted with edgellm's errors, as "status code"
        _EXPECTED[f"{resp.status} {_check_error_body(resp, what)}"] += 1
    elif resp.headers.get("content-type", "").startswith("text/event-stream"):
        text = resp.body.decode("utf-8")
        events = [ln[6:] for ln in text.split("\n") if ln.startswith("data: ")]
        assert events and events[-1] == "[DONE]", f"{what}: the stream did not end with [DONE]: {text[-200:]}"
        for ev in events[:-1]:
            chunk = json.loads(ev)
            assert "error" not in chunk, f"{what}: an error mid-stream: {ev[:200]}"
    elif path.startswith("/v1/") or path in ("/tokenize", "/detokenize", "/health"):
        assert isinstance(resp.json(), dict), what


# ------------------------------------------------------------------------------ state

STATE_PROMPT = [1, 17, 42, 99, 5, 23, 64, 7, 81, 3, 12, 150, 33, 8, 71, 19, 2, 44, 90, 61, 5, 6, 7, 8, 9, 10, 11]


def _state_setup() -> dict:
    import sys

    from edgellm.api import LLM

    sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import tiny_model

    d = Path(tempfile.mkdtemp(prefix="edgellm-fuzz-state-"))
    models = []
    for arch in ("llama", "gemma3"):
        path = tiny_model(d / f"{arch}.gguf", arch, n_layer=2, n_embd=64, n_head=2, n_head_kv=1, head_dim=32,
                          n_ff=128, n_swa=8)
        llm = LLM(str(path), n_ctx=64, n_threads=1)
        s = llm.session()
        s.feed(STATE_PROMPT)
        s.save_state(d / f"{arch}.state", meta={"turns": 1})
        s.close()
        s.feed(STATE_PROMPT[:5])
        nxt = s.feed(STATE_PROMPT[5:6]).copy()  # what a session holding the first 5 tokens gives next
        s.close()
        models.append({"llm": llm, "saved": (d / f"{arch}.state").read_bytes(), "next": nxt})
    return {"models": models, "path": d / "input.state"}


def _state_parts(data: bytes):
    """(header dict or None, blocks) of a well-formed state file's bytes."""
    from edgellm import state

    fixed = len(state.MAGIC) + state._FIXED.size
    _, hlen = state._FIXED.unpack_from(data, len(state.MAGIC))
    return json.loads(data[fixed:fixed + hlen]), data[fixed + hlen:-32]


def _state_seal(header, blocks: bytes, version: int | None = None) -> bytes:
    """A state file of this header (any JSON value, or raw bytes) and blocks, with a valid checksum."""
    import hashlib

    from edgellm import state

    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    body = state.MAGIC + state._FIXED.pack(state.VERSION if version is None else version, len(h)) + h + blocks
    return body + hashlib.sha256(body).digest()


_ODD_VALUES = [None, True, -1, 0, 1, 2**31, 2**63, -2**63, 1.5, float("inf"), "", "x", "12", [], [0], [[0]], {}, {"a": 1}]


def _mutate_header(rng: random.Random, header: dict, n_vocab: int) -> object:
    h = json.loads(json.dumps(header))
    for _ in range(rng.randrange(1, 4)):
        key = rng.choice(list(h) + ["extra"])
        r = rng.random()
        if r < 0.15:
            h.pop(key, None)
        elif r < 0.35:
            h[key] = rng.choice(_ODD_VALUES)
        elif key == "tokens" and isinstance(h.get("tokens"), list):
            t = h["tokens"]
            op = rng.randrange(5)
            if op == 0 and t:
                t[rng.randrange(len(t))] = rng.choice([-1, n_vocab, n_vocab - 1, 2**40, "7", 1.0, None])
            elif op == 1:
                del t[rng.randrange(len(t) + 1):]
            elif op == 2:
                t.extend(rng.randrange(n_vocab) for _ in range(rng.choice((1, 16, 40, 100))))
            elif op == 3:
                rng.shuffle(t)
            else:
                h["tokens"] = t * rng.randrange(2, 5)
        elif key == "held" and isinstance(h.get("held"), list):
            for g in h["held"]:
                if isinstance(g, list):
                    op = rng.randrange(5)
                    if op == 0 and g:
                        g.pop(rng.randrange(len(g)))
                    elif op == 1:
                        g.append(rng.choice([0, -1, len(g), len(g) + 5, 2**33]))
                    elif op == 2 and g:
                        g.append(g[0])
                    elif op == 3:
                        rng.shuffle(g)
                    else:
                        g[:] = g[::-1]
        elif key == "block_bytes" and isinstance(h.get("block_bytes"), list) and h["block_bytes"]:
            i = rng.randrange(len(h["block_bytes"]))
            size = h["block_bytes"][i] if type(h["block_bytes"][i]) is int else 64
            h["block_bytes"][i] = rng.choice([0, -1, 1, size // 2, size + 2, 2**40])
        elif key == "swa_valid":
            h[key] = rng.choice([-5, 0, 1, 7, 8, 9, 26, 27, 28, 63, 64, 65, 2**40, "3", None])
        elif key in ("cache_type_k", "cache_type_v"):
            h[key] = rng.choice(["f16", "q8_0", "q4_0", "f32", "", "F16", 1])
        elif key == "model_sha256" and isinstance(h.get(key), str):
            h[key] = h[key][::-1] if rng.random() < 0.5 else h[key][:10]
        else:
            h[key] = rng.choice(_ODD_VALUES)
    if rng.random() < 0.05:
        return rng.choice([[], [h], 3, "header", None])
    return h


def _state_generate(rng: random.Random, ctx: dict) -> bytes:
    m = rng.randrange(len(ctx["models"]))
    saved = ctx["models"][m]["saved"]
    r = rng.random()
    if r < 0.25:  # damage as a disk or a transfer makes it: the checksum catches it
        data = mutate_bytes(rng, saved)
    elif r < 0.35:
        data = saved[:rng.randrange(len(saved) + 1)]
    else:  # a rewritten file with a valid checksum: the loader's own checks must refuse or cope
        header, blocks = _state_parts(saved)
        if r < 0.75:
            header = _mutate_header(rng, header, ctx["models"][m]["llm"].n_vocab)
        if rng.random() < 0.4:
            op = rng.randrange(4)
            if op == 0:
                blocks = blocks[:rng.randrange(len(blocks) + 1)]
            elif op == 1:
                blocks = blocks + rng.randbytes(rng.choice((1, 64, 4096)))
            else:  # the values themselves (f16 NaN / Inf / anything): loadable, and what it gives is garbage
                blocks = mutate_bytes(rng, blocks, rounds=rng.randrange(1, 8))[:len(blocks)].ljust(len(blocks), b"\0")
        raw = None
        if rng.random() < 0.05:
            raw = rng.choice([b"{", b"\xff\xfe", b"[1,2", b"{}" * 3, json.dumps(header).encode()[:-1]])
        version = rng.choice([0, 2, 2**32 - 1]) if rng.random() < 0.05 else None
        data = _state_seal(raw if raw is not None else header, blocks, version)
    return bytes([m]) + data


@target("state", setup=_state_setup, generate=_state_generate, max_len=1 << 17)
def fuzz_state(data: bytes, ctx: dict) -> None:
    """Saved session files: refused with StateFileError and the session unchanged, or loaded and usable."""
    if not data:
        return
    m = ctx["models"][data[0] % len(ctx["models"])]
    llm, pool = m["llm"], m["llm"]._pool
    ctx["path"].write_bytes(data[1:])
    used = pool.blocks_in_use()
    s = llm.session()
    s.feed(STATE_PROMPT[:5])
    try:
        if expect(lambda: s.load_state(ctx["path"]) or True) is None:  # refused: the session as it was
            assert s.tokens == STATE_PROMPT[:5], s.tokens
            pool.check()
            assert np.array_equal(s.feed(STATE_PROMPT[5:6]), m["next"]), "a refused state changed the session"
        else:
            toks = s.tokens
            assert 0 < len(toks) <= llm.n_ctx and all(0 <= t < llm.n_vocab for t in toks), toks
            pool.check()
            if len(toks) < llm.n_ctx:
                out = s.feed([toks[-1]])  # continues: the logits may be anything the blocks say
                assert out.shape == (llm.n_vocab,)
                assert len(s) == len(toks) + 1
    finally:
        s.close()
        del s
    assert pool.blocks_in_use() == used, "a refused or loaded state leaked KV blocks"
