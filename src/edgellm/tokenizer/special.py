"""Splitting text on special tokens before tokenizing the rest, as llama.cpp's
tokenizer_st_partition: special tokens are tried one after another, longest first; each splits
every remaining piece of raw text at all its (non-overlapping, left to right) occurrences.
User-defined tokens are always split out; control and unknown tokens only when parsing special
tokens. A token with the lstrip/rstrip attribute swallows the ASCII whitespace before/after it."""

from __future__ import annotations

from .vocab import Attr, Vocab

_ASCII_SPACE = frozenset(" \t\n\v\f\r")  # C isspace() on a byte
_NOT_PARSED_PLAIN = int(Attr.CONTROL | Attr.UNKNOWN)


class SpecialSplitter:
    """Cuts text into raw-text spans and special token ids."""

    def __init__(self, vocab: Vocab):
        self._vocab = vocab
        self._order: dict[bool, list[tuple[str, int, bool, bool]]] = {}
        self._by_prefix: dict[bool, dict[str, list[int]]] = {}

    def _tables(self, parse_special: bool):
        """(text, id, lstrip, rstrip) in trial order, and positions in it grouped by the first
        two characters of the text (built on first use)."""
        if parse_special not in self._order:
            v = self._vocab
            order = []
            for tid in v.special_token_order():
                attr = v.attr(tid)
                if not parse_special and attr & _NOT_PARSED_PLAIN:
                    continue
                order.append((v.tokens[tid], tid, bool(attr & Attr.LSTRIP), bool(attr & Attr.RSTRIP)))
            by_prefix: dict[str, list[int]] = {}
            for pos, (text, *_) in enumerate(order):
                by_prefix.setdefault(text[:2], []).append(pos)
            self._order[parse_special] = order
            self._by_prefix[parse_special] = by_prefix
        return self._order[parse_special], self._by_prefix[parse_special]

    def split(self, text: str, parse_special: bool) -> list:
        """Fragments of `text` in order: (start, end) spans of raw text and special token ids."""
        order, by_prefix = self._tables(parse_special)
        if not order or not text:
            return [(0, len(text))] if text else []
        # Only the tokens that occur in the text can split it; find them without trying each.
        present = []
        for prefix, positions in by_prefix.items():
            if prefix in text:
                present.extend(p for p in positions if order[p][0] in text)
        present.sort()

        frags: list = [(0, len(text))]
        for p in present:
            tok, tid, lstrip, rstrip = order[p]
            out: list = []
            for frag in frags:
                if type(frag) is int:
                    out.append(frag)
                    continue
                pos, end = frag
                while True:
                    match = text.find(tok, pos, end)
                    if match < 0:
                        if pos < end:
                            out.append((pos, end))
                        break
                    left_end = match
                    if lstrip:
                        while left_end > pos and text[left_end - 1] in _ASCII_SPACE:
                            left_end -= 1
                    if left_end > pos:
                        out.append((pos, left_end))
                    out.append(tid)
                    pos = match + len(tok)
                    if rstrip:
                        while pos < end and text[pos] in _ASCII_SPACE:
                            pos += 1
            frags = out
        return frags
