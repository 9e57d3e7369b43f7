"""Gemma 4 (text): Gemma 3's block with per-layer sizes, shared KV caches and per-layer embeddings.

As llama.cpp's gemma4 loader and graph (src/models/gemma4.cpp) read a file:
- Layer il slides over the last attention.sliding_window tokens where the attention.sliding_window_pattern
  array (one flag per layer, required) says so. Window layers have their own head size
  (attention.key_length_swa, = value_length_swa), rotated dims (rope.dimension_count_swa, default
  rope.dimension_count) and RoPE base (rope.freq_base_swa, default 10k, unscaled); global layers
  key_length (= value_length), rope.dimension_count, rope.freq_base and the rope scaling, and the one
  rope_freqs.weight ("proportional" RoPE: factors of 1e30 leave the dims past the rotated part
  in place). head_count_kv and feed_forward_length may be one value per layer.
- Per layer: RMS norm -> q, k, v (v = k where attn_v is absent); q and k RMS-normed per head with
  their weights, v without one; RoPE (neox) on q and k; attention with scale 1 -> post-attention norm
  -> residual; RMS norm -> GELU(tanh)-gated FFN -> post-FFN norm -> residual; then, with per-layer
  embeddings, the residual plus norm(proj(gelu(inp_gate(x)) * e_il)); the layer's output times
  layer_output_scale where the file has one.
- The last attention.shared_kv_layers layers compute no K/V: they attend to the cache of the last
  window layer / last global layer before them (n_kv - 2 / n_kv - 1, n_kv the layers with a cache).
- Per-layer embeddings (embedding_length_per_layer_input P > 0): for each token, e = (rms_norm(
  per_layer_model_proj(x0) / sqrt(n_embd)) * per_layer_proj_norm + per_layer_token_embd[token] * sqrt(P))
  / sqrt(2), x0 the scaled token embedding; e_il its il-th P values.
- Embeddings scaled by sqrt(n_embd); the output tied to them where output.weight is absent; logits
  soft-capped by final_logit_softcapping.
Mixture-of-experts layers (the 26B-A4B) are refused.
"""

from __future__ import annotations

from ..errors import GGUFError, UnsupportedModelError
from .base import (ACT_GELU_TANH, REQUIRED, ROPE_NEOX, Keys, LayerConfig, ModelConfig, _layer_count, n_vocab_of,
                   positive, rope_config, rope_params, sqrt_f32)

NAMES = ("gemma4",)
LAYER_REQUIRED = ("attn_norm", "wq", "wo", "attn_q_norm", "attn_post_norm", "ffn_norm", "w_gate", "w_up", "w_down",
            "ffn_post_norm")
# k and its norm are required on layers with a KV cache of their own (tensors.bind_weights checks)
OPTIONAL = ("wk", "wv", "attn_k_norm", "out_scale")
PER_LAYER_EMBD = ("ple_gate", "ple_proj", "ple_post_norm")


def load_config(gguf, arch: str) -> ModelConfig:
    k = Keys(gguf, arch)
    n_layer = _layer_count(k)
    n_embd = positive("n_embd", k.int("{arch}.embedding_length", REQUIRED))
    n_head = positive("n_head", k.per_layer("{arch}.attention.head_count", n_layer))
    pattern = k.raw("{arch}.attention.sliding_window_pattern")
    if pattern is None or isinstance(pattern, (str, bytes)) or not hasattr(pattern, "__len__"):
        raise GGUFError(f"required metadata key '{arch}.attention.sliding_window_pattern' (one flag per layer) "
                        "is missing")
    if len(pattern) != n_layer:
        raise GGUFError(f"{arch}.attention.sliding_window_pattern has {len(pattern)} entries for {n_layer} layers")
    swa = tuple(bool(x) for x in pattern)
    n_swa = positive("sliding_window", k.int("{arch}.attention.sliding_window", REQUIRED))
    if k.int("{arch}.expert_count", 0):
        raise UnsupportedModelError(f"{arch}: mixture-of-experts layers (expert_count) are not supported")

    hd = positive("head_dim", k.int("{arch}.attention.key_length", n_embd // n_head))
    if k.int("{arch}.attention.value_length", n_embd // n_head) != hd:
        raise GGUFError(f"{arch}: attention.key_length and value_length must be equal")
    hd_swa = positive("head_dim_swa", k.int("{arch}.attention.key_length_swa", REQUIRED))
    if k.int("{arch}.attention.value_length_swa", REQUIRED) != hd_swa:
        raise GGUFError(f"{arch}: attention.key_length_swa and value_length_swa must be equal")
    n_rot = k.int("{arch}.rope.dimension_count", hd)
    n_rot_swa = k.int("{arch}.rope.dimension_count_swa", n_rot)
    if not (0 < n_rot <= hd and n_rot % 2 == 0 and 0 < n_rot_swa <= hd_swa and n_rot_swa % 2 == 0):
        raise GGUFError(f"{arch}: rotated dims {n_rot} / {n_rot_swa} (global / window) do not fit head sizes "
                        f"{hd} / {hd_swa}")
    n_head_kv = k.layer_values("{arch}.attention.head_count_kv", n_layer, n_head)
    n_ff = k.layer_values("{arch}.feed_forward_length", n_layer, 0)
    for il in range(n_layer):
        positive(f"head_count_kv of layer {il}", n_head_kv[il])
        positive(f"feed_forward_length of layer {il}", n_ff[il])
        if n_head % n_head_kv[il]:
            raise GGUFError(f"{arch}: layer {il} has {n_head_kv[il]} key/value heads for {n_head} query heads")

    n_shared = k.int("{arch}.attention.shared_kv_layers", 0)
    n_kv = n_layer - n_shared
    if n_kv < 2 or n_shared < 0:  # llama.cpp asserts this
        raise GGUFError(f"{arch}: attention.shared_kv_layers is {n_shared} of {n_layer} layers; at least 2 must "
                        "have a KV cache")
    kv_from = [il if il < n_kv else n_kv - (2 if swa[il] else 1) for il in range(n_layer)]
    for il, src in enumerate(kv_from):
        if src != il and (swa[src] != swa[il] or n_head_kv[src] != n_head_kv[il]):
            raise UnsupportedModelError(f"{arch}: layer {il} would share the KV cache of layer {src}, "
                                        "a layer of another kind")

    rope = rope_params(k)
    base = k.float("{arch}.rope.freq_base", 10000.0)
    base_swa = k.float("{arch}.rope.freq_base_swa", 10000.0)
    # the model's sizes are those of the first global layer (of layer 0 where all slide)
    ref = swa.index(False) if False in swa else 0
    layers = tuple(LayerConfig(
        is_swa=s, rope_base=base_swa if s else base, rope_scale=1.0 if s else rope["freq_scale"],
        head_dim=hd_swa if s else 0, n_head_kv=n_head_kv[il] if n_head_kv[il] != n_head_kv[ref] else 0,
        n_ff=n_ff[il] if n_ff[il] != n_ff[ref] else 0, n_rot=n_rot_swa if s else -1,
        kv_layer=kv_from[il] if kv_from[il] != il else -1, rope_freqs=not s)
        for il, s in enumerate(swa))
    n_per_layer = k.int("{arch}.embedding_length_per_layer_input", REQUIRED)
    ple = ("ple_embd", "ple_model_proj", "ple_proj_norm") if n_per_layer else ()
    return ModelConfig(
        arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv[ref], head_dim_k=hd,
        head_dim_v=hd, n_ff=n_ff[ref], n_vocab=n_vocab_of(gguf, k), n_rot=n_rot,
        n_ctx_train=k.int("{arch}.context_length", 131072),
        rope_type=ROPE_NEOX,
        norm_eps=k.float("{arch}.attention.layer_norm_rms_epsilon", REQUIRED),
        act=ACT_GELU_TANH,
        attn_scale=1.0,
        layers=layers,
        n_swa=n_swa if any(swa) else 0,
        embd_scale=sqrt_f32(n_embd),
        final_softcap=k.float("{arch}.final_logit_softcapping", 0.0),
        v_norm=True,
        n_embd_per_layer=n_per_layer,
        **rope_config(rope),
        required_tensors=LAYER_REQUIRED + (PER_LAYER_EMBD if n_per_layer else ()),
        optional_tensors=OPTIONAL,
        global_tensors=("rope_freqs",) + ple,
        # llama.cpp requires rope_freqs where a layer is global (its "proportional" RoPE)
        required_global_tensors=ple + (("rope_freqs",) if not all(swa) else ()),
    )
