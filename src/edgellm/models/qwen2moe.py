"""Qwen 1.5 / 2 MoE (llama.cpp's qwen2moe): Qwen 2 attention; every FFN is routed experts (softmax,
top expert_used_count, weights NOT renormalised) plus a shared expert of
expert_shared_feed_forward_length (default n_ff) whose output is gated per token by
sigmoid(x . ffn_gate_inp_shexp). output.weight is required."""

from __future__ import annotations

from ..errors import GGUFError
from .base import Keys, ModelConfig, moe_config
from .llama import ATTENTION, QKV_OPTIONAL, SHARED_EXPERT
from .qwen2 import attention_config
from .qwen3moe import EXPERTS

NAMES = ("qwen2moe",)


def load_config(gguf, arch: str) -> ModelConfig:
    base = attention_config(gguf, arch, need_ff=False)
    moe = moe_config(Keys(gguf, arch), base["n_layer"], base["n_ff"], norm_topk=False, shexp_gate=True,
                     shared_default=base["n_ff"])
    if moe is None:
        raise GGUFError(f"{arch} needs experts: {arch}.expert_count / expert_used_count are missing or 0")
    return ModelConfig(**base, moe=moe, output="required",
                       required_tensors=ATTENTION + EXPERTS + ("w_gate_inp_shexp",) + SHARED_EXPERT,
                       optional_tensors=QKV_OPTIONAL)
