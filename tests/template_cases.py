"""The conversations every chat template is rendered for, by transformers when the fixtures
were made (scripts/make_template_fixtures.py) and by edgellm in tests/test_chat_templates.py."""

from __future__ import annotations

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
FIXED_DATE = (2024, 7, 26)  # strftime_now's date on both sides

CHAT = [
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "Tell me a joke."},
]
SYSTEM = {"role": "system", "content": "You are terse."}
PROBE_TEXT = "System probe 7f3a"
SYSTEM_PROBE = [{"role": "system", "content": PROBE_TEXT}, {"role": "user", "content": "Hi"}]

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                        "unit": {"type": "string", "enum": ["C", "F"]}},
                       "required": ["city"]},
    },
}]
TOOL_CALL = {"id": "abc123DEF", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL_CHAT = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": "abc123DEF", "name": "get_weather", "content": '{"temperature": 18, "unit": "C"}'},
]


# Cohere's tool-use template reads tools in Cohere's own shape
COHERE_TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city",
                 "parameter_definitions": {"city": {"description": "The city", "type": "str", "required": True}}}]
# Variables some templates need beside messages and tools, passed as apply_chat_template(**kwargs)
EXTRA = {
    "fireworks-ai-llama-3-firefunction-v2.jinja": {"functions": '[{"name": "get_weather"}]', "datetime": "2024-07-26"},
}


def tools_for(name: str) -> list:
    return COHERE_TOOLS if name.startswith("CohereForAI-c4ai-command-r-plus") else TOOLS


def cases_for(name: str, source: str) -> dict:
    """case -> (messages, tools): chat and system always; tools cases for templates that use them."""
    out = {"chat": (CHAT, None), "system": ([SYSTEM] + CHAT, None)}
    if "tools" in source or "tool_calls" in source:
        out["tools_first_turn"] = ([SYSTEM, TOOL_CHAT[0]], tools_for(name))
        out["tools_result"] = ([SYSTEM] + TOOL_CHAT, tools_for(name))
    return out


def fold_system(messages: list[dict]) -> list[dict]:
    """llama.cpp's way with a template that has no system role: the system text, a newline, then
    the next message's text."""
    if not messages or messages[0]["role"] != "system" or len(messages) < 2:
        return messages
    first, nxt = messages[0], messages[1]
    return [{**nxt, "content": first["content"] + "\n" + nxt["content"]}] + list(messages[2:])
