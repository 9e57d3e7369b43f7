"""Muse Glimmer's format: a reply is a run of messages, each " to=RECIPIENT<|message|>" and its
body, ended by <|eom|> (another message follows, opened with <|start|>assistant) or <|eot|> (the
turn's end, which ends generation; the prompt already wrote the first message's
<|start|>assistant):

    to=self<|message|>thinking...<|eom|>                        -> reasoning_content
    <|start|>assistant to=user<|message|>the answer<|eot|>       -> content (also without " to=user")
    <|start|>assistant to=NAME<|message|><atem:function_calls>
    <atem:invoke name="NAME">
    <atem:parameter name="key">value</atem:parameter>
    </atem:invoke>
    </atem:function_calls><|eom|>                               -> a call of NAME (its arguments XML: xml.py's
                                                                   "muse_glimmer", a text value as written)

as llama.cpp's common/parsers/muse-glimmer.cpp reads it. A message to a tool where the request
has no tools is dropped; text that is no message header is content as written.
"""

from __future__ import annotations

import re

from . import xml
from .common import lit

START, MESSAGE, EOM, EOT = "<|start|>", "<|message|>", "<|eom|>", "<|eot|>"
ASSISTANT = START + "assistant"
SELF, USER = "self", "user"
_NAME = "muse_glimmer"  # (xml.py's name of its calls)
_HEADER = re.compile(r"\s*(?:to=(\S+))?\s*")


def markers(name: str) -> tuple[str, ...]:
    """The markers every reply's messages are read by, tools or not (formats.preserved_markers)."""
    return (START, MESSAGE, EOM) + xml.markers(_NAME)


def _message(recipient: str, body: str) -> str:
    return f" to={recipient}{MESSAGE}{body}"


def write(name: str, calls: list[dict]) -> str:
    """Calls ({"name", "arguments"}) as the model writes them, each its own message."""
    return (EOM + ASSISTANT).join(_message(c["name"], xml.write(_NAME, [c])) for c in calls)


def grammar(name: str, tools: list[dict], parallel: bool) -> str:
    """A call (several with `parallel`, each its own message), maybe after a reasoning message."""
    block = xml.XML_BLOCK[_NAME]
    reasoning = re.escape(_message(SELF, "")).replace("/", "\\/") + "([^<]|<[^|])*" + re.escape(EOM + ASSISTANT)
    more = f" ({lit(EOM + ASSISTANT)} one)*" if parallel else ""
    rules = xml.call_rules(_NAME, tools, lambda t: (_message(t["function"]["name"], block[0]), block[1]))
    return f"start: MUSE_REASONING? one{more}\n{rules}\nMUSE_REASONING: /{reasoning}/"


def read(name: str, s, tools):
    """The reader of a reply's body (scan.py): each message's body as its recipient says, a
    message a stretch of its kind's text."""
    by_name = {t["function"]["name"]: t for t in tools or ()}
    block = xml.XML_BLOCK[_NAME][0].strip()
    while True:
        at = s.pos
        yield from s.opens(ASSISTANT)  # (the first message's is in the prompt)
        got = yield from s.until(MESSAGE)
        header = _HEADER.fullmatch(got[0]) if got is not None else None
        if header is None:  # no message: content as written
            s.pos = at
            return (yield from s.rest())
        recipient = header.group(1) or USER
        s.stretch()
        if recipient in (SELF, USER):
            end = yield from s.content_until(EOM, EOT, kind="reasoning" if recipient == SELF else "content")
        elif tools is not None and (yield from s.opens(block)):
            yield from xml.read_calls(_NAME, s, by_name)
            end = yield from s.content_until(EOM, EOT)  # (what follows the call in its message)
        else:  # a message to a tool the request did not give: dropped
            got = yield from s.until(EOM, EOT, limit=1 << 62)
            end = got[1] if got is not None else None
            s.pos = len(s.text) if got is None else s.pos
        if end != EOM:
            return (yield from s.rest())
