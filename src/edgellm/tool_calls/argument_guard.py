"""Each argument of an XML call at most once, in any order, the required ones before the call ends -
for any number of arguments. A grammar cannot say so in less than one rule per set of arguments
written (2^n: xml.py writes that grammar up to common.MAX_ANY_ORDER arguments); beyond that the
grammar lets each argument come any number of times and this guard, the matcher's second half
(constrain.Constraint), keeps the set written: it reads the call's text byte by byte as the
grammar writes it (head, then per argument its opening - key and all -, the value, the value's
end, then the call's end) and refuses a token whose text opens an argument already written, or
ends the call with a required one missing.

A guard's state is a tuple (the constraint keeps one per token, to roll back). Where the text is
not a call as the grammar writes it from its first byte (the JSON answer of call_or_json_grammar)
the guard steps aside ("off")."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

_HEAD, _ARGS, _TEXT, _JSON, _END, _DONE, _OFF = range(7)
_KEY_STOP = b"<>\n"  # what an argument's key may not hold (xml.py's XML_KEY)


@dataclass(frozen=True)
class _Tool:
    opens: dict  # an argument's opening (bytes) -> (its index, whether its value is text)
    required: frozenset  # indices
    names: frozenset  # the keys (bytes)
    extras: bool  # arguments it does not list are allowed (as text)


class ArgumentGuard:
    """The guard of a grammar of XML calls of `tools` in format `name` (xml.grammar's layout; no
    argument's opening begins another's: xml._free)."""

    def __init__(self, name: str, tools: list[dict], parallel: bool):
        from . import xml

        o, n, k, _, v, e = xml.XML[name]
        self.k, self.v, self.e = k.encode(), v.encode(), e.encode()
        self.kv_text = xml._kv(name, "string").encode()
        self.kv_lead = min(i for i, c in enumerate(self.kv_text) if c in _KEY_STOP)
        block = xml.XML_BLOCK.get(name)
        self.block = (block[0].encode(), block[1].encode()) if block else None
        self.index = (n[0].encode(), n[1].encode()) if not isinstance(n, str) else None
        self.heads: dict[bytes, _Tool] = {}
        for t in tools:
            params, props = xml.parameters(t), xml.properties(t)
            required = set(params.get("required") or [])
            opens = {}
            for i, (key, schema) in enumerate(props.items()):
                kind = xml._SCHEMA_KIND.get(schema.get("type"), "object") if isinstance(schema, dict) else "object"
                opens[(k + key + xml._kv(name, kind)).encode()] = (i, xml._is_text(schema))
            head = (o + t["function"]["name"] + (n if isinstance(n, str) else n[0])).encode()
            self.heads[head] = _Tool(opens, frozenset(i for i, key in enumerate(props) if key in required),
                                     frozenset(key.encode() for key in props), params.get("additionalProperties") is not False)
        self.parallel = parallel
        # a token that steps from a value's end or a head's into the next argument holds the end's
        # last byte then the first of an opening or of the call end
        ends = [self.v[-1:], (self.index[1] if self.index else n.encode())[-1:]]
        self.steps = tuple({a + b for a in ends for b in (self.k[:1], self.e[:1])})

    def start(self) -> tuple:
        return (_HEAD, 0, b"", None, frozenset(), None)

    # -- reading -----------------------------------------------------------------------------

    def feed(self, state: tuple, data: bytes) -> tuple | None:
        """The state after `data`, or None where the data breaks the arguments' rule."""
        i = 0
        while i < len(data):
            phase, calls, buf, tool, seen, _ = state
            if phase in (_DONE, _OFF):
                return state
            if phase == _TEXT:  # (a text value runs to its end's first occurrence)
                text = buf + data[i:]
                at = text.find(self.v)
                if at < 0:
                    return (_TEXT, calls, text[-len(self.v):], tool, seen, None)
                i += at + len(self.v) - len(buf)
                state = (_ARGS, calls, b"", tool, seen, None)
                continue
            state = self._byte(state, data[i])
            if state is None:
                return None
            i += 1
        return state

    def _byte(self, state: tuple, b: int):
        phase, calls, buf, tool, seen, json = state
        c = bytes((b,))
        if phase == _HEAD:
            return self._head(calls, buf + c)
        if phase == _ARGS:
            return self._args(calls, buf + c, tool, seen)
        if phase == _JSON:
            depth, in_str, esc = json
            if in_str:
                return (_JSON, calls, b"", tool, seen, (depth, not (c == b'"' and not esc), c == b"\\" and not esc))
            if depth == 0 and c == self.v[:1]:
                return self._ended(calls, 1, tool, seen)
            depth += 1 if c in b"[{" else -1 if c in b"]}" else 0
            return (_JSON, calls, b"", tool, seen, (depth, c == b'"', False))
        return self._ended(calls, buf + 1, tool, seen)  # _END: buf counts the value end's bytes read

    def _ended(self, calls, got, tool, seen):
        return (_ARGS, calls, b"", tool, seen, None) if got == len(self.v) else (_END, calls, got, tool, seen, None)

    def _head(self, calls: int, buf: bytes):
        leads = ([self.block[0]] if calls == 0 else [b""]) if self.block else [b"" if calls == 0 else b"\n"]
        if self.block and calls and self.block[1].startswith(buf):
            done = buf == self.block[1]
            return (_DONE if done else _HEAD, calls, b"" if done else buf, None, frozenset(), None)
        for lead in leads:
            for head, tool in self.heads.items():
                whole = lead + head
                if whole.startswith(buf):
                    if buf == whole and self.index is None:
                        return (_ARGS, calls, b"", tool, frozenset(), None)
                    return (_HEAD, calls, buf, None, frozenset(), None)
                if self.index is not None and buf.startswith(whole):  # (Kimi K3: the call's number, then its end)
                    rest = buf[len(whole):]
                    digits = len(rest) - len(rest.lstrip(b"0123456789"))
                    if rest[digits:] == self.index[1] and digits:
                        return (_ARGS, calls, b"", tool, frozenset(), None)
                    if self.index[1].startswith(rest[digits:]):
                        return (_HEAD, calls, buf, None, frozenset(), None)
        return (_OFF, calls, b"", None, frozenset(), None)

    def _args(self, calls: int, w: bytes, tool: _Tool, seen: frozenset):
        hit = tool.opens.get(w)
        if hit is not None:  # (one not written: _live refused the others before they ended)
            return (_TEXT if hit[1] else _JSON, calls, b"", tool, seen | {hit[0]}, None if hit[1] else (0, False, False))
        if w == self.e:
            if not tool.required <= seen:
                return None
            return (_HEAD, calls + 1, b"", None, frozenset(), None) if self.parallel or self.block else \
                (_DONE, calls + 1, b"", None, frozenset(), None)
        if tool.extras and w.startswith(self.k) and w.endswith(self.kv_text):
            key = w[len(self.k):len(w) - len(self.kv_text)]
            if key and not any(s in key for s in (b"<", b">", b"\n")) and key not in tool.names:
                return (_TEXT, calls, b"", tool, seen, None)
        return (_ARGS, calls, w, tool, seen, None) if self._live(w, tool, seen) else None

    def _live(self, w: bytes, tool: _Tool, seen: frozenset) -> bool:
        """Whether the text since the last argument can still become an argument allowed here."""
        if any(i not in seen and a.startswith(w) for a, (i, _) in tool.opens.items()):
            return True
        if tool.required <= seen and self.e.startswith(w):
            return True
        if not tool.extras:
            return False
        if len(w) <= len(self.k):
            return self.k.startswith(w)
        if not w.startswith(self.k):
            return False
        r = w[len(self.k):]
        stop = min((i for i, c in enumerate(r) if c in _KEY_STOP), default=-1)
        if stop < 0:
            return True  # (a key being written: some key not listed begins so)
        cut = stop - self.kv_lead
        return cut >= 1 and self.kv_text.startswith(r[cut:]) and r[:cut] not in tool.names

    # -- masks -------------------------------------------------------------------------------

    def refused(self, state: tuple, vocab: TokenIndex, mask: np.ndarray) -> list:
        """The tokens the grammar allows here (mask: uint32 words, bit t % 32 of word t // 32 for
        token t) that the guard refuses: id arrays and lists."""
        phase, calls, w, tool, seen, _ = state
        if phase in (_DONE, _OFF):
            return []
        out, maybe = [], set()
        if phase == _ARGS:
            closed = [a for a, (i, _) in tool.opens.items() if i in seen]
            if not tool.required <= seen:
                closed.append(self.e)
            for f in closed:
                if not f.startswith(w):
                    continue
                r = f[len(w):]
                out.append(vocab.starting_with(r))  # (f whole: no opening allowed begins with it)
                for j in range(1, len(r)):
                    maybe.update(vocab.by_text.get(r[:j], ()))
        steps = vocab.containing(self.steps)
        maybe.update(steps[_on(mask, steps)].tolist())
        maybe = np.fromiter(maybe, dtype=np.int64, count=len(maybe))
        out.append([t for t in maybe[_on(mask, maybe)].tolist() if self.feed(state, vocab.pieces[t]) is None])
        return out


def _on(mask: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Whether each of ids is in the mask."""
    return ((mask[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)


class TokenIndex:
    """A vocabulary's token texts (as llguidance sees them), sorted, for the guard's look-ups."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        order = sorted(range(len(pieces)), key=pieces.__getitem__)
        self.sorted = [pieces[i] for i in order]
        self.order = np.array(order, dtype=np.int64)
        self.by_text: dict[bytes, list[int]] = {}
        for i, p in enumerate(pieces):
            self.by_text.setdefault(p, []).append(i)
        self._containing: dict[tuple, np.ndarray] = {}

    def starting_with(self, prefix: bytes) -> np.ndarray:
        lo = bisect_left(self.sorted, prefix)
        hi = lo
        if prefix[-1] < 255:
            hi = bisect_left(self.sorted, prefix[:-1] + bytes((prefix[-1] + 1,)))
        else:
            while hi < len(self.sorted) and self.sorted[hi].startswith(prefix):
                hi += 1
        return self.order[lo:hi]

    def containing(self, texts: tuple) -> np.ndarray:
        got = self._containing.get(texts)
        if got is None:
            got = np.array([i for i, p in enumerate(self.pieces) if any(t in p for t in texts)], dtype=np.int64)
            self._containing[texts] = got
        return got
