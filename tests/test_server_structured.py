"""Structured output and tools through `edgellm serve`, with the official `openai` client against
real server processes running SmolLM2: response_format json_object / json_schema, llama.cpp's
`grammar` and `json_schema` fields, tools with tool_choice required / named / auto / none, tool
calls streamed as OpenAI streams them, and a tool result that continues the conversation. One
server uses SmolLM2's own ChatML template (no tools: the generic format), one Qwen 2.5's
(Hermes <tool_call>, parallel calls), one Qwen3-Coder's (XML arguments, streamed as JSON), one
gpt-oss's (harmony channels: reasoning_content, a call to functions.NAME); Gemma 3 (its own template, no system role) checks a schema
and a required call on the second real model."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from llamacpp_source import models_dir
from server_process import ServerProcess

pytestmark = pytest.mark.real

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                   "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                   "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

SCHEMAS = {
    "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False},
    "colours": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    "point": {"type": "object", "properties": {"x": {"type": "number", "minimum": -10, "maximum": 10},
                                               "label": {"type": "string", "pattern": "^[a-z]{1,6}$"}},
              "required": ["x", "label"], "additionalProperties": False},
}


def _server(*args, model=MODEL, env=None):
    return ServerProcess(model, "-c", "1024", "--parallel", "2", "-t", "1", *args, env=env)


@pytest.fixture(scope="module")
def own(smollm2_path):
    srv = _server()
    yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def qwen(smollm2_path):
    srv = _server("--chat-template-file", str(models_dir() / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"))
    yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def coder(smollm2_path):  # (an XML format: the arguments are built from the elements as they stream)
    srv = _server("--chat-template-file", str(models_dir() / "templates" / "Qwen3-Coder.jinja"))
    yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def harmony(smollm2_path):
    # gpt-oss's system message carries today's date: a fixed one makes the prompt, and so the
    # sampled replies, the same on every day (2024-07-26, template_cases.FIXED_DATE)
    srv = _server("--chat-template-file", str(models_dir() / "templates" / "openai-gpt-oss-120b.jinja"),
                  env={"SOURCE_DATE_EPOCH": "1721995200"})
    yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def gemma(gemma3_path):
    srv = _server(model="gemma3-270m")
    yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
    assert srv.stop() == 0


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def streamed(client, **kw) -> tuple[dict, list[str]]:
    """The message the client assembles from a stream (as the openai package's helpers do) and the
    finish reasons; checks each chunk carries what OpenAI's do."""
    msg: dict = {"content": None, "reasoning_content": None, "tool_calls": {}, "logprobs": []}
    reasons = []
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    for ch in chunks:
        d = ch.choices[0].delta
        if ch.choices[0].logprobs is not None:
            msg["logprobs"] += [t.token for t in ch.choices[0].logprobs.content]
        if d.content:
            msg["content"] = (msg["content"] or "") + d.content
        if (d.model_extra or {}).get("reasoning_content"):
            msg["reasoning_content"] = (msg["reasoning_content"] or "") + d.model_extra["reasoning_content"]
        for tc in d.tool_calls or []:
            if tc.index not in msg["tool_calls"]:  # first: id, type and name, empty arguments
                assert tc.id and tc.type == "function" and tc.function.name and tc.function.arguments == ""
                msg["tool_calls"][tc.index] = {"name": tc.function.name, "arguments": ""}
            else:  # then fragments of the arguments only
                assert tc.id is None and tc.function.name is None
                msg["tool_calls"][tc.index]["arguments"] += tc.function.arguments
        if ch.choices[0].finish_reason:
            reasons.append(ch.choices[0].finish_reason)
    msg["tool_calls"] = [msg["tool_calls"][i] for i in sorted(msg["tool_calls"])]
    return msg, reasons


def calls_of(message) -> list[dict]:
    return [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]


# -- response_format, grammar, json_schema --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_validate(own, name):
    schema = SCHEMAS[name]
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    r = own.chat.completions.create(model=MODEL, messages=ask(f"Give me a {name} as JSON."), response_format=fmt,
                                    n=3, temperature=1.0, seed=5, max_tokens=80)
    for c in r.choices:
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), schema)
    msg, reasons = streamed(own, model=MODEL, messages=ask(f"Give me a {name} as JSON."), response_format=fmt,
                            temperature=1.0, seed=5, max_tokens=80)
    alone = own.chat.completions.create(model=MODEL, messages=ask(f"Give me a {name} as JSON."), response_format=fmt,
                                        temperature=1.0, seed=5, max_tokens=80)
    assert (msg["content"], reasons) == (alone.choices[0].message.content, ["stop"])


def test_json_object_and_a_cut_short_object_says_length(own):
    r = own.chat.completions.create(model=MODEL, messages=ask("Describe a cat in JSON."), max_tokens=60, seed=2,
                                    response_format={"type": "json_object"}, temperature=0.8)
    c = r.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)
    else:  # a 135M model may go on; then it must say so
        assert c.finish_reason == "length" and r.usage.completion_tokens == 60
    cut = own.chat.completions.create(model=MODEL, messages=ask("Describe a cat in JSON."), max_tokens=3,
                                      response_format={"type": "json_schema", "json_schema": {
                                          "name": "p", "schema": SCHEMAS["person"]}})
    assert cut.choices[0].finish_reason == "length"


def test_llama_cpp_grammar_and_json_schema_fields(own):
    r = own.chat.completions.create(model=MODEL, messages=ask("Is the sky blue? Answer yes or no."), n=4, seed=1,
                                    temperature=1.0, max_tokens=8, extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert {c.message.content for c in r.choices} <= {"yes", "no"}
    assert all(c.finish_reason == "stop" for c in r.choices)
    comp = own.completions.create(model=MODEL, prompt="A point as JSON:", max_tokens=60, seed=3, temperature=1.0,
                                  n=2, extra_body={"json_schema": SCHEMAS["point"]})
    for c in comp.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), SCHEMAS["point"])
    text = "".join(ch.choices[0].text for ch in own.completions.create(
        model=MODEL, prompt="A point as JSON:", max_tokens=60, seed=3, temperature=1.0, stream=True,
        extra_body={"json_schema": SCHEMAS["point"]}))
    jsonschema.validate(json.loads(text), SCHEMAS["point"])


def test_bad_schema_is_a_400_through_the_client(own):
    with pytest.raises(openai.BadRequestError) as e:
        own.chat.completions.create(model=MODEL, messages=ask("hi"), response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "x"}}})
    assert e.value.body["param"] == "response_format" and "schema" in e.value.body["message"]


# -- tools ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("server", ["own", "qwen", "coder", "harmony"])
def test_required_tool_call_streamed_as_openai_streams_it(request, server):
    client = request.getfixturevalue(server)
    kw = dict(model=MODEL, messages=ask("What is the weather in Paris?"), tools=TOOLS, tool_choice="required",
              max_tokens=80, seed=4, temperature=0.7, parallel_tool_calls=False, logprobs=True)
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    assert len(c.logprobs.content) == r.usage.completion_tokens  # every token, markers included
    msg, reasons = streamed(client, **kw)
    assert reasons == ["tool_calls"] and msg["content"] is None
    assert msg["tool_calls"] == calls_of(c.message)
    assert msg["reasoning_content"] == (c.message.model_extra or {}).get("reasoning_content")
    assert msg["logprobs"] == [t.token for t in c.logprobs.content]


def test_a_ten_argument_xml_call_through_the_server(coder):
    """Qwen3-Coder's XML format with a tool of ten arguments (more than a grammar lists the orders
    of: the ArgumentGuard keeps them each once), sampled: the call follows the
    tool's schema, dates as their format says, and the stream adds up to the same message."""
    import re

    from edgellm.tool_calls.string_formats import STRING_FORMATS
    from test_tool_calls import TRIP

    kw = dict(model=MODEL, messages=ask("Book a trip from Lisbon to Oslo on 14 March 2026 for two adults."), tools=TRIP,
              tool_choice="required", max_tokens=300, seed=2, temperature=0.8, parallel_tool_calls=False)
    r = coder.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message
    for call in c.message.tool_calls:
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, TRIP[0]["function"]["parameters"])
        assert all(re.fullmatch(STRING_FORMATS["date"], args[k]) for k in ("date", "return_date") if k in args)
    msg, reasons = streamed(coder, **kw)
    assert reasons == ["tool_calls"] and msg["tool_calls"] == calls_of(c.message)


def test_named_tool_choice(qwen):
    r = qwen.chat.completions.create(model=MODEL, messages=ask("What time is it in Tokyo?"), tools=TOOLS, seed=0,
                                     tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=60)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), PARAMS["get_time"])


def test_parallel_tool_calls_when_the_template_has_them(qwen):
    """Hermes' format takes several <tool_call> blocks: with parallel_tool_calls (OpenAI's
    default) a required call may be followed by more; each parses and follows its tool."""
    msgs = [{"role": "system", "content": "Call get_weather once for each city the user names."},
            {"role": "user", "content": "Weather in Paris, in Rome and in Oslo?"}]
    seen = 0
    for seed in range(4):
        r = qwen.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="required", seed=seed,
                                         temperature=0.8, max_tokens=120)
        c = r.choices[0]
        assert c.finish_reason in ("tool_calls", "length")
        if c.finish_reason == "tool_calls":
            for call in c.message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
            assert len({call.id for call in c.message.tool_calls}) == len(c.message.tool_calls)
            seen = max(seen, len(c.message.tool_calls))
    assert seen >= 2


def test_tool_result_continues_the_conversation(qwen):
    msgs = ask("What is the weather in Paris?")
    first = qwen.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="required", seed=1,
                                         max_tokens=60, parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    msgs = msgs + [first.choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'}]
    replies = [qwen.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="none", seed=s,
                                            max_tokens=24).choices[0] for s in range(3)]
    assert all(r.message.tool_calls is None and r.finish_reason in ("stop", "length") for r in replies)
    assert any(r.message.content for r in replies)


def test_auto_with_a_json_answer_is_a_call_or_that_json(own):
    answer = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 30}}, "required": ["answer"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": answer}}
    for seed, question in enumerate(["What is the weather in Paris?", "What is two plus two?"]):
        r = own.chat.completions.create(model=MODEL, messages=ask(question), tools=TOOLS, tool_choice="auto", seed=seed,
                                        response_format=fmt, max_tokens=80, temperature=0.7)
        c = r.choices[0]
        if c.finish_reason == "tool_calls":
            for call in c.message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
        else:
            assert c.finish_reason == "stop" and not c.message.tool_calls
            jsonschema.validate(json.loads(c.message.content), answer)


def test_gpt_oss_channels_stream_as_reasoning_and_content(harmony):
    """Without tools, a gpt-oss reply's analysis is reasoning_content and its final message the content, streamed
    or not (SmolLM2 writes the channels as text: the grammar makes it write an analysis, then the final message)."""
    grammar = ('root ::= "<|channel|>analysis<|message|>" [a-z ]{1,30} "<|end|><|start|>assistant<|channel|>final'
               '<|message|>" [A-Za-z ]{1,30} "."')
    kw = dict(model=MODEL, messages=ask("What is the weather in Paris?"), max_tokens=60, seed=0, extra_body={"grammar": grammar})
    c = harmony.chat.completions.create(**kw).choices[0]
    thought = c.message.model_extra["reasoning_content"]
    assert thought and c.message.content.endswith(".") and "<|" not in thought + c.message.content
    msg, reasons = streamed(harmony, **kw)
    assert (msg["reasoning_content"], msg["content"]) == (thought, c.message.content) and reasons == [c.finish_reason]


def test_gpt_oss_json_answer_is_its_final_message(harmony):
    """The answer is forced as the final channel's message (SmolLM2 may think past max_tokens first)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS["person"]}}
    kws = [dict(model=MODEL, messages=ask("Who are you?"), max_tokens=200, seed=s, response_format=fmt, logprobs=True)
           for s in range(4)]
    done = [(kw, c) for kw in kws if (c := harmony.chat.completions.create(**kw).choices[0]).finish_reason == "stop"]
    assert done
    for kw, c in done:
        jsonschema.validate(json.loads(c.message.content), SCHEMAS["person"])
        assert "<|channel|>final<|message|>{" in "".join(t.token for t in c.logprobs.content)  # what the model wrote
    msg, _ = streamed(harmony, **done[0][0])
    assert msg["content"] == done[0][1].message.content


def test_second_real_model(gemma):
    schema = SCHEMAS["person"]
    r = gemma.chat.completions.create(model="gemma3-270m", n=2, seed=3, temperature=1.0, max_tokens=60,
                                      messages=[{"role": "system", "content": "Answer in JSON."}] + ask("A person?"),
                                      response_format={"type": "json_schema", "json_schema": {"name": "p",
                                                                                              "schema": schema}})
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), schema)
    kw = dict(model="gemma3-270m", messages=ask("What is the weather in Paris?"), tools=TOOLS, tool_choice="required",
              max_tokens=80, seed=0)
    c = gemma.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "tool_calls"
    for call in c.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    msg, reasons = streamed(gemma, **kw)
    assert reasons == ["tool_calls"] and msg["tool_calls"] == calls_of(c.message)
