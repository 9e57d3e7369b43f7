"""A request's structured output: the grammar the engine follows (response_format, llama.cpp's
grammar / json_schema fields, a required tool call) and, for chat, the prompt rendered with the
tools (tool_calls.prepare_turn) and how to read the reply back (tool_calls.Reply). Each problem is a
400 naming its field.

    tool_choice  + response_format / json_schema   -> the engine follows
    none / no tools        the JSON schema                   the schema
    auto                   -                                 nothing (the reply is read for calls)
    auto                   the JSON schema                   a call, or JSON of the schema
    required / named       (ignored: the reply is a call)    exactly one call of the tool(s)

A GBNF `grammar` with tools (tool_choice other than "none") is refused, as llama.cpp refuses it:
nothing says how a call and the grammar's text would combine.

Compiling takes milliseconds for a schema, and the first constraint of a server builds
llguidance's view of the vocabulary (1-2 s), so the handlers call these in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..constrain import Grammar, lltokenizer
from ..errors import GrammarError, TemplateError
from ..tool_calls import ChatTurn, Reply, call_or_json_grammar, chosen_tools, in_answer, prepare_turn
from .errors import invalid
from .schemas import Generation, Output


@dataclass
class ChatPlan:
    ids: list[int]  # the prompt
    grammar: Grammar | None
    turn: ChatTurn
    json_answer: bool  # the answer is constrained JSON
    parallel: bool
    preserved: frozenset[int] = frozenset()  # control tokens the reply's text keeps (its format's markers)

    def reply(self) -> Reply:
        """A reader for one choice's reply."""
        return self.turn.reply(self.json_answer, self.parallel)


def _schema(out: Output):
    """The JSON schema of response_format / json_schema (None for text or a GBNF grammar)."""
    if out.field == "json_schema":
        schema = out.json_schema
    elif out.field == "response_format":
        fmt = out.response_format
        if fmt["type"] == "json_object":
            schema = fmt.get("schema", {"type": "object"})
        else:
            schema = fmt["json_schema"].get("schema", {})  # OpenAI: no schema, any JSON
    else:
        return None
    return {} if schema is True else schema


def _output_grammar(out: Output) -> Grammar | None:
    try:
        if out.field == "grammar":
            return Grammar.from_gbnf(out.grammar)
        schema = _schema(out)
        return None if schema is None else Grammar.from_json_schema(schema)
    except GrammarError as exc:
        raise invalid(out.field, f"Invalid '{out.field}': {exc}.") from None


def _ready(llm, grammar: Grammar | None) -> Grammar | None:
    if grammar is not None:
        lltokenizer(llm.tokenizer)  # built once, here rather than on the event loop
    return grammar


def completion_grammar(llm, gen: Generation) -> Grammar | None:
    return _ready(llm, _output_grammar(gen.output))


def _tools_grammar(text: str, tools: list[dict], all_tools: list[dict]) -> Grammar:
    """The grammar of a call (or call-or-answer); a tool whose parameters cannot be compiled is
    named."""
    for tool in tools:
        params = tool["function"].get("parameters")
        if params is not None:
            try:
                Grammar.from_json_schema(params)
            except GrammarError as exc:
                i = all_tools.index(tool)
                raise invalid(f"tools[{i}].function.parameters", f"Invalid 'tools[{i}].function.parameters': "
                                                                 f"{exc}.") from None
    try:
        return Grammar.from_lark(text)
    except GrammarError as exc:
        raise invalid("tools", f"Invalid 'tools': {exc}.") from None


def chat_plan(llm, gen: Generation) -> ChatPlan:
    out = gen.output
    tools, choice = out.tools, out.tool_choice
    if tools and choice != "none" and out.field == "grammar":
        raise invalid("grammar", "'grammar' cannot be combined with 'tools' (a call would not follow it); use "
                                 "'response_format' or 'json_schema', or tool_choice 'none'.")
    try:
        turn = prepare_turn(llm.template, gen.messages, tools, choice, parallel=out.parallel_tool_calls)
    except TemplateError as exc:
        raise invalid("messages", f"The chat template could not render the messages: {exc}.") from None
    if turn.grammar is not None:  # tool_choice required or named: a call, whatever the answer's format
        grammar = _tools_grammar(turn.grammar, chosen_tools(tools, choice)[0], tools)
        json_answer = False
    else:
        grammar = in_answer(turn.fmt, _output_grammar(out))
        schema = _schema(out)
        json_answer = schema is not None
        if turn.tools and schema is not None:  # auto: a call, or the answer in its format
            grammar = _tools_grammar(call_or_json_grammar(turn.fmt, tools, schema), tools, tools)
    return ChatPlan(llm.chat_tokens(turn.prompt), _ready(llm, grammar), turn, json_answer, out.parallel_tool_calls,
                    llm.tokenizer.preserved_ids(turn.markers))
