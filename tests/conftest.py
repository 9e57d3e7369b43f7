"""Shared fixtures: the two real models (fetched through edgellm's own resolver, then cached)
and llama.cpp's reference outputs on them (tests/fixtures)."""

from __future__ import annotations

import functools
import json
import signal
from pathlib import Path

import numpy as np

import pytest

REPO = Path(__file__).resolve().parents[1]


# llama.cpp's reference outputs live in the repository (tests/fixtures/README.md says how they
# were made); nothing outside the clone is needed.
FIXTURES = REPO / "tests" / "fixtures"
REFERENCE = FIXTURES / "reference"


def default_sigint() -> None:
    """preexec_fn of the terminal tests' children: Ctrl-C with its default action. A test run
    started in the background by a shell without job control (`cmd &` in a script) ignores SIGINT,
    children inherit that, and Python then installs no KeyboardInterrupt handler, so sendintr()
    did nothing and the tests waited for their timeouts."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def engine_paths() -> list[str]:
    """Every way this machine can run a model: "c:<isa>" per C kernel path, and "numba"."""
    from edgellm.kernels import available_isas

    return [f"c:{isa}" for isa in available_isas()] + ["numba"]


def use_engine_path(monkeypatch, path: str) -> None:
    """Make engines created from now on run on `path` (see engine_paths)."""
    if path == "numba":
        monkeypatch.setenv("EDGELLM_BACKEND", "numba")
        monkeypatch.delenv("EDGELLM_ISA", raising=False)
    else:
        monkeypatch.setenv("EDGELLM_BACKEND", "c")
        monkeypatch.setenv("EDGELLM_ISA", path.split(":", 1)[1])


# alias in models.toml -> reference fixture key
REAL_MODELS = {
    "smollm2-135m-instruct": "smollm2-135m-instruct-q4_1",
    "gemma3-270m": "gemma3-270m-q4_k_m",
}


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


def _resolve(alias: str) -> Path:
    from edgellm.registry import resolve

    return Path(resolve(alias, progress=False))


@pytest.fixture(scope="session", params=sorted(REAL_MODELS))
def real_model(request):
    """(alias, path, reference dict) for each real model."""
    alias = request.param
    ref = json.loads((REFERENCE / f"{REAL_MODELS[alias]}.public.json").read_text())
    return alias, _resolve(alias), ref


def read_with_gguf_py(path):
    """gguf-py's GGUFReader, the oracle for what a file holds. It slices its np.memmap once per
    string part and every slice runs memmap.__array_finalize__ (13 s for gemma's 262144 tokens);
    handed a plain ndarray view of the same mapping, its parsing code is unchanged and takes about
    a third of that."""
    import gguf.gguf_reader as gr

    class _NumpyWithPlainMemmap:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def memmap(*args, **kwargs):
            return np.memmap(*args, **kwargs).view(np.ndarray)

    saved = gr.np
    gr.np = _NumpyWithPlainMemmap()
    try:
        return gr.GGUFReader(path)
    finally:
        gr.np = saved


@functools.lru_cache(maxsize=None)
def gguf_py_of_real_model(path: Path):
    """read_with_gguf_py of a real model's file, parsed once per session (the files never change)."""
    return read_with_gguf_py(path)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _resolve("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _resolve("gemma3-270m")
