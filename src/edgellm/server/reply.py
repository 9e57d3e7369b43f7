"""An assistant reply read as it streams: a leading <think>...</think> (Command R7B's
<|START_THINKING|>...<|END_THINKING|>) becomes `reasoning_content`
(llama.cpp's --reasoning-format deepseek), tool calls written in the chat template's format
(the tool_calls package lists them) become OpenAI's `tool_calls` - the call's id and name as soon as the
name is written, then its arguments in fragments as they are written - and the rest is
`content`.

    reply = open_reply(fmt, calls=turn.tools, thinking=turn.thinking)
    for text in pieces:                 # the engine's text, in any pieces
        deltas = reply.feed(text)       # [{"content": ...} | {"reasoning_content": ...} | {"tool_calls": [...]}]
    deltas = reply.close()              # what was held back
    reply.message(), reply.finish_reason(engine_reason)

The server reads a whole reply the same way (one feed), and the message is what the deltas add
up to, so a streamed reply assembles into exactly the non-streamed one whatever the pieces.
What may still turn out to be a call (a marker's first characters, a JSON reply not yet
decided) is held back until it is decided; text that turns out not to be a call is content.
Arguments are the model's own JSON text (as OpenAI returns them), not re-serialised; a call cut
short (max_tokens) keeps the arguments written so far, and finish_reason says "length".

A format FORMATS does not list (most of the tool_calls package's: DeepSeek, Command R7B, the XML ones, ...) is read once
the reply is complete, by tool_calls.parse: its content and calls come in the last deltas.
gpt-oss's harmony messages (tool_calls/harmony.py) are read as they stream, with or without tools (its
analysis is reasoning_content): HarmonyReply.

Without tools (fmt None) the content is the model's text as written, less a leading think
block; with tools, content is stripped of the whitespace around it and around calls, as
tool_calls.parse strips it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from ..tool_calls import ToolFormat, answer_marks, parse, reasoning_tags
from ..tool_calls.harmony import Split
from ..tool_calls.json_calls import FUNCTIONARY_TEXT, PYTHON_TAG

# How each format writes a call, as tool_calls.parse reads it:
#   open        the text that starts a call (None: calls are JSON at the very start of the reply)
#   name_end    the name is the text between `open` and this, the arguments the JSON value after
#               it; None: the call is a JSON object with a "name" member and an arguments member
#   args        the names of the arguments member (JSON calls)
#   close       text that ends a call, if any
#   shape       "object": one call object; "array": an array of them; "objects": objects one after
#               another (";" or whitespace between); "wrapped": {"tool_call": {...}},
#               {"tool_calls": [...]} or {"response": "..."}; "value": a JSON value (the arguments)
FORMATS = {
    "hermes": dict(open="<tool_call>", name_end=None, args=("arguments",), close="</tool_call>", shape="object"),
    "mistral": dict(open="[TOOL_CALLS]", name_end=None, args=("arguments",), close=None, shape="array"),
    "granite": dict(open="<|tool_call|>", name_end=None, args=("arguments",), close=None, shape="array"),
    "nemotron_v2": dict(open="<TOOLCALL>", name_end=None, args=("arguments",), close="</TOOLCALL>", shape="array"),
    "mistral_args": dict(open="[TOOL_CALLS]", name_end="[ARGS]", args=(), close=None, shape="value"),
    "functionary": dict(open=">>>", name_end="\n", args=(), close=None, shape="value"),
    "function_tag": dict(open="<function=", name_end=">", args=(), close="</function>", shape="value"),
    "llama3": dict(open=None, name_end=None, args=("parameters", "arguments"), close=None, shape="objects"),
    "generic": dict(open=None, name_end=None, args=("arguments",), close=None, shape="wrapped"),
}


def _held(text: str, marker: str) -> int:
    """How many trailing characters of text could be the start of marker (held back for now)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def _decode(raw: str):
    try:
        return json.loads(raw)
    except ValueError:
        return None


# -- one JSON value, followed as it is written ------------------------------------------------------


class _Frame:
    __slots__ = ("kind", "path", "expect", "key", "index")

    def __init__(self, kind: str, path: tuple, expect: str):
        self.kind, self.path, self.expect, self.key, self.index = kind, path, expect, None, 0


class JSONSpans:
    """Follows the JSON value that starts at text[pos:] (after whitespace) as the text grows:
    where each member up to MAX_DEPTH starts and ends, by path (keys and array indices), the keys
    of each object in order, and where the whole value ends. Lenient: a bare word counts as a
    value, so a model's not-quite-JSON still has spans; `error` is set where it cannot go on."""

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
        if len(path) <= self.MAX_DEPTH:
            self.spans[path] = [i, None]
        return path

    def _ended(self, path: tuple, end: int) -> None:
        if path in self.spans:
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
                        f.key, f.expect = _decode(text[start:i + 1]), ":"
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


# -- the reply --------------------------------------------------------------------------------------


@dataclass
class _Call:
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])
    name: str | None = None
    index: int = -1  # in the reply's tool_calls, once shown
    sent: int = 0  # characters of the arguments sent
    shown: bool = False  # its id and name have been sent
    dropped: bool = False  # a second call when parallel_tool_calls is false


class Reply:
    """One choice's reply (see the module docstring). fmt: the template's tool-call format, None
    when the request has no tools; thinking: the prompt opened a <think> block; json_answer: the
    answer is constrained JSON (the generic format's {"response": ...} is then an answer like any
    other); parallel: more than one call allowed (OpenAI's parallel_tool_calls; later calls are
    dropped); tools: the request's (they type the XML formats' arguments); template: the
    template's format when fmt is None (its reasoning markers and answer markers still apply)."""

    def __init__(self, fmt: ToolFormat | None, *, thinking: bool = False, json_answer: bool = False,
                 parallel: bool = True, tools=(), template: ToolFormat | None = None):
        self.fmt = fmt.name if fmt is not None else None
        self._tags = reasoning_tags(fmt or template)
        self._marks = answer_marks(fmt or template)
        self.spec = None if fmt is None else FORMATS.get(fmt.name, FORMATS["generic"])
        self.whole = fmt if fmt is not None and fmt.name not in FORMATS and fmt.name != "generic" else None
        self.tools = list(tools)
        self.json_answer = json_answer
        self.parallel = parallel
        # before the body: a think block, or the text that may still open one
        self._phase = "reasoning" if thinking else "start"  # -> "body"
        self._head = ""
        self._thought = thinking
        # the body
        self.text = ""  # the reply after its think block
        self.pos = 0  # text[:pos] is decided
        self._state = "content" if self.spec is None or self.spec["open"] else "json_start"
        self._hold = 0  # where the text held back (maybe a call) starts
        self._committed = False  # ... and whether it has turned out to be a call
        self._json: JSONSpans | None = None
        self._call: _Call | None = None  # the call whose name was written before its JSON arguments
        self._paths: dict[tuple, _Call] = {}  # calls in the JSON value being read, by path
        # what is sent
        self._lead = True  # drop the whitespace that opens the current section
        self._ws = ""  # trailing whitespace held back (sent if more of the section follows)
        self._out: list[dict] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self.calls: list[_Call] = []
        self._args: dict[int, list[str]] = {}

    # -- what the server calls --

    def feed(self, text: str) -> list[dict]:
        if self._phase == "body":
            self.text += text
        else:
            self._head += text
            self._think(final=False)
        self._body(final=False)  # (nothing before the body has begun)
        return self._take()

    def close(self) -> list[dict]:
        if self._phase != "body":
            self._think(final=True)
        self._body(final=True)
        return self._take()

    def message(self) -> dict:
        """The OpenAI assistant message the deltas add up to."""
        msg = {"role": "assistant", "content": "".join(self._content)}
        if self.calls:
            msg["content"] = msg["content"] or None
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": "".join(self._args[c.index])}}
                                 for c in self.calls]
        if self._reasoning:
            msg["reasoning_content"] = "".join(self._reasoning)
        return msg

    def finish_reason(self, engine_reason: str) -> str:
        return "tool_calls" if engine_reason == "stop" and self.calls else engine_reason

    # -- sending --

    def _take(self) -> list[dict]:
        out, self._out = self._out, []
        merged: list[dict] = []
        for d in out:  # neighbours of one kind go in one delta
            last = merged[-1] if merged else None
            if last is not None and d.keys() == last.keys() and "tool_calls" not in d:
                key = next(iter(d))
                last[key] += d[key]
            elif (last is not None and "tool_calls" in d and "tool_calls" in last and "id" not in d["tool_calls"][0]
                  and "id" not in last["tool_calls"][-1]  # a call's first delta: its name, arguments ""
                  and last["tool_calls"][-1]["index"] == d["tool_calls"][0]["index"]):
                last["tool_calls"][-1]["function"]["arguments"] += d["tool_calls"][0]["function"]["arguments"]
            else:
                merged.append(d)
        return merged

    def _send(self, kind: str, text: str, strip: bool) -> None:
        """text as `kind` (content / reasoning_content), without the whitespace that opens a
        section; strip: trailing whitespace waits until more of the section follows."""
        if self._lead:
            text = text.lstrip()
            self._lead = not text
        if not text:
            return
        if strip:
            core = text.rstrip()
            tail = text[len(core):]
            text, self._ws = (self._ws + core, tail) if core else ("", self._ws + tail)
            if not text:
                return
        (self._content if kind == "content" else self._reasoning).append(text)
        self._out.append({kind: text})

    def _content_text(self, text: str) -> None:
        self._send("content", text, strip=self.spec is not None)

    def _section(self) -> None:
        """A section (reasoning, content between calls) ends: its trailing whitespace goes."""
        self._ws = ""
        self._lead = True

    def _show(self, call: _Call) -> None:
        """A call's first delta: index, id, type and name."""
        self._committed = True
        if self.calls and not self.parallel:
            call.dropped = True
            return
        call.shown, call.index = True, len(self.calls)
        self.calls.append(call)
        self._args[call.index] = []
        self._out.append({"tool_calls": [{"index": call.index, "id": call.id, "type": "function",
                                          "function": {"name": call.name, "arguments": ""}}]})

    def _arguments(self, call: _Call, text: str) -> None:
        call.sent += len(text)
        if call.shown and text:
            self._args[call.index].append(text)
            self._out.append({"tool_calls": [{"index": call.index, "function": {"arguments": text}}]})

    # -- <think> --

    def _think(self, final: bool) -> None:
        opening, closing = self._tags
        if self._phase == "start":
            head = self._head.lstrip()
            if head.startswith(opening):
                self._head, self._phase, self._thought = head[len(opening):], "reasoning", True
            elif opening.startswith(head) and not final:
                return  # maybe a think block: wait
            else:
                self._enter_body(self._head, lead=self.spec is not None)
                return
        end = self._head.find(closing)
        if end >= 0:
            self._send("reasoning_content", self._head[:end], strip=True)
            self._enter_body(self._head[end + len(closing):], lead=True)
            return
        keep = 0 if final else _held(self._head, closing)
        self._send("reasoning_content", self._head[:len(self._head) - keep], strip=True)
        self._head = self._head[len(self._head) - keep:]
        if final:
            self._enter_body("", lead=True)

    def _enter_body(self, text: str, lead: bool) -> None:
        self._phase, self._head, self.text = "body", "", text
        self._section()
        self._lead = lead

    # -- the body: content and calls --

    def _body(self, final: bool) -> None:
        if self._phase != "body":
            return
        if self.spec is None:  # no tools: all content, less the markers around the answer
            rest = self.text[self.pos:]
            keep = 0 if final else max((_held(rest, m) for m in self._marks), default=0)
            piece = rest[:len(rest) - keep]
            for m in self._marks:
                piece = piece.replace(m, "")
            self._content_text(piece)
            self.pos = len(self.text) - keep
            return
        if self.whole is not None:  # read when complete
            if final:
                content, calls = parse(self.whole, self.text[self.pos:], self.tools)
                self._content_text(content)
                for c in calls:
                    call = _Call(name=c["function"]["name"])
                    self._show(call)
                    self._arguments(call, c["function"]["arguments"])
                self.pos = len(self.text)
            return
        while self._step(final):
            pass
        if final:
            if self._state in ("content", "plain"):
                self._content_text(self.text[self.pos:])
            elif not self._committed:  # held back, and not a call after all
                self._content_text(self.text[self._hold:])
            self.pos = len(self.text)

    def _hold_from(self, pos: int) -> None:
        self._hold, self._committed = pos, False

    def _step(self, final: bool) -> bool:
        """One move of the body's state machine; False when it waits for more text."""
        spec, text, state = self.spec, self.text, self._state
        if state == "plain":
            self._content_text(text[self.pos:])
            self.pos = len(text)
            return False
        if state == "content":  # content until the marker that opens a call
            marker = spec["open"]
            k = text.find(marker, self.pos)
            if k < 0:
                keep = 0 if final else _held(text[self.pos:], marker)
                self._content_text(text[self.pos:len(text) - keep])
                self.pos = len(text) - keep
                return False
            self._content_text(text[self.pos:k])
            self._section()
            self._hold_from(k)
            self.pos = k + len(marker)
            if spec["name_end"] is not None:
                self._state = "name"
            else:
                self._start_json()
            return True
        if state == "name":
            end = text.find(spec["name_end"], self.pos)
            if end < 0:
                return False
            name = text[self.pos:end].strip()
            self.pos = end + len(spec["name_end"])
            if self.fmt == "functionary" and name == FUNCTIONARY_TEXT:
                self._committed = True
                self._state = "content"
                return True
            self._call = _Call(name=name)
            self._show(self._call)
            self._start_json()
            return True
        if state == "json_start":  # llama3 / generic: a reply that starts with JSON may be calls
            rest = text[self.pos:].lstrip()
            if not final and (not rest or (self.fmt == "llama3" and PYTHON_TAG.startswith(rest))):
                return False
            if self.fmt == "llama3" and rest.startswith(PYTHON_TAG):
                self.pos = text.index(PYTHON_TAG, self.pos) + len(PYTHON_TAG)
                rest = text[self.pos:].lstrip()
            if not rest.startswith("{"):
                self._state = "plain"
                return True
            self._hold_from(self.pos)
            self._start_json()
            return True
        if state == "json":
            return self._json_step(final)
        return self._after(final)

    def _start_json(self) -> None:
        self._json, self._paths, self._state = JSONSpans(self.pos), {}, "json"

    def _json_calls(self) -> list[tuple] | None:
        """The paths of the calls in the JSON value so far; None: the value is no call."""
        j, shape = self._json, self.spec["shape"]
        keys = j.keys.get((), [])
        if shape == "object":
            return [()]
        if shape == "objects":
            return None if keys and keys[0] not in ("name",) + self.spec["args"] else [()]
        if shape == "array":
            return sorted((p for p in j.spans if len(p) == 1 and isinstance(p[0], int)), key=lambda p: p[0])
        if not keys:  # wrapped: decided by the first key
            return []
        if keys[0] == "tool_call":
            return [("tool_call",)]
        if keys[0] == "tool_calls":
            return sorted((p for p in j.spans if len(p) == 2 and p[0] == "tool_calls" and isinstance(p[1], int)),
                          key=lambda p: p[1])
        if keys[0] == "response" and not self.json_answer:
            return [("response",)]
        return None

    def _json_step(self, final: bool) -> bool:
        j, text = self._json, self.text
        j.feed(text)
        if self.spec["shape"] == "value":  # the arguments, after their call's name
            call = self._call
            if () in j.spans:
                self._arguments(call, j.span_text(text, ())[call.sent:])
            elif j.done:  # not JSON
                self._arguments(call, "{}")
        else:
            paths = self._json_calls()
            if paths is None:  # JSON, but no call: content, and what follows it too
                self._content_text(text[self._hold:])
                self._committed, self.pos, self._state = True, len(text), "plain"
                return False
            if paths == [("response",)]:
                if not j.complete(("response",)):
                    return False
                if not self._committed:
                    raw = j.span_text(text, ("response",))
                    value = _decode(raw)
                    self._content_text(value if isinstance(value, str) else raw)
                    self._committed = True
                paths = []
            for p in paths:
                self._update(self._paths.setdefault(p, _Call()), p, final)
        if not j.done:
            return False
        self.pos = j.end if j.end is not None else j.pos
        self._call = None
        self._state = "after"
        return True

    def _update(self, call: _Call, p: tuple, final: bool) -> None:
        """Send what is new of the call at path p of the JSON value."""
        j, text = self._json, self.text
        if call.name is None and j.complete(p + ("name",)):
            name = _decode(j.span_text(text, p + ("name",)))
            call.name = name if isinstance(name, str) else str(name)
        if call.name is None or call.dropped:
            return
        if not call.shown:
            self._show(call)
        key = next((p + (k,) for k in self.spec["args"] if p + (k,) in j.spans), None)
        if key is not None:
            self._arguments(call, j.span_text(text, key)[call.sent:])
        elif j.complete(p) and not call.sent:  # a call without arguments
            self._arguments(call, "{}")

    def _after(self, final: bool) -> bool:
        """After a call's JSON: its closing text; then content, or (llama3) another call."""
        spec, text = self.spec, self.text
        if spec["close"] is not None:
            k = text.find(spec["close"], self.pos)
            if k < 0:
                return False
            self.pos = k + len(spec["close"])
        elif spec["shape"] == "objects":
            rest = text[self.pos:].lstrip(" \t\r\n;")
            if not rest and not final:
                return False
            if rest.startswith("{"):
                self.pos = len(text) - len(rest)
                if not self._committed:
                    self._content_text(text[self._hold:self.pos])
                self._hold_from(self.pos)
                self._start_json()
                return True
        if not self._committed:  # it was not a call: its text is content
            self._content_text(text[self._hold:self.pos])
        self._section()
        self._state = "content" if spec["open"] is not None else "plain"
        return True


class HarmonyReply(Reply):
    """A gpt-oss reply (tool_calls/harmony.py): each message's body streamed as what its header says -
    reasoning_content, content, or a call's arguments as written (its id and name sent when
    its header ends) - messages of one kind joined by a newline. calls: the request has tools."""

    def __init__(self, fmt: ToolFormat, *, calls: bool, parallel: bool = True, **_):
        super().__init__(fmt, parallel=parallel)
        self._split = Split(calls)
        self._kind: str | None = None
        self._said = {"content": False, "reasoning_content": False}  # a message of the kind had text

    def feed(self, text: str) -> list[dict]:
        self._events(self._split.feed(text))
        return self._take()

    def close(self) -> list[dict]:
        self._events(self._split.close())
        return self._take()

    def _events(self, events: list[tuple]) -> None:
        for ev in events:
            if ev[0] == "open":
                self._section()
                self._kind = {"reasoning": "reasoning_content", "content": "content"}.get(ev[1], ev[1])
                if ev[1] == "call":
                    self._call = _Call(name=ev[2])
                    self._show(self._call)
            elif ev[0] == "text" and self._kind == "call":
                self._arguments(self._call, ev[2])
            elif ev[0] == "text" and self._kind in self._said:
                text = ev[2]
                if self._lead:  # a message's first text: after a newline if one of its kind came before
                    text = text.lstrip()
                    if not text:
                        continue
                    self._lead = False
                    text = ("\n" if self._said[self._kind] else "") + text
                    self._said[self._kind] = True
                self._send(self._kind, text, strip=True)


def open_reply(fmt: ToolFormat | None, *, calls: bool, **kw) -> Reply:
    """The reader for a reply in format fmt (None: the template has none); calls: the request
    has tools. kw: Reply's."""
    if fmt is not None and fmt.name == "gpt_oss":
        return HarmonyReply(fmt, calls=calls, **kw)
    return Reply(fmt if calls else None, template=fmt, **kw)
