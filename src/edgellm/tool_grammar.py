"""The pieces tool-call grammars are built from (Lark, llguidance's dialect): a tool's parameter
schema, a JSON value of a schema, a literal."""

from __future__ import annotations

import json


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
    from .constrain import JSON_OPTIONS

    return "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS}, ensure_ascii=False)


def lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
