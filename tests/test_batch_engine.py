"""The batched engine (BatchEngine over the paged KV cache): batch invariance on every engine
path, prefix sharing and forks, a pool smaller than the work, cancellation, a randomized run of
submit / step / cancel / fork that must leak no block, threads, and the thread pool under
oversubscription."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import edgellm
from edgellm.kv_cache import BLOCK
from edgellm.quants import QType
from edgellm.sampling import SamplingParams
from edgellm.scheduler import BatchEngine
from tiny_models import tiny_model

from conftest import engine_paths, use_engine_path

BACKENDS = engine_paths()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("batch")


_paths: dict = {}


def model_path(model_dir, arch, qtype, **kw):
    key = (arch, qtype, tuple(sorted(kw.items())))
    if key not in _paths:
        _paths[key] = tiny_model(model_dir / f"{arch}-{qtype.name}-{len(_paths)}.gguf", arch, qtype, **kw)
    return _paths[key]


def prompts(n, seed=0, lo=1, hi=40, vocab=(3, 300)):
    rng = random.Random(seed)
    return [[1] + [rng.randrange(*vocab) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def run(llm, ps, *, params, max_tokens=8, **kw):
    """Tokens generated for each prompt, all submitted to one BatchEngine."""
    eng = BatchEngine(llm, **kw)
    reqs = [eng.submit(p, max_tokens=max_tokens, sampling=sp) for p, sp in zip(ps, params)]
    eng.run_until_done(reqs)
    for r in reqs:
        assert r.error is None, r.error
    return [r.generated for r in reqs], eng


GREEDY = SamplingParams(temperature=0)


def seeded(i):
    return SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=1000 + i)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch,qtype", [("llama", QType.Q4_K), ("gemma3", QType.Q6_K), ("llama", QType.Q4_0)],
                         ids=["llama-Q4_K", "gemma3-Q6_K", "llama-Q4_0"])
def test_batch_invariance(model_dir, monkeypatch, backend, arch, qtype):
    """32 prompts of different lengths, greedy and seeded sampling, generated together equal each
    generated alone, token for token. Q4_K and Q6_K are the types whose llama.cpp kernels change
    with the batch size; gemma3's sliding-window layers (window 8) see their window only."""
    use_engine_path(monkeypatch, backend)
    llm = edgellm.LLM(model_path(model_dir, arch, qtype), n_ctx=96, n_batch=64, n_threads=2)
    ps = prompts(32, seed=hash((arch, qtype.name)) % 1000)
    params = [GREEDY if i % 2 else seeded(i) for i in range(32)]
    # together, the steps' logits are made and sampled 5 rows at a time (as a large vocabulary's are)
    monkeypatch.setattr(edgellm.batch, "LOGITS_GROUP_BYTES", 5 * 4 * llm.n_vocab)
    together, eng = run(llm, ps, params=params, max_seqs=32, kv_tokens=32 * 96)
    assert eng._logits_rows == 5
    assert eng.steps < 32 * 8  # they really shared steps
    alone = [run(llm, [p], params=[sp], max_seqs=1, prefix_cache=False)[0][0] for p, sp in zip(ps, params)]
    assert together == alone
    assert llm._pool.blocks_in_use() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunking_does_not_change_results(model_dir, monkeypatch, backend):
    """The same prompts with a budget of 3 tokens a step (prompts split mid-block, sharing steps
    with other sequences' decodes) and of 64: the same tokens."""
    use_engine_path(monkeypatch, backend)
    llm = edgellm.LLM(model_path(model_dir, "gemma3", QType.Q4_K), n_ctx=96, n_batch=64, n_threads=2)
    ps = prompts(6, seed=5, lo=10, hi=40)
    params = [GREEDY] * 6
    small, _ = run(llm, ps, params=params, step_tokens=3, prefix_cache=False)
    big, _ = run(llm, ps, params=params, step_tokens=64, prefix_cache=False)
    assert small == big


def test_batched_logits_equal_alone_exactly(model_dir, monkeypatch):
    """Below the sampler: the logits of a row are the same bits alone and in a step with other
    sequences (the property the token-level tests rest on)."""
    from edgellm.batch import LOGITS_ALL, Step

    use_engine_path(monkeypatch, BACKENDS[-2] if len(BACKENDS) > 1 else BACKENDS[0])
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q4_K), n_ctx=96, n_batch=64, n_threads=2)
    pool, eng = llm._pool, llm._engine
    ps = prompts(4, seed=9, lo=5, hi=15)  # 4 x <= 15 tokens: one step of n_batch 64

    def logits(group):
        seqs = [pool.new_sequence() for _ in group]
        step = Step()
        for s, p in zip(seqs, group):
            pool.reserve(s, len(p))
            step.add(s, p, LOGITS_ALL)
        out = [np.array(x) for x in step.run(eng, pool)]
        for s in seqs:
            pool.release(s)
        return out

    together = logits(ps)
    for p, t in zip(ps, together):
        np.testing.assert_array_equal(logits([p])[0], t)


@pytest.mark.parametrize("path", [b for b in BACKENDS if b != "numba"])
@pytest.mark.parametrize("arch,qtype,n_ff", [("llama", QType.Q4_K, 512), ("gemma3", QType.Q8_0, 96),
                                             ("llama", QType.Q4_0, 160)])
def test_ffn_in_row_chunks_equals_the_whole_step(model_dir, monkeypatch, path, arch, qtype, n_ff):
    """A long batch-order step runs its FFN a chunk of rows at a time (el_engine_set_ffn_chunk):
    every row's logits are the bits of the step made whole, for chunks that split sequences
    anywhere (1 row, 5, 64, 256 - the default -, and more than the step)."""
    from edgellm.batch import LOGITS_ALL, Step

    use_engine_path(monkeypatch, path)
    llm = edgellm.LLM(model_path(model_dir, arch, qtype, n_ff=n_ff), n_ctx=128, n_batch=128, n_threads=2)
    pool, eng = llm._pool, llm._engine
    ps = prompts(5, seed=21, lo=14, hi=30)  # 5 prompts, one step of 70-150 rows, every row's logits

    def logits(chunk):
        eng.set_ffn_chunk(chunk)
        seqs = [pool.new_sequence() for _ in ps]
        st = Step()
        for s, p in zip(seqs, ps):
            pool.reserve(s, len(p))
            st.add(s, p, LOGITS_ALL)
        out = np.concatenate([np.array(x) for x in st.run(eng, pool)])
        for s in seqs:
            pool.release(s)
        return out

    whole = logits(0)
    assert len(whole) == sum(map(len, ps)) > 64
    for chunk in (1, 5, 64, 256, 1000):
        np.testing.assert_array_equal(logits(chunk), whole, err_msg=f"chunk {chunk}")


def test_logits_in_the_step_scratch_equal_a_buffer_of_their_own(model_dir, monkeypatch):
    """The C engine's logits buffer is its step scratch (el_engine_set_scratch): logits made there,
    step after step and in a grown buffer, are the bits of logits made into the caller's array;
    the engine refuses scratch memory too small or unaligned."""
    from edgellm.batch import LOGITS_ALL, Step

    use_engine_path(monkeypatch, BACKENDS[0])
    if BACKENDS[0] == "numba":
        pytest.skip("the C engine's buffers")
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q4_K), n_ctx=128, n_batch=128, n_threads=2)
    pool, eng = llm._pool, llm._engine
    need = eng.lib.el_engine_scratch_bytes(eng._eng)
    assert eng._out.nbytes <= eng._scratch.nbytes and eng._scratch.nbytes >= need
    ps = prompts(6, seed=3, lo=2, hi=12)
    for grow in (False, True):  # the engine's buffer, then a larger one that replaces it
        if grow:
            eng._out = eng._new_out(2 * len(eng._out))
        got = []
        for out in (None, np.empty((100, llm.n_vocab), np.float32), None):
            seqs = [pool.new_sequence() for _ in ps]
            st = Step()
            for s, p in zip(seqs, ps):
                pool.reserve(s, len(p))
                st.add(s, p, LOGITS_ALL)
            got.append(np.concatenate([np.array(x) for x in st.run(eng, pool, out=out)]))
            for s in seqs:
                pool.release(s)
        np.testing.assert_array_equal(got[0], got[1])
        np.testing.assert_array_equal(got[2], got[1])
    raw = np.empty(need + 64, np.uint8)
    aligned = raw[-raw.ctypes.data % 64:]
    for buf, n in ((aligned, need - 64), (aligned[1:], need)):
        assert eng.lib.el_engine_set_scratch(eng._eng, eng.ffi.from_buffer(buf), n) == -2
    assert "step scratch" in eng.ffi.string(eng.lib.el_last_error()).decode()


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_in_groups_equal_the_whole_step(model_dir, monkeypatch, backend):
    """Step.run_in_groups makes the same bits as Step.run, whatever the groups (entries with all,
    last and no logits rows; an entry with more rows than a group); the engine refuses logits
    rows it has not got."""
    from edgellm.batch import LOGITS_ALL, LOGITS_LAST, LOGITS_NONE, Step
    from edgellm.errors import EdgeLLMError

    use_engine_path(monkeypatch, backend)
    llm = edgellm.LLM(model_path(model_dir, "gemma3", QType.Q4_K), n_ctx=96, n_batch=64, n_threads=2)
    pool, eng = llm._pool, llm._engine
    ps = prompts(6, seed=11, lo=2, hi=9)
    kinds = [LOGITS_LAST, LOGITS_ALL, LOGITS_NONE, LOGITS_LAST, LOGITS_LAST, LOGITS_ALL]

    def step():
        seqs = [pool.new_sequence() for _ in ps]
        st = Step()
        for s, p, k in zip(seqs, ps, kinds):
            pool.reserve(s, len(p))
            st.add(s, p, k)
        return st, seqs

    st, seqs = step()
    whole = [None if x is None else np.array(x) for x in st.run(eng, pool)]
    for s in seqs:
        pool.release(s)
    for max_rows in (1, 2, 3, 100):
        st, seqs = step()
        got = []
        for first, x, results, rs in st.run_in_groups(eng, pool, max_rows):
            assert first == len(got)
            assert x is None or len(x) <= max(max_rows, max(len(p) for p in ps))
            for r, o in zip(results, rs):  # each entry's rows are its rows of the group's logits
                assert (r is None) == (o is None)
                if r is not None:
                    np.testing.assert_array_equal(r, x[o:o + (len(r) if r.ndim == 2 else 1)].reshape(r.shape))
            got += [None if r is None else np.array(r) for r in results]
        for w, g, k in zip(whole, got, kinds):
            if k == LOGITS_NONE:
                assert g is None
            else:
                np.testing.assert_array_equal(g, w)
        for s in seqs:
            pool.release(s)
    eng.logits(0, 1)  # the last step's rows can be made again until the next step
    for row0, n in ((0, 10 ** 6), (-1, 1), (0, 0)):
        with pytest.raises(EdgeLLMError, match="not within"):
            eng.logits(row0, n)
    st, seqs = step()
    st.run(eng, pool)  # a step that made its logits leaves none waiting
    with pytest.raises(EdgeLLMError, match="no step"):
        eng.logits(0, 1)
    for s in seqs:
        pool.release(s)
    seq, p = pool.new_sequence(), ps[1]  # a llama_order step makes its rows in one piece
    pool.reserve(seq, len(p))
    st = Step()
    st.add(seq, p, LOGITS_ALL)
    eng.decode(st.n_tokens, 1, st._pack(eng), llama_order=True, defer=True)
    with pytest.raises(EdgeLLMError, match="all at once"):
        eng.logits(0, 1)
    assert eng.logits(0, len(p)).shape == (len(p), llm.n_vocab)
    pool.release(seq)


@pytest.mark.parametrize("backend", [BACKENDS[-2] if len(BACKENDS) > 1 else BACKENDS[0], "numba"])
def test_prefix_cache_and_forks_give_the_same_tokens(model_dir, monkeypatch, backend):
    use_engine_path(monkeypatch, backend)
    llm = edgellm.LLM(model_path(model_dir, "gemma3", QType.Q8_0, n_swa=16), n_ctx=160, n_batch=64, n_threads=2)
    system = prompts(1, seed=3, lo=70, hi=71)[0]
    ps = [system + p[1:] for p in prompts(6, seed=4, lo=2, hi=12)]
    params = [seeded(i) for i in range(6)]
    cold = [run(llm, [p], params=[sp], prefix_cache=False)[0][0] for p, sp in zip(ps, params)]
    warm, eng = run(llm, ps, params=params, max_seqs=2, prefix_cache=True)
    assert warm == cold
    assert eng.stats()["prompt_tokens_cached"] >= 4 * (len(system) // BLOCK) * BLOCK
    # n = 3 completions of one prompt: forked after one evaluation, each as if submitted alone
    eng = BatchEngine(llm, max_seqs=4)
    group = eng.submit(ps[0], max_tokens=8, sampling=seeded(7), n=3)
    eng.run_until_done(group)
    single = [run(llm, [ps[0]], params=[seeded(7 + i)], prefix_cache=False)[0][0] for i in range(3)]
    assert [r.generated for r in group] == single
    assert llm._pool.cow_copies > 0  # the forks shared the prompt's partial block until they wrote
    assert llm._pool.blocks_in_use() == 0


def test_logit_bias_on_forks_and_among_others_gives_the_tokens_alone(model_dir, monkeypatch):
    """logit_bias is added to a row of the step's logits in place, except on the row n > 1
    forks share (sampled by each sibling, then the leader): each fork and each request among
    others gets what it gets alone with the same bias."""
    use_engine_path(monkeypatch, BACKENDS[-2] if len(BACKENDS) > 1 else BACKENDS[0])
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q8_0), n_ctx=96, n_batch=32, n_threads=2)
    ps = prompts(4, seed=31)
    bias = {t: 40.0 for t in range(40, 60)} | {t: -100.0 for t in range(3, 20)}

    def hot(i):  # the tiny model's logits spread over ~100: a high temperature lets the bias show
        return SamplingParams(temperature=20.0, top_k=0, top_p=1.0, min_p=0.0, seed=i)

    def alone(p, sp):
        eng = BatchEngine(llm, prefix_cache=False)
        req = eng.submit(p, max_tokens=8, sampling=sp, logit_bias=bias)
        eng.run_until_done([req])
        return req.generated

    eng = BatchEngine(llm, max_seqs=8)
    group = eng.submit(ps[0], max_tokens=8, sampling=hot(3), n=3, logit_bias=bias)
    others = [eng.submit(p, max_tokens=8, sampling=hot(10 + i), logit_bias=bias) for i, p in enumerate(ps[1:])]
    eng.run_until_done(group + others)
    assert [r.generated for r in group] == [alone(ps[0], hot(3 + i)) for i in range(3)]
    assert [r.generated for r in others] == [alone(p, hot(10 + i)) for i, p in enumerate(ps[1:])]
    picked = [t for r in group + others for t in r.generated]
    assert sum(40 <= t < 60 for t in picked) > len(picked) // 4 and not any(3 <= t < 20 for t in picked)


def test_step_listeners_and_phase_times(model_dir, monkeypatch):
    """Events of a step are emitted inside it (in_step) and step listeners run after each step,
    on the stepping thread; the phases' times add up to the steps' wall time."""
    use_engine_path(monkeypatch, BACKENDS[-2] if len(BACKENDS) > 1 else BACKENDS[0])
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q8_0), n_ctx=96, n_batch=32, n_threads=2)
    eng = BatchEngine(llm, max_seqs=4)
    log = []
    eng.add_step_listener(lambda: log.append(("step", eng.in_step())))
    reqs = [eng.submit(p, max_tokens=4, sampling=GREEDY, on_event=lambda r, ev: log.append(("ev", eng.in_step())))
            for p in prompts(3, seed=41)]
    assert not eng.in_step()
    t = time.perf_counter_ns()
    eng.run_until_done(reqs)
    wall = time.perf_counter_ns() - t
    assert ("ev", False) not in log and ("step", True) not in log
    assert log.count(("step", False)) == eng.steps and log[-1] == ("step", False)
    assert sum(1 for k, _ in log if k == "ev") >= 3 * (4 + 1)  # 4 tokens and the end of each
    ph = eng.stats()["step_seconds"]
    assert set(ph) == {"schedule", "batch", "decode", "sample", "emit"}
    assert min(ph.values()) > 0
    assert 0.5 * wall < 1e9 * sum(ph.values()) <= wall


def test_events_go_to_on_event_or_the_queue_not_both(model_dir, monkeypatch):
    """A request with an on_event callback hands each event to it and queues none for iteration
    (a server's requests would otherwise hold every token's event until they are freed); without
    one, iterating gives the same events."""
    use_engine_path(monkeypatch, BACKENDS[0])
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q8_0), n_ctx=96, n_batch=32, n_threads=1)
    eng = BatchEngine(llm, max_seqs=2)
    p = prompts(1, seed=43)[0]
    seen = []
    called = eng.submit(p, max_tokens=5, sampling=GREEDY, on_event=lambda r, ev: seen.append(ev))
    queued = eng.submit(p, max_tokens=5, sampling=GREEDY)
    eng.run_until_done([called, queued])
    assert list(called) == [] and called.result() == queued.text
    events = list(queued)
    assert list(queued) == [] and queued.result() == queued.text  # iterated once, a request stays done
    assert [e for e in seen if e is not None] == events and seen[-1] is None
    assert [e.token for e in events if e.token is not None] == queued.generated


def test_requests_sharing_a_prompt_sent_together_evaluate_it_once(model_dir, monkeypatch):
    """Six requests with one 70-token system prompt, two of them the very same prompt, all
    submitted before the first step (as many clients at once), with a 32-token step budget so
    the first takes three steps over it: the others wait for its blocks and take them from the
    index (without waiting, all six evaluated it at once and nothing was shared); each gives
    the tokens it gives alone."""
    use_engine_path(monkeypatch, BACKENDS[-2] if len(BACKENDS) > 1 else BACKENDS[0])
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q8_0), n_ctx=160, n_batch=32, n_threads=2)
    system = prompts(1, seed=5, lo=70, hi=71)[0]
    ps = [system + p[1:] for p in prompts(5, seed=6, lo=2, hi=12)]
    ps.append(list(ps[0]))
    params = [seeded(i) for i in range(6)]
    alone = [run(llm, [p], params=[sp], prefix_cache=False)[0][0] for p, sp in zip(ps, params)]
    together, eng = run(llm, ps, params=params, max_seqs=6, kv_tokens=6 * 160)  # room for all: no preemption
    assert together == alone
    assert eng.preemptions == 0
    shared = (len(system) // BLOCK) * BLOCK
    assert eng.stats()["prompt_tokens_cached"] >= 5 * shared, eng.stats()
    assert llm._pool.blocks_in_use() == 0


@pytest.mark.parametrize("backend", [BACKENDS[-2] if len(BACKENDS) > 1 else BACKENDS[0], "numba"])
def test_more_sequences_than_the_pool_holds(model_dir, monkeypatch, backend):
    """A pool of 96 tokens for 10 requests needing ~40 each: admission waits, running requests
    are preempted and recomputed; every one finishes with the tokens it gets alone, and the
    pool never holds more than its limit."""
    use_engine_path(monkeypatch, backend)
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q4_K), n_ctx=96, n_batch=32, n_threads=2)
    ps = prompts(10, seed=11, lo=20, hi=30)
    params = [GREEDY if i % 3 else seeded(i) for i in range(10)]
    eng = BatchEngine(llm, max_seqs=8, kv_tokens=96, prefix_cache=False)
    reqs = [eng.submit(p, max_tokens=16, sampling=sp) for p, sp in zip(ps, params)]
    peak = 0
    while not all(r.done for r in reqs):
        assert eng.step()
        peak = max(peak, llm._pool.blocks_in_use())
        llm._pool.check()
    assert peak <= 96 // BLOCK
    assert eng.preemptions > 0
    assert all(r.finish_reason == "length" for r in reqs), [r.finish_reason for r in reqs]
    alone = [run(llm, [p], params=[sp], max_tokens=16, prefix_cache=False)[0][0] for p, sp in zip(ps, params)]
    assert [r.generated for r in reqs] == alone


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.parametrize("backend", [BACKENDS[-2] if len(BACKENDS) > 1 else BACKENDS[0], "numba"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_kv_memory_claimed_at_startup(model_dir, monkeypatch, backend, arch):
    """claim_kv (the server's startup) makes the whole KV budget resident at once, so nothing
    grows later while the prefix cache fills; the tokens are those of a lazily grown pool; and
    a budget beyond the memory available is refused before anything is taken."""
    use_engine_path(monkeypatch, backend)
    llm = edgellm.LLM(model_path(model_dir, arch, QType.Q8_0), n_ctx=128, n_batch=32, n_threads=2)
    ps = prompts(6, seed=5, lo=20, hi=60)
    lazy = run(llm, ps, params=[GREEDY] * 6, max_tokens=12, max_seqs=4, kv_tokens=40_000)[0]
    llm.close()
    llm = edgellm.LLM(model_path(model_dir, arch, QType.Q8_0), n_ctx=128, n_batch=32, n_threads=2)
    eng = BatchEngine(llm, max_seqs=4, kv_tokens=40_000)
    pool = llm._pool
    monkeypatch.setattr("edgellm.scheduler.mem_available", lambda: 4096)
    with pytest.raises(edgellm.errors.EdgeLLMError, match=r"needs \d+ MiB and 0 MiB of memory is available"):
        eng.claim_kv()
    assert pool.groups[0].size < 40_000 // BLOCK  # nothing taken
    monkeypatch.undo()
    use_engine_path(monkeypatch, backend)
    before = _rss_bytes()
    need = eng.claim_kv()
    if backend != "numba":  # the C engine maps fresh pages: the claim must make them resident. The
        # numba engine's arrays are written as they grow (np.concatenate), into memory the
        # allocator may have had resident already, so RSS says nothing there.
        assert _rss_bytes() - before >= 0.9 * need
    claimed = [grp.size for grp in pool.groups]
    assert claimed[0] >= 40_000 // BLOCK
    if arch == "gemma3":
        assert claimed[1] >= 4 * 2  # the windows of 4 sequences
    reqs = [eng.submit(p, max_tokens=12, sampling=GREEDY) for p in ps]
    eng.run_until_done(reqs)
    assert [r.generated for r in reqs] == lazy
    assert [grp.size for grp in pool.groups] == claimed  # nothing grew
    pool.check()


def test_a_finished_request_is_freed_without_the_cycle_collector(model_dir):
    """The server's Submission holds its requests and is their on_event callback's owner: once a
    request has finished, that must not be a cycle, or every finished request (its sampler, its
    history) stays in memory until a full garbage collection (a soak's heap grew ~6 MiB a
    minute)."""
    import gc
    import weakref

    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q4_0), n_ctx=96, n_batch=32, n_threads=2)
    eng = BatchEngine(llm, max_seqs=4)

    class Owner:  # as server.bridge.Submission
        def __init__(self):
            self.requests = []
            self.events = 0

        def on_event(self, req, event):
            self.events += 1

    gc.collect()
    gc.disable()
    try:
        owner = Owner()
        owner.requests = [eng.submit(p, max_tokens=6, sampling=GREEDY, on_event=owner.on_event)
                          for p in prompts(3, seed=4)]
        owner.requests += eng.submit(prompts(1, seed=5)[0], max_tokens=6, n=2, sampling=seeded(1),
                                     on_event=owner.on_event)  # siblings of a fork name each other
        eng.run_until_done(owner.requests)
        assert owner.events >= 5 * 7  # six tokens and the end, each
        alive = [weakref.ref(r) for r in owner.requests] + [weakref.ref(owner)]
        del owner
        assert [w() for w in alive] == [None] * 6
    finally:
        gc.enable()


def test_cancel_returns_the_blocks(model_dir, monkeypatch):
    use_engine_path(monkeypatch, BACKENDS[-2] if len(BACKENDS) > 1 else BACKENDS[0])
    llm = edgellm.LLM(model_path(model_dir, "gemma3", QType.Q8_0), n_ctx=128, n_batch=32, n_threads=2)
    eng = BatchEngine(llm, max_seqs=4)
    keep = eng.submit(prompts(1, seed=1)[0], max_tokens=None, sampling=GREEDY)
    for _ in range(3):
        eng.step()
    before = [llm._pool.blocks_in_use(g) for g in (0, 1)]
    doomed = [eng.submit(p, max_tokens=None, sampling=seeded(i)) for i, p in enumerate(prompts(3, seed=2))]
    for _ in range(4):
        eng.step()
    assert llm._pool.blocks_in_use() > before[0]
    for r in doomed:
        r.cancel()
    eng.step()
    assert all(r.finish_reason == "cancelled" for r in doomed)
    assert eng.stats()["running"] == 1
    # the survivor grew by at most a block in those steps
    assert llm._pool.blocks_in_use() <= before[0] + 1
    keep.cancel()
    eng.step()
    assert llm._pool.blocks_in_use(0) == 0 and llm._pool.blocks_in_use(1) == 0
    llm._pool.check()


def test_randomized_operations_leak_no_block(model_dir, monkeypatch):
    """A few thousand seeded steps of random submissions (some with n > 1 forks and shared
    prefixes), cancellations and steps on a small pool: the books stay consistent every step and
    every block comes back at the end."""
    use_engine_path(monkeypatch, BACKENDS[-2] if len(BACKENDS) > 1 else BACKENDS[0])
    llm = edgellm.LLM(model_path(model_dir, "gemma3", QType.Q4_0, n_swa=8, n_layer=2), n_ctx=64, n_batch=24,
                      n_threads=2)
    rng = random.Random(1234)
    eng = BatchEngine(llm, max_seqs=6, kv_tokens=160, step_tokens=24)
    shared = prompts(1, seed=99, lo=30, hi=31)[0]
    live: list = []
    finished = 0
    for it in range(2500):
        op = rng.random()
        if op < 0.08 and len(live) < 12:
            base = shared[:rng.randrange(1, len(shared))] if rng.random() < 0.5 else [1]
            p = base + [rng.randrange(3, 300) for _ in range(rng.randrange(0, 20))]
            sp = GREEDY if rng.random() < 0.5 else seeded(rng.randrange(1000))
            got = eng.submit(p, max_tokens=rng.choice([1, 4, 12, None]), sampling=sp, n=rng.choice([1, 1, 1, 2, 3]))
            live.extend(got if isinstance(got, list) else [got])
        elif op < 0.12 and live:
            rng.choice(live).cancel()
        else:
            eng.step()
        llm._pool.check()
        for r in [r for r in live if r.done]:
            assert r.finish_reason in ("stop", "length", "cancelled"), (r.finish_reason, r.error)
            live.remove(r)
            finished += 1
    for r in live:
        r.cancel()
    eng.step()
    assert finished > 50
    assert all(r.done for r in live)
    assert llm._pool.blocks_in_use(0) == 0 and llm._pool.blocks_in_use(1) == 0
    llm._pool.check()


def test_engine_thread_streams_and_other_threads_submit(model_dir, monkeypatch):
    """The background thread steps while four threads submit and read their streams; each
    stream's text is what its request gives alone."""
    use_engine_path(monkeypatch, BACKENDS[-2] if len(BACKENDS) > 1 else BACKENDS[0])
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q8_0), n_ctx=96, n_batch=32, n_threads=2)
    ps = prompts(8, seed=21)
    want = [run(llm, [p], params=[seeded(i)])[0][0] for i, p in enumerate(ps)]
    with BatchEngine(llm, max_seqs=4).start() as eng:
        got = [None] * 8

        def client(i):
            req = eng.submit(ps[i], max_tokens=8, sampling=seeded(i))
            got[i] = [ev.token for ev in req if ev.token is not None]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
    assert got == want


def test_bad_submissions(model_dir):
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q8_0), n_ctx=32, n_batch=16, n_threads=1)
    eng = BatchEngine(llm, max_seqs=2, max_queue=1)
    with pytest.raises(edgellm.ContextOverflowError, match="40 tokens"):
        eng.submit([1] * 40)
    with pytest.raises(ValueError, match="vocabulary"):
        eng.submit([10**6])
    with pytest.raises(ValueError, match="max_tokens"):
        eng.submit([1, 5], max_tokens=-3)
    with pytest.raises(ValueError, match="n must be"):
        eng.submit([1, 5], n=3)
    with pytest.raises(ValueError, match="logit_bias"):
        eng.submit([1, 5], logit_bias={10**6: 1.0})
    eng.submit([1, 5])
    from edgellm.scheduler import QueueFullError

    with pytest.raises(QueueFullError):
        eng.submit([1, 6])


def test_generate_batch_and_chat_batch(model_dir, monkeypatch):
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q8_0), n_ctx=96, n_batch=32, n_threads=2)
    texts = llm.generate_batch(["hello world", "the cat sat", "a dog"], max_tokens=6, temperature=0)
    assert texts == [llm.generate_batch([p], max_tokens=6, temperature=0)[0] for p in
                     ["hello world", "the cat sat", "a dog"]]
    seeded_texts = llm.generate_batch(["hello", "hello"], max_tokens=6, seed=[1, 2], temperature=1.0)
    assert len(seeded_texts) == 2
    replies = llm.chat_batch([[{"role": "user", "content": "hello"}]] * 2, max_tokens=4, temperature=0)
    assert replies[0] == replies[1]
    # a conversation with a tool call is rendered as chat() renders it (the built-in template
    # has no tool calls: the call goes into the assistant's text)
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q8_0), n_ctx=256, n_batch=32, n_threads=2)
    prompts, tokens = [], llm.chat_tokens
    monkeypatch.setattr(llm, "chat_tokens", lambda text: prompts.append(text) or tokens(text))
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}
    llm.chat_batch([[{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]], max_tokens=1, temperature=0)
    assert '"name": "get_weather", "arguments": {"city": "Lyon"}' in prompts[0]


def test_threads_share_one_llm(model_dir):
    """Four threads calling generate() on one LLM each get what they get alone; an open stream
    goes on unchanged after another call on the same LLM."""
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q8_0), n_ctx=96, n_batch=32, n_threads=2)
    ps = ["hello world", "the cat sat on", "a dog", "the mat"]
    want = [llm.generate(p, max_tokens=10, seed=i, temperature=0.9) for i, p in enumerate(ps)]
    got = [None] * 4

    def worker(i):
        got[i] = llm.generate(ps[i], max_tokens=10, seed=i, temperature=0.9)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert got == want
    stream = llm.generate(ps[0], max_tokens=10, seed=0, temperature=0.9, stream=True)
    first = next(stream)
    assert llm.generate(ps[1], max_tokens=10, seed=1, temperature=0.9) == want[1]
    assert first + "".join(stream) == want[0]


def test_session_used_from_two_threads_at_once_is_refused(model_dir):
    llm = edgellm.LLM(model_path(model_dir, "llama", QType.Q8_0), n_ctx=96, n_batch=32, n_threads=1)
    s = llm.session()
    s._busy.acquire()  # as if another thread were inside feed()
    with pytest.raises(RuntimeError, match="another thread"):
        s.feed([1, 5])
    s._busy.release()
    assert s.feed([1, 5]).shape == (llm.n_vocab,)


def test_more_threads_than_cores_finishes(model_dir):
    """The engine with 16 threads on this machine's cores (and an LLM asked for more threads than
    it may use: clamped, with a warning) finishes: the pool's waits sleep instead of spinning."""
    path = model_path(model_dir, "gemma3", QType.Q4_K)
    code = f"""
import warnings, edgellm
from edgellm import kernels, models
from edgellm.gguf_file import GGUFFile
from edgellm.models.base import bind_weights
from edgellm.kv_cache import KVPool
from edgellm.batch import Step
g = GGUFFile({str(path)!r}); cfg = models.load_config(g)
eng = kernels.create_engine(g, cfg, bind_weights(g, cfg), n_ctx=64, n_batch=32, n_threads=16)
pool = KVPool(eng, n_ctx=64, n_swa=cfg.n_swa, has_swa=eng.has_swa)
s = pool.new_sequence()
for i in range(40):
    pool.reserve(s, 1)
    st = Step(); st.add(s, [5 + i]); st.run(eng, pool)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    llm = edgellm.LLM({str(path)!r}, n_ctx=64, n_threads=1000)
print(llm.n_threads, len(w), str(w[0].message) if w else "")
print(llm.generate("hello", max_tokens=4, temperature=0) is not None)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "EDGELLM_BACKEND": "c"} if BACKENDS[0] != "numba" else None)
    assert r.returncode == 0, r.stderr
    n, warned = r.stdout.split()[:2]
    assert int(n) == len(os.sched_getaffinity(0)) and int(warned) >= 1
    assert "1000 threads requested" in r.stdout


@pytest.mark.skipif(BACKENDS[0] == "numba", reason="the C engine's thread pool")
def test_two_threads_on_one_cpu_step_down_to_one(smollm2_path):
    """Two threads held to one CPU (the other cores busy, as far as this engine can tell): one
    thread's half of every matmul waits for the other's, so the adaptive pool runs the next
    steps on one thread, and the logits are the bits two fixed threads give."""
    code = f"""
import os, numpy as np, edgellm
os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})  # the pool's threads inherit it
llm = edgellm.LLM({str(smollm2_path)!r}, n_ctx=128, n_threads=1)
eng = llm._engine
ids = llm.tokenize("The quick brown fox jumps over the lazy dog. " * 3)[:32]
def decode():
    s = llm.session()
    rows = [s.feed([t]).copy() for t in ids]
    s.close()
    return np.stack(rows)
eng.set_threads(2, adaptive=False)
fixed = decode()
eng.set_threads(2, adaptive=True)
runs0, reduced0 = eng.thread_stats[1:]
adaptive = decode()
active, runs, reduced = eng.thread_stats
print(active, runs - runs0, reduced - reduced0, np.array_equal(fixed, adaptive))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    active, runs, reduced, same = r.stdout.split()
    assert same == "True"
    assert int(active) == 1 and int(reduced) >= int(runs) // 2, r.stdout


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_engine_state_saved_and_loaded_skips_the_prefix(model_dir, tmp_path, arch):
    """A finished request's cached blocks saved (BatchEngine.save_state), loaded by another LLM's
    engine: a request that starts with them evaluates only the rest (sliding-window layers
    included) and gives the tokens it gives without the state."""
    from edgellm.errors import EdgeLLMError
    from edgellm.state import StateFileError

    path = model_path(model_dir, arch, QType.Q8_0)
    doc = prompts(1, seed=5, lo=70, hi=71)[0]
    a = edgellm.LLM(path, n_ctx=256, n_batch=32, n_threads=2)
    eng = BatchEngine(a, max_seqs=2, kv_tokens=256)
    req = eng.submit(doc, max_tokens=10, sampling=GREEDY)
    eng.run_until_done([req])
    saved = eng.save_state(tmp_path / "doc.state", req.history, meta={"doc": 1})
    assert saved == len(req.history) // BLOCK * BLOCK and saved >= 64
    with pytest.raises(EdgeLLMError, match="none of these"):
        eng.save_state(tmp_path / "x.state", [1, 299, 298] * 10)

    question = req.history + prompts(1, seed=6, lo=5, hi=6)[0][1:]
    want, _ = run(edgellm.LLM(path, n_ctx=256, n_batch=32, n_threads=2), [question], params=[GREEDY], max_tokens=6)
    b = edgellm.LLM(path, n_ctx=256, n_batch=32, n_threads=2)
    fresh = BatchEngine(b, max_seqs=2, kv_tokens=256)
    assert fresh.load_state(tmp_path / "doc.state") == {"doc": 1}
    got = fresh.submit(question, max_tokens=6, sampling=GREEDY)
    fresh.run_until_done([got])
    assert fresh.stats()["prompt_tokens_cached"] == saved
    assert got.generated == want[0]
    b._pool.check()

    with pytest.raises(StateFileError, match="another model"):
        BatchEngine(edgellm.LLM(model_path(model_dir, arch, QType.Q8_0, seed=3), n_ctx=256)).load_state(
            tmp_path / "doc.state")
    with pytest.raises(EdgeLLMError, match="prefix cache"):
        BatchEngine(b, prefix_cache=False).load_state(tmp_path / "doc.state")
