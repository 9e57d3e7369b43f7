"""OpenAI's harmony format (gpt-oss): a reply is a run of messages, each a header, <|message|>,
then its body up to <|end|> (the next one opens with <|start|>assistant; the prompt already wrote
the first one's). The header names the channel and, for a tool call, the recipient:

    <|channel|>analysis<|message|>thinking...<|end|>                  -> reasoning_content
    <|start|>assistant<|channel|>final<|message|>the answer            -> content
    <|channel|>commentary<|message|>a preamble<|end|>                  -> content
    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}   -> a call of NAME
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}   (the same call,
                                                                        as the template writes it)

<|call|> and <|return|> end the reply (they end generation, so they are rarely in the text). A
message to another recipient (a built-in tool), or any call where the request has no tools, is
dropped, as llama.cpp's gpt-oss parser drops it. Text that is no message header is content as
written.

Split reads the text in pieces as it streams and says what each piece is; read turns that into
what scan.py's reader of every format says.
"""

from __future__ import annotations

import re

from .common import dump, json_rule, lit, per_tool

START, END, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|end|>", "<|channel|>", "<|message|>", "<|constrain|>"
STOPS = ("<|return|>", "<|call|>")
FUNCTIONS = "functions."
# what the model writes for a call (the grammar that forces one writes it so), before the arguments
CALL_HEAD = (CHANNEL + "commentary to=" + FUNCTIONS, " " + CONSTRAIN + "json" + MESSAGE)
ANALYSIS = CHANNEL + "analysis" + MESSAGE
FINAL = CHANNEL + "final" + MESSAGE  # the answer's message
_BODY_ENDS = (END,) + STOPS  # (what ends a message)
_HEADER = re.compile(r"\s*(?:<\|start\|>)?\s*(?:assistant)?\s*(?:to=(?P<r1>[^\s<]+))?\s*<\|channel\|>(?P<channel>[\w-]+)"
                     r"\s*(?:to=(?P<r2>[^\s<]+))?\s*(?:<\|constrain\|>)?\s*[\w-]*\s*", re.S)
_LEAD = re.compile(r"\s*(?:<\|start\|>)?\s*(?:assistant)?\s*")
_MAX_HEADER = 200  # characters: a header no longer than this, else the text is no message


def _held(text: str) -> int:
    """How many trailing characters of text could begin a marker that ends a body."""
    for k in range(min(max(map(len, _BODY_ENDS)) - 1, len(text)), 0, -1):
        if any(m.startswith(text[-k:]) for m in _BODY_ENDS):
            return k
    return 0


def _may_be_header(head: str) -> bool:
    """Whether head may still grow into a message header."""
    if len(head) > _MAX_HEADER or END in head:
        return False
    if any(lead.startswith(head.lstrip()) for lead in (START + "assistant", "assistant")):
        return True
    rest = head[_LEAD.match(head).end():]
    return any(rest.startswith(m) or m.startswith(rest) for m in (CHANNEL, "to="))


class Split:
    """Reads a harmony reply as it grows. feed(text) and close() return events:

        ("open", kind, name, header)   a message begins: kind "reasoning", "content", "call" (name:
                                       the tool's) or "drop"; header: its text, up to <|message|>
        ("text", kind, text)           more of the open message's body
        ("close",)                     it ended

    Text that is no message header (and all after it) is one "content" message, as written.
    calls: the request has tools (a call to a function is one)."""

    def __init__(self, calls: bool):
        self.calls = calls
        self.buf, self.pos = "", 0
        self.state = "header"  # -> "body" -> "header" ...; or "plain" for good
        self.kind: str | None = None

    def feed(self, text: str) -> list[tuple]:
        self.buf += text
        return self._read(final=False)

    def close(self) -> list[tuple]:
        out = self._read(final=True)
        if self.state == "body":
            out.append(("close",))
        return out

    def _kind(self, m: re.Match) -> tuple[str, str | None]:
        recipient = m.group("r1") or m.group("r2")
        if recipient:
            if self.calls and recipient.startswith(FUNCTIONS) and len(recipient) > len(FUNCTIONS):
                return "call", recipient[len(FUNCTIONS):]
            return "drop", None
        return ("reasoning" if m.group("channel") == "analysis" else "content"), None

    def _read(self, final: bool) -> list[tuple]:
        out: list[tuple] = []
        while True:
            rest = self.buf[self.pos:]
            if self.state == "plain":
                if rest:
                    out.append(("text", "content", rest))
                self.pos = len(self.buf)
                return out
            if self.state == "header":
                k = rest.find(MESSAGE)
                m = _HEADER.fullmatch(rest[:k]) if k >= 0 else None
                if m is None:
                    if not rest.strip() or (k < 0 and not final and _may_be_header(rest)):
                        if final:
                            self.pos = len(self.buf)
                        return out  # (nothing, or a header still being written)
                    self.state, self.kind = "plain", "content"
                    out.append(("open", "content", None, ""))
                    continue
                self.kind, name = self._kind(m)
                out.append(("open", self.kind, name, rest[:k]))
                self.pos += k + len(MESSAGE)
                self.state = "body"
                continue
            ends = [(i, e) for e in _BODY_ENDS if (i := rest.find(e)) >= 0]
            if ends:
                i, e = min(ends)
                if i:
                    out.append(("text", self.kind, rest[:i]))
                out.append(("close",))
                self.pos += i + len(e)
                self.state = "header"
                continue
            keep = 0 if final else _held(rest)
            if len(rest) > keep:
                out.append(("text", self.kind, rest[:len(rest) - keep]))
            self.pos += len(rest) - keep
            return out


def read(name: str, s, tools):
    """The reader of a reply's body (scan.py): each message's body as what its header says -
    reasoning, content, or a call's arguments as written (complete when the message ends) -, a
    message a stretch of its kind's text (so messages of one kind are joined by a newline)."""
    split, seen, kind = Split(tools is not None), 0, None
    while True:
        events = split.feed(s.text[seen:])
        seen = s.pos = len(s.text)
        if s.final:
            events += split.close()
        for ev in events:
            if ev[0] == "open":
                s.stretch()
                kind = ev[1]
                if kind == "call":
                    s.call(ev[2])
            elif ev[0] == "text" and kind == "call":
                s.args(ev[2])
            elif ev[0] == "text" and kind in ("content", "reasoning"):
                s.say(ev[2], kind)
            elif ev[0] == "close" and kind == "call":
                s.end()
        if s.final:
            return
        yield


def markers(name: str) -> tuple[str, ...]:
    """The markers every reply's messages are read by, tools or not (formats.preserved_markers)."""
    return START, CHANNEL, CONSTRAIN, MESSAGE, END


def write(name: str, calls: list[dict]) -> str:
    """Calls ({"name", "arguments"}) as the model writes them, each its own message."""
    return (STOPS[1] + START + "assistant").join(CALL_HEAD[0] + c["name"] + CALL_HEAD[1] + dump(c["arguments"]) for c in calls)


def _after_analysis(body: str, tools: list[dict] | None = None) -> str:
    """A Lark grammar: maybe an analysis message, then body (with `call`: a call of one of tools)."""
    analysis = re.escape(ANALYSIS).replace("/", "\\/") + "([^<]|<[^|])*" + re.escape(END)
    call = f"\ncall: {per_tool(tools, *CALL_HEAD)}" if tools else ""
    return f"start: (HARMONY_ANALYSIS {lit(START + 'assistant')})? {body}{call}\nHARMONY_ANALYSIS: /{analysis}/"


def grammar(name: str, tools: list[dict], parallel: bool) -> str:
    """One call, maybe after an analysis message (a call ends the reply: never several)."""
    return _after_analysis("call", tools)


def answer_grammar(schema: dict) -> str:
    """The answer as JSON of `schema`, in the final channel (maybe after an analysis)."""
    return _after_analysis(f"{lit(FINAL)} {json_rule(schema)}")


def call_or_answer_grammar(tools: list[dict], schema: dict) -> str:
    return _after_analysis(f"(call | {lit(FINAL)} {json_rule(schema)})", tools)
