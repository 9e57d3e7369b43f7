"""The Python API on tiny random models: loading, tokenize, logits, sessions, generation options,
chat, context limits and the errors users get."""

from __future__ import annotations

import os

import numpy as np
import pytest

import edgellm
from edgellm.errors import ContextOverflowError, GGUFError, ModelNotFoundError
from edgellm.quants import QType
from tiny_models import tiny_model, vocab


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("api") / "tiny-llama.gguf", "llama", QType.Q8_0)


@pytest.fixture(scope="module")
def llm(tiny_path):
    return edgellm.LLM(tiny_path, n_ctx=64, n_threads=2)


def test_load_and_describe(llm, tiny_path):
    assert llm.path == tiny_path
    assert llm.n_vocab == len(vocab()[0]) and llm.config.arch == "llama"
    assert llm.n_ctx == 64 and llm.n_threads == 2
    assert "llama" in repr(llm)


def test_default_threads_are_physical_cores(tiny_path):
    from edgellm.api import physical_cores

    assert edgellm.LLM(tiny_path, n_ctx=32).n_threads == physical_cores() >= 1


def test_tokenize_roundtrip(llm):
    ids = llm.tokenize("hello world")
    assert ids[0] == 1  # the tiny vocabulary asks for BOS
    assert len(ids) == 3  # "▁hello", "▁world"
    assert llm.tokenize("hello world", add_bos=False) == ids[1:]
    assert llm.detokenize(ids) == "hello world"


def test_logits_shapes(llm):
    ids = llm.tokenize("the cat sat on the mat")
    full = llm.logits(ids)
    last = llm.logits(ids, last_only=True)
    assert full.shape == (len(ids), llm.n_vocab) and full.dtype == np.float32
    np.testing.assert_array_equal(last, full[-1])


def test_session_feed_reset(llm):
    s = llm.session()
    ids = llm.tokenize("the cat sat")
    a = s.feed(ids[:2])
    b = s.feed(ids[2:])
    assert len(s) == len(ids) and a.shape == (llm.n_vocab,)
    np.testing.assert_allclose(b, llm.logits(ids, last_only=True), rtol=0, atol=1e-4)
    s.reset()
    assert len(s) == 0
    with pytest.raises(ContextOverflowError):
        s.feed([5] * 65)
    assert len(s) == 0
    with pytest.raises(ValueError):
        s.feed([10**6])


def test_generate_greedy_is_deterministic(llm):
    a = llm.generate("the cat", max_tokens=10, temperature=0)
    b = llm.generate("the cat", max_tokens=10, temperature=0)
    assert a == b and llm.last_stats.generated_tokens <= 10


def test_generate_same_seed_same_text(llm):
    a = llm.generate("the dog", max_tokens=12, temperature=1.0, seed=5)
    b = llm.generate("the dog", max_tokens=12, temperature=1.0, seed=5)
    c = llm.generate("the dog", max_tokens=12, temperature=1.0, seed=6)
    assert a == b
    assert llm.last_stats.generated_tokens > 0
    assert isinstance(c, str)


def test_generate_stream_yields_pieces(llm):
    it = llm.generate("hello", max_tokens=8, temperature=0, stream=True)
    pieces = list(it)
    assert all(isinstance(p, str) for p in pieces)
    assert "".join(pieces) == llm.generate("hello", max_tokens=8, temperature=0)


def test_generate_token_ids_prompt(llm):
    ids = llm.tokenize("the mat")
    assert llm.generate(ids, max_tokens=6, temperature=0) == llm.generate("the mat", max_tokens=6, temperature=0)


def test_interrupt_during_the_prompt_stops_at_the_next_step(tiny_path, monkeypatch):
    """Ctrl-C in a long prompt: the prompt goes in steps of n_batch tokens and the interrupt lands at
    the end of the step it hit, so no later step runs; the stats count the tokens evaluated (the
    CLI printed the whole prompt's length and 0.0 tok/s), and the LLM works afterwards."""
    from edgellm import batch

    llm = edgellm.LLM(tiny_path, n_ctx=64, n_threads=1, n_batch=8)
    ids = llm.tokenize("the cat sat on the mat " * 6)[:30]
    steps, run = [], batch.Step.run

    def interrupted_second_step(self, *a, **kw):
        steps.append(self.n_tokens)
        if len(steps) == 2:
            raise KeyboardInterrupt  # as SIGINT surfaces when the engine call returns
        return run(self, *a, **kw)

    monkeypatch.setattr(batch.Step, "run", interrupted_second_step)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(ids, max_tokens=4, temperature=0)
    assert steps == [8, 8]
    s = llm.last_stats
    assert (s.stop_reason, s.prompt_tokens, s.generated_tokens) == ("interrupted", 8, 0)
    monkeypatch.undo()
    want = edgellm.LLM(tiny_path, n_ctx=64, n_threads=1, n_batch=8).generate(ids, max_tokens=4, temperature=0)
    assert llm.generate(ids, max_tokens=4, temperature=0) == want


def test_closing_a_stream_counts_as_interrupted(llm):
    stream = llm.generate("the cat", max_tokens=20, temperature=0, stream=True)
    next(stream)
    stream.close()
    s = llm.last_stats
    assert s.stop_reason == "interrupted" and s.generated_tokens >= 1 and s.prompt_tokens > 0


def test_stop_strings(llm):
    full = llm.generate("the", max_tokens=20, temperature=0)
    if len(full) > 3:
        stop = full[2:4]
        cut = llm.generate("the", max_tokens=20, temperature=0, stop=[stop])
        assert cut == full[:full.index(stop)]
        assert llm.last_stats.stop_reason == "stop"


def test_long_generation_shifts_context(llm):
    """Generating past n_ctx slides the window instead of failing."""
    out = llm.generate("the cat", max_tokens=150, temperature=0.8, seed=1, top_k=0, top_p=1.0, min_p=0.0)
    assert llm.last_stats.generated_tokens == 150
    assert isinstance(out, str)


def test_prompt_longer_than_context(llm):
    with pytest.raises(ContextOverflowError):
        llm.generate([5] * 65, max_tokens=1)
    # the model is still usable afterwards
    assert isinstance(llm.generate("the", max_tokens=2, temperature=0), str)


def test_chat(llm):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    text = llm.chat(msgs, max_tokens=8, temperature=0)
    assert isinstance(text, str)
    pieces = list(llm.chat(msgs, max_tokens=8, temperature=0, stream=True))
    assert "".join(pieces) == text


def test_unknown_sampling_option(llm):
    with pytest.raises(TypeError):
        llm.chat([{"role": "user", "content": "hi"}], tempreature=0)
    with pytest.raises(ValueError):
        llm.generate("x", max_tokens=1, temperature=-1)


def test_missing_and_corrupt_files(tmp_path, tiny_path):
    with pytest.raises(ModelNotFoundError):
        edgellm.LLM(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFoundError):
        edgellm.LLM("no-such-alias")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    with pytest.raises(GGUFError):
        edgellm.LLM(bad)
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(tiny_path.read_bytes()[: tiny_path.stat().st_size // 2])
    with pytest.raises(GGUFError):
        edgellm.LLM(trunc)


def test_bad_constructor_arguments(tiny_path):
    with pytest.raises(ValueError):
        edgellm.LLM(tiny_path, n_threads=0)
    with pytest.raises(TypeError):
        edgellm.LLM(tiny_path, n_gpu_layers=3)
