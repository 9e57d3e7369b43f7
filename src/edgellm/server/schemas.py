"""Request bodies of the OpenAI endpoints, checked field by field into what the engine takes.

Every problem is a 400 naming the field (`param`), as OpenAI answers: unknown fields, wrong
types, values out of OpenAI's ranges, more choices than the server can queue, more tokens than
the context holds. The structured-output fields (response_format, grammar, json_schema, tools)
are checked for shape here and compiled in structured.py. Ranges and defaults are OpenAI's (temperature 1, top_p 1, no penalties);
`top_k`, `min_p` and `repeat_penalty` are llama.cpp's extras, off unless given; `speculative`
("lookup", "draft", "none") is edgellm's: this request's speculative decoding, by default the
server's (`edgellm serve --lookup | --draft MODEL`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ..sampling import SamplingParams
from .errors import invalid, model_not_found

MAX_STOP_STRINGS = 4  # OpenAI's limits
MAX_TOP_LOGPROBS_CHAT = 20
MAX_LOGPROBS_COMPLETIONS = 5
MAX_CHOICES = 128
MAX_LOGIT_BIAS = 100.0
SEED_RANGE = 2**64  # seeds are int64 in OpenAI's API; taken modulo 2**64 (the sampler's seeds are >= 0)

SPECULATIVE = ("lookup", "draft", "none")  # the `speculative` field's values
SERVER_DEFAULT = "default"  # Generation.speculative when the field is absent

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
# the fields each role's message may carry (OpenAI's, and llama.cpp's reasoning_content)
MESSAGE_FIELDS = {"system": {"role", "content", "name"}, "user": {"role", "content", "name"},
                  "assistant": {"role", "content", "name", "tool_calls", "refusal", "reasoning_content"},
                  "tool": {"role", "content", "tool_call_id", "name"}}
TOOL_CHOICES = ("none", "auto", "required")

# Fields OpenAI accepts that change nothing here (bookkeeping).
_ACCEPTED_NO_EFFECT = {"user", "metadata", "store", "service_tier"}
_SAMPLING = {"temperature", "top_p", "frequency_penalty", "presence_penalty", "seed", "logit_bias", "stop", "n",
             "stream", "stream_options", "max_tokens", "top_k", "min_p", "repeat_penalty", "model",
             "speculative"}
_STRUCTURED = {"response_format", "grammar", "json_schema"}  # OpenAI's, then llama.cpp's two
CHAT_FIELDS = _SAMPLING | _ACCEPTED_NO_EFFECT | _STRUCTURED | {
    "messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
    "modalities"}
COMPLETION_FIELDS = _SAMPLING | _ACCEPTED_NO_EFFECT | _STRUCTURED | {"prompt", "logprobs", "echo", "best_of", "suffix"}


@dataclass
class Generation:
    """A checked request: what to generate and how to answer."""

    model: str
    sampling: SamplingParams
    max_tokens: int | None  # None: as many as the context leaves
    n: int = 1
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None  # None: none; k: the chosen token's log-prob and the top k
    logit_bias: dict[int, float] | None = None
    stream: bool = False
    include_usage: bool = False
    messages: list[dict] | None = None  # chat: the conversation, content as text
    prompts: list[str | list[int]] | None = None  # completions: one or more prompts
    echo: bool = False
    speculative: str = SERVER_DEFAULT  # or one of SPECULATIVE
    output: "Output" = None  # the structured-output fields, checked for shape


@dataclass
class Output:
    """What the reply must look like: at most one of response_format (not "text"), grammar and
    json_schema (the name of the field given is `field`), and the tools it may call."""

    field: str | None = None  # "response_format" | "grammar" | "json_schema" | None
    response_format: dict | None = None
    grammar: str | None = None  # GBNF text
    json_schema: dict | bool | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True


# -- one value ---------------------------------------------------------------------------------


def _type_name(v) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
            type(None): "null"}.get(type(v), type(v).__name__)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _wrong_type(name: str, want: str, v):
    return invalid(name, f"Invalid type for '{name}': expected {want}, but got {_type_name(v)}.", "invalid_type")


def _out_of_range(name: str, v, rule: str):
    return invalid(name, f"Invalid value for '{name}': {v!r} {rule}.")


def number(body: dict, name: str, default, lo: float, hi: float, *, lo_open: bool = False):
    v = body.get(name)
    if v is None:
        return default
    if not _is_num(v):
        raise _wrong_type(name, "a number", v)
    if v < lo or (lo_open and v == lo) or v > hi:
        bounds = f"greater than {lo:g}" if lo_open and hi == math.inf else f"between {lo:g} and {hi:g}"
        raise _out_of_range(name, v, f"is not {bounds}")
    return float(v)


def integer(body: dict, name: str, default, lo: int, hi: int | None = None, why_hi: str = ""):
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v):
        raise _wrong_type(name, "an integer", v)
    if v < lo:
        raise _out_of_range(name, v, f"is less than the minimum of {lo}")
    if hi is not None and v > hi:
        raise _out_of_range(name, v, f"is greater than the maximum of {hi}{why_hi}")
    return v


def boolean(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _wrong_type(name, "a boolean", v)
    return v


def string(body: dict, name: str, default=None, *, required: bool = False, where: str | None = None):
    """body[name], a string; `where` names the field in errors (default: name)."""
    where = where or name
    v = body.get(name)
    if v is None:
        if required:
            raise invalid(where, f"Missing required parameter: '{where}'.", "missing_required_parameter")
        return default
    if not isinstance(v, str):
        raise _wrong_type(where, "a string", v)
    return v


# -- shared fields -----------------------------------------------------------------------------


def _check_fields(body, allowed: set[str]) -> None:
    if not isinstance(body, dict):
        raise invalid(None, f"The request body must be a JSON object, got {_type_name(body)}.")
    for name in body:
        if name not in allowed:
            raise invalid(name, f"Unrecognized request argument supplied: {name}", "unknown_parameter")


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list):
        raise _wrong_type("stop", "a string or an array of strings", v)
    if len(items) > MAX_STOP_STRINGS:
        raise invalid("stop", f"Invalid 'stop': {len(items)} strings; at most {MAX_STOP_STRINGS} are allowed.")
    for s in items:
        if not isinstance(s, str):
            raise _wrong_type("stop", "a string or an array of strings", s)
    return [s for s in items if s]


def _logit_bias(body: dict, n_vocab: int) -> dict[int, float] | None:
    v = body.get("logit_bias")
    if v is None:
        return None
    if not isinstance(v, dict):
        raise _wrong_type("logit_bias", "an object mapping token ids to numbers", v)
    out = {}
    for key, bias in v.items():
        try:
            tok = int(key)
        except ValueError:
            raise invalid("logit_bias", f"Invalid key in 'logit_bias': {key!r} is not a token id.") from None
        if not 0 <= tok < n_vocab:
            raise invalid("logit_bias", f"Invalid key in 'logit_bias': token {tok} is outside the vocabulary "
                                        f"[0, {n_vocab}).")
        if not _is_num(bias) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise invalid("logit_bias", f"Invalid value in 'logit_bias' for token {tok}: {bias!r} is not a number "
                                        f"between -100 and 100.")
        out[tok] = float(bias)
    return out or None


def _stream(body: dict) -> tuple[bool, bool]:
    stream = boolean(body, "stream")
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not stream:
        raise invalid("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
    if not isinstance(opts, dict):
        raise _wrong_type("stream_options", "an object", opts)
    for key in opts:
        if key not in ("include_usage", "include_obfuscation"):
            raise invalid(f"stream_options.{key}", f"Unrecognized argument in 'stream_options': {key}",
                          "unknown_parameter")
    boolean(opts, "include_obfuscation")
    return stream, boolean(opts, "include_usage")


def _sampling(body: dict) -> SamplingParams:
    temperature = number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:  # only the most likely token is left: greedy
        temperature, top_p = 0.0, 1.0
    seed = integer(body, "seed", None, -(2**63), 2**63 - 1)
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=integer(body, "top_k", 0, 0),
        min_p=number(body, "min_p", 0.0, 0.0, 1.0),
        repeat_penalty=number(body, "repeat_penalty", 1.0, 0.0, math.inf, lo_open=True),
        frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
        seed=None if seed is None else seed % SEED_RANGE,
    )


def _model(body, allowed: set[str], models: set[str]) -> str:
    _check_fields(body, allowed)
    model = string(body, "model", required=True)
    if model not in models:
        raise model_not_found(model)
    return model


def _common(body: dict, *, max_n: int, n_ctx: int, n_vocab: int) -> dict:
    string(body, "user")
    boolean(body, "store")
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise _wrong_type("metadata", "an object", body["metadata"])
    why = f" (the server queues at most {max_n} sequences: --max-queue)" if max_n < MAX_CHOICES else ""
    stream, include_usage = _stream(body)
    return dict(
        sampling=_sampling(body),
        n=integer(body, "n", 1, 1, min(max_n, MAX_CHOICES), why),
        max_tokens=integer(body, "max_tokens", None, 1, n_ctx, f" (the context holds {n_ctx} tokens)"),
        stop=_stop(body),
        logit_bias=_logit_bias(body, n_vocab),
        stream=stream,
        include_usage=include_usage,
        speculative=_speculative(body),
    )


def _speculative(body: dict) -> str:
    v = string(body, "speculative")
    if v is None:
        return SERVER_DEFAULT
    if v not in SPECULATIVE:
        raise invalid("speculative", f"Invalid 'speculative': {v!r}; expected one of {', '.join(map(repr, SPECULATIVE))}.")
    return v


# -- chat --------------------------------------------------------------------------------------


def _content(msg: dict, i: int, role: str) -> str:
    where = f"messages[{i}].content"
    content = msg.get("content")
    if content is None and role == "assistant" and msg.get("tool_calls"):
        return ""  # OpenAI: content may be left out beside tool calls
    if content is None:
        raise invalid(where, f"Missing required parameter: '{where}'.", "missing_required_parameter")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _wrong_type(where, "a string or an array of content parts", content)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise invalid(f"{where}[{j}]", f"Content part {j} of message {i} must be {{'type': 'text', 'text': ...}}"
                                           f" (this server reads text only), got type {kind!r}.")
        if not isinstance(part.get("text"), str):
            raise _wrong_type(f"{where}[{j}].text", "a string", part.get("text"))
        texts.append(part["text"])
    return "\n".join(texts)


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise invalid("messages", "Missing required parameter: 'messages'.", "missing_required_parameter")
    if not isinstance(msgs, list):
        raise _wrong_type("messages", "an array", msgs)
    if not msgs:
        raise invalid("messages", "Invalid 'messages': empty array. Expected an array with at least one message.",
                      "empty_array")
    out = []
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict):
            raise _wrong_type(f"messages[{i}]", "an object", msg)
        role = msg.get("role")
        if not isinstance(role, str):
            raise _wrong_type(f"messages[{i}].role", "a string", role)
        if role not in ROLES:
            hint = " (send function results as role 'tool')" if role == "function" else ""
            raise invalid(f"messages[{i}].role", f"Invalid value for 'messages[{i}].role': {role!r}{hint}; "
                                                 f"supported roles are {', '.join(ROLES)}.")
        allowed = MESSAGE_FIELDS[ROLES[role]]
        for key in msg:
            if key not in allowed:
                raise invalid(f"messages[{i}].{key}", f"Unrecognized argument in message {i} ({role}): {key}",
                              "unknown_parameter")
        m = {"role": ROLES[role], "content": _content(msg, i, role)}
        for key in ("name", "reasoning_content", "refusal"):
            if string(msg, key, where=f"messages[{i}].{key}") is not None:
                m[key] = msg[key]
        m.pop("refusal", None)  # accepted (clients send back what they got), not the template's
        if role == "tool":
            m["tool_call_id"] = string(msg, "tool_call_id", required=True, where=f"messages[{i}].tool_call_id")
        if msg.get("tool_calls") is not None:
            m["tool_calls"] = _message_tool_calls(msg["tool_calls"], f"messages[{i}].tool_calls")
        out.append(m)
    return out


def _message_tool_calls(calls, where: str) -> list[dict]:
    """An assistant message's tool_calls as OpenAI sends them back (arguments as JSON text)."""
    if not isinstance(calls, list):
        raise _wrong_type(where, "an array", calls)
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise _wrong_type(at, "an object", call)
        for key in call:
            if key not in ("id", "type", "function"):
                raise invalid(f"{at}.{key}", f"Unrecognized argument in '{at}': {key}", "unknown_parameter")
        string(call, "id", required=True, where=f"{at}.id")
        if call.get("type", "function") != "function":
            raise invalid(f"{at}.type", f"Invalid value for '{at}.type': {call.get('type')!r}; only 'function' "
                                        f"calls are supported.")
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise _wrong_type(f"{at}.function", "an object with 'name' and 'arguments'", fn)
        string(fn, "name", required=True, where=f"{at}.function.name")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                json.loads(args)
            except ValueError:
                raise invalid(f"{at}.function.arguments", f"Invalid '{at}.function.arguments': not JSON text "
                                                          f"({args[:60]!r}).") from None
        elif not isinstance(args, dict):
            raise _wrong_type(f"{at}.function.arguments", "a string of JSON", args)
        out.append({"id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def parse_chat(body, *, max_n: int, n_ctx: int, n_vocab: int, models: set[str]) -> Generation:
    model = _model(body, CHAT_FIELDS, models)
    messages = _messages(body)
    common = _common(body, max_n=max_n, n_ctx=n_ctx, n_vocab=n_vocab)
    mct = integer(body, "max_completion_tokens", None, 1, n_ctx, f" (the context holds {n_ctx} tokens)")
    if mct is not None and common["max_tokens"] is not None and mct != common["max_tokens"]:
        raise invalid("max_completion_tokens", "'max_tokens' and 'max_completion_tokens' disagree; send only "
                                               "'max_completion_tokens'.")
    if mct is not None:
        common["max_tokens"] = mct
    want_logprobs = boolean(body, "logprobs")
    top = integer(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS_CHAT)
    if top is not None and not want_logprobs:
        raise invalid("top_logprobs", "'top_logprobs' needs 'logprobs' set to true.")
    if body.get("modalities") not in (None, ["text"]):
        raise invalid("modalities", "Only the 'text' modality is supported by this server.")
    output = _output(body)
    output.tools = _tools(body)
    output.tool_choice = _tool_choice(body, output.tools)
    output.parallel_tool_calls = boolean(body, "parallel_tool_calls", True)
    return Generation(model=model, messages=messages, logprobs=(top or 0) if want_logprobs else None, output=output,
                      **common)


# -- structured output -------------------------------------------------------------------------


def _keys(obj: dict, where: str, allowed: tuple[str, ...]) -> None:
    for key in obj:
        if key not in allowed:
            raise invalid(f"{where}.{key}", f"Unrecognized argument in '{where}': {key}", "unknown_parameter")


def _schema(v, where: str):
    if not isinstance(v, (dict, bool)):
        raise _wrong_type(where, "a JSON schema (an object)", v)
    return v


def _response_format(body: dict) -> dict | None:
    """OpenAI's response_format (and llama.cpp's {"type": "json_object", "schema": ...}); None for text."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _wrong_type("response_format", "an object", fmt)
    kind = fmt.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise invalid("response_format.type", f"Invalid value for 'response_format.type': {kind!r}; supported "
                                              f"values are 'text', 'json_object' and 'json_schema'.")
    if kind == "text":
        _keys(fmt, "response_format", ("type",))
        return None
    if kind == "json_object":
        _keys(fmt, "response_format", ("type", "schema"))
        if "schema" in fmt:
            _schema(fmt["schema"], "response_format.schema")
        return fmt
    _keys(fmt, "response_format", ("type", "json_schema"))
    spec = fmt.get("json_schema")
    if spec is None:
        raise invalid("response_format.json_schema", "Missing required parameter: 'response_format.json_schema'.",
                      "missing_required_parameter")
    if not isinstance(spec, dict):
        raise _wrong_type("response_format.json_schema", "an object", spec)
    _keys(spec, "response_format.json_schema", ("name", "description", "schema", "strict"))
    string(spec, "name", where="response_format.json_schema.name")
    string(spec, "description", where="response_format.json_schema.description")
    boolean(spec, "strict")
    if "schema" in spec:
        _schema(spec["schema"], "response_format.json_schema.schema")
    return fmt


def _output(body: dict) -> Output:
    out = Output(response_format=_response_format(body), grammar=string(body, "grammar"))
    if "json_schema" in body and body["json_schema"] is not None:
        out.json_schema = _schema(body["json_schema"], "json_schema")
    given = [name for name, v in (("response_format", out.response_format), ("grammar", out.grammar),
                                  ("json_schema", out.json_schema)) if v is not None]
    if len(given) > 1:
        raise invalid(given[1], f"Give one of 'response_format', 'grammar' and 'json_schema', not "
                                f"{' and '.join(repr(g) for g in given)}.")
    out.field = given[0] if given else None
    return out


def _tools(body: dict) -> list[dict] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _wrong_type("tools", "an array of tools", tools)
    if not tools:
        return None
    names = set()
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _wrong_type(at, "an object", tool)
        _keys(tool, at, ("type", "function"))
        if tool.get("type") != "function":
            raise invalid(f"{at}.type", f"Invalid value for '{at}.type': {tool.get('type')!r}; only 'function' "
                                        f"tools are supported.")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise _wrong_type(f"{at}.function", "an object", fn)
        _keys(fn, f"{at}.function", ("name", "description", "parameters", "strict"))
        name = string(fn, "name", required=True, where=f"{at}.function.name")
        if not name or len(name) > 64 or any(c.isspace() for c in name):
            raise invalid(f"{at}.function.name", f"Invalid '{at}.function.name': {name!r} (1 to 64 characters, "
                                                 f"no spaces).")
        if name in names:
            raise invalid(f"{at}.function.name", f"Invalid '{at}.function.name': {name!r} is given twice.")
        names.add(name)
        string(fn, "description", where=f"{at}.function.description")
        boolean(fn, "strict")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _wrong_type(f"{at}.function.parameters", "a JSON schema (an object)", fn["parameters"])
    return tools


def _tool_choice(body: dict, tools: list[dict] | None):
    choice = body.get("tool_choice")
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise invalid("tool_choice", f"Invalid value for 'tool_choice': {choice!r}; supported values are "
                                         f"'none', 'auto', 'required' and {{'type': 'function', 'function': "
                                         f"{{'name': ...}}}}.")
    elif isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid("tool_choice", "Invalid 'tool_choice': a named tool is {'type': 'function', 'function': "
                                         "{'name': ...}}.")
        if fn["name"] not in [t["function"]["name"] for t in tools or []]:
            raise invalid("tool_choice", f"Invalid 'tool_choice': {fn['name']!r} is not among the 'tools'.")
    else:
        raise _wrong_type("tool_choice", "a string or an object", choice)
    if choice not in ("none", "auto") and not tools:
        raise invalid("tool_choice", "'tool_choice' other than 'none' or 'auto' needs 'tools'.")
    return choice


# -- completions -------------------------------------------------------------------------------


def _prompts(body: dict, n_vocab: int) -> list[str | list[int]]:
    """A string, an array of strings, an array of token ids, or an array of arrays of token ids."""
    p = body.get("prompt")
    if p is None:
        raise invalid("prompt", "Missing required parameter: 'prompt'.", "missing_required_parameter")
    if isinstance(p, str):
        return [p]
    if not isinstance(p, list) or not p:
        raise _wrong_type("prompt", "a string, or a non-empty array of strings or token ids", p)
    if all(_is_int(t) for t in p):
        p = [p]
    out = []
    for i, item in enumerate(p):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list) and item and all(_is_int(t) for t in item):
            bad = [t for t in item if not 0 <= t < n_vocab]
            if bad:
                raise invalid("prompt", f"Invalid 'prompt': token {bad[0]} is outside the vocabulary [0, {n_vocab}).")
            out.append(item)
        else:
            raise _wrong_type(f"prompt[{i}]", "a string or a non-empty array of token ids", item)
    return out


def parse_completion(body, *, max_n: int, n_ctx: int, n_vocab: int, models: set[str]) -> Generation:
    model = _model(body, COMPLETION_FIELDS, models)
    prompts = _prompts(body, n_vocab)
    common = _common(body, max_n=max_n, n_ctx=n_ctx, n_vocab=n_vocab)
    if common["max_tokens"] is None:
        common["max_tokens"] = 16  # OpenAI's default for completions
    best_of = integer(body, "best_of", None, 1, MAX_CHOICES)
    if best_of is not None and best_of != common["n"]:
        raise invalid("best_of", f"'best_of' other than 'n' ({common['n']}) is not supported by this server.")
    if len(prompts) * common["n"] > min(max_n, MAX_CHOICES):
        raise invalid("n", f"{len(prompts)} prompts x n={common['n']} choices is more than the maximum of "
                           f"{min(max_n, MAX_CHOICES)}.")
    if string(body, "suffix"):
        raise invalid("suffix", "'suffix' (insertion) is not supported by this server.")
    echo = boolean(body, "echo")
    logprobs = integer(body, "logprobs", None, 0, MAX_LOGPROBS_COMPLETIONS)
    if echo and logprobs is not None:
        raise invalid("echo", "'echo' together with 'logprobs' (log-probs of the prompt) is not supported.")
    return Generation(model=model, prompts=prompts, echo=echo, logprobs=logprobs, output=_output(body), **common)


def parse_tokenize(body, n_vocab: int) -> tuple[str, bool, bool, bool]:
    _check_fields(body, {"content", "add_special", "parse_special", "with_pieces"})
    return (string(body, "content", required=True), boolean(body, "add_special"),
            boolean(body, "parse_special", True), boolean(body, "with_pieces"))


def parse_detokenize(body, n_vocab: int) -> list[int]:
    _check_fields(body, {"tokens"})
    ids = body.get("tokens")
    if ids is None:
        raise invalid("tokens", "Missing required parameter: 'tokens'.", "missing_required_parameter")
    if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
        raise _wrong_type("tokens", "an array of token ids", ids)
    bad = [t for t in ids if not 0 <= t < n_vocab]
    if bad:
        raise invalid("tokens", f"Invalid 'tokens': {bad[0]} is outside the vocabulary [0, {n_vocab}).")
    return ids
