"""llama.cpp's own source files the tests read: its tokenizer suite (models/ggml-vocab-*.gguf with
their .inp/.out files), its chat templates (models/templates/*.jinja) and its example grammars
(grammars/*.gbnf).

They come from the llama-cpp-python 0.3.36 sdist (which vendors llama.cpp build 0c1e570), fetched
once from PyPI with `pip download --no-binary :all: --no-deps` into edgellm's cache directory
($EDGELLM_HOME, default ~/.cache/edgellm) and unpacked there. EDGELLM_LLAMACPP_SDIST may name a
copy of that sdist to unpack instead of downloading it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from edgellm.registry import home

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
_PREFIX = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
_WANTED = ("models/ggml-vocab-", "models/templates/", "grammars/")


def _cache() -> Path:
    return home() / "llama.cpp-source" / VERSION


def _sdist() -> Path:
    local = os.environ.get("EDGELLM_LLAMACPP_SDIST")
    if local:
        return Path(local)
    dest = _cache()
    path = dest / SDIST
    if not path.exists():
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
               "-q", "-d", str(dest), f"llama-cpp-python=={VERSION}"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or not path.exists():
            raise RuntimeError(f"cannot fetch llama.cpp's source ({' '.join(cmd)}): {r.stderr.strip()[-500:]}")
    return path


def models_dir() -> Path:
    """llama.cpp's models/ directory (vocabularies and templates only), unpacked on first use."""
    out = _cache() / "llama.cpp"
    done = out / ".complete"
    if not done.exists() or not (out / "grammars").is_dir():  # (a copy unpacked before grammars/ was wanted)
        with tarfile.open(_sdist()) as tar:
            members = [m for m in tar.getmembers()
                       if m.isfile() and m.name.startswith(_PREFIX) and m.name[len(_PREFIX):].startswith(_WANTED)]
            if not members:
                raise RuntimeError(f"{_sdist()} holds no {_PREFIX}models/ggml-vocab-* files")
            for m in members:
                m.name = m.name[len(_PREFIX):]
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4 / 3.10.12
            tar.extractall(out, members=members, **safe)
        done.touch()
    return out / "models"


def grammars_dir() -> Path:
    """llama.cpp's grammars/ directory (*.gbnf)."""
    return models_dir().parent / "grammars"


def vocab_file(name: str) -> Path:
    """models/ggml-vocab-<name>.gguf"""
    return models_dir() / f"ggml-vocab-{name}.gguf"


def template(name: str) -> str:
    """The text of models/templates/<name>.jinja"""
    return (models_dir() / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


def vocab_cases(path: Path) -> list[tuple[str, list[int]]]:
    """(text, ids) pairs of a vocabulary's .inp / .out files, read as llama.cpp's test-tokenizer-0
    reads them: inputs separated by "\\n__ggml_vocab_test__\\n", one line of ids per input."""
    raw = Path(f"{path}.inp").read_bytes().decode("utf-8")
    sep = "\n__ggml_vocab_test__\n"
    inputs, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:nxt])
        pos = nxt + len(sep)
    lines = Path(f"{path}.out").read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(inputs) != len(lines):
        raise ValueError(f"{path}: {len(inputs)} inputs but {len(lines)} outputs")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(inputs, lines)]
