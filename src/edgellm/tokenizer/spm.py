"""SentencePiece-style tokenizer (`tokenizer.ggml.model == "llama"`), as llama.cpp's
llm_tokenizer_spm_session: start from one symbol per character, repeatedly merge the adjacent pair
whose concatenation is the vocabulary token with the highest score (leftmost first on ties), then
emit each symbol's token, or byte tokens (<0xAB>) for a character the vocabulary lacks."""

from __future__ import annotations

import heapq

import numpy as np

from .. import kernels
from ..errors import TokenizerError
from .vocab import Vocab

_CACHE_LIMIT = 1 << 14  # fragments remembered (text -> ids); cleared when full
_CACHE_MAX_LEN = 256    # longer fragments are rarely seen twice: not remembered


class SpmEncoder:
    """Escaped text (without special tokens) -> ids, remembering recent short fragments. The merges
    run in C (el_spm_encode) when the vocabulary is indexed in C, else here in Python."""

    def __init__(self, vocab: Vocab):
        self._token_to_id = vocab.token_to_id
        scores = vocab.scores if vocab.scores is not None else np.zeros(vocab.n_vocab, np.float32)
        scores = np.require(scores, np.float32, ["C", "A"])  # C reads it: contiguous and aligned (a copy if not)
        # token id -> score: indexing a memoryview of the float32 array gives exact Python floats
        # without a float object per token
        self._scores = memoryview(scores)
        self._byte_ids = [self._byte_id(b) for b in range(256)]  # -1: no token for the byte
        self._cache: dict[str, list[int]] = {}
        self._c_args = None
        ix = vocab.token_to_id.c_index
        if ix is not None:
            self._ffi, self._lib = kernels.c_module()
            self._c_args = (ix, self._ffi.from_buffer("float[]", scores),
                            self._ffi.new("int32_t[]", self._byte_ids))
            self._c_keep = scores  # the pointer above is into it

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, whose spaces are already escaped as ▁."""
        if len(text) > _CACHE_MAX_LEN:
            return self._encode(text)
        ids = self._cache.get(text)
        if ids is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            ids = self._cache[text] = self._encode(text)
        return ids

    def _encode_py(self, text: str) -> list[int]:
        n = len(text)
        if n == 0:
            return []
        get = self._token_to_id.get
        scores = self._scores
        # Symbol i starts at character i (a merge keeps the left symbol's start); size[i] is its
        # length in characters, 0 once merged into its left neighbour.
        size = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []
        for i in range(n - 1):
            tid = get(text[i : i + 2])
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, 2))
        heapq.heapify(heap)
        while heap:
            _, left, right, total = heapq.heappop(heap)
            a, b = size[left], size[right]
            if a == 0 or b == 0 or a + b != total:
                continue  # outdated pair
            size[left], size[right] = total, 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            before = prev[left]
            if before >= 0:
                tid = get(text[before : left + total])
                if tid is not None:
                    heapq.heappush(heap, (-scores[tid], before, left, left + total - before))
            if after >= 0:
                tid = get(text[left : after + size[after]])
                if tid is not None:
                    heapq.heappush(heap, (-scores[tid], left, after, after + size[after] - left))
        out: list[int] = []
        i = 0
        while i >= 0:
            piece = text[i : i + size[i]]
            tid = get(piece)
            if tid is not None:
                out.append(tid)
            else:  # only single characters can be missing: every merge makes a token
                out.extend(self._byte_token(b) for b in piece.encode("utf-8"))
            i = nxt[i]
        return out

    def _encode(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        if self._c_args is None or len(data) >= 2**31:  # el_spm_encode counts bytes in 32 bits
            return self._encode_py(text)
        out = self._ffi.new("int32_t[]", len(data))  # at most one id per byte
        n = self._lib.el_spm_encode(*self._c_args, data, len(data), out)
        if n < 0:
            if n == self._lib.EL_TOKENIZE_NO_MEMORY:
                raise MemoryError("no memory to tokenize the text")
            self._byte_token(-1 - n)  # raises: the byte has no token
        return self._ffi.unpack(out, n)

    def _byte_id(self, byte: int) -> int:
        """Token of one raw byte: <0xAB>, else the byte as a one-character token (llama.cpp's
        byte_to_token); -1 if neither exists."""
        tid = self._token_to_id.get(f"<0x{byte:02X}>")
        if tid is None and byte < 0x80:
            tid = self._token_to_id.get(chr(byte))
        return -1 if tid is None else tid

    def _byte_token(self, byte: int) -> int:
        tid = self._byte_ids[byte]
        if tid < 0:
            raise TokenizerError(
                f"text needs byte 0x{byte:02X} but the vocabulary has no byte-fallback token <0x{byte:02X}>"
            )
        return tid
