"""What a chat template does with tools, found by rendering small probe conversations and looking
for marker strings in the output (as llama.cpp probes a template's capabilities), not by guessing
from the template's source.

`probe(render)` takes the template's raw render (messages, tools, add_generation_prompt -> text,
or None where the template raised) and answers:

    supports_tools               a tool's name appears when tools= is passed
    supports_tool_calls          an assistant message's tool call (its arguments) appears
    object_arguments             arguments are best passed as an object: it renders them (a
                                 template that prints an object as Python's repr wants text)
    requires_object_arguments    arguments appear only when passed as an object (a JSON string is
                                 refused or written escaped)
    supports_parallel_tool_calls two calls in one message both appear
    supports_tool_responses      a role "tool" message's content appears

A probe the template raises on counts as "not supported". The probes after the first render the
tools only where the template renders them (tool_calls.prepare_turn passes them on only then).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

# messages, tools, add_generation_prompt -> the rendered text, or None where the template raised
Render = Callable[[list, "list | None", bool], "str | None"]

_TOOL = "probe_tool_q7"
_ARG = "probe_arg"
_CALL_IDS = ("pr0beCa11", "pr0beCa12")  # nine letters and digits, as Mistral's templates demand
_ARG_NEEDLES = ("needle_arg_7f3a", "needle_arg_9c2e")
_RESULT = "needle_result_5b1d"
_PROBE_TOOL = {"type": "function", "function": {
    "name": _TOOL, "description": "A probe tool",
    # (a parameter's description too: some templates print it, and fail without one - Command R+'s)
    "parameters": {"type": "object", "properties": {_ARG: {"type": "string", "description": "A probe argument"}},
                   "required": [_ARG]}}}
_USER = {"role": "user", "content": "Probe question"}


@dataclass(frozen=True)
class ToolCaps:
    supports_tools: bool
    supports_tool_calls: bool
    object_arguments: bool
    requires_object_arguments: bool
    supports_parallel_tool_calls: bool
    supports_tool_responses: bool


def _call(i: int, as_object: bool) -> dict:
    args = {_ARG: _ARG_NEEDLES[i]}
    return {"id": _CALL_IDS[i], "type": "function",
            "function": {"name": _TOOL, "arguments": args if as_object else json.dumps(args)}}


def _calls_probe(render: Render, tools, calls: list[dict]) -> str | None:
    """A conversation with `calls` and their results, the assistant's turn to come; where the
    template refuses role "tool" messages, the call alone ending the conversation."""
    asked = {"role": "assistant", "content": "", "tool_calls": calls}
    results = [{"role": "tool", "tool_call_id": c["id"], "name": _TOOL, "content": _RESULT} for c in calls]
    out = render([_USER, asked] + results, tools, True)
    return out if out is not None else render([_USER, asked], tools, False)


def probe(render: Render) -> ToolCaps:
    out = render([_USER], [_PROBE_TOOL], True)
    supports_tools = out is not None and _TOOL in out
    tools = [_PROBE_TOOL] if supports_tools else None

    as_object = _calls_probe(render, tools, [_call(0, True)]) or ""
    as_text = _calls_probe(render, tools, [_call(0, False)]) or ""
    needle = _ARG_NEEDLES[0]
    # an object printed as Python's repr, a JSON string written through tojson (escaped quotes)
    object_right = needle in as_object and f"'{_ARG}': '{needle}'" not in as_object
    text_right = needle in as_text and f'\\"{needle}\\"' not in as_text
    supports_calls = needle in as_object or needle in as_text
    # objects where they render right (as llama.cpp's func_args_not_string), else text where it does
    object_arguments = object_right or (not text_right and needle in as_object)

    parallel = False
    if supports_calls:
        two = _calls_probe(render, tools, [_call(0, object_arguments), _call(1, object_arguments)]) or ""
        parallel = all(n in two for n in _ARG_NEEDLES)
        answered = as_object if object_arguments else as_text
    else:  # the call will reach the template as the assistant's text
        answered = render([_USER, {"role": "assistant", "content": "Calling the probe tool."},
                           {"role": "tool", "tool_call_id": _CALL_IDS[0], "name": _TOOL, "content": _RESULT}],
                          tools, True) or ""
    return ToolCaps(
        supports_tools=supports_tools,
        supports_tool_calls=supports_calls,
        object_arguments=supports_calls and object_arguments,
        requires_object_arguments=object_right and not text_right,
        supports_parallel_tool_calls=parallel,
        supports_tool_responses=_RESULT in answered,
    )
