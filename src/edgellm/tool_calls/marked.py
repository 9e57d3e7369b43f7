"""The formats whose calls are JSON after a marker (and before an end marker, if any)."""

from __future__ import annotations

import json

from .common import dump, json_rule, json_values, lit, make_call, parameters

# name -> (opening, closing, layout: "array" - one JSON array -, "lines" - an object a line - or
# "one" - one call, each after its own opening -, a call's (name key, arguments key, numbering
# key or None), or None where a call is {name: arguments})
MARKED = {
    "mistral": ("[TOOL_CALLS]", "", "array", ("name", "arguments", None)),
    "granite": ("<|tool_call|>", "", "array", ("name", "arguments", None)),
    "command_r7b": ("<|START_ACTION|>", "<|END_ACTION|>", "array", ("tool_name", "parameters", "tool_call_id")),
    "nemotron_v2": ("<TOOLCALL>", "</TOOLCALL>", "array", ("name", "arguments", None)),
    "apriel": ("<tool_calls>", "</tool_calls>", "array", ("name", "arguments", None)),
    "minimax_m1": ("<tool_calls>\n", "\n</tool_calls>", "lines", ("name", "arguments", None)),
    "apertus": ("<|tools_prefix|>", "<|tools_suffix|>", "array", None),
    "firefunction_v2": ("functools", "", "array", ("name", "arguments", None)),
    "command_r_plus": ("Action:\n```json\n", "```", "array", ("tool_name", "parameters", None)),
    "gigachat_v3": ("<|message_sep|>\n\nfunction call<|role_sep|>\n", "", "one", ("name", "arguments", None)),
    "gigachat_v31": ("<|function_call|>", "", "one", ("name", "arguments", None)),
}


def markers(name: str) -> tuple[str, ...]:
    """The texts around format `name`'s calls (formats.preserved_markers)."""
    return tuple(m for m in MARKED[name][:2] if m)


def _item(name: str, i: int, call: dict) -> dict:
    """Call number i ({"name", "arguments"}) as format `name` writes it."""
    keys = MARKED[name][3]
    if keys is None:
        return {call["name"]: call["arguments"]}
    name_key, args_key, number_key = keys
    return {**({number_key: str(i)} if number_key else {}), name_key: call["name"], args_key: call["arguments"]}


def _schema(name: str, tool: dict) -> dict:
    """The JSON schema of a call of `tool` in format `name`."""
    keys, fn = MARKED[name][3], tool["function"]["name"]
    if keys is None:
        return {"type": "object", "properties": {fn: parameters(tool)}, "required": [fn], "additionalProperties": False}
    name_key, args_key, number_key = keys
    props = {**({number_key: {"type": "string"}} if number_key else {}), name_key: {"const": fn}, args_key: parameters(tool)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def write(name: str, calls: list[dict]) -> str:
    opening, closing, layout, _ = MARKED[name]
    items = [dump(_item(name, i, c)) for i, c in enumerate(calls)]
    if layout == "one":
        return "".join(opening + item + closing for item in items)
    return opening + ("[" + ", ".join(items) + "]" if layout == "array" else "\n".join(items)) + closing


def grammar(name: str, tools: list[dict], parallel: bool) -> str:
    opening, closing, layout, _ = MARKED[name]
    items = {"anyOf": [_schema(name, t) for t in tools]}
    end = f" {lit(closing)}" if closing else ""
    if layout in ("lines", "one"):
        more = f" ({lit(chr(10))} one)*" if parallel and layout == "lines" else ""
        return f"start: {lit(opening)} one{more}{end}\none: {json_rule(items)}"
    array = json_rule({"type": "array", "items": items, "minItems": 1, **({} if parallel else {"maxItems": 1})})
    return f"start: {lit(opening)} {array}{end}"


def parse(name: str, text: str, tools) -> tuple[str, list[dict]] | None:
    """(content, calls); None without the markers (a JSON error or a call of another shape raises)."""
    opening, closing, layout, keys = MARKED[name]
    i = text.find(opening)
    j = text.find(closing, i + len(opening)) if closing else len(text)
    if i < 0 or j < 0:
        return None
    body = text[i + len(opening):j]
    if layout == "one":  # (each call after its opening)
        items = [json.loads(part) for part in body.split(opening)]
    else:
        items = json.loads(body) if layout == "array" else json_values(body)
    if keys is None:  # {name: arguments}
        if not all(isinstance(v, dict) and len(v) == 1 for v in items):
            raise TypeError("a call is one name")
        calls = [make_call(*next(iter(v.items()))) for v in items]
    else:
        calls = [make_call(v[keys[0]], v.get(keys[1], {})) for v in items]
    return text[:i].strip() + text[j + len(closing):].strip(), calls  # (as the server streams it)
