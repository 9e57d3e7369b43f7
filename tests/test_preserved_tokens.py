"""A chat format's markers stay in the reply's text where the vocabulary makes them control
tokens (which decoding otherwise drops, so the call would be read as plain content): Mistral's
[TOOL_CALLS], Hermes / Qwen's <tool_call> ... </tool_call>, Command R7B's <|END_THINKING|>, as
llama-server's preserved tokens.

The model is a tiny GGUF that says what the test decides (tiny_models.chain_model: each token is
answered by one fixed next token). After Mistral Nemo's prompt (it ends with [/INST]) it writes
<|other|> (a control token that is no marker), [TOOL_CALLS], a JSON call, then EOS; after
Qwen 2.5's (it ends with a newline) <tool_call>, a JSON call, </tool_call>, then <|im_end|>. After
an end of generation it would write LEAK for ever: a reply that did not stop there says so. After
Cohere's Command R7B-style prompt (it opens the reasoning) it writes the rest of its reasoning,
<|END_THINKING|>, then its answer between <|START_RESPONSE|> and <|END_RESPONSE|>. The
call reaches tool_calls through LLM.chat (streamed or not, speculative or not), chat_batch
(BatchEngine) and the server (streamed or not); without tools the call markers are dropped as
before, while the reasoning and answer markers are kept."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgellm import LLM
from edgellm.gguf_file import GGUFFile
from edgellm.tokenizer import Tokenizer
from edgellm.tokenizer.vocab import Attr
from edgellm.tool_calls import ToolFormat, detect_format, parse, prepare_turn, preserved_markers
from llamacpp_source import models_dir
from server_process import ServerProcess, open_stream, sse_events
from tiny_models import chain_model

NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
M_CALL = '[{"name":"get_weather","arguments":{"city":"Paris"}}]'
H_CALL = '{"name":"get_weather","arguments":{"city":"Paris"}}'
COHERE = ["<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>",
          "<|START_TEXT|>", "<|END_TEXT|>", "<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>",
          "<|END_RESPONSE|>", "<|START_ACTION|>", "<|END_ACTION|>"]
CONTROLS = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|other|>"] + COHERE
WORDS = ["▁", M_CALL, H_CALL, "hmm", "Sunny.", "LEAK"]
TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + CONTROLS + WORDS
TYPES = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [CONTROL] * len(CONTROLS) + [NORMAL] * len(WORDS)
ID = {t: i for i, t in enumerate(TOKENS)}
CHAIN = {"[/INST]": "<|other|>", "<|other|>": "[TOOL_CALLS]", "[TOOL_CALLS]": M_CALL, M_CALL: "</s>", "</s>": "LEAK",
         "<0x0A>": "<tool_call>", "<tool_call>": H_CALL, H_CALL: "</tool_call>", "</tool_call>": "<|im_end|>",
         "<|im_end|>": "LEAK", "LEAK": "LEAK",
         # Cohere's prompt opens the reasoning: the rest of it, then the answer between its marks
         "<|START_THINKING|>": "hmm", "hmm": "<|END_THINKING|>", "<|END_THINKING|>": "<|START_RESPONSE|>",
         "<|START_RESPONSE|>": "Sunny.", "Sunny.": "<|END_RESPONSE|>", "<|END_RESPONSE|>": "<|END_OF_TURN_TOKEN|>",
         "<|END_OF_TURN_TOKEN|>": "LEAK"}
COHERE_TEMPLATE = "Cohere2MoE"  # (Command R7B's format: its prompt ends with <|START_THINKING|>)
COHERE_REPLY = "hmm<|END_THINKING|><|START_RESPONSE|>Sunny.<|END_RESPONSE|>"

TEMPLATES = {"mistral": "mistralai-Mistral-Nemo-Instruct-2407", "hermes": "Qwen-Qwen2.5-7B-Instruct"}
# the reply with tools (its markers kept, <|other|> not), and without (control tokens all dropped)
WITH_TOOLS = {"mistral": "[TOOL_CALLS]" + M_CALL, "hermes": "<tool_call>" + H_CALL + "</tool_call>"}
WITHOUT = {"mistral": M_CALL, "hermes": H_CALL}
N_REPLY = {"mistral": 3, "hermes": 3}  # tokens before the end of generation
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["CET"]}},
                                        "required": ["zone"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
MAX_TOKENS = 12  # room to go on past the end of generation
SERVER_TIMEOUT = 60  # seconds for one request to the tiny model
MODEL_ID = "chain"  # the server's model id: the file's stem


def template_path(name: str):
    return models_dir() / "templates" / f"{TEMPLATES.get(name, name)}.jinja"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return chain_model(tmp_path_factory.mktemp("preserved") / f"{MODEL_ID}.gguf", TOKENS, TYPES,
                       {ID[a]: ID[b] for a, b in CHAIN.items()},
                       special={"bos": 1, "eos": 2, "unknown": 0, "eot": ID["<|END_OF_TURN_TOKEN|>"]})


@pytest.fixture(scope="module")
def tok(model_path):
    return Tokenizer.from_metadata(GGUFFile(model_path).metadata)


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def chat(request, model_path):
    """(format name, an LLM of the tiny model with that format's template)"""
    llm = LLM(model_path, n_ctx=2048, n_threads=1, chat_template=template_path(request.param).read_text())
    yield request.param, llm
    llm.close()


def the_call(calls: list[dict]) -> None:
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("get_weather", {"city": "Paris"})]


# -- the formats' markers, the tokenizer's preserved ids ----------------------------------------------


def test_preserved_ids_are_the_control_tokens_of_a_formats_markers(tok):
    def ids(name, calls=True):
        return tok.preserved_ids(preserved_markers(ToolFormat(name, True), calls))

    assert ids("mistral") == {ID["[TOOL_CALLS]"]}
    assert ids("hermes") == {ID["<tool_call>"], ID["</tool_call>"]}
    assert ids("qwen3_coder") == {ID["<tool_call>"], ID["</tool_call>"]}  # (in "<tool_call>\n<function=", ...)
    assert ids("mistral", calls=False) == ids("hermes", calls=False) == ids("generic") == frozenset()
    # end-of-generation tokens never (they end the reply), normal tokens need not be
    assert tok.preserved_ids(["</s>", "<|im_end|>", "LEAK", "[TOOL_CALLS]"]) == {ID["[TOOL_CALLS]"]}


def test_decoding_renders_preserved_control_tokens_only(tok):
    ids = [ID["<|other|>"], ID["[TOOL_CALLS]"], ID[M_CALL]]
    keep = frozenset({ID["[TOOL_CALLS]"]})
    assert tok.decode(ids) == M_CALL  # (as before: no preserved set)
    assert tok.decode(ids, preserved=keep) == "[TOOL_CALLS]" + M_CALL
    assert tok.decode(ids, special=True) == "<|other|>[TOOL_CALLS]" + M_CALL
    for preserved, text in ((frozenset(), M_CALL), (keep, "[TOOL_CALLS]" + M_CALL)):
        d = tok.streaming_decoder(preserved=preserved)
        assert "".join(d.add(i) for i in ids) + d.flush() == text


# -- LLM.chat, chat_message, chat_batch -------------------------------------------------------------


@pytest.mark.parametrize("speculative", [None, "lookup"])
def test_chat_keeps_the_call_markers_and_the_call_is_read(chat, speculative):
    name, llm = chat
    kw = dict(tools=[WEATHER], max_tokens=MAX_TOKENS, temperature=0, speculative=speculative)
    assert llm.chat(ASK, **kw) == WITH_TOOLS[name]
    assert (llm.last_stats.stop_reason, llm.last_stats.generated_tokens) == ("eog", N_REPLY[name])
    streamed = "".join(llm.chat(ASK, stream=True, **kw))
    assert streamed == WITH_TOOLS[name]
    content, calls = parse(detect_format(llm.template.source), streamed, [WEATHER])
    assert content == ""
    the_call(calls)
    out = llm.create_chat_completion(ASK, **kw)["choices"][0]
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None
    the_call(out["message"]["tool_calls"])


def test_a_streamed_chat_completion_adds_up_to_the_whole(chat):
    """create_chat_completion(stream=True): the role, the call's id and name, its arguments, then
    finish_reason - the chunks a server streams, adding up to the message it returns whole."""
    name, llm = chat
    kw = dict(tools=[WEATHER], max_tokens=MAX_TOKENS, temperature=0)
    whole = llm.create_chat_completion(ASK, **kw)["choices"][0]
    chunks = list(llm.create_chat_completion(ASK, stream=True, **kw))
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": None} and deltas[-1] == {}
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["tool_calls"]
    first = deltas[1]["tool_calls"][0]
    assert set(first) == {"index", "id", "type", "function"} and first["function"] == {"name": "get_weather", "arguments": ""}
    args = "".join(tc["function"]["arguments"] for d in deltas[2:-1] for tc in d["tool_calls"])
    assert (first["function"]["name"], args) == (whole["message"]["tool_calls"][0]["function"]["name"],
                                                 whole["message"]["tool_calls"][0]["function"]["arguments"])
    assert not any("content" in d for d in deltas[1:])
    plain = list(llm.create_chat_completion(ASK, stream=True, max_tokens=MAX_TOKENS, temperature=0))
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in plain) == WITHOUT[name]
    assert plain[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("kw", [{}, {"tools": [WEATHER], "tool_choice": "none"}], ids=["no tools", "tool_choice none"])
def test_without_tools_the_markers_are_dropped_as_before(chat, kw):
    name, llm = chat
    assert llm.chat(ASK, max_tokens=MAX_TOKENS, temperature=0, **kw) == WITHOUT[name]
    assert "".join(llm.chat(ASK, stream=True, max_tokens=MAX_TOKENS, temperature=0, **kw)) == WITHOUT[name]
    msg = llm.chat_message(ASK, max_tokens=MAX_TOKENS, temperature=0, **kw)
    assert msg["content"] == WITHOUT[name] and "tool_calls" not in msg


def test_chat_batch_keeps_the_call_markers(chat):
    name, llm = chat
    replies = llm.chat_batch([ASK, ASK], tools=[WEATHER], max_tokens=MAX_TOKENS, temperature=0)
    assert replies == [WITH_TOOLS[name]] * 2
    for text in replies:
        the_call(parse(detect_format(llm.template.source), text, [WEATHER])[1])
    assert llm.chat_batch([ASK, ASK], max_tokens=MAX_TOKENS, temperature=0) == [WITHOUT[name]] * 2


def test_chat_batch_follows_a_required_call(chat):
    """A named tool_choice's grammar holds for every conversation (the model alone would call
    get_weather)."""
    _, llm = chat
    tools, choice = [WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}
    for text in llm.chat_batch([ASK, ASK], tools=tools, tool_choice=choice, max_tokens=200, temperature=0):
        calls = parse(detect_format(llm.template.source), text, tools)[1]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
            [("get_time", {"zone": "CET"})]


@pytest.fixture(scope="module")
def cohere(model_path):
    llm = LLM(model_path, n_ctx=2048, n_threads=1, chat_template=template_path(COHERE_TEMPLATE).read_text())
    yield llm
    llm.close()


def test_reasoning_and_answer_markers_are_kept_without_tools(cohere):
    """Command R7B's format reads its reasoning up to <|END_THINKING|> and its answer between
    <|START_RESPONSE|> and <|END_RESPONSE|>: kept with tools or without (dropped, the reply would
    be all reasoning), not <|END_OF_TURN_TOKEN|>, which ends it."""
    kw = dict(max_tokens=MAX_TOKENS, temperature=0)
    assert cohere.chat(ASK, **kw) == "".join(cohere.chat(ASK, stream=True, **kw)) == COHERE_REPLY
    assert cohere.chat_batch([ASK], **kw) == [COHERE_REPLY]
    for tools in (None, [WEATHER]):
        msg = cohere.chat_message(ASK, tools=tools, **kw)
        assert (msg["reasoning_content"], msg["content"], msg.get("tool_calls")) == ("hmm", "Sunny.", None)


def test_run_keeps_the_answer_in_its_history_without_markers(tmp_path):
    """`edgellm run` (the model's own template: Command R7B's) keeps each answer in its history as
    the turn reads it: the reasoning apart, the content without the kept markers, so the template
    does not render <|START_RESPONSE|> twice; the saved chat (--prompt-cache) holds that history."""
    path = chain_model(tmp_path / "cohere.gguf", TOKENS, TYPES, {ID[a]: ID[b] for a, b in CHAIN.items()},
                       special={"bos": 1, "eos": 2, "unknown": 0, "eot": ID["<|END_OF_TURN_TOKEN|>"]},
                       chat_template=template_path(COHERE_TEMPLATE).read_text())
    cache = tmp_path / "chat.state"
    r = subprocess.run([sys.executable, "-m", "edgellm", "run", str(path), "-c", "2048", "-n", str(MAX_TOKENS),
                        "--temp", "0", "-t", "1", "--prompt-cache", str(cache)],
                       input="Weather in Paris?\nAnd tomorrow?\n/exit\n", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(COHERE_REPLY) == 2  # (shown as written)
    with LLM(path, n_ctx=2048, n_threads=1) as llm:
        history = llm.load_state(cache)["messages"]
    answer = {"role": "assistant", "content": "Sunny.", "reasoning_content": "hmm"}
    assert history == [{"role": "user", "content": "Weather in Paris?"}, answer,
                       {"role": "user", "content": "And tomorrow?"}, answer]


# -- the server ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def server(request, model_path):
    srv = ServerProcess(model_path, "-c", "2048", "--parallel", "2", "-t", "1",
                        "--chat-template-file", str(template_path(request.param)))
    yield request.param, srv
    assert srv.stop() == 0


def body(**kw) -> dict:
    return {"model": MODEL_ID, "messages": ASK, "max_tokens": MAX_TOKENS, "temperature": 0, **kw}


def post(srv, payload: dict) -> dict:
    conn = srv.connection(timeout=SERVER_TIMEOUT)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(payload).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out = json.loads(resp.read())
        assert resp.status == 200, out
        return out
    finally:
        conn.close()


def stream(srv, payload: dict) -> tuple[dict, list[str]]:
    """The message a client adds up from the stream, and the finish reasons."""
    conn, resp = open_stream(srv, "/v1/chat/completions", {**payload, "stream": True})
    conn.sock.settimeout(SERVER_TIMEOUT)
    try:
        assert resp.status == 200
        msg, calls, reasons = {"content": None}, {}, []
        for ev in sse_events(resp):
            if ev == "[DONE]":
                break
            choice = ev["choices"][0]
            d = choice["delta"]
            for key in ("content", "reasoning_content"):
                if d.get(key):
                    msg[key] = (msg.get(key) or "") + d[key]
            for tc in d.get("tool_calls") or []:
                c = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                c["name"] += tc["function"].get("name") or ""
                c["arguments"] += tc["function"].get("arguments") or ""
            if choice.get("finish_reason"):
                reasons.append(choice["finish_reason"])
        if calls:
            msg["tool_calls"] = [{"function": calls[i]} for i in sorted(calls)]
        return msg, reasons
    finally:
        conn.close()


@pytest.mark.parametrize("speculative", [None, "lookup"])
def test_server_reads_the_call_streamed_or_not(server, speculative):
    _, srv = server
    payload = body(tools=[WEATHER], **({"speculative": speculative} if speculative else {}))
    out = post(srv, payload)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    the_call(choice["message"]["tool_calls"])
    assert out["usage"]["completion_tokens"] == 3  # (stopped at the end of generation)
    msg, reasons = stream(srv, payload)
    assert reasons == ["tool_calls"] and msg["content"] is None
    the_call(msg["tool_calls"])


@pytest.fixture(scope="module")
def cohere_server(model_path):
    srv = ServerProcess(model_path, "-c", "2048", "--parallel", "1", "-t", "1",
                        "--chat-template-file", str(template_path(COHERE_TEMPLATE)))
    yield srv
    assert srv.stop() == 0


def test_server_reads_reasoning_by_its_kept_markers(cohere_server):
    out = post(cohere_server, body())["choices"][0]
    assert (out["message"].get("reasoning_content"), out["message"]["content"]) == ("hmm", "Sunny.")
    msg, reasons = stream(cohere_server, body())
    assert (msg.get("reasoning_content"), msg["content"], reasons) == ("hmm", "Sunny.", ["stop"])


def test_server_without_tools_drops_the_markers(server):
    name, srv = server
    choice = post(srv, body())["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == (WITHOUT[name], "stop")
    assert "tool_calls" not in choice["message"] or not choice["message"]["tool_calls"]
    msg, reasons = stream(srv, body())
    assert (msg["content"], reasons) == (WITHOUT[name], ["stop"]) and "tool_calls" not in msg


def test_a_real_vocabulary_preserves_its_control_markers_only():
    """Gemma 4's vocabulary (llama.cpp's models/ggml-vocab-gemma-4.gguf): its own call and reasoning
    markers are user-defined tokens, in the text anyway, so none is preserved; <|think|> there is a
    control token, preserved where a format reads it (Solar Open's reasoning tag); <turn|>, its end
    of turn, never."""
    real = Tokenizer.from_metadata(dict(GGUFFile(models_dir() / "ggml-vocab-gemma-4.gguf").metadata))
    think, turn_end = real.vocab.token_to_id.get("<|think|>"), real.vocab.token_to_id.get("<turn|>")
    assert real.preserved_ids(preserved_markers(ToolFormat("gemma4", True), True)) == frozenset()
    assert real.preserved_ids(preserved_markers(ToolFormat("solar_open", True), False)) == {think}
    assert real.decode([think]) == "" and real.decode([think], preserved={think}) == "<|think|>"
    assert turn_end in real.eog_ids and real.preserved_ids(["<turn|>", "<|think|>"]) == {think}


# -- the markers as the real vocabularies have them -------------------------------------------------
#
# Each vocabulary below has its model's special tokens - texts, order, and the GGUF type llama.cpp's
# converter gives them - around 256 byte tokens and the words of a reply (an SPM vocabulary, as
# chain_model writes; the real ones are BPE, which changes how text is cut, not which tokens are
# control ones):
# - Mistral's tekken: its first 20 special tokens, all control (mistral-common's tekken.json;
#   [TOOL_CALLS] is rank 9).
# - Granite 3.3: its added special tokens (IBM's granite-io lists them: <|end_of_text|>, the FIM and
#   repository ones, <|start_of_role|>, <|end_of_role|>, <|tool_call|>, cite and plugin marks); the
#   converter makes an added token control where it is special or looks like <|...|>.
# - Kimi K2: its tiktoken special tokens (163584 [BOS] ... 163601 <|im_middle|>, with 163589, 163592,
#   163600 reserved), every one control in the converter (convert_hf_to_gguf's kimi-k2 vocabulary).
# llama.cpp's own vocabulary files have none of these formats' markers as control tokens.
REAL = {
    "mistral": dict(template="mistralai-Mistral-Nemo-Instruct-2407", eos="</s>", specials=[
        "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]",
        "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"],
        reply=["[TOOL_CALLS]", M_CALL], markers={"[TOOL_CALLS]"}),
    "granite": dict(template="ibm-granite-granite-3.3-2B-Instruct", eos="<|end_of_text|>", specials=[
        "<|end_of_text|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<filename>", "<gh_stars>",
        "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>", "<jupyter_text>", "<jupyter_code>",
        "<jupyter_output>", "<empty_output>", "<commit_before>", "<commit_msg>", "<commit_after>", "<reponame>",
        "<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>", "<|start_of_cite|>", "<|end_of_cite|>",
        "<|start_of_plugin|>", "<|end_of_plugin|>"],
        reply=["<|tool_call|>", M_CALL], markers={"<|tool_call|>"}),
    "kimi_k2": dict(template="Kimi-K2-Instruct", eos="<|im_end|>", specials=[
        "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|reserved_token_5|>", "<|start_header_id|>",
        "<|end_header_id|>", "<|reserved_token_8|>", "[EOT]", "<|im_system|>", "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
        "<|reserved_token_16|>", "<|im_middle|>"],
        reply=["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.get_weather:0", "<|tool_call_argument_begin|>",
               '{"city":"Paris"}', "<|tool_call_end|>", "<|tool_calls_section_end|>"],
        markers={"<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                 "<|tool_calls_section_end|>"}),
}


@pytest.fixture(scope="module", params=sorted(REAL))
def real(request, tmp_path_factory):
    """(format name, its facts, the tiny model with its vocabulary and template): after the prompt
    (it ends with a control token) the model writes the reply's tokens, then its end of turn."""
    name, facts = request.param, REAL[request.param]
    words = ["▁"] + sorted({t for t in facts["reply"] if t not in facts["specials"]}) + ["LEAK"]
    tokens = facts["specials"] + [f"<0x{i:02X}>" for i in range(256)] + words
    types = [CONTROL] * len(facts["specials"]) + [BYTE] * 256 + [NORMAL] * len(words)
    ids = {t: i for i, t in enumerate(tokens)}
    text = template_path(facts["template"]).read_text()
    with LLM(chain_model(tmp_path_factory.mktemp(name) / "probe.gguf", tokens, types, {}, special={"eos": ids[facts["eos"]]},
                         chat_template=text), n_ctx=2048, n_threads=1) as probe:  # (which token ends the prompt)
        last = probe.chat_tokens(prepare_turn(probe.template, ASK, [WEATHER]).prompt)[-1]
    chain = dict(zip([last] + [ids[t] for t in facts["reply"]], [ids[t] for t in facts["reply"]] + [ids[facts["eos"]]]))
    chain[ids[facts["eos"]]] = chain[ids["LEAK"]] = ids["LEAK"]
    path = chain_model(tmp_path_factory.mktemp(name) / f"{name}.gguf", tokens, types, chain,
                       special={"eos": ids[facts["eos"]], **({"bos": ids["<s>"]} if "<s>" in ids else {})}, chat_template=text)
    llm = LLM(path, n_ctx=2048, n_threads=1)
    yield name, facts, llm
    llm.close()


def test_real_vocabularies_keep_their_control_markers_and_the_call_is_read(real):
    name, facts, llm = real
    fmt = detect_format(llm.template.source)
    tok = llm.tokenizer
    assert fmt.name == name
    assert all(tok.vocab.attr(tok.vocab.token_to_id[m]) & Attr.CONTROL for m in facts["markers"])
    assert tok.preserved_ids(preserved_markers(fmt, True)) == {tok.vocab.token_to_id[m] for m in facts["markers"]}
    assert tok.preserved_ids(preserved_markers(fmt, False)) == frozenset()
    kw = dict(tools=[WEATHER], max_tokens=MAX_TOKENS, temperature=0)
    assert llm.chat(ASK, **kw) == "".join(facts["reply"])  # the markers in the text, the end of turn not
    msg = llm.chat_message(ASK, **kw)
    assert msg["content"] is None
    the_call(msg["tool_calls"])
    deltas = [c["choices"][0]["delta"] for c in llm.create_chat_completion(ASK, stream=True, **kw)]
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert [(calls[0]["function"]["name"], json.loads("".join(tc["function"]["arguments"] for tc in calls)))] == \
        [("get_weather", {"city": "Paris"})]
    assert llm.chat(ASK, max_tokens=MAX_TOKENS, temperature=0) == "".join(t for t in facts["reply"] if t not in facts["markers"])
