"""SentencePiece-style tokenizer (`tokenizer.ggml.model == "llama"`), as llama.cpp's
llm_tokenizer_spm_session: start from one symbol per character, repeatedly merge the adjacent pair
whose concatenation is the vocabulary token with the highest score (leftmost first on ties), then
emit each symbol's token, or byte tokens (<0xAB>) for a character the vocabulary lacks."""

from __future__ import annotations

import heapq

import numpy as np

from ..errors import TokenizerError
from .vocab import Vocab

_CACHE_LIMIT = 1 << 14  # fragments remembered (text -> ids); cleared when full
_CACHE_MAX_LEN = 256    # longer fragments are rarely seen twice: not remembered


class SpmEncoder:
    """Escaped text (without special tokens) -> ids, remembering recent short fragments."""

    def __init__(self, vocab: Vocab):
        self._token_to_id = vocab.token_to_id
        # token id -> score: indexing a memoryview of the float32 array gives exact Python floats
        # without a float object per token
        scores = vocab.scores if vocab.scores is not None else np.zeros(vocab.n_vocab, np.float32)
        self._scores = memoryview(np.ascontiguousarray(scores, np.float32))
        self._byte_ids: dict[int, int] = {}
        self._cache: dict[str, list[int]] = {}

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

    def _encode(self, text: str) -> list[int]:
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

    def _byte_token(self, byte: int) -> int:
        """Token of one raw byte: <0xAB>, else the byte as a one-character token (llama.cpp's
        byte_to_token)."""
        tid = self._byte_ids.get(byte)
        if tid is None:
            tid = self._token_to_id.get(f"<0x{byte:02X}>")
            if tid is None and byte < 0x80:
                tid = self._token_to_id.get(chr(byte))
            if tid is None:
                raise TokenizerError(
                    f"text needs byte 0x{byte:02X} but the vocabulary has no byte-fallback token "
                    f"<0x{byte:02X}>"
                )
            self._byte_ids[byte] = tid
        return tid
