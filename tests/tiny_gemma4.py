"""The tiny Gemma 4 file (tiny_archs.SPECS["gemma4"]): the layout of the small Gemma 4 GGUFs (E2B /
E4B) at a tiny size, every tensor and key llama.cpp's gemma4 loader reads for them.

6 layers: window, window, window, global, window, global (attention.sliding_window_pattern); window
layers with 2 key/value heads of 16, 16 dims rotated (rope.freq_base_swa); global ones with 1
key/value head of 32, "proportional" RoPE (rope_freqs.weight: the first quarter of the frequencies
1, the rest 1e30 - unrotated, as llama.cpp's converter writes it) on rope.freq_base; the last 2 layers
share the KV cache of layers 2 and 3 (attention.shared_kv_layers) and have a double-wide FFN
(feed_forward_length per layer, E2B's use_double_wide_mlp); layer 3 has no attn_v (values are its
keys, as on the larger Gemma 4's global layers); per-layer input embeddings of 8 per layer
(per_layer_token_embd Q4_0, per_layer_model_proj, per_layer_proj_norm, and inp_gate / proj /
post_norm in each layer); a layer_output_scale on each layer; the output tied to the F16 embeddings;
logits soft-capped. The vocabulary is llama.cpp's ggml-vocab-gemma-4.gguf with its chat template."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf import GGUFValueType as VT

import tiny_archs

N_LAYER, N_EMBD, N_HEAD, N_PER_LAYER = 6, 64, 4, 16
SWA = (True, True, True, False, True, False)
N_SHARED = 2                   # the last 2 layers borrow the caches of layers 2 (window) and 3 (global)
HEAD, HEAD_SWA = 32, 16
KV_HEADS, KV_HEADS_SWA = 1, 2
N_FF = 128                     # 2 * N_FF on the KV-sharing layers
ROT_FRACTION = 0.25            # of the global layers' frequencies rotated (the rest: factor 1e30)
NO_V = (3,)                    # layers without attn_v


def metadata(spec, chat=None) -> list[tuple]:
    a = spec.arch
    n_ff = [N_FF if il < N_LAYER - N_SHARED else 2 * N_FF for il in range(N_LAYER)]
    kv = [KV_HEADS_SWA if s else KV_HEADS for s in SWA]
    md = [("general.name", VT.STRING, f"tiny-{a}", None),
          (f"{a}.block_count", VT.UINT32, N_LAYER, None),
          (f"{a}.context_length", VT.UINT32, 4096, None),
          (f"{a}.embedding_length", VT.UINT32, N_EMBD, None),
          (f"{a}.feed_forward_length", VT.ARRAY, n_ff, VT.UINT32),
          (f"{a}.attention.head_count", VT.UINT32, N_HEAD, None),
          (f"{a}.attention.head_count_kv", VT.ARRAY, kv, VT.UINT32),
          (f"{a}.attention.key_length", VT.UINT32, HEAD, None),
          (f"{a}.attention.value_length", VT.UINT32, HEAD, None),
          (f"{a}.attention.key_length_swa", VT.UINT32, HEAD_SWA, None),
          (f"{a}.attention.value_length_swa", VT.UINT32, HEAD_SWA, None),
          (f"{a}.rope.dimension_count", VT.UINT32, HEAD, None),
          (f"{a}.rope.dimension_count_swa", VT.UINT32, HEAD_SWA, None),
          (f"{a}.attention.layer_norm_rms_epsilon", VT.FLOAT32, 1e-6, None),
          (f"{a}.attention.sliding_window_pattern", VT.ARRAY, list(SWA), VT.BOOL),
          (f"{a}.attention.shared_kv_layers", VT.UINT32, N_SHARED, None),
          (f"{a}.embedding_length_per_layer_input", VT.UINT32, N_PER_LAYER, None)]
    md += [(f"{a}.{k}", vt, v, None) for k, (vt, v) in spec.keys.items()]
    tok = tiny_archs._tokenizer_fields(spec.vocab)
    if chat is not None:
        tok = tiny_archs._chat_fields(tok, chat)
    return md + tok


def tensors(spec, n_vocab: int) -> dict:
    r = tiny_archs.Rand(spec.seed)
    E, P, L = N_EMBD, N_PER_LAYER, N_LAYER
    gain = tiny_archs.RESIDUAL_GAIN
    n_rot = int(HEAD * ROT_FRACTION / 2)
    t = {"token_embd.weight": r.matrix(E, n_vocab, scale=tiny_archs.HEAD_SCALE, qtype=tiny_archs.HEAD_TYPE),
         "per_layer_token_embd.weight": r.matrix(L * P, n_vocab, scale=1.0, qtype=GT.Q4_0),
         "per_layer_model_proj.weight": r.matrix(E, L * P),
         "per_layer_proj_norm.weight": r.norm(P),
         "rope_freqs.weight": np.array([1.0] * n_rot + [1e30] * (HEAD // 2 - n_rot), dtype=np.float32),
         "output_norm.weight": r.norm(E)}
    for il, swa in enumerate(SWA):
        p = f"blk.{il}."
        hd, kvh = (HEAD_SWA, KV_HEADS_SWA) if swa else (HEAD, KV_HEADS)
        qd, kd = N_HEAD * hd, kvh * hd
        F = N_FF if il < L - N_SHARED else 2 * N_FF
        t[p + "attn_norm.weight"] = r.norm(E)
        t[p + "attn_q.weight"] = r.matrix(E, qd)
        t[p + "attn_k.weight"] = r.matrix(E, kd)
        if il not in NO_V:
            t[p + "attn_v.weight"] = r.matrix(E, kd)
        t[p + "attn_q_norm.weight"] = r.norm(hd)
        t[p + "attn_k_norm.weight"] = r.norm(hd)
        t[p + "attn_output.weight"] = r.matrix(qd, E, scale=gain * qd ** -0.5)
        t[p + "post_attention_norm.weight"] = r.norm(E)
        t[p + "ffn_norm.weight"] = r.norm(E)
        t[p + "ffn_gate.weight"] = r.matrix(E, F)
        t[p + "ffn_up.weight"] = r.matrix(E, F)
        t[p + "ffn_down.weight"] = r.matrix(F, E, scale=gain * F ** -0.5)
        t[p + "post_ffw_norm.weight"] = r.norm(E)
        t[p + "inp_gate.weight"] = r.matrix(E, P)
        t[p + "proj.weight"] = r.matrix(P, E, scale=gain * P ** -0.5)
        t[p + "post_norm.weight"] = r.norm(E)
        t[p + "layer_output_scale.weight"] = np.array([0.25 + 0.75 * r.rng.random()], dtype=np.float32)
    return t
