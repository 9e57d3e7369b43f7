"""Tiny random-weight GGUF files of every architecture edgellm runs, for checks against llama.cpp.

Each has the structure of the real thing at a small size: 4 layers, 4 query heads sharing 2 key/value
heads (head size 16), every tensor llama.cpp's loader reads for the architecture (biases, norms,
fused projections, rope factors, experts, ...), the hyperparameters that switch its features on,
and a real vocabulary from llama.cpp's tokenizer suite (tests/llamacpp_source.py) with a chat
template (or, where the suite has none of the family's, one of its vocabularies made into the
family's shape: VOCABS). Weights are random normal from a fixed seed: the layers' matrices in F16
(so llama.cpp rounds their activations only to f16 and the float64 reference can be held close to
it), and so is the matrix the logits come from (HEAD_TYPE); an input embedding that is not also the
output is Q4_0, to keep files at a few MB (quantized with gguf-py). All is written with gguf-py's
GGUFWriter, so the same seed gives the same bytes: scripts/make_arch_references.py records each file's sha256 next to
llama.cpp's outputs for it, and the tests rebuild the file and check the hash.

    build("qwen3", directory) -> path
    build("qwen3", directory, chat=True) -> path   # the same weights, set up to chat as the family's GGUFs

With chat=True (CHATS) the tokenizer metadata is that of the real family's GGUFs, as far as the
borrowed vocabulary allows: its chat template (from llama.cpp's models/templates), its special
tokens renamed into the vocabulary at the ids the family uses, and its bos / eos ids; the weights
and the vocabulary's size are those of the reference file, only its name ends in -chat.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf import GGUFValueType as VT
from gguf import GGUFWriter
from gguf.quants import quantize

import llamacpp_source
from edgellm.gguf_file import GGUFFile, StringArray

N_FF_EXP = 32  # the experts' width unless a spec sets its own
# The logits' matrix (output.weight, or token_embd where the output is tied to it) is F16, as the
# layers' are. llama.cpp multiplies a quantized one with the hidden state rounded to Q8_0 blocks
# (steps of 1/127 of a block's largest value); with a Q4_0 head that rounding moved these models'
# log-probabilities 10x more than all the layers' f16 roundings together (mean |delta| over the
# top 8: 0.040 against 0.006 on qwen3), and it turns any difference between two evaluations into
# whole steps: llama.cpp's own token-by-token evaluation was 0.013 - 0.015 from its batch one, past
# the 0.01 the engines must meet. With an F16 head llama.cpp agrees with itself to 0.0001 - 0.0022.
HEAD_TYPE = GT.F16
# Standard deviation of the logits' matrix (the output, or tied embeddings), N(0, 0.5^2): with the
# RMS-normed hidden state the logits then spread over the vocabulary as a trained model's do (a
# standard deviation of about 4; SmolLM2-135M 3.4, Gemma-3-270M 4.7 on tests/fixtures/apache-2.0.txt),
# where tied N(0, 1) embeddings spread them twice as wide and every rounding twice as far
HEAD_SCALE = 0.5
# attention and FFN outputs this many times larger than N(0, 1/fan_in) weights give, so the layers
# move the residual stream away from the token's own embedding (else a tied output just repeats it)
RESIDUAL_GAIN = 3.0


@dataclass(frozen=True)
class Shape:
    """The sizes every architecture's file shares (the tiny ones by default; scripts/bench_moe.py and
    scripts/bench_dense.py write real models')."""
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_shexp: int = 64


TINY = Shape()


@dataclass(frozen=True)
class Spec:
    arch: str                    # general.architecture
    vocab: str                   # llama.cpp's models/ggml-vocab-<vocab>.gguf, or a VOCABS entry
    seed: int
    template: str | None = None  # models/templates/<template>.jinja, in place of the vocabulary's own
    keys: dict = field(default_factory=dict)  # {arch}.<key> -> (type, value), beyond the shape keys
    attn: str = "qkv"            # "qkv" separate q/k/v, "fused" attn_qkv
    qkv_bias: bool = False
    out_bias: bool = False       # attn_output.bias
    qk_norm: str = ""            # "head" (head_dim) or "all" (all heads)
    pre_norms: bool = True       # attn_norm / ffn_norm
    post_norms: bool = False
    ffn: str = "gated"           # "gated", "fused" (phi3's ffn_up of 2 * n_ff), "moe"
    ffn_bias: bool = False
    shared_expert: str = ""      # "", "plain", "gated" (qwen2moe's ffn_gate_inp_shexp)
    n_ff_exp: int = N_FF_EXP     # the experts' width (llama.cpp's granite loader makes them n_ff wide)
    output: bool = True          # an output.weight (else tied to the embeddings)
    output_bias: bool = False
    rope_freqs: bool = False     # rope_freqs.weight
    longrope: bool = False       # rope_factors_long / _short
    embd_init: float | None = None  # standard deviation of the token embeddings (default: HEAD_SCALE
                                 # where they are the output too, else 1)
    rope_dims: int = 0           # rope.dimension_count, where only part of each head is rotated
    name: str = ""               # general.name (default tiny-<arch>); llama.cpp reads it: a name with
                                 # "phi3" in it gives the special tokens Phi-3's rstrip attribute
    attn_gate: bool = False      # attn_q holds each head's q then its output gate (qwen35)
    delta_net: bool = False      # gated DeltaNet layers (their sizes: the DELTA_NET keys) where
                                 # full_attention_interval says


# the gated DeltaNet layers' sizes (qwen35): 4 value heads sharing 2 key heads, all of 16, a conv of 4 taps
DELTA_NET = {"ssm.conv_kernel": 4, "ssm.state_size": 16, "ssm.group_count": 2, "ssm.time_step_rank": 4,
             "ssm.inner_size": 64}
# ... and with Qwen 3.5's own head size of 128, whose dot products take ggml's 64-wide chunks
DELTA_NET_128 = {**DELTA_NET, "ssm.state_size": 128, "ssm.inner_size": 512}


def _f32(v):
    return (VT.FLOAT32, v)


def _u32(v):
    return (VT.UINT32, v)


SPECS: dict[str, Spec] = {
    "qwen2": Spec("qwen2", "qwen2", 1, qkv_bias=True, output=False, output_bias=True,
                  keys={"rope.freq_base": _f32(1e6)}),
    "qwen3": Spec("qwen3", "qwen2", 2, template="Qwen-Qwen3-0.6B", qk_norm="head", output=False,
                  keys={"rope.freq_base": _f32(1e6)}),
    "qwen3moe": Spec("qwen3moe", "qwen2", 3, template="Qwen-Qwen3-0.6B", qk_norm="head", ffn="moe", output=False,
                     keys={"rope.freq_base": _f32(1e6)}),
    "qwen2moe": Spec("qwen2moe", "qwen2", 4, qkv_bias=True, ffn="moe", shared_expert="gated",
                     keys={"rope.freq_base": _f32(1e6)}),
    "phi3": Spec("phi3", "phi-3", 5, attn="fused", ffn="fused", longrope=True, output=True,
                 keys={"rope.scaling.type": (VT.STRING, "longrope"), "rope.scaling.attn_factor": _f32(1.1902),
                       "rope.scaling.original_context_length": _u32(600), "attention.sliding_window": _u32(2047)}),
    # Phi-4-mini (phi3 as llama.cpp reads it): GQA, 3/4 of each head rotated (rope.dimension_count), LongRoPE
    # with Phi-4-mini's attention factor and original context, the output tied to the embeddings, no window
    "phi4-mini": Spec("phi3", "phi-4-mini", 16, attn="fused", ffn="fused", longrope=True, output=False, rope_dims=12,
                      name="tiny Phi 4 Mini",
                      keys={"rope.scaling.attn_factor": _f32(1.190238),
                            "rope.scaling.original_context_length": _u32(4096)}),
    "smollm3": Spec("smollm3", "llama-bpe", 6, template="HuggingFaceTB-SmolLM3-3B", output=False),
    "gemma2": Spec("gemma2", "llama-spm", 7, template="google-gemma-2-2b-it", post_norms=True, output=False,
                   embd_init=0.25, keys={"attention.sliding_window": _u32(32), "attn_logit_softcapping": _f32(1.5),
                                         "final_logit_softcapping": _f32(10.0)}),
    "granite": Spec("granite", "refact", 8, template="ibm-granite-granite-3.3-2B-Instruct", output=False,
                    keys={"logit_scale": _f32(2.5), "residual_scale": _f32(0.22), "embedding_scale": _f32(6.0),
                          "attention.scale": _f32(0.0625)}),
    "granitemoe": Spec("granitemoe", "refact", 14, template="ibm-granite-granite-3.3-2B-Instruct", output=False,
                       ffn="moe", shared_expert="plain", n_ff_exp=TINY.n_ff,
                       keys={"logit_scale": _f32(2.5), "residual_scale": _f32(0.22), "embedding_scale": _f32(6.0),
                             "attention.scale": _f32(0.0625)}),
    "olmo2": Spec("olmo2", "gpt-2", 9, template="Qwen-Qwen2.5-7B-Instruct", qk_norm="all", pre_norms=False,
                  post_norms=True),
    "mistral3": Spec("mistral3", "llama-spm", 10, template="mistralai-Mistral-Nemo-Instruct-2407",
                     keys={"rope.scaling.type": (VT.STRING, "yarn"), "rope.scaling.factor": _f32(4.0),
                           "rope.scaling.original_context_length": _u32(64),
                           "rope.scaling.yarn_beta_fast": _f32(16.0), "rope.scaling.yarn_beta_slow": _f32(2.0),
                           "rope.scaling.yarn_log_multiplier": _f32(1.0), "attention.temperature_scale": _f32(0.1),
                           "rope.freq_base": _f32(1e6)}),
    # Mixtral (and Mistral's MoE GGUFs): llama with experts n_ff wide, softmax over all experts, the
    # top 2 renormalised; no shared expert (llama.cpp's llama loader reads none)
    "llama-moe": Spec("llama", "llama-spm", 15, template="mistralai-Mistral-Nemo-Instruct-2407", ffn="moe",
                      n_ff_exp=TINY.n_ff, keys={"rope.freq_base": _f32(1e6)}),
    # llama features no real model above exercises
    "llama-bias-ropefreqs": Spec("llama", "llama-spm", 11, template="mistralai-Mistral-Nemo-Instruct-2407",
                                 qkv_bias=True, out_bias=True, rope_freqs=True),
    "llama-linear": Spec("llama", "llama-spm", 12, template="mistralai-Mistral-Nemo-Instruct-2407",
                         keys={"rope.scaling.type": (VT.STRING, "linear"), "rope.scaling.factor": _f32(4.0)}),
    # Gemma 4 (E2B / E4B layout): its own tensors and keys, tests/tiny_gemma4.py
    "gemma4": Spec("gemma4", "gemma-4", 17, keys={"rope.freq_base": _f32(1e6), "rope.freq_base_swa": _f32(1e4),
                                                   "attention.sliding_window": _u32(32),
                                                   "final_logit_softcapping": _f32(10.0)}),
    "llama-yarn": Spec("llama", "llama-spm", 13, template="mistralai-Mistral-Nemo-Instruct-2407",
                       keys={"rope.scaling.type": (VT.STRING, "yarn"), "rope.scaling.factor": _f32(4.0),
                             "rope.scaling.original_context_length": _u32(64),
                             "rope.scaling.attn_factor": _f32(0.9)}),
    # Qwen 3.5: DeltaNet layers 0 and 2, gated full attention on 1 and 3 (every 2nd; real models every 4th)
    # rotating 8 of each head's 16 dims in Qwen 3.5's interleaved sections (its GGUFs: 64 of 256,
    # [11, 11, 10, 0]); the output tied to the embeddings as in the small Qwen 3.5 models
    "qwen35": Spec("qwen35", "qwen35", 17, template="Qwen3.5-4B", qk_norm="head", output=False, rope_dims=8,
                   attn_gate=True, delta_net=True,
                   keys={"rope.freq_base": _f32(1e7), "full_attention_interval": _u32(2),
                         **{k: _u32(v) for k, v in DELTA_NET.items()}}),
    # the same with DeltaNet heads of 128, as Qwen 3.5's (ggml's dot products over whole 64-wide chunks)
    "qwen35-s128": Spec("qwen35", "qwen35", 18, template="Qwen3.5-4B", qk_norm="head", output=False, rope_dims=8,
                        attn_gate=True, delta_net=True,
                        keys={"rope.freq_base": _f32(1e7), "full_attention_interval": _u32(2),
                              **{k: _u32(v) for k, v in DELTA_NET_128.items()}}),
}


@dataclass(frozen=True)
class Chat:
    """How the real family's GGUFs chat: the template they carry, their special token ids, and the
    token an assistant turn ends with (an end-of-generation token to llama.cpp)."""
    template: str | None             # models/templates/<template>.jinja (None: the vocabulary's own)
    eot: int                         # the id that closes an assistant turn in the template
    ids: dict = field(default_factory=dict)     # tokenizer.ggml.<name>_token_id -> id
    tokens: dict = field(default_factory=dict)  # id -> (text, token type): the family's special tokens
    source: str = ""                 # the template's Jinja source, where llama.cpp's source has none
    pre: str = ""                    # tokenizer.ggml.pre of the family's GGUFs, where the vocabulary's differs

    def template_source(self) -> str | None:
        return self.source or (self.template and llamacpp_source.template(self.template))


CONTROL, UNKNOWN, UNUSED = 3, 2, 5  # llama.cpp's token types


@dataclass(frozen=True)
class Vocab:
    """A family's vocabulary that llama.cpp's tokenizer suite lacks, made of one it has: the suite
    vocabulary's tokens and merges, padded to the family's size with unused [PAD<id>] tokens (as
    llama.cpp's converter pads a vocabulary to the model's; the suite vocabulary's own control tokens
    become such tokens too), the family's special tokens at their ids, its pre-tokenizer, its
    bos / eos / ... ids and flags, and its chat template."""
    base: str            # llama.cpp's models/ggml-vocab-<base>.gguf
    size: int            # tokens in all
    pre: str             # tokenizer.ggml.pre
    tokens: dict         # id -> (text, token type)
    ids: dict            # tokenizer.ggml.<name>_token_id -> id
    flags: dict          # tokenizer.ggml.<name> -> bool
    template: str        # the chat template's Jinja source


# Phi-4-mini-instruct's chat template (its tokenizer_config.json; llama.cpp's source has none)
PHI4_MINI_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + "
    "message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
    "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")
VOCABS: dict[str, Vocab] = {
    # Phi-4-mini: o200k (pre-tokenizer gpt-4o, 200064 tokens) is not in the suite; Llama 3's tokens and
    # merges stand in for it. Its GGUFs' tokenizer keys (as llama.cpp's converter writes them):
    # <|endoftext|> 199999 is bos, eos, unknown and padding, no BOS or EOS added; its chat markers are
    # control tokens at the ids of Phi-4-mini-instruct's tokenizer_config.json (<|end|> 200020 ends a
    # turn; llama.cpp finds it by its text, as Phi-3's)
    "phi-4-mini": Vocab(
        "llama-bpe", 200064, "gpt-4o",
        {199999: ("<|endoftext|>", CONTROL), 200018: ("<|endofprompt|>", CONTROL), 200019: ("<|assistant|>", CONTROL),
         200020: ("<|end|>", CONTROL), 200021: ("<|user|>", CONTROL), 200022: ("<|system|>", CONTROL),
         200023: ("<|tool|>", CONTROL)},
        {"bos": 199999, "eos": 199999, "unknown": 199999, "padding": 199999},
        {"add_bos_token": False, "add_eos_token": False}, PHI4_MINI_TEMPLATE),
}
# OLMo 2 Instruct's template (allenai/OLMo-2-1124-7B-Instruct's tokenizer_config; llama.cpp's source has none)
OLMO2_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'assistant' %}{% if not loop.last %}"
    "{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}"
    "{% else %}{{ '<|assistant|>\n' + message['content'] + eos_token }}{% endif %}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}")
_QWEN_CHAT = {"eos": 151645}  # Qwen 2.5 / 3 instruct GGUFs: eos <|im_end|> (bos and padding <|endoftext|>)
_GRANITE_TOKENS = {0: ("<|end_of_text|>", CONTROL), 49152: ("<|start_of_role|>", CONTROL),
                   49153: ("<|end_of_role|>", CONTROL), 49154: ("<|tool_call|>", CONTROL)}
CHATS: dict[str, Chat] = {
    "qwen2": Chat("Qwen-Qwen2.5-7B-Instruct", 151645, _QWEN_CHAT),
    "qwen3": Chat("Qwen-Qwen3-0.6B", 151645, _QWEN_CHAT),
    "qwen3moe": Chat("Qwen-Qwen3-0.6B", 151645, _QWEN_CHAT),  # Qwen3-30B-A3B carries Qwen 3's template
    "qwen35": Chat("Qwen3.5-4B", 151645, _QWEN_CHAT),  # Qwen 3.5's GGUFs: eos <|im_end|>, as Qwen 3's
    "qwen2moe": Chat(None, 151645, _QWEN_CHAT),  # the vocabulary's own: Qwen 2's ChatML (Qwen2-57B-A14B)
    # Phi-3.5-mini: eos <|endoftext|> (32000, as the vocabulary); <|end|> (32007) is found by its text
    "phi3": Chat("microsoft-Phi-3.5-mini-instruct", 32007),
    # Phi-4-mini: its vocabulary's own template and ids (VOCABS), a turn ends with <|end|>
    "phi4-mini": Chat(None, 200020),
    # SmolLM3: Llama 3's vocabulary with reserved tokens renamed to ChatML's. Its GGUFs (llama.cpp's
    # SmolLM3 pull request, #14581, lists one's keys): pre-tokenizer smaug-bpe, bos 128000, eos and
    # padding <|im_end|> 128012; <|im_start|> is the reserved token before it (128011)
    "smollm3": Chat("HuggingFaceTB-SmolLM3-3B", 128012, {"eos": 128012, "padding": 128012},
                    {128011: ("<|im_start|>", CONTROL), 128012: ("<|im_end|>", CONTROL)}, pre="smaug-bpe"),
    # Gemma 2's ids (<pad> 0, <eos> 1, <bos> 2, <unk> 3, turn markers 106 / 107) on Llama 2's vocabulary
    "gemma2": Chat("google-gemma-2-2b-it", 107, {"bos": 2, "eos": 1, "unknown": 3, "padding": 0},
                   {0: ("<pad>", CONTROL), 1: ("<eos>", CONTROL), 2: ("<bos>", CONTROL), 3: ("<unk>", UNKNOWN),
                    106: ("<start_of_turn>", CONTROL), 107: ("<end_of_turn>", CONTROL)}),
    # Granite 3.x: the StarCoder vocabulary, token 0 <|end_of_text|> (bos = eos = padding), role markers after it
    "granite": Chat("ibm-granite-granite-3.3-2B-Instruct", 0, {"padding": 0}, _GRANITE_TOKENS),
    "granitemoe": Chat("ibm-granite-granite-3.3-2B-Instruct", 0, {"padding": 0}, _GRANITE_TOKENS),
    "olmo2": Chat(None, 50256, source=OLMO2_TEMPLATE),  # eos <|endoftext|>, as OLMo 2's (there 100257)
    # Mistral Small 3.x (mistral3): Tekken's control ids (mistral-common's Tekkenizer: <unk> 0, <s> 1,
    # </s> 2, [INST] 3, [/INST] 4, ..., [SYSTEM_PROMPT] 17, [/SYSTEM_PROMPT] 18)
    "mistral3": Chat("Mistral-Small-3.2-24B-Instruct-2506", 2, {},
                     {3: ("[INST]", CONTROL), 4: ("[/INST]", CONTROL), 17: ("[SYSTEM_PROMPT]", CONTROL),
                      18: ("[/SYSTEM_PROMPT]", CONTROL)}),
    # Mixtral 8x7B: Llama 2-sized SentencePiece vocabulary, [INST] as plain text, eos </s>
    "llama-moe": Chat("mistralai-Mistral-Nemo-Instruct-2407", 2),
    # Gemma 4: the vocabulary's own template and ids (eos <eos> 1); a turn ends with <turn|> (106)
    "gemma4": Chat(None, 106),
}


_ARRAY_TYPES = {np.dtype(np.int32): VT.INT32, np.dtype(np.uint32): VT.UINT32, np.dtype(np.float32): VT.FLOAT32}


def _tokenizer_fields(vocab: str):
    """(key, value type, value, element type) of every tokenizer.* key of a suite vocabulary (or of
    a VOCABS one), as edgellm's reader gives the values (ids written as UINT32, like the converters do)."""
    if vocab in VOCABS:
        return _derived_fields(VOCABS[vocab])
    with GGUFFile(llamacpp_source.vocab_file(vocab)) as g:
        out = []
        for key, v in g.metadata.items():
            if not key.startswith("tokenizer."):
                continue
            if isinstance(v, StringArray):
                out.append((key, VT.ARRAY, list(v), VT.STRING))
            elif isinstance(v, np.ndarray):
                out.append((key, VT.ARRAY, v.tolist(), _ARRAY_TYPES[v.dtype]))
            elif isinstance(v, (bool, np.bool_)):
                out.append((key, VT.BOOL, bool(v), None))
            elif isinstance(v, str):
                out.append((key, VT.STRING, v, None))
            elif isinstance(v, int):
                out.append((key, VT.UINT32, v, None))
            else:
                out.append((key, VT.FLOAT32, float(v), None))
        return out


class Rand:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def matrix(self, *ne, scale=None, qtype=GT.F16):
        """A weight of ggml shape ne (ne[0] = row length), N(0, 1/ne[0]) unless scale is given:
        float32 for F32, else (qtype, the quantized bytes)."""
        w = self.rng.standard_normal(tuple(reversed(ne))).astype(np.float32) * np.float32(
            ne[0] ** -0.5 if scale is None else scale)
        if qtype == GT.F32:
            return w
        return w.astype(np.float16) if qtype == GT.F16 else (qtype, quantize(w, qtype))

    def norm(self, n):
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)

    def bias(self, n, scale=0.5):
        return (scale * self.rng.standard_normal(n)).astype(np.float32)


def tensors(spec: Spec, n_vocab: int, shape: Shape = TINY, rand: Rand | None = None) -> dict:
    """Every tensor of spec at shape: {name: float32 / float16 array, or (type, quantized bytes)},
    the weights drawn by rand (default Rand(spec.seed))."""
    r = rand or Rand(spec.seed)
    E, F, hd = shape.n_embd, shape.n_ff, shape.head_dim
    qd, kd, X, FS = shape.n_head * hd, shape.n_head_kv * hd, shape.n_expert, shape.n_ff_shexp
    embd_std = spec.embd_init if spec.embd_init is not None else 1.0 if spec.output else HEAD_SCALE
    t = {"token_embd.weight": r.matrix(E, n_vocab, scale=embd_std, qtype=GT.Q4_0 if spec.output else HEAD_TYPE),
         "output_norm.weight": r.norm(E)}
    if spec.output:
        t["output.weight"] = r.matrix(E, n_vocab, scale=HEAD_SCALE, qtype=HEAD_TYPE)
    if spec.output_bias:
        t["output.bias"] = r.bias(n_vocab, 1.0)
    rot = spec.rope_dims or hd
    if spec.rope_freqs:  # Llama 3's shape: 1 on high frequencies, rising to 8 on low ones
        t["rope_freqs.weight"] = np.geomspace(1.0, 8.0, rot // 2).astype(np.float32)
    if spec.longrope:
        t["rope_factors_long.weight"] = np.geomspace(1.0, 6.0, rot // 2).astype(np.float32)
        t["rope_factors_short.weight"] = np.geomspace(1.0, 1.5, rot // 2).astype(np.float32)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        if spec.delta_net:
            t.update(_qwen35_layer(p, i, r, shape, {k: spec.keys[k][1] for k in DELTA_NET}))
            continue
        if spec.pre_norms:
            t[p + "attn_norm.weight"] = r.norm(E)
        if spec.attn == "fused":
            t[p + "attn_qkv.weight"] = r.matrix(E, qd + 2 * kd)
        else:
            t[p + "attn_q.weight"] = r.matrix(E, qd)
            t[p + "attn_k.weight"] = r.matrix(E, kd)
            t[p + "attn_v.weight"] = r.matrix(E, kd)
        if spec.qkv_bias:
            t[p + "attn_q.bias"], t[p + "attn_k.bias"], t[p + "attn_v.bias"] = r.bias(qd), r.bias(kd), r.bias(kd)
        if spec.qk_norm:
            t[p + "attn_q_norm.weight"] = r.norm(hd if spec.qk_norm == "head" else qd)
            t[p + "attn_k_norm.weight"] = r.norm(hd if spec.qk_norm == "head" else kd)
        t[p + "attn_output.weight"] = r.matrix(qd, E, scale=RESIDUAL_GAIN * qd ** -0.5)
        if spec.out_bias:
            t[p + "attn_output.bias"] = r.bias(E)
        if spec.post_norms:
            t[p + "post_attention_norm.weight"] = r.norm(E)
        if spec.pre_norms:
            t[p + "ffn_norm.weight"] = r.norm(E)
        if spec.ffn == "moe":
            FX = spec.n_ff_exp
            t[p + "ffn_gate_inp.weight"] = r.matrix(E, X, qtype=GT.F32)
            t[p + "ffn_gate_exps.weight"] = r.matrix(E, FX, X)
            t[p + "ffn_up_exps.weight"] = r.matrix(E, FX, X)
            t[p + "ffn_down_exps.weight"] = r.matrix(FX, E, X, scale=RESIDUAL_GAIN * FX ** -0.5)
            if spec.shared_expert == "gated":
                t[p + "ffn_gate_inp_shexp.weight"] = r.matrix(E, qtype=GT.F32)
            if spec.shared_expert:
                t[p + "ffn_gate_shexp.weight"] = r.matrix(E, FS)
                t[p + "ffn_up_shexp.weight"] = r.matrix(E, FS)
                t[p + "ffn_down_shexp.weight"] = r.matrix(FS, E, scale=RESIDUAL_GAIN * FS ** -0.5)
        elif spec.ffn == "fused":
            t[p + "ffn_up.weight"] = r.matrix(E, 2 * F)
            t[p + "ffn_down.weight"] = r.matrix(F, E, scale=RESIDUAL_GAIN * F ** -0.5)
        else:
            t[p + "ffn_gate.weight"] = r.matrix(E, F)
            t[p + "ffn_up.weight"] = r.matrix(E, F)
            t[p + "ffn_down.weight"] = r.matrix(F, E, scale=RESIDUAL_GAIN * F ** -0.5)
            if spec.ffn_bias:
                t[p + "ffn_gate.bias"], t[p + "ffn_up.bias"], t[p + "ffn_down.bias"] = r.bias(F), r.bias(F), r.bias(E)
        if spec.post_norms:
            t[p + "post_ffw_norm.weight"] = r.norm(E)
    return t


def _qwen35_layer(p: str, i: int, r: Rand, shape: Shape, sizes: dict) -> dict:
    """One qwen35 block (llama.cpp's loader): attn_norm, then gated DeltaNet (even layers) or full
    attention with q, its gate and per-head q / k norms (odd layers), then post_attention_norm (the
    FFN's pre-norm) and a SwiGLU FFN."""
    E, F, hd = shape.n_embd, shape.n_ff, shape.head_dim
    qd, kd = shape.n_head * hd, shape.n_head_kv * hd
    t = {p + "attn_norm.weight": r.norm(E)}
    if i % 2 == 0:
        sk, hk, hv, kc = (sizes[k] for k in ("ssm.state_size", "ssm.group_count", "ssm.time_step_rank",
                                               "ssm.conv_kernel"))
        vi = sk * hv
        cd = 2 * sk * hk + vi
        t[p + "attn_qkv.weight"] = r.matrix(E, cd)
        t[p + "attn_gate.weight"] = r.matrix(E, vi)
        t[p + "ssm_conv1d.weight"] = r.matrix(kc, cd, scale=0.5, qtype=GT.F32)
        # decay rates spread as a trained model's: softplus(alpha + dt) * a from about -0.01 to -2 per token
        t[p + "ssm_dt.bias"] = r.bias(hv, 1.0)
        t[p + "ssm_a"] = -np.exp(r.rng.uniform(-3.0, 0.5, hv)).astype(np.float32)
        t[p + "ssm_beta.weight"] = r.matrix(E, hv)
        t[p + "ssm_alpha.weight"] = r.matrix(E, hv)
        t[p + "ssm_norm.weight"] = r.norm(sk)
        t[p + "ssm_out.weight"] = r.matrix(vi, E, scale=RESIDUAL_GAIN * vi ** -0.5)
    else:
        t[p + "attn_q.weight"] = r.matrix(E, 2 * qd)
        t[p + "attn_k.weight"] = r.matrix(E, kd)
        t[p + "attn_v.weight"] = r.matrix(E, kd)
        t[p + "attn_q_norm.weight"] = r.norm(hd)
        t[p + "attn_k_norm.weight"] = r.norm(hd)
        t[p + "attn_output.weight"] = r.matrix(qd, E, scale=RESIDUAL_GAIN * qd ** -0.5)
    t[p + "post_attention_norm.weight"] = r.norm(E)
    t[p + "ffn_gate.weight"] = r.matrix(E, F)
    t[p + "ffn_up.weight"] = r.matrix(E, F)
    t[p + "ffn_down.weight"] = r.matrix(F, E, scale=RESIDUAL_GAIN * F ** -0.5)
    return t


def _derived_fields(v: Vocab) -> list[tuple]:
    base = _tokenizer_fields(v.base)
    types = next(value for key, _, value, _ in base if key == "tokenizer.ggml.token_type")
    tokens = {i: ("[PAD%d]" % i, UNUSED) for i in range(v.size) if i >= len(types) or types[i] == CONTROL}
    tokens.update(v.tokens)
    out = []
    for key, vtype, value, sub in base:
        name = key.removeprefix("tokenizer.ggml.")
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            value = list(value) + [None] * (v.size - len(value))
            for i, (text, ttype) in tokens.items():
                value[i] = text if key == "tokenizer.ggml.tokens" else ttype
        elif key == "tokenizer.ggml.pre":
            value = v.pre
        elif key == "tokenizer.chat_template" or name.removesuffix("_token_id") in v.ids or name in v.flags:
            continue
        out.append((key, vtype, value, sub))
    out += [(f"tokenizer.ggml.{name}_token_id", VT.UINT32, i, None) for name, i in v.ids.items()]
    out += [(f"tokenizer.ggml.{name}", VT.BOOL, flag, None) for name, flag in v.flags.items()]
    return out + [("tokenizer.chat_template", VT.STRING, v.template, None)]


def metadata(spec: Spec, chat: Chat | None = None, shape: Shape = TINY) -> list[tuple]:
    a = spec.arch
    md = [("general.name", VT.STRING, spec.name or f"tiny-{spec.arch}", None),
          (f"{a}.block_count", VT.UINT32, shape.n_layer, None),
          (f"{a}.context_length", VT.UINT32, 4096, None),
          (f"{a}.embedding_length", VT.UINT32, shape.n_embd, None),
          (f"{a}.feed_forward_length", VT.UINT32, shape.n_ff, None),
          (f"{a}.attention.head_count", VT.UINT32, shape.n_head, None),
          (f"{a}.attention.head_count_kv", VT.UINT32, shape.n_head_kv, None),
          (f"{a}.attention.key_length", VT.UINT32, shape.head_dim, None),
          (f"{a}.attention.value_length", VT.UINT32, shape.head_dim, None),
          (f"{a}.attention.layer_norm_rms_epsilon", VT.FLOAT32, 1e-6, None)]
    if spec.ffn == "moe":
        md += [(f"{a}.expert_count", VT.UINT32, shape.n_expert, None),
               (f"{a}.expert_used_count", VT.UINT32, shape.n_expert_used, None),
               (f"{a}.expert_feed_forward_length", VT.UINT32, spec.n_ff_exp, None)]
        if spec.shared_expert:
            md.append((f"{a}.expert_shared_feed_forward_length", VT.UINT32, shape.n_ff_shexp, None))
    if spec.rope_dims:
        md.append((f"{a}.rope.dimension_count", VT.UINT32, spec.rope_dims, None))
    if spec.delta_net:  # Qwen 3.5's sections scaled to the rotated dims: [11, 11, 10, 0] of 32 pairs
        md.append((f"{a}.rope.dimension_sections", VT.ARRAY, [2, 1, 1, 0], VT.INT32))
    md += [(f"{a}.{k}", vt, v, None) for k, (vt, v) in spec.keys.items()]
    tok = _tokenizer_fields(spec.vocab)
    if spec.template:  # the family's template, not the one the borrowed vocabulary carries
        tok = [f for f in tok if f[0] != "tokenizer.chat_template"]
        tok.append(("tokenizer.chat_template", VT.STRING, llamacpp_source.template(spec.template), None))
    if chat is not None:
        tok = _chat_fields(tok, chat)
    return md + tok


def _chat_fields(tok: list[tuple], chat: Chat) -> list[tuple]:
    """The tokenizer keys with the family's special tokens, ids and chat template."""
    out = []
    for key, vtype, value, sub in tok:
        if key == "tokenizer.ggml.tokens":
            value = list(value)
            for i, (text, _) in chat.tokens.items():
                value[i] = text
        elif key == "tokenizer.ggml.token_type":
            value = list(value)
            for i, (_, ttype) in chat.tokens.items():
                value[i] = ttype
        elif key == "tokenizer.chat_template" and chat.template_source():
            continue
        elif key == "tokenizer.ggml.pre" and chat.pre:
            value = chat.pre
        elif key.removeprefix("tokenizer.ggml.").removesuffix("_token_id") in chat.ids:
            continue
        out.append((key, vtype, value, sub))
    out += [(f"tokenizer.ggml.{name}_token_id", VT.UINT32, i, None) for name, i in chat.ids.items()]
    if chat.template_source():
        out.append(("tokenizer.chat_template", VT.STRING, chat.template_source(), None))
    return out


def build(name: str, directory: Path, *, chat: bool = False) -> Path:
    """Write SPECS[name] as <directory>/tiny-<name>.gguf (deterministic bytes) and return its path;
    chat=True: tiny-<name>-chat.gguf, set up to chat as the family's GGUFs (CHATS[name])."""
    spec = SPECS[name]
    layout = _layout(spec)
    md = layout.metadata(spec, CHATS[name] if chat else None)
    path = Path(directory) / f"tiny-{name}{'-chat' if chat else ''}.gguf"
    return write(path, spec.arch, md, layout.tensors(spec, vocab_size(md)))


def _layout(spec: Spec):
    """The module that lays out spec's file: this one, or an architecture's own (tiny_<arch>.py)."""
    if spec.arch == "gemma4":  # per-layer sizes and embeddings, beyond what Spec describes
        import tiny_gemma4
        return tiny_gemma4
    return sys.modules[__name__]


def vocab_size(md: list[tuple]) -> int:
    return len(next(v for k, _, v, _ in md if k == "tokenizer.ggml.tokens"))


def write(path: Path, arch: str, md: list[tuple], tensors: dict) -> Path:
    """A GGUF file of metadata md (metadata()'s rows) and tensors (tensors()' values) at path."""
    w = GGUFWriter(path, arch)
    for key, vtype, value, sub in md:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for tname, t in tensors.items():
        if isinstance(t, tuple):
            w.add_tensor(tname, t[1], raw_dtype=t[0])
        else:
            w.add_tensor(tname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
