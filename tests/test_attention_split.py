"""Attention split across threads (csrc/attention.c): a step with few jobs over many keys splits
each job's keys (scores, softmax) across the threads, and p.v by value dimensions (f16 values) or
by the same keys in whole chunks of EL_PV_CHUNK tiles (quantized values). The split is a
schedule, not another arithmetic: the logits equal the single-thread ones bit for bit, for every
cache type, at depths past every split boundary, in sliding-window layers, after a context shift,
for single-token steps (llama.cpp's order), small prefill chunks and the batched path alike."""

from __future__ import annotations

import numpy as np
import pytest

import edgellm
from edgellm.batch import LOGITS_ALL, Step
from edgellm.kernels import c_module
from edgellm.quants import QType
from tiny_models import tiny_model

from conftest import engine_paths, use_engine_path

pytestmark = pytest.mark.skipif(c_module() is None, reason="C kernels not built")
C_PATHS = [p for p in engine_paths() if p != "numba"]
DEPTH = 700  # > 32 tiles: decode steps split (the threshold is SPLIT_MIN = 32 tiles of 16 slots)
CACHES = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("f16", "q4_0")]
# 400 tiles: p.v over quantized values is split by tiles at chunk ends (EL_PV_CHUNK = 64 tiles; 2
# threads cut at tile 192, 3 at 128 and 256); at DEPTH by value groups (the cut too uneven)
DEEP = 6400


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    # global layers plus sliding-window layers whose window (600) is itself past the threshold;
    # f32 weights: a quantized matmul rounds its input to 8 bits, which would hide an attention
    # output a unit in the last place off (p.v's chunk sums added in another order, say)
    return {"gemma3": tiny_model(d / "g.gguf", "gemma3", QType.F32, n_swa=600),
            "llama": tiny_model(d / "l.gguf", "llama", QType.F32)}


def _history(rng, n):
    return [1] + rng.integers(3, 300, n - 1).tolist()


def _feed(llm, seq, ids, llama_order=True):
    """Evaluate ids after what seq holds, in steps of n_batch; logits of every row."""
    pool, eng, out = llm._pool, llm._engine, []
    for i in range(0, len(ids), llm.n_batch):
        chunk = ids[i:i + llm.n_batch]
        pool.reserve(seq, len(chunk))
        step = Step()
        step.add(seq, chunk, LOGITS_ALL)
        out.append(np.array(step.run(eng, pool, llama_order=llama_order)[0]))
    return np.concatenate(out)


def _continuations(path, ids, tail, threads, shift=None, cache=CACHES[0]):
    """The single-stream (llama_order) logits of tail after ids, one token at a time then a
    chunk of 6, for each thread count (forks of one prefill); and which groups split."""
    llm = edgellm.LLM(path, n_ctx=1024, n_batch=256, n_threads=1, cache_type_k=cache[0], cache_type_v=cache[1])
    base = llm._pool.new_sequence()
    _feed(llm, base, ids)
    if shift:
        llm._pool.shift(base, 1, shift)
    return _forks(llm, base, tail, threads)


def _forks(llm, base, tail, threads):
    """_continuations' runs from the sequence base."""
    pool, eng = llm._pool, llm._engine
    res = []
    for n in threads:
        eng.set_threads(n, adaptive=False)  # more threads than cores is allowed here: results must not change
        seq, rows, split = pool.fork(base), [], 0
        for t in tail[:4]:
            rows.append(_feed(llm, seq, [t]))
            split |= eng.attention_split
        rows.append(_feed(llm, seq, tail[4:]))
        split |= eng.attention_split
        pool.release(seq)
        res.append((np.concatenate(rows), split))
    return res


@pytest.mark.parametrize("cache", CACHES, ids="/".join)
@pytest.mark.parametrize("path", C_PATHS)
@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_split_equals_single_thread(models, monkeypatch, path, arch, cache):
    use_engine_path(monkeypatch, path)
    rng = np.random.default_rng(7)
    ids, tail = _history(rng, DEPTH), rng.integers(3, 300, 10).tolist()
    (one, split1), *more = _continuations(models[arch], ids, tail, (1, 2, 3), cache=cache)
    assert split1 == 0  # one thread never splits
    for n, (got, split) in zip((2, 3), more):
        # (bits 2, 3: p.v over quantized values by keys, not at this depth)
        assert split == (3 if arch == "gemma3" else 1), f"{n} threads did not split every group ({split})"
        np.testing.assert_array_equal(got, one, err_msg=f"{n} threads")


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A tiny Gemma-3 (f32 weights) DEEP tokens in, saved per quantized cache type: (model, {cache: state})"""
    d = tmp_path_factory.mktemp("deep")
    model = tiny_model(d / "g.gguf", "gemma3", QType.F32, n_swa=600, ctx=DEEP + 64)
    ids = _history(np.random.default_rng(10), DEEP)
    states = {}
    for cache in CACHES[1:3]:
        llm = edgellm.LLM(model, n_ctx=DEEP + 64, n_batch=512, cache_type_k=cache[0], cache_type_v=cache[1])
        s = llm.session()
        s.feed(ids)
        states[cache] = d / f"{cache[0]}.state"
        s.save_state(states[cache])
    return model, states


@pytest.mark.parametrize("cache", CACHES[1:3], ids="/".join)
@pytest.mark.parametrize("path", C_PATHS)
def test_deep_split_of_quantized_values(deep, monkeypatch, path, cache):
    """Past 4 chunks of 64 tiles, p.v over quantized values splits by tiles, 2 and 3 threads
    cutting at different chunk ends: the bits of one thread."""
    use_engine_path(monkeypatch, path)
    model, states = deep
    llm = edgellm.LLM(model, n_ctx=DEEP + 64, n_batch=256, n_threads=1, cache_type_k=cache[0], cache_type_v=cache[1])
    base = llm.session()
    base.load_state(states[cache])
    tail = np.random.default_rng(11).integers(3, 300, 10).tolist()
    (one, _), *more = _forks(llm, base._seq, tail, (1, 2, 3))
    for n, (got, split) in zip((2, 3), more):
        assert split & 7 == 7, f"{n} threads: {split}"  # (bit 2: the global layers' p.v by keys)
        np.testing.assert_array_equal(got, one, err_msg=f"{n} threads")


@pytest.mark.parametrize("cache", CACHES[:2], ids="/".join)
@pytest.mark.parametrize("path", C_PATHS[-1:])
def test_split_after_context_shift(models, monkeypatch, path, cache):
    """The cache full: 500 slots after the first dropped and the keys re-rotated, then decoding
    on: every thread count the same bits."""
    use_engine_path(monkeypatch, path)
    rng = np.random.default_rng(8)
    ids, tail = _history(rng, 1010), rng.integers(3, 300, 10).tolist()
    (one, _), (two, split) = _continuations(models["gemma3"], ids, tail, (1, 2), shift=500, cache=cache)
    assert split & 1
    np.testing.assert_array_equal(two, one)


@pytest.mark.parametrize("cache", CACHES[:2], ids="/".join)
@pytest.mark.parametrize("path", C_PATHS[-1:])
def test_batched_path_splits_the_same(models, monkeypatch, path, cache):
    """The batched order (no llama_order): a long sequence alone splits, and gives the bits it
    gets on one thread and in a step beside another sequence (where jobs are whole)."""
    use_engine_path(monkeypatch, path)
    rng = np.random.default_rng(9)
    long, short = _history(rng, DEPTH), _history(rng, 40)
    nxt = rng.integers(3, 300, 3).tolist()

    def run(n_threads, company):
        llm = edgellm.LLM(models["gemma3"], n_ctx=1024, n_batch=256, n_threads=1, cache_type_k=cache[0],
                          cache_type_v=cache[1])
        pool, eng = llm._pool, llm._engine
        eng.set_threads(n_threads, adaptive=False)  # the split counts must not depend on the load
        seqs = [pool.new_sequence() for _ in range(1 + len(company))]
        for s, p in zip(seqs, [long] + company):
            _feed(llm, s, p, llama_order=False)
        step = Step()
        pool.reserve(seqs[0], len(nxt))
        step.add(seqs[0], nxt, LOGITS_ALL)
        for s in seqs[1:]:
            pool.reserve(s, 1)
            step.add(s, [5], LOGITS_ALL)
        out = np.array(step.run(eng, pool)[0])
        return out, eng.attention_split

    alone1, s1 = run(1, [])
    alone3, s3 = run(3, [])
    crowd, s2 = run(2, [short] * 3)
    assert s1 == 0 and s3 == 3 and s2 == 0
    np.testing.assert_array_equal(alone3, alone1)
    np.testing.assert_array_equal(crowd, alone1)


@pytest.fixture(scope="module")
def three_kv(tmp_path_factory):
    """llama with SmolLM2's 3 kv heads"""
    return tiny_model(tmp_path_factory.mktemp("kv3") / "l3.gguf", "llama", QType.F32, n_head=6, n_head_kv=3)


@pytest.mark.parametrize("path", C_PATHS[-1:])
@pytest.mark.parametrize("arch,threads,rows,runs", [("llama3", 2, 8, 2), ("llama3", 2, 7, 2), ("gemma3", 3, 16, 3),
                                                    ("llama", 3, 16, 3), ("llama", 2, 9, 2), ("llama3", 2, 16, 2)])
def test_runs_cut_for_the_threads_change_no_bit(models, three_kv, monkeypatch, path, arch, threads, rows, runs):
    """Attention's jobs are runs of at most 8 rows of a sequence times its kv heads. A step of many
    rows of one sequence (too many to split its keys across the threads) but few jobs cuts its rows
    into more runs of even sizes where that evens out the threads' shares (engine.c's plan_runs: 8
    rows of 3 kv heads on 2 threads as 4 + 4, six jobs, not one run and three jobs); else runs of 8
    and the rest (9 rows as 8 + 1). Each row's logits are the bits it gets in steps of one row on
    one thread."""
    use_engine_path(monkeypatch, path)
    rng = np.random.default_rng(rows)
    hist, nxt = _history(rng, 300), rng.integers(3, 300, rows).tolist()
    model = three_kv if arch == "llama3" else models[arch]

    def run(n_threads, step_rows):
        llm = edgellm.LLM(model, n_ctx=1024, n_batch=256, n_threads=1)
        pool, eng = llm._pool, llm._engine
        eng.set_threads(n_threads, adaptive=False)
        seq = pool.new_sequence()
        _feed(llm, seq, hist, llama_order=False)
        out, counts = [], set()
        for i in range(0, rows, step_rows):
            out.append(_feed(llm, seq, nxt[i:i + step_rows], llama_order=False))
            counts.add(eng.attention_runs)
        return np.concatenate(out), counts

    alone, runs1 = run(1, 1)
    together, counts = run(threads, rows)
    assert runs1 == {1} and counts == {runs}
    np.testing.assert_array_equal(together, alone)


@pytest.fixture(scope="module")
def one_kv(tmp_path_factory):
    """llama with Gemma-3-270M's one kv head for 4 query heads"""
    return tiny_model(tmp_path_factory.mktemp("kv1") / "l1.gguf", "llama", QType.F32, n_head=4, n_head_kv=1)


@pytest.mark.parametrize("cache", CACHES, ids="/".join)
@pytest.mark.parametrize("path", C_PATHS)
def test_jobs_cut_into_heads_change_no_bit(one_kv, monkeypatch, path, cache):
    """Below the split's depth a step's jobs are whole, one per run of rows and kv head; with fewer
    jobs than threads (one kv head, one token) each job's query heads are cut into runs, one for
    each thread (2 + 2 on 2 threads, 1 + 1 + 2 on 3). Each row's logits are the bits of one thread."""
    use_engine_path(monkeypatch, path)
    rng = np.random.default_rng(12)
    hist, tail = _history(rng, 150), rng.integers(3, 300, 4).tolist()
    llm = edgellm.LLM(one_kv, n_ctx=1024, n_batch=256, n_threads=1, cache_type_k=cache[0], cache_type_v=cache[1])
    pool, eng = llm._pool, llm._engine
    base = pool.new_sequence()
    _feed(llm, base, hist)
    res = {}
    for n in (1, 2, 3):
        eng.set_threads(n, adaptive=False)
        seq, rows, parts = pool.fork(base), [], set()
        for t in tail:
            rows.append(_feed(llm, seq, [t]))
            parts.add((eng.attention_parts, eng.attention_split))
        pool.release(seq)
        res[n] = np.concatenate(rows)
        assert parts == {(min(n, 4), 0)}, f"{n} threads: (parts, split) {parts}"
    for n in (2, 3):
        np.testing.assert_array_equal(res[n], res[1], err_msg=f"{n} threads")
