"""Sampler chain (penalties -> top_k -> top_p -> min_p -> temperature -> draw) and stop strings."""

from __future__ import annotations


import numpy as np
import pytest

from edgellm.sampling import (
    Candidates,
    Sampler,
    SamplingParams,
    StopChecker,
    all_candidates,
    apply_penalties,
    find_stop,
    min_p,
    sample_rows,
    top_k,
    top_p,
)

# chi-square critical values at significance 0.001 (scipy.stats.chi2.ppf(0.999, df))
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 7: 24.322, 9: 27.877}


def only(**kw) -> SamplingParams:
    """Params with every filter off unless given."""
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    base.update(kw)
    return SamplingParams(**base)


def draws(sampler: Sampler, logits, n: int, history=()) -> np.ndarray:
    return np.array([sampler.sample(logits, history) for _ in range(n)])


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


def softmax(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def ref_order(logits) -> np.ndarray:
    """Best first, ties by index: the order the filters promise."""
    logits = np.asarray(logits, dtype=np.float32)
    return np.lexsort((np.arange(logits.shape[0]), -logits))


def ref_top_p(logits, p) -> np.ndarray:
    """Plain full-sort nucleus, in float64."""
    order = ref_order(logits)
    cum = np.cumsum(softmax(np.asarray(logits, dtype=np.float32))[order])
    return order[: int(np.argmax(cum >= p)) + 1]


# --------------------------------------------------------------------------------------------
# params


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(min_p=1.1), "min_p"),
        (dict(repeat_penalty=0.0), "repeat_penalty"),
        (dict(repeat_last_n=-2), "repeat_last_n"),
        (dict(top_k=2.5), "top_k"),
        (dict(frequency_penalty=float("inf")), "frequency_penalty"),
        (dict(presence_penalty="1"), "presence_penalty"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.0), "seed"),
    ],
)
def test_params_rejects_bad_values(kw, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kw)


def test_params_defaults_are_llama_cpp_common_defaults():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repeat_penalty, p.repeat_last_n) == (1.0, 64)
    assert not p.greedy and SamplingParams(temperature=0).greedy


def test_sampler_rejects_bad_construction_and_logits():
    with pytest.raises(ValueError, match="n_vocab"):
        Sampler(SamplingParams(), 0)
    with pytest.raises(TypeError):
        Sampler({"temperature": 0}, 10)
    s = Sampler(SamplingParams(), 8)
    with pytest.raises(ValueError, match=r"shape \(8,\)"):
        s.sample(np.zeros(9, np.float32), [])
    with pytest.raises(ValueError, match="floating"):
        s.sample(np.zeros(8, np.int32), [])
    with pytest.raises(ValueError, match="seed"):
        s.reset(-3)


# --------------------------------------------------------------------------------------------
# greedy


def test_greedy_is_argmax_and_uses_no_randomness():
    rng = np.random.default_rng(0)
    s = Sampler(SamplingParams(temperature=0, seed=7), 1000)
    state = s._rng._state
    for _ in range(20):
        logits = rng.standard_normal(1000).astype(np.float32)
        assert s.sample(logits, []) == int(np.argmax(logits))
    assert s._rng._state == state


def test_greedy_ties_pick_first_and_float64_logits_accepted():
    s = Sampler(SamplingParams(temperature=0), 5)
    assert s.sample(np.array([0.0, 3.0, 1.0, 3.0, 3.0]), []) == 1


def test_greedy_applies_penalties_first():
    logits = np.array([1.0, 5.0, 4.0, 0.0], np.float32)
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=1.5), 4)
    assert s.sample(logits, [1]) == 2  # 5 / 1.5 < 4
    assert s.sample(logits, [3]) == 1  # penalizing another token changes nothing


# --------------------------------------------------------------------------------------------
# penalties


def test_penalties_math():
    logits = np.array([2.0, -1.0, 0.5, 3.0, 0.0], np.float32)
    history = [3, 0, 1, 1, 4]
    kw = dict(repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    # window = last 4 ids: 0 once, 1 twice, 4 once; 3 has left the window
    got = apply_penalties(logits, history, repeat_last_n=4, **kw)
    want = [2.0 / 2 - 0.75, -1.0 * 2 - (2 * 0.5 + 0.25), 0.5, 3.0, 0.0 * 2 - 0.75]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # -1: the whole history, so 3 is penalized too
    got_all = apply_penalties(logits, history, repeat_last_n=-1, **kw)
    np.testing.assert_allclose(got_all[3], 3.0 / 2 - 0.75, atol=1e-6)
    np.testing.assert_array_equal(logits, [2.0, -1.0, 0.5, 3.0, 0.0])  # input untouched


def test_penalties_disabled_cases_return_input():
    logits = np.arange(6, dtype=np.float32)
    assert apply_penalties(logits, [1, 2], repeat_last_n=0, repeat_penalty=1.3) is logits
    assert apply_penalties(logits, [1, 2], repeat_last_n=64) is logits
    assert apply_penalties(logits, [], repeat_last_n=64, repeat_penalty=1.3) is logits


def test_penalties_reject_ids_outside_vocab():
    with pytest.raises(ValueError, match="token id 6"):
        apply_penalties(np.zeros(6, np.float32), [1, 6], repeat_penalty=1.1)
    with pytest.raises(ValueError, match="integer"):
        apply_penalties(np.zeros(6, np.float32), [1.5], repeat_penalty=1.1)


# --------------------------------------------------------------------------------------------
# filters


# probabilities 0.5, 0.3, 0.15, 0.05 placed out of order
PROBS = np.array([0.15, 0.5, 0.05, 0.3])
LOGITS = np.log(PROBS).astype(np.float32)


def ids_of(c: Candidates) -> list[int]:
    return sorted(int(i) for i in c.ids)


def test_top_k_mask_and_ties():
    c = all_candidates(LOGITS)
    assert ids_of(top_k(c, 2)) == [1, 3]
    assert ids_of(top_k(c, 1)) == [1]
    assert top_k(c, 0) is c and top_k(c, -5) is c and top_k(c, 4) is c
    ties = all_candidates(np.array([1.0, 5.0, 5.0, 5.0, 0.0, 5.0], np.float32))
    assert top_k(ties, 2).ids.tolist() == [1, 2]  # earliest of the tied
    assert top_k(ties, 5).ids.tolist() == [0, 1, 2, 3, 5]


def ref_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """The ids top_k keeps, by a full stable sort: the k best, ties by position, in id order."""
    order = np.argsort(-logits.astype(np.float64), kind="stable")
    return np.sort(order[:k])


@pytest.mark.parametrize("n", [262144, 49152, 40000 + 37])  # Gemma 3's and SmolLM2's vocabularies, a ragged tail
@pytest.mark.parametrize("kind", ["normal", "ties", "masked", "best in the tail"])
@pytest.mark.parametrize("k", [1, 40, 200])
def test_top_k_on_large_vocabularies_matches_full_sort(n, kind, k):
    # large sets take the column-maxima shortcut (_top_k_contenders): the same tokens as sorting all
    rng = np.random.default_rng(n + k + len(kind))
    logits = rng.standard_normal(n).astype(np.float32)
    if kind == "ties":  # many tokens tied at the cut, spread over the columns
        logits = rng.integers(0, 6, n).astype(np.float32)
    elif kind == "masked":
        logits[rng.integers(0, n, n // 3)] = -np.inf
    elif kind == "best in the tail":  # the best tokens in the last, partial column or the last row
        logits[-min(k, 30):] = 10.0
        logits[-(n % 64) - 5:-(n % 64) - 1 if n % 64 else None] = 9.0
    out = top_k(all_candidates(logits), k)
    np.testing.assert_array_equal(out.ids, ref_top_k(logits, k))
    np.testing.assert_array_equal(out.logits, logits[out.ids])


@pytest.mark.parametrize("p, kept", [(0.45, [1]), (0.79, [1, 3]), (0.81, [0, 1, 3]), (0.96, [0, 1, 2, 3])])
def test_top_p_mask(p, kept):
    out = top_p(all_candidates(LOGITS), p)
    assert ids_of(out) == kept
    assert list(out.logits) == sorted(out.logits, reverse=True)  # best first


@pytest.mark.parametrize("p, kept", [(0.05, [0, 1, 2, 3]), (0.2, [0, 1, 3]), (0.5, [1, 3]), (0.7, [1]), (1.0, [1])])
def test_min_p_mask(p, kept):
    assert ids_of(min_p(all_candidates(LOGITS), p)) == kept


@pytest.mark.parametrize("scale", [0.01, 1.0, 3.0, 8.0])
@pytest.mark.parametrize("p", [0.3, 0.9, 0.999])
def test_top_p_matches_full_sort_on_large_sets(scale, p):
    # scale picks how wide the nucleus is: from nearly everything (0.01) to a handful (8), so
    # every pool size of the search is exercised
    rng = np.random.default_rng(int(scale * 100) + int(p * 1000))
    logits = (rng.standard_normal(40000) * scale).astype(np.float32)
    logits[rng.integers(0, 40000, 50)] = logits.max()  # ties
    out = top_p(all_candidates(logits), p)
    np.testing.assert_array_equal(out.ids, ref_top_p(logits, p))


def test_top_p_order_with_signed_zeros_tiny_values_and_neg_inf():
    logits = np.array([0.0, -0.0, 2.5, -2.5, 1e-30, -1e-30, 1.0, -1.0, -0.0, 0.0, 2.5, -np.inf], np.float32)
    out = top_p(all_candidates(logits), 1 - 1e-9)
    assert out.ids.tolist() == ref_order(logits)[:11].tolist()  # all but -inf, ties (0 == -0) by index


@pytest.mark.parametrize("seed", range(5))
def test_min_p_before_top_p_shortcut_equals_chain_order(seed):
    # Sampler runs top_p(min_p(c), mass=...) instead of min_p(top_p(c)); same set, same order
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(3000) * rng.uniform(0.5, 4)).astype(np.float32)
    c = all_candidates(logits)
    mass = np.exp(logits - logits.max()).sum(dtype=np.float64)
    for tp in (0.5, 0.9, 0.99):
        for mp in (0.01, 0.05, 0.3):
            chain = min_p(top_p(c, tp), mp)
            fast = top_p(min_p(c, mp), tp, mass=mass)
            np.testing.assert_array_equal(fast.ids, chain.ids)


# --------------------------------------------------------------------------------------------
# drawing


def test_same_seed_same_sequence_and_reset_replays():
    rng = np.random.default_rng(3)
    steps = [rng.standard_normal(500).astype(np.float32) for _ in range(50)]
    a, b, c = (Sampler(SamplingParams(seed=s), 500) for s in (42, 42, 43))
    seq_a = [a.sample(x, []) for x in steps]
    assert seq_a == [b.sample(x, []) for x in steps]
    assert seq_a != [c.sample(x, []) for x in steps]
    a.reset()
    assert [a.sample(x, []) for x in steps] == seq_a
    c.reset(42)
    assert [c.sample(x, []) for x in steps] == seq_a


def test_unseeded_sampler_records_its_seed():
    rng = np.random.default_rng(4)
    steps = [rng.standard_normal(300).astype(np.float32) for _ in range(40)]
    s = Sampler(SamplingParams(), 300)
    first = [s.sample(x, []) for x in steps]
    again = Sampler(SamplingParams(seed=s.seed), 300)
    assert [again.sample(x, []) for x in steps] == first


def test_distribution_matches_softmax_with_temperature():
    logits = np.array([1.0, 0.2, -0.5, 2.0, 0.0], np.float32)
    s = Sampler(only(temperature=0.7), 5)
    counts = np.bincount(draws(s, logits, 20000), minlength=5)
    assert chi_square(counts, softmax(logits / 0.7)) < CHI2_999[4]
    # the same counts are far from the temperature-1 distribution: the test can tell
    assert chi_square(counts, softmax(logits)) > 10 * CHI2_999[4]


def test_distribution_after_top_k_is_renormalized():
    logits = np.array([1.0, 0.2, -0.5, 2.0, 0.0, 1.5], np.float32)
    s = Sampler(only(top_k=3), 6)
    counts = np.bincount(draws(s, logits, 15000), minlength=6)
    kept = [0, 3, 5]
    assert counts[[1, 2, 4]].sum() == 0
    assert chi_square(counts[kept], softmax(logits[kept])) < CHI2_999[2]


def test_distribution_over_many_blocks_of_a_large_vocab():
    # the draw walks the probabilities in blocks of 1024; put the mass in several blocks,
    # at their edges too
    n = 5000
    hot = np.array([0, 1023, 1024, 2047, 3000, 4095, 4096, 4999])
    logits = np.full(n, -30.0, np.float32)
    logits[hot] = np.linspace(0.0, 1.4, hot.shape[0], dtype=np.float32)
    s = Sampler(only(), n)
    got = draws(s, logits, 16000)
    assert np.isin(got, hot).all()
    counts = np.array([(got == h).sum() for h in hot])
    assert chi_square(counts, softmax(logits[hot])) < CHI2_999[7]


def test_all_equal_logits_sample_uniformly():
    s = Sampler(only(), 8)
    counts = np.bincount(draws(s, np.full(8, 0.25, np.float32), 16000), minlength=8)
    assert chi_square(counts, np.full(8, 1 / 8)) < CHI2_999[7]
    s2 = Sampler(only(top_k=2), 8)
    assert set(draws(s2, np.zeros(8, np.float32), 200).tolist()) == {0, 1}


def test_neg_inf_logits_are_never_chosen():
    logits = np.full(3000, -np.inf, np.float32)
    logits[[17, 2900]] = [0.0, 0.5]
    for params in (only(), SamplingParams(seed=3), only(top_k=100), only(top_p=0.99), only(min_p=0.01)):
        got = set(draws(Sampler(params, 3000), logits, 300).tolist())
        assert got == {17, 2900}


def test_pos_inf_logits_take_all_probability():
    logits = np.zeros(10, np.float32)
    logits[[2, 7]] = np.inf
    assert set(draws(Sampler(only(), 10), logits, 300).tolist()) == {2, 7}
    assert Sampler(SamplingParams(temperature=0), 10).sample(logits, []) == 2


def test_nan_and_all_neg_inf_are_errors():
    s = Sampler(SamplingParams(), 4)
    with pytest.raises(ValueError, match="NaN"):
        s.sample(np.array([0.0, np.nan, 1.0, 2.0], np.float32), [])
    with pytest.raises(ValueError, match="-inf"):
        s.sample(np.full(4, -np.inf, np.float32), [])


def test_ids_stay_in_range_under_extremes():
    rng = np.random.default_rng(11)
    for trial in range(60):
        n = int(rng.integers(1, 3000))
        scale = float(10.0 ** rng.uniform(-6, 30))
        logits = (rng.standard_normal(n) * scale).astype(np.float32)
        params = SamplingParams(
            temperature=float(10.0 ** rng.uniform(-8, 1)),
            top_k=int(rng.integers(-1, 60)),
            top_p=float(rng.uniform(0.01, 1.0)),
            min_p=float(rng.uniform(0, 1)),
            repeat_penalty=float(rng.uniform(0.5, 2)),
            seed=trial,
        )
        history = rng.integers(0, n, 20).tolist()
        tok = Sampler(params, n).sample(logits, history)
        assert 0 <= tok < n


def test_tiny_temperature_approaches_greedy():
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(1000) * 1e4).astype(np.float32)
    s = Sampler(only(temperature=1e-20), 1000)
    assert set(draws(s, logits, 20).tolist()) == {int(np.argmax(logits))}


def test_large_vocab_chain_respects_filters():
    n = 262144
    rng = np.random.default_rng(9)
    logits = (rng.standard_normal(n) * 2).astype(np.float32)
    logits[rng.integers(0, n, 30)] += 9.0
    top40 = set(ref_order(logits)[:40].tolist())
    s = Sampler(SamplingParams(seed=1), n)
    assert set(draws(s, logits, 30).tolist()) <= top40
    nucleus = set(ref_top_p(logits, 0.9).tolist())
    s2 = Sampler(only(top_p=0.9, seed=2), n)
    assert set(draws(s2, logits, 30).tolist()) <= nucleus


# --------------------------------------------------------------------------------------------
# stop strings


def test_find_stop():
    stops = ["<|im_end|>", "\nUser:"]
    assert find_stop("hello<|im_end|>more", stops) == (5, True)
    assert find_stop("hi\nUser: x <|im_end|>", stops) == (2, True)  # earliest wins
    assert find_stop("hello<|im", stops) == (5, False)  # held back: could become a stop
    assert find_stop("hello\n", stops) == (5, False)
    assert find_stop("hello", stops) == (5, False)
    assert find_stop("", stops) == (0, False)
    assert find_stop("a<b", ["<"]) == (1, True)


def test_stop_checker_split_across_pieces():
    sc = StopChecker(["<end_of_turn>"])
    assert sc.feed("Hel") == ("Hel", False)
    assert sc.feed("lo <end") == ("lo ", False)
    assert sc.feed("_of") == ("", False)
    assert sc.feed("_turn>\nmore") == ("", True)
    assert sc.feed("ignored") == ("", True)
    assert sc.stopped


def test_stop_checker_releases_false_alarms_and_flushes():
    sc = StopChecker(["<end_of_turn>"])
    assert sc.feed("a <en") == ("a ", False)
    assert sc.feed("d of story") == ("<end of story", False)
    assert sc.feed(" <") == (" ", False)
    assert sc.flush() == "<"
    assert sc.flush() == ""


def test_stop_checker_random_splits():
    rng = np.random.default_rng(2)
    stops = ["</s>", "<|im_end|>", "ab", "bcd"]
    alphabet = list("abcd<|/>ims_en ")
    for _ in range(300):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 40))))
        cuts = sorted(rng.integers(0, len(text) + 1, size=int(rng.integers(0, 6))).tolist())
        pieces = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        sc = StopChecker(stops)
        shown = ""
        for piece in pieces:
            out, stopped = sc.feed(piece)
            shown += out
            if stopped:
                break
        if not sc.stopped:
            shown += sc.flush()
        found = [text.find(s) for s in stops if s in text]
        assert shown == (text[: min(found)] if found else text)
        assert sc.stopped == bool(found)


def test_stop_checker_rejects_bad_stops():
    with pytest.raises(ValueError, match="single string"):
        StopChecker("</s>")
    with pytest.raises(ValueError, match="non-empty"):
        StopChecker(["</s>", ""])
    assert StopChecker([]).feed("anything") == ("anything", False)


@pytest.mark.parametrize("n_vocab", [49152, 64 * 700 + 37])
def test_sample_rows_draws_what_each_row_draws_alone(n_vocab):
    """sample_rows (a step's rows sampled together, the vocabulary-wide passes shared) gives each
    row the token, and leaves its random generator in the state, that sample() on that row alone
    does: rows of several top_k values (the batched ones), ties at the cut, rows that fall back
    (greedy, penalties, top_k off or too wide, -inf and +inf logits, NaN), over steps."""
    rng = np.random.default_rng(7)
    kinds = [dict(top_k=40), dict(top_k=40, top_p=1.0, min_p=0.0), dict(top_k=5, temperature=2.0),
             dict(top_k=40, min_p=0.2), dict(top_k=40), dict(temperature=0.0), dict(top_k=0),
             dict(top_k=40, repeat_penalty=1.3), dict(top_k=5000), dict(top_k=40), dict(top_k=40), dict(top_k=40)]
    params = [SamplingParams(**{**dict(temperature=0.8, top_p=0.95, min_p=0.05, seed=i), **kw}) for i, kw in enumerate(kinds)]
    together = [Sampler(p, n_vocab) for p in params]
    alone = [Sampler(p, n_vocab) for p in params]
    history = list(range(30))
    for step in range(6):
        x = (rng.standard_normal((len(params) + 2, n_vocab)) * 3).astype(np.float32)
        x[1] = np.round(x[1])  # many ties, at the cut too
        x[9, 17] = -np.inf  # a banned token: the row falls back
        x[10, 5] = np.inf if step % 2 else np.float32(1e30)
        if step == 3:
            x[11, 8] = np.nan
        rows = [r + 1 for r in range(len(params))][::-1]  # not in order, and not the block's first row
        got = sample_rows(together[::-1], x, rows, [history] * len(params))[::-1]
        for i, s in enumerate(alone):
            try:
                want = s.sample(x[i + 1], history)
            except ValueError as exc:
                want = str(exc)
            assert (str(got[i]) if isinstance(got[i], ValueError) else got[i]) == want, (step, i)
    for a, b in zip(together, alone):  # the generators went through the same draws
        assert a.rng.random() == b.rng.random()


@pytest.mark.parametrize("n_allowed, top_k, top_p",
                         [(7, 40, 0.9), (300, 40, 0.9), (4997, 40, 0.9), (4997, 0, 0.9), (4990, 4995, 1.0)])
def test_masked_logits_are_filtered_and_drawn_as_the_tokens_left(n_allowed, top_k, top_p):
    """Logits with -inf for all but some tokens (a grammar's mask) give the candidates and the
    seeded draws those tokens' logits alone give (the sampler drops the -inf ones first: selecting
    among 262k equal values was 9 ms a token). With a few tokens banned (a logit_bias) and at
    least top_k left, top-k runs over all the logits instead: the same tokens in the same order."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(5000) * 3).astype(np.float32)
    allowed = np.sort(rng.choice(5000, n_allowed, replace=False))
    masked = np.full_like(x, -np.inf)
    masked[allowed] = x[allowed]
    params = SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, min_p=0.0, seed=3)
    full, alone = Sampler(params, 5000), Sampler(params, n_allowed)
    c, ref = full.candidates(masked, []), alone.candidates(x[allowed], [])
    np.testing.assert_array_equal(c.ids, allowed[ref.ids])
    np.testing.assert_array_equal(c.logits, ref.logits)
    assert [full.sample(masked, []) for _ in range(50)] == [int(allowed[alone.sample(x[allowed], [])]) for _ in range(50)]


def test_a_top_k_chain_holds_no_vocabulary_sized_id_array():
    # the ids of candidates cut from a whole row are their positions: a top-k chain (the default)
    # draws the same tokens as one over an explicit arange, and never makes one (2 MB at 262k)
    from edgellm import sampling

    rng = np.random.default_rng(7)
    n = 262144
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    sampling._vocab_ids.cache_clear()
    s = Sampler(SamplingParams(temperature=0.8, seed=5), n)
    got = [s.sample(x, []) for _ in range(20)]
    rows = sample_rows([Sampler(SamplingParams(temperature=0.8, seed=i), n) for i in range(3)],
                       np.stack([x, -x, x * 2]), [0, 1, 2], [[], [], []])
    assert sampling._vocab_ids.cache_info().currsize == 0
    p = s.params
    ref = Sampler(p, n)
    want = []
    for _ in range(20):  # the chain spelled out over all_candidates (an arange of ids)
        c = top_p(top_k(all_candidates(x), p.top_k), p.top_p)
        c = min_p(c, p.min_p)
        c = sampling.apply_temperature(c, p.temperature)
        want.append(sampling.draw(c, ref.rng))
    assert got == want
    assert rows == [Sampler(SamplingParams(temperature=0.8, seed=i), n).sample(r, [])
                    for i, r in enumerate((x, -x, x * 2))]


@pytest.mark.parametrize("seed", [0, 1, 42, 2**32 - 1, 2**32, 2**64 + 5, 2**128 - 1, 3**150])
def test_pcg64_gives_numpys_generator_draws(seed):
    """The samplers' plain-Python PCG64 is numpy's Generator(PCG64(seed)).random(), draw for
    draw: seeds of one to many 32-bit words (SeedSequence's pool of 4, and words past it)."""
    from edgellm.rng import Pcg64

    ours = Pcg64(seed)
    assert [ours.random() for _ in range(2000)] == np.random.Generator(np.random.PCG64(seed)).random(2000).tolist()


def test_pcg64_rejects_bad_seeds():
    from edgellm.rng import Pcg64

    for bad in (-1, 1.5, "3", None):
        with pytest.raises(ValueError, match="seed"):
            Pcg64(bad)


def test_sampling_imports_no_numpy_random():
    """numpy.random (with OpenSSL's libcrypto through `secrets`) costs a process ~6 MB resident;
    loading edgellm's engine, scheduler and speculation and drawing tokens must not import it."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, edgellm, edgellm.scheduler, edgellm.speculative\n"
        "from edgellm.sampling import Sampler, SamplingParams\n"
        "for seed in (7, None):\n"
        "    s = Sampler(SamplingParams(temperature=0.8, top_k=0, seed=seed), 1000)\n"
        "    [s.sample(np.linspace(0, 3, 1000, dtype=np.float32), []) for _ in range(5)]\n"
        "print(sorted(m for m in sys.modules if m.startswith('numpy.random') or m in ('secrets', '_hashlib')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
