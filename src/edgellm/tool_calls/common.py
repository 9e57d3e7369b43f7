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


MAX_ANY_ORDER = 6  # arguments a call may write in any order (with more, in the schema's order): llama.cpp's
# Qwen3-Coder grammar takes up to 6 required arguments in any order (COMMON_CHAT_MAX_PERMUTE)


def argument_list(items: list[tuple[str, bool]], sep: str, rules: dict, rule: str, any_order: bool = True) -> str:
    """A call's arguments (Lark, with a leading space; "" for none): each of items (its Lark,
    whether it is required) at most once, all the required ones, sep between two. In any order
    where there are at most MAX_ANY_ORDER of them and any_order, else in the items' order, those
    not required skippable. rules gets the rules this refers to (each item's, and one for each
    set of items written), named rule_..."""
    if not items:
        return ""
    sep_ = f"{lit(sep)} " if sep else ""
    required = {i for i, (_, req) in enumerate(items) if req}
    names = []
    for i, (it, _) in enumerate(items):
        names.append(f"{rule}_a{i}")
        rules[names[-1]] = it
    if any_order and len(items) <= MAX_ANY_ORDER:
        def after(written: frozenset) -> str:  # what may follow once `written` are
            left = [i for i in range(len(items)) if i not in written]
            if not left:
                return ""
            name = f"{rule}_w{sum(1 << i for i in written)}"
            if name not in rules:
                rules[name] = " | ".join(f"({sep_}{names[i]}{after(written | {i})})" for i in left)
            return f" {name}" + ("?" if required <= written else "")

        alts = " | ".join(f"({names[i]}{after(frozenset({i}))})" for i in range(len(items)))
        return f" ({alts})" + ("" if required else "?")

    def rest(i: int) -> str:  # what may follow once items[i - 1] is written, in order
        return "".join(f" ({sep_}{names[j]})" + ("" if items[j][1] else "?") for j in range(i, len(items)))

    starts = []  # the first argument written is each one up to the first required
    for k, (_, req) in enumerate(items):
        starts.append(f"{names[k]}{rest(k + 1)}")
        if req:
            break
    alts = " | ".join(f"({a})" for a in starts)
    return f" ({alts})" + ("" if required else "?")


def keyword_arguments(tool: dict, key_end: str, sep: str, value, rules: dict, rule: str, order=None) -> str:
    """A call's named arguments (argument_list): each of the tool's properties as its name,
    key_end, then value(its schema). order: sorts the names, which then stay in that order (else
    any order)."""
    params = parameters(tool)
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = set(params.get("required") or [])
    names = order(props) if order else list(props)
    items = [(f"{lit(key + key_end)} {value(props[key])}", key in required) for key in names]
    return argument_list(items, sep, rules, rule, any_order=order is None)


def grammar_rules(rules: dict) -> str:
    return "".join(f"\n{name}: {body}" for name, body in rules.items())


def per_tool(tools: list[dict], prefix: str, between: str, suffix: str = "") -> str:
    """One call of one of `tools`: prefix, its name, between, its arguments as JSON, suffix."""
    alts = [f"{lit(prefix + t['function']['name'] + between)} {json_rule(parameters(t))}"
            + (f" {lit(suffix)}" if suffix else "") for t in tools]
    return " | ".join(f"({a})" for a in alts)
