"""Token ids back to bytes and text, as llama.cpp's token_to_piece: control and unknown tokens are
rendered (as their text) only when asked for special tokens, or when they are among the
`preserved` ids a caller names (a tool-call format's markers); user-defined tokens always as their
text; normal tokens with ▁ turned back into spaces (SPM, SPM-style BPE) or through the inverse byte
map (byte-level BPE);
byte tokens <0xAB> as the raw byte; unused and undefined tokens as nothing."""

from __future__ import annotations

import codecs

from ..errors import TokenizerError
from .bpe import CHAR_TO_BYTE
from .vocab import Attr, Vocab

_HIDDEN_UNLESS_SPECIAL = int(Attr.CONTROL | Attr.UNKNOWN)
_AS_TEXT = int(Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED)


class PieceTable:
    """Bytes of each token's piece, computed on first use (a 262k vocabulary costs nothing to load)."""

    def __init__(self, vocab: Vocab):
        self._vocab = vocab
        self._pieces: dict[int, bytes] = {}  # id -> piece with special tokens rendered

    def piece(self, token_id: int, special: bool, preserved: frozenset[int] = frozenset()) -> bytes:
        v = self._vocab
        if type(token_id) is not int:
            try:
                token_id = int(token_id)  # numpy integers from a sampler
            except (TypeError, ValueError):
                raise TokenizerError(f"token id must be an integer, got {type(token_id).__name__}") from None
        if not 0 <= token_id < v.n_vocab:
            raise TokenizerError(f"token id {token_id} is outside the vocabulary (size {v.n_vocab})")
        if not special and v.attr(token_id) & _HIDDEN_UNLESS_SPECIAL and token_id not in preserved:
            return b""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._render(token_id)
        return piece

    def _render(self, token_id: int) -> bytes:
        v = self._vocab
        text = v.tokens[token_id]
        attr = v.attr(token_id)
        # token texts are read with surrogateescape: bytes that are not UTF-8 go out as they came in
        if attr & _AS_TEXT:
            return text.encode("utf-8", "surrogateescape")
        if attr & Attr.NORMAL:
            if v.kind == "spm" or not v.byte_map:
                return text.replace("\u2581", " ").encode("utf-8", "surrogateescape")
            return _bpe_bytes(text)
        if attr & Attr.BYTE:  # "<0xAB>"
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                raise TokenizerError(f"byte token {token_id} has text {text!r}, expected <0xAB>") from None
        return b""  # unused / undefined


def _bpe_bytes(text: str) -> bytes:
    """Inverse of GPT-2's byte map. A character outside it is rendered as llama.cpp does
    (llama_decode_text): "[UNK_BYTE_0x<its UTF-8 in hex>" + the token text + "]"."""
    out = bytearray()
    for ch in text:
        b = CHAR_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            unk = f"[UNK_BYTE_0x{ch.encode('utf-8', 'surrogateescape').hex()}{text}]"
            out += unk.encode("utf-8", "surrogateescape")
    return bytes(out)


class StreamingDetokenizer:
    """Turns ids into text one at a time. Text is returned as soon as it is complete: the bytes
    of a UTF-8 character split across tokens are held back until the character is whole (invalid
    bytes become U+FFFD, exactly as decoding all the bytes at once would). preserved: ids of
    control tokens rendered as their text though special tokens are not (PieceTable.piece)."""

    def __init__(self, pieces: PieceTable, *, special: bool = False, preserved: frozenset[int] = frozenset()):
        self._pieces = pieces
        self._special = special
        self._preserved = frozenset(preserved)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        return self._decoder.decode(self._pieces.piece(token_id, self._special, self._preserved))

    def flush(self) -> str:
        """Whatever is held back (an incomplete character becomes U+FFFD); the stream can go on."""
        return self._decoder.decode(b"", final=True)
