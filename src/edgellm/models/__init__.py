"""Architectures, found by `general.architecture`. Adding one = a module + a line here."""

from __future__ import annotations

from ..errors import GGUFError, UnsupportedModelError
from . import gemma3, llama
from .base import ModelConfig

_MODULES = (llama, gemma3)
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
