"""Speculative decoding (edgellm.speculative): exact greedy equality with and without drafts on
tiny models of every architecture on every engine path and on both real models, the sampling
rule's distribution (chi-square, and the test failing a wrong rule), seeded prompt lookup giving
the seed's text, context shift and stop strings, draft models with another vocabulary refused,
and the parts (n-gram lookup, step costs and their calibration, controller) on their own."""

from __future__ import annotations

import random

import numpy as np
import pytest
from gguf import GGUFValueType as VT

import edgellm
import tiny_models
from edgellm import speculative as sp
from edgellm.errors import DraftModelError
from edgellm.quants import QType
from edgellm.sampling import Sampler, SamplingParams, probabilities
from edgellm.scheduler import BatchEngine
from edgellm.speculative import Speculative
from tiny_models import ARCHS, tiny_model

from conftest import REAL_MODELS, engine_paths, use_engine_path

BACKENDS = engine_paths()
GREEDY = SamplingParams(temperature=0)
# drafting at every step (the adaptive controller could switch a poor drafter off, leaving
# nothing to verify): 4 drafts, so steps accept some and reject others
EVERY_STEP = dict(max_draft=4, adaptive=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("spec")


_paths: dict = {}


def model_path(model_dir, arch, qtype=QType.Q8_0, **kw):
    """A tiny model with untied output weights of small scale: tied ones make a random model
    repeat its input token, which drafts would always guess."""
    kw.setdefault("tied", False)
    key = (arch, qtype, tuple(sorted(kw.items())))
    if key not in _paths:
        _paths[key] = tiny_model(model_dir / f"{arch}-{qtype.name}-{len(_paths)}.gguf", arch, qtype, **kw)
    return _paths[key]


def tiny_prompts(seed=0):
    """Random prompts, and two that repeat themselves (prompt lookup finds them)."""
    rng = random.Random(seed)
    ps = [[1] + [rng.randrange(3, 300) for _ in range(rng.randrange(4, 20))] for _ in range(2)]
    ps.append([1] + [40, 41, 42, 43, 44, 45] * 3)
    ps.append([1] + [rng.randrange(3, 300) for _ in range(5)] * 3)
    return ps


def engine_run(llm, prompts, *, params=GREEDY, max_tokens=24, stop=None, **kw):
    """Requests submitted together to one BatchEngine: (generated tokens, texts, engine)."""
    eng = BatchEngine(llm, max_seqs=len(prompts), **{k: v for k, v in kw.items() if k != "speculative"})
    reqs = [eng.submit(p, max_tokens=max_tokens, sampling=params, stop=stop,
                       speculative=kw.get("speculative")) for p in prompts]
    eng.run_until_done(reqs)
    for r in reqs:
        assert r.error is None, r.error
    return [r.generated for r in reqs], [r.text for r in reqs], eng


def check_drafts_were_tested(drafted, accepted):
    """Equality means something only if steps both took and refused drafts."""
    assert 0 < accepted < drafted, (drafted, accepted)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equal_on_tiny_models(model_dir, monkeypatch, backend, arch):
    """Prompt lookup and a draft model (the same weights in Q4_0), in the batched engine (all
    requests in shared steps) and through generate(): the tokens of greedy decoding without
    speculation, on every engine path."""
    use_engine_path(monkeypatch, backend)
    llm = edgellm.LLM(model_path(model_dir, arch), n_ctx=128, n_batch=32, n_threads=2)
    draft = edgellm.LLM(model_path(model_dir, arch, QType.Q4_0), n_ctx=128, n_batch=32, n_threads=2)
    ps = tiny_prompts(1)
    n = 24
    if backend == "numba":  # (its matmuls are slow: fewer tokens)
        ps, n = ps[2:], 16
    ref, ref_text, _ = engine_run(llm, ps, max_tokens=n)
    for how in ("lookup", draft):
        spec = Speculative(how, **EVERY_STEP)
        got, _, eng = engine_run(llm, ps, speculative=spec, max_tokens=n)
        assert got == ref
        st = eng.stats()
        check_drafts_were_tested(st["draft_tokens"], st["accepted_tokens"])
        texts = [llm.generate(p, max_tokens=n, temperature=0, speculative=spec) for p in ps[-2:]]
        assert texts == ref_text[-2:]
    assert llm._pool.blocks_in_use() <= -(-128 // 16) + 1  # only generate()'s cached session holds blocks
    assert draft._pool.blocks_in_use() == 0  # draft sequences end with their requests


@pytest.fixture(scope="module")
def smollm2_q4_0(smollm2_path, tmp_path_factory):
    """SmolLM2 requantized to Q4_0 with edgellm's quantizer: a draft model of the real one."""
    from edgellm.tools.quant_mix import parse_file_type
    from edgellm.tools.quantize import quantize_model

    out = tmp_path_factory.mktemp("draft") / "smollm2-q4_0.gguf"
    quantize_model(smollm2_path, out, parse_file_type("Q4_0"), allow_requantize=True)
    return out


def test_greedy_equal_on_real_models(real_model, smollm2_q4_0, monkeypatch):
    """The fixture prompts with prompt lookup (and, for SmolLM2, its Q4_0 as a draft model):
    the tokens of greedy decoding on the batch-invariant path, 32 tokens each, and generate()
    too. On the fastest engine path: the other C paths give its bits (test_real_models), and
    every path runs speculation on the tiny models above."""
    use_engine_path(monkeypatch, BACKENDS[-2] if len(BACKENDS) > 1 else "numba")
    alias, path, ref = real_model
    llm = edgellm.LLM(path, n_ctx=256, n_threads=2)
    ps = [g["prompt_ids"] for g in ref["greedy"]]
    n = 32
    plain, _, _ = engine_run(llm, ps, max_tokens=n)
    hows = ["lookup"]
    if "smollm2" in alias:
        hows.append(edgellm.LLM(smollm2_q4_0, n_ctx=256, n_threads=2))
    for how in hows:
        got, _, eng = engine_run(llm, ps, max_tokens=n, speculative=Speculative(how, max_draft=4, adaptive=False))
        assert got == plain, how
        st = eng.stats()
        check_drafts_were_tested(st["draft_tokens"], st["accepted_tokens"])
    text = llm.generate(ps[0], max_tokens=n, temperature=0, speculative="lookup")
    assert text == llm.detokenize(plain[0])


def test_seeded_lookup_gives_the_seeds_text(model_dir):
    """With prompt lookup, sampling draws each token as plain decoding does (a draft is taken
    when it is the token drawn), so a seed gives the same text with and without speculation."""
    llm = edgellm.LLM(model_path(model_dir, "llama"), n_ctx=128, n_batch=32, n_threads=2)
    ps = tiny_prompts(7)
    # a penalty window (4) shorter than the repeats lookup finds: drafts are taken, and rows
    # after accepted drafts see them in their window
    params = SamplingParams(temperature=0.1, top_k=20, seed=11, repeat_penalty=1.1, repeat_last_n=4)
    ref, ref_text, _ = engine_run(llm, ps, params=params)
    got, _, eng = engine_run(llm, ps, params=params, speculative=Speculative("lookup", **EVERY_STEP))
    assert got == ref
    check_drafts_were_tested(eng.stats()["draft_tokens"], eng.stats()["accepted_tokens"])
    text = llm.generate(ps[3], max_tokens=24, temperature=0.1, top_k=20, seed=11, repeat_penalty=1.1, repeat_last_n=4,
                        speculative=Speculative("lookup", **EVERY_STEP))
    assert text == ref_text[3]


def test_sampled_draft_model_is_reproducible(model_dir):
    """A draft model with sampling: the same seed and fixed draft lengths give the same text."""
    llm = edgellm.LLM(model_path(model_dir, "llama"), n_ctx=128, n_batch=32, n_threads=2)
    draft = edgellm.LLM(model_path(model_dir, "llama", QType.Q4_0), n_ctx=128, n_batch=32, n_threads=2)
    kw = dict(max_tokens=24, temperature=0.8, seed=5, speculative=Speculative(draft, **EVERY_STEP))
    a = [llm.generate(p, **kw) for p in tiny_prompts(3)]
    st = llm.last_stats
    assert st.draft_tokens > 0 and st.verify_steps > 0
    assert a == [llm.generate(p, **kw) for p in tiny_prompts(3)]


# -- the sampling rule keeps the target's distribution ---------------------------------------

PARAMS = SamplingParams(temperature=1.0, top_k=6, top_p=1.0, min_p=0.0)


class _Logits:
    """Last-token logits of a model after a context, memoized."""

    def __init__(self, llm):
        self.llm, self.memo = llm, {}

    def __call__(self, ctx):
        key = tuple(ctx)
        if key not in self.memo:
            self.memo[key] = self.llm.logits(list(ctx), last_only=True)
        return self.memo[key]


def _two_tokens(state, sampler, target, draft, prompt):
    """The first two tokens speculative decoding gives after prompt (2 drafts a step)."""
    out = []
    while len(out) < 2:
        ctx = prompt + out
        if draft is None:  # prompt lookup's point mass: a fixed guess
            drafts = [int(np.argsort(target(ctx))[-2]), 7]
        else:  # the draft model samples two tokens (ModelDrafter.choose keeps their q)
            d = state.model
            d.drafts, d.q, d.keys = [], [], []
            for _ in range(2):
                d.choose(draft(ctx + d.drafts), ctx + d.drafts)
            drafts = list(d.drafts)
        rows = np.stack([target(ctx + drafts[:i]) for i in range(3)])
        out += state.verify(sampler, rows, ctx, drafts)[0]
    return tuple(out[:2])


def _chi2_pvalue(counts: dict, probs: dict, n: int) -> float:
    from scipy.stats import chi2

    cells, small_obs, small_exp = [], 0, 0.0
    for key, p in probs.items():
        e = p * n
        if e < 5:
            small_obs += counts.get(key, 0)
            small_exp += e
        else:
            cells.append((counts.get(key, 0), e))
    rest = n - sum(counts.get(k, 0) for k in probs)  # outcomes of zero probability
    assert rest == 0, f"{rest} samples outside the target's support"
    if small_exp > 0:
        cells.append((small_obs, small_exp))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    return float(chi2.sf(stat, len(cells) - 1))


def _exact_two_token_probs(sampler, target, prompt):
    def dist(ctx):
        c = sampler.candidates(target(ctx), ctx)
        return dict(zip(c.ids.tolist(), probabilities(c).tolist()))

    return {(a, b): pa * pb for a, pa in dist(prompt).items() for b, pb in dist(prompt + [a]).items()}


@pytest.fixture(scope="module")
def chi2_models(model_dir):
    target = edgellm.LLM(model_path(model_dir, "llama", seed=1), n_ctx=64, n_threads=1)
    draft = edgellm.LLM(model_path(model_dir, "llama", QType.Q4_0, seed=2), n_ctx=64, n_threads=1)
    return target, draft


N_SAMPLES = 4000
ALPHA = 1e-6  # a correct rule fails this once in a million seeds; the wrong ones here reach 1e-15


@pytest.mark.parametrize("drafter", ["lookup", "model"])
def test_sampling_keeps_the_target_distribution(chi2_models, drafter, monkeypatch):
    """Chi-square goodness of fit of the first two generated tokens (the accepted draft, the
    correction or bonus after it, and the next step's) against the target's exact joint
    distribution, on tiny models whose top-6 sets differ; then the same test with a wrong rule
    (on rejection, draw from p instead of the residual) must fail."""
    target_llm, draft_llm = chi2_models
    target, draft = _Logits(target_llm), _Logits(draft_llm)
    prompt = [1, 50, 60, 70]
    sampler = Sampler(replace_seed(PARAMS, 123), target_llm.n_vocab)
    spec = Speculative(draft_llm if drafter == "model" else "lookup", max_draft=2, adaptive=False)
    exact = _exact_two_token_probs(sampler, target, prompt)

    def pvalue():
        state = sp.SpecState(target_llm, spec, replace_seed(PARAMS, 321))
        counts: dict = {}
        for _ in range(N_SAMPLES):
            key = _two_tokens(state, sampler, target, draft if drafter == "model" else None, prompt)
            counts[key] = counts.get(key, 0) + 1
        return _chi2_pvalue(counts, exact, N_SAMPLES), state

    p, state = pvalue()
    assert p > ALPHA
    check_drafts_were_tested(state.drafted, state.accepted)
    if drafter == "model":
        def wrong(sampler, logits, history, d, q, p=None):  # resamples from p, not from max(0, p - q)
            c = sampler.candidates(logits, history)
            p = probabilities(c)
            pd, qd = float(p[c.ids == d].sum()), float(q[1][q[0] == d].sum())
            if sampler.rng.random() * qd < pd:
                return d
            return int(c.ids[sp._draw_index(p, sampler.rng)])

        monkeypatch.setattr(sp, "accept_or_resample", wrong)
    else:
        def wrong_verify(self, sampler, rows, history, drafts, **kw):  # takes the guess half the time
            if sampler.rng.random() < 0.5:
                return [drafts[0]], 1
            return [sampler.sample(rows[0], history)], 0

        monkeypatch.setattr(sp.SpecState, "verify", wrong_verify)
    assert pvalue()[0] < ALPHA


def replace_seed(params, seed):
    return SamplingParams(**{**params.__dict__, "seed": seed})


# -- context shift, stop strings, limits ------------------------------------------------------

def _plain_invariant(llm, ids, n):
    """Greedy decoding on the batch-invariant path through a session, shifting the context when
    it is full as generate() does: the reference for speculation through a context shift."""
    s = llm.session()
    s._set_llama_order(False)
    logits, out = s._prefill(ids), []
    for _ in range(n):
        tok = int(np.argmax(logits))
        out.append(tok)
        if len(s) >= s.n_ctx:
            s._make_room(1)
        logits = s._feed([tok])
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_context_shift_gives_the_same_text(model_dir, arch, monkeypatch):
    """A 64-token context, 150 tokens generated: shifts (gemma3: with its sliding window) happen
    between and inside drafted stretches; the text is that of decoding without drafts."""
    from edgellm.tokenizer import Tokenizer

    monkeypatch.setattr(Tokenizer, "eog_ids", frozenset())  # no end of text: 150 tokens, two shifts
    llm = edgellm.LLM(model_path(model_dir, arch), n_ctx=64, n_batch=32, n_threads=2)
    draft = edgellm.LLM(model_path(model_dir, arch, QType.Q4_0), n_ctx=64, n_batch=32, n_threads=2)
    ids = tiny_prompts(1)[3]
    ref = llm.detokenize(_plain_invariant(llm, ids, 150))
    for how in ("lookup", draft):
        text = llm.generate(ids, max_tokens=150, temperature=0, speculative=Speculative(how, **EVERY_STEP))
        assert text == ref
        st = llm.last_stats
        assert st.generated_tokens == 150 and st.accepted_tokens > 0


def test_stop_strings_give_the_same_text(model_dir):
    """A stop string in the middle of a drafted stretch cuts the text where it cuts without
    speculation (generate and the batched engine); eos and max_tokens too."""
    llm = edgellm.LLM(model_path(model_dir, "gemma3"), n_ctx=128, n_batch=32, n_threads=2)
    ps = tiny_prompts(2)
    _, full, _ = engine_run(llm, ps, max_tokens=40)
    for p, text in zip(ps, full):
        stop = text[len(text) // 2: len(text) // 2 + 3]
        if not stop.strip():
            continue
        _, want, _ = engine_run(llm, [p], max_tokens=40, stop=[stop])
        spec = Speculative("lookup", **EVERY_STEP)
        _, got, _ = engine_run(llm, [p], max_tokens=40, stop=[stop], speculative=spec)
        assert got == want
        assert llm.generate(p, max_tokens=40, temperature=0, stop=[stop], speculative=spec) == want[0]
    for n in (1, 2, 5):  # a limit inside a drafted stretch
        _, want, _ = engine_run(llm, ps, max_tokens=n)
        _, got, _ = engine_run(llm, ps, max_tokens=n, speculative=Speculative("lookup", **EVERY_STEP))
        assert got == want


# -- draft models that cannot serve -----------------------------------------------------------

def test_draft_with_another_vocabulary_is_refused(model_dir, monkeypatch, tmp_path):
    llm = edgellm.LLM(model_path(model_dir, "llama"), n_ctx=64, n_threads=1)
    toks, scores, types = tiny_models.vocab()
    monkeypatch.setattr(tiny_models, "vocab", lambda: (toks[:-1] + ["<|other|>"], scores, types))
    other_text = tiny_model(tmp_path / "other-text.gguf", "llama")
    monkeypatch.undo()
    with pytest.raises(DraftModelError, match=r"another vocabulary: token \d+ is '<\|other\|>'"):
        llm.generate([1, 5], max_tokens=2, speculative=other_text)
    orig = tiny_models.write_gguf

    def other_eos(path, md, t, arch):
        return orig(path, {**md, "tokenizer.ggml.eos_token_id": (VT.UINT32, 0)}, t, arch=arch)

    monkeypatch.setattr(tiny_models, "write_gguf", other_eos)
    eos = tiny_model(tmp_path / "other-eos.gguf", "llama")
    with pytest.raises(DraftModelError, match="other special tokens: eos"):
        BatchEngine(llm, speculative=eos)
    with pytest.raises(DraftModelError, match="vocabulary of 262144 tokens"):
        BatchEngine(llm).submit([1, 5], speculative=edgellm.LLM("gemma3-270m", n_ctx=64, n_threads=1))
    with pytest.raises(TypeError):
        llm.generate([1, 5], speculative=3)
    with pytest.raises(ValueError, match="max_draft"):
        Speculative("lookup", max_draft=0)


# -- the parts --------------------------------------------------------------------------------

def test_lookup_proposes_what_followed_the_longest_match():
    d = sp.LookupDrafter()
    h = [5, 1, 2, 3, 9, 1, 2, 3, 7, 8, 4, 1, 2, 3]
    m, e = d.match(h)
    assert (m, e) == (3, 8) and d.draft(e, 3) == [7, 8, 4]  # [1, 2, 3] last seen before 7
    h = h + [7, 8, 4, 2, 3]  # appended: the index grows with it
    m, e = d.match(h)
    assert m == 2 and d.draft(e, 2) == [7, 8]  # [2, 3]'s latest earlier occurrence
    assert d.match([6, 6, 6]) == (2, 2) and d.draft(2, 4) == [6, 6, 6, 6]  # copies on into itself
    assert d.match([1, 2, 3, 4]) == (0, -1)
    # [1, 2, 3, 4] twice before: the earlier one is preceded by [7, 8] as the end is, so its
    # match is 6 tokens long against 4 for the latest (preceded by 9), and it proposes 50
    h = [7, 8, 1, 2, 3, 4, 50, 9, 1, 2, 3, 4, 60, 7, 8, 1, 2, 3, 4]
    m, e = d.match(h)
    assert (m, e) == (6, 6) and d.draft(e, 2) == [50, 9]
    # equal matches: the latest; a repeating pattern's match runs back to the cap
    h = [3, 4, 5, 6] * 30
    m, e = d.match(h)
    assert e == len(h) - 4 and m == sp.LookupDrafter.MATCH_CAP and d.draft(e, 6) == [3, 4, 5, 6, 3, 4]


def test_step_costs():
    c = sp.StepCosts()
    assert [c.predict(r) for r in (1, 2, 5)] == pytest.approx([1.0, 1.35, 2.4])  # the prior line, relative
    c = sp.StepCosts.known([0.010, 0.012, 0.014, 0.016, 0.023, 0.026, 0.028, 0.031, 0.038])
    ms = lambda r: 1000 * c.predict(r)  # noqa: E731
    assert [ms(r) for r in (1, 2, 3, 4, 5, 8, 9)] == pytest.approx([10, 12, 14, 16, 23, 31, 38])
    c = sp.StepCosts()
    for rows, t in {1: 10, 2: 12, 4: 16, 5: 23, 8: 31, 9: 38}.items():  # each after a one-row step
        c.observe(1, 0.010)
        c.observe(rows, t / 1000)
    c.observe(1, 0.010)
    # measured rows as measured, others interpolated, past the last at the mean per row of 1..9
    assert [ms(r) for r in (1, 2, 3, 4, 5, 8, 9)] == pytest.approx([10, 12, 14, 16, 23, 31, 38])
    assert ms(6) == pytest.approx(23 + 8 / 3) and ms(11) == pytest.approx(38 + 2 * 28 / 8)
    c.observe(3, 0.011)  # noise: a step of more rows never costs less
    c.observe(1, 0.010)
    assert ms(3) == pytest.approx(12)
    for _ in range(40):  # a row count's cost is the median of its last WINDOW ratios
        c.observe(2, 0.020)
        c.observe(1, 0.010)
    assert ms(2) == pytest.approx(20) and ms(3) == ms(2)
    c.observe(2, 1.0)  # so a step stalled by the machine does not move it
    c.observe(1, 0.010)
    assert ms(2) == pytest.approx(20)
    for _ in range(5):  # the machine slows one-row steps down: every row count follows them
        c.observe(1, 0.020)
    assert ms(1) == pytest.approx(20) and ms(2) == pytest.approx(40) and ms(8) == pytest.approx(62)
    # a ratio is a step over its one-row neighbours: the load changing between the one-row
    # steps before and after a stretch of multi-row steps moves no ratio
    c = sp.StepCosts.known([0.010, 0.012, 0.014, 0.016, 0.023])
    for one in (0.010, 0.010, 0.010, 0.010, 0.010, 0.030, 0.030):
        c.observe(1, one)
    c.observe(4, 0.048)  # 1.6 x the one-row steps of its time (30 ms), 4.8 x the median (10 ms)
    c.observe(4, 0.048)
    c.observe(1, 0.030)
    assert c.shape(4) == pytest.approx(1.6)
    # multi-row steps more than MAX_GAP steps from a one-row step before them: not timed
    for _ in range(sp.StepCosts.MAX_GAP + 1):
        c.observe(5, 0.500)
    c.observe(1, 0.030)
    assert c.shape(5) == pytest.approx(2.3)


def test_step_costs_calibrate_on_an_engine(model_dir):
    """Calibration times steps on the engine without touching the sequence it follows (a fork)
    or keeping blocks; its shape starts at 1 and never falls."""
    llm = edgellm.LLM(model_path(model_dir, "llama"), n_ctx=128, n_batch=32, n_threads=2)
    s = edgellm.api.Session(llm)
    s._set_llama_order(False)
    s._prefill(list(range(3, 40)))
    held, blocks = s.tokens, llm._pool.blocks_in_use()
    c = sp.StepCosts()
    c.calibrate(llm, 9, s._seq)
    assert c.calibrated and len(c.ones) > 0
    assert set(c.ratios) == set(range(2, 10))  # every row count up to 9 (a tiny model: time for all)
    t = [c.predict(r) for r in range(1, 12)]
    assert t[0] > 0 and all(b >= a for a, b in zip(t, t[1:]))
    assert s.tokens == held and llm._pool.blocks_in_use() == blocks
    before = {r: list(q) for r, q in c.ratios.items()}
    c.calibrate(llm, 9)  # once per engine
    assert {r: list(q) for r, q in c.ratios.items()} == before
    small = edgellm.LLM(model_path(model_dir, "llama"), n_ctx=128, n_batch=4, n_threads=2)
    c = sp.StepCosts()
    c.calibrate(small, 17)
    assert set(c.ratios) == {2, 3, 4}  # steps of at most n_batch rows


def test_controller():
    cheap = lambda k: 1.0 + 0.1 * k  # noqa: E731
    dear = lambda k: 1.0 + 0.9 * k  # noqa: E731

    def along(ctl, m):  # prompt lookup's rates: draft j extends a match of m by j
        return lambda j: ctl.alpha(m + j)

    ctl = sp.Controller([0], [0.9], k_max=16, adaptive=True, probes=True)
    assert 4 <= ctl.choose(along(ctl, 0), 16, cheap) <= 16  # cheap rows, good guesses: long drafts
    assert ctl.choose(along(ctl, 0), 16, dear) <= 2  # rows almost as dear as a step: short ones
    assert ctl.choose(along(ctl, 0), 5, cheap) == 5  # (within the limit)
    for _ in range(20):
        ctl.observe([0] * 4, 0)  # nothing taken: drafting stops...
    assert ctl.alpha(0) < 0.1 and ctl.overall < 0.1
    assert ctl.choose(along(ctl, 0), 16, cheap) == 0
    ctl = sp.Controller([0], [0.02], k_max=16, adaptive=True, probes=True)
    picks = [ctl.choose(along(ctl, 0), 16, cheap) for _ in range(sp.Controller.PROBE_FIRST)]
    assert picks[:-1] == [0] * (len(picks) - 1) and picks[-1] == 2  # ...but is probed now and then
    assert sp.Controller([0], [0.9], k_max=3, adaptive=False, probes=False).choose(along(ctl, 0), 10, dear) == 3
    # rates by match length: a draft extends its match, so the rate of draft j is that of m + j
    ctl = sp.Controller([1, 4, 8], [0.1, 0.5, 0.99], k_max=16, adaptive=True, probes=False)
    assert ctl.choose(along(ctl, 1), 16, cheap) == 0 and ctl.choose(along(ctl, 8), 16, cheap) == 16
    assert ctl.choose(along(ctl, 6), 16, cheap) >= 12  # two weak drafts are worth it for the strong ones after them
    assert ctl.choose(along(ctl, 4), 16, cheap) <= 4  # four are not
    ctl.observe(range(6, 11), 3)  # drafts on matches of 6, 7, 8 taken, of 9 refused, of 10 unseen
    assert ctl.acc[1] == pytest.approx([0.5 * 4 * 0.9 ** 2 + 0.9 + 1, 0.5 * 4 * 0.9 ** 2])
    assert ctl.acc[2] == pytest.approx([0.99 * 4 * 0.9 ** 2 + 0.9, 0.01 * 4 * 0.9 ** 2 + 1])
    assert ctl.acc[0] == pytest.approx([0.1 * 4, 0.9 * 4])
    # a staircase of costs: the draft length that fills a tile
    stairs = lambda k: (1.0, 1.2, 1.4, 1.6, 2.3, 2.5, 2.7, 2.9, 3.6)[k]  # noqa: E731
    ctl = sp.Controller([0], [0.9], k_max=8, adaptive=True, probes=False)
    assert ctl.choose(along(ctl, 0), 8, stairs) in (3, 7)


def test_controller_stops_a_draft_model_where_its_confidence_drops():
    """A draft model drafts one token at a time while drafting on promises more tokens per
    second than verifying what it has: confident drafts go on, an unsure one stops them."""
    ctl = sp.Controller(range(10), [(i + 0.5) / 10 for i in range(10)], k_max=8, adaptive=True, probes=True,
                        overall=0.8)
    cost = lambda k: 1.0 + 0.3 * k  # noqa: E731  (a row and a draft step)
    sure, unsure = ctl.alpha(9), ctl.alpha(1)
    assert ctl.worth_more([], 8, cost) and ctl.worth_more([sure] * 3, 8, cost)
    assert not ctl.worth_more([sure, unsure], 8, cost)
    assert not ctl.worth_more([sure] * 8, 8, cost)  # (the limit)
    assert sp.Controller([0], [0.1], k_max=8, adaptive=False, probes=False).worth_more([0.1] * 3, 8, cost)
    ctl.observe([1, 1, 1, 1], 4)  # unsure drafts all taken: the rate of their bucket rises
    assert ctl.alpha(1) > unsure + 0.3
    # the confidences a draft model gives its drafts (greedy: its argmax's probability)
    d = sp.ModelDrafter.__new__(sp.ModelDrafter)
    d.greedy, d.drafts, d.q, d.keys = True, [], [], []
    d.sampler = Sampler(GREEDY, 4)
    d.choose(np.log(np.array([0.05, 0.9, 0.03, 0.02], np.float32)), [])
    d.choose(np.log(np.array([0.35, 0.2, 0.25, 0.2], np.float32)), [])
    assert d.drafts == [1, 0] and d.keys == [9, 3]


def test_draft_model_drafts_only_while_its_steps_pay(model_dir):
    """A draft model drafts while its drafting steps, timed whole (its catch-up and steps, the
    target's step, sampling), give at least as many tokens per second as plain steps, whatever
    the step costs promise; switched off it is probed now and then, and while it drafts a plain
    step is timed again every REFRESH steps (the load changes)."""
    llm = edgellm.LLM(model_path(model_dir, "llama"), n_ctx=128, n_batch=32, n_threads=2)
    draft = edgellm.LLM(model_path(model_dir, "llama", QType.Q4_0), n_ctx=128, n_batch=32, n_threads=2)
    st = sp.SpecState(llm, Speculative(draft, with_lookup=False), GREEDY)
    st.costs = sp.StepCosts.known([0.010 + 0.001 * (rows - 1) for rows in range(1, 10)])  # cheap rows
    sp.costs_for(draft).observe_drafts(0.004, 4)  # and 1 ms drafts: the step costs say drafting pays
    h = [1, 7, 9, 11, 13]
    plan = lambda: st._plan(h, len(h), 8, 1, 0)  # noqa: E731
    assert plan() == 8  # (the most; worth_more stops it earlier)

    def drafting(seconds, tokens, n=1):
        for _ in range(n):
            st._by_lookup = False
            st.observe_step(seconds, 3, tokens)

    drafting(0.030, 2, sp.SpecState.MIN_RUNS - 1)  # 67 tokens/s, plain steps 100 (the step costs')
    assert st.model_pays() and plan() == 8  # (too few to judge by)
    drafting(0.030, 2)
    assert not st.model_pays()
    picks = [plan() for _ in range(sp.Controller.PROBE_FIRST)]
    assert picks == [0] * (sp.Controller.PROBE_FIRST - 1) + [8]  # off, but probed
    for _ in range(3):
        st.observe_step(0.025, 0, 1)  # plain steps timed slower (40 tokens/s): drafting pays
    assert st.model_pays() and plan() == 8
    drafting(0.030, 2, sp.SpecState.REFRESH - 1)
    assert plan() == 8
    drafting(0.030, 2)
    assert plan() == 0  # REFRESH drafting steps: a plain one
    st.observe_step(0.025, 0, 1)
    assert plan() == 8
    drafting(0.020, 1, sp.SpecState.GUARD_WINDOW)  # the last GUARD_WINDOW: 50 tokens/s, plain 40
    assert st.model_pays()
    drafting(0.030, 1, sp.SpecState.GUARD_WINDOW // 2 + 1)  # 33 tokens/s over the window's last
    assert not st.model_pays()
    assert Speculative(draft, adaptive=False).adaptive is False
    fixed = sp.SpecState(llm, Speculative(draft, adaptive=False), GREEDY)
    fixed._model_runs.extend([(1.0, 1)] * sp.SpecState.GUARD_WINDOW)  # fixed lengths: drafts whatever the timings
    assert fixed._plan(h, len(h), 8, 1, 0) == 8
    st.close()
    fixed.close()


def test_probes_wait_in_proportion_to_what_they_cost(model_dir):
    """A switched-off draft model's probe is timed: what it took beyond the plain steps its
    tokens replace is its loss, and the next probe waits until that loss is PROBE_BUDGET of the
    plain steps' time in between (and at least the doubling schedule's steps)."""
    llm = edgellm.LLM(model_path(model_dir, "llama"), n_ctx=128, n_batch=32, n_threads=2)
    draft = edgellm.LLM(model_path(model_dir, "llama", QType.Q4_0), n_ctx=128, n_batch=32, n_threads=2)
    st = sp.SpecState(llm, Speculative(draft, with_lookup=False), GREEDY)
    st.costs = sp.StepCosts.known([0.010 + 0.008 * (rows - 1) for rows in range(1, 10)])  # costly rows
    sp.costs_for(draft).observe_drafts(0.008, 1)  # and costly drafts: the step costs say no
    h = [1, 7, 9, 11, 13]
    plan = lambda: st._plan(h, len(h), 8, 1, 0)  # noqa: E731

    def until_probe():
        n = 0
        while True:
            n += 1
            k = plan()
            if k:
                assert st._probing
                return n
            assert not st._probing
            st.observe_step(0.010, 0, 1)

    assert until_probe() == sp.Controller.PROBE_FIRST  # no probe measured yet: the schedule
    st._by_lookup = False
    st.observe_step(0.040, 2, 1)  # 30 ms beyond the 10 ms plain step its token replaces
    gap = int(0.030 / (sp.SpecState.PROBE_BUDGET * 0.010)) + 1
    assert gap > 2 * sp.Controller.PROBE_FIRST
    assert until_probe() == gap
    st.observe_step(0.012, 2, 2)  # a probe that paid: no loss; the median of the last losses
    assert until_probe() == max(2 * 2 * sp.Controller.PROBE_FIRST, int(0.015 / (sp.SpecState.PROBE_BUDGET * 0.010)) + 1)
    st.close()


def test_draft_model_catches_up_on_a_window(model_dir, monkeypatch):
    """A draft model that fell more than CATCH_UP_WINDOW tokens behind evaluates only the last
    CATCH_UP_WINDOW: its sequence then holds the context with a gap, which later catch-ups,
    rejected drafts and context shifts map through; drafts made so are verified as any, so the
    text is greedy decoding's."""
    llm = edgellm.LLM(model_path(model_dir, "llama"), n_ctx=128, n_batch=32, n_threads=2)
    draft = edgellm.LLM(model_path(model_dir, "llama", QType.Q4_0), n_ctx=128, n_batch=32, n_threads=2)
    W = sp.CATCH_UP_WINDOW
    d = sp.ModelDrafter(draft, GREEDY)
    ctx = [1] + [3 + (7 * i) % 250 for i in range(60)]

    def feed(todo):
        from edgellm.batch import LOGITS_NONE, Step

        draft._pool.reserve(d.seq, len(todo))
        step = Step()
        step.add(d.seq, todo, LOGITS_NONE)
        step.run(draft._engine, draft._pool)

    d.prefill(ctx[:10])
    assert d.seq.tokens == ctx[:10]
    with draft._engine_lock:
        assert d._catch_up(ctx[:10 + W], window=True) == ctx[10:10 + W]  # (W tokens: no gap yet)
        todo = d._catch_up(ctx[:40], window=True)
        assert todo == ctx[40 - W:40] and (d.base, d.skip) == (10, 40 - W - 10)
        feed(todo + [251, 252])  # the context's last token and two drafts
        assert d.seq.tokens == ctx[:10] + ctx[40 - W:40] + [251, 252]
        assert d._catch_up(ctx[:40] + [251, 5], window=True) == [5]  # one draft taken, the next not
        assert d.seq.tokens == ctx[:10] + ctx[40 - W:40] + [251]
        other = ctx[:38] + [253, 254, 255]  # a context that parts from it inside the window
        assert d._catch_up(other, window=True) == [253, 254, 255]
        assert d.seq.tokens == ctx[:10] + ctx[40 - W:38]
        assert d._catch_up(other) == [253, 254, 255]  # (no window: the same, a short catch-up)
    d.shift(1, 4)  # the target dropped tokens: the gapped sequence starts over
    assert d.seq.n == 0 and (d.base, d.skip) == (0, 0)
    with draft._engine_lock:
        assert d._catch_up(ctx[:5]) == ctx[:5]
    d.close()

    monkeypatch.setattr(sp, "CATCH_UP_WINDOW", 1)  # every catch-up of 2 tokens (all drafts taken) gapped
    for ids in tiny_prompts(1)[2:]:
        ref = llm.generate(ids, max_tokens=32, temperature=0)
        for spec in (Speculative(draft, **EVERY_STEP), Speculative(draft)):
            assert llm.generate(ids, max_tokens=32, temperature=0, speculative=spec) == ref
            if not spec.adaptive:
                check_drafts_were_tested(llm.last_stats.draft_tokens, llm.last_stats.accepted_tokens)


def test_batch_engine_times_speculating_steps(model_dir, monkeypatch):
    """The batched engine gives each speculating request's whole steps (drafting to sampling)
    and the tokens they gave it to its SpecState.observe_step, as generate() does: what
    model_pays judges a draft model by, in the server too."""
    llm = edgellm.LLM(model_path(model_dir, "llama"), n_ctx=512, n_batch=32, n_threads=2)
    draft = edgellm.LLM(model_path(model_dir, "llama", QType.Q4_0), n_ctx=512, n_batch=32, n_threads=2)
    calls = []
    observe = sp.SpecState.observe_step

    def spy(self, seconds, drafted, tokens):
        calls.append((self, seconds, drafted, tokens))
        observe(self, seconds, drafted, tokens)

    monkeypatch.setattr(sp.SpecState, "observe_step", spy)
    prompts = tiny_prompts(2)
    eng = BatchEngine(llm, max_seqs=len(prompts))
    reqs = [eng.submit(p, max_tokens=24, sampling=GREEDY, speculative=Speculative(draft)) for p in prompts]
    eng.run_until_done(reqs)
    assert eng.preemptions == 0  # (a preempted request's next token comes from its prompt step again)
    for r in reqs:
        assert r.error is None, r.error
        mine = [c for c in calls if c[0] is r.spec]
        # every token after the prompt step's came from a timed step of this request
        assert sum(c[3] for c in mine) == len(r.generated) - 1 and all(c[1] > 0 for c in mine)


def test_draft_model_takes_lookup_drafts_where_they_promise_more(model_dir):
    """With a draft model (adaptive), a step takes prompt lookup's drafts where a long match
    promises more than the draft model (whose steps cost), the draft model's elsewhere; the
    text is greedy decoding's either way."""
    llm = edgellm.LLM(model_path(model_dir, "llama"), n_ctx=128, n_batch=32, n_threads=2)
    draft = edgellm.LLM(model_path(model_dir, "llama", QType.Q4_0), n_ctx=128, n_batch=32, n_threads=2)
    st = sp.SpecState(llm, Speculative(draft), GREEDY)
    st.costs = sp.StepCosts.known([0.010 + 0.001 * (rows - 1) for rows in range(1, 10)])
    dc = sp.costs_for(draft)
    dc.calibrated = True
    dc.observe(1, 0.004)
    h = [1] + [40, 41, 42, 43, 44, 45] * 3
    drafts = sp.propose([(st, h, h, 8)])[0]
    assert st._by_lookup and drafts == [40, 41, 42, 43, 44, 45, 40, 41]
    h = [1, 7, 9, 11, 13]  # no match: the draft model's
    drafts = sp.propose([(st, h, h, 8)])[0]
    assert not st._by_lookup and 1 <= len(drafts) <= 8 and drafts == st.model.drafts
    st.close()
    fixed = sp.SpecState(llm, Speculative(draft, adaptive=False), GREEDY)
    assert fixed.lookup is None  # fixed lengths: the draft model's drafts only
    p = tiny_prompts(1)[2]
    ref = llm.generate(p, max_tokens=24, temperature=0)
    assert llm.generate(p, max_tokens=24, temperature=0, speculative=Speculative(draft)) == ref
    assert llm.last_stats.draft_tokens > 0


def test_usage_and_stats_report_drafts(model_dir):
    llm = edgellm.LLM(model_path(model_dir, "llama"), n_ctx=128, n_batch=32, n_threads=2)
    p = tiny_prompts(1)[3]
    llm.generate(p, max_tokens=20, temperature=0, speculative=Speculative("lookup", **EVERY_STEP))
    st = llm.last_stats
    assert st.verify_steps > 0 and st.draft_tokens >= st.accepted_tokens > 0
    assert st.mean_accepted == st.accepted_tokens / st.verify_steps
    llm.generate(p, max_tokens=20, temperature=0)
    assert llm.last_stats.draft_tokens == 0
    # not adaptive: whether drafting pays depends on the step times measured (a loaded machine
    # can make the adaptive controller draft nothing, which failed this check once)
    _, _, eng = engine_run(llm, [p], speculative=Speculative("lookup", **EVERY_STEP), max_tokens=20)
    u = eng.stats()
    assert u["draft_tokens"] >= u["accepted_tokens"] > 0


# -- the command line -------------------------------------------------------------------------

def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "edgellm", *args], capture_output=True, text=True, timeout=600)


def test_cli_lookup_and_draft(model_dir, tmp_path, monkeypatch):
    """`generate --lookup -v` prints generate(speculative="lookup")'s text and the draft counts;
    `run --draft` answers; a draft with another vocabulary, or both options, is one line."""
    path = model_path(model_dir, "llama")
    prompt = "the cat sat on the mat the cat sat on the"
    r = _cli("generate", str(path), "-p", prompt, "-n", "12", "--temp", "0", "--lookup", "--draft-max", "4", "-v")
    assert r.returncode == 0, r.stderr
    llm = edgellm.LLM(path)
    want = llm.generate(prompt, max_tokens=12, temperature=0, speculative=Speculative("lookup", max_draft=4))
    assert r.stdout == want + "\n"
    assert "drafts:" in r.stderr and "accepted" in r.stderr
    draft = model_path(model_dir, "llama", QType.Q4_0)
    r = subprocess_run_chat(path, "--draft", str(draft), "-v")
    assert r.returncode == 0 and "drafts:" in r.stderr, r.stderr
    toks, scores, types = tiny_models.vocab()
    monkeypatch.setattr(tiny_models, "vocab", lambda: (toks[:-1] + ["<|other|>"], scores, types))
    other = tiny_model(tmp_path / "other.gguf", "llama")
    for args, says in ((["--draft", str(other)], "another vocabulary"), (["--lookup", "--draft", str(draft)], "not both")):
        r = _cli("generate", str(path), "-p", "the cat", "-n", "4", *args)
        assert r.returncode != 0 and "Traceback" not in r.stderr
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error")]
        assert len(errors) == 1 and says in errors[0], r.stderr


def subprocess_run_chat(path, *args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "edgellm", "run", str(path), "-n", "8", "--temp", "0", *args],
                          input="the cat sat on the mat\n/exit\n", capture_output=True, text=True, timeout=600)


# -- under a constraint (grammar, JSON schema, regex) -----------------------------------------

JSON_RECORD = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
               "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                              "city": {"type": "string", "maxLength": 24}}}
RECORD_PROMPTS = ["Alice Smith is 31 and lives in Paris. Write her record as JSON.",
                  "Copy this out as JSON: name Tom the cat, age 4, city Oslo; name Tom the cat, age 4.",
                  "A person from Rome, as JSON."]


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return edgellm.LLM(smollm2_path, n_ctx=512, n_threads=2)


def _record_prompts(llm):
    return [llm.chat_tokens(llm.template.render([{"role": "user", "content": p}], add_generation_prompt=True))
            for p in RECORD_PROMPTS]


def _constrained_run(llm, prompts, grammar, params, speculative=None, max_tokens=40):
    eng = BatchEngine(llm, max_seqs=len(prompts))
    reqs = [eng.submit(p, max_tokens=max_tokens, sampling=params, grammar=grammar, speculative=speculative)
            for p in prompts]
    eng.run_until_done(reqs)
    for r in reqs:
        assert r.error is None, r.error
    return [r.generated for r in reqs], [r.finish_reason for r in reqs], eng.stats()


@pytest.mark.real
def test_greedy_equal_under_a_json_schema(smollm2, smollm2_q4_0):
    """With a JSON schema, drafts are cut to what the grammar allows and the rows sampled under
    it, the tokens it forces appended: greedy tokens equal constrained decoding without
    speculation, in BatchEngine (prompt lookup and a draft model) and through generate()."""
    from edgellm.constrain import Grammar

    llm = smollm2
    ps = _record_prompts(llm)
    g = Grammar.from_json_schema(JSON_RECORD)
    ref, ref_finish, _ = _constrained_run(llm, ps, g, GREEDY)
    draft = edgellm.LLM(smollm2_q4_0, n_ctx=512, n_threads=2)
    for how in ("lookup", draft):
        got, finish, st = _constrained_run(llm, ps, g, GREEDY, Speculative(how, **EVERY_STEP))
        assert got == ref and finish == ref_finish, how
        check_drafts_were_tested(st["draft_tokens"], st["accepted_tokens"])
    text = llm.generate(ps[1], max_tokens=40, temperature=0, json_schema=JSON_RECORD,
                        speculative=Speculative("lookup", **EVERY_STEP))
    assert text == llm.detokenize(ref[1])
    s = llm.last_stats
    assert s.forced_tokens > 0 and s.draft_tokens > 0
    assert s.stop_reason == ("grammar" if ref_finish[1] == "stop" else "length")


@pytest.mark.real
def test_seeded_lookup_under_a_grammar_gives_the_seeds_text(smollm2):
    """Prompt lookup with sampling under a grammar draws every token as constrained decoding
    does (the same draws, the same redraws from the masked logits): a seed's tokens."""
    from edgellm.constrain import Grammar

    ps = _record_prompts(smollm2)
    g = Grammar.from_json_schema(JSON_RECORD)
    params = SamplingParams(temperature=0.7, top_k=20, seed=9)
    ref, _, _ = _constrained_run(smollm2, ps, g, params)
    got, _, st = _constrained_run(smollm2, ps, g, params, Speculative("lookup", **EVERY_STEP))
    assert got == ref
    check_drafts_were_tested(st["draft_tokens"], st["accepted_tokens"])


@pytest.mark.real
def test_guided_distribution_and_the_rule_under_a_grammar(smollm2):
    """Guide.distribution is what Guide.sample draws (a free draw kept when the grammar allows
    it, else a masked draw: not the masked distribution alone), and the acceptance rule with it
    and any draft distribution q gives that distribution (chi-square); a wrong p fails."""
    from edgellm.constrain import Grammar, Guide

    tok = smollm2.tokenizer
    ids = {c: smollm2.tokenize(c, add_bos=False) for c in "abc123456"}
    assert all(len(v) == 1 for v in ids.values())
    ids = {c: v[0] for c, v in ids.items()}
    logits = np.full(smollm2.n_vocab, -10.0, dtype=np.float32)
    for c, v in zip("abc123456", (6.0, 5.5, 5.0, 4.8, 4.6, 4.4, 4.2, 4.2, 4.2)):
        logits[ids[c]] = v  # top-6 unconstrained: a b c 1 2 3; allowed (digits): 1 .. 6
    guide = Guide(Grammar.from_regex("[0-9]+").constraint(tok))
    params = SamplingParams(temperature=1.0, top_k=6, top_p=1.0, min_p=0.0, seed=5)
    sampler = Sampler(params, smollm2.n_vocab)
    pi, pp = guide.distribution(sampler, logits, [])
    exact = dict(zip(pi.tolist(), pp.tolist()))
    assert set(exact) == {ids[c] for c in "123456"} and abs(sum(exact.values()) - 1) < 1e-9

    def count(draw):
        out: dict = {}
        for _ in range(N_SAMPLES):
            t = draw()
            out[t] = out.get(t, 0) + 1
        return out

    sampled = count(lambda: guide.sample(sampler, logits, []))
    assert _chi2_pvalue(sampled, exact, N_SAMPLES) > ALPHA
    m = sampler.candidates(masked_logits_of(guide, logits), [])
    naive = dict(zip(m.ids.tolist(), probabilities(m).tolist()))  # the masked draw alone
    assert _chi2_pvalue(sampled, naive, N_SAMPLES) < ALPHA
    q = (np.array([ids[c] for c in "a1246"]), np.array([0.3, 0.1, 0.2, 0.25, 0.15]))
    rng = np.random.default_rng(3)

    def speculated():
        d = int(rng.choice(q[0], p=q[1]))
        return sp.accept_or_resample(sampler, logits, [], d, q, (pi, pp))

    assert _chi2_pvalue(count(speculated), exact, N_SAMPLES) > ALPHA


def masked_logits_of(guide, logits):
    from edgellm.constrain import masked_logits

    return masked_logits(logits, guide.constraint.compute_mask())


@pytest.mark.real
def test_drafts_are_cut_where_the_grammar_stops_allowing_them(smollm2):
    from edgellm.constrain import Grammar

    c = Grammar.from_regex("[0-9]+").constraint(smollm2.tokenizer)
    digits = [smollm2.tokenize(x, add_bos=False)[0] for x in "12"]
    letter = smollm2.tokenize("a", add_bos=False)[0]
    assert c.valid_prefix(digits + [letter] + digits) == 2 and c.valid_prefix([letter]) == 0
    c.accept(digits[0])
    c.accept(digits[1])
    c.rollback(2)
    assert c.valid_prefix([letter]) == 0 and c.valid_prefix(digits) == 2  # back at the start


@pytest.mark.real
def test_cli_lookup_with_a_json_schema(smollm2_path, smollm2):
    import json

    prompt = 'Copy: {"name": "Alice Smith", "age": 31, "city": "Paris"}\nCopy: '
    r = _cli("generate", str(smollm2_path), "-p", prompt, "-n", "40", "--temp", "0", "--lookup", "-t", "2",
             "--json-schema", json.dumps(JSON_RECORD), "-v")
    assert r.returncode == 0, r.stderr
    assert r.stdout == smollm2.generate(prompt, max_tokens=40, temperature=0, json_schema=JSON_RECORD,
                                        speculative="lookup") + "\n"
    assert json.loads(r.stdout) and "drafts:" in r.stderr


# -- the server -------------------------------------------------------------------------------

def test_server_speculates_per_request_and_by_default(model_dir):
    """`edgellm serve --draft`: a request's `speculative` ("none", "lookup", "draft"; absent:
    the server's draft model) gives the greedy text of "none", and usage reports accepted and
    rejected drafts as OpenAI's predicted-output counts; a bad value is a 400 naming the field."""
    from server_process import ServerProcess

    path = model_path(model_dir, "llama")
    draft = model_path(model_dir, "llama", QType.Q4_0)
    srv = ServerProcess(path, "--draft", str(draft), "--draft-max", "4", "-c", "128", "--parallel", "2", "-t", "1")
    try:
        model = path.stem

        def complete(prompt, **extra):
            status, _, body = srv.request("POST", "/v1/completions", {"model": model, "prompt": prompt,
                                                                       "max_tokens": 20, "temperature": 0, **extra})
            assert status == 200, body
            return body["choices"][0]["text"], body["usage"]

        for p in tiny_prompts(1)[2:]:
            plain, u = complete(p, speculative="none")
            assert "completion_tokens_details" not in u
            for extra in ({"speculative": "lookup"}, {"speculative": "draft"}, {}):
                text, u = complete(p, **extra)
                assert text == plain, extra
                d = u["completion_tokens_details"]
                assert d["accepted_prediction_tokens"] >= 0 and d["rejected_prediction_tokens"] >= 0
        assert srv.metrics()["edgellm_draft_tokens_total"] > 0
        status, _, body = srv.request("POST", "/v1/completions", {"model": model, "prompt": [1, 2], "speculative": "x"})
        assert status == 400 and body["error"]["param"] == "speculative", body
    finally:
        assert srv.stop() == 0


def test_server_refuses_draft_without_a_draft_model():
    from types import SimpleNamespace

    from edgellm.server.errors import APIError
    from edgellm.server.routes import _speculative
    from edgellm.server.schemas import Generation

    gen = Generation(model="m", sampling=GREEDY, max_tokens=4, speculative="draft")
    for default in (None, Speculative("lookup")):
        with pytest.raises(APIError, match="draft model"):
            _speculative(SimpleNamespace(engine=SimpleNamespace(speculative=default)), gen)
    gen.speculative = "lookup"
    assert _speculative(SimpleNamespace(engine=SimpleNamespace(speculative=None)), gen)["speculative"].is_lookup
