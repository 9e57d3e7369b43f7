"""Model resolver (minimal: local path or the cache). To be extended with Hub / PyPI sources."""

from __future__ import annotations

import os
import tomllib
from importlib import resources
from pathlib import Path

from .errors import ModelNotFoundError


def home() -> Path:
    return Path(os.environ.get("EDGELLM_HOME", Path.home() / ".cache" / "edgellm"))


def load_models() -> dict:
    with resources.files("edgellm").joinpath("models.toml").open("rb") as f:
        return tomllib.load(f)


def resolve(name: str | os.PathLike, *, progress: bool = True) -> Path:
    p = Path(name)
    if p.suffix == ".gguf" or p.exists():
        if not p.is_file():
            raise ModelNotFoundError(f"no such model file: {p}")
        return p
    table = load_models()
    entry = table["models"].get(str(name))
    if entry is None:
        raise ModelNotFoundError(f"unknown model {name!r}; known: {', '.join(sorted(table['models']))}")
    cached = home() / "models" / entry["file"]
    if cached.is_file():
        return cached
    raise ModelNotFoundError(f"model {name!r} is not cached at {cached}")
