"""Tool calls: the text formats chat models write them in, parsed back into OpenAI `tool_calls`,
and grammars that make a model write one when it must (tool_choice "required" or a named
function).

A format is chosen from the chat template's text, as llama.cpp's common/chat.cpp recognises them
(the XML formats, qwen3_coder, seed_oss, glm, minimax_m2, deepseek_v32 / v4 and hy3, write a text argument as it is and any other as JSON):

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (Hermes 2/3, Qwen 2.5/3, SmolLM3)
    llama3       {"name": ..., "parameters": {...}}, maybe after <|python_tag|>   (Llama 3.1-3.3)
    mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}]              (Mistral Nemo)
    mistral_args [TOOL_CALLS]name[ARGS]{...}                                  (Mistral Small 3.2, Devstral, Ministral 3)
    functionary  >>>name\\n{...}                                               (Functionary v3.2)
    function_tag <function=name>{...}</function>                              (Functionary v3.1)
    granite      <|tool_call|>[{"name": ..., "arguments": {...}}]             (Granite 3.3)
    deepseek_r1  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\\n```json\\n{...}\\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
                 (DeepSeek R1 and its distills)
    deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>   (DeepSeek V3.1)
    command_r7b  <|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>
                 (Command R7B and Cohere's MoE template; the answer between <|START_RESPONSE|> and <|END_RESPONSE|>)
    apertus      <|tools_prefix|>[{name: {...}}]<|tools_suffix|>              (Apertus; its reasoning between
                 <|inner_prefix|> and <|inner_suffix|>)
    nemotron_v2  <TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL>     (Nemotron Nano v2)
    apriel       <tool_calls>[{"name": ..., "arguments": {...}}]</tool_calls> (Apriel 1.6)
    lfm2         <|tool_call_start|>[name(key="value", n=1)]<|tool_call_end|>   (LFM2, LFM2.5: Python calls, pythonic.py)
    command_r_plus  Action:\\n```json\\n[{"tool_name": ..., "parameters": {...}}]```   (Command R+)
    gigachat_v3  <|message_sep|>\\n\\nfunction call<|role_sep|>\\n{"name": ..., "arguments": {...}}   (GigaChat 3: one call)
    gigachat_v31 <|function_call|>{"name": ..., "arguments": {...}}            (GigaChat 3.1: one call)
    firefunction_v2  functools[{"name": ..., "arguments": {...}}]              (FireFunction v2)
    minimax_m1   <tool_calls>\\n{"name": ..., "arguments": {...}}\\n...</tool_calls>   (MiniMax-M1: a call a line)
    qwen3_coder  <tool_call>\\n<function=name>\\n<parameter=key>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>
                 (Qwen3-Coder, Qwen3.5, Nemotron 3 Nano, Step 3.5)
    seed_oss     <seed:tool_call>\\n<function=name>\\n<parameter=key>value</parameter>\\n</function>\\n</seed:tool_call>   (Seed-OSS)
    deepseek_v32 <｜DSML｜function_calls>\\n<｜DSML｜invoke name="name">\\n<｜DSML｜parameter name="key" string="true">value</｜DSML｜parameter>\\n
                 </｜DSML｜invoke>\\n</｜DSML｜function_calls>   (DeepSeek V3.2; string="false" for a JSON value)
    deepseek_v4  the same in <｜DSML｜tool_calls>                                 (DeepSeek V4)
    hy3          <tool_calls:opensource>\\n<tool_call:opensource>name<tool_sep:opensource>\\n<arg_key:opensource>key</arg_key:opensource>\\n
                 <arg_value:opensource>value</arg_value:opensource>\\n</tool_call:opensource>\\n</tool_calls:opensource>   (Hunyuan 3)
    glm          <tool_call>name\\n<arg_key>key</arg_key>\\n<arg_value>value</arg_value>\\n</tool_call>
                 (GLM-4.5 to 4.7, Ling 3, Laguna, Spark)
    minimax_m2   <minimax:tool_call>\\n<invoke name="name">\\n<parameter name="key">value</parameter>\\n</invoke>\\n</minimax:tool_call>
                 (MiniMax-M2; one block may hold several invokes)
    kimi_k2      <|tool_calls_section_begin|><|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>
                 (Kimi K2; the number counts the calls)
    gpt_oss      <|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}
                 (gpt-oss: OpenAI's harmony messages, harmony.py; analysis is reasoning_content)
    generic      {"tool_call": {"name": ..., "arguments": {...}}}  or  {"response": "..."}
                 (any other template: the system message says how to call a tool)

What reaches the template follows what it renders (ChatTemplate.tool_caps, probed): tools it does
not list are listed in the system message, calls and results it drops are written as text.

Reasoning models' <think>...</think> (Command R7B's <|START_THINKING|>...<|END_THINKING|>:
REASONING_TAGS) is split off as `reasoning_content` (llama.cpp's --reasoning-format deepseek).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from . import harmony, pythonic
from .errors import TemplateError
from .tool_caps import ToolCaps
from .tool_grammar import json_rule as _json
from .tool_grammar import lit as _lit
from .tool_grammar import parameters as _parameters

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
DSML = "｜DSML｜"  # DeepSeek V3.2 / V4's XML markers' prefix
HY = ":opensource"  # Hunyuan 3's markers' suffix
KIMI = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
        "<|tool_calls_section_end|>")
# the formats whose calls are JSON after a marker (and before an end marker, if any):
# (opening, closing, layout: "array" - one JSON array -, "lines" - an object a line - or "one" - one
# call, each after its own opening -, a call's
# (name key, arguments key, numbering key or None), or None where a call is {name: arguments})
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
# the markers around a reasoning block, where a format has its own (others: THINK_OPEN, THINK_CLOSE)
# (Apriel 1.6's prompt opens its reasoning)
REASONING_TAGS = {"command_r7b": ("<|START_THINKING|>", "<|END_THINKING|>"), "apertus": ("<|inner_prefix|>", "<|inner_suffix|>"),
                  "apriel": ("Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]"), "hy3": (f"<think{HY}>", f"</think{HY}>")}
# the formats whose templates write an assistant's reasoning from its `thinking` (as llama.cpp
# passes reasoning_content to them), and whether a message with calls then loses its content (the
# gpt-oss template takes one or the other)
THINKING_FIELD = {"gpt_oss": True, "lfm2": False}
# the markers around the answer, dropped from the content (Command R7B's, Cohere2 MoE's, Apriel's)
ANSWER_MARKS = {"command_r7b": ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>"),
                "apriel": ("[END FINAL RESPONSE]",)}
# the XML formats: (call opening before the name, after it, argument before its key, between key
# and value - or (for a text value, for a JSON one) where they differ -, after the value, call end)
XML = {
    "qwen3_coder": ("<tool_call>\n<function=", ">\n", "<parameter=", ">\n", "\n</parameter>\n", "</function>\n</tool_call>"),
    "seed_oss": ("<seed:tool_call>\n<function=", ">\n", "<parameter=", ">", "</parameter>\n",
                 "</function>\n</seed:tool_call>"),
    "glm": ("<tool_call>", "\n", "<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>\n", "</tool_call>"),
    "minimax_m2": ('<invoke name="', '">\n', '<parameter name="', '">', "</parameter>\n", "</invoke>\n"),
    **{ds: (f'<{DSML}invoke name="', '">\n', f'<{DSML}parameter name="', ('" string="true">', '" string="false">'),
            f"</{DSML}parameter>\n", f"</{DSML}invoke>\n") for ds in ("deepseek_v32", "deepseek_v4")},
    "hy3": (f"<tool_call{HY}>", f"<tool_sep{HY}>\n", f"<arg_key{HY}>", f"</arg_key{HY}>\n<arg_value{HY}>", f"</arg_value{HY}>\n",
            f"</tool_call{HY}>\n"),
}
# the block around an XML format's calls, where one holds them all
XML_BLOCK = {"minimax_m2": ("<minimax:tool_call>\n", "</minimax:tool_call>"),
             "deepseek_v32": (f"<{DSML}function_calls>\n", f"</{DSML}function_calls>"),
             "deepseek_v4": (f"<{DSML}tool_calls>\n", f"</{DSML}tool_calls>"),
             "hy3": (f"<tool_calls{HY}>\n", f"</tool_calls{HY}>")}
# how parse finds them: (a call - its name and body -, an argument - its key, then its value, or
# whether it is text and its value)
_QWEN_ARG = r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>"
XML_READ = {
    "qwen3_coder": (r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</tool_call>", _QWEN_ARG),
    "seed_oss": (r"<seed:tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</seed:tool_call>", _QWEN_ARG),
    "glm": (r"<tool_call>([^<]+?)\s*((?:<arg_key>.*?)?)</tool_call>", r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>"),
    "minimax_m2": (r'<invoke name="([^"]+)">(.*?)</invoke>', r'<parameter name="([^"]+)">(.*?)</parameter>'),
    **{ds: (rf'<{DSML}invoke name="([^"]+)">(.*?)</{DSML}invoke>',
            rf'<{DSML}parameter name="([^"]+)" string="(true|false)">(.*?)</{DSML}parameter>') for ds in ("deepseek_v32", "deepseek_v4")},
    "hy3": (rf"<tool_call{HY}>(.*?)<tool_sep{HY}>(.*?)</tool_call{HY}>", rf"<arg_key{HY}>(.*?)</arg_key{HY}>\s*<arg_value{HY}>(.*?)</arg_value{HY}>"),
}


@dataclass(frozen=True)
class ToolFormat:
    name: str
    native: bool  # the template's text has this format's own markers (what the prompt gets goes by
    # the template's probed ChatTemplate.tool_caps; prepare_messages without them falls back on this)


def detect_format(template_source: str) -> ToolFormat:
    src = template_source or ""
    if harmony.CHANNEL in src:
        return ToolFormat("gpt_oss", True)
    if "<tool_sep{}>" in src and HY in src:
        return ToolFormat("hy3", True)
    if DSML in src:
        return ToolFormat("deepseek_v32" if "function_calls>" in src else "deepseek_v4", True)
    if DS_CALLS_BEGIN in src:
        return ToolFormat("deepseek_r1" if "```json" in src else "deepseek_v3", True)
    if KIMI[0] in src:
        return ToolFormat("kimi_k2", True)
    if "<|START_ACTION|>" in src:
        return ToolFormat("command_r7b", True)
    if pythonic.OPEN in src or "<|tool_list_start|>" in src or "List of tools: [" in src:
        return ToolFormat("lfm2", True)
    if "<|START_OF_TURN_TOKEN|>" in src and "Action:" in src and "```json" in src:
        return ToolFormat("command_r_plus", True)
    if "functools[" in src:
        return ToolFormat("firefunction_v2", True)
    if "<|role_sep|>" in src and "<|message_sep|>" in src:
        return ToolFormat("gigachat_v31" if "<|function_call|>" in src else "gigachat_v3", True)
    if "<|tools_prefix|>" in src:
        return ToolFormat("apertus", True)
    if "<TOOLCALL>" in src:
        return ToolFormat("nemotron_v2", True)
    if "<tool_calls>" in src:
        return ToolFormat("apriel" if "<tool_calls>[" in src else "minimax_m1", True)
    if "<|tool_call|>" in src:
        return ToolFormat("granite", True)
    if "<minimax:tool_call>" in src:
        return ToolFormat("minimax_m2", True)
    if "<seed:tool_call>" in src:
        return ToolFormat("seed_oss", True)
    if "<tool_call>" in src and "<arg_key>" in src:
        return ToolFormat("glm", True)
    if "<tool_call>" in src and "<function=" in src and "<parameter=" in src:
        return ToolFormat("qwen3_coder", True)
    if "<tool_call>" in src:
        return ToolFormat("hermes", True)
    if "[TOOL_CALLS]" in src:
        return ToolFormat("mistral_args" if "[ARGS]" in src else "mistral", True)
    if ">>>" in src:
        return ToolFormat("functionary", True)
    if "<function=" in src:
        return ToolFormat("function_tag", True)
    if "<|start_header_id|>" in src and ("tools" in src or "<|python_tag|>" in src):
        return ToolFormat("llama3", True)
    return GENERIC


GENERIC = ToolFormat("generic", False)


# ---------------------------------------------------------------------------------------------
# checking what the caller passes


def check_tools(tools) -> list[dict]:
    if not isinstance(tools, list) or not tools:
        raise TemplateError("tools must be a non-empty list of {'type': 'function', 'function': {...}}")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise TemplateError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise TemplateError(f"tools[{i}].function needs a name")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise TemplateError(f"tools[{i}].function.parameters must be a JSON schema object")
    return tools


def chosen_tools(tools: list[dict], tool_choice) -> tuple[list[dict], bool]:
    """(the tools a call may use, whether a call is required) for OpenAI's tool_choice."""
    if tool_choice in (None, "auto"):
        return tools, False
    if tool_choice == "none":
        return [], False
    if tool_choice == "required":
        return tools, True
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        picked = [t for t in tools if t["function"]["name"] == name]
        if not picked:
            raise TemplateError(f"tool_choice names {name!r}, which is not among the tools")
        return picked, True
    raise TemplateError(f'tool_choice must be "auto", "none", "required" or {{"type": "function", '
                        f'"function": {{"name": ...}}}}, got {tool_choice!r}')


def _assumed_caps(fmt: ToolFormat) -> ToolCaps:
    """What a format's markers suggest the template does, for a caller of prepare_messages that
    has no probed ChatTemplate.tool_caps: a template with a format of its own renders calls (as
    objects, but Functionary v3.2's text) and results; any other renders results only."""
    return ToolCaps(supports_tools=fmt.native, supports_tool_calls=fmt.native,
                    object_arguments=fmt.name != "functionary", requires_object_arguments=False,
                    supports_parallel_tool_calls=fmt.native, supports_tool_responses=True)


def _check_calls(messages: list) -> None:
    """Each message's tool_calls as OpenAI sends them: a list of {"id": text, "type": "function",
    "function": {"name": text, "arguments": JSON text or an object}}."""
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls is None:
            continue
        shape = "a list of {'id': ..., 'type': 'function', 'function': {'name': ..., 'arguments': ...}}"
        if not isinstance(calls, list):
            raise TemplateError(f"message {i}: tool_calls must be {shape}, got {type(calls).__name__}")
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if (not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]
                    or not isinstance(c.get("id"), (str, type(None)))
                    or not isinstance(fn.get("arguments"), (str, dict, type(None)))):
                raise TemplateError(f"message {i}: tool_calls[{j}] must be {shape[len('a list of '):]} with a "
                                    f"name and text or object arguments, got {c!r:.80}")


def _parsed_calls(calls: list) -> list[dict]:
    """(name, arguments as an object) of each call; arguments that are not JSON are an error."""
    out = []
    for c in calls:
        fn = c["function"]
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                raise TemplateError(f"tool call {fn.get('name')!r}: arguments are not JSON: {args!r:.80}") from None
        out.append({"name": fn["name"], "arguments": {} if args is None else args})
    return out


def write_calls(fmt: ToolFormat, calls: list[dict]) -> str:
    """Calls ({"name", "arguments"}) as a model writes them in format `fmt` (what parse reads back)."""
    dump = lambda v: json.dumps(v, ensure_ascii=False)  # noqa: E731
    name = fmt.name
    if name == "hermes":
        return "\n".join(f"<tool_call>\n{dump(c)}\n</tool_call>" for c in calls)
    if name == "llama3":
        return "\n".join(dump({"name": c["name"], "parameters": c["arguments"]}) for c in calls)
    if name in MARKED:
        opening, closing, layout, _ = MARKED[name]
        items = [dump(_marked_item(name, i, c)) for i, c in enumerate(calls)]
        if layout == "one":
            return "".join(opening + item + closing for item in items)
        return opening + ("[" + ", ".join(items) + "]" if layout == "array" else "\n".join(items)) + closing
    if name == "mistral_args":
        return "".join(f"[TOOL_CALLS]{c['name']}[ARGS]{dump(c['arguments'])}" for c in calls)
    if name == "functionary":
        return "".join(f">>>{c['name']}\n{dump(c['arguments'])}" for c in calls)
    if name == "function_tag":
        return "".join(f"<function={c['name']}>{dump(c['arguments'])}</function>" for c in calls)
    if name in ("deepseek_r1", "deepseek_v3"):
        one = (lambda c: f"function{DS_SEP}{c['name']}\n```json\n{dump(c['arguments'])}\n```") if name == "deepseek_r1" \
            else (lambda c: f"{c['name']}{DS_SEP}{dump(c['arguments'])}")
        between = "\n" if name == "deepseek_r1" else ""
        return DS_CALLS_BEGIN + between.join(DS_CALL_BEGIN + one(c) + DS_CALL_END for c in calls) + DS_CALLS_END
    if name == "kimi_k2":
        return KIMI[0] + "".join(f"{KIMI[1]}functions.{c['name']}:{i}{KIMI[2]}{dump(c['arguments'])}{KIMI[3]}"
                                 for i, c in enumerate(calls)) + KIMI[4]
    if name == "gpt_oss":
        return harmony.write_calls(calls)
    if name == "lfm2":
        return pythonic.write(calls)
    if name in XML:
        o, n, k, kv, v, e = XML[name]
        text = lambda x: x if isinstance(x, str) else dump(x)  # noqa: E731
        one = [o + c["name"] + n + "".join(k + key + _kv(name, isinstance(val, str)) + text(val) + v
                                           for key, val in c["arguments"].items()) + e for c in calls]
        if name in XML_BLOCK:
            return XML_BLOCK[name][0] + "".join(one) + XML_BLOCK[name][1]
        return "\n".join(one)
    return dump({"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls})


def _text(content) -> str | None:
    """A message's content as text (a list of text parts joined with newlines), or None for
    anything else (the template's render names the problem)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    return None


def _result_text(m: dict, names: dict) -> str:
    call_id = m.get("tool_call_id") if isinstance(m.get("tool_call_id"), str) else None
    name = m.get("name") or names.get(call_id)
    said = ", ".join(x for x in (name and f"tool {name}", call_id and f"call {call_id}") if x)
    return f"Tool result{f' ({said})' if said else ''}:\n{_text(m.get('content'))}"


def _with_thinking(messages: list, calls_drop_content: bool) -> list:
    """An assistant message's reasoning_content as the template's `thinking` (THINKING_FIELD)."""
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("reasoning_content"), str):
            m = {**m, "thinking": m["reasoning_content"]}
            if calls_drop_content and m.get("tool_calls"):
                m.pop("content", None)
        out.append(m)
    return out


def _one_call_at_a_time(messages: list) -> list:
    """An assistant message with several calls as one message per call, each followed by its
    results (matched by tool_call_id, else in order): for a template that renders one call a
    message (Llama 3.x refuses more, gpt-oss writes the first)."""
    out, i = [], 0
    while i < len(messages):
        m = messages[i]
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        i += 1
        if not calls or len(calls) < 2:
            out.append(m)
            continue
        results = []
        while i < len(messages) and isinstance(messages[i], dict) and messages[i].get("role") == "tool":
            results.append(messages[i])
            i += 1
        ids = [c.get("id") if isinstance(c, dict) else None for c in calls]
        by_id = None not in ids and len(set(ids)) == len(ids) and all(r.get("tool_call_id") in ids for r in results)
        for k, c in enumerate(calls):
            out.append({**m, "content": m.get("content") if k == 0 else "", "tool_calls": [c]})
            out += [r for j, r in enumerate(results) if (r.get("tool_call_id") == ids[k] if by_id else j == k)]
        out += [] if by_id else results[len(calls):]
    return out


def prepare_messages(messages: list[dict], fmt: ToolFormat, caps: ToolCaps | None = None) -> list[dict]:
    """Messages as the template can take them (caps: its ChatTemplate.tool_caps; without them,
    what `fmt` suggests). Tool-call arguments as objects or as JSON text, whichever the template
    renders; several calls in one message, for a template that renders one, as one message per
    call; an assistant's calls that the template cannot render written into its content as the
    model writes them in `fmt`; role "tool" results that the template drops turned into a user
    message naming the tool and call (one for consecutive results, joined with the user message
    after them)."""
    _check_calls(messages)
    caps = caps or _assumed_caps(fmt)
    if fmt.name in THINKING_FIELD:
        messages = _with_thinking(messages, THINKING_FIELD[fmt.name])
    if caps.supports_tool_calls and not caps.supports_parallel_tool_calls:
        messages = _one_call_at_a_time(messages)
    out: list[dict] = []
    names: dict = {}  # call id -> tool name, for results that do not name their tool
    pending: list[str] = []  # results of tools, turned into text, for the next user message
    for m in messages:
        if not isinstance(m, dict):  # (the template's render names the problem)
            out.append(m)
            continue
        if pending and m.get("role") != "tool":
            text = "\n\n".join(pending)
            pending = []
            if m.get("role") == "user" and _text(m.get("content")) is not None:
                m = {**m, "content": text + "\n\n" + _text(m["content"])}
            else:
                out.append({"role": "user", "content": text})
        calls = m.get("tool_calls")
        if calls:
            parsed = _parsed_calls(calls)
            names.update((c.get("id"), p["name"]) for c, p in zip(calls, parsed))
            if caps.supports_tool_calls:
                fixed = []
                for c, p in zip(calls, parsed):
                    fn = dict(c["function"])
                    if caps.object_arguments:
                        fn["arguments"] = p["arguments"]
                    elif not isinstance(fn.get("arguments"), str):
                        fn["arguments"] = json.dumps(p["arguments"], ensure_ascii=False)
                    fixed.append({**c, "function": fn})
                m = {**m, "tool_calls": fixed}
            else:
                said = _text(m.get("content")) or ""
                m = {k: v for k, v in m.items() if k != "tool_calls"}
                m["content"] = "\n".join(x for x in (said.strip(), write_calls(fmt, parsed)) if x)
        elif m.get("role") == "tool" and not caps.supports_tool_responses and _text(m.get("content")) is not None:
            pending.append(_result_text(m, names))
            continue
        out.append(m)
    if pending:
        out.append({"role": "user", "content": "\n\n".join(pending)})
    return out


def describe_tools(tools: list[dict], fmt: ToolFormat = GENERIC, listed: bool = True) -> str:
    """System-message text: the tools (unless the template lists them: listed=False) and how to
    call one in format `fmt` (for the generic format, which the template does not teach)."""
    specs = "You can call these tools:\n" + json.dumps([t["function"] for t in tools], ensure_ascii=False) + "\n"
    if fmt.name == "generic":
        how = ('To call a tool, reply with only {"tool_call": {"name": <tool name>, "arguments": <its arguments>}}; '
               'otherwise reply with {"response": <your answer>}.')
    else:
        name = tools[0]["function"]["name"]
        how = f"To call a tool, write the call in this form (here {name} with no arguments): " + \
            write_calls(fmt, [{"name": name, "arguments": {}}])
    return (specs if listed else "") + how


def with_tool_description(messages: list[dict], tools: list[dict], fmt: ToolFormat = GENERIC,
                          listed: bool = True) -> list[dict]:
    """`messages` with describe_tools' text at the end of the system message (or in a new one)."""
    text = describe_tools(tools, fmt, listed)
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}] + list(messages[1:])
    return [{"role": "system", "content": text}] + list(messages)


# ---------------------------------------------------------------------------------------------
# grammars that force a call


def _marked_item(name: str, i: int, call: dict) -> dict:
    """Call number i ({"name", "arguments"}) as format `name` of MARKED writes it."""
    keys = MARKED[name][3]
    if keys is None:
        return {call["name"]: call["arguments"]}
    name_key, args_key, number_key = keys
    return {**({number_key: str(i)} if number_key else {}), name_key: call["name"], args_key: call["arguments"]}


def _marked_schema(name: str, tool: dict) -> dict:
    """The JSON schema of a call of `tool` in format `name` of MARKED."""
    keys, fn = MARKED[name][3], tool["function"]["name"]
    if keys is None:
        return {"type": "object", "properties": {fn: _parameters(tool)}, "required": [fn], "additionalProperties": False}
    name_key, args_key, number_key = keys
    props = {**({number_key: {"type": "string"}} if number_key else {}), name_key: {"const": fn}, args_key: _parameters(tool)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _call_schema(tool: dict, args_key: str = "arguments") -> dict:
    return {"type": "object", "properties": {"name": {"const": tool["function"]["name"]}, args_key: _parameters(tool)},
            "required": ["name", args_key], "additionalProperties": False}


# formats that write several calls one after another, and the text between two of them (Mistral
# Nemo writes them as one JSON array)
PARALLEL = {"hermes": "\n", "mistral_args": "", "function_tag": "", "qwen3_coder": "\n", "seed_oss": "\n", "glm": "\n"}

# an XML argument's key, and a text value with the text that ends it (one terminal: no "</" in
# the text, so it ends exactly there, whitespace and all)
def _xml_terminals(name: str) -> str:
    end = re.escape(XML[name][4]).replace("\n", "n").replace("/", "\\/")  # (re.escape: backslash, newline)
    return f"\nXML_KEY: /[^<>\\n]+/\nXML_TEXT_END: /([^<]|<[^\\/])*{end}/"


def _xml_value(name: str, schema) -> str:
    """An XML argument's value and the text after it: text for a string (one of its enum), else JSON."""
    if _is_text(schema):
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum):
            return "(" + " | ".join(_lit(e + XML[name][4]) for e in enum) + ")"
        return "XML_TEXT_END"
    return f"{_json(schema if isinstance(schema, dict) else {})} {_lit(XML[name][4])}"


def _kv(name: str, text: bool) -> str:
    """What XML format `name` writes between an argument's key and its value (text or JSON)."""
    kv = XML[name][3]
    return kv if isinstance(kv, str) else kv[0 if text else 1]


def _is_text(schema) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "string"


def _xml_call(name: str, tool: dict) -> str:
    """One call of `tool` in XML format `name`: its listed arguments in their order (those not
    required may be left out), any others only where its schema allows them."""
    o, n, k, _, _, e = XML[name]
    params = _parameters(tool)
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = set(params.get("required") or [])
    parts = [_lit(o + tool["function"]["name"] + n)]
    for key, schema in props.items():
        parts.append(f"({_lit(k + key + _kv(name, _is_text(schema)))} {_xml_value(name, schema)})"
                     + ("" if key in required else "?"))
    if params.get("additionalProperties") is not False:
        parts.append(f"({_lit(k)} XML_KEY {_lit(_kv(name, True))} XML_TEXT_END)*")
    return " ".join(parts + [_lit(e)])


def call_grammar(fmt: ToolFormat, tools: list[dict], parallel: bool = False) -> str:
    """A Lark grammar (llguidance's dialect) that admits exactly one call of one of `tools`, or
    with `parallel` one or more where the format writes several (PARALLEL)."""
    name = fmt.name
    many = parallel and name in PARALLEL

    def one_of(args_key="arguments"):
        return {"anyOf": [_call_schema(t, args_key) for t in tools]}

    def per_tool(prefix, between, suffix=""):
        alts = [f"{_lit(prefix + t['function']['name'] + between)} {_json(_parameters(t))}"
                + (f" {_lit(suffix)}" if suffix else "") for t in tools]
        return " | ".join(f"({a})" for a in alts)

    rules = ""
    if name in MARKED:  # the calls as JSON between the format's markers
        opening, closing, layout, _ = MARKED[name]
        items = {"anyOf": [_marked_schema(name, t) for t in tools]}
        end = f" {_lit(closing)}" if closing else ""
        if layout in ("lines", "one"):
            more = f" ({_lit(chr(10))} one)*" if parallel and layout == "lines" else ""
            return f"start: {_lit(opening)} one{more}{end}\none: {_json(items)}"
        array = _json({"type": "array", "items": items, "minItems": 1, **({} if parallel else {"maxItems": 1})})
        return f"start: {_lit(opening)} {array}{end}"
    if name in ("deepseek_r1", "deepseek_v3"):  # the calls between DS_CALLS_BEGIN and DS_CALLS_END
        if name == "deepseek_r1":
            call = per_tool(DS_CALL_BEGIN + "function" + DS_SEP, "\n```json\n", "\n```" + DS_CALL_END)
        else:
            call = per_tool(DS_CALL_BEGIN, DS_SEP, DS_CALL_END)
        more = (f" ({_lit(chr(10))} one)*" if name == "deepseek_r1" else " one*") if parallel else ""
        return f"start: {_lit(DS_CALLS_BEGIN)} one{more} {_lit(DS_CALLS_END)}\none: {call}"
    if name == "lfm2":
        return pythonic.grammar(tools, parallel)
    if name == "gpt_oss":  # one call, maybe after an analysis message (a call ends the reply)
        return (f"start: (HARMONY_ANALYSIS {_lit(harmony.START + 'assistant')})? call\n"
                f"call: {per_tool(harmony.CALL_HEAD[0], harmony.CALL_HEAD[1])}\n"
                f"HARMONY_ANALYSIS: /{re.escape(harmony.ANALYSIS).replace('/', chr(92) + '/')}([^<]|<[^|])*"
                f"{re.escape(harmony.END)}/")
    if name == "kimi_k2":  # the calls between KIMI[0] and KIMI[4], each numbered
        call = " | ".join(f"({_lit(KIMI[1] + 'functions.' + t['function']['name'] + ':')} KIMI_INDEX {_lit(KIMI[2])} "
                          f"{_json(_parameters(t))} {_lit(KIMI[3])})" for t in tools)
        return (f"start: {_lit(KIMI[0])} one{' one*' if parallel else ''} {_lit(KIMI[4])}\none: {call}"
                "\nKIMI_INDEX: /[0-9]+/")
    if name in XML_BLOCK:  # the calls in one block
        calls = " | ".join(f"({_xml_call(name, t)})" for t in tools)
        return (f"start: {_lit(XML_BLOCK[name][0])} one{' one*' if parallel else ''} {_lit(XML_BLOCK[name][1])}\n"
                f"one: {calls}{_xml_terminals(name)}")
    if name in XML:
        call, rules = " | ".join(f"({_xml_call(name, t)})" for t in tools), _xml_terminals(name)
    elif name == "hermes":
        call, rules = f"{_lit('<tool_call>' + chr(10))} call {_lit(chr(10) + '</tool_call>')}", f"\ncall: {_json(one_of())}"
    elif name == "llama3":
        call = _json(one_of("parameters"))
    elif name == "mistral_args":
        call = per_tool("[TOOL_CALLS]", "[ARGS]")
    elif name == "functionary":
        call = per_tool(">>>", "\n")
    elif name == "function_tag":
        call = per_tool("<function=", ">", "</function>")
    else:
        call = _json({"type": "object", "properties": {"tool_call": one_of()}, "required": ["tool_call"],
                      "additionalProperties": False})
    if many:
        sep = f"{_lit(PARALLEL[name])} " if PARALLEL[name] else ""
        return f"start: one ({sep}one)*\none: {call}{rules}"
    return f"start: {call}{rules}"


def call_or_json_grammar(fmt: ToolFormat, tools: list[dict], schema: dict) -> str:
    """A Lark grammar admitting one call of `tools` (as call_grammar) or JSON following `schema`:
    tool_choice "auto" with a JSON response_format (the answer, when it is not a call, is that JSON)."""
    call = call_grammar(fmt, tools)
    return f"start: tool_call | answer\ntool_call: {call[len('start: '):]}\nanswer: {_json(schema)}"


# ---------------------------------------------------------------------------------------------
# parsing what the model wrote


def _call(name: str, arguments: Any) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": {"name": name, "arguments": args}}


def _json_values(text: str) -> list[Any]:
    """The JSON values written one after another in text (whitespace or ; between them)."""
    dec, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
        if i >= len(text):
            break
        value, i = dec.raw_decode(text, i)
        out.append(value)
    return out


def reasoning_tags(fmt: ToolFormat | None) -> tuple[str, str]:
    return REASONING_TAGS.get(fmt.name if fmt is not None else "", (THINK_OPEN, THINK_CLOSE))


def unmarked(fmt: ToolFormat, text: str) -> str:
    """text without the markers format `fmt` writes around its answer (ANSWER_MARKS)."""
    for m in ANSWER_MARKS.get(fmt.name, ()):
        text = text.replace(m, "")
    return text


def split_reasoning(text: str, started: bool = False, tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)
                    ) -> tuple[str | None, str]:
    """(reasoning, rest): the text of a leading <think>...</think> (tags: another format's
    markers), or, when the prompt already opened one, of everything up to </think>."""
    opening, closing = tags
    body = text.lstrip()
    if not started:
        if not body.startswith(opening):
            return None, text
        body = body[len(opening):]
    end = body.find(closing)
    if end < 0:
        return body.strip(), ""  # cut off while still thinking
    return body[:end].strip(), body[end + len(closing):].lstrip()


def _xml_args(name: str, body: str, tool: dict | None) -> dict:
    """An XML call's arguments: a value stays text where the format says so (DeepSeek's
    string="true") or the tool's schema says string (or it is not JSON), else its JSON."""
    pattern = XML_READ[name][1]
    props = ((tool or {}).get("function", {}).get("parameters") or {}).get("properties") or {}
    args = {}
    for m in re.finditer(pattern, body, re.S):
        key, raw = m.group(1).strip(), m.group(m.lastindex)
        schema = props.get(key) if isinstance(props, dict) else None
        if _is_text(schema) or (m.lastindex == 3 and m.group(2) == "true"):
            args[key] = raw
            continue
        try:
            args[key] = json.loads(raw)
        except json.JSONDecodeError:
            args[key] = raw
    return args


def _content(text: str, calls_at: list[tuple[int, int]]) -> str:
    """text without the spans of its calls, stripped of the whitespace around them."""
    pieces, last = [], 0
    for a, b in calls_at:
        pieces.append(text[last:a].strip())
        last = b
    pieces.append(text[last:].strip())
    return "\n".join(p for p in pieces if p)


def _marked(name: str, text: str) -> tuple[str, list[dict]] | None:
    """(content, calls) of a reply in format `name` of MARKED; None without its markers (a JSON
    error or a call of another shape raises)."""
    opening, closing, layout, keys = MARKED[name]
    i = text.find(opening)
    j = text.find(closing, i + len(opening)) if closing else len(text)
    if i < 0 or j < 0:
        return None
    body = text[i + len(opening):j]
    if layout == "one":  # (each call after its opening)
        items = [json.loads(part) for part in body.split(opening)]
    else:
        items = json.loads(body) if layout == "array" else _json_values(body)
    if keys is None:  # {name: arguments}
        if not all(isinstance(v, dict) and len(v) == 1 for v in items):
            raise TypeError("a call is one name")
        calls = [_call(*next(iter(v.items()))) for v in items]
    else:
        calls = [_call(v[keys[0]], v.get(keys[1], {})) for v in items]
    return text[:i].strip() + text[j + len(closing):].strip(), calls  # (as the server streams it)


def parse(fmt: ToolFormat, text: str, tools: list[dict] | None = None) -> tuple[str, list[dict]]:
    """(content, tool_calls) of a reply in format `fmt`; text that is not a well-formed call
    stays content. tools: the request's, which say which XML argument values are text."""
    name = fmt.name
    if name == "gpt_oss":
        _, content, found = harmony.parse_reply(text, True)
        return content, [_call(n, args) for n, args in found]
    try:
        if name in XML:
            by_name = {t["function"]["name"]: t for t in tools or []}
            pattern = XML_READ[name][0]
            block = XML_BLOCK.get(name)
            spans = list(re.finditer(re.escape(block[0].strip()) + "(.*?)" + re.escape(block[1]) if block else pattern,
                                     text, re.S))
            found = [m for b in spans for m in re.finditer(pattern, b.group(1), re.S)] if block else spans
            if found:
                calls = [_call(m.group(1).strip(), _xml_args(name, m.group(2), by_name.get(m.group(1).strip())))
                         for m in found]
                return _content(text, [m.span() for m in spans]), calls
        elif name in ("deepseek_r1", "deepseek_v3"):
            i = text.find(DS_CALLS_BEGIN)
            if i >= 0 and text.find(DS_CALLS_END, i) >= 0:
                b, e = re.escape(DS_CALL_BEGIN), re.escape(DS_CALL_END)
                pattern = (b + r"(?:function)?" + re.escape(DS_SEP) + r"([^\n]+)\n```(?:json)?\n(.*?)\n```\s*" + e
                           if name == "deepseek_r1" else b + r"(.*?)" + re.escape(DS_SEP) + r"(.*?)" + e)
                calls = [_call(m.group(1).strip(), json.loads(m.group(2)))
                         for m in re.finditer(pattern, text[i:], re.S)]
                if calls:
                    return text[:i].strip(), calls
        elif name == "kimi_k2":
            i = text.find(KIMI[0])
            if i >= 0 and text.find(KIMI[4], i) >= 0:
                b, a, e = (re.escape(m) for m in KIMI[1:4])
                calls = [_call(m.group(1).strip(), json.loads(m.group(2)))
                         for m in re.finditer(b + r"\s*(?:functions\.)?([^<:]+?)(?::\d+)?\s*" + a + r"(.*?)" + e, text[i:], re.S)]
                if calls:
                    return text[:i].strip(), calls
        elif name == "lfm2":
            i = text.find(pythonic.OPEN)
            j = text.find(pythonic.CLOSE, i)
            if i >= 0 and j >= 0:
                calls = [_call(n, args) for n, args in pythonic.read(text[i + len(pythonic.OPEN):j])]
                return text[:i].strip() + text[j + len(pythonic.CLOSE):].strip(), calls
        elif name in MARKED:
            answer = unmarked(fmt, text)
            found = _marked(name, answer)
            if found is not None:
                return found
            return answer.strip(), []
        elif name == "hermes":
            calls = []
            for m in re.finditer(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.S):
                obj = json.loads(m.group(1))
                calls.append(_call(obj["name"], obj.get("arguments", {})))
            if calls:
                return re.sub(r"\s*<tool_call>.*?</tool_call>\s*", "", text, flags=re.S).strip(), calls
        elif name == "llama3":
            body = text.strip()
            if body.startswith("<|python_tag|>"):
                body = body[len("<|python_tag|>"):]
            if body.startswith("{"):
                values = _json_values(body)
                if values and all(isinstance(v, dict) and "name" in v for v in values):
                    return "", [_call(v["name"], v.get("parameters", v.get("arguments", {}))) for v in values]
        elif name == "mistral_args":
            i = text.find("[TOOL_CALLS]")
            if i >= 0:
                calls = []
                for part in text[i:].split("[TOOL_CALLS]")[1:]:
                    fn, _, args = part.partition("[ARGS]")
                    calls.append(_call(fn.strip(), json.loads(args)))
                return text[:i].strip(), calls
        elif name == "functionary":
            parts = re.split(r">>>", text)
            content, calls = parts[0].strip(), []
            for part in parts[1:]:
                fn, _, body = part.partition("\n")
                if fn.strip() == "all":
                    content = (content + body).strip()
                else:
                    calls.append(_call(fn.strip(), json.loads(body)))
            if calls:
                return content, calls
        elif name == "function_tag":
            calls = [_call(m.group(1), json.loads(m.group(2)))
                     for m in re.finditer(r"<function=([^>]+)>(.*?)</function>", text, re.S)]
            if calls:
                return re.sub(r"\s*<function=[^>]+>.*?</function>\s*", "", text, flags=re.S).strip(), calls
        else:
            body = text.strip()
            if body.startswith("{"):
                obj = json.loads(body)
                if isinstance(obj.get("tool_call"), dict):
                    c = obj["tool_call"]
                    return "", [_call(c["name"], c.get("arguments", {}))]
                if isinstance(obj.get("tool_calls"), list):
                    return "", [_call(c["name"], c.get("arguments", {})) for c in obj["tool_calls"]]
                if "response" in obj:
                    r = obj["response"]
                    return r if isinstance(r, str) else json.dumps(r, ensure_ascii=False), []
    except (ValueError, KeyError, TypeError, AttributeError):  # (json.JSONDecodeError is a ValueError)
        pass
    return text.strip(), []


# ---------------------------------------------------------------------------------------------
# one assistant turn


@dataclass
class ChatTurn:
    """A rendered chat prompt and what is needed to read the reply back."""

    prompt: str
    fmt: ToolFormat
    grammar: str | None  # Lark for a required call, else None
    thinking: bool  # the prompt opened a reasoning block (<think>) the reply continues
    tools: bool
    usable: tuple = ()  # the tools a call may use (their schemas type XML arguments)

    def message(self, text: str, stop_reason: str) -> tuple[dict, str]:
        """(OpenAI-style assistant message, finish_reason) for the reply `text`."""
        if self.fmt.name == "gpt_oss":  # (its reasoning is a message of its own)
            reasoning, content, found = harmony.parse_reply(text, self.tools)
            calls = [_call(n, args) for n, args in found]
        else:
            reasoning, rest = split_reasoning(text, self.thinking, reasoning_tags(self.fmt))
            content, calls = parse(self.fmt, rest, list(self.usable)) if self.tools else (unmarked(self.fmt, rest).strip(), [])
        msg: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            msg["tool_calls"] = calls
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        finish = "tool_calls" if calls else ("length" if stop_reason == "length" else "stop")
        return msg, finish


def prepare_turn(template, messages: list[dict], tools=None, tool_choice=None, parallel: bool = False) -> ChatTurn:
    """Render `messages` (and `tools`, as transformers passes them) for the next assistant turn,
    as far as the template can take them (its probed tool_caps): tools it does not list are
    described in the system message, calls and results it cannot render become text.
    parallel: tool_choice "required" admits several calls where the format writes them."""
    fmt = detect_format(template.source)
    if tools is None:
        if tool_choice not in (None, "none", "auto"):
            raise TemplateError("tool_choice needs tools")
        toolish = any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages)
        msgs = prepare_messages(messages, fmt, template.tool_caps) if toolish else messages
        prompt = template.render(msgs, add_generation_prompt=True, **template.tool_context(None))
        return ChatTurn(prompt, fmt, None, _opens_think(prompt, fmt), False)
    caps = template.tool_caps
    tools = check_tools(tools)
    usable, required = chosen_tools(tools, tool_choice)
    msgs = prepare_messages(messages, fmt, caps)
    if usable and (not caps.supports_tools or fmt.name == "generic"):
        msgs = with_tool_description(msgs, usable, fmt, listed=not caps.supports_tools)
    # a template that does not list tools gets none (some fail on them: llama-cpp-deepseek-r1)
    listed = (usable or None) if caps.supports_tools else None
    prompt = template.render(msgs, add_generation_prompt=True, tools=listed, **template.tool_context(listed))
    grammar = call_grammar(fmt, usable, parallel and tool_choice == "required") if required else None
    return ChatTurn(prompt, fmt, grammar, _opens_think(prompt, fmt), bool(usable), tuple(usable))


def _opens_think(prompt: str, fmt: ToolFormat) -> bool:
    return prompt.rstrip().endswith(reasoning_tags(fmt)[0])
