"""Gemma 4's tool calls: <|tool_call>call:name{key:value,...}<tool_call|>, one after another.
Values are Gemma's own notation, as its template writes them: text between <|"|> quotes, numbers,
true / false / null as JSON, {key:value,...} with bare keys and [value,...]; the arguments in
the order of their names (the template sorts them)."""

from __future__ import annotations

import json
import re

from .common import keyword_arguments, lit, make_call

OPEN, CLOSE, QUOTE = "<|tool_call>call:", "<tool_call|>", '<|"|>'
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_LITERAL = re.compile(rf"\s*({_NUMBER}|true|false|null)")
_KEY = re.compile(r"\s*([^:{}\[\],<]+?)\s*:")


def markers(name: str) -> tuple[str, ...]:
    return OPEN, CLOSE, QUOTE


def _text(value) -> str:
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_text(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return json.dumps(value)


def write(name: str, calls: list[dict]) -> str:
    return "".join(OPEN + c["name"] + _text(c["arguments"] if isinstance(c["arguments"], dict) else {}) + CLOSE
                   for c in calls)


def _skip_space(s: str, i: int) -> int:
    while i < len(s) and s[i].isspace():
        i += 1
    return i


def _value(s: str, i: int):
    """(the value at s[i:], where it ends); ValueError where there is none."""
    i = _skip_space(s, i)
    if s.startswith(QUOTE, i):
        j = s.index(QUOTE, i + len(QUOTE))
        return s[i + len(QUOTE):j], j + len(QUOTE)
    if s.startswith("{", i):
        pairs, end = _items(s, i + 1, "}", _pair)
        return dict(pairs), end
    if s.startswith("[", i):
        return _items(s, i + 1, "]", _value)
    m = _LITERAL.match(s, i)
    if not m:
        raise ValueError(f"no value at {i}")
    return json.loads(m.group(1)), m.end()


def _items(s: str, i: int, close: str, item):
    """The comma-separated items from s[i:] (just past the opening bracket) up to `close`, each
    read by item(s, i) -> (item, end): (the items, where the sequence ends)."""
    out = []
    while True:
        i = _skip_space(s, i)
        if s.startswith(close, i):
            return out, i + 1
        if out:
            if not s.startswith(",", i):
                raise ValueError(f"expected , or {close}")
            i += 1
        v, i = item(s, i)
        out.append(v)


def _pair(s: str, i: int):
    """((key, value), where it ends) at s[i:]: a bare or quoted key, then its value."""
    m = _KEY.match(s, i)
    if not m:
        raise ValueError(f"no key at {i}")
    key = m.group(1)
    key = key[len(QUOTE):-len(QUOTE)] if key.startswith(QUOTE) and key.endswith(QUOTE) else key
    value, end = _value(s, m.end())
    return (key, value), end


def parse(name: str, text: str, tools) -> tuple[str, list[dict]] | None:
    """(content, calls); None without a call (one that does not read raises ValueError)."""
    calls, spans, i = [], [], text.find(OPEN)
    while i >= 0:
        brace = text.index("{", i)
        args, end = _value(text, brace)  # text[brace] is "{": a dict
        if not text.startswith(CLOSE, end):
            raise ValueError("a call without its end")
        calls.append(make_call(text[i + len(OPEN):brace].strip(), args))
        spans.append((i, end + len(CLOSE)))
        i = text.find(OPEN, end)
    if not calls:
        return None
    return text[:spans[0][0]].strip() + text[spans[-1][1]:].strip(), calls


# -- forcing a call: each argument typed by its schema where the notation can say it ------------------

_RULES = f"""
gvalue: GSTR | gdict | garray | GNUMBER | "true" | "false" | "null"
gdict: "{{" (GKEY ":" gvalue ("," GKEY ":" gvalue)*)? "}}"
garray: "[" (gvalue ("," gvalue)*)? "]"
GSTR: /{re.escape(QUOTE)}([^<]|<[^|])*{re.escape(QUOTE)}/
GKEY: /[A-Za-z_][A-Za-z0-9_]*/
GNUMBER: /{_NUMBER}/
GINT: /-?(0|[1-9][0-9]*)/"""


def _typed(schema) -> str:
    kind = schema.get("type") if isinstance(schema, dict) else None
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum):
        return "(" + " | ".join(lit(QUOTE + e + QUOTE) for e in enum) + ")"
    return {"string": "GSTR", "integer": "GINT", "number": "GNUMBER", "boolean": '("true" | "false")',
            "object": "gdict", "array": "garray"}.get(kind, "gvalue")


def grammar(name: str, tools: list[dict], parallel: bool) -> str:
    # (the arguments in the order of their names, as the template sorts them)
    one = " | ".join(f"({lit(OPEN + t['function']['name'] + '{')}{keyword_arguments(t, ':', ',', _typed, sorted)} "
                     f"{lit('}' + CLOSE)})" for t in tools)
    return f"start: one{' one*' if parallel else ''}\none: {one}{_RULES}"
