"""`edgellm serve` under real use: a client that leaves frees its sequence at once, a full queue
answers 429 with Retry-After, SIGTERM drains running streams (and cuts them after the grace
period with an error they can read), the server binds localhost and says how to call it.

A request that must stay running while the test looks at it generates up to the whole context
with the end-of-generation tokens banned (logit_bias): thousands of tokens, many seconds, while
each check takes a fraction of one; the finish reasons counted in /metrics tell a cancelled
sequence from one that ran to its end."""

from __future__ import annotations

import http.client
import json
import signal
import socket

import pytest

from server_process import ServerProcess, open_stream, sse_events, wait_for

pytestmark = pytest.mark.real

MODEL = "smollm2-135m-instruct"
N_CTX = 4096
CANCELLED = 'edgellm_sequences_finished_total{reason="cancelled"}'


@pytest.fixture(scope="module")
def eog_bias(smollm2_path):
    from edgellm import LLM

    llm = LLM(smollm2_path, n_ctx=64, n_threads=1)
    return {str(t): -100 for t in sorted(llm.tokenizer.eog_ids)}


@pytest.fixture(scope="module")
def server(smollm2_path):
    """One sequence at a time and room for one waiting request."""
    srv = ServerProcess(MODEL, "-c", str(N_CTX), "--parallel", "1", "--max-queue", "1", "-t", "1")
    yield srv
    assert srv.stop() == 0


def endless(eog_bias, **kw) -> dict:
    """A completion that runs to the end of the context unless cancelled."""
    return {"model": MODEL, "prompt": "Once upon a time", "max_tokens": N_CTX - 16, "temperature": 0,
            "logit_bias": eog_bias, **kw}


def read_text(events, n: int) -> str:
    """Read events until n of them carried text."""
    text, seen = "", 0
    for ev in events:
        assert ev != "[DONE]" and "error" not in ev, ev
        piece = ev["choices"][0]["text"]
        if piece:
            text += piece
            seen += 1
            if seen == n:
                return text
    raise AssertionError("the stream ended early")


def idle(server) -> bool:
    m = server.metrics()
    return m["edgellm_running_sequences"] == 0 and m["edgellm_queue_depth"] == 0 and m["edgellm_kv_blocks_used"] == 0


def test_disconnect_mid_stream_frees_the_sequence(server, eog_bias):
    wait_for(lambda: idle(server), 60)
    before = server.metrics()
    conn, resp = open_stream(server, "/v1/completions", endless(eog_bias, stream=True))
    assert resp.status == 200
    read_text(sse_events(resp), 3)
    during = server.metrics()
    assert during["edgellm_running_sequences"] == 1 and during["edgellm_kv_blocks_used"] > 0
    conn.close()
    wait_for(lambda: idle(server), 30)
    after = server.metrics()
    assert after.get(CANCELLED, 0) == before.get(CANCELLED, 0) + 1
    generated = after["edgellm_completion_tokens_total"] - before.get("edgellm_completion_tokens_total", 0)
    assert 3 <= generated < N_CTX // 2  # stopped long before its end


def test_disconnect_before_a_non_streamed_answer_frees_the_sequence(server, eog_bias):
    wait_for(lambda: idle(server), 60)
    before = server.metrics()
    conn = server.connection()
    conn.request("POST", "/v1/completions", body=json.dumps(endless(eog_bias)).encode(),
                 headers={"Content-Type": "application/json"})
    wait_for(lambda: server.metrics()["edgellm_kv_blocks_used"] > 0, 60)
    conn.close()
    wait_for(lambda: idle(server), 30)
    assert server.metrics().get(CANCELLED, 0) == before.get(CANCELLED, 0) + 1


def test_full_queue_answers_429_with_retry_after(server, eog_bias):
    wait_for(lambda: idle(server), 60)
    running_conn, running = open_stream(server, "/v1/completions", endless(eog_bias, stream=True))
    read_text(sse_events(running), 1)
    waiting_conn, waiting = open_stream(server, "/v1/completions", endless(eog_bias, stream=True))
    assert waiting.status == 200
    wait_for(lambda: server.metrics()["edgellm_queue_depth"] == 1, 30)
    try:
        for stream in (False, True):
            status, headers, payload = server.request("POST", "/v1/completions",
                                                      endless(eog_bias, max_tokens=4, stream=stream))
            assert status == 429, payload
            assert int(headers["retry-after"]) >= 1
            assert payload["error"]["code"] == "queue_full"
        assert server.request("GET", "/health")[0] == 200
    finally:
        running_conn.close()
        waiting_conn.close()
    wait_for(lambda: idle(server), 30)
    status, _, payload = server.request("POST", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert status == 200 and payload["choices"][0]["finish_reason"] == "length"


def test_a_client_that_does_not_read_does_not_hold_up_the_engine(server, eog_bias):
    """The engine finishes a stream whose client reads nothing (its socket buffer small and full);
    the client then gets every token."""
    wait_for(lambda: idle(server), 60)
    before = server.metrics()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((server.host, server.port))
    conn = server.connection()
    conn.sock = sock
    n = 300
    conn.request("POST", "/v1/completions", body=json.dumps(endless(eog_bias, max_tokens=n, logprobs=5, stream=True,
                                                                    stream_options={"include_usage": True})).encode(),
                 headers={"Content-Type": "application/json"})
    length = 'edgellm_sequences_finished_total{reason="length"}'
    wait_for(lambda: server.metrics().get(length, 0) == before.get(length, 0) + 1, 120)
    events = list(sse_events(conn.getresponse()))
    conn.close()
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == n
    assert sum(len(e["choices"][0]["logprobs"]["tokens"]) for e in events[:-2] if e["choices"] and
               e["choices"][0]["logprobs"]) == n


def test_binds_localhost_and_prints_how_to_call_it(server):
    assert server.url.startswith("http://127.0.0.1:")
    out = "".join(server.stdout)
    assert f"curl {server.url}/v1/chat/completions" in out and '"model": "smollm2-135m-instruct"' in out


def _after_sigterm_refused_or_503(srv: ServerProcess) -> None:
    try:
        status, headers, _ = srv.request("POST", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    except (ConnectionError, http.client.HTTPException, OSError):
        return  # the listening socket is closed
    assert status == 503 and "retry-after" in headers


def test_sigterm_lets_running_streams_finish(smollm2_path, eog_bias):
    srv = ServerProcess(MODEL, "-c", "1024", "--parallel", "2", "-t", "1", "--grace", "120")
    try:
        conn, resp = open_stream(srv, "/v1/completions",
                                 endless(eog_bias, max_tokens=300, stream=True, stream_options={"include_usage": True}))
        events = sse_events(resp)
        read_text(events, 1)
        srv.signal(signal.SIGTERM)
        _after_sigterm_refused_or_503(srv)
        rest = list(events)
        assert rest[-1] == "[DONE]"
        assert [e["choices"][0]["finish_reason"] for e in rest[:-2] if e["choices"][0]["finish_reason"]] == ["length"]
        assert rest[-2]["usage"]["completion_tokens"] == 300
        assert srv.wait(60) == 0
        assert "stopping; 1 running" in "".join(srv.stderr)
    finally:
        srv.kill()


def test_sigterm_cuts_streams_after_the_grace_period(smollm2_path, eog_bias):
    srv = ServerProcess(MODEL, "-c", str(N_CTX), "--parallel", "2", "-t", "1", "--grace", "1")
    try:
        conn, resp = open_stream(srv, "/v1/completions", endless(eog_bias, stream=True))
        events = sse_events(resp)
        read_text(events, 1)
        srv.signal(signal.SIGTERM)
        rest = list(events)
        assert "[DONE]" not in rest
        assert rest[-1]["error"]["code"] == "shutting_down"
        assert srv.wait(60) == 0
    finally:
        srv.kill()
