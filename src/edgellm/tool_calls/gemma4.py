"""Gemma 4's tool calls: <|tool_call>call:name{key:value,...}<tool_call|>, one after another.
Values are Gemma's own notation, as its template writes them: text between <|"|> quotes, numbers,
true / false / null as JSON, {key:value,...} with bare keys and [value,...]; the arguments in
the order of their names (the template sorts them)."""

from __future__ import annotations

import json
import re

from .common import grammar_rules, keyword_arguments, lit

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


def _scan_value(s):
    """The text of the value that starts here, up to a "," or "}" outside its brackets and
    quotes (not read); None where the text ends first."""
    i, depth, quoted = s.pos, 0, False
    while True:
        while i < len(s.text):
            if s.text.startswith(QUOTE, i):
                quoted = not quoted
                i += len(QUOTE)
                continue
            if len(s.text) - i < len(QUOTE) and QUOTE.startswith(s.text[i:]) and not s.final:
                break  # (maybe a quote: wait)
            c = s.text[i]
            if not quoted:
                if c in "[{":
                    depth += 1
                elif c in "]}":
                    if depth == 0:
                        text, s.pos = s.text[s.pos:i], i
                        return text
                    depth -= 1
                elif c == "," and depth == 0:
                    text, s.pos = s.text[s.pos:i], i
                    return text
            i += 1
        if s.final:
            return None
        yield


def _arguments(s):
    """A call's arguments, after its "{", sent as JSON as each is read; whether they ended ("}")."""
    s.args("{")
    first = True
    while not (yield from s.opens("}")):
        if not first and not (yield from s.opens(",")):
            return False
        key = yield from s.until(":", limit=100)
        raw = None if key is None else (yield from _scan_value(s))
        if raw is None:
            return False
        try:
            (k, value), end = _pair(key[0] + ":" + raw, 0)
        except (ValueError, IndexError):
            return False
        if raw[end - len(key[0]) - 1:].strip():
            return False
        s.args(("" if first else ", ") + json.dumps(k, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False))
        first = False
    s.args("}")
    return True


def read(name: str, s, tools):
    """The reader of a reply's body (scan.py): each call between its markers."""
    if tools is None:
        return (yield from s.rest())
    while (yield from s.content_until(OPEN)) is not None:
        start = s.pos - len(OPEN)
        got = yield from s.until("{", limit=100)
        fn = got[0].strip() if got is not None else ""
        if not fn or any(c in fn for c in "<>{}[],:"):
            s.release(start)
            continue
        s.call(fn)
        if (yield from _arguments(s)) and (yield from s.opens(CLOSE, ws=False)):
            s.end()
        else:
            s.cut()


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
    rules: dict[str, str] = {}
    one = " | ".join(f"({lit(OPEN + t['function']['name'] + '{')}{keyword_arguments(t, ':', ',', _typed, rules, f'args{i}', sorted)} "
                     f"{lit('}' + CLOSE)})" for i, t in enumerate(tools))
    return f"start: one{' one*' if parallel else ''}\none: {one}{grammar_rules(rules)}{_RULES}"
