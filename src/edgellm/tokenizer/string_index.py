"""Text -> position in a StringArray (token text -> id, merge rule -> rank) without a Python object
per string: an open-addressing hash table of positions over the array's own bytes, in C
(csrc/vocab_index.c). Without the C kernels it falls back to a dict (a Python object per string
again)."""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..gguf_file import StringArray


class DuplicateStringError(ValueError):
    """The array holds the same string at positions `first` and `second` (first < second)."""

    def __init__(self, text: str, first: int, second: int):
        super().__init__(f"{text!r} at positions {first} and {second}")
        self.text, self.first, self.second = text, first, second


class StringIndex:
    """Position of a string in `strings`. A repeated string raises DuplicateStringError, or with
    first_wins maps to its first position. Lookups: get(text, default), `in`, [text]."""

    def __init__(self, strings: StringArray, *, first_wins: bool = False, use_c: bool | None = None):
        """use_c: None = the C table when the kernels are built; True/False to insist (tests)."""
        self.strings = strings
        c = kernels.c_module() if use_c is not False else None
        if use_c and c is None:
            raise RuntimeError("the C kernels are not built")
        self._dict_get = None
        self.c_index = None  # the el_str_index (cffi) for C code to look up in, with the C table
        if c is not None:
            self._build_c(c, first_wins)
        else:
            self._dict_get = self._build_dict(first_wins)
        self.backend = "dict" if c is None else "c"

    def _build_c(self, c, first_wins: bool) -> None:
        ffi, lib = c
        n = len(self.strings)
        if n >= 2**32 - 1:  # slots hold position + 1 in 32 bits
            raise ValueError(f"{n} strings are too many to index")
        n_slots = 1 << max(4, (2 * n - 1).bit_length())  # at most half full: short probe runs
        self._slots = np.zeros(n_slots, np.uint32)  # (n_slots,) position + 1, 0 = empty
        # the struct points into these three buffers; holding them here keeps the pointers valid
        self._keep = (ffi.from_buffer(self.strings.buffer), ffi.from_buffer("int64_t[]", self.strings.bounds),
                      ffi.from_buffer("uint32_t[]", self._slots))
        ix = self.c_index = ffi.new("el_str_index *")
        ix.base, ix.bounds, ix.slots = self._keep
        ix.n = n
        ix.mask = n_slots - 1
        earlier = ffi.new("int64_t *")
        second = lib.el_str_index_build(ix, first_wins, earlier)
        if second >= 0:
            raise DuplicateStringError(self.strings[second], earlier[0], second)
        self._find = lib.el_str_index_find

    def _build_dict(self, first_wins: bool):
        strings = self.strings
        n = len(strings)
        if first_wins:  # the first of equal keys is inserted last and wins
            index = dict(zip(reversed(strings), range(n - 1, -1, -1)))
        else:
            index = dict(zip(strings, range(n)))
            if len(index) != n:
                seen: dict[str, int] = {}
                for i, s in enumerate(strings):
                    if s in seen:
                        raise DuplicateStringError(s, seen[s], i)
                    seen[s] = i
        return index.get

    def get(self, text: str, default=None):
        if self._dict_get is not None:
            return self._dict_get(text, default)
        b = text.encode("utf-8", "surrogateescape")
        i = self._find(self.c_index, b, len(b))
        return default if i < 0 else i

    def __contains__(self, text: str) -> bool:
        return self.get(text) is not None

    def __getitem__(self, text: str) -> int:
        i = self.get(text)
        if i is None:
            raise KeyError(text)
        return i
