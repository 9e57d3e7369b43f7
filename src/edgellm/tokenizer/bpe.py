"""BPE, as llama.cpp's llm_tokenizer_bpe_session: pre-tokenize, map each word's UTF-8 bytes to
printable characters (GPT-2's bytes_to_unicode), then repeatedly merge the adjacent pair with the
lowest merge rank (leftmost first on ties). Byte-level (`tokenizer.ggml.model == "gpt2"`), or over
raw UTF-8 with spaces written as ▁ and <0xAB> byte tokens as fallback (Gemma 4's vocabulary)."""

from __future__ import annotations

import heapq

from .. import kernels
from .pretokenize import Splitter
from .string_index import StringIndex
from .vocab import Vocab

_CACHE_LIMIT = 1 << 16  # pre-tokens remembered (word -> ids); cleared when full
_CACHE_MAX_LEN = 64     # longer pre-tokens (long runs of spaces, symbols) are not remembered


def _byte_chars() -> list[str]:
    """GPT-2's byte -> character map: printable Latin-1 bytes map to themselves, the other 68
    bytes to U+0100 upwards, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = [""] * 256
    for b in printable:
        chars[b] = chr(b)
    extra = 0
    for b in range(256):
        if not chars[b]:
            chars[b] = chr(0x100 + extra)
            extra += 1
    return chars


BYTE_CHARS = _byte_chars()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_CHARS)}
# str.translate table: a Latin-1 character (one raw byte) -> its printable stand-in
_ENCODE_TABLE = {b: c for b, c in enumerate(BYTE_CHARS)}


def byte_encode(text: str) -> str:
    return text.encode("utf-8").decode("latin-1").translate(_ENCODE_TABLE)


class BpeEncoder:
    """Text (without special tokens) -> ids, remembering the ids of recent pre-tokens. The merges
    run in C (el_bpe_encode) when the tokens and rules are indexed in C, else here in Python."""

    def __init__(self, vocab: Vocab):
        self._token_to_id = vocab.token_to_id
        self._ignore_merges = vocab.ignore_merges
        self._byte_map = vocab.byte_map
        self._splitter = Splitter(vocab.pre)
        # what a symbol that is no token falls back to, byte by byte (-1: dropped, as llama.cpp)
        get = vocab.token_to_id.get
        if vocab.byte_map:  # the byte alone (a byte >= 0x80 as surrogateescape decodes it)
            fallback = [get(chr(b) if b < 0x80 else chr(0xDC00 + b)) for b in range(256)]
        else:
            fallback = [get(f"<0x{b:02X}>") for b in range(256)]
        self._fallback = [-1 if i is None else i for i in fallback]
        # "left right" -> rank; the first of duplicate rules wins, as in llama.cpp (emplace)
        self._ranks = StringIndex(vocab.merges, first_wins=True)
        self._cache: dict[str, list[int]] = {}
        self._c = None
        self._c_fallback = None  # self._fallback for el_bpe_encode, made on first use
        if self._token_to_id.c_index is not None and self._ranks.c_index is not None:
            self._c = kernels.c_module()

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        if not self._byte_map:
            text = text.replace(" ", "\u2581")
        for word in self._splitter.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._encode_word(byte_encode(word) if self._byte_map else word)
                if len(word) <= _CACHE_MAX_LEN:
                    if len(cache) >= _CACHE_LIMIT:
                        cache.clear()
                    cache[word] = ids
            out.extend(ids)
        return out

    def _encode_word(self, word: str) -> list[int]:
        """Ids of one pre-token, already mapped through the byte map."""
        if not word:
            return []
        if (self._ignore_merges or (not self._byte_map and not word.strip("\n"))) and word in self._token_to_id:
            return [self._token_to_id[word]]  # (raw UTF-8 vocabularies: a run of newlines that is a token)
        data = word.encode("utf-8")
        if self._c is None or len(data) >= 2**31:  # el_bpe_encode counts bytes in 32 bits
            return self._merge_py(word)
        ffi, lib = self._c
        if self._c_fallback is None:
            self._c_fallback = ffi.new("int32_t[]", self._fallback)
        out = ffi.new("int32_t[]", len(data))  # at most one id per byte
        n = lib.el_bpe_encode(self._token_to_id.c_index, self._ranks.c_index, self._c_fallback, data, len(data),
                              out)
        if n == lib.EL_TOKENIZE_NO_MEMORY:
            raise MemoryError("no memory to tokenize the text")
        return ffi.unpack(out, n)

    def _merge_py(self, word: str) -> list[int]:
        get = self._token_to_id.get
        ranks = self._ranks
        syms = list(word)  # one symbol per character; a merged-away symbol becomes ""
        n = len(syms)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []
        for i in range(n - 1):
            rank = ranks.get(syms[i] + " " + syms[i + 1])
            if rank is not None:
                heap.append((rank, i, i + 1, syms[i] + syms[i + 1]))
        heapq.heapify(heap)
        while heap:
            _, left, right, text = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or a + b != text:
                continue  # outdated pair
            syms[left], syms[right] = text, ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            before = prev[left]
            if before >= 0:
                rank = ranks.get(syms[before] + " " + text)
                if rank is not None:
                    heapq.heappush(heap, (rank, before, left, syms[before] + text))
            if after >= 0:
                rank = ranks.get(text + " " + syms[after])
                if rank is not None:
                    heapq.heappush(heap, (rank, left, after, text + syms[after]))
        out = []
        for s in syms:
            if not s:
                continue
            tid = get(s)
            if tid is not None:
                out.append(tid)
            else:  # llama.cpp: the fallback token of each byte that has one; the rest are dropped
                out.extend(t for t in (self._fallback[b] for b in s.encode("utf-8")) if t >= 0)
        return out
