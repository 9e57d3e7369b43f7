"""`edgellm perplexity`: llama-perplexity's method (checked on a bigram model whose answer is
known in closed form), the logits file and KL divergence, and the real models against
llama-perplexity's figures (fixtures/reference/perplexity.json)."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
from click.testing import CliRunner

from edgellm.errors import EdgeLLMError
from edgellm.tools import perplexity as ppl
from edgellm.tools.commands import perplexity as perplexity_cmd

BOS = 1


class Bigram:
    """A model whose logits at a position depend only on the token there: W[token]."""

    def __init__(self, n_vocab=40, seed=0, scale=3.0):
        self.n_vocab = n_vocab
        self.W = (np.random.default_rng(seed).standard_normal((n_vocab, n_vocab)) * scale).astype(np.float32)
        self.calls: list[list[int]] = []

    def logits(self, ids, *, start=0):
        self.calls.append(list(ids))
        return self.W[np.asarray(ids)][start:]


def closed_form_nll(W, tokens, n_ctx, n_chunk):
    """-log p of each scored token: positions first..n_ctx-2 of each chunk predict the next token.
    For a bigram model that is log_softmax(W[previous])[next]; BOS replaces position 0 only, which
    is never a scored position's token."""
    W = W.astype(np.float64)
    lsm = W - np.log(np.exp(W - W.max(1, keepdims=True)).sum(1, keepdims=True)) - W.max(1, keepdims=True)
    first = n_ctx // 2
    out = []
    for c in range(n_chunk):
        chunk = tokens[c * n_ctx : (c + 1) * n_ctx]
        for j in range(first, n_ctx - 1):
            out.append(-lsm[chunk[j], chunk[j + 1]])
    return np.array(out)


@pytest.mark.parametrize("n_ctx, n_tokens, bos", [(16, 100, BOS), (16, 100, None), (9, 40, BOS), (4, 8, None)])
def test_method_on_a_bigram_model(n_ctx, n_tokens, bos):
    model = Bigram()
    tokens = np.random.default_rng(1).integers(2, model.n_vocab, n_tokens).tolist()
    seen = []
    res = ppl.perplexity(model, tokens, n_ctx, bos=bos, on_chunk=lambda i, r: seen.append(i))
    n_chunk = n_tokens // n_ctx
    assert res.n_chunks == n_chunk and seen == list(range(n_chunk))
    # one fresh evaluation per chunk, of the chunk's tokens with BOS first where the model uses one
    assert len(model.calls) == n_chunk
    for c, ids in enumerate(model.calls):
        want = tokens[c * n_ctx : (c + 1) * n_ctx]
        assert ids == ([bos] + want[1:] if bos is not None else want)
    nll = closed_form_nll(model.W, tokens, n_ctx, n_chunk)
    assert res.nll.count == n_chunk * (n_ctx - 1 - n_ctx // 2) == nll.size
    # the softmax runs in float32 as llama.cpp's does (its sum in float64): float32 rounding
    assert res.ppl == pytest.approx(math.exp(nll.mean()), rel=1e-6)
    # llama.cpp's error: PPL * sqrt(population variance / (count - 1))
    assert res.ppl_stderr == pytest.approx(res.ppl * math.sqrt(nll.var() / (nll.size - 1)), rel=1e-6)
    assert res.chunk_ppl[-1] == res.ppl
    assert res.chunk_ppl[0] == pytest.approx(math.exp(nll[: n_ctx - 1 - n_ctx // 2].mean()), rel=1e-6)


def test_chunk_limit_and_too_short_text():
    model = Bigram()
    tokens = list(range(2, 40)) * 3
    assert ppl.perplexity(model, tokens, 16, bos=None, n_chunks=2).n_chunks == 2
    with pytest.raises(EdgeLLMError, match="needs at least 32"):
        ppl.perplexity(model, tokens[:31], 16, bos=None)


def test_read_text_drops_one_trailing_newline(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"one\r\ntwo\n\n")
    assert ppl.read_text(tmp_path / "a.txt") == "one\r\ntwo\n"  # bytes as they are, no newline translation
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(EdgeLLMError, match="not UTF-8"):
        ppl.read_text(tmp_path / "b.txt")


# --- the logits file and KL divergence -----------------------------------------------------------

def save(model, tokens, n_ctx, path, bos=BOS):
    n = ppl.n_chunks_for(len(tokens), n_ctx)
    with open(path, "wb") as f:
        return ppl.perplexity(model, tokens, n_ctx, bos=bos, save=ppl.LogitsWriter(f, n_ctx, model.n_vocab, n, tokens))


def test_logits_file_layout(tmp_path):
    """llama.cpp's layout: magic, u32 n_ctx, i32 n_vocab, i32 n_chunk, i32 tokens, then
    (n_ctx - 1 - n_ctx/2) rows per chunk of 2*ceil(n_vocab/2) + 4 uint16."""
    model = Bigram(n_vocab=41)
    tokens = np.random.default_rng(2).integers(0, 41, 70).tolist()
    save(model, tokens, 16, tmp_path / "l.bin")
    raw = (tmp_path / "l.bin").read_bytes()
    assert raw[:8] == b"_logits_"
    assert struct.unpack_from("<Iii", raw, 8) == (16, 41, 4)
    assert np.frombuffer(raw, "<i4", 64, 20).tolist() == tokens[:64]
    nv = 2 * 21 + 4
    assert len(raw) == 20 + 4 * 64 + 4 * 7 * nv * 2
    f = ppl.LogitsFile.open(tmp_path / "l.bin")
    assert (f.n_ctx, f.n_vocab, f.n_chunk, f.rows_per_chunk) == (16, 41, 4, 7)
    # chunk 1's rows are the log-probs at positions 8..14, to within the 16-bit step
    W = model.W.astype(np.float64)
    for r, pos in enumerate(range(8, 15)):
        row = W[tokens[16 + pos]]
        lsm = row - row.max() - np.log(np.exp(row - row.max()).sum())
        got = f.log_probs(1)[r]
        keep = lsm > lsm.max() - 16
        step = (row.max() - max(row.min(), row.max() - 16)) / 65535
        assert np.all(np.abs(got[keep] - lsm[keep]) <= step + 1e-5)


def test_pack_round_trip_properties():
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((5, 1001)) * 8).astype(np.float32)
    logits[2] = 0.5  # a constant row: scale 0, every value stored as 0
    packed = ppl.pack_log_probs(logits)
    head = packed[:, :4].copy().view(np.float32)
    assert head[2, 0] == 0 and np.all(packed[2, 4:] == 0)
    assert np.all(packed[[0, 1, 3, 4], 4 + logits[[0, 1, 3, 4]].argmax(1)] == 65535)
    lp = ppl.unpack_log_probs(packed, 1001)
    assert lp[2] == pytest.approx(np.full(1001, -math.log(1001)), abs=1e-5)


def test_kl_divergence_of_a_model_with_itself_and_another(tmp_path):
    base = Bigram(seed=0)
    tokens = np.random.default_rng(4).integers(2, base.n_vocab, 200).tolist()
    ref = save(base, tokens, 20, tmp_path / "base.bin")
    f = ppl.LogitsFile.open(tmp_path / "base.bin")
    same = ppl.kl_divergence(Bigram(seed=0), f, bos=BOS)
    assert same.count == ref.nll.count
    assert same.kld.mean < 1e-7 and same.top1[0] == 1.0
    assert same.ppl == pytest.approx(ref.ppl, rel=1e-12)
    assert same.ppl_base == pytest.approx(ref.ppl, rel=1e-4)  # from the 16-bit log-probs
    other = Bigram(seed=5)
    res = ppl.kl_divergence(other, f, bos=BOS)
    # KL(base || other) per scored position, computed directly from both models' weights
    W0, W1 = base.W.astype(np.float64), other.W.astype(np.float64)

    def lsm(W):
        return W - W.max(1, keepdims=True) - np.log(np.exp(W - W.max(1, keepdims=True)).sum(1, keepdims=True))

    L0, L1 = lsm(W0), lsm(W1)
    prev = [tokens[c * 20 + j] for c in range(10) for j in range(10, 19)]
    kl = [(np.exp(L0[p]) * (L0[p] - L1[p]))[L0[p] > -16].sum() for p in prev]
    assert res.kld.mean == pytest.approx(np.mean(kl), rel=1e-3)
    same_top = np.mean([W0[p].argmax() == W1[p].argmax() for p in prev])
    assert res.top1[0] == pytest.approx(same_top)
    assert res.ppl == pytest.approx(ppl.perplexity(other, tokens, 20, bos=BOS).ppl, rel=1e-12)


def test_bad_logits_files(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"hello world, not logits")
    with pytest.raises(EdgeLLMError, match="not a logits file"):
        ppl.LogitsFile.open(tmp_path / "x.bin")
    model = Bigram()
    tokens = list(range(2, 40)) * 2
    save(model, tokens, 16, tmp_path / "l.bin")
    raw = (tmp_path / "l.bin").read_bytes()
    (tmp_path / "t.bin").write_bytes(raw[:-10])
    with pytest.raises(EdgeLLMError, match="truncated"):
        ppl.LogitsFile.open(tmp_path / "t.bin")
    with pytest.raises(EdgeLLMError, match="vocabulary of 40"):
        ppl.kl_divergence(Bigram(n_vocab=50), ppl.LogitsFile.open(tmp_path / "l.bin"), bos=None)


@pytest.mark.parametrize("args, msg", [
    (["m.gguf"], "-f FILE"),
    (["m.gguf", "-f", "{text}", "--save-logits", "a", "--kl-divergence", "{text}"], "cannot be combined"),
])
def test_cli_option_errors(tmp_path, args, msg):
    (tmp_path / "t.txt").write_text("x")
    args = [a.replace("{text}", str(tmp_path / "t.txt")) for a in args]
    res = CliRunner().invoke(perplexity_cmd, args)
    assert res.exit_code == 1 and msg in res.output and "Traceback" not in res.output


# --- real models against llama-perplexity ---------------------------------------------------------

REF_FILES = {"smollm2-135m-instruct": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("n_ctx", [128, 512])
def test_real_models_match_llama_perplexity(real_model, fixtures_dir, n_ctx):
    alias, path, _ = real_model
    want = json.loads((fixtures_dir / "reference" / "perplexity.json").read_text())["results"]
    want = want[REF_FILES[alias]][str(n_ctx)]
    res = CliRunner().invoke(perplexity_cmd, [str(path), "-f", str(fixtures_dir / "apache-2.0.txt"),
                                              "-c", str(n_ctx)])
    assert res.exit_code == 0, res.output
    final = [line for line in res.output.splitlines() if line.startswith("Final estimate")][0]
    ppl_val, err = (float(x) for x in final.split("PPL = ")[1].split()[0:3:2])
    n_chunks = int(final.split("(")[1].split()[0])
    assert n_chunks == want["chunks"]
    assert ppl_val == pytest.approx(want["ppl"], rel=0.01)
    assert err == pytest.approx(want["stderr"], rel=0.05)


def _final_ppl(output):
    line = [x for x in output.splitlines() if x.startswith("Final estimate")][0]
    return float(line.split("PPL = ")[1].split()[0])


def _stat(output, name):
    line = [x for x in output.splitlines() if x.startswith(name)][0]
    return float(line.split(":")[1].split()[0])


def _stat_pm(output, name):
    """(value, error) of a `name : value ± error` line"""
    line = [x for x in output.splitlines() if x.startswith(name)][0]
    value, err = line.split(":")[1].split("±")
    return float(value), float(err)


@pytest.mark.real
@pytest.mark.slow
def test_real_kl_divergence_against_an_f16_base(smollm2_path, fixtures_dir, tmp_path):
    """SmolLM2 widened to F16 (the same weights) as the base: the original Q4_1 file stays very
    close to it, a Q2_K requantization drifts further; the base's PPL survives the logits file."""
    from edgellm.tools.commands import quantize

    runner = CliRunner()
    f16, q2 = tmp_path / "f16.gguf", tmp_path / "q2k.gguf"
    assert runner.invoke(quantize, [str(smollm2_path), str(f16), "F16", "--allow-requantize", "-q"]).exit_code == 0
    assert runner.invoke(quantize, [str(f16), str(q2), "Q2_K", "--pure", "-q"]).exit_code == 0
    text = str(fixtures_dir / "apache-2.0.txt")
    base = runner.invoke(perplexity_cmd, [str(f16), "-f", text, "-c", "128", "--chunks", "1",
                                          "--save-logits", str(tmp_path / "base.bin")])
    assert base.exit_code == 0, base.output
    results = {}
    for name, model in (("q4_1", smollm2_path), ("q2_k", q2)):
        res = runner.invoke(perplexity_cmd, [str(model), "--kl-divergence", str(tmp_path / "base.bin")])
        assert res.exit_code == 0, res.output
        results[name] = res.output
        assert _stat(res.output, "Mean PPL(base)") == pytest.approx(_final_ppl(base.output), rel=1e-3)
    kld = {k: _stat(v, "Mean    KLD") for k, v in results.items()}
    top = {k: _stat(v, "Same top p") for k, v in results.items()}
    assert 0 <= kld["q4_1"] < 0.05 and kld["q4_1"] < kld["q2_k"], kld
    assert top["q4_1"] > 90 and top["q4_1"] > top["q2_k"], top


@pytest.fixture(scope="module")
def kv_type_runs(smollm2_path, fixtures_dir, tmp_path_factory):
    """SmolLM2 on the fixture text followed by three more license texts (fixtures/licenses: 36
    chunks of 512, 9,180 tokens scored) with an f16 cache saving its logits, then q8_0 and q4_0
    caches against them (llama-perplexity's --kl-divergence): (base PPL, {type: (PPL, mean KLD,
    (ln(PPL/PPL base), its standard error))}). The Apache text alone scores 765 tokens, where that
    error is 0.4%: too coarse for a 0.5% bar."""
    runner = CliRunner()
    work = tmp_path_factory.mktemp("kvq")
    text, logits = work / "text.txt", work / "base.bin"
    parts = [fixtures_dir / "apache-2.0.txt"] + [fixtures_dir / "licenses" / f"{n}.txt" for n in ("GPL-3", "GFDL-1.3", "MPL-2.0")]
    text.write_text("".join(p.read_text(encoding="utf-8") for p in parts), encoding="utf-8")
    base = runner.invoke(perplexity_cmd, [str(smollm2_path), "-f", str(text), "-c", "512", "--save-logits", str(logits)])
    assert base.exit_code == 0, base.output
    out = {}
    for t in ("q8_0", "q4_0"):
        res = runner.invoke(perplexity_cmd, [str(smollm2_path), "-ctk", t, "-ctv", t, "--kl-divergence", str(logits)])
        assert res.exit_code == 0, res.output
        out[t] = (_stat(res.output, "Mean PPL(Q)"), _stat(res.output, "Mean    KLD"), _stat_pm(res.output, "Mean ln(PPL(Q)/PPL(base))"))
    logits.unlink()  # 0.9 GB
    return _final_ppl(base.output), out


@pytest.mark.real
@pytest.mark.slow
def test_real_quantized_kv_cache_drift(kv_type_runs):
    """Each cache type moves the distribution, q4_0 further than q8_0 (on this text q8_0 KLD
    measured 0.0045, q4_0 0.072; on the Apache text alone q4_0 measured 0.081 rotated, 0.256
    before keys and values were stored rotated; llama.cpp 0c1e570's rotated q4_0 cache with -fa
    on: 0.069 there)."""
    _, out = kv_type_runs
    assert 0 < out["q8_0"][1] < out["q4_0"][1] < 0.12, out


@pytest.mark.real
@pytest.mark.slow
def test_real_q8_0_cache_perplexity_within_half_a_percent(kv_type_runs):
    """The issue's bar: a q8_0 cache keeps perplexity within 0.5% of f16's (measured +0.001%), on
    a text long enough to tell: the ratio's standard error (measured 0.11%) must stay under a
    third of the bar."""
    base, out = kv_type_runs
    ratio, err = out["q8_0"][2]
    assert err < 0.005 / 3, out
    assert out["q8_0"][0] == pytest.approx(base, rel=0.005), (base, out)
    assert abs(ratio) < math.log(1.005), out
