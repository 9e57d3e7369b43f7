"""What the tool-call formats share: a format's name, a call as OpenAI returns it, and the
pieces their grammars are built from (Lark, llguidance's dialect)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ToolFormat:
    name: str
    native: bool  # the template's text has this format's own markers (what the prompt gets goes by
    # the template's probed ChatTemplate.tool_caps; prepare_messages without them falls back on this)


GENERIC = ToolFormat("generic", False)


def dump(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def make_call(name: str, arguments: Any) -> dict:
    """An OpenAI tool call: arguments as JSON text (text as written, any other value dumped)."""
    args = arguments if isinstance(arguments, str) else dump(arguments)
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": {"name": name, "arguments": args}}


# -- grammar pieces --------------------------------------------------------------------------------


def parameters(tool: dict) -> dict:
    """A tool's parameter schema; properties it does not list are not allowed unless it says so
    (llama.cpp's json-schema-to-grammar default, OpenAI's strict mode): a model may not invent
    arguments."""
    params = tool["function"].get("parameters") or {"type": "object"}
    if isinstance(params.get("properties"), dict) and "additionalProperties" not in params:
        params = {**params, "additionalProperties": False}
    return params


def json_rule(schema: dict) -> str:
    """JSON of `schema`, written as json.dumps writes it (constrain.JSON_OPTIONS)."""
    from ..constrain import JSON_OPTIONS

    return "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS}, ensure_ascii=False)


def lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def call_schema(tool: dict, args_key: str = "arguments") -> dict:
    """{"name": the tool's, args_key: its parameters}."""
    return {"type": "object", "properties": {"name": {"const": tool["function"]["name"]}, args_key: parameters(tool)},
            "required": ["name", args_key], "additionalProperties": False}


def keyword_arguments(tool: dict, key_end: str, sep: str, value, order=None) -> str:
    """A call's named arguments (Lark, with a leading space; "" for none): each of the tool's
    properties as its name, key_end, then value(its schema); those not required may be left out,
    sep between those written. order: sorts the names (else the schema's order)."""
    params = parameters(tool)
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = set(params.get("required") or [])
    names = order(props) if order else list(props)
    items = [(f"{lit(key + key_end)} {value(props[key])}", key in required) for key in names]

    def after(i: int) -> str:  # what may follow once an argument is written
        return "".join(f" ({lit(sep)} {it})" + ("" if req else "?") for it, req in items[i:])

    starts = []  # the first argument written is each one up to the first required
    for k, (it, req) in enumerate(items):
        starts.append(f"{it}{after(k + 1)}")
        if req:
            break
    if not starts:
        return ""
    alts = " | ".join(f"({a})" for a in starts)
    return f" ({alts})" + ("" if any(req for _, req in items) else "?")


def per_tool(tools: list[dict], prefix: str, between: str, suffix: str = "") -> str:
    """One call of one of `tools`: prefix, its name, between, its arguments as JSON, suffix."""
    alts = [f"{lit(prefix + t['function']['name'] + between)} {json_rule(parameters(t))}"
            + (f" {lit(suffix)}" if suffix else "") for t in tools]
    return " | ".join(f"({a})" for a in alts)
