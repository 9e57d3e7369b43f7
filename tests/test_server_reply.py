"""The reading of a reply (tool_calls/reply.py, the server's and the library's): streamed in any
pieces it adds up to the message read whole, that message agrees with tool_calls.parse for every
format, and the deltas are OpenAI's (id and name first, then argument fragments). No model needed."""

from __future__ import annotations

import json

import pytest

from edgellm.tool_calls import (FORMATS, Reply, ToolFormat, gemma4, harmony, json_calls, marked, open_reply, parse,
                                preserved_markers, pythonic, reasoning_tags, split_reasoning, unmarked)
from edgellm.tool_calls.scan import JSONSpans
from test_tool_calls import TOOLS, TWO, WRITTEN

# more replies per format: calls after text, several calls, keys in another order, no call at all
MORE = {
    "hermes": ['<think>\nhmm\n</think>\n\nA <tool_call>{"arguments": {"x": [1, {"y": "}"}]}, "name": "f"}</tool_call>'
               '\n<tool_call>{"name": "g", "arguments": {}}</tool_call> B ', "It is sunny.", "<tool_call>\n{\"na",
               '<tool_call>{"name": "a", "x": 1, "name": "b", "arguments": {"k": 1}}</tool_call>'],  # (a key twice: the first)
    "llama3": ['{"name": "a", "parameters": {"q": 1}}; {"name": "b", "parameters": {}}', '{"x": 1}', "Sunny."],
    "mistral": ['Sure. [TOOL_CALLS][{"name": "a", "arguments": {"k": "\\"v\\""}}, {"name": "b", "arguments": {}}]'],
    "mistral_args": ['Hi [TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}'],
    "functionary": ['>>>all\nHello\n>>>get_weather\n{"city": "Rome"}'],
    "function_tag": ['Call: <function=f>{"a": [1, 2]}</function> done'],
    "granite": ['Sure. <|tool_call|>[{"name": "a", "arguments": {"k": 1}}, {"name": "b", "arguments": {}}]', "Sunny."],
    "deepseek_r1": ["<think>hmm</think>Sunny.", "A<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n"
                    '{"k": 1}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>b\n```json\n{}\n```'
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"],
    "command_r7b": ["<|START_RESPONSE|>Sunny.<|END_RESPONSE|>", "<|START_THINKING|>hmm<|END_THINKING|><|START_RESPONSE|>Sunny."],
    "qwen3_coder": ["<tool_call>\n<function=a>\n<parameter=k>\n[1, 2]\n</parameter>\n</function>\n</tool_call>\n"
                    "<tool_call>\n<function=b>\n</function>\n</tool_call> B", "<tool_call>\n<function=a>\n<para",
                    "<tool_call>\n<function=a>\n<parameter=k>\n\n two \n</parameter>\n</function>\n</tool_call>"],
    "glm": ["<tool_call>a\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>\n<tool_call>b\n</tool_call>", "Sunny."],
    "apertus": ["<|inner_prefix|>hmm<|inner_suffix|>Sunny.", '<|inner_prefix|>hmm<|inner_suffix|><|tools_prefix|>[{"a": {"k": 1}}, '
                '{"b": {}}]<|tools_suffix|>'],
    "lfm2": ["<think>hmm</think>Sure. <|tool_call_start|>[a(k='v', n=true, xs=[1, 2]), b()]<|tool_call_end|> Done."],
    "solar_open": ["<|think|>hmm<|end|><|begin|>assistant<|content|>Sunny.", "<|think|>hmm<|end|><|begin|>assistant"
                   '<|tool_calls|><|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>a<|tool_call:args|>{"k": 1}<|tool_call:end|>'],
    "gemma4": ['<|channel>thought\nhmm<channel|>A <|tool_call>call:a{k:<|"|>v<|"|>,n:[1,2]}<tool_call|><|tool_call>call:b{}'
               '<tool_call|> B'],
    "nemotron_v2": ['Sure. <TOOLCALL>[{"name": "a", "arguments": {"k": 1}}, {"name": "b", "arguments": {}}]</TOOLCALL> Done.'],
    "apriel": ['<tool_calls>[{"name": "a", "arguments": {"k": "v"}}]</tool_calls>', "Sunny.[END FINAL RESPONSE]"],
    "minimax_m1": ['A\n<tool_calls>\n{"name": "a", "arguments": {"k": 1}}\n{"name": "b", "arguments": {}}\n</tool_calls>'],
    "gpt_oss": ["<|channel|>analysis<|message|>hmm <|end|>\n<|start|>assistant<|channel|>commentary<|message|>A<|end|>"
                "<|start|>assistant<|channel|>analysis<|message|> more<|end|><|start|>assistant<|channel|>final<|message|>"
                " Sunny. ", "It is sunny.", "<|channel|>commentary to=browser.search <|constrain|>json<|message|>{}",
                '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": [1, "}"]}<|call|>'],
    "muse_glimmer": [" to=self<|message|>hmm <|eom|><|start|>assistant to=self<|message|> more<|eom|><|start|>assistant to=user"
                     "<|message|> Sunny. ", "<|message|>Sunny.", "It is sunny.", " to=browser.search<|message|>{}<|eom|><|start|>"
                     "assistant to=user<|message|>Done", TWO["muse_glimmer"]],
    "generic": ['{"response": "It is \\"sunny\\"."}', '{"tool_calls": [{"name": "a", "arguments": {"k": "v"}}]}',
                '{"x": 2}'],
}
CASES = [(fmt, text) for fmt in sorted(WRITTEN) for text in [WRITTEN[fmt]] + MORE.get(fmt, [])]


def read(fmt: str | None, pieces, **kw):
    reply = open_reply(None if fmt is None else ToolFormat(fmt, fmt != "generic"), calls=fmt is not None, **kw)
    deltas = [d for p in pieces for d in reply.feed(p)] + reply.close()
    return reply, deltas


def assemble(deltas) -> dict:
    """What a client adds up from the deltas (as the openai package's stream helpers do)."""
    msg: dict = {"content": None}
    calls: dict[int, dict] = {}
    for d in deltas:
        for key in ("content", "reasoning_content"):
            if key in d:
                msg[key] = (msg.get(key) or "") + d[key]
        for tc in d.get("tool_calls", []):
            if tc["index"] not in calls:  # the first delta of a call carries its id, type and name
                assert set(tc) == {"index", "id", "type", "function"} and tc["type"] == "function"
                assert tc["function"]["name"] and tc["function"]["arguments"] == ""
                calls[tc["index"]] = {"id": tc["id"], "type": "function", "function": dict(tc["function"])}
            else:  # then only argument fragments
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                calls[tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
    if calls:
        assert sorted(calls) == list(range(len(calls)))
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


def splits(text: str):
    yield [text]
    yield list(text)  # a character at a time
    for k in range(1, len(text)):
        yield [text[:k], text[k:]]


def norm(msg: dict) -> dict:
    out = {"content": msg["content"] or None, "reasoning_content": msg.get("reasoning_content")}
    out["tool_calls"] = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls", [])]
    return out


@pytest.mark.parametrize("fmt, text", CASES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(CASES)])
def test_streamed_in_any_pieces_adds_up_to_the_whole(fmt, text):
    whole, _ = read(fmt, [text])
    want = norm(whole.message())
    for pieces in splits(text):
        reply, deltas = read(fmt, pieces)
        got = norm(reply.message())
        assert [c[1:] for c in got["tool_calls"]] == [c[1:] for c in want["tool_calls"]], pieces
        assert {**got, "tool_calls": None} == {**want, "tool_calls": None}, pieces
        assert norm(assemble(deltas)) == got, pieces


# replies cut short inside a call (max_tokens): the reply keeps the call begun, parse (whole
# replies only) finds none
CUT = ('<tool_call>\n{"na', "<tool_call>\n<function=a>\n<para")


@pytest.mark.parametrize("fmt, text", CASES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(CASES)])
def test_the_whole_reply_reads_as_tool_calls_parse_reads_it(fmt, text):
    f = ToolFormat(fmt, fmt != "generic")
    body = split_reasoning(text, tags=reasoning_tags(f))[1]
    content, calls = parse(f, body)
    msg = read(fmt, [text])[0].message()
    if text.endswith(CUT):
        assert (content, calls) == (unmarked(f, body).strip(), [])
        assert len(msg.get("tool_calls", [])) == text.endswith(CUT[1])  # (the first has no name yet)
        if text.endswith(CUT[1]):  # what is left of a call begun is not content
            assert msg["content"] is None
        return
    assert (msg["content"] or "") == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])] == \
           [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    if calls and FORMATS[fmt].family in (json_calls, marked, harmony):  # the arguments as the model wrote them
        for c in msg["tool_calls"]:
            assert c["function"]["arguments"] in text and c["id"].startswith("call_")


@pytest.mark.parametrize("fmt, text", CASES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(CASES)])
def test_a_reply_cut_at_any_character_reads_the_same_streamed_or_whole(fmt, text):
    """max_tokens may end a reply anywhere: each cut reads the same fed whole, a character at a
    time, or in two pieces."""
    for k in range(len(text) + 1):
        cut = text[:k]
        want = norm(read(fmt, [cut])[0].message())
        for pieces in (list(cut), [cut[:k // 2], cut[k // 2:]]):
            reply, deltas = read(fmt, pieces)
            got = norm(reply.message())
            assert [c[1:] for c in got["tool_calls"]] == [c[1:] for c in want["tool_calls"]], pieces
            assert {**got, "tool_calls": None} == {**want, "tool_calls": None}, pieces
            assert norm(assemble(deltas)) == got, pieces


@pytest.mark.parametrize("fmt", sorted(WRITTEN))
def test_every_format_streams_a_call_as_it_is_written(fmt):
    """A character at a time: the call's id and name come before its arguments are written, the
    arguments in fragments as they are written - a text value a character at a time where the
    format writes text, else a value once it ends -, and no marker of the format is ever content."""
    f = ToolFormat(fmt, fmt != "generic")
    text = WRITTEN[fmt]
    reply = open_reply(f, calls=True, tools=TOOLS)
    named_at, paris_at, fragments, args, contents = None, None, 0, "", []
    for i, c in enumerate(text):
        for d in reply.feed(c):
            for tc in d.get("tool_calls", []):
                named_at = i if "id" in tc and named_at is None else named_at
                fragments += "id" not in tc
                args += tc["function"]["arguments"]
                paris_at = i if "Paris" in args and paris_at is None else paris_at
            contents += [d["content"]] if "content" in d else []
    reply.close()
    (call,) = reply.message()["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert named_at is not None and named_at < text.index("Paris")
    # the value is sent once its own end is written (Gemma 4's <|"|>} is the longest), not the call's
    assert paris_at is not None and paris_at <= text.index("Paris") + len('Paris<|"|>}')
    assert fragments >= (2 if FORMATS[fmt].family in (pythonic, gemma4) else len("Paris"))
    markers = [m.strip() for m in preserved_markers(f, True) if m.strip()]
    assert not [m for m in markers for t in contents if m in t], contents


def test_arguments_stream_as_they_are_written():
    reply = Reply(ToolFormat("hermes", True), calls=True)
    assert reply.feed("Let me look.\n<tool") == [{"content": "Let me look."}]  # the marker's start waits
    head = reply.feed('_call>\n{"name": "get_weather", "arguments": {"ci')
    assert head[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert head[1] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}
    assert reply.feed('ty": "Paris"}}\n</tool_call>') == [{"tool_calls": [{"index": 0, "function": {
        "arguments": 'ty": "Paris"}'}}]}]
    assert reply.close() == [] and reply.finish_reason("stop") == "tool_calls"


def test_a_call_cut_short_keeps_what_was_written_and_says_length():
    reply, _ = read("hermes", ['<tool_call>\n{"name": "f", "arguments": {"city": "Pa'])
    msg = reply.message()
    assert msg["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"city": "Pa'}
    assert reply.finish_reason("length") == "length"
    cut, _ = read("hermes", ['<tool_call>\n{"na'])  # no name yet: not a call, the text is content
    assert cut.message() == {"role": "assistant", "content": '<tool_call>\n{"na'}


def test_reasoning_is_split_off():
    reply, deltas = read(None, ["<think>\n I think", " it is sunny. \n</th", "ink>\n\nIt is sunny. "])
    assert reply.message() == {"role": "assistant", "content": "It is sunny. ", "reasoning_content": "I think it is sunny."}
    assert deltas[0] == {"reasoning_content": "I think"}
    opened, _ = read(None, ["hmm</think>Sunny"], thinking=True)  # the prompt opened the think block
    assert opened.message() == {"role": "assistant", "content": "Sunny", "reasoning_content": "hmm"}
    cut, _ = read(None, ["<think>still going"])
    assert cut.message() == {"role": "assistant", "content": "", "reasoning_content": "still going"}
    plain, deltas = read(None, [" Hello", " <b>world</b>\n"])  # no tools, no think block: as written
    assert plain.message() == {"role": "assistant", "content": " Hello <b>world</b>\n"}


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    one, deltas = read("hermes", [text], parallel=False)
    assert [c["function"]["name"] for c in one.message()["tool_calls"]] == ["a"]
    assert norm(assemble(deltas)) == norm(one.message())


def test_a_json_answer_is_content_in_the_generic_format():
    answer = '{"response": "yes", "score": 3}'
    assert read("generic", [answer], json_answer=True)[0].message()["content"] == answer
    assert read("generic", [answer])[0].message()["content"] == "yes"


def test_gpt_oss_streams_its_analysis_then_its_call():
    reply = open_reply(ToolFormat("gpt_oss", True), calls=True)
    assert reply.feed("<|channel|>analysis<|mess") == []  # a header is held until it ends
    assert reply.feed("age|>The user wants") == [{"reasoning_content": "The user wants"}]
    assert reply.feed(" weather.<|e") == [{"reasoning_content": " weather."}]  # <|end|>'s start waits
    head = reply.feed('nd|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"ci')
    assert head[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert head[1] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}
    assert reply.feed('ty": "Paris"}') == [{"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]}]
    assert reply.close() == [] and reply.finish_reason("stop") == "tool_calls"
    assert reply.message()["reasoning_content"] == "The user wants weather." and reply.message()["content"] is None
    plain = open_reply(ToolFormat("gpt_oss", True), calls=False)  # no tools: the channels are read all the same
    deltas = plain.feed("<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>Sunny")
    assert deltas == [{"reasoning_content": "hmm"}, {"content": "Sunny"}]


def test_command_r7b_thinking_streams_as_reasoning_with_or_without_tools():
    text = "<|START_THINKING|>The user wants weather.<|END_THINKING|><|START_RESPONSE|>It is sunny.<|END_RESPONSE|>"
    for calls in (True, False):
        for pieces in splits(text):
            reply = open_reply(ToolFormat("command_r7b", True), calls=calls)
            deltas = [d for p in pieces for d in reply.feed(p)] + reply.close()
            assert reply.message() == {"role": "assistant", "content": "It is sunny.",
                                       "reasoning_content": "The user wants weather."}, pieces
            assert norm(assemble(deltas)) == norm(reply.message())
    opened = open_reply(ToolFormat("command_r7b", True), calls=False, thinking=True)  # the prompt opened the block
    assert opened.feed("hmm<|END_THI") == [{"reasoning_content": "hmm"}]


def test_json_spans_follow_members_by_path():
    text = '{"a": [1, {"b": "x}"}], "c": tru'
    j = JSONSpans(0)
    j.feed(text)
    assert j.span_text(text, ("a",)) == '[1, {"b": "x}"}]' and j.span_text(text, ("a", 1, "b")) == '"x}"'
    assert j.keys[()] == ["a", "c"] and not j.complete(("c",)) and not j.done
    j.feed(text + "e}")
    assert j.complete(("c",)) and j.end == len(text) + 2
