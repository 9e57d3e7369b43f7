"""LFM2's tool calls: Python calls in a list between markers,

    <|tool_call_start|>[get_weather(city="Paris", unit="C"), get_time(zone='CET')]<|tool_call_end|>

keyword arguments only, values Python literals or JSON ones (true, false, null), as llama.cpp's
LFM2 parser reads them. The text is parsed with Python's own parser (ast), never run.
"""

from __future__ import annotations

import ast
import json

from .common import grammar_rules, json_rule, keyword_arguments, lit

OPEN, CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"
_JSON_WORDS = {"true": True, "false": False, "null": None}
_MAX_TEXT = 100_000  # characters of calls read at most (the parser's work grows with the text)


def _value(node: ast.AST):
    if isinstance(node, ast.Name) and node.id in _JSON_WORDS:
        return _JSON_WORDS[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def _literal(text: str):
    """The value of a Python literal's text (JSON's true / false / null too); ValueError where it is
    none (or text is None)."""
    if text is None or len(text) > _MAX_TEXT:
        raise ValueError("a value too long to read")
    try:
        return _value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, RecursionError, MemoryError, TypeError) as exc:
        raise ValueError(f"not a literal: {exc}") from None


def _scan_literal(s):
    """The text of the literal that starts here, up to a "," or ")" outside its brackets and
    quotes (not read); None where the text ends first, or the literal is too long."""
    i, depth, quote, escaped = s.pos, 0, None, False
    while True:
        while i < len(s.text):
            c = s.text[i]
            if quote is not None:
                if escaped:
                    escaped = False
                elif c == "\\":
                    escaped = True
                elif c == quote:
                    quote = None
            elif c in "'\"":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                break
            i += 1
            if i - s.pos > _MAX_TEXT:
                return None
        if i < len(s.text):
            text, s.pos = s.text[s.pos:i], i
            return text
        if s.final:
            return None
        yield


def _arguments(s):
    """A call's keyword arguments, after its "(", sent as JSON as each is read; whether the call
    ended (its ")")."""
    s.args("{")
    first = True
    while not (yield from s.opens(")")):
        if not first and not (yield from s.opens(",")):
            return False
        if not first and (yield from s.opens(")")):  # (a trailing comma)
            break
        key = yield from s.until("=", limit=100)
        if key is None or not key[0].strip().isidentifier():
            return False
        raw = yield from _scan_literal(s)
        try:
            value = json.dumps(_literal(raw), ensure_ascii=False)
        except (ValueError, TypeError):  # (no literal; text ended; a dict with keys JSON has not)
            return False
        s.args(("" if first else ", ") + json.dumps(key[0].strip()) + ": " + value)
        first = False
    s.args("}")
    return True


def read(name: str, s, tools):
    """The reader of a reply's body (scan.py): [name(key=value, ...), ...] between the markers."""
    if tools is None:
        return (yield from s.rest())
    while (yield from s.content_until(OPEN)) is not None:
        start, begun, ok = s.pos - len(OPEN), 0, False
        if (yield from s.opens("[")):
            while True:
                got = yield from s.until("(", limit=100)
                if got is None or not got[0].strip().isidentifier():
                    break
                s.call(got[0].strip())
                begun += 1
                if not (yield from _arguments(s)):
                    break
                if (yield from s.opens(",")):
                    continue
                ok = (yield from s.opens("]")) and (yield from s.opens(CLOSE))
                break
        if begun:
            s.end() if ok else s.cut()
        else:
            s.release(start)


def markers(name: str) -> tuple[str, ...]:
    return OPEN, CLOSE


def write(name: str, calls: list[dict]) -> str:
    """Calls ({"name", "arguments"}) as the model writes them (values as JSON, as the grammar has them)."""
    one = [c["name"] + "(" + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in c["arguments"].items()) + ")"
           for c in calls]
    return OPEN + "[" + ", ".join(one) + "]" + CLOSE


def _json_value(schema) -> str:
    return json_rule(schema if isinstance(schema, dict) else {})


def grammar(name: str, tools: list[dict], parallel: bool) -> str:
    """A Lark grammar admitting one call of `tools` (several with `parallel`), its keyword
    arguments in any order."""
    rules: dict[str, str] = {}
    one = " | ".join(f"({lit(t['function']['name'] + '(')}{keyword_arguments(t, '=', ', ', _json_value, rules, f'args{i}')} "
                     f"{lit(')')})" for i, t in enumerate(tools))
    more = f" ({lit(', ')} one)*" if parallel else ""
    return f"start: {lit(OPEN + '[')} one{more} {lit(']' + CLOSE)}\none: {one}{grammar_rules(rules)}"
