"""The engines on the tiny model of every architecture (tests/tiny_archs.py) against llama.cpp's
outputs for the same file (tests/fixtures/arch/*.json), on every engine path (each C ISA path and
numba; the last two checks on the best C path and numba only, to keep the suite lean): issue 10's acceptance - teacher-forced top-1 agreement >= 99% and mean |Δ log-prob| < 0.01
over the top-8 tokens of 320 positions, llama.cpp's 32 greedy tokens, token-by-token evaluation as
close to the batch one as llama.cpp's own (its `batch_envelope`), and the batched engine
(BatchEngine, several sequences in each step) choosing the same greedy tokens. Expert counts that
do not fit a file's expert tensors are refused before any expert runs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import edgellm
import tiny_archs
from conftest import FIXTURES, engine_paths, use_engine_path
from edgellm.batch import LOGITS_ALL, Step
from edgellm import kernels, models
from edgellm.errors import EdgeLLMError, GGUFError
from edgellm.gguf_file import GGUFFile
from edgellm.models.tensors import bind_weights
from edgellm.sampling import SamplingParams
from edgellm.scheduler import BatchEngine

REFS = {p.stem: json.loads(p.read_text()) for p in sorted((FIXTURES / "arch").glob("*.json"))}
RUNS = sorted(REFS)
PATHS = engine_paths()
# the batch-vs-token and batched-engine checks, kept lean: the best C path and numba
LEAN_PATHS = PATHS[-2:] if len(PATHS) > 1 else PATHS
# The models whose engines give llama.cpp's own numbers on the single-stream path (llama_order,
# float weights in ggml's orders: csrc/float_llama.c, and numba's twin of it and of every float op
# of the C generic path, numba_float_llama / numba_ops): every log-probability within the
# references' 5 decimals, so all 32 greedy tokens equal and the token-by-token evaluation exactly as
# far from the batch one as llama.cpp's own - no near-tie allowance - on every C path and numba.
EXACT = {"gemma2", "gemma4", "granite", "granitemoe", "llama-bias-ropefreqs", "llama-linear", "llama-moe", "llama-yarn",
         "mistral3", "olmo2", "phi3", "phi3-long", "phi4-mini", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "qwen35", "qwen35-s128",
         "smollm3"}
REF_DECIMALS = 1e-5  # the references' log-probabilities are rounded to 5 decimals


def _exact(name) -> bool:
    return name in EXACT


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out, cache = tmp_path_factory.mktemp("arch_engines"), {}

    def get(name):
        if name not in cache:
            cache[name] = tiny_archs.build(REFS[name]["spec"], out)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def evals():
    """What several tests compute of one model on one path, computed once: the batch evaluation
    of the teacher-forced ids (log-probs at the reference's columns, argmax, logits of the top two
    per row)."""
    memo = {}

    def get(kind, name, path, compute):
        if (kind, name, path) not in memo:
            memo[kind, name, path] = compute()
        return memo[kind, name, path]

    return get


def _batch_eval(evals, llm, name, path):
    tf = REFS[name]["teacher_forced"]

    def compute():
        z = llm.session()._feed(tf["ids"], logits=LOGITS_ALL)
        lp, best = _log_probs_at(z, np.array(tf["top_ids"]))
        return lp, best, np.sort(np.partition(np.asarray(z), -2, -1)[:, -2:], -1).astype(np.float64)

    return evals("batch", name, path, compute)


def _log_probs_at(z, cols) -> tuple[np.ndarray, np.ndarray]:
    """The float64 log-softmax of each row of logits z at that row's columns cols, and each row's
    argmax; a block of rows at a time, since the whole matrix for a 152k-token vocabulary is 390 MB."""
    z, cols = np.asarray(z), np.asarray(cols)
    out = np.empty(cols.shape)
    for i in range(0, len(z), 32):
        zi = z[i:i + 32].astype(np.float64)
        zi -= zi.max(-1, keepdims=True)
        out[i:i + 32] = np.take_along_axis(zi, cols[i:i + 32], -1) - np.log(np.exp(zi).sum(-1, keepdims=True))
    return out, z.argmax(-1)


def _llm(built, name, path, monkeypatch, n_batch=64):
    use_engine_path(monkeypatch, path)
    return edgellm.LLM(built(name), n_ctx=REFS[name]["n_ctx"], n_batch=n_batch, n_threads=2)


def _near_ties(name, differ) -> bool:
    """Whether every greedy step where the engine chose another token than llama.cpp is a near-tie:
    the engine's top two closer than llama.cpp's own largest token-by-token |Δ log-prob| on this file
    (batch_envelope max_abs), a perturbation llama.cpp itself shows - as at qwen2moe's step 20 on
    numba's batch-invariant path, where the top two are 0.001-0.0045 apart and llama.cpp's own
    largest |Δ| is 0.0052 (a router near-tie 0.00013 wide in layer 1, decided by the last bits of
    float sums). Not for the EXACT models on the single-stream path."""
    return all(margin < REFS[name]["batch_envelope"]["max_abs"] for *_, margin in differ)


def _greedy_steps_differing(llm, prompt, ids, llama_order=True):
    """Along llama.cpp's greedy continuation (each of its tokens fed back): the steps where the
    engine's argmax is another token, with the engine's margin between its top two there - in the
    single-stream arithmetic (llama_order) or the batch-invariant one BatchEngine uses."""
    s, out = llm.session(), []
    s._set_llama_order(llama_order)
    z = np.array(s._feed(prompt))
    for i, want in enumerate(ids):
        if int(np.argmax(z)) != want:
            top2 = np.sort(z)[-2:]
            out.append((i, int(np.argmax(z)), want, float(top2[1] - top2[0])))
        z = np.array(s._feed([want]))
    return out


def _greedy(llm, prompt, n):
    s, got = llm.session(), []
    z = s._feed(prompt)
    for _ in range(n):
        got.append(int(np.argmax(z)))
        z = s._feed([got[-1]])
    return got


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", RUNS)
def test_engine_matches_llama_cpp(built, evals, monkeypatch, name, path):
    ref = REFS[name]
    tf, g = ref["teacher_forced"], ref["greedy"]
    llm = _llm(built, name, path, monkeypatch)
    top = np.array(tf["top_ids"])
    lp, best, _ = _batch_eval(evals, llm, name, path)
    diff = np.abs(lp - np.array(tf["top_logprobs"]))
    top1 = float(np.mean(best == top[:, 0]))
    detail = f"{name} on {path}: top-1 {top1:.4f}, mean |Δ| {diff.mean():.4f} over {len(tf['ids'])} positions"
    assert top1 >= 0.99, detail
    assert diff.mean() < 0.01, detail
    differ = _greedy_steps_differing(llm, g["prompt_ids"], g["ids"])
    if _exact(name):  # llama.cpp's numbers (on every path): its 32 greedy tokens, every one
        assert diff.max() < REF_DECIMALS, (detail, float(diff.max()))
        assert not differ, (name, differ)
    else:  # llama.cpp's 32 greedy tokens, every one but a near-tie (_near_ties)
        assert _near_ties(name, differ), (name, differ)


@pytest.mark.parametrize("path", LEAN_PATHS)
@pytest.mark.parametrize("name", RUNS)
def test_token_by_token_within_llama_cpps_envelope(built, evals, monkeypatch, name, path):
    """The 320 tokens one at a time against all at once, as llama.cpp measured itself: mean |Δ| of
    the top-8 log-probabilities no worse than llama.cpp's, over the positions within llama.cpp's own
    largest |Δ| (its max_abs) - at most 1% of them (the issue's top-1 budget) may be beyond it, a
    decision at a near-tie gone the other way; every position whose top-1 differs a near-tie: its
    top two closer (in the batch evaluation) than llama.cpp's max_abs, so a perturbation llama.cpp
    itself shows explains the flip; and the token-by-token top-1 meets the issue's bar against
    llama.cpp's (>= 99%). The EXACT models compute llama.cpp's own numbers both ways, so
    none of their positions may be beyond llama.cpp's max_abs. (Comparing flip counts with
    llama.cpp's own is comparing luck at ties: before the C paths took ggml's orders, gemma2's batch
    top two at position 280 were 0.0004 apart, and llama-linear flipped at 5 positions, all under
    0.019 apart. Likewise a MoE router: in qwen3moe, position 237's last layer ranks its
    2nd and 3rd experts 0.0013 apart in the float64 reference, under the ~0.001 the C engine's
    token-by-token and batch evaluations move a router's logits; on avx512 the expert changes and
    that position's log-probabilities moved by 0.7 before the C engine took ggml's float orders.)"""
    ref = REFS[name]
    ids, top = ref["teacher_forced"]["ids"], np.array(ref["teacher_forced"]["top_ids"])
    llm = _llm(built, name, path, monkeypatch)
    batch, batch_best, top2 = _batch_eval(evals, llm, name, path)
    s = llm.session()
    one, one_best = _log_probs_at(np.stack([np.array(s._feed([t])) for t in ids]), top)
    d = np.abs(one - batch)
    flips = np.nonzero(one_best != batch_best)[0]
    margins = top2[flips, 1] - top2[flips, 0]  # a log-prob difference is the logits'
    env = ref["batch_envelope"]
    beyond = d.max(1) > env["max_abs"]
    allowed = 0 if _exact(name) else len(ids) // 100
    assert beyond.sum() <= allowed, (np.nonzero(beyond)[0], d.max(1)[beyond], env)
    assert d[~beyond].mean() <= env["mean_abs"], (d[~beyond].mean(), env)
    assert float(np.mean(one_best == top[:, 0])) >= 0.99
    assert np.all(margins < env["max_abs"]), [(int(i), float(m)) for i, m in zip(flips, margins)]


@pytest.mark.parametrize("path", LEAN_PATHS)
@pytest.mark.parametrize("name", RUNS)
def test_batched_engine_same_greedy_tokens(built, monkeypatch, name, path):
    """llama.cpp's greedy prompt beside three other sequences in one BatchEngine (the
    batch-invariant path): llama.cpp's 32 tokens up to the first step where the batch-invariant
    arithmetic decides a near-tie the other way (qwen2moe's step 20: its float sums are not ggml's,
    so that router near-tie is not llama.cpp's decision there), and every sequence the tokens it
    gets alone."""
    g = REFS[name]["greedy"]
    ids = REFS[name]["teacher_forced"]["ids"]
    llm = _llm(built, name, path, monkeypatch)
    prompts = [g["prompt_ids"], ids[20:45], ids[50:58], ids[100:140]]

    def run(ps):
        eng = BatchEngine(llm, max_seqs=len(ps), prefix_cache=False)
        reqs = [eng.submit(p, max_tokens=len(g["ids"]), sampling=SamplingParams(temperature=0), ignore_eos=True)
                for p in ps]  # on past an end of generation, as llama.cpp's greedy tokens go
        eng.run_until_done(reqs)
        assert all(r.error is None for r in reqs)
        return [r.generated for r in reqs]

    together = run(prompts)
    differ = _greedy_steps_differing(llm, g["prompt_ids"], g["ids"], llama_order=False)
    assert _near_ties(name, differ), (name, differ)
    k = differ[0][0] if differ else len(g["ids"])
    assert together[0][:k] == g["ids"][:k]
    assert together == [run([p])[0] for p in prompts]


def test_corrupt_expert_counts_are_refused(built, monkeypatch):
    """Expert counts that do not fit the file's expert tensors never reach an expert id past a
    tensor: the loader refuses them with one line, and the C engine checks the stacked tensors
    against the counts it is given (behind the loader, so a bad description cannot read out of bounds)."""
    path = built("qwen3moe")
    for key, value, says in (("expert_count", 16, "ffn_gate_inp.weight' has shape"),
                             ("expert_used_count", 9, "expert_used_count must be in 1..8"),
                             ("expert_count", 4096, "expert_count must be in 1..512 (got 4096)")):
        g = GGUFFile(path)
        g.metadata[f"qwen3moe.{key}"] = value
        with pytest.raises(GGUFError) as e:
            bind_weights(g, models.load_config(g))
        assert says in str(e.value) and "\n" not in str(e.value)
    if kernels.c_module() is None:
        return
    use_engine_path(monkeypatch, PATHS[0])
    g = GGUFFile(path)
    cfg = models.load_config(g)
    w = bind_weights(g, cfg)
    for moe, says in ((dataclasses.replace(cfg.moe, n_expert=16), "blk.0.ffn_gate_inp: bad shape"),
                      (dataclasses.replace(cfg.moe, n_ff_exp=64), "blk.0.ffn_gate_exps: bad shape")):
        with pytest.raises(EdgeLLMError, match=says):
            kernels.create_engine(g, dataclasses.replace(cfg, moe=moe), w, n_ctx=64, n_batch=8, n_threads=1)


@pytest.mark.skipif(kernels.c_module() is None, reason="C kernels not built")
def test_numba_holds_the_c_engines_gemma4_cache(built, monkeypatch, tmp_path):
    """gemma4's KV layout (per-layer head sizes and kv heads, the last layers holding no cache of
    their own) and context shift (per-layer rotated dims, RoPE factors on the global layers only)
    on numba are the C generic path's: over 70 tokens in steps of 16, a shift of 40 slots behind
    the first 4 (past the window of 32) and 3 more tokens, the same logits and the same saved
    state, byte for byte (measured: equal)."""
    ids = REFS["gemma4"]["teacher_forced"]["ids"][:70]
    got = {}
    for path in ("c:generic", "numba"):
        llm = _llm(built, "gemma4", path, monkeypatch, n_batch=16)
        s = llm.session()
        before = s._feed(ids, logits=LOGITS_ALL).copy()
        s.save_state(tmp_path / f"{path}.before")
        with llm._engine_lock:
            llm._pool.shift(s._seq, 4, 40)
        s.save_state(tmp_path / f"{path}.after")
        after = s._feed([300, 301, 302], logits=LOGITS_ALL).copy()
        got[path] = (before, after, *((tmp_path / f"{path}.{w}").read_bytes() for w in ("before", "after")))
    for c, nb in zip(got["c:generic"], got["numba"]):
        assert np.array_equal(c, nb) if isinstance(c, np.ndarray) else c == nb


@pytest.mark.skipif(kernels.c_module() is None, reason="C kernels not built")
def test_numba_holds_the_c_engines_qwen35_state(built, monkeypatch):
    """qwen35's recurrent states on numba (numba_delta_net, a slot per sequence) are the C generic
    path's: the same logits, bit for bit, over 70 tokens in steps of 16 (each step continuing the
    conv and delta-rule states of the last), then a fork and each copy fed its own tokens, then
    two sequences in each of two batch-order steps (one of them a single token)."""
    ids = REFS["qwen35"]["teacher_forced"]["ids"]
    got = {}
    for path in ("c:generic", "numba"):
        llm = _llm(built, "qwen35", path, monkeypatch, n_batch=16)
        s = llm.session()
        out = [s._feed(ids[:70], logits=LOGITS_ALL).copy()]
        f = s.fork()
        out += [s._feed(ids[70:73], logits=LOGITS_ALL).copy(), f._feed(ids[100:102], logits=LOGITS_ALL).copy()]
        pool, eng = llm._pool, llm._engine
        seqs = [pool.new_sequence() for _ in range(2)]
        for parts in ((ids[:9], ids[30:37]), (ids[9:10], ids[37:40])):
            st = Step()
            for q, p in zip(seqs, parts):
                pool.reserve(q, len(p))
                st.add(q, p, LOGITS_ALL)
            out += [np.array(r) for r in st.run(eng, pool)]
        got[path] = out
    for c, nb in zip(got["c:generic"], got["numba"]):
        assert np.array_equal(c, nb), np.abs(c - nb).max()
