"""Tiny random llama / gemma3 GGUF models, written with gguf-py's writer, for engine tests.

Shapes are the smallest that every quant type accepts (row lengths multiple of 256 for the
K-quants). Weights are random normal; norms are near 1. The vocabulary is a small SPM one
(control tokens + 256 byte tokens + a few words), so `edgellm.LLM` can load these files too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFValueType as VT

from edgellm.kernels.quant_ops import BACKENDS, quantize_rows
from edgellm.quants import QType
from gguf_builders import write_gguf

ARCHS = ("llama", "gemma3")  # the architectures tiny_model() builds (tests parametrize over them)
WORDS = ["▁the", "▁a", "▁cat", "▁dog", "▁sat", "▁on", "▁mat", "▁hello", "▁world", "<|im_start|>", "<|im_end|>"]


def vocab() -> tuple[list[str], list[float], list[int]]:
    """Control tokens, 256 byte tokens, then SPM pieces: single characters and every prefix of the
    words (so merges can reach them; longer pieces score higher), then two chat markers."""
    words = [w for w in WORDS if w.startswith("▁")]
    pieces = sorted({"▁"} | set("abcdefghijklmnopqrstuvwxyz") | {w[:i] for w in words for i in range(2, len(w) + 1)},
                    key=lambda p: (len(p), p))
    specials = [w for w in WORDS if not w.startswith("▁")]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + pieces + specials
    scores = [0.0] * 259 + [float(len(p)) for p in pieces] + [0.0] * len(specials)
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces) + [3] * len(specials)  # unknown, control, byte, normal
    return tokens, scores, types


def _quant_backend() -> str:
    from edgellm.kernels import c_module

    return "c" if c_module() is not None else BACKENDS[1]


def _weight(rng, qtype: QType, rows: int, cols: int, scale: float):
    w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    if qtype == QType.F32:
        return w
    if qtype == QType.F16:
        return w.astype(np.float16)
    return (qtype, quantize_rows(qtype, w, _quant_backend()))


def tiny_model(path: Path, arch: str = "llama", qtype: QType = QType.Q8_0, *, n_layer: int | None = None,
               n_embd: int = 256, n_head: int = 4, n_head_kv: int = 2, head_dim: int = 64, n_ff: int = 512,
               n_swa: int = 8, seed: int = 0, tied: bool = True, ctx: int = 2048) -> Path:
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocab()
    n_vocab = len(tokens)
    if n_layer is None:
        n_layer = 6 if arch == "gemma3" else 2
    md = {
        f"{arch}.block_count": (VT.UINT32, n_layer),
        f"{arch}.context_length": (VT.UINT32, ctx),
        f"{arch}.embedding_length": (VT.UINT32, n_embd),
        f"{arch}.feed_forward_length": (VT.UINT32, n_ff),
        f"{arch}.attention.head_count": (VT.UINT32, n_head),
        f"{arch}.attention.head_count_kv": (VT.UINT32, n_head_kv),
        f"{arch}.attention.key_length": (VT.UINT32, head_dim),
        f"{arch}.attention.value_length": (VT.UINT32, head_dim),
        f"{arch}.attention.layer_norm_rms_epsilon": (VT.FLOAT32, 1e-6),
        f"{arch}.rope.freq_base": (VT.FLOAT32, 10000.0),
        "tokenizer.ggml.model": (VT.STRING, "llama"),
        "tokenizer.ggml.tokens": (VT.ARRAY, tokens, VT.STRING),
        "tokenizer.ggml.scores": (VT.ARRAY, scores, VT.FLOAT32),
        "tokenizer.ggml.token_type": (VT.ARRAY, types, VT.INT32),
        "tokenizer.ggml.bos_token_id": (VT.UINT32, 1),
        "tokenizer.ggml.eos_token_id": (VT.UINT32, 2),
        "tokenizer.ggml.unknown_token_id": (VT.UINT32, 0),
        "tokenizer.ggml.add_bos_token": (VT.BOOL, True),
    }
    if arch == "gemma3":
        md[f"{arch}.attention.sliding_window"] = (VT.UINT32, n_swa)
        md[f"{arch}.rope.freq_base"] = (VT.FLOAT32, 1000000.0)
    E, F = n_embd, n_ff
    qd, kd = n_head * head_dim, n_head_kv * head_dim

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {"token_embd.weight": _weight(rng, qtype, n_vocab, E, 1.0), "output_norm.weight": norm(E)}
    if not tied:
        t["output.weight"] = _weight(rng, qtype, n_vocab, E, 0.05)
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(E)
        t[p + "attn_q.weight"] = _weight(rng, qtype, qd, E, E ** -0.5)
        t[p + "attn_k.weight"] = _weight(rng, qtype, kd, E, E ** -0.5)
        t[p + "attn_v.weight"] = _weight(rng, qtype, kd, E, E ** -0.5)
        t[p + "attn_output.weight"] = _weight(rng, qtype, E, qd, qd ** -0.5)
        t[p + "ffn_norm.weight"] = norm(E)
        t[p + "ffn_gate.weight"] = _weight(rng, qtype, F, E, E ** -0.5)
        t[p + "ffn_up.weight"] = _weight(rng, qtype, F, E, E ** -0.5)
        t[p + "ffn_down.weight"] = _weight(rng, qtype, E, F, F ** -0.5)
        if arch == "gemma3":
            t[p + "attn_q_norm.weight"] = norm(head_dim)
            t[p + "attn_k_norm.weight"] = norm(head_dim)
            t[p + "post_attention_norm.weight"] = norm(E)
            t[p + "post_ffw_norm.weight"] = norm(E)
    return write_gguf(path, md, t, arch=arch)


def chain_model(path: Path, tokens: list[str], types: list[int], successor: dict[int, int], *,
                special: dict[str, int], chat_template: str | None = None, ctx: int = 2048) -> Path:
    """A llama GGUF (SPM vocabulary `tokens` with GGUF token `types`) that always answers token i
    with token successor[i], whatever came before: one layer whose weights are all zero, so the
    hidden state is the token's embedding, one-hot for each token with a successor, and the output
    row of successor[i] reads token i's dimension (logit 50 against 0 for every other token; a
    token without a successor has logits all 0). special: tokenizer.ggml.<name>_token_id values
    (bos, eos, ...)."""
    n_embd = 256
    if len(successor) > n_embd:
        raise ValueError(f"at most {n_embd} tokens with a successor")
    n_vocab = len(tokens)
    embd = np.zeros((n_vocab, n_embd), np.float32)
    out = np.zeros((n_vocab, n_embd), np.float32)
    for dim, (tok, nxt) in enumerate(sorted(successor.items())):
        embd[tok, dim] = 1.0
        out[nxt, dim] = 50.0 / np.sqrt(n_embd)  # (the norm scales a one-hot state by sqrt(n_embd))
    arch, n_head, n_head_kv, head_dim, n_ff = "llama", 4, 2, 64, 512
    md = {
        f"{arch}.block_count": (VT.UINT32, 1),
        f"{arch}.context_length": (VT.UINT32, ctx),
        f"{arch}.embedding_length": (VT.UINT32, n_embd),
        f"{arch}.feed_forward_length": (VT.UINT32, n_ff),
        f"{arch}.attention.head_count": (VT.UINT32, n_head),
        f"{arch}.attention.head_count_kv": (VT.UINT32, n_head_kv),
        f"{arch}.attention.layer_norm_rms_epsilon": (VT.FLOAT32, 1e-6),
        f"{arch}.rope.freq_base": (VT.FLOAT32, 10000.0),
        "tokenizer.ggml.model": (VT.STRING, "llama"),
        "tokenizer.ggml.tokens": (VT.ARRAY, tokens, VT.STRING),
        "tokenizer.ggml.scores": (VT.ARRAY, [float(len(t)) if ty == 1 else 0.0 for t, ty in zip(tokens, types)],
                                  VT.FLOAT32),
        "tokenizer.ggml.token_type": (VT.ARRAY, types, VT.INT32),
        **{f"tokenizer.ggml.{name}_token_id": (VT.UINT32, i) for name, i in special.items()},
    }
    if chat_template is not None:
        md["tokenizer.chat_template"] = (VT.STRING, chat_template)
    qd, kd = n_head * head_dim, n_head_kv * head_dim
    zeros = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    t = {"token_embd.weight": embd, "output_norm.weight": np.ones(n_embd, np.float32), "output.weight": out,
         "blk.0.attn_norm.weight": np.ones(n_embd, np.float32), "blk.0.ffn_norm.weight": np.ones(n_embd, np.float32),
         "blk.0.attn_q.weight": zeros(qd, n_embd), "blk.0.attn_k.weight": zeros(kd, n_embd),
         "blk.0.attn_v.weight": zeros(kd, n_embd), "blk.0.attn_output.weight": zeros(n_embd, qd),
         "blk.0.ffn_gate.weight": zeros(n_ff, n_embd), "blk.0.ffn_up.weight": zeros(n_ff, n_embd),
         "blk.0.ffn_down.weight": zeros(n_embd, n_ff)}
    return write_gguf(path, md, t, arch=arch)
