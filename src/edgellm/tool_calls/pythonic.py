"""LFM2's tool calls: Python calls in a list between markers,

    <|tool_call_start|>[get_weather(city="Paris", unit="C"), get_time(zone='CET')]<|tool_call_end|>

keyword arguments only, values Python literals or JSON ones (true, false, null), as llama.cpp's
LFM2 parser reads them. The text is parsed with Python's own parser (ast), never run.
"""

from __future__ import annotations

import ast
import json

from .common import json_rule, keyword_arguments, lit, make_call

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


def read(body: str) -> list[tuple[str, dict]]:
    """[(name, arguments)] of the calls in `body` (the text between the markers, brackets and
    all); ValueError where it is not a list of calls with keyword arguments and literal values."""
    if len(body) > _MAX_TEXT:
        raise ValueError("tool calls too long to read")
    try:
        tree = ast.parse(body.strip(), mode="eval").body
        if not isinstance(tree, ast.List):
            raise ValueError("not a list of calls")
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args or \
                    any(kw.arg is None for kw in node.keywords):
                raise ValueError("not a call with keyword arguments")
            calls.append((node.func.id, {kw.arg: _value(kw.value) for kw in node.keywords}))
        return calls
    except (SyntaxError, RecursionError, MemoryError, TypeError) as exc:
        raise ValueError(f"not a list of calls: {exc}") from None


def parse(name: str, text: str, tools) -> tuple[str, list[dict]] | None:
    """(content, calls) of a reply; None without the markers."""
    i = text.find(OPEN)
    j = text.find(CLOSE, i)
    if i < 0 or j < 0:
        return None
    calls = [make_call(n, args) for n, args in read(text[i + len(OPEN):j])]
    return text[:i].strip() + text[j + len(CLOSE):].strip(), calls


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
    """A Lark grammar admitting one call of `tools` (several with `parallel`)."""
    one = " | ".join(f"({lit(t['function']['name'] + '(')}{keyword_arguments(t, '=', ', ', _json_value)} {lit(')')})"
                     for t in tools)
    more = f" ({lit(', ')} one)*" if parallel else ""
    return f"start: {lit(OPEN + '[')} one{more} {lit(']' + CLOSE)}\none: {one}"
