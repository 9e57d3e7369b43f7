"""An assistant reply read as it streams, into OpenAI's deltas and message: a leading <think>...
</think> (a format's own reasoning markers: Command R7B's <|START_THINKING|>...) becomes
`reasoning_content` (llama.cpp's --reasoning-format deepseek), the calls written in the format
(its family's reader, scan.py) become `tool_calls` - a call's id and name as soon as its name is
written, then its arguments in fragments - and the rest is `content`.

    reply = open_reply(fmt, calls=turn.tools, thinking=turn.thinking, tools=turn.usable)
    for text in pieces:                 # the engine's text, in any pieces
        deltas = reply.feed(text)       # [{"content": ...} | {"reasoning_content": ...} | {"tool_calls": [...]}]
    deltas = reply.close()              # what was held back
    reply.message(), reply.finish_reason(engine_reason)

A whole reply is read the same way (one feed: ChatTurn.message, the server's non-streamed
answer), and the message is what the deltas add up to, so a streamed reply assembles into exactly
the non-streamed one whatever the pieces. Arguments are the model's own JSON text where the format
writes JSON (as OpenAI returns them), not re-serialised; a call cut short (max_tokens) keeps the
arguments written so far, and finish_reason says "length".

Without tools the content is the model's text as written (less a leading think block and the
format's answer marks); with tools it is stripped around calls.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from .common import ToolFormat, make_call
from .formats import always_read, answer_marks, reader, reasoning_tags, unmarked
from .scan import Scan, held


@dataclass
class _Call:
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])
    name: str = ""
    index: int = -1  # in the reply's tool_calls; -1 when dropped (a second call when parallel_tool_calls is false)
    args: list[str] = field(default_factory=list)


def body_scan(fmt: ToolFormat | None, *, calls: bool, tools=(), json_answer: bool = False, lead: bool = True) -> Scan:
    """The reader of a reply's body in format fmt (None: the template has none); calls: the
    request has tools, so calls are read (gpt-oss's messages are read either way)."""
    marks = answer_marks(fmt)
    if not calls and not always_read(fmt):
        return Scan(lambda s: s.rest(), drop=marks, strip=False, lead=lead)
    return Scan(reader(fmt, list(tools) if calls else None), drop=marks, json_answer=json_answer)


class Reply:
    """One choice's reply (see the module docstring). fmt: the template's tool-call format;
    calls: the request has tools; thinking: the prompt opened a reasoning block; json_answer: the
    answer is constrained JSON (the generic format's {"response": ...} is then an answer like any
    other); parallel: more than one call allowed (OpenAI's parallel_tool_calls; later calls are
    dropped); tools: the request's (they type the XML formats' arguments)."""

    def __init__(self, fmt: ToolFormat | None, *, calls: bool, thinking: bool = False, json_answer: bool = False,
                 parallel: bool = True, tools=()):
        self._scan_args = dict(fmt=fmt, calls=calls, tools=tools, json_answer=json_answer)
        self.parallel = parallel
        self._tags = None if always_read(fmt) else reasoning_tags(fmt)  # (gpt-oss: its channels)
        self._phase = "reasoning" if thinking and self._tags else "start"  # -> "body"
        self._head = ""
        self._scan: Scan | None = None
        self._calls_read = calls
        if self._tags is None:
            self._enter_body("", lead=True)
        self._out: list[dict] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self.calls: list[_Call] = []
        self._call: _Call | None = None  # the call whose arguments are being read
        self._think_ws = ""  # reasoning's trailing whitespace, held back until more of it follows
        self._think_lead = True  # the reasoning's leading whitespace goes

    # -- what the server calls --

    def feed(self, text: str) -> list[dict]:
        if self._phase == "body":
            self._events(self._scan.feed(text))
        else:
            self._head += text
            self._think(final=False)
        return self._take()

    def close(self) -> list[dict]:
        if self._phase != "body":
            self._think(final=True)
        self._events(self._scan.close())
        return self._take()

    def message(self) -> dict:
        """The OpenAI assistant message the deltas add up to."""
        msg = {"role": "assistant", "content": "".join(self._content)}
        if self.calls:
            msg["content"] = msg["content"] or None
            msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": "".join(c.args)}}
                                 for c in self.calls]
        if self._reasoning:
            msg["reasoning_content"] = "".join(self._reasoning)
        return msg

    def finish_reason(self, engine_reason: str) -> str:
        return "tool_calls" if engine_reason == "stop" and self.calls else engine_reason

    # -- the events of the body --

    def _events(self, events: list[tuple]) -> None:
        for ev in events:
            kind = ev[0]
            if kind == "content":
                self._content.append(ev[1])
                self._out.append({"content": ev[1]})
            elif kind == "reasoning":
                self._reasoning.append(ev[1])
                self._out.append({"reasoning_content": ev[1]})
            elif kind == "call":
                self._call = _Call(name=ev[1])
                if self.calls and not self.parallel:
                    continue
                self._call.index = len(self.calls)
                self.calls.append(self._call)
                self._out.append({"tool_calls": [{"index": self._call.index, "id": self._call.id, "type": "function",
                                                  "function": {"name": self._call.name, "arguments": ""}}]})
            elif kind == "args":
                if self._call.index >= 0:
                    self._call.args.append(ev[1])
                    self._out.append({"tool_calls": [{"index": self._call.index, "function": {"arguments": ev[1]}}]})

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

    # -- <think> --

    def _reason(self, text: str) -> None:
        """Reasoning text, stripped at both ends of the block."""
        if self._think_lead:
            text = text.lstrip()
            self._think_lead = not text
        core = text.rstrip()
        text, self._think_ws = (self._think_ws + core, text[len(core):]) if core else ("", self._think_ws + text)
        if text:
            self._reasoning.append(text)
            self._out.append({"reasoning_content": text})

    def _think(self, final: bool) -> None:
        opening, closing = self._tags
        if self._phase == "start":
            head = self._head.lstrip()
            if head.startswith(opening):
                self._head, self._phase = head[len(opening):], "reasoning"
            elif opening.startswith(head) and not final:
                return  # maybe a think block: wait
            else:
                self._enter_body(self._head, lead=self._calls_read)
                return
        end = self._head.find(closing)
        if end >= 0:
            self._reason(self._head[:end])
            self._enter_body(self._head[end + len(closing):], lead=True)
            return
        keep = 0 if final else held(self._head, 0, (closing,))
        self._reason(self._head[:len(self._head) - keep])
        self._head = self._head[len(self._head) - keep:]
        if final:
            self._enter_body("", lead=True)

    def _enter_body(self, text: str, lead: bool) -> None:
        self._phase, self._head = "body", ""
        self._scan = body_scan(**self._scan_args, lead=lead)
        if text:
            self._events(self._scan.feed(text))


def open_reply(fmt: ToolFormat | None, *, calls: bool, **kw) -> Reply:
    """The reader for a reply in format fmt (None: the template has none); calls: the request
    has tools. kw: Reply's."""
    return Reply(fmt, calls=calls, **kw)


def _object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def parse(fmt: ToolFormat, text: str, tools: list[dict] | None = None) -> tuple[str, list[dict]]:
    """(content, tool_calls) of a complete reply's body in format `fmt`, read as its stream is:
    where a call is cut short or malformed (its markers not closed, its arguments no JSON object)
    there is none, and the text is content (less the format's answer marks). tools: the request's,
    which say which XML argument values are text."""
    scan = body_scan(fmt, calls=True, tools=tools or ())
    content, calls = [], []
    for ev in scan.feed(text) + scan.close():
        if ev[0] == "content":
            content.append(ev[1])
        elif ev[0] == "call":
            calls.append([ev[1], ""])
        elif ev[0] == "args":
            calls[-1][1] += ev[1]
    if scan.open_calls or not all(_object(args) for _, args in calls):
        return unmarked(fmt, text).strip(), []
    return "".join(content), [make_call(name, args) for name, args in calls]
