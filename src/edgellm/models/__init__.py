"""Architectures, found by `general.architecture`. Adding one = a module + a line here."""

from __future__ import annotations

from ..errors import GGUFError, UnsupportedModelError
from . import gemma2, gemma3, gemma4, granite, llama, mistral3, olmo2, phi3, qwen2, qwen2moe, qwen3, qwen3moe, qwen35, smollm3
from .base import ModelConfig

_MODULES = (llama, gemma2, gemma3, gemma4, granite, mistral3, olmo2, phi3, qwen2, qwen2moe, qwen3, qwen3moe, qwen35, smollm3)
ARCHITECTURES = {name: mod for mod in _MODULES for name in mod.NAMES}


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def load_config(gguf) -> ModelConfig:
    arch = gguf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError("required metadata key 'general.architecture' is missing")
    mod = ARCHITECTURES.get(arch)
    if mod is None:
        raise UnsupportedModelError(
            f"architecture {arch!r} is not supported (supported: {', '.join(supported_architectures())})")
    return mod.load_config(gguf, arch)
