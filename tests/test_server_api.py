"""`edgellm serve` through the official `openai` package (sync and async, streamed and not) and
plain HTTP, against a real server process running SmolLM2 (fetched through the resolver)."""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest

from server_process import ServerProcess

pytestmark = pytest.mark.real

MODEL = "smollm2-135m-instruct"
N_CTX = 2048
PARALLEL = 4


@pytest.fixture(scope="module")
def server(smollm2_path):
    srv = ServerProcess(MODEL, "-c", str(N_CTX), "--parallel", str(PARALLEL), "-t", "1", "--max-queue", "64")
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_chat(client):
    r = client.chat.completions.create(model=MODEL, messages=ask("What is the capital of France?"), max_tokens=16,
                                       seed=1)
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")
    (c,) = r.choices
    assert c.index == 0 and c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length") and c.logprobs is None
    u = r.usage
    assert u.prompt_tokens > 5 and 1 <= u.completion_tokens <= 16
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert (c.finish_reason == "length") == (u.completion_tokens == 16)


def test_streamed_text_equals_non_streamed_for_the_same_seed(client):
    kw = dict(model=MODEL, messages=ask("Write a short poem about the sea."), max_tokens=40, seed=7, temperature=0.9)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert all(ch.usage is None for ch in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_n_choices_with_a_seed(client):
    kw = dict(model=MODEL, messages=ask("Name a fruit."), max_tokens=12, n=2, seed=3, temperature=1.0)
    first = client.chat.completions.create(**kw)
    again = client.chat.completions.create(**kw)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert 2 <= first.usage.completion_tokens <= 24 and first.usage.prompt_tokens == again.usage.prompt_tokens
    streamed = {0: "", 1: ""}
    for ch in client.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            streamed[c.index] += c.delta.content or ""
    assert [streamed[0], streamed[1]] == [c.message.content for c in first.choices]


def test_more_choices_than_sequences_run_in_groups_seeded_as_one_request(client):
    """n above --parallel: the choices run in groups of PARALLEL, choice i seeded seed + i as the
    engine seeds siblings, so choices PARALLEL.. of n=PARALLEL+2 are choices 0.. of n=2 at seed + PARALLEL."""
    kw = dict(model=MODEL, messages=ask("Name a colour."), max_tokens=8, temperature=1.0)
    many = client.chat.completions.create(n=PARALLEL + 2, seed=11, **kw)
    assert [c.index for c in many.choices] == list(range(PARALLEL + 2))
    later = client.chat.completions.create(n=2, seed=11 + PARALLEL, **kw)
    assert [c.message.content for c in many.choices[PARALLEL:]] == [c.message.content for c in later.choices]
    first = client.chat.completions.create(n=PARALLEL, seed=11, **kw)
    assert [c.message.content for c in many.choices[:PARALLEL]] == [c.message.content for c in first.choices]


def test_stop_strings(client):
    kw = dict(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0)
    plain = client.completions.create(**kw).choices[0]
    assert " 7" in plain.text, plain.text  # greedy counting goes on past 7
    cut = plain.text[: plain.text.index(" 7")]
    stopped = client.completions.create(stop=[" 7", "never"], **kw).choices[0]
    assert (stopped.text, stopped.finish_reason) == (cut, "stop")
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(stop=" 7", stream=True, **kw))
    assert streamed == cut


def test_seed_reproduces_and_temperature_zero_is_greedy(client):
    kw = dict(model=MODEL, messages=ask("Tell me a story."), max_tokens=20)
    a = client.chat.completions.create(seed=11, temperature=1.0, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=11, temperature=1.0, **kw).choices[0].message.content
    assert a == b
    greedy = client.chat.completions.create(temperature=0, **kw).choices[0].message.content
    # llama.cpp's extras: top_k=1 and min_p=1 leave only the best token, as temperature 0 does
    assert client.chat.completions.create(temperature=1.0, seed=5, extra_body={"top_k": 1}, **kw) \
        .choices[0].message.content == greedy
    assert client.chat.completions.create(temperature=1.0, seed=5, extra_body={"min_p": 1.0}, **kw) \
        .choices[0].message.content == greedy
    assert client.chat.completions.create(temperature=1.0, seed=5, top_p=0, **kw).choices[0].message.content == greedy


def test_logit_bias_and_penalties_change_greedy_output(client, server):
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=0)
    plain = client.completions.create(**kw).choices[0]
    first = plain.logprobs.tokens[0]
    _, _, tok = server.request("POST", "/tokenize", {"content": first})
    banned = client.completions.create(logit_bias={str(tok["tokens"][0]): -100}, **kw).choices[0]
    assert banned.logprobs.tokens[0] != first
    _, _, forced = server.request("POST", "/tokenize", {"content": " banana"})
    (banana,) = forced["tokens"]
    got = client.completions.create(logit_bias={str(banana): 100}, **kw).choices[0]
    assert got.logprobs.tokens[0] == " banana"
    rep = dict(model=MODEL, prompt="the the the the the the the the", max_tokens=8, temperature=0)
    base = client.completions.create(**rep).choices[0].text
    assert client.completions.create(frequency_penalty=2.0, **rep).choices[0].text != base
    assert client.completions.create(presence_penalty=2.0, **rep).choices[0].text != base
    assert client.completions.create(extra_body={"repeat_penalty": 2.0}, **rep).choices[0].text != base


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=ask("Say hello."), max_tokens=8, temperature=0,
                                       logprobs=True, top_logprobs=3)
    c = r.choices[0]
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert len(e.top_logprobs) == 3
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)
        assert (e.token, e.logprob) == (e.top_logprobs[0].token, e.top_logprobs[0].logprob)  # greedy: the best
    assert bytes(b for e in content for b in e.bytes).decode() == c.message.content


def test_logprobs_are_the_models(client, server, smollm2_path):
    """The first token's log-prob equals log-softmax of the logits the server's engine computes for
    the prompt: the batched path's (batch-invariant, so the same bits in this process's own
    BatchEngine; for legacy-type weights not llm.logits()'s llama.cpp order - README)."""
    from edgellm import LLM
    from edgellm.scheduler import BatchEngine, SamplingParams

    llm = LLM(smollm2_path, n_ctx=256, n_threads=1)
    ids = llm.tokenize("The quick brown fox")
    eng = BatchEngine(llm, max_seqs=2)
    rows = []
    plain = eng._logprobs
    eng._logprobs = lambda req, x, tok: (rows.append(np.array(x, dtype=np.float64)), plain(req, x, tok))[1]
    eng.run_until_done([eng.submit(ids, max_tokens=1, sampling=SamplingParams(temperature=0.0), logprobs=5)])
    logits = rows[0]
    logsoft = logits - logits.max() - math.log(np.exp(logits - logits.max()).sum())
    best = np.argsort(-logsoft, kind="stable")[:5]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    assert lp.tokens[0] == llm.tokenizer.token_bytes(int(best[0])).decode()
    assert lp.token_logprobs[0] == pytest.approx(logsoft[best[0]], abs=1e-4)
    top = lp.top_logprobs[0]
    for i in best:
        assert top[llm.tokenizer.token_bytes(int(i)).decode()] == pytest.approx(logsoft[i], abs=1e-4)


def test_completions_echo_several_prompts_and_stream(client):
    prompts = ["Once upon a time", "The weather today"]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0, echo=True)
    assert [c.index for c in r.choices] == [0, 1]
    for p, c in zip(prompts, r.choices):
        assert c.text.startswith(p) and len(c.text) > len(p)
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0) for p in prompts]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    streamed = {0: "", 1: ""}
    for ch in client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0, echo=True,
                                        stream=True):
        for c in ch.choices:
            streamed[c.index] += c.text
    assert [streamed[0], streamed[1]] == [c.text for c in r.choices]


def test_async_client(server):
    async def run():
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
        kw = dict(model=MODEL, messages=ask("Hi!"), max_tokens=12, seed=2)
        whole = await client.chat.completions.create(**kw)
        text = ""
        async for ch in await client.chat.completions.create(stream=True, **kw):
            text += ch.choices[0].delta.content or "" if ch.choices else ""
        comp = await client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, seed=2)
        await client.close()
        return whole.choices[0].message.content, text, comp.choices[0].text

    whole, streamed, comp = asyncio.run(run())
    assert whole and streamed == whole and comp


def test_models_tokenize_detokenize(client, server):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    status, _, tok = server.request("POST", "/tokenize", {"content": "Hello world"})
    assert status == 200 and len(tok["tokens"]) == 2
    status, _, text = server.request("POST", "/detokenize", {"tokens": tok["tokens"]})
    assert (status, text) == (200, {"content": "Hello world"})
    _, _, pieces = server.request("POST", "/tokenize", {"content": "Hello world", "with_pieces": True})
    assert [p["piece"] for p in pieces["tokens"]] == ["Hello", " world"]


def test_metrics(client, server):
    before = server.metrics()
    client.chat.completions.create(model=MODEL, messages=ask("Hi"), max_tokens=5, temperature=0)
    after = server.metrics()
    for gauge in ("queue_depth", "running_sequences", "kv_blocks_used", "kv_blocks_total"):
        assert f"edgellm_{gauge}" in after
    assert after["edgellm_completion_tokens_total"] > before.get("edgellm_completion_tokens_total", 0)
    assert after["edgellm_prompt_tokens_total"] > before.get("edgellm_prompt_tokens_total", 0)
    for hist in ("time_to_first_token_seconds", "request_latency_seconds"):
        assert after[f"edgellm_{hist}_count"] == before.get(f"edgellm_{hist}_count", 0) + 1
    key = 'edgellm_http_requests_total{route="/v1/chat/completions",status="200"}'
    assert after[key] == before.get(key, 0) + 1
    for phase in ("schedule", "batch", "decode", "sample", "emit"):  # where the engine steps' time went
        key = f'edgellm_engine_step_seconds_total{{phase="{phase}"}}'
        assert after[key] > before.get(key, 0)


def test_a_shared_system_prompt_comes_from_the_prefix_cache(client):
    system = {"role": "system", "content": "You are a patient teacher of geography. " * 12}
    kw = dict(model=MODEL, max_tokens=4, temperature=0)
    first = client.chat.completions.create(messages=[system, *ask("Where is Peru?")], **kw)
    second = client.chat.completions.create(messages=[system, *ask("Where is Chad?")], **kw)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0 and first.usage.prompt_tokens > 100
    # all of the shared part but the last partial KV block (16 tokens) and the differing question
    assert second.usage.prompt_tokens - 32 <= cached < second.usage.prompt_tokens


def test_32_concurrent_greedy_requests_each_as_alone(client):
    prompts = [f"Write one sentence about the number {i}." for i in range(32)]

    def run(p):
        return client.chat.completions.create(model=MODEL, messages=ask(p), max_tokens=16, temperature=0) \
            .choices[0].message.content

    alone = [run(p) for p in prompts]
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(run, prompts))
    assert together == alone


def test_streamed_equals_non_streamed_among_other_requests(client):
    kw = dict(model=MODEL, messages=ask("Describe a forest."), max_tokens=32, seed=9, temperature=0.8)
    whole = client.chat.completions.create(**kw).choices[0].message.content
    with ThreadPoolExecutor(8) as pool:
        others = [pool.submit(client.chat.completions.create, model=MODEL, messages=ask(f"Count to {i}."),
                              max_tokens=32, seed=i) for i in range(6)]
        streamed = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(stream=True, **kw)
                           if ch.choices)
        for f in others:
            f.result()
    assert streamed == whole
