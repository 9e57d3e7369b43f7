"""Qwen 3 MoE (llama.cpp's qwen3moe, e.g. Qwen3-30B-A3B): Qwen 3 attention; every FFN is routed
experts - softmax over the router's logits, the top expert_used_count experts, their weights
renormalised to sum 1, SwiGLU experts of expert_feed_forward_length (default n_ff / n_used)."""

from __future__ import annotations

from ..errors import GGUFError
from .base import Keys, ModelConfig, moe_config
from .llama import ATTENTION, QKV_OPTIONAL
from .qwen2 import attention_config
from .qwen3 import QK_NORMS

NAMES = ("qwen3moe",)
EXPERTS = ("ffn_norm", "w_gate_inp", "w_gate_exps", "w_up_exps", "w_down_exps")


def load_config(gguf, arch: str) -> ModelConfig:
    base = attention_config(gguf, arch, need_ff=False)
    moe = moe_config(Keys(gguf, arch), base["n_layer"], base["n_ff"], norm_topk=True)
    if moe is None:
        raise GGUFError(f"{arch} needs experts: {arch}.expert_count / expert_used_count are missing or 0")
    return ModelConfig(**base, moe=moe, required_tensors=ATTENTION + QK_NORMS + EXPERTS,
                       optional_tensors=QKV_OPTIONAL)
