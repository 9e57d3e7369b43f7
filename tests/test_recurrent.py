"""A model with recurrent layers (qwen35's gated DeltaNet, on its tiny model from tests/tiny_archs.py)
keeps a state per sequence beside its KV blocks (kv_cache.KVPool, csrc/delta_net.c). Whatever the
cache does to a sequence must leave it what evaluating its tokens from scratch gives: a new prompt
sharing a prefix with the last, a fork, a context shift, a sequence started in a freed slot, prefill
in chunks, several sequences in one step. What cannot hold for such a state (rollback: speculative
decoding; saved sessions; the prefix cache) is refused with one line or switched off. Each on the
best C path and on numba (numba_delta_net's twins of csrc/delta_net.c and its own state slots)."""

from __future__ import annotations

import numpy as np
import pytest

import edgellm
import tiny_archs
from conftest import engine_paths, use_engine_path
from edgellm.batch import Step
from edgellm.errors import EdgeLLMError
from edgellm.sampling import SamplingParams
from edgellm.scheduler import BatchEngine

PATHS = engine_paths()
LEAN_PATHS = PATHS[-2:]  # the best C path (where built) and numba


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_archs.build("qwen35", tmp_path_factory.mktemp("recurrent"))


@pytest.fixture(scope="module", params=LEAN_PATHS)
def llm(request, path):
    with pytest.MonkeyPatch.context() as mp:
        use_engine_path(mp, request.param)
        out = edgellm.LLM(path, n_ctx=256, n_batch=16, n_threads=2)
        out._pool  # noqa: B018 - the engine is made now, on this path
    return out


@pytest.fixture(scope="module")
def ids(llm):
    text = ("The license grants each contributor's patent rights to those who make, use and sell the work, "
            "under the terms and conditions stated below and in the notice.")
    out = llm.tokenize(text)
    assert len(out) > 30
    return out


def _fresh(llm, tokens) -> np.ndarray:
    """The last logits of tokens evaluated from an empty state, one token at a time."""
    s = llm.session()
    for t in tokens:
        z = s.feed([t])
    s.close()
    return z


def test_chunks_and_single_tokens_agree(llm, ids):
    """Prefill chunks of n_batch (16) carry the state over: close to token by token (the batch
    path's float orders differ a little from the single token's, as llama.cpp's do)."""
    s = llm.session()
    z = s.feed(ids)
    assert len(ids) > llm.n_batch
    np.testing.assert_allclose(z, _fresh(llm, ids), atol=2e-2)
    assert np.argmax(z) == np.argmax(_fresh(llm, ids))


def test_a_prompt_sharing_a_prefix_is_evaluated_again(llm, ids):
    """_prefill keeps a common prefix of KV slots, but not of a recurrent state: it starts over."""
    s = llm.session()
    s._prefill(ids[:20])
    other = ids[:12] + ids[25:35]
    got = np.array(s._prefill(other))
    want = llm.session()._prefill(other)
    np.testing.assert_array_equal(got, np.array(want))


def test_fork_copies_the_state(llm, ids):
    a = llm.session()
    a.feed(ids[:16])
    b = a.fork()
    za, zb = a.feed(ids[16:20]), b.feed(ids[30:33])
    for z, rest in ((za, ids[16:20]), (zb, ids[30:33])):
        alone = llm.session()
        alone.feed(ids[:16])
        np.testing.assert_array_equal(z, alone.feed(rest))


def test_a_freed_slot_starts_empty(llm, ids):
    first = llm.session()
    want = first.feed(ids[:10])
    first.close()
    del first
    again = llm.session()  # takes the lowest free slot: the one just freed
    np.testing.assert_array_equal(again.feed(ids[:10]), want)
    s = llm.session()
    s.feed(ids[10:20])
    s.reset()  # an emptied sequence's state is zeroed too
    np.testing.assert_array_equal(s.feed(ids[:10]), want)


def test_context_shift_evaluates_the_kept_tokens_again(llm, ids):
    s = llm.session()
    s.feed(ids[:30])
    s._make_room(4)  # drops half of what follows the first 4 tokens
    kept = s.tokens
    assert len(kept) < 30 and kept[:4] == ids[:4]
    want = llm.session()
    want.feed(kept)
    np.testing.assert_array_equal(s.feed(ids[30:32]), want.feed(ids[30:32]))


def test_batched_engine_sequences_keep_their_own_state(llm, ids):
    """Several sequences in each step, forks (n=2), the prefix cache asked for but off: every
    greedy completion is what the request gets alone."""
    prompts = [ids[:20], ids[:20] + ids[40:44], ids[5:9]]

    def run(ps, n=1):
        eng = BatchEngine(llm, max_seqs=4, prefix_cache=True)
        assert not eng.prefix_cache
        out = []
        for p in ps:
            r = eng.submit(p, max_tokens=8, sampling=SamplingParams(temperature=0), ignore_eos=True, n=n)
            out += r if isinstance(r, list) else [r]
        eng.run_until_done(out)
        assert all(r.error is None for r in out)
        return [r.generated for r in out]

    alone = [run([p])[0] for p in prompts]
    assert run(prompts) == alone
    assert run(prompts[:1], n=2) == [alone[0], alone[0]]
    s = llm.session()
    got = [int(np.argmax(s._prefill(prompts[1])))]
    assert got[0] == alone[1][0]


def test_a_step_with_a_bad_state_slot_is_refused(llm, ids):
    """el_dn_check_batch on both engines: a sequence's slot out of range, or two sequences of a
    step in one slot, refuse the step with one line before it runs."""
    eng, pool = llm._engine, llm._pool
    seqs = [pool.new_sequence() for _ in range(2)]
    try:
        st = Step()
        for s, p in zip(seqs, (ids[:3], ids[3:5])):
            pool.reserve(s, len(p))
            st.add(s, p)
        for slot, says in ((seqs[0].rs, f"sequences 0 and 1 share recurrent state slot {seqs[0].rs}"),
                           (10 ** 6, "sequence 1: recurrent state slot 1000000 of")):
            mb = st._pack(eng)
            eng.batch.rs_slot[1] = slot
            with pytest.raises(EdgeLLMError, match=f"^bad batch: {says}") as e:
                eng.decode(st.n_tokens, 2, mb)
            assert "\n" not in str(e.value)
    finally:
        for s in seqs:
            pool.release(s)


def test_what_cannot_hold_is_refused(llm, ids, tmp_path):
    s = llm.session()
    s.feed(ids[:8])
    for call in (lambda: s.save_state(tmp_path / "s.state"), lambda: s.load_state(tmp_path / "s.state")):
        with pytest.raises(EdgeLLMError, match="recurrent state") as e:
            call()
        assert "\n" not in str(e.value)
    eng = BatchEngine(llm, max_seqs=2)
    for call in (lambda: eng.save_state(tmp_path / "b.state", ids[:8]), lambda: eng.load_state(tmp_path / "b.state")):
        with pytest.raises(EdgeLLMError, match="recurrent state"):
            call()
    with pytest.raises(EdgeLLMError, match="speculative decoding .* cannot be rolled back"):
        list(llm.generate("Hello", max_tokens=4, speculative="lookup"))
    with pytest.raises(EdgeLLMError, match="cannot be rolled back"):
        BatchEngine(llm, speculative="lookup")


@pytest.mark.parametrize("key,value,says", [
    ("ssm.state_size", None, "'qwen35.ssm.state_size' is missing"),
    ("ssm.conv_kernel", None, "'qwen35.ssm.conv_kernel' is missing"),
    ("rope.dimension_sections", None, "'qwen35.rope.dimension_sections' is missing"),
    ("ssm.inner_size", 48, "ssm.inner_size is 48, not ssm.state_size x ssm.time_step_rank"),
    ("ssm.group_count", 3, "time_step_rank (4) is not a multiple of ssm.group_count (3)"),
    ("full_attention_interval", 4, "'blk.1.attn_qkv.weight'"),  # layer 1 becomes DeltaNet: its tensors are missing
])
def test_bad_hyperparameters_are_refused(path, key, value, says):
    """Each hyperparameter llama.cpp's qwen35 loader reads, missing or inconsistent with the tensors:
    one line naming it (or the tensor that then does not fit), before any engine runs."""
    from edgellm import models
    from edgellm.gguf_file import GGUFFile
    from edgellm.models.tensors import bind_weights

    g = GGUFFile(path)
    if value is None:
        del g.metadata[f"qwen35.{key}"]
    else:
        g.metadata[f"qwen35.{key}"] = value
    with pytest.raises(EdgeLLMError) as e:
        bind_weights(g, models.load_config(g))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_multi_token_prediction_head_is_not_run(path):
    """nextn_predict_layers blocks after the trunk are llama.cpp's draft head: bound as the file's
    (no tensor left over), not run."""
    from edgellm import models
    from edgellm.gguf_file import GGUFFile
    from edgellm.models.tensors import bind_weights

    g = GGUFFile(path)
    g.metadata["qwen35.nextn_predict_layers"] = 1
    cfg = models.load_config(g)
    assert cfg.n_layer == 3 and len(bind_weights(g, cfg).layers) == 3
