"""The one reader of a reply's text, as it is written: a format family's reader - a generator
read(name, scan, tools), named in formats.FORMATS by its family - walks the text with Scan's
steps, yields whenever it needs more text than there is (scan.final: no more will come), and says
what the text is. Scan turns that into events:

    ("content", text)     the answer (with tools: each stretch between calls stripped, stretches
                          joined by a newline; without, as written)
    ("reasoning", text)   reasoning (gpt-oss's analysis messages)
    ("call", name)        a call begins: its name is written
    ("args", text)        more of that call's arguments (OpenAI's JSON text)
    ("end",)              the calls begun since the last end are complete (their markers closed)

A reader decides nothing before the text that decides it is there - what may still be a marker is
held back - so the events of a text fed whole and fed in any pieces add up to the same. A call
counts once its name is written (it cannot be taken back from a stream): cut short, or malformed
after that, it keeps the arguments written so far. Text after a marker that turns out to be no
call is content, markers and all (release).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator

Steps = Generator[None, None, object]  # a reader's step: yields while it waits for text
LIMIT = 256  # characters: a call's name or header no longer than this, else it is no call


def held(text: str, pos: int, markers) -> int:
    """How many trailing characters of text[pos:] could be the start of one of markers."""
    most = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text) - pos), most, -1):
            if text.endswith(m[:k]):
                most = k
                break
    return most


class _Voice:
    """One kind of text said (content or reasoning): stretches stripped and joined by a newline
    (strip), or as written."""

    def __init__(self, kind: str, strip: bool, lead: bool):
        self.kind, self.strip, self.lead = kind, strip, lead
        self.ws = ""  # trailing whitespace held back until more of the stretch follows
        self.said = False  # something was said
        self.fresh = False  # a new stretch began: a newline before its first text

    def say(self, text: str, out: list) -> None:
        if self.lead:
            text = text.lstrip()
            if not text:
                return
            self.lead = False
            if self.fresh and self.said:
                text = "\n" + text
        if self.strip:
            core = text.rstrip()
            text, self.ws = (self.ws + core, text[len(core):]) if core else ("", self.ws + text)
        if text:
            self.said = True
            out.append((self.kind, text))

    def stretch(self) -> None:
        """The stretch ends: its trailing whitespace goes, the next one's leading whitespace too."""
        if self.strip:
            self.ws, self.lead, self.fresh = "", True, True


class Scan:
    """A reply's body as it grows, read by `read(scan)` (a family's reader with its format and
    tools bound). drop: markers left out of the content (a format's answer marks); strip: with
    tools, content is stripped around calls; lead: leading whitespace goes (after a think block).
    json_answer: the answer is constrained JSON (the generic format's {"response": ...} is then
    content as written)."""

    def __init__(self, read: Callable[[Scan], Steps], *, drop: tuple[str, ...] = (), strip: bool = True,
                 lead: bool = True, json_answer: bool = False):
        self.text, self.pos, self.final = "", 0, False
        self.drop = drop
        self.json_answer = json_answer
        self._voices = {k: _Voice(k, strip, lead) for k in ("content", "reasoning")}
        self._out: list[tuple] = []
        self.open_calls = 0  # calls begun and not yet complete
        self._steps = read(self)

    # -- feeding --

    def feed(self, text: str) -> list[tuple]:
        self.text += text
        self._run()
        return self._take()

    def close(self) -> list[tuple]:
        self.final = True
        self._run()
        if self.pos < len(self.text):  # (a reader that stops before the end leaves content)
            self.say(self.text[self.pos:])
            self.pos = len(self.text)
        return self._take()

    def _run(self) -> None:
        if self._steps is None:
            return
        try:
            next(self._steps)
        except StopIteration:
            self._steps = None
            return
        if self.final:
            raise RuntimeError("a tool-call reader waited for text after the end")

    def _take(self) -> list[tuple]:
        out, self._out = self._out, []
        return out

    # -- what the text is --

    def say(self, text: str, kind: str = "content") -> None:
        if text:
            self._voices[kind].say(text, self._out)

    def stretch(self) -> None:
        for v in self._voices.values():
            v.stretch()

    def call(self, name: str) -> None:
        self.stretch()
        self.open_calls += 1
        self._out.append(("call", name))

    def args(self, text: str) -> None:
        if text:
            self._out.append(("args", text))

    def end(self) -> None:
        if self.open_calls:
            self.open_calls = 0
            self._out.append(("end",))

    def cut(self) -> None:
        """A begun call does not read on: where the text has ended (it was cut short), the rest is
        the call's, not content."""
        if self.final:
            self.pos = len(self.text)

    def release(self, start: int) -> None:
        """The text from start to here was no call: it is content."""
        self.say(self.text[start:self.pos])

    # -- steps (each a generator: `x = yield from scan.step(...)`) --

    def _find(self, markers) -> tuple[int, str] | None:
        best = None
        for m in markers:
            k = self.text.find(m, self.pos)
            if k >= 0 and (best is None or k < best[0]):
                best = (k, m)
        return best

    def content_until(self, *markers: str, kind: str = "content") -> Steps:
        """Content (or `kind`) up to the first of markers; returns the marker (pos past it), or
        None at the end."""
        every = markers + self.drop
        while True:
            found = self._find(every)
            if found is not None:
                k, m = found
                self.say(self.text[self.pos:k], kind)
                self.pos = k + len(m)
                if m in markers:
                    return m
                continue  # (an answer mark: left out)
            keep = 0 if self.final else held(self.text, self.pos, every)
            self.say(self.text[self.pos:len(self.text) - keep], kind)
            self.pos = len(self.text) - keep
            if self.final:
                return None
            yield

    def rest(self) -> Steps:
        """All the rest is content."""
        return (yield from self.content_until())

    def wait(self, n: int = 1) -> Steps:
        """Until n characters follow pos (or the text ends); whether they do."""
        while len(self.text) - self.pos < n and not self.final:
            yield
        return len(self.text) - self.pos >= n

    def first(self) -> Steps:
        """The first character after whitespace ("" at the end); pos stays."""
        while True:
            i = self.pos
            while i < len(self.text) and self.text[i].isspace():
                i += 1
            if i < len(self.text) or self.final:
                return self.text[i:i + 1]
            yield

    def opens(self, literal: str, ws: bool = True) -> Steps:
        """Whether literal follows (after whitespace, with ws); pos past it if it does ("" always
        follows, no whitespace read)."""
        while literal:
            i = self.pos
            while ws and i < len(self.text) and self.text[i].isspace():
                i += 1
            if self.text.startswith(literal, i):
                self.pos = i + len(literal)
                return True
            if self.final or not literal.startswith(self.text[i:]):
                return False
            yield
        return True

    def until(self, *markers: str, limit: int = LIMIT) -> Steps:
        """The text up to the first of markers, and pos past that marker: (text, marker); None
        where the text ends first, or more than limit characters come without one."""
        while True:
            found = self._find(markers)
            if found is not None and found[0] - self.pos <= limit:
                k, m = found
                text, self.pos = self.text[self.pos:k], k + len(m)
                return text, m
            if found is not None or self.final or len(self.text) - self.pos > limit + max(map(len, markers)):
                return None
            yield

    def stream_until(self, end: str, emit: Callable[[str], None], trim: bool = False) -> Steps:
        """Text up to `end`, given to emit as it comes (what may be the start of end held back),
        pos past end; whether end came. trim: a newline just before end is left out."""
        while True:
            k = self.text.find(end, self.pos)
            if k >= 0:
                stop = k - 1 if trim and k > self.pos and self.text[k - 1] == "\n" else k
                emit(self.text[self.pos:stop])
                self.pos = k + len(end)
                return True
            keep = 0 if self.final else held(self.text, self.pos, (end,))
            if trim and not self.final and len(self.text) - keep > self.pos and self.text[len(self.text) - keep - 1] == "\n":
                keep += 1
            emit(self.text[self.pos:len(self.text) - keep])
            self.pos = len(self.text) - keep
            if self.final:
                return False
            yield

    def json(self, on: Callable[[JSONSpans], None] | None = None) -> Steps:
        """Follow the JSON value that starts here (on(spans) after each piece read); the spans, pos
        where the value ends (or reading stopped: an error, the end of the text)."""
        j = JSONSpans(self.pos)
        while True:
            j.feed(self.text)
            if on is not None:
                on(j)
            if j.done or self.final:
                self.pos = j.end if j.end is not None else j.pos
                return j
            yield


# -- a JSON value, followed as it is written -----------------------------------------------------------


def decode(raw: str):
    try:
        return json.loads(raw)
    except ValueError:
        return None


class _Frame:
    __slots__ = ("kind", "path", "expect", "key", "index")

    def __init__(self, kind: str, path: tuple, expect: str):
        self.kind, self.path, self.expect, self.key, self.index = kind, path, expect, None, 0


class JSONSpans:
    """Follows the JSON value that starts at text[pos:] (after whitespace) as the text grows:
    where each member up to MAX_DEPTH starts and ends, by path (keys and array indices), the keys
    of each object in order, and where the whole value ends (a key written twice has the span of
    its first value: what a stream has sent of it stays). Lenient: a bare word counts as a value,
    so a model's not-quite-JSON still has spans; `error` is set where it cannot go on."""

    MAX_DEPTH = 3

    def __init__(self, pos: int):
        self.pos = pos  # the next character to read
        self.spans: dict[tuple, list] = {}  # path -> [start, end or None]
        self.keys: dict[tuple, list] = {}  # object path -> its keys so far
        self.end: int | None = None  # where the value ends, once it has
        self.error = False
        self._stack: list[_Frame] = []
        self._str: tuple[int, bool] | None = None  # inside a string: (start, is a key)
        self._esc = False
        self._prim: int | None = None  # inside a number / literal: its start

    @property
    def done(self) -> bool:
        return self.end is not None or self.error

    def _path(self) -> tuple:
        if not self._stack:
            return ()
        f = self._stack[-1]
        return f.path + ((f.key,) if f.kind == "{" else (f.index,))

    def _begin(self, i: int) -> tuple:
        path = self._path()
        if len(path) <= self.MAX_DEPTH and path not in self.spans:  # (a key written twice: its first value)
            self.spans[path] = [i, None]
        return path

    def _ended(self, path: tuple, end: int) -> None:
        if path in self.spans and self.spans[path][1] is None:
            self.spans[path][1] = end
        if self._stack:
            self._stack[-1].expect = ","
        else:
            self.end = end

    def feed(self, text: str) -> None:
        i, n = self.pos, len(text)
        while i < n and not self.done:
            c = text[i]
            if self._str is not None:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == '"':
                    start, is_key = self._str
                    self._str = None
                    if is_key:
                        f = self._stack[-1]
                        f.key, f.expect = decode(text[start:i + 1]), ":"
                        if len(f.path) < self.MAX_DEPTH:
                            self.keys.setdefault(f.path, []).append(f.key)
                    else:
                        self._ended(self._path(), i + 1)
                i += 1
                continue
            if self._prim is not None:
                if c in ",}]:" or c.isspace():
                    self._prim = None
                    self._ended(self._path(), i)
                    continue  # c is read again, as what follows the value
                i += 1
                continue
            if c.isspace():
                i += 1
                continue
            f = self._stack[-1] if self._stack else None
            expect = f.expect if f else "value"
            if expect == "key":
                if c == '"':
                    self._str = (i, True)
                elif c == "}":  # {} (or a trailing comma)
                    self._close(i)
                else:
                    self.error = True
            elif expect == ":":
                if c == ":":
                    f.expect = "value"
                else:
                    self.error = True
            elif expect == ",":
                if c == ",":
                    if f.kind == "{":
                        f.expect = "key"
                    else:
                        f.index += 1
                        f.expect = "value"
                elif c == ("}" if f.kind == "{" else "]"):
                    self._close(i)
                else:
                    self.error = True
            elif f is not None and f.kind == "[" and c == "]":  # [] (or a trailing comma)
                self._close(i)
            elif c in "}],:":
                self.error = True
            else:
                path = self._begin(i)
                if c in "{[":
                    self._stack.append(_Frame(c, path, "key" if c == "{" else "value"))
                elif c == '"':
                    self._str = (i, False)
                else:
                    self._prim = i
            i += 1
        self.pos = i

    def _close(self, i: int) -> None:
        f = self._stack.pop()
        self._ended(f.path, i + 1)

    def span_text(self, text: str, path: tuple) -> str | None:
        """The text of the member at path written so far (None: not begun)."""
        sp = self.spans.get(path)
        if sp is None:
            return None
        return text[sp[0]:sp[1] if sp[1] is not None else self.pos]

    def complete(self, path: tuple) -> bool:
        sp = self.spans.get(path)
        return sp is not None and sp[1] is not None

    def items(self, path: tuple = ()) -> list[tuple]:
        """The paths of the items begun so far of the array at path, in order."""
        out, i = [], 0
        while path + (i,) in self.spans:
            out.append(path + (i,))
            i += 1
        return out


class CallsIn:
    """The calls in one JSON value as it is written, each an object at a path of it: its name
    under name_key and its arguments under the first of args_keys written (with name_key None,
    {name: arguments}). update(spans, paths) says what is new of the calls at those paths: a call
    begins once its name is written (arguments written before it wait for it), then its arguments
    as they are written ({} for a call without them)."""

    def __init__(self, scan: Scan, name_key: str | None = "name", args_keys: tuple[str, ...] = ("arguments",)):
        self.scan, self.name_key, self.args_keys = scan, name_key, args_keys
        self._calls: dict[tuple, list] = {}  # path -> [name or None, characters of arguments sent]
        self.begun = 0

    def update(self, j: JSONSpans, paths) -> None:
        s, text = self.scan, self.scan.text
        for p in paths:
            c = self._calls.setdefault(p, [None, -1])
            if c[0] is None:
                if self.name_key is None:
                    keys = j.keys.get(p)
                    args = p + (keys[0],) if keys else None
                    if args is None or args not in j.spans:
                        continue
                    c[0] = keys[0]
                else:
                    if not j.complete(p + (self.name_key,)):
                        continue
                    name = decode(j.span_text(text, p + (self.name_key,)))
                    if not isinstance(name, str) or not name:
                        continue
                    c[0] = name
                s.call(c[0])
                self.begun += 1
                c[1] = 0
            args = p + (c[0],) if self.name_key is None else next(
                (p + (k,) for k in self.args_keys if p + (k,) in j.spans), None)
            if args is not None:
                written = j.span_text(text, args)
                s.args(written[c[1]:])
                c[1] = len(written)
            elif j.complete(p) and c[1] == 0:  # a call without arguments
                s.args("{}")
                c[1] = 2


def json_arguments(scan: Scan) -> Steps:
    """The JSON value that starts here as the current call's arguments, sent as written; whether
    the value ended."""
    sent = [0]

    def on(j: JSONSpans) -> None:
        written = j.span_text(scan.text, ())
        if written is not None:
            scan.args(written[sent[0]:])
            sent[0] = len(written)

    j = yield from scan.json(on)
    return j.end is not None
