"""llama.cpp's GBNF grammars, translated to the Lark syntax llguidance reads, meaning what they
mean to llama.cpp.

llama.cpp matches a GBNF grammar one character at a time with no lexer, so `num ::= [0-9]+ ws`
followed by "\\n" may end with the newline, whatever `ws` could also have taken. llguidance's own
converter turns rules made only of characters into greedy lexemes, and a greedy `ws` then
swallows that newline: llama.cpp's arithmetic.gbnf could never end. Here every GBNF rule stays
a parser rule and only literals and character classes become lexemes, so llguidance's Earley
parser sees the grammar llama.cpp sees.

Syntax (llama.cpp's grammars/README.md): `name ::= alternatives`, `|`, `( ... )`, "literals"
and [character classes] with \\n \\t \\r \\\\ \\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH escapes, `.` for
any character, `*` `+` `?` `{m}` `{m,}` `{m,n}`, `<token>` special tokens, `#` comments;
newlines end a rule except inside parentheses or after `::=` or `|`.
"""

from __future__ import annotations

import json
import re

from .errors import GrammarError

_NAME = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^",
            "/": "/", "'": "'"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


class _Parser:
    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.refs: list[tuple[str, int]] = []  # rule references, checked once all rules are read

    def fail(self, message: str, at: int | None = None):
        at = self.i if at is None else at
        line = self.s.count("\n", 0, at) + 1
        col = at - (self.s.rfind("\n", 0, at) + 1) + 1
        near = self.s[at : at + 20].split("\n", 1)[0]
        raise GrammarError(f"invalid grammar: {message} at line {line}, column {col} (near {near!r})")

    def space(self, newlines: bool) -> None:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "#":
                while self.i < len(s) and s[self.i] not in "\r\n":
                    self.i += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            else:
                return

    def name(self) -> str:
        m = _NAME.match(self.s, self.i)
        if not m:
            self.fail("expected a rule name")
        self.i = m.end()
        return m.group()

    def char(self) -> str:
        """One character of a literal or class, escapes decoded."""
        s = self.s
        if self.i >= len(s):
            self.fail("unexpected end of grammar")
        c = s[self.i]
        if c != "\\":
            self.i += 1
            return c
        if self.i + 1 >= len(s):
            self.fail("unexpected end of grammar after \\")
        e = s[self.i + 1]
        if e in _HEX_DIGITS:
            n = _HEX_DIGITS[e]
            digits = s[self.i + 2 : self.i + 2 + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                self.fail(f"\\{e} needs {n} hex digits")
            self.i += 2 + n
            code = int(digits, 16)
            if code > 0x10FFFF:
                self.fail(f"\\{e}{digits} is not a Unicode character")
            return chr(code)
        if e not in _ESCAPES:
            self.fail(f"unknown escape \\{e}")
        self.i += 2
        return _ESCAPES[e]

    def literal(self) -> str:
        self.i += 1  # "
        out = []
        while self.i < len(self.s) and self.s[self.i] != '"':
            if self.s[self.i] in "\r\n":
                self.fail("a literal may not span lines")
            out.append(self.char())
        if self.i >= len(self.s):
            self.fail("unterminated literal")
        self.i += 1
        return "".join(out)

    def char_class(self) -> str:
        start = self.i
        self.i += 1  # [
        negated = self.s.startswith("^", self.i)
        if negated:
            self.i += 1
        parts = []
        while self.i < len(self.s) and self.s[self.i] != "]":
            lo = self.char()
            if self.s.startswith("-", self.i) and not self.s.startswith("-]", self.i):
                self.i += 1
                hi = self.char()
                if ord(hi) < ord(lo):
                    self.fail("character range out of order", start)
                parts.append(f"{_re_char(lo)}-{_re_char(hi)}")
            else:
                parts.append(_re_char(lo))
        if self.i >= len(self.s):
            self.fail("unterminated character class", start)
        self.i += 1
        if not parts:
            self.fail("empty character class", start)
        return f"/[{'^' if negated else ''}{''.join(parts)}]/"

    def repetition(self, atom: str) -> str:
        s = self.s
        if self.i < len(s) and s[self.i] in "*+?":
            op = s[self.i]
            self.i += 1
            return f"{atom}{op}"
        if s.startswith("{", self.i):
            m = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}").match(s, self.i)
            if not m:
                self.fail("expected {m}, {m,} or {m,n}")
            self.i = m.end()
            lo, comma, hi = m.group(1), m.group(2), m.group(3)
            if hi and int(hi) < int(lo):
                self.fail("repetition {m,n} with n < m")
            return f"{atom}{{{lo}{',' + hi if comma else ''}}}" if comma else f"{atom}{{{lo}}}"
        return atom

    def sequence(self, nested: bool) -> str:
        items = []
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            at = self.i
            if c == '"':
                text = self.literal()
                atom = json.dumps(text, ensure_ascii=False) if text else '""'
            elif c == "[":
                atom = self.char_class()
            elif c == ".":
                self.i += 1
                atom = "/(?s:.)/"
            elif c == "(":
                self.i += 1
                self.space(True)
                inner = self.alternatives(True)
                if not s.startswith(")", self.i):
                    self.fail("expected )")
                self.i += 1
                atom = f"({inner})"
            elif c == "<":
                end = s.find(">", self.i)
                if end < 0 or "\n" in s[self.i:end]:
                    self.fail("unterminated <token>")
                atom = s[self.i : end + 1]
                self.i = end + 1
            elif _NAME.match(s, self.i):
                name = self.name()
                self.refs.append((name, at))
                atom = _rule_name(name)
            else:
                break
            items.append(self.repetition(atom))
            self.space(nested)
        return " ".join(items) if items else '""'

    def alternatives(self, nested: bool) -> str:
        alts = [self.sequence(nested)]
        while self.s.startswith("|", self.i):
            self.i += 1
            self.space(True)
            alts.append(self.sequence(nested))
        return " | ".join(alts)

    def rules(self) -> dict[str, str]:
        out: dict[str, str] = {}
        s = self.s
        while True:
            self.space(True)
            if self.i >= len(s):
                return out
            at = self.i
            name = self.name()
            self.space(False)
            if not s.startswith("::=", self.i):
                self.fail(f"expected ::= after rule name {name!r}")
            self.i += 3
            self.space(True)
            body = self.alternatives(False)
            if self.i < len(s) and s[self.i] not in "\r\n":
                self.fail("unexpected character")
            if name in out:
                self.fail(f"rule {name!r} is defined twice", at)
            out[name] = body


def _re_char(c: str) -> str:
    """c inside a regex character class (Rust regex syntax, within Lark's /.../)."""
    return c if c.isalnum() and c.isascii() else f"\\x{{{ord(c):X}}}"


def _rule_name(name: str) -> str:
    # Lark rule names are lowercase; the prefix keeps fooBar and foobar apart and away from
    # Lark's own names (start is the root)
    return "start" if name == "root" else "g_" + "".join(
        ch if ch.islower() or ch.isdigit() else ("_" if ch in "-_" else "_" + ch.lower()) for ch in name)


def gbnf_to_lark(text: str) -> str:
    """The Lark grammar (llguidance's dialect) equivalent to the GBNF `text`; GrammarError names
    the line and column of a syntax error, an undefined rule or a missing root."""
    p = _Parser(text)
    rules = p.rules()
    if "root" not in rules:
        raise GrammarError("invalid grammar: no root rule (the grammar starts at `root ::= ...`)")
    for name, at in p.refs:
        if name not in rules:
            p.fail(f"undefined rule {name!r}", at)
    names = {}
    for name in rules:
        lark = _rule_name(name)
        if lark in names:
            raise GrammarError(f"invalid grammar: rules {names[lark]!r} and {name!r} differ only in case or -/_")
        names[lark] = name
    lines = ["%llguidance {}"]
    lines += [f"{_rule_name(name)}: {body}" for name, body in rules.items()]
    return "\n".join(lines) + "\n"
