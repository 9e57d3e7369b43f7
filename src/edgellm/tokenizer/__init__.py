"""Tokenizers read from GGUF metadata, giving the same ids as llama.cpp.

    tok = Tokenizer.from_metadata(gguf_metadata)
    ids = tok.encode("Hello")                        # BOS first if the model wants one
    ids = tok.encode("<|im_start|>user\\nHi", special=True)
    text = tok.decode(ids)

Supported: SentencePiece-style vocabularies (`tokenizer.ggml.model` "llama": Llama 1/2, Gemma,
Mistral v1, ...), byte-level BPE ("gpt2": Llama 3, Qwen 2, SmolLM, GPT-2, ...) and SPM-style BPE
over raw UTF-8 ("gemma4").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import TokenizerError
from .bpe import BpeEncoder
from .detokenize import PieceTable, StreamingDetokenizer
from .special import SpecialSplitter
from .spm import SpmEncoder
from .vocab import SUPPORTED_MODELS, Attr, Vocab, load_vocab

__all__ = ["Tokenizer", "StreamingDetokenizer", "SUPPORTED_MODELS"]


class Tokenizer:
    """Text <-> token ids for one model. Build with `Tokenizer.from_metadata`."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self._specials = SpecialSplitter(vocab)
        self._pieces = PieceTable(vocab)
        self._encoder: SpmEncoder | BpeEncoder | None = None  # built on first encode
        self._preserved: dict[tuple[str, ...], frozenset[int]] = {}  # preserved_ids' answers

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (key -> value; string arrays as list[str], numeric arrays as
        sequences or numpy arrays). Raises UnsupportedModelError for a tokenizer model other than
        "llama", "gpt2" or "gemma4", TokenizerError for missing or inconsistent tokenizer keys."""
        if not isinstance(meta, Mapping):
            raise TokenizerError(f"metadata must be a mapping of GGUF keys, got {type(meta).__name__}")
        return cls(load_vocab(meta))

    # -- properties ---------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special["eos"]

    @property
    def add_bos(self) -> bool:
        """Whether the model wants BOS first in a prompt (tokenizer.ggml.add_bos_token, or
        llama.cpp's default for the tokenizer type when the key is absent)."""
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    @property
    def eog_ids(self) -> frozenset[int]:
        """Tokens that end generation: EOS, end-of-turn and the like, as llama.cpp decides."""
        return self.vocab.eog_ids

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.vocab.eog_ids

    def preserved_ids(self, markers: Iterable[str]) -> frozenset[int]:
        """Ids of the control tokens that make up the marker texts (found in them as
        encode(special=True) finds them), those that end generation excepted: the tokens a reply's
        decoder renders as their text though it drops control tokens (llama.cpp's preserved tokens;
        tool_calls.preserved_markers names a format's markers). Other tokens of the texts (normal
        or user-defined ones, rendered anyway) are not among them."""
        key = tuple(markers)
        found = self._preserved.get(key)
        if found is None:
            v = self.vocab
            found = frozenset(f for m in key for f in self._specials.split(m, True)
                              if type(f) is int and v.attr(f) & Attr.CONTROL and f not in v.eog_ids)
            self._preserved[key] = found
        return found

    # -- encoding -----------------------------------------------------------------------------
    def encode(self, text: str, *, add_bos: bool = True, special: bool = False, space_prefix: bool = True) -> list[int]:
        """Token ids of `text`, as llama.cpp's tokenize(text, add_special=add_bos, parse_special=special).

        add_bos: add the BOS token (and EOS at the end) only if the model's metadata asks for them.
        special: recognise control tokens written in the text (e.g. "<|im_start|>"); without it
        they are tokenized as plain text. User-defined tokens are recognised either way.
        space_prefix=False: `text` continues other text, so no space is put in front of it or
        after a special token even when the model's SPM tokenizer would (add_space_prefix); the
        tokens' pieces then spell exactly `text` (a grammar's forced text needs that)."""
        if not isinstance(text, str):
            raise TokenizerError(f"text to encode must be a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TokenizerError(f"text is not valid Unicode (lone surrogate at index {e.start})") from None
        v = self.vocab
        if self._encoder is None:
            self._encoder = SpmEncoder(v) if v.kind == "spm" else BpeEncoder(v)
        encode = self._encoder.encode

        out: list[int] = []
        if add_bos and v.add_bos:
            out.append(v.special["bos"])
        if v.kind == "spm":
            # llama.cpp prefixes a space to every run of text that starts the input or follows a
            # special token (when add_space_prefix), then writes spaces as ▁.
            after_special = True
            for frag in self._specials.split(text, special):
                if type(frag) is int:
                    out.append(frag)
                    after_special = True
                    continue
                piece = text[frag[0] : frag[1]]
                if v.add_space_prefix and after_special and space_prefix:
                    piece = " " + piece
                out.extend(encode(piece.replace(" ", "\u2581")))
                after_special = False
        else:
            for frag in self._specials.split(text, special):
                if type(frag) is int:
                    out.append(frag)
                else:
                    out.extend(encode(text[frag[0] : frag[1]]))
        if add_bos and v.add_eos:
            out.append(v.special["eos"])
        return out

    # -- decoding -----------------------------------------------------------------------------
    def token_to_piece(self, token_id: int, *, special: bool = False) -> bytes:
        """Bytes one token contributes to decoded text (control tokens only when special=True)."""
        return self._pieces.piece(token_id, special)

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token's piece, control tokens included (their text)."""
        return self._pieces.piece(token_id, True)

    def decode(self, ids: Iterable[int], *, special: bool = False, preserved: frozenset[int] = frozenset()) -> str:
        """Text of `ids`. Control tokens are rendered only when special=True, or when among the
        `preserved` ids (preserved_ids). Bytes that do not
        form valid UTF-8 become U+FFFD. With add_space_prefix (SPM), the space the tokenizer put
        in front of the text is removed: from the first piece (llama.cpp's detokenize) or, when
        the ids start with BOS, from the text after it (llama-cpp-python's detokenize)."""
        ids = list(ids)
        pieces = [self._pieces.piece(i, special, preserved) for i in ids]
        if self.vocab.add_space_prefix and ids:
            if ids[0] != self.bos_id:
                if pieces[0].startswith(b" "):
                    pieces[0] = pieces[0][1:]
            elif not special:
                data = b"".join(pieces)
                return (data[1:] if data.startswith(b" ") else data).decode("utf-8", errors="replace")
        return b"".join(pieces).decode("utf-8", errors="replace")

    def streaming_decoder(self, *, special: bool = False, preserved: frozenset[int] = frozenset()
                          ) -> StreamingDetokenizer:
        """A decoder for ids arriving one by one (generated text): each piece as is, no space
        removed, incomplete UTF-8 characters held back until complete; control tokens among
        `preserved` (preserved_ids) rendered as their text."""
        return StreamingDetokenizer(self._pieces, special=special, preserved=preserved)
