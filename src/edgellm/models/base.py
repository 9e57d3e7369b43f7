"""What every architecture module shares: the typed config, GGUF key access, the hyperparameter
rules llama.cpp applies to every architecture, and the table of model features.

An architecture module reads hyperparameters from GGUF keys into a `ModelConfig` and says which
tensors its layers have (tensors.py binds them); it never parses bytes (gguf_file does) and never
computes (the engines in `kernels/` and the float64 reference in tests do, all from this config).

The model features (FEATURES) are the one description of everything a forward pass may have to do
beyond a plain pre-norm llama block: each has a name, a line saying what it is, and the rule that
tells from a config and its bound tensors whether a model uses it. An engine declares the names it
implements; a model that needs one it lacks is refused with that line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import GGUFError, UnsupportedModelError

ACT_SILU = "silu"
ACT_GELU_TANH = "gelu_tanh"
ROPE_NORM = "norm"  # rotate adjacent pairs (2i, 2i+1): llama
ROPE_NEOX = "neox"  # rotate halves (i, i + n_rot/2): gemma, qwen, ...
QK_NORM_HEAD = "head"  # attn_q_norm / attn_k_norm: RMS norm of each head's q and k (qwen3, gemma3)
QK_NORM_ALL = "all"    # RMS norm of the whole q and k vectors, all heads at once (olmo2)
GATING_SOFTMAX = "softmax"  # router probabilities: softmax over all experts


@dataclass(frozen=True)
class LayerConfig:
    is_swa: bool
    rope_base: float
    rope_scale: float  # multiplies positions (1 / linear scaling factor)
    use_rope: bool = True   # False: q and k of this layer are not rotated (smollm3's every 4th layer)
    rope_yarn: bool = True  # False: this layer ignores YaRN's mix and magnitude (olmo2's window layers)
    # this layer's own sizes where they differ from the model's (gemma4: sliding-window and global
    # layers have their own head sizes, key/value heads and rotated dims, KV-sharing layers a wider FFN)
    head_dim: int = 0       # q, k and v head size (0: the model's head_dim_k / head_dim_v)
    n_head_kv: int = 0      # (0: the model's)
    n_ff: int = 0           # (0: the model's)
    n_rot: int = -1         # dimensions rotated (-1: the model's n_rot)
    kv_layer: int = -1      # >= 0: no K/V of its own, attends to that earlier layer's cache (gemma4)
    rope_freqs: bool = True  # False: rope_freqs.weight does not apply here (gemma4's window layers)

    def sizes(self, cfg: "ModelConfig") -> tuple[int, int, int, int, int]:
        """(head_dim_k, head_dim_v, n_head_kv, n_ff, n_rot) of this layer of cfg."""
        return (self.head_dim or cfg.head_dim_k, self.head_dim or cfg.head_dim_v, self.n_head_kv or cfg.n_head_kv,
                self.n_ff or cfg.n_ff, cfg.n_rot if self.n_rot < 0 else self.n_rot)
    recurrent: bool = False  # a gated DeltaNet layer in place of attention (ModelConfig.delta_net; qwen35)


@dataclass(frozen=True)
class MoEConfig:
    """Routed experts, as llama.cpp's build_moe_ffn: per token, probabilities over the experts from
    the router (ffn_gate_inp), the n_expert_used most probable chosen, their weights optionally
    renormalised to sum 1 and scaled, each chosen expert's gated FFN weighted and summed."""

    n_expert: int
    n_expert_used: int
    n_ff_exp: int               # width of one expert's FFN
    gating: str = GATING_SOFTMAX
    norm_topk: bool = False     # divide the chosen weights by their sum (clamped below at 2^-14)
    weights_scale: float = 1.0  # then multiply them by this
    n_ff_shexp: int = 0         # width of the shared expert run on every token (0: none)
    shexp_gate: bool = False    # shared expert output times sigmoid(x . ffn_gate_inp_shexp) (qwen2moe)


@dataclass(frozen=True)
class DeltaNetConfig:
    """Gated DeltaNet linear attention, as llama.cpp's delta-net-base graph (qwen35's recurrent
    layers): per token, attn_qkv projects q, k (n_k_heads each) and v (n_v_heads), all of d_state per
    head; a causal conv1d of d_conv taps over time (ssm_conv1d, the last d_conv - 1 inputs kept as
    the conv state) then SiLU; q and k L2-normed; per v head a state S (d_state x d_state, float32)
    decays by exp(softplus(alpha + ssm_dt) * ssm_a), learns v - S k at rate sigmoid(beta), and
    gives o = S q / sqrt(d_state); o is RMS-normed per head (ssm_norm), times SiLU(attn_gate . x),
    and projected by ssm_out. v head h reads q / k head h % n_k_heads."""

    d_conv: int      # {arch}.ssm.conv_kernel
    d_state: int     # {arch}.ssm.state_size: the head size of q, k and v
    n_k_heads: int   # {arch}.ssm.group_count
    n_v_heads: int   # {arch}.ssm.time_step_rank

    @property
    def d_inner(self) -> int:  # {arch}.ssm.inner_size: width of v, z and the output
        return self.d_state * self.n_v_heads

    @property
    def conv_dim(self) -> int:  # channels of the conv: q, k and v
        return 2 * self.d_state * self.n_k_heads + self.d_inner


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    n_rot: int
    rope_type: str
    norm_eps: float
    act: str
    attn_scale: float           # multiplies the scores q.k (after the attention soft-cap)
    layers: tuple[LayerConfig, ...]
    n_swa: int = 0
    embd_scale: float = 1.0
    attn_softcap: float = 0.0   # scores s become tanh(s * (1/c)) * c before attn_scale and the softmax
    q_scale: float = 1.0        # multiplies q after RoPE, before its f16 rounding (llama.cpp's gemma graphs)
    final_softcap: float = 0.0
    yarn_ext_factor: float = 0.0
    yarn_attn_factor: float = 1.0  # llama.cpp's cparams.yarn_attn_factor (RoPE adds YaRN's own term)
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    n_ctx_orig: int = 0
    qk_norm: str = QK_NORM_HEAD  # how attn_q_norm / attn_k_norm apply, when the layers have them
    fused_gate_up: bool = False  # ffn_up holds gate and up (2 * n_ff rows, gate first), no ffn_gate (phi3)
    residual_scale: float = 1.0  # multiplies attention and FFN outputs before each residual add (granite)
    logit_scale: float = 1.0     # multiplies the logits (granite: 1 / {arch}.logit_scale)
    attn_temp_scale: float = 0.0  # q of the token at position p times 1 + s * log(floor(p / floor) + 1)
    attn_temp_floor: int = 0      # (llama 4 / mistral3 attention temperature; 0 scale = off)
    moe: MoEConfig | None = None  # every layer's FFN is routed experts
    v_norm: bool = False          # v RMS-normed per head, without a weight (gemma4)
    n_embd_per_layer: int = 0     # per-layer input embeddings of this width (gemma4's per_layer_* tensors)
    attn_out_gate: bool = False   # attn_q holds each head's q then a gate: output times sigmoid(gate) (qwen35)
    delta_net: DeltaNetConfig | None = None  # the layers with LayerConfig.recurrent are gated DeltaNet
    recurrent_tensors: tuple[str, ...] = ()  # the layer roles of those layers (in place of required_tensors)
    role_names: tuple[tuple[str, str], ...] = ()  # (role, GGUF name) where the architecture names it otherwise
    n_layer_skip: int = 0         # blocks after the last layer the forward pass does not run (MTP heads)
    output: str = "optional"      # output.weight: "optional" (else tied to token_embd), "required", "tied"
    required_tensors: tuple[str, ...] = ()   # layer roles (tensors.LAYER_ROLES) that must be present
    optional_tensors: tuple[str, ...] = ()   # layer roles that may be present
    global_tensors: tuple[str, ...] = ()     # optional global roles (tensors.GLOBAL_ROLES) besides the output
    required_global_tensors: tuple[str, ...] = ()  # global roles that must be present
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def n_params_hint(self) -> str:
        return f"{self.n_layer} layers, {self.n_embd} embd, {self.n_head}/{self.n_head_kv} heads"


class Keys:
    """Typed access to `{arch}.*` keys with errors that name the key."""

    def __init__(self, gguf, arch: str):
        self.g = gguf
        self.arch = arch

    def _get(self, key: str, default, kind):
        full = key.replace("{arch}", self.arch)
        v = self.g.metadata.get(full, None)
        if v is None:
            if default is _REQUIRED:
                raise GGUFError(f"required metadata key {full!r} is missing")
            return default
        try:
            if kind is bool:
                if not isinstance(v, (bool, np.bool_)):
                    raise ValueError
                return bool(v)
            if kind is int:
                if isinstance(v, bool) or not float(v).is_integer():
                    raise ValueError
                return int(v)
            if kind is float:
                return float(v)
            if kind is str:
                if not isinstance(v, str):
                    raise ValueError
                return v
        except (TypeError, ValueError):
            raise GGUFError(f"metadata key {full!r} has an unexpected value {v!r} (want {kind.__name__})") from None
        return v

    def int(self, key, default=None):
        return self._get(key, default, int)

    def float(self, key, default=None):
        return self._get(key, default, float)

    def str(self, key, default=None):
        return self._get(key, default, str)

    def bool(self, key, default=None):
        return self._get(key, default, bool)

    def raw(self, key, default=None):
        return self.g.metadata.get(key.replace("{arch}", self.arch), default)

    def per_layer(self, key: str, n_layer: int, default: int = 0) -> int:
        """A key llama.cpp reads as one value or one per layer; edgellm runs the uniform case only."""
        v = self.raw(key)
        if v is not None and not isinstance(v, (str, bytes)) and hasattr(v, "__len__"):
            vals = {int(x) for x in v}
            if len(v) != n_layer or len(vals) != 1:
                raise UnsupportedModelError(
                    f"per-layer values of {key.replace('{arch}', self.arch)} are not supported ({sorted(vals)})")
            return vals.pop()
        return self.int(key, default)


    def layer_values(self, key: str, n_layer: int, default: int) -> tuple[int, ...]:
        """A key llama.cpp reads as one value or one per layer (get_key_or_arr), as one per layer."""
        v = self.raw(key)
        if v is not None and not isinstance(v, (str, bytes)) and hasattr(v, "__len__"):
            if len(v) != n_layer:
                raise GGUFError(f"{key.replace('{arch}', self.arch)} has {len(v)} values for {n_layer} layers")
            return tuple(int(x) for x in v)
        return (self.int(key, default),) * n_layer


_REQUIRED = object()
REQUIRED = _REQUIRED


MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS: a larger block_count is refused there too


def positive(name: str, v: int) -> int:
    if v is None or v <= 0:
        raise GGUFError(f"hyperparameter {name} must be positive (got {v})")
    return v


def n_vocab_of(gguf, k: Keys) -> int:
    n = k.int("{arch}.vocab_size", None)
    if n is None:
        toks = gguf.metadata.get("tokenizer.ggml.tokens")
        if toks is None:
            raise GGUFError("cannot tell the vocabulary size: no {arch}.vocab_size and no tokenizer.ggml.tokens")
        n = len(toks)
    return positive("n_vocab", n)


def decoder_shape(gguf, k: Keys, *, need_ff: bool = True) -> dict:
    """The shape keys every decoder shares: layers, widths, heads, head sizes, vocabulary, rotated
    dims (llama.cpp's defaults: head sizes n_embd / n_head, all of the key head rotated)."""
    n_layer = _layer_count(k)
    n_embd = positive("n_embd", k.int("{arch}.embedding_length", REQUIRED))
    n_head = positive("n_head", k.per_layer("{arch}.attention.head_count", n_layer))
    head_dim = positive("head_dim", k.int("{arch}.attention.key_length", n_embd // n_head))
    return dict(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=positive("n_head_kv", k.per_layer("{arch}.attention.head_count_kv", n_layer, n_head)),
        head_dim_k=head_dim,
        head_dim_v=positive("head_dim_v", k.int("{arch}.attention.value_length", n_embd // n_head)),
        n_ff=positive("n_ff", k.per_layer("{arch}.feed_forward_length", n_layer)) if need_ff else
        k.per_layer("{arch}.feed_forward_length", n_layer),
        n_vocab=n_vocab_of(gguf, k),
        n_rot=k.int("{arch}.rope.dimension_count", head_dim),
    )


def _layer_count(k: Keys) -> int:
    n = positive("n_layer", k.int("{arch}.block_count", REQUIRED))
    if n > MAX_LAYERS:  # before anything makes per-layer tables of that size
        raise GGUFError(f"hyperparameter n_layer is {n}, more than the {MAX_LAYERS} layers supported")
    return n


ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")


def rope_params(k: Keys, *, yarn_betas: bool = False, yarn_log_mul: bool = False) -> dict:
    """RoPE scaling as llama.cpp's loader and context set it up for every architecture:
    rope.scaling.type (default "linear"), the factor from rope.scaling.factor or the legacy
    rope.scale_linear, the original context (rope.scaling.original_context_length, else the
    training context), and the attention factor llama.cpp's context computes (cparams.yarn_attn_factor:
    with YaRN, YaRN's magnitude divided back out - ggml's RoPE multiplies it in again - and, where
    the architecture reads rope.scaling.yarn_log_multiplier, the ratio of the two mscales).
    yarn_betas: the architecture reads rope.scaling.yarn_beta_fast / _slow (others keep 32 / 1).
    Returns the ModelConfig fields plus "rope_type" (the scaling type) and "freq_scale"."""
    typ = k.str("{arch}.rope.scaling.type", "linear")
    if typ not in ROPE_SCALING_TYPES:
        raise UnsupportedModelError(f"rope scaling type {typ!r} is not supported ({', '.join(ROPE_SCALING_TYPES)})")
    factor = k.float("{arch}.rope.scaling.factor", None)
    if factor is None:
        factor = k.float("{arch}.rope.scale_linear", 0.0)
    if not (math.isfinite(factor) and factor >= 0.0):  # (0: no scaling)
        raise GGUFError(f"{k.arch}: the rope scaling factor must be a positive number (got {factor})")
    freq_scale = 1.0 if typ == "none" or factor == 0.0 else float(np.float32(1.0) / np.float32(factor))
    n_orig = k.int("{arch}.rope.scaling.original_context_length", 0) or k.int("{arch}.context_length", 0)
    ext = 1.0 if typ == "yarn" else 0.0
    f32 = np.float32
    attn = f32(1.0)
    if ext:
        f = f32(1.0) / f32(freq_scale)

        def mscale(m):  # llama.cpp's get_mscale
            return f32(1.0) if f <= 1.0 else f32(f32(0.1) * f32(m) * f32(math.log(f)) + f32(1.0))

        log_mul = k.float("{arch}.rope.scaling.yarn_log_multiplier", 0.0) if yarn_log_mul else 0.0
        attn = f32(mscale(1.0) / mscale(log_mul)) if log_mul != 0.0 else mscale(1.0)
        attn = f32(attn * f32(f32(1.0) / f32(f32(1.0) + f32(0.1) * f32(math.log(f)))))
    attn = f32(attn * f32(k.float("{arch}.rope.scaling.attn_factor", 1.0)))
    out = dict(scaling=typ, freq_scale=freq_scale, yarn_ext_factor=ext, yarn_attn_factor=float(attn),
               n_ctx_orig=n_orig)
    if yarn_betas:
        out["yarn_beta_fast"] = k.float("{arch}.rope.scaling.yarn_beta_fast", 32.0)
        out["yarn_beta_slow"] = k.float("{arch}.rope.scaling.yarn_beta_slow", 1.0)
    return out


def rope_config(rope: dict) -> dict:
    """The ModelConfig fields among rope_params' result."""
    return {k: v for k, v in rope.items() if k not in ("scaling", "freq_scale")}


def uniform_layers(n_layer: int, base: float, freq_scale: float, **kw) -> tuple[LayerConfig, ...]:
    return (LayerConfig(is_swa=False, rope_base=base, rope_scale=freq_scale, **kw),) * n_layer


def swa_pattern(k: Keys, n_layer: int, n_pattern: int, *, dense_first: bool = False) -> tuple[bool, ...]:
    """Which layers use the sliding window: {arch}.attention.sliding_window_pattern as one flag per
    layer, or a period n (default n_pattern): layer il slides unless il % n == n - 1 (dense_first:
    unless il % n == 0); n = 0 makes every layer slide (llama.cpp's set_swa_pattern)."""
    pat = k.raw("{arch}.attention.sliding_window_pattern", n_pattern)
    if hasattr(pat, "__len__") and not isinstance(pat, str):
        if len(pat) != n_layer:
            raise GGUFError(f"{k.arch}.attention.sliding_window_pattern has {len(pat)} entries for {n_layer} layers")
        return tuple(bool(x) for x in pat)
    n = int(pat)
    if dense_first:
        return tuple(n == 0 or il % n != 0 for il in range(n_layer))
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))


MAX_EXPERTS = 512  # llama.cpp's LLAMA_MAX_EXPERTS


def moe_config(k: Keys, n_layer: int, n_ff: int, *, norm_topk: bool, shexp_gate: bool = False,
               shared_default: int = 0, expert_width: int | None = None, shared: bool = True) -> MoEConfig | None:
    """Routed experts from {arch}.expert_count / expert_used_count / expert_feed_forward_length
    (default n_ff / n_expert_used) and expert_shared_feed_forward_length; None without experts.
    shared_default: the shared expert's width when the key is absent (0: no shared expert);
    expert_width: the experts' width whatever the keys say (llama's and granite's loaders: n_ff);
    shared=False: the architecture has no shared expert and does not read its key (llama, mistral3)."""
    n_expert = k.int("{arch}.expert_count", 0)
    n_used = k.per_layer("{arch}.expert_used_count", n_layer)
    if n_expert == 0:
        if n_used:
            raise GGUFError(f"{k.arch}.expert_used_count is {n_used} but there are no experts")
        return None
    if not 0 < n_expert <= MAX_EXPERTS:
        raise GGUFError(f"{k.arch}.expert_count must be in 1..{MAX_EXPERTS} (got {n_expert})")
    if not 0 < n_used <= n_expert:
        raise GGUFError(f"{k.arch}.expert_used_count must be in 1..{n_expert} (got {n_used})")
    if k.int("{arch}.expert_group_count", 0) > 1:
        raise UnsupportedModelError(f"{k.arch}: expert groups ({k.arch}.expert_group_count) are not supported")
    n_ff_exp = expert_width or k.per_layer("{arch}.expert_feed_forward_length", n_layer) or n_ff // n_used
    n_shexp = (k.int("{arch}.expert_shared_feed_forward_length", 0) or shared_default) if shared else 0
    return MoEConfig(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=positive("n_ff_exp", n_ff_exp),
                     norm_topk=norm_topk, n_ff_shexp=n_shexp, shexp_gate=shexp_gate)


def inv_sqrt_f32(x: float) -> float:
    """1.0f / sqrtf(float(x)), as llama.cpp computes its attention scales."""
    return float(np.float32(1.0) / np.sqrt(np.float32(x)))


def sqrt_f32(x: float) -> float:
    """sqrtf(float(x)) (the Gemma embedding scale)."""
    return float(np.sqrt(np.float32(x)))


def attn_scale_default(head_dim: int) -> float:
    return inv_sqrt_f32(head_dim)


# --- model features ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Feature:
    name: str
    what: str                                # one line, for errors and docs
    used: Callable[[ModelConfig, Any], bool]  # (config, tensors.ModelWeights) -> does the model need it


def _any_layer(role: str) -> Callable[[ModelConfig, Any], bool]:
    return lambda cfg, w: any(layer.get(role) is not None for layer in w.layers)


def _qk_norm(kind: str):
    return lambda cfg, w: cfg.qk_norm == kind and _any_layer("attn_q_norm")(cfg, w)


FEATURES: tuple[Feature, ...] = (
    Feature("qkv_bias", "biases on q, k and v (attn_q/k/v.bias)",
            lambda c, w: any(layer.get(r) is not None for layer in w.layers for r in ("bq", "bk", "bv"))),
    Feature("attn_out_bias", "a bias on the attention output (attn_output.bias)", _any_layer("bo")),
    Feature("fused_qkv", "a fused q/k/v projection (attn_qkv.weight, optionally attn_qkv.bias)", _any_layer("wqkv")),
    Feature("qk_norm_head", "RMS norms of q and k per head (attn_q_norm / attn_k_norm)", _qk_norm(QK_NORM_HEAD)),
    Feature("qk_norm_all", "RMS norms of q and k over all heads at once (attn_q_norm / attn_k_norm)",
            _qk_norm(QK_NORM_ALL)),
    Feature("no_pre_norm", "blocks without RMS norm before attention and FFN (no attn_norm / ffn_norm)",
            lambda c, w: any(layer.get("attn_norm") is None for layer in w.layers)),
    Feature("post_norms", "RMS norms after attention and FFN (post_attention_norm, post_ffw_norm)",
            _any_layer("attn_post_norm")),
    Feature("attn_softcap", "soft-capped attention scores", lambda c, w: c.attn_softcap > 0),
    Feature("final_softcap", "soft-capped logits", lambda c, w: c.final_softcap > 0),
    Feature("sliding_window", "sliding-window attention layers", lambda c, w: any(lc.is_swa for lc in c.layers)),
    Feature("rope_skip", "layers without RoPE", lambda c, w: c.n_rot > 0 and not all(lc.use_rope for lc in c.layers)),
    Feature("rope_freqs", "per-dimension RoPE frequency factors (rope_freqs.weight)",
            lambda c, w: w.rope_freqs is not None),
    Feature("longrope", "LongRoPE frequency factors chosen by context size (rope_factors_long / _short)",
            lambda c, w: w.rope_freqs is None and (w.rope_long is not None or w.rope_short is not None)),
    Feature("rope_linear", "linear RoPE scaling", lambda c, w: any(lc.rope_scale != 1.0 for lc in c.layers)),
    Feature("rope_yarn", "YaRN RoPE scaling", lambda c, w: c.yarn_ext_factor != 0.0),
    Feature("rope_yarn_layers", "YaRN on some layers only",
            lambda c, w: c.yarn_ext_factor != 0.0 and not all(lc.rope_yarn for lc in c.layers)),
    Feature("attn_temp", "attention temperature by position (attention.temperature_scale)",
            lambda c, w: c.attn_temp_scale != 0.0),
    Feature("embd_scale", "scaled token embeddings", lambda c, w: c.embd_scale != 1.0),
    Feature("q_scale", "q scaled before attention", lambda c, w: c.q_scale != 1.0),
    Feature("residual_scale", "scaled attention / FFN outputs before the residual (residual_scale)",
            lambda c, w: c.residual_scale != 1.0),
    Feature("logit_scale", "scaled logits (logit_scale)", lambda c, w: c.logit_scale != 1.0),
    Feature("gelu", "GELU-gated FFN", lambda c, w: c.act == ACT_GELU_TANH),
    Feature("fused_gate_up", "a fused gate/up FFN projection (ffn_up of 2 * n_ff rows)", lambda c, w: c.fused_gate_up),
    Feature("ffn_bias", "biases in the FFN (ffn_gate/up/down.bias)",
            lambda c, w: any(layer.get(r) is not None for layer in w.layers for r in ("b_gate", "b_up", "b_down"))),
    Feature("output_bias", "a bias on the output projection (output.bias)", lambda c, w: w.output_bias is not None),
    Feature("moe", "mixture of experts (router, top-k experts, weighted sum)", lambda c, w: c.moe is not None),
    Feature("moe_ungated", "experts without a gate projection (no ffn_gate_exps)",
            lambda c, w: c.moe is not None and any(layer.get("w_gate_exps") is None for layer in w.layers)),
    Feature("shared_expert", "a shared expert beside the routed ones",
            lambda c, w: c.moe is not None and c.moe.n_ff_shexp > 0),
    Feature("layer_sizes", "head sizes, key/value heads, FFN widths or rotated dims that differ between layers",
            lambda c, w: any(lc.sizes(c) != LayerConfig(False, 0.0, 1.0).sizes(c) for lc in c.layers)),
    Feature("kv_shared", "layers that attend to an earlier layer's KV cache (attention.shared_kv_layers)",
            lambda c, w: any(lc.kv_layer >= 0 for lc in c.layers)),
    Feature("v_from_k", "layers whose values are their keys (no attn_v)",
            lambda c, w: any(lc.kv_layer < 0 and layer.get("wv") is None and layer.get("wqkv") is None
                             for lc, layer in zip(c.layers, w.layers))),
    Feature("v_norm", "RMS-normed values", lambda c, w: c.v_norm),
    Feature("rope_freqs_layers", "RoPE frequency factors on some layers only",
            lambda c, w: w.rope_freqs is not None and not all(lc.rope_freqs for lc in c.layers)),
    Feature("per_layer_embd", "per-layer input embeddings (per_layer_token_embd, inp_gate, proj)",
            lambda c, w: c.n_embd_per_layer > 0),
    Feature("layer_out_scale", "a scale on each layer's output (layer_output_scale)", _any_layer("out_scale")),
    Feature("attn_out_gate", "a sigmoid gate on the attention output (attn_q holds q and the gate)",
            lambda c, w: c.attn_out_gate),
    Feature("delta_net", "gated DeltaNet linear-attention layers with a recurrent state (ssm_*)",
            lambda c, w: is_recurrent(c)),
    Feature("shared_expert_gate", "a sigmoid gate on the shared expert (ffn_gate_inp_shexp)",
            lambda c, w: c.moe is not None and c.moe.shexp_gate),
)
FEATURE_NAMES = frozenset(f.name for f in FEATURES)


def is_recurrent(cfg: ModelConfig) -> bool:
    """Whether the model keeps a recurrent state per sequence (DeltaNet layers): what it has seen
    cannot be cut back to a prefix (no prefix reuse, rollback or state save), only recomputed."""
    return cfg.delta_net is not None and any(lc.recurrent for lc in cfg.layers)


def features_of(cfg: ModelConfig, weights) -> frozenset[str]:
    """Names of the features a model with this config and these bound tensors needs."""
    return frozenset(f.name for f in FEATURES if f.used(cfg, weights))


def check_features(cfg: ModelConfig, weights, supported: frozenset[str], engine: str) -> None:
    """UnsupportedModelError naming what `engine` lacks for this model, if anything."""
    missing = [f for f in FEATURES if f.name not in supported and f.used(cfg, weights)]
    if missing:
        raise UnsupportedModelError(
            f"{cfg.arch}: the {engine} engine does not run {'; '.join(f.what for f in missing)} yet")


# the binding of tensors lives in tensors.py; these names are imported from here by the engines
from .tensors import LAYER_TENSORS, ModelWeights, bind_weights  # noqa: E402,F401
