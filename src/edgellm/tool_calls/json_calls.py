"""The formats that write each call's arguments as JSON with the format's own markers around the
call: Hermes' <tool_call>, Llama 3's bare JSON, Mistral's [TOOL_CALLS]name[ARGS], Functionary's,
DeepSeek R1 / V3.1's, Kimi K2's and Solar Open's call sections, and the generic {"tool_call": ...}."""

from __future__ import annotations

import re

from .common import call_schema, dump, json_rule, lit, parameters, per_tool
from .scan import CallsIn, decode, json_arguments

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


# the formats whose call is a header naming the tool, then its arguments as a JSON object: (the
# block around the calls - its opening, its closing or None - or None, a call's opening, its header
# up to the arguments' "{" (a pattern, group 1 the name; functionary's ends at its newline), what
# follows the arguments)
_ESC = re.escape
HEADED = {
    "mistral_args": (None, MISTRAL[0], rf"\s*([\w.\-]+)\s*{_ESC(MISTRAL[1])}\s*", ()),
    "functionary": (None, FUNCTIONARY, r"\s*([\w.\-]+)\s*", ()),
    "function_tag": (None, FUNCTION_TAG[0], r"([\w.\-]+)>\s*", (FUNCTION_TAG[1],)),
    "deepseek_r1": ((DS_CALLS_BEGIN, DS_CALLS_END), DS_CALL_BEGIN,
                    rf"\s*(?:function)?\s*{_ESC(DS_SEP)}\s*([^\n{{]+?)\s*```(?:json)?\s*", ("```", DS_CALL_END)),
    "deepseek_v3": ((DS_CALLS_BEGIN, DS_CALLS_END), DS_CALL_BEGIN, rf"\s*([^{{<]+?)\s*{_ESC(DS_SEP)}\s*", (DS_CALL_END,)),
    "kimi_k2": ((KIMI[0], KIMI[4]), KIMI[1], rf"\s*(?:functions\.)?([^<:{{]+?)(?::\d+)?\s*{_ESC(KIMI[2])}\s*", (KIMI[3],)),
    "solar_open": ((SOLAR[0], None), SOLAR[1], rf"[^<{{]*{_ESC(SOLAR[2])}\s*([^<{{]+?)\s*{_ESC(SOLAR[3])}\s*", (SOLAR[4],)),
}


def read(name: str, s, tools):
    """The reader of a reply's body (scan.py)."""
    if tools is None:
        return (yield from s.rest())
    if name == "hermes":
        return (yield from _read_hermes(s))
    if name in HEADED:
        return (yield from _read_headed(name, s))
    return (yield from _read_leading(name, s))


def _read_hermes(s):
    while (yield from s.content_until(HERMES[0])) is not None:
        start = s.pos - len(HERMES[0])
        calls = CallsIn(s)
        if (yield from s.first()) == "{":
            j = yield from s.json(lambda j: calls.update(j, [()]))
            if calls.begun:
                if j.end is not None and (yield from s.opens(HERMES[1])):
                    s.end()
                else:
                    s.cut()
                continue
        s.release(start)


def _read_headed(name: str, s):
    block, opening, head, after = HEADED[name]
    head = re.compile(head, re.S)
    starts = block[0] if block else opening
    while (yield from s.content_until(starts)) is not None:
        start, begun, ok = s.pos - len(starts), 0, True
        while ok:
            if block is not None and not (yield from s.opens(opening)):
                break  # (the block's end, or no call)
            got = yield from s.until("\n" if name == "functionary" else "{")
            m = got and head.fullmatch(got[0])
            if m and name == "functionary" and m.group(1) == FUNCTIONARY_TEXT:  # >>>all: text follows
                break
            if name != "functionary" and got:
                s.pos -= 1  # (back to the arguments' "{")
            if not m or (yield from s.first()) != "{":
                ok = False
                break
            s.call(m.group(1))
            begun += 1
            ok = yield from json_arguments(s)
            for marker in after:
                ok = ok and (yield from s.opens(marker))
            if block is None:
                break
        if block is not None and block[1] is not None:
            ok = ok and (yield from s.opens(block[1]))
        if begun:
            s.end() if ok else s.cut()
        elif not ok:
            s.release(start)


def _read_leading(name: str, s):
    """llama3's calls (JSON objects, maybe after <|python_tag|>, ";" or whitespace between) and
    the generic format's ({"tool_call": ...}, {"tool_calls": [...]} or {"response": ...}), at the
    start of the reply; anything after them is content."""
    start, begun = s.pos, 0
    if name == "llama3":
        yield from s.opens(PYTHON_TAG)
    while (yield from s.first()) == "{":
        at = s.pos
        calls = CallsIn(s, "name", ("parameters", "arguments"))
        said = []  # the generic format's answer, once its value is whole

        def update(j):
            keys = j.keys.get((), [])
            if name == "llama3":
                if not keys or keys[0] in ("name", "parameters", "arguments"):
                    calls.update(j, [()])
            elif keys[:1] == ["tool_call"]:
                calls.update(j, [("tool_call",)])
            elif keys[:1] == ["tool_calls"]:
                calls.update(j, j.items(("tool_calls",)))
            elif keys[:1] == ["response"] and not s.json_answer and j.complete(("response",)) and not said:
                raw = j.span_text(s.text, ("response",))
                value = decode(raw)
                said.append(value if isinstance(value, str) else raw)

        j = yield from s.json(update)
        begun += calls.begun
        if said:
            s.say(said[0])
        elif not calls.begun:  # no call: content, and all after it
            s.release(at if begun else start)
        elif j.end is not None:
            s.end()
        if name != "llama3" or not calls.begun or j.end is None:
            break
        while (yield from s.opens(";")):
            pass
    yield from s.rest()
