"""Qwen 3 (llama.cpp's qwen3): the Qwen 2 block with RMS norms of q and k per head before RoPE
(attn_q_norm / attn_k_norm) and no biases in the files (llama.cpp still reads optional ones)."""

from __future__ import annotations

from .base import ModelConfig
from .llama import ATTENTION, DENSE, QKV_OPTIONAL
from .qwen2 import attention_config

NAMES = ("qwen3",)
QK_NORMS = ("attn_q_norm", "attn_k_norm")


def load_config(gguf, arch: str) -> ModelConfig:
    return ModelConfig(**attention_config(gguf, arch), required_tensors=ATTENTION + QK_NORMS + DENSE,
                       optional_tensors=QKV_OPTIONAL)
