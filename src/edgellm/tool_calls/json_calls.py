"""The formats that write each call's arguments as JSON with the format's own markers around the
call: Hermes' <tool_call>, Llama 3's bare JSON, Mistral's [TOOL_CALLS]name[ARGS], Functionary's,
DeepSeek R1 / V3.1's, Kimi K2's and Solar Open's call sections, and the generic {"tool_call": ...}."""

from __future__ import annotations

import json
import re

from .common import call_schema, dump, json_rule, json_values, lit, make_call, parameters, per_tool

DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
KIMI = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
        "<|tool_calls_section_end|>")
# Solar Open: the section's opening, then each call: opening, its id, before its name, before its arguments, end
SOLAR = ("<|tool_calls|>", "<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>", "<|tool_call:end|>")
PYTHON_TAG = "<|python_tag|>"  # Llama 3.x may open its JSON call with it
HERMES = ("<tool_call>", "</tool_call>")  # around each call
MISTRAL = ("[TOOL_CALLS]", "[ARGS]")  # before each call's name, before its arguments (Mistral Small 3.2)
FUNCTIONARY = ">>>"  # before each call's name (v3.2)
FUNCTION_TAG = ("<function=", "</function>")  # before a call's name, after its arguments (v3.1)
FUNCTIONARY_TEXT = "all"  # Functionary's ">>>all\n" introduces text, not a call
# the formats here that write several calls one after another, and the text between two of them
PARALLEL = {"hermes": "\n", "mistral_args": "", "function_tag": ""}
# each format's markers (formats.preserved_markers: they stay in a reply's text)
_DEEPSEEK = (DS_CALLS_BEGIN, DS_CALL_BEGIN, DS_SEP, DS_CALL_END, DS_CALLS_END)
MARKERS = {"hermes": HERMES, "llama3": (PYTHON_TAG,), "mistral_args": MISTRAL, "functionary": (FUNCTIONARY,),
           "function_tag": FUNCTION_TAG, "deepseek_r1": _DEEPSEEK, "deepseek_v3": _DEEPSEEK, "kimi_k2": KIMI,
           "solar_open": SOLAR}


def markers(name: str) -> tuple[str, ...]:
    return MARKERS.get(name, ())


def write(name: str, calls: list[dict]) -> str:
    if name == "hermes":
        return "\n".join(f"{HERMES[0]}\n{dump(c)}\n{HERMES[1]}" for c in calls)
    if name == "llama3":
        return "\n".join(dump({"name": c["name"], "parameters": c["arguments"]}) for c in calls)
    if name == "mistral_args":
        return "".join(f"{MISTRAL[0]}{c['name']}{MISTRAL[1]}{dump(c['arguments'])}" for c in calls)
    if name == "functionary":
        return "".join(f"{FUNCTIONARY}{c['name']}\n{dump(c['arguments'])}" for c in calls)
    if name == "function_tag":
        return "".join(f"{FUNCTION_TAG[0]}{c['name']}>{dump(c['arguments'])}{FUNCTION_TAG[1]}" for c in calls)
    if name in ("deepseek_r1", "deepseek_v3"):
        one = (lambda c: f"function{DS_SEP}{c['name']}\n```json\n{dump(c['arguments'])}\n```") if name == "deepseek_r1" \
            else (lambda c: f"{c['name']}{DS_SEP}{dump(c['arguments'])}")
        between = "\n" if name == "deepseek_r1" else ""
        return DS_CALLS_BEGIN + between.join(DS_CALL_BEGIN + one(c) + DS_CALL_END for c in calls) + DS_CALLS_END
    if name == "solar_open":  # (the ids: ten lowercase letters and digits, as the template asks)
        return SOLAR[0] + "".join(f"{SOLAR[1]}{i:010d}{SOLAR[2]}{c['name']}{SOLAR[3]}{dump(c['arguments'])}{SOLAR[4]}"
                                  for i, c in enumerate(calls))
    if name == "kimi_k2":
        return KIMI[0] + "".join(f"{KIMI[1]}functions.{c['name']}:{i}{KIMI[2]}{dump(c['arguments'])}{KIMI[3]}"
                                 for i, c in enumerate(calls)) + KIMI[4]
    return dump({"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls})


def grammar(name: str, tools: list[dict], parallel: bool) -> str:
    def one_of(args_key="arguments"):
        return {"anyOf": [call_schema(t, args_key) for t in tools]}

    if name in ("deepseek_r1", "deepseek_v3"):  # the calls between DS_CALLS_BEGIN and DS_CALLS_END
        if name == "deepseek_r1":
            call = per_tool(tools, DS_CALL_BEGIN + "function" + DS_SEP, "\n```json\n", "\n```" + DS_CALL_END)
        else:
            call = per_tool(tools, DS_CALL_BEGIN, DS_SEP, DS_CALL_END)
        more = (f" ({lit(chr(10))} one)*" if name == "deepseek_r1" else " one*") if parallel else ""
        return f"start: {lit(DS_CALLS_BEGIN)} one{more} {lit(DS_CALLS_END)}\none: {call}"
    if name == "solar_open":  # each call with its id (<|calls|>, which ends them, ends generation)
        call = " | ".join(f"({lit(SOLAR[1])} SOLAR_ID {lit(SOLAR[2] + t['function']['name'] + SOLAR[3])} "
                          f"{json_rule(parameters(t))} {lit(SOLAR[4])})" for t in tools)
        return f"start: {lit(SOLAR[0])} one{' one*' if parallel else ''}\none: {call}\nSOLAR_ID: /[a-z0-9]{{10}}/"
    if name == "kimi_k2":  # the calls between KIMI[0] and KIMI[4], each numbered
        call = " | ".join(f"({lit(KIMI[1] + 'functions.' + t['function']['name'] + ':')} KIMI_INDEX {lit(KIMI[2])} "
                          f"{json_rule(parameters(t))} {lit(KIMI[3])})" for t in tools)
        return (f"start: {lit(KIMI[0])} one{' one*' if parallel else ''} {lit(KIMI[4])}\none: {call}"
                "\nKIMI_INDEX: /[0-9]+/")
    rules = ""
    if name == "hermes":
        call, rules = f"{lit(HERMES[0] + chr(10))} call {lit(chr(10) + HERMES[1])}", f"\ncall: {json_rule(one_of())}"
    elif name == "llama3":
        call = json_rule(one_of("parameters"))
    elif name == "mistral_args":
        call = per_tool(tools, *MISTRAL)
    elif name == "functionary":
        call = per_tool(tools, FUNCTIONARY, "\n")
    elif name == "function_tag":
        call = per_tool(tools, FUNCTION_TAG[0], ">", FUNCTION_TAG[1])
    else:
        call = json_rule({"type": "object", "properties": {"tool_call": one_of()}, "required": ["tool_call"],
                          "additionalProperties": False})
    if parallel and name in PARALLEL:
        sep = f"{lit(PARALLEL[name])} " if PARALLEL[name] else ""
        return f"start: one ({sep}one)*\none: {call}{rules}"
    return f"start: {call}{rules}"


def parse(name: str, text: str, tools) -> tuple[str, list[dict]] | None:
    """(content, calls); None where there is no call (a JSON error raises)."""
    if name in ("deepseek_r1", "deepseek_v3"):
        i = text.find(DS_CALLS_BEGIN)
        if i >= 0 and text.find(DS_CALLS_END, i) >= 0:
            b, e = re.escape(DS_CALL_BEGIN), re.escape(DS_CALL_END)
            pattern = (b + r"(?:function)?" + re.escape(DS_SEP) + r"([^\n]+)\n```(?:json)?\n(.*?)\n```\s*" + e
                       if name == "deepseek_r1" else b + r"(.*?)" + re.escape(DS_SEP) + r"(.*?)" + e)
            calls = [make_call(m.group(1).strip(), json.loads(m.group(2))) for m in re.finditer(pattern, text[i:], re.S)]
            if calls:
                return text[:i].strip(), calls
    elif name == "kimi_k2":
        i = text.find(KIMI[0])
        if i >= 0 and text.find(KIMI[4], i) >= 0:
            b, a, e = (re.escape(m) for m in KIMI[1:4])
            calls = [make_call(m.group(1).strip(), json.loads(m.group(2)))
                     for m in re.finditer(b + r"\s*(?:functions\.)?([^<:]+?)(?::\d+)?\s*" + a + r"(.*?)" + e, text[i:], re.S)]
            if calls:
                return text[:i].strip(), calls
    elif name == "solar_open":
        i = text.find(SOLAR[0])
        if i >= 0:
            b, n, a, e = (re.escape(m) for m in SOLAR[1:])
            calls = [make_call(m.group(1).strip(), json.loads(m.group(2)))
                     for m in re.finditer(b + r"[^<]*" + n + r"(.*?)" + a + r"(.*?)" + e, text[i:], re.S)]
            if calls:
                return text[:i].strip(), calls
    elif name == "hermes":
        calls = []
        for m in re.finditer(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.S):
            obj = json.loads(m.group(1))
            calls.append(make_call(obj["name"], obj.get("arguments", {})))
        if calls:
            return re.sub(r"\s*<tool_call>.*?</tool_call>\s*", "", text, flags=re.S).strip(), calls
    elif name == "llama3":
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):]
        if body.startswith("{"):
            values = json_values(body)
            if values and all(isinstance(v, dict) and "name" in v for v in values):
                return "", [make_call(v["name"], v.get("parameters", v.get("arguments", {}))) for v in values]
    elif name == "mistral_args":
        i = text.find(MISTRAL[0])
        if i >= 0:
            calls = []
            for part in text[i:].split(MISTRAL[0])[1:]:
                fn, _, args = part.partition(MISTRAL[1])
                calls.append(make_call(fn.strip(), json.loads(args)))
            return text[:i].strip(), calls
    elif name == "functionary":
        parts = text.split(FUNCTIONARY)
        content, calls = parts[0].strip(), []
        for part in parts[1:]:
            fn, _, body = part.partition("\n")
            if fn.strip() == FUNCTIONARY_TEXT:
                content = (content + body).strip()
            else:
                calls.append(make_call(fn.strip(), json.loads(body)))
        if calls:
            return content, calls
    elif name == "function_tag":
        calls = [make_call(m.group(1), json.loads(m.group(2)))
                 for m in re.finditer(r"<function=([^>]+)>(.*?)</function>", text, re.S)]
        if calls:
            return re.sub(r"\s*<function=[^>]+>.*?</function>\s*", "", text, flags=re.S).strip(), calls
    else:  # generic
        body = text.strip()
        if body.startswith("{"):
            obj = json.loads(body)
            if isinstance(obj.get("tool_call"), dict):
                c = obj["tool_call"]
                return "", [make_call(c["name"], c.get("arguments", {}))]
            if isinstance(obj.get("tool_calls"), list):
                return "", [make_call(c["name"], c.get("arguments", {})) for c in obj["tool_calls"]]
            if "response" in obj:
                r = obj["response"]
                return (r if isinstance(r, str) else dump(r)), []
    return None
