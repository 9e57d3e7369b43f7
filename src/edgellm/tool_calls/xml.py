"""The formats whose calls are XML: each argument its own element, a text value as it is and any
other as JSON (as the templates write them)."""

from __future__ import annotations

import json
import re

from .common import MAX_ANY_ORDER, argument_list, dump, grammar_rules, json_rule, lit, parameters
from .string_formats import STRING_FORMATS

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
    # (Muse Glimmer's ATEM calls, each in a message of its own: muse.py)
    "muse_glimmer": ('<atem:invoke name="', '">\n', '<atem:parameter name="', '">', "</atem:parameter>\n", "</atem:invoke>\n"),
}
# the block around a format's calls, where one holds them all (the others write calls one after
# another, a newline between)
XML_BLOCK = {"minimax_m2": ("<minimax:tool_call>\n", "</minimax:tool_call>"),
             "deepseek_v32": (f"<{DSML}function_calls>\n", f"</{DSML}function_calls>"),
             "deepseek_v4": (f"<{DSML}tool_calls>\n", f"</{DSML}tool_calls>"),
             "hy3": (f"<tool_calls{HY}>\n", f"</tool_calls{HY}>"),
             "kimi_k3": ("<|open|>tools<|sep|>", "<|close|>tools<|sep|>"),
             "muse_glimmer": ("<atem:function_calls>\n", "</atem:function_calls>")}
# how a call is read, as the templates write it (whitespace may come between the parts): the
# literals that open it, the markers that may end its name ("<" is the next part's), what ends the
# rest of its head (None: nothing more), an argument's opening, what ends its key, what ends its
# attributes (which may say the value is text; None: it has none), what opens its value, what ends
# it, the literals that end the call. qwen3_coder / seed_oss: a value's first and last newline are
# the layout's.
XML_READ = {
    "qwen3_coder": (("<tool_call>", "<function="), (">",), None, "<parameter=", ">", None, "", "</parameter>",
                    ("</function>", "</tool_call>")),
    "seed_oss": (("<seed:tool_call>", "<function="), (">",), None, "<parameter=", ">", None, "", "</parameter>",
                 ("</function>", "</seed:tool_call>")),
    "glm": (("<tool_call>",), ("\n", "<"), None, "<arg_key>", "</arg_key>", None, "<arg_value>", "</arg_value>", ("</tool_call>",)),
    "minimax_m2": (('<invoke name="',), ('">',), None, '<parameter name="', '">', None, "", "</parameter>", ("</invoke>",)),
    **{ds: ((f'<{DSML}invoke name="',), ('">',), None, f'<{DSML}parameter name="', '"', ">", "", f"</{DSML}parameter>",
            (f"</{DSML}invoke>",)) for ds in ("deepseek_v32", "deepseek_v4")},
    "hy3": ((f"<tool_call{HY}>",), (f"<tool_sep{HY}>",), None, f"<arg_key{HY}>", f"</arg_key{HY}>", None, f"<arg_value{HY}>",
            f"</arg_value{HY}>", (f"</tool_call{HY}>",)),
    "minicpm5": (('<function name="',), ('">',), None, '<param name="', '">', None, "", "</param>", ("</function>",)),
    "kimi_k3": (('<|open|>call tool="',), ('"',), "<|sep|>", '<|open|>argument key="', '"', "<|sep|>", "", "<|close|>argument<|sep|>",
                ("<|close|>call<|sep|>",)),
    "muse_glimmer": (('<atem:invoke name="',), ('">',), None, '<atem:parameter name="', '">', None, "", "</atem:parameter>",
                     ("</atem:invoke>",)),
}
_TRIMMED = ("qwen3_coder", "seed_oss")
_SAYS_TEXT = re.compile(r'(?:string|type)="(true|string)"')  # an attribute that says the value is text
# the JSON type of a value (Kimi K3 names it), and of a schema
_KIND = ((bool, "boolean"), (type(None), "null"), ((int, float), "number"), (str, "string"), (dict, "object"), (list, "array"))
_SCHEMA_KIND = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null",
                "object": "object", "array": "array"}
CDATA = ("<![CDATA[", "]]>")  # around a value with <, & or a newline (MiniCPM5 writes them so)
_MAX_VALUE = 1 << 20  # characters of a value that is not text, read whole


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


def _rx(text: str) -> str:
    """text as a Lark regex matches it."""
    return re.escape(text).replace("\n", "n").replace("/", "\\/")  # (re.escape: backslash, newline)


def _no_end(name: str) -> str:
    """A regex of text that cannot hold format `name`'s value end: no "<" followed by the
    character that follows it in the end ("</", "<|"), so a value ends exactly there, whitespace
    and all."""
    value_end = XML[name][4]
    return f"([^<]|<[^{_rx(value_end[value_end.index('<') + 1])}])*"


def _terminals(name: str, texts: dict[str, str]) -> str:
    """An argument's key, a text value with the text that ends it (one terminal), those of the
    texts the schemas hold to a pattern, lengths or a format, the keys of a tool's arguments it
    does not list (XML_KEY_n: any but those it lists), and a call's number."""
    end = _rx(XML[name][4])
    out = f"\nXML_KEY: /[^<>\\n]+/\nXML_TEXT_END: /{_no_end(name)}{end}/\nXML_INDEX: /[1-9][0-9]*/"
    return out + "".join(f"\n{term}: ({body})" + ("" if term.startswith("XML_KEY") else f" /{end}/")
                         for body, term in texts.items())


def _alternatives(rx: str) -> list[str]:
    """A regex's top-level alternatives (split at the | outside groups and classes)."""
    out, depth, cls, i, last = [], 0, False, 0, 0
    while i < len(rx):
        c = rx[i]
        if c == "\\":
            i += 1
        elif cls:
            cls = c != "]"
        elif c == "[":
            cls = True
            if rx[i + 1:i + 2] == "]":  # ([]...] : the ] is the class's)
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(rx[last:i])
            last = i + 1
        i += 1
    return out + [rx[last:]]


def _searched(pattern: str) -> str:
    """A JSON schema's pattern as a regex the whole text matches: JSON Schema searches the text
    for it, so each alternative is open at an end where it has no ^ / $ (ECMA's \\d and \\w ASCII,
    as llguidance's JSON grammar reads them)."""
    from llguidance import regex_to_lark

    out = []
    for alt in _alternatives(regex_to_lark(pattern, "dw")):
        start, end = alt.startswith("^"), alt.endswith("$") and not alt.endswith("\\$")
        alt = alt[1 if start else 0:len(alt) - 1 if end else len(alt)]
        out.append(("" if start else "[\\s\\S]*") + f"({alt})" + ("" if end else "[\\s\\S]*"))
    return "|".join(out)


def _text_value(name: str, schema: dict, texts: dict[str, str]) -> str:
    """A text value and the end after it, held to what the JSON grammar holds a string to: its
    const or one of its enum as written, its pattern, lengths and format, all of them at once
    (texts: the terminals of such texts, by their regexes). A format the table does not know
    goes to the JSON grammar, which names it as unknown."""
    end = XML[name][4]
    enum = [schema["const"]] if "const" in schema else schema.get("enum")
    words = isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum)
    limits = []
    if isinstance(schema.get("pattern"), str):
        limits.append(_searched(schema["pattern"]))
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if isinstance(lo, int) or isinstance(hi, int):
        limits.append(f"[\\s\\S]{{{lo if isinstance(lo, int) else 0},{hi if isinstance(hi, int) else ''}}}")
    fmt = schema.get("format")
    if isinstance(fmt, str):
        if fmt not in STRING_FORMATS:
            return f"{json_rule(schema)} {lit(end)}"
        if STRING_FORMATS[fmt] is not None:
            limits.append(STRING_FORMATS[fmt].replace("/", "\\/"))
    if words and not limits:
        return "(" + " | ".join(lit(e + end) for e in enum) + ")"
    if words:
        limits.append("|".join(_rx(e) for e in enum))
    if not limits:
        return "XML_TEXT_END"
    body = " & ".join(f"/{r}/" for r in [_no_end(name)] + limits)
    return texts.setdefault(body, f"XML_TEXT_{len(texts)}")


def _value(name: str, schema, texts: dict[str, str]) -> str:
    """An argument's value and the text after it: text for a string, else JSON."""
    if _is_text(schema):
        return _text_value(name, schema, texts)
    return f"{json_rule(schema if isinstance(schema, dict) else {})} {lit(XML[name][4])}"


def _call(name: str, tool: dict, rules: dict, rule: str, texts: dict[str, str], free: bool) -> str:
    """One call of `tool`: its listed arguments in any order (argument_list: the templates write
    them in the order they are given), those not required skippable, any others (after them)
    only where its schema allows them, under keys it does not list. free: the listed ones any
    number of times, the others among them (an ArgumentGuard keeps each to once)."""
    o, n, k, _, _, e = XML[name]
    params = parameters(tool)
    named = lit(o + tool["function"]["name"] + n) if isinstance(n, str) else \
        f"{lit(o + tool['function']['name'] + n[0])} XML_INDEX {lit(n[1])}"
    props = properties(tool)
    required = set(params.get("required") or [])
    items = []
    for key, schema in props.items():
        kind = _SCHEMA_KIND.get(schema.get("type"), "object") if isinstance(schema, dict) else "object"
        items.append((f"{lit(k + key + _kv(name, kind))} {_value(name, schema, texts)}", key in required))
    other = None
    if params.get("additionalProperties") is not False:
        key = "XML_KEY"
        if props:  # (a listed key is written as listed)
            key = texts.setdefault("/[^<>\\n]+/ & ~/(" + "|".join(_rx(p) for p in props) + ")/", f"XML_KEY_{len(texts)}")
        other = f"{lit(k)} {key} {lit(_kv(name, 'string'))} XML_TEXT_END"
    if free:
        return f"{named} ({' | '.join(f'({it})' for it, _ in items + [(other, False)] if it)})* {lit(e)}"
    return " ".join([named + argument_list(items, "", rules, rule)] + ([f"({other})*"] if other else []) + [lit(e)])


def properties(tool: dict) -> dict:
    """The arguments a tool lists: name -> schema."""
    props = parameters(tool).get("properties")
    return props if isinstance(props, dict) else {}


def _free(tool: dict) -> bool:
    """Whether a call of `tool` takes its arguments in any order and number, for an ArgumentGuard
    to keep each to once: more than MAX_ANY_ORDER of them, none of whose keys holds what ends a
    key (so no argument's opening begins another's)."""
    props = properties(tool)
    return len(props) > MAX_ANY_ORDER and not any(c in key for key in props for c in "<>\n")


def free_order(tools: list[dict]) -> bool:
    """Whether a grammar of `tools` lets some call's arguments repeat: an ArgumentGuard must go
    with it."""
    return any(_free(t) for t in tools)


def call_rules(name: str, tools: list[dict], around=None, free: bool = False) -> str:
    """Lark: the rule `one`, a call of one of `tools` in format `name` (its block aside; around:
    a tool -> the texts written before and after its call), and the rules and terminals it needs.
    free: the arguments of a tool with more than MAX_ANY_ORDER in any order and number (_free; the
    grammar needs an ArgumentGuard then); else in the order listed beyond that."""
    rules: dict[str, str] = {}
    texts: dict[str, str] = {}
    calls = []
    for i, t in enumerate(tools):
        before, after = around(t) if around else ("", "")
        many = free and _free(t)
        call = _call(name, t, rules, f"args{i}", texts, many)
        calls.append(f"({lit(before) + ' ' if before else ''}{call}{' ' + lit(after) if after else ''})")
    return f"one: {' | '.join(calls)}{grammar_rules(rules)}{_terminals(name, texts)}"


def grammar(name: str, tools: list[dict], parallel: bool) -> str:
    free = free_order(tools)
    rules = call_rules(name, tools, free=free)
    if name in XML_BLOCK:  # the calls in one block
        text = f"start: {lit(XML_BLOCK[name][0])} one{' one*' if parallel else ''} {lit(XML_BLOCK[name][1])}\n{rules}"
    else:
        text = f"start: one{' (' + lit(chr(10)) + ' one)*' if parallel else ''}\n{rules}"
    if not free:
        return text
    from ..constrain import guarded
    from .argument_guard import ArgumentGuard

    return guarded(text, ArgumentGuard(name, tools, parallel))


def read(name: str, s, tools):
    """The reader of a reply's body (scan.py)."""
    if tools is None:
        return (yield from s.rest())
    by_name = {t["function"]["name"]: t for t in tools}
    block = tuple(b.strip() for b in XML_BLOCK[name]) if name in XML_BLOCK else None
    starts = block[0] if block else XML_READ[name][0][0]
    while (yield from s.content_until(starts)) is not None:
        start = s.pos - len(starts)
        if not (yield from read_calls(name, s, by_name)):
            s.release(start)


def read_calls(name: str, s, by_name: dict):
    """The calls after the text that opens them (a block's opening, else the first call's first
    literal): how many begun (none: the text read is no call's, nothing said of it)."""
    head = XML_READ[name][0]
    block = tuple(b.strip() for b in XML_BLOCK[name]) if name in XML_BLOCK else None
    begun, ok = 0, True
    while True:
        if (block is not None or begun) and not (yield from s.opens(head[0])):
            break  # (the block's end, or no more calls)
        ok = yield from _read_call(name, s, by_name)
        if ok is None:  # no call after all
            ok = False
            break
        begun += 1
        if not ok or block is None:
            break
    if block is not None:
        ok = ok and (yield from s.opens(block[1]))
    if begun:
        s.end() if ok else s.cut()
    return begun


def _read_call(name: str, s, by_name: dict):
    """One call, its head's first literal read: whether it is complete; None where its head
    turns out to be no call's (nothing said of it)."""
    head, name_ends, head_end, arg, key_end, attrs_end, value_open, value_end, call_end = XML_READ[name]
    for literal in head[1:]:
        if not (yield from s.opens(literal)):
            return None
    got = yield from s.until(*name_ends)
    if got is None or not got[0].strip() or "<" in got[0]:
        return None
    if got[1] == "<":  # (glm: the next part's)
        s.pos -= 1
    if head_end is not None and (yield from s.until(head_end)) is None:
        return None
    fn = got[0].strip()
    s.call(fn)
    props = ((by_name.get(fn) or {}).get("function", {}).get("parameters") or {}).get("properties")
    props = props if isinstance(props, dict) else {}
    s.args("{")
    first = True
    while (yield from s.opens(arg)):
        key = yield from s.until(key_end)
        attrs = ("", "")
        if key is not None and attrs_end is not None:
            attrs = yield from s.until(attrs_end)
        if key is None or attrs is None or not (yield from s.opens(value_open)):
            return False
        s.args(("" if first else ", ") + dump(key[0].strip()) + ": ")
        first = False
        said = _SAYS_TEXT.search(attrs[0])
        if not (yield from _read_value(name, s, value_end, _is_text(props.get(key[0].strip())) or said is not None)):
            return False
    s.args("}")
    for literal in call_end:
        if not (yield from s.opens(literal)):
            return False
    return True


def _read_value(name: str, s, end: str, text: bool):
    """An argument's value up to `end`, sent as JSON: text (CDATA, or where the schema or the
    format says so) as it comes, anything else whole (its JSON, or as text if it is none);
    whether it ended."""
    trim = name in _TRIMMED
    if trim and (yield from s.wait(1)) and s.text[s.pos] == "\n":
        s.pos += 1
    if (yield from s.opens(CDATA[0], ws=False)):
        s.args('"')
        if not (yield from s.stream_until(CDATA[1], lambda t: s.args(dump(t)[1:-1]))):
            return False
        s.args('"')
        return (yield from s.opens(end, ws=False))
    if text:
        s.args('"')
        if not (yield from s.stream_until(end, lambda t: s.args(dump(t)[1:-1]), trim)):
            return False
        s.args('"')
        return True
    got = yield from s.until(end, limit=_MAX_VALUE)
    if got is None:
        return False
    raw = got[0][:-1] if trim and got[0].endswith("\n") else got[0]
    try:
        s.args(dump(json.loads(raw)))
    except ValueError:
        s.args(dump(raw))
    return True
