"""The Jinja2 sandbox chat templates render in, with a budget for each render.

The environment is transformers' chat-template one (an immutable sandbox, trim_blocks,
lstrip_blocks, loop controls, the generation tag, `raise_exception`, `strftime_now`, a plain
`tojson`), plus what a
template from an untrusted GGUF file must not get past:
- no loader (no include / import / extends) and unsafe attribute access as an error;
- nothing is evaluated while compiling (Jinja's constant folding would run a filter such as
  `'%999999999s'|format(1)` at compile time, outside every check below);
- a step budget per render: every loop iteration and every call (macros included) is a step,
  and calls have a budget of their own, so loops over long strings and exponential macro
  recursion end;
- size bounds on everything that can build a large string, list or number from a small one:
  `*`, `**`, `+`, `%` and `~`; list, tuple and dict displays and what calls return (counted deep,
  so a list of lists of one list is as big as it prints); the filters center, indent, format, replace, join, batch, slice,
  sum, tojson and wordwrap; the str / bytes methods ljust, rjust, center, zfill, expandtabs,
  replace, join, translate, format and format_map; and the rendered text itself;
- range() with a total budget of items per render.
A template that goes past one raises jinja2's SecurityError (chat.py turns it into TemplateError).
"""

from __future__ import annotations

import contextvars
import functools
import json
import operator
import os
import re
import string
from datetime import datetime, timezone
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, _PassArg

# Work one render may do (real chat templates need a few thousand steps and range items at most).
MAX_STEPS = 2_000_000  # loop iterations + calls
MAX_CALLS = 50_000  # calls alone (a macro call costs some 50 loop iterations)
MAX_RANGE_ITEMS = 1_000_000  # items produced by range(), in total
MAX_REPEAT_LEN = 100_000  # length of a string or list built with *
MAX_ITEMS = 100_000  # batch / slice sizes; containers, counted deep (a list held twice counts twice)
MAX_TEXT = 16_000_000  # characters (or items) of any string or list built, and of the output
MAX_POWER_EXPONENT = 1_000
MAX_INT_BITS = 1 << 16
MAX_JSON_INDENT = 64


class RaisedByTemplate(Exception):
    """raise_exception() called by the template itself."""


def _raise_exception(message: str):
    raise RaisedByTemplate(message)


def template_now() -> datetime:
    """The time a template renders as now (`strftime_now`, firefunction's `datetime`): the clock's,
    or SOURCE_DATE_EPOCH's where it is set (the reproducible-builds convention), so a prompt
    that carries the date - gpt-oss's, Llama 3.1's - can be made the same on every day."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch.isdigit():
        return datetime.fromtimestamp(int(epoch), tz=timezone.utc)
    return datetime.now()


def _strftime_now(fmt: str) -> str:
    return template_now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None, separators=None,
            sort_keys: bool = False) -> str:
    # as transformers' chat-template tojson: plain json.dumps, non-ASCII kept, no HTML escaping
    # (Jinja's own tojson escapes <, >, & and ' for HTML)
    if indent is not None and (indent if isinstance(indent, int) else len(str(indent))) > MAX_JSON_INDENT:
        raise SecurityError(f"tojson indent {indent!r} is too large (limit {MAX_JSON_INDENT})")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (it marks the assistant's tokens for
    training masks): the body is rendered as it is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


# --------------------------------------------------------------------------------- the budget


class _Budget:
    __slots__ = ("steps", "calls", "range_items")

    def __init__(self):
        self.steps = 0
        self.calls = 0
        self.range_items = 0


_BUDGET: contextvars.ContextVar[_Budget] = contextvars.ContextVar("edgellm_template_budget")


def _budget() -> _Budget:
    try:
        return _BUDGET.get()
    except LookupError:  # only render() runs templates; this is a guard, not a path
        raise SecurityError("templates run only through edgellm.chat_sandbox.render") from None


def _tick() -> None:
    """One step; called at the top of every loop body and by every call."""
    budget = _budget()
    budget.steps += 1
    if budget.steps > MAX_STEPS:
        raise SecurityError(f"the template ran more than {MAX_STEPS} steps (loop iterations and calls)")


_TICK = f"{__name__}._tick"


def _too_big(what: str, n: int, limit: int = MAX_TEXT) -> None:
    if n > limit:
        raise SecurityError(f"{what} would be {n} long (limit {limit})")


def _sized(value):
    """`value` if, printed, it stays within the bounds: containers are walked (each time a list is
    held counts, so lists of lists of the same list are caught) up to MAX_ITEMS items, and their
    strings' lengths add up to at most MAX_TEXT."""
    if not isinstance(value, (list, tuple, dict, set, frozenset, Namespace)):
        return value
    items, chars, stack = 0, 0, [value]
    while stack:
        x = stack.pop()
        if isinstance(x, (str, bytes)):
            chars += len(x)
            continue
        if isinstance(x, Namespace):
            x = x._Namespace__attrs  # noqa: SLF001 - jinja2's namespace() holds its values here
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack.extend(x)
        items += 1
        if items > MAX_ITEMS:
            raise SecurityError(f"the template built a structure of more than {MAX_ITEMS} items")
    _too_big("the structure's text", chars)
    return value


# --------------------------------------------------------------------------------- size bounds

_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[diouxXeEfFgGcrsab%]")


def _check_printf(fmt) -> None:
    """printf-style formatting (`%` and |format): widths and precisions stay within MAX_TEXT."""
    text = fmt.decode("latin-1") if isinstance(fmt, (bytes, bytearray)) else fmt
    total = len(text)
    for width, precision in _PRINTF.findall(text):
        if "*" in (width, precision):
            raise SecurityError("printf-style '*' widths are not allowed in chat templates")
        total += int(width or 0) + int(precision or 0)
    _too_big("the formatted text", total)


def _check_str_format(fmt: str) -> None:
    """str.format / format_map: no nested fields in a format spec; widths within MAX_TEXT."""
    total = len(fmt)
    for _, _, spec, _ in string.Formatter().parse(fmt):
        if spec:
            if "{" in spec:
                raise SecurityError("nested fields in a format spec are not allowed in chat templates")
            total += sum(int(n) for n in re.findall(r"\d+", spec))
    _too_big("the formatted text", total)


def _replaced_len(s, old, new, count=-1) -> int:
    n = len(s) + 1 if not old else s.count(old)
    if count is not None and count >= 0:
        n = min(n, count)
    return len(s) + n * max(len(new) - len(old), 0)


def _bound_center(value, width=80, *a, **k):
    _too_big("centered text", int(width))


def _bound_indent(s, width=4, *a, **k):
    w = width if isinstance(width, int) else len(str(width))
    _too_big("indented text", len(str(s)) + (str(s).count("\n") + 1) * w)


def _bound_format(value, *a, **k):
    _check_printf(str(value))


def _bound_replace(s, old, new, count=None):
    _too_big("the replaced text", _replaced_len(str(s), str(old), str(new), count))


def _bound_join(value, d="", attribute=None):
    n = len(value) if hasattr(value, "__len__") else 0
    _too_big("the joined text", max(n - 1, 0) * len(str(d)))


def _bound_count(value, count, *a, **k):
    _too_big("the number of items", int(count), MAX_ITEMS)


def _bound_sum(iterable, attribute=None, start=0):
    if not isinstance(start, (int, float)) or isinstance(start, bool):
        raise SecurityError("sum() adds numbers only in chat templates")


def _bound_wordwrap(s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
    s = str(s)
    lines = len(s) // max(int(width), 1) + s.count(" ") + 1
    _too_big("the wrapped text", len(s) + lines * len(wrapstring or "\n"))


_FILTER_BOUNDS = {"center": _bound_center, "indent": _bound_indent, "format": _bound_format,
                  "replace": _bound_replace, "join": _bound_join, "batch": _bound_count, "slice": _bound_count,
                  "sum": _bound_sum, "wordwrap": _bound_wordwrap}


def _checked_filter(fn, bound):
    skip = 1 if _PassArg.from_obj(fn) is not None else 0  # the context / environment argument

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        bound(*args[skip:], **kwargs)
        return fn(*args, **kwargs)

    return checked


def _check_method(obj, args, kwargs):
    """Size bounds for the str / bytes methods that can grow their result past their inputs;
    returns the (possibly materialized) arguments."""
    s = getattr(obj, "__self__", None)
    if not isinstance(s, (str, bytes, bytearray)):
        return args
    name = getattr(obj, "__name__", "")
    if name in ("ljust", "rjust", "center", "zfill") and args:
        _too_big(f"{name}() text", int(args[0]))
    elif name == "expandtabs":
        tab = int(args[0] if args else kwargs.get("tabsize", 8))
        _too_big("expandtabs() text", len(s) + s.count("\t" if isinstance(s, str) else b"\t") * tab)
    elif name == "replace" and len(args) >= 2:
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        _too_big("the replaced text", _replaced_len(s, args[0], args[1], count))
    elif name == "join" and args:
        items = list(args[0])
        _too_big("the joined text", len(s) * max(len(items) - 1, 0) + sum(len(i) for i in items if hasattr(i, "__len__")))
        args = (items, *args[1:])
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if hasattr(v, "__len__")), default=1)
        _too_big("the translated text", len(s) * longest)
    return args


# --------------------------------------------------------------------------------- the environment


class _CodeGenerator(CodeGenerator):
    """Compiles without evaluating anything (output included), calls the step counter where
    _parse put it, and routes `~` and list, tuple and dict displays through the sandbox's checks."""

    def visit_ExprStmt(self, node, frame):
        if isinstance(node.node, nodes.ImportedName) and node.node.importname == _TICK:
            self.newline(node)
            self.write(f"{self.import_aliases[_TICK]}()")
            return
        super().visit_ExprStmt(node, frame)

    def _sized_display(visit):
        def checked(self, node, frame):
            if getattr(node, "ctx", "load") != "load":  # an assignment target
                return visit(self, node, frame)
            self.write("environment.sized(")
            visit(self, node, frame)
            self.write(")")

        return checked

    visit_List = _sized_display(CodeGenerator.visit_List)
    visit_Tuple = _sized_display(CodeGenerator.visit_Tuple)
    visit_Dict = _sized_display(CodeGenerator.visit_Dict)

    def _output_child_to_const(self, node, frame, finalize):
        if not isinstance(node, nodes.TemplateData):
            raise nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)

    def visit_Concat(self, node, frame):
        self.write("environment.concat_checked((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class Sandbox(ImmutableSandboxedEnvironment):
    """The chat-template environment described at the top of this module."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag],
                         loader=None, optimized=False)
        self.filters["tojson"] = _tojson
        for name, bound in _FILTER_BOUNDS.items():
            self.filters[name] = _checked_filter(self.filters[name], bound)
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.globals["range"] = self._budgeted_range
        del self.globals["lipsum"]  # lipsum(n) builds n paragraphs: no template needs it

    def _parse(self, source, name, filename):
        tree = super()._parse(source, name, filename)
        for loop in list(tree.find_all(nodes.For)):
            loop.body.insert(0, nodes.ExprStmt(nodes.ImportedName(_TICK), lineno=loop.lineno))
        return tree

    def unsafe_undefined(self, obj, attribute):
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__} objects is not allowed")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's signature
        _tick()
        budget = _budget()
        budget.calls += 1
        if budget.calls > MAX_CALLS:
            raise SecurityError(f"the template made more than {MAX_CALLS} calls")
        args = _check_method(__obj, args, kwargs)
        return _sized(super().call(__context, __obj, *args, **kwargs))

    sized = staticmethod(_sized)

    def wrap_str_format(self, value):
        fmt = super().wrap_str_format(value)
        if fmt is None:
            return None
        text = value.__self__

        @functools.wraps(fmt)
        def checked(*args, **kwargs):
            _check_str_format(text)
            return fmt(*args, **kwargs)

        return checked

    def call_binop(self, context, op, left, right):
        if op == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(times, int):
                    _too_big("the repetition", len(seq) * times, MAX_REPEAT_LEN)
            if isinstance(left, int) and isinstance(right, int):
                _too_big("the product's bits", left.bit_length() + right.bit_length(), MAX_INT_BITS)
            return _sized(operator.mul(left, right))
        if op == "**":
            if isinstance(right, (int, float)) and abs(right) > MAX_POWER_EXPONENT:
                raise SecurityError(f"exponent {right} is too large (limit {MAX_POWER_EXPONENT})")
            if isinstance(left, int) and isinstance(right, int) and right > 0:
                _too_big("the power's bits", left.bit_length() * right, MAX_INT_BITS)
            return operator.pow(left, right)
        if op == "+":
            if isinstance(left, (str, bytes, list, tuple)) and hasattr(right, "__len__"):
                _too_big("the sum", len(left) + len(right))
            return _sized(operator.add(left, right))
        if isinstance(left, (str, bytes)):  # %: printf-style formatting
            _check_printf(left)
        return operator.mod(left, right)

    def concat_checked(self, parts) -> str:
        texts = [str(p) for p in parts]
        _too_big("the joined text", sum(map(len, texts)))
        return "".join(texts)

    def _budgeted_range(self, *args):
        budget = _budget()
        r = jinja2.sandbox.safe_range(*args)
        budget.range_items += len(r)
        if budget.range_items > MAX_RANGE_ITEMS:
            raise SecurityError(f"the template iterates over more than {MAX_RANGE_ITEMS} range items")
        return r


SANDBOX = Sandbox()


def render(template: jinja2.Template, variables: dict) -> str:
    """Render with a fresh budget; the text may be at most MAX_TEXT characters."""
    token = _BUDGET.set(_Budget())
    try:
        out, size = [], 0
        for chunk in template.generate(variables):
            size += len(chunk)
            _too_big("the rendered prompt", size)
            out.append(chunk)
        return "".join(out)
    finally:
        _BUDGET.reset(token)
