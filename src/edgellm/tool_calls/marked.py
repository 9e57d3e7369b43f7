"""The formats whose calls are JSON after a marker (and before an end marker, if any)."""

from __future__ import annotations

from .common import dump, json_rule, lit, parameters
from .scan import CallsIn

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


def read(name: str, s, tools):
    """The reader of a reply's body (scan.py): after the opening (its whitespace aside), the calls
    - one JSON array of them, objects one after another, or one object -, then the closing."""
    if tools is None:
        return (yield from s.rest())
    opening, closing, layout, keys = MARKED[name]
    opening, closing = opening.strip(), closing.strip()
    name_key, args_keys = (None, ()) if keys is None else (keys[0], (keys[1],))
    while (yield from s.content_until(opening)) is not None:
        start, begun, ok = s.pos - len(opening), 0, True
        if layout == "array":
            calls = CallsIn(s, name_key, args_keys)
            if (yield from s.first()) == "[":
                j = yield from s.json(lambda j: calls.update(j, j.items()))
                begun, ok = calls.begun, j.end is not None
        else:
            while (yield from s.first()) == "{":
                calls = CallsIn(s, name_key, args_keys)
                j = yield from s.json(lambda j: calls.update(j, [()]))
                begun += calls.begun
                ok = ok and calls.begun and j.end is not None
                if layout == "one" or not ok:
                    break
        if closing:
            ok = ok and (yield from s.opens(closing))
        if begun:
            s.end() if ok else s.cut()
        else:
            s.release(start)
