"""Every architecture's description (models/*) against llama.cpp, before any engine runs it: the tiny
model of each architecture (tests/tiny_archs.py) is rebuilt byte for byte (its sha256 is the one
llama.cpp ran, tests/fixtures/arch/*.json, made by scripts/make_arch_references.py), tokenized as
llama.cpp did, and run through the float64 reference forward (tests/reference_forward.py).

How close the reference must be - derived per model, not tuned: the reference computes exactly,
llama.cpp rounds (activations to f16 before products with F16 weights and to Q8_0 blocks before
products with quantized ones; q, k, v and the softmax weights to f16). Running the reference once more with those roundings added measures
how far they move the log-probabilities on this model; llama.cpp may be at most twice as far from
the exact reference (mean |Δ log-prob| over the top-8 tokens of 320 teacher-forced positions), and
its top-1 may differ at most at twice as many positions (+2). Along llama.cpp's greedy continuation
the reference must choose the same token wherever its own top-2 margin exceeds 4x the rounding
effect (its 99th percentile: a MoE router flipping an expert makes rare jumps). The roundings move
the log-probabilities by 3e-4 - 8e-3 on these models (up to 4e-2 while their output matrix was Q4_0,
whose product rounds the hidden state to Q8_0 blocks); test_a_misread_graph_would_fail shows that
reading any of the features wrong moves them more than three times the tolerance.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import tiny_archs
from conftest import FIXTURES
from edgellm.gguf_file import GGUFFile
from edgellm.tokenizer import Tokenizer
from reference_forward import ReferenceModel

REFS = {p.stem: p for p in sorted((FIXTURES / "arch").glob("*.json"))}
TEXT = (FIXTURES / "apache-2.0.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (path of the rebuilt tiny file, its reference), built once per module."""
    out, cache = tmp_path_factory.mktemp("arch"), {}

    def get(name):
        if name not in cache:
            ref = json.loads(REFS[name].read_text())
            path = out / f"tiny-{ref['spec']}.gguf"
            if not path.exists():
                tiny_archs.build(ref["spec"], out)
            cache[name] = path, ref
        return cache[name]

    return get


def test_every_architecture_has_references():
    specs = {json.loads(p.read_text())["spec"] for p in REFS.values()}
    assert specs == set(tiny_archs.SPECS)
    from edgellm.models import supported_architectures

    # every architecture edgellm loads has a tiny model ("mistral" is llama under another name)
    assert {s.arch for s in tiny_archs.SPECS.values()} | {"gemma3", "mistral"} == set(supported_architectures())


def _log_probs(model: ReferenceModel, ids) -> np.ndarray:
    h = model.hidden(ids)
    out = []
    for i in range(0, len(ids), 64):
        z = model.head(h[i:i + 64])
        z = z - z.max(-1, keepdims=True)
        out.append(z - np.log(np.exp(z).sum(-1, keepdims=True)))
    return np.concatenate(out)


@pytest.mark.parametrize("name", sorted(REFS))
def test_tiny_file_and_tokens_are_llama_cpps(built, name):
    """The rebuilt file is the one llama.cpp ran, and edgellm tokenizes as llama.cpp did: the text,
    and the texts of llama.cpp's tokenizer test plus a few (make_arch_references.TEXTS) - for a
    vocabulary not in llama.cpp's suite (tiny_archs.VOCABS: Phi-4-mini's gpt-4o pre-tokenizer) the
    only check of the tokenizer."""
    path, ref = built(name)
    assert tiny_archs.sha256(path) == ref["sha256"], "the builder no longer writes the bytes llama.cpp ran"
    tok = Tokenizer.from_metadata(dict(GGUFFile(path).metadata))
    ids = ref["teacher_forced"]["ids"]
    assert tok.encode(TEXT)[:len(ids)] == ids
    assert len(ref["tokenize"]) > 40
    for case in ref["tokenize"]:
        assert tok.encode(case["text"], add_bos=False) == case["ids"], case["text"]


@pytest.mark.parametrize("name", sorted(REFS))
def test_reference_forward_matches_llama_cpp(built, name):
    path, ref = built(name)
    tf = ref["teacher_forced"]
    ids, top, want = tf["ids"], np.array(tf["top_ids"]), np.array(tf["top_logprobs"])
    exact = _log_probs(ReferenceModel(path, n_ctx=ref["n_ctx"]), ids)
    rounded = _log_probs(ReferenceModel(path, n_ctx=ref["n_ctx"], rounded=True), ids)

    def at_top(lp):
        return np.take_along_axis(lp, top, -1)

    noise = np.abs(at_top(exact) - at_top(rounded))
    diff = np.abs(at_top(exact) - want)
    flips_noise = int(np.sum(exact.argmax(-1) != rounded.argmax(-1)))
    flips = int(np.sum(exact.argmax(-1) != top[:, 0]))
    detail = (f"mean |Δ| {diff.mean():.2e} (roundings: {noise.mean():.2e}), top-1 differs at {flips} "
              f"(roundings: {flips_noise}) of {len(ids)}")
    assert diff.mean() <= 2 * noise.mean(), detail
    assert flips <= 2 * flips_noise + 2, detail

    g = ref["greedy"]
    seq = g["prompt_ids"] + g["ids"]
    lp = _log_probs(ReferenceModel(path, n_ctx=ref["n_ctx"]), seq)[len(g["prompt_ids"]) - 1:-1]
    best2 = np.sort(lp, axis=-1)[:, -2:]
    clear = (best2[:, 1] - best2[:, 0]) > 4 * np.quantile(noise, 0.99)
    assert clear.sum() >= len(g["ids"]) // 4, f"only {clear.sum()} clear greedy steps"
    assert np.array_equal(lp.argmax(-1)[clear], np.array(g["ids"])[clear])


def _layers(m, **kw):
    m.cfg = dataclasses.replace(m.cfg, layers=tuple(dataclasses.replace(lc, **kw) for lc in m.cfg.layers))


def _cfg(m, **kw):
    m.cfg = dataclasses.replace(m.cfg, **kw)


def _moe(m, **kw):
    _cfg(m, moe=dataclasses.replace(m.cfg.moe, **kw))


def _drop(m, *roles):
    for layer in m.wt.layers:
        for r in roles:
            layer[r] = None


def _share(m, il, src):
    layers = list(m.cfg.layers)
    layers[il] = dataclasses.replace(layers[il], kv_layer=src)
    _cfg(m, layers=tuple(layers))


def _weights(m, role, fn):
    """Every layer's tensor of role replaced by fn(its float64 values)."""
    for layer in m.wt.layers:
        if layer[role] is not None:
            m._w[layer[role].name] = fn(m.w(layer[role]))


def _rotate_all(m):
    """RoPE over the whole head, the dimensions past rope.dimension_count with a LongRoPE factor of 1."""
    _cfg(m, n_rot=m.cfg.head_dim_k)
    for info in (m.wt.rope_long, m.wt.rope_short):
        f = m.w(info)
        m._w[info.name] = np.concatenate([f, np.ones(m.cfg.n_rot // 2 - len(f))])


def _gate_open(m):
    """The attention output gate read as absent: its rows of attn_q zeroed (sigmoid(0) = 1/2 on every
    head) and attn_output doubled to undo the half."""
    hd = m.cfg.head_dim_k

    def no_gate(w):
        w = w.reshape(m.cfg.n_head, 2, hd, -1).copy()
        w[:, 1] = 0.0
        return w.reshape(2 * m.cfg.n_head * hd, -1)

    _weights(m, "wq", no_gate)
    _weights(m, "wo", lambda w: 2.0 * w)


# Each feature a tiny model has, misread: the reference with that change must be far outside the
# tolerance above - so the comparison would catch the graph read wrong in that way.
MISREADINGS = {
    "qwen2": {"no q/k/v biases": lambda m: _drop(m, "bq", "bk", "bv"),
              "no output bias": lambda m: setattr(m.wt, "output_bias", None)},
    "qwen3": {"no q/k norms": lambda m: _drop(m, "attn_q_norm", "attn_k_norm")},
    "qwen3moe": {"top-k weights not renormalised": lambda m: _moe(m, norm_topk=False),
                 "one expert per token": lambda m: _moe(m, n_expert_used=1)},
    "qwen2moe": {"shared expert ungated": lambda m: _moe(m, shexp_gate=False),
                 "top-k weights renormalised": lambda m: _moe(m, norm_topk=True)},
    "phi3": {"LongRoPE's long factors": lambda m: setattr(m, "n_ctx", 1024),
             "no LongRoPE attention factor": lambda m: _cfg(m, yarn_attn_factor=1.0)},
    "phi3-long": {"LongRoPE's short factors": lambda m: setattr(m, "n_ctx", 512)},
    "phi4-mini": {"all of each head rotated": lambda m: _rotate_all(m),
                  "no LongRoPE attention factor": lambda m: _cfg(m, yarn_attn_factor=1.0)},
    "qwen35": {"no attention output gate": lambda m: _gate_open(m),
               "conv taps reversed in time": lambda m: _weights(m, "ssm_conv1d", lambda w: w[:, ::-1]),
               "no decay": lambda m: _weights(m, "ssm_a", np.zeros_like),
               "all of each head rotated": lambda m: _cfg(m, n_rot=m.cfg.head_dim_k),
               "no DeltaNet output norm weight": lambda m: _weights(m, "ssm_norm", np.ones_like)},
    "smollm3": {"RoPE on every layer": lambda m: _layers(m, use_rope=True)},
    "gemma2": {"no attention soft-cap": lambda m: _cfg(m, attn_softcap=0.0),
               "no final soft-cap": lambda m: _cfg(m, final_softcap=0.0),
               "no sliding window": lambda m: _layers(m, is_swa=False)},
    "granite": {"no residual multiplier": lambda m: _cfg(m, residual_scale=1.0),
                "no embedding multiplier": lambda m: _cfg(m, embd_scale=1.0),
                "no logit multiplier": lambda m: _cfg(m, logit_scale=1.0),
                "default attention scale": lambda m: _cfg(m, attn_scale=0.25)},
    "olmo2": {"no q/k norms": lambda m: _drop(m, "attn_q_norm", "attn_k_norm")},
    "mistral3": {"no attention temperature": lambda m: _cfg(m, attn_temp_scale=0.0),
                 "YaRN betas 32 / 1": lambda m: _cfg(m, yarn_beta_fast=32.0, yarn_beta_slow=1.0)},
    "llama-moe": {"top-k weights not renormalised": lambda m: _moe(m, norm_topk=False),
                  "one expert per token": lambda m: _moe(m, n_expert_used=1)},
    "llama-bias-ropefreqs": {"no rope_freqs": lambda m: setattr(m.wt, "rope_freqs", None),
                             "no output-projection bias": lambda m: _drop(m, "bo")},
    "llama-linear": {"no linear scaling": lambda m: _layers(m, rope_scale=1.0)},
    "llama-yarn": {"linear instead of YaRN": lambda m: _cfg(m, yarn_ext_factor=0.0, yarn_attn_factor=1.0)},
    "gemma4": {"no per-layer embeddings": lambda m: _cfg(m, n_embd_per_layer=0),
               "no layer output scale": lambda m: _drop(m, "out_scale"),
               "no v norm": lambda m: _cfg(m, v_norm=False),
               "layer 4 on layer 1's KV cache": lambda m: _share(m, 4, 1),
               "global layers rotated whole": lambda m: setattr(m.wt, "rope_freqs", None),
               "no final soft-cap": lambda m: _cfg(m, final_softcap=0.0)},
}
N_MISREAD = 128  # positions compared


@pytest.mark.parametrize("name,what", [(n, w) for n, ws in MISREADINGS.items() for w in ws])
def test_a_misread_graph_would_fail(built, name, what):
    path, ref = built(name)
    tf = ref["teacher_forced"]
    ids, top = tf["ids"][:N_MISREAD], np.array(tf["top_ids"][:N_MISREAD])
    want = np.array(tf["top_logprobs"][:N_MISREAD])
    exact = _log_probs(ReferenceModel(path, n_ctx=ref["n_ctx"]), ids)
    rounded = _log_probs(ReferenceModel(path, n_ctx=ref["n_ctx"], rounded=True), ids)
    tolerance = 2 * np.abs(np.take_along_axis(exact - rounded, top, -1)).mean()
    wrong = ReferenceModel(path, n_ctx=ref["n_ctx"])
    MISREADINGS[name][what](wrong)
    diff = np.abs(np.take_along_axis(_log_probs(wrong, ids), top, -1) - want).mean()
    assert diff > 3 * tolerance, f"{what}: mean |Δ| {diff:.2e}, tolerance {tolerance:.2e}"
