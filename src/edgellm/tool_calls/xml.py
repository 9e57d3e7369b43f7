"""The formats whose calls are XML: each argument its own element, a text value as it is and any
other as JSON (as the templates write them)."""

from __future__ import annotations

import json
import re

from .common import dump, json_rule, lit, make_call, parameters, without

DSML = "｜DSML｜"  # DeepSeek V3.2 / V4's markers' prefix
HY = ":opensource"  # Hunyuan 3's markers' suffix
# name -> (call opening before the name, after it - or (before, after) the call's number, from 1 -,
# argument before its key, between key and value - or (for a text value, for a JSON one) where they
# differ, or a function of the value's JSON type -, after the value, call end)
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
    "minicpm5": ('<function name="', '">', '<param name="', '">', "</param>", "</function>"),
    "kimi_k3": ('<|open|>call tool="', ('" index="', '"<|sep|>'), '<|open|>argument key="', lambda kind: f'" type="{kind}"<|sep|>',
                "<|close|>argument<|sep|>", "<|close|>call<|sep|>"),
}
# the block around a format's calls, where one holds them all (the others write calls one after
# another, a newline between)
XML_BLOCK = {"minimax_m2": ("<minimax:tool_call>\n", "</minimax:tool_call>"),
             "deepseek_v32": (f"<{DSML}function_calls>\n", f"</{DSML}function_calls>"),
             "deepseek_v4": (f"<{DSML}tool_calls>\n", f"</{DSML}tool_calls>"),
             "hy3": (f"<tool_calls{HY}>\n", f"</tool_calls{HY}>"),
             "kimi_k3": ("<|open|>tools<|sep|>", "<|close|>tools<|sep|>")}
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
    "minicpm5": (r'<function name="([^"]+)">(.*?)</function>', r'<param name="([^"]+)">(.*?)</param>'),
    "kimi_k3": (r'<\|open\|>call tool="([^"]+)"[^<]*<\|sep\|>(.*?)<\|close\|>call<\|sep\|>',
                r'<\|open\|>argument key="([^"]+)" type="([a-z]+)"<\|sep\|>(.*?)<\|close\|>argument<\|sep\|>'),
}
# the JSON type of a value (Kimi K3 names it), and of a schema
_KIND = ((bool, "boolean"), (type(None), "null"), ((int, float), "number"), (str, "string"), (dict, "object"), (list, "array"))
_SCHEMA_KIND = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null",
                "object": "object", "array": "array"}
CDATA = ("<![CDATA[", "]]>")  # around a value with <, & or a newline (MiniCPM5 writes them so)


def markers(name: str) -> tuple[str, ...]:
    """The texts format `name` writes around a call's parts and its block (formats.preserved_markers)."""
    parts = [_kv(name, kind) for kind in ("string", "object")] + [_after_name(name, 0)]
    parts += [p for p in XML[name] if isinstance(p, str)] + list(XML_BLOCK.get(name, ()))
    return tuple(dict.fromkeys(parts))


def _kv(name: str, kind: str) -> str:
    """What format `name` writes between an argument's key and a value of JSON type `kind`."""
    kv = XML[name][3]
    if callable(kv):
        return kv(kind)
    return kv if isinstance(kv, str) else kv[0 if kind == "string" else 1]


def _kind_of(value) -> str:
    return next(k for t, k in _KIND if isinstance(value, t))


def _after_name(name: str, i: int) -> str:
    n = XML[name][1]
    return n if isinstance(n, str) else f"{n[0]}{i + 1}{n[1]}"


def _is_text(schema) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "string"


def write(name: str, calls: list[dict]) -> str:
    o, _, k, _, v, e = XML[name]
    text = lambda x: x if isinstance(x, str) else dump(x)  # noqa: E731
    one = [o + c["name"] + _after_name(name, i) + "".join(k + key + _kv(name, _kind_of(val)) + text(val) + v
                                                          for key, val in c["arguments"].items()) + e
           for i, c in enumerate(calls)]
    if name in XML_BLOCK:
        return XML_BLOCK[name][0] + "".join(one) + XML_BLOCK[name][1]
    return "\n".join(one)


# an argument's key, a text value with the text that ends it (one terminal: the text has no "<"
# followed by the character that follows it in the end - "</", "<|" -, so it ends exactly there,
# whitespace and all) and a call's number
def _terminals(name: str) -> str:
    value_end = XML[name][4]
    after = value_end[value_end.index("<") + 1]
    end, after = (re.escape(x).replace("\n", "n").replace("/", "\\/") for x in (value_end, after))  # (re.escape: backslash, newline)
    return f"\nXML_KEY: /[^<>\\n]+/\nXML_TEXT_END: /([^<]|<[^{after}])*{end}/\nXML_INDEX: /[1-9][0-9]*/"


def _value(name: str, schema) -> str:
    """An argument's value and the text after it: text for a string (one of its enum), else JSON."""
    if _is_text(schema):
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum):
            return "(" + " | ".join(lit(e + XML[name][4]) for e in enum) + ")"
        return "XML_TEXT_END"
    return f"{json_rule(schema if isinstance(schema, dict) else {})} {lit(XML[name][4])}"


def _call(name: str, tool: dict) -> str:
    """One call of `tool`: its listed arguments in their order (those not required may be left
    out), any others only where its schema allows them."""
    o, n, k, _, _, e = XML[name]
    params = parameters(tool)
    named = lit(o + tool["function"]["name"] + n) if isinstance(n, str) else \
        f"{lit(o + tool['function']['name'] + n[0])} XML_INDEX {lit(n[1])}"
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = set(params.get("required") or [])
    parts = [named]
    for key, schema in props.items():
        kind = _SCHEMA_KIND.get(schema.get("type"), "object") if isinstance(schema, dict) else "object"
        parts.append(f"({lit(k + key + _kv(name, kind))} {_value(name, schema)})"
                     + ("" if key in required else "?"))
    if params.get("additionalProperties") is not False:
        parts.append(f"({lit(k)} XML_KEY {lit(_kv(name, 'string'))} XML_TEXT_END)*")
    return " ".join(parts + [lit(e)])


def grammar(name: str, tools: list[dict], parallel: bool) -> str:
    calls = " | ".join(f"({_call(name, t)})" for t in tools)
    if name in XML_BLOCK:  # the calls in one block
        return (f"start: {lit(XML_BLOCK[name][0])} one{' one*' if parallel else ''} {lit(XML_BLOCK[name][1])}\n"
                f"one: {calls}{_terminals(name)}")
    return f"start: one{' (' + lit(chr(10)) + ' one)*' if parallel else ''}\none: {calls}{_terminals(name)}"


def _args(name: str, body: str, tool: dict | None) -> dict:
    """A call's arguments: a value stays text where the format says so (DeepSeek's string="true",
    Kimi K3's type="string")
    or the tool's schema says string (or it is not JSON), else its JSON."""
    pattern = XML_READ[name][1]
    props = ((tool or {}).get("function", {}).get("parameters") or {}).get("properties") or {}
    args = {}
    for m in re.finditer(pattern, body, re.S):
        key, raw = m.group(1).strip(), m.group(m.lastindex)
        if raw.startswith(CDATA[0]) and raw.endswith(CDATA[1]):
            args[key] = raw[len(CDATA[0]):-len(CDATA[1])]
            continue
        schema = props.get(key) if isinstance(props, dict) else None
        if _is_text(schema) or (m.lastindex == 3 and m.group(2) in ("true", "string")):
            args[key] = raw
            continue
        try:
            args[key] = json.loads(raw)
        except json.JSONDecodeError:
            args[key] = raw
    return args


def parse(name: str, text: str, tools) -> tuple[str, list[dict]] | None:
    """(content, calls); None without a call. tools: the request's (their schemas say which
    values are text)."""
    by_name = {t["function"]["name"]: t for t in tools or []}
    pattern = XML_READ[name][0]
    block = XML_BLOCK.get(name)
    spans = list(re.finditer(re.escape(block[0].strip()) + "(.*?)" + re.escape(block[1]) if block else pattern, text, re.S))
    found = [m for b in spans for m in re.finditer(pattern, b.group(1), re.S)] if block else spans
    if not found:
        return None
    calls = [make_call(m.group(1).strip(), _args(name, m.group(2), by_name.get(m.group(1).strip()))) for m in found]
    return without(text, [m.span() for m in spans]), calls
