"""The architecture modules (models/*): what each reads from a file, and the one-line errors for
files edgellm runs only in part - a tensor the architecture does not use, a feature an engine lacks,
per-layer hyperparameters."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf import GGUFValueType as VT

import tiny_archs
from edgellm import models
from edgellm.errors import UnsupportedModelError
from edgellm.gguf_file import GGUFFile
from edgellm.kv_cache import head_sizes, kv_rotation, slot_bytes
from edgellm.quants import QType
from edgellm.models.base import FEATURE_NAMES, check_features, features_of
from edgellm.models.tensors import bind_weights
from gguf_builders import write_gguf

# what each tiny model needs, as its description says (the float64 reference turns each feature
# into arithmetic; tests/test_arch_reference.py checks that arithmetic against llama.cpp)
FEATURES = {
    "qwen2": {"qkv_bias", "output_bias"},
    "qwen3": {"qk_norm_head"},
    "qwen3moe": {"qk_norm_head", "moe"},
    "qwen2moe": {"qkv_bias", "moe", "shared_expert", "shared_expert_gate"},
    "phi3": {"fused_qkv", "fused_gate_up", "longrope", "q_scale"},
    "phi4-mini": {"fused_qkv", "fused_gate_up", "longrope", "q_scale"},
    "smollm3": {"rope_skip"},
    "gemma2": {"attn_softcap", "final_softcap", "sliding_window", "post_norms", "embd_scale", "q_scale", "gelu"},
    "granite": {"embd_scale", "residual_scale", "logit_scale"},
    "granitemoe": {"embd_scale", "residual_scale", "logit_scale", "moe", "shared_expert"},
    "olmo2": {"no_pre_norm", "qk_norm_all", "post_norms"},
    "mistral3": {"rope_yarn", "rope_linear", "attn_temp"},
    "llama-moe": {"moe"},
    "llama-bias-ropefreqs": {"qkv_bias", "attn_out_bias", "rope_freqs"},
    "llama-linear": {"rope_linear"},
    "llama-yarn": {"rope_yarn", "rope_linear"},
    "gemma4": {"final_softcap", "sliding_window", "post_norms", "embd_scale", "gelu", "qk_norm_head", "rope_freqs",
               "layer_sizes", "kv_shared", "v_from_k", "v_norm", "rope_freqs_layers", "per_layer_embd",
               "layer_out_scale"},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out, cache = tmp_path_factory.mktemp("tiny"), {}

    def get(name):
        if name not in cache:
            g = GGUFFile(tiny_archs.build(name, out))
            cfg = models.load_config(g)
            cache[name] = g, cfg, bind_weights(g, cfg)
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_features_of_each_tiny_model(tiny, name):
    _, cfg, w = tiny(name)
    assert features_of(cfg, w) == FEATURES[name]
    assert FEATURES[name] <= FEATURE_NAMES


def test_phi3_reads_longrope_and_drops_the_window(tiny):
    _, cfg, w = tiny("phi3")
    assert cfg.n_swa == 0 and not any(lc.is_swa for lc in cfg.layers)  # llama.cpp turns phi3's window off
    assert cfg.n_ctx_orig == 600 and cfg.yarn_ext_factor == 0.0
    assert cfg.yarn_attn_factor == pytest.approx(1.1902)
    assert w.rope_factors(512, cfg.n_ctx_orig) is w.rope_short
    assert w.rope_factors(1024, cfg.n_ctx_orig) is w.rope_long


def test_phi4_mini_rotates_part_of_each_head_and_ties_the_output(tiny):
    g, cfg, w = tiny("phi4-mini")
    assert (cfg.n_rot, cfg.head_dim_k, cfg.n_head, cfg.n_head_kv) == (12, 16, 4, 2)
    assert "output.weight" not in g.tensors and w.output is w.tok_embd
    assert w.rope_factors(512, cfg.n_ctx_orig) is w.rope_short and w.rope_short.shape == (6,)  # n_rot / 2
    assert cfg.n_ctx_orig == 4096 and cfg.yarn_attn_factor == pytest.approx(1.190238)


def test_qwen3_files_carry_qwen3s_template(tiny):
    """Not the one of the Qwen 2 vocabulary they borrow."""
    import llamacpp_source

    for name in ("qwen3", "qwen3moe"):
        assert tiny(name)[0].metadata["tokenizer.chat_template"] == llamacpp_source.template("Qwen-Qwen3-0.6B")


def test_layer_patterns(tiny):
    assert [lc.use_rope for lc in tiny("smollm3")[1].layers] == [True, True, True, False]
    g2 = tiny("gemma2")[1]
    assert [lc.is_swa for lc in g2.layers] == [True, False, True, False] and g2.n_swa == 32


def test_engine_without_a_feature_says_which(tiny):
    _, cfg, w = tiny("qwen2moe")
    with pytest.raises(UnsupportedModelError) as e:
        check_features(cfg, w, FEATURE_NAMES - {"moe", "shared_expert_gate"}, "c")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("qwen2moe: the c engine does not run")
    assert "mixture of experts" in msg and "sigmoid gate on the shared expert" in msg
    check_features(cfg, w, FEATURE_NAMES, "c")  # everything implemented: no error


def test_unused_tensor_is_named(tiny, tmp_path):
    g, cfg, _ = tiny("gemma2")
    # gemma2 always uses the embedding matrix as output: an output.weight is left over
    info = g.tensors["token_embd.weight"]
    g2 = GGUFFile(g.path)
    g2.tensors["output.weight"] = dataclasses.replace(info, name="output.weight")
    with pytest.raises(UnsupportedModelError, match="'output.weight'.*gemma2 model does not use"):
        bind_weights(g2, cfg)


@pytest.mark.parametrize("arch", ["llama", "mistral3"])
def test_llama_experts_are_n_ff_wide_and_never_shared(tiny, arch):
    """llama.cpp's llama and mistral3 loaders make experts n_ff wide whatever
    expert_feed_forward_length says and read no shared expert: its key is ignored, and a file with
    its tensors is refused (llama.cpp refuses it too: tensors it does not create)."""
    g0, _, _ = tiny("llama-moe")
    g = GGUFFile(g0.path)
    g.metadata = {(f"{arch}." + k[len("llama."):] if k.startswith("llama.") else k): v for k, v in g0.metadata.items()}
    g.metadata["general.architecture"] = arch
    g.metadata[f"{arch}.expert_feed_forward_length"] = 32
    g.metadata[f"{arch}.expert_shared_feed_forward_length"] = 64
    cfg = models.load_config(g)
    assert (cfg.moe.n_ff_exp, cfg.moe.n_ff_shexp, cfg.moe.norm_topk) == (cfg.n_ff, 0, True)
    bind_weights(g, cfg)
    info = g.tensors["blk.0.ffn_down_exps.weight"]
    g.tensors["blk.0.ffn_down_shexp.weight"] = dataclasses.replace(info, name="blk.0.ffn_down_shexp.weight")
    with pytest.raises(UnsupportedModelError, match=f"'blk.0.ffn_down_shexp.weight'.*{arch} model does not use"):
        bind_weights(g, cfg)


def test_per_layer_head_counts_are_refused(tmp_path):
    md = {"llama.block_count": (VT.UINT32, 2), "llama.embedding_length": (VT.UINT32, 32),
          "llama.feed_forward_length": (VT.UINT32, 64), "llama.attention.head_count": (VT.UINT32, 2),
          "llama.attention.head_count_kv": (VT.ARRAY, [1, 2], VT.UINT32), "llama.vocab_size": (VT.UINT32, 8)}
    path = write_gguf(tmp_path / "x.gguf", md, {"token_embd.weight": np.zeros((8, 32), np.float32)})
    with pytest.raises(UnsupportedModelError, match="per-layer values of llama.attention.head_count_kv"):
        models.load_config(GGUFFile(path))


@pytest.mark.parametrize("factor", [-4.0, float("nan"), float("inf")])
def test_bad_rope_scaling_factor_is_refused(tmp_path, factor):
    """Found by scripts/fuzz.py gguf: a negative YaRN factor reached math.log (ValueError)."""
    from edgellm.errors import GGUFError

    md = {"llama.block_count": (VT.UINT32, 1), "llama.embedding_length": (VT.UINT32, 32),
          "llama.feed_forward_length": (VT.UINT32, 64), "llama.attention.head_count": (VT.UINT32, 2),
          "llama.vocab_size": (VT.UINT32, 8), "llama.rope.scaling.type": (VT.STRING, "yarn"),
          "llama.rope.scaling.factor": (VT.FLOAT32, factor)}
    path = write_gguf(tmp_path / "x.gguf", md, {"token_embd.weight": np.zeros((8, 32), np.float32)})
    with pytest.raises(GGUFError, match="rope scaling factor must be a positive number"):
        models.load_config(GGUFFile(path))


@pytest.mark.parametrize("name", ["qwen3moe", "qwen2moe"])
def test_decode_bytes_count_the_chosen_experts(tmp_path, name):
    """bench's bytes per decode step take n_expert_used of n_expert experts from each stacked
    expert tensor (a step reads only the chosen ones), all of every other layer tensor."""
    from edgellm import LLM
    from edgellm.bench import weight_bytes_per_token

    llm = LLM(tiny_archs.build(name, tmp_path))
    ts, moe = llm.gguf.tensors, llm.config.moe
    want = sum(t.nbytes * moe.n_expert_used // moe.n_expert if "_exps." in n else t.nbytes
               for n, t in ts.items() if n.startswith("blk."))
    embd = ts["token_embd.weight"].nbytes
    want += ts["output_norm.weight"].nbytes + (ts["output.weight"].nbytes + embd // llm.n_vocab
                                               if "output.weight" in ts else embd)
    assert weight_bytes_per_token(llm) == want


def test_gemma4_reads_per_layer_sizes_and_shared_caches(tiny):
    """As llama.cpp's gemma4 loader: window layers with key_length_swa and rope.dimension_count_swa,
    key/value heads and FFN widths per layer, the last shared_kv_layers layers on the caches of the
    last window / global layer before them, rope_freqs on the global layers only."""
    g, cfg, w = tiny("gemma4")
    sizes = [lc.sizes(cfg) for lc in cfg.layers]  # (head_dim_k, head_dim_v, n_head_kv, n_ff, n_rot)
    assert sizes == [(16, 16, 2, 128, 16)] * 3 + [(32, 32, 1, 128, 32), (16, 16, 2, 256, 16), (32, 32, 1, 256, 32)]
    assert [lc.is_swa for lc in cfg.layers] == [True, True, True, False, True, False] and cfg.n_swa == 32
    assert [lc.kv_layer for lc in cfg.layers] == [-1, -1, -1, -1, 2, 3]
    assert [lc.rope_freqs for lc in cfg.layers] == [not lc.is_swa for lc in cfg.layers]
    assert [lc.rope_base for lc in cfg.layers] == [1e4, 1e4, 1e4, 1e6, 1e4, 1e6]
    assert (cfg.attn_scale, cfg.q_scale, cfg.v_norm, cfg.n_embd_per_layer) == (1.0, 1.0, True, 16)
    assert cfg.final_softcap == 10.0
    assert w.output is w.tok_embd and w.layers[3]["wv"] is None and w.ple_embd.shape == (6 * 16, cfg.n_vocab)
    # f16 bytes per slot: global layer 3 (1 head of 32), window layers 0 - 2 (2 heads of 16); 4 and 5 hold none
    assert slot_bytes(cfg, (QType.F16, QType.F16)) == (1 * 2 * 32 * 2, 3 * 2 * 2 * 16 * 2)
    # a quantized cache's types and rotation chunks fit every layer's heads (E2B: 256 and 512)
    assert head_sizes(cfg) == (16, 16)
    e2b = dataclasses.replace(cfg, head_dim_k=512, head_dim_v=512, layers=tuple(
        dataclasses.replace(lc, head_dim=256 if lc.is_swa else 0) for lc in cfg.layers))
    assert head_sizes(e2b) == (256, 256) and kv_rotation(256, 256, (QType.Q8_0, QType.Q8_0)) == (256, 64)


def _gemma4_variant(tiny, **changes):
    g0, _, _ = tiny("gemma4")
    g = GGUFFile(g0.path)
    for key, v in changes.items():
        if v is None:
            del g.metadata[f"gemma4.{key}"]
        else:
            g.metadata[f"gemma4.{key}"] = v
    return g


@pytest.mark.parametrize("key,value,says", [
    ("attention.sliding_window_pattern", None,
     "'gemma4.attention.sliding_window_pattern' (one flag per layer) is missing"),
    ("attention.sliding_window_pattern", np.array([True, False]), "has 2 entries for 6 layers"),
    ("embedding_length_per_layer_input", None, "'gemma4.embedding_length_per_layer_input' is missing"),
    ("attention.key_length_swa", None, "'gemma4.attention.key_length_swa' is missing"),
    ("attention.value_length_swa", 8, "key_length_swa and value_length_swa must be equal"),
    ("attention.shared_kv_layers", 5, "at least 2 must have a KV cache"),
    ("attention.shared_kv_layers", 3, "layer 3 would share the KV cache of layer 2, a layer of another kind"),
    ("feed_forward_length", np.array([128, 128], dtype=np.uint32), "feed_forward_length has 2 values for 6 layers"),
    ("expert_count", 128, "mixture-of-experts layers (expert_count) are not supported"),
])
def test_gemma4_bad_or_unsupported_keys_are_named(tiny, key, value, says):
    from edgellm.errors import EdgeLLMError

    g = _gemma4_variant(tiny, **{key: value})
    with pytest.raises(EdgeLLMError) as e:
        bind_weights(g, models.load_config(g))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_gemma4_missing_tensors_are_named(tiny):
    from edgellm.errors import GGUFError

    g0, cfg, _ = tiny("gemma4")
    for name in ("rope_freqs.weight", "per_layer_model_proj.weight", "blk.2.attn_k.weight", "blk.1.inp_gate.weight"):
        g = GGUFFile(g0.path)
        del g.tensors[name]
        with pytest.raises(GGUFError, match=f"required tensor '{name}' is missing"):
            bind_weights(g, cfg)
    g = GGUFFile(g0.path)  # the layers on another's cache need no K of their own
    del g.tensors["blk.4.attn_k.weight"], g.tensors["blk.4.attn_k_norm.weight"], g.tensors["blk.4.attn_v.weight"]
    bind_weights(g, cfg)
