"""`edgellm info`: quant mix, sizes, parameters, tokenizer and metadata against gguf-py's reader."""

from __future__ import annotations

import functools
import json
from collections import Counter

import pytest
from click.testing import CliRunner
from gguf_builders import VT, write_gguf

from conftest import gguf_py_of_real_model

import numpy as np

from edgellm.tools.commands import info


def run(*args, ok=True):
    res = CliRunner().invoke(info, [str(a) for a in args])
    assert res.exit_code == (0 if ok else 1), res.output
    assert "Traceback" not in res.output
    return res


@functools.lru_cache(maxsize=None)
def oracle(path):
    """The facts, as gguf-py reads them."""
    r = gguf_py_of_real_model(path)
    mix = Counter()
    nbytes = Counter()
    for t in r.tensors:
        mix[t.tensor_type.name] += 1
        nbytes[t.tensor_type.name] += int(t.n_bytes)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return r, mix, nbytes, fields


@pytest.mark.real
def test_real_models_json(real_model):
    _, path, _ = real_model
    r, mix, nbytes, fields = oracle(path)
    data = json.loads(run(path, "-o", "json", "--tensors", "--all").output)
    assert {t: m["tensors"] for t, m in data["quant_mix"].items()} == dict(mix)
    assert {t: m["bytes"] for t, m in data["quant_mix"].items()} == dict(nbytes)
    assert data["parameters"] == sum(int(t.n_elements) for t in r.tensors)
    assert data["tensor_bytes"] == sum(nbytes.values())
    arch = fields["general.architecture"].contents()
    assert data["architecture"] == arch
    assert data["context_length"] == fields[f"{arch}.context_length"].contents()
    assert data["tokenizer"]["vocab_size"] == len(fields["tokenizer.ggml.tokens"].contents())
    assert data["tokenizer"]["model"] == fields["tokenizer.ggml.model"].contents()
    assert data["chat_template"] == ("tokenizer.chat_template" in fields)
    assert set(data["metadata"]) == set(fields)  # --all: every key
    assert [(t["name"], t["type"], t["shape"], t["bytes"]) for t in data["tensors"]] == [
        (t.name, t.tensor_type.name, [int(x) for x in t.shape], int(t.n_bytes)) for t in r.tensors]


@pytest.mark.real
def test_real_models_text(real_model):
    _, path, _ = real_model
    _, mix, _, fields = oracle(path)
    out = run(path).output
    for t, n in mix.items():
        assert any(line.split()[:3] == [t, str(n), "tensors"] for line in out.splitlines()), t
    kind = {"gpt2": "BPE", "llama": "SPM"}[fields["tokenizer.ggml.model"].contents()]
    assert f"tokenizer:       {kind}" in out
    assert "tokenizer.ggml.tokens" not in out  # without --all, only general and architecture keys
    assert "tokenizer.ggml.tokens = [" in run(path, "--all").output


def test_synthetic_model(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", {
        "llama.context_length": (VT.UINT32, 2048),
        "general.file_type": (VT.UINT32, 15),
        "tokenizer.ggml.model": (VT.STRING, "gpt2"),
        "tokenizer.ggml.tokens": (VT.ARRAY, [f"t{i}" for i in range(20)], VT.STRING),
        "tokenizer.chat_template": (VT.STRING, "{{ x }}"),
        "tokenizer.chat_template.tool_use": (VT.STRING, "{{ y }}"),
    }, {"a.weight": np.zeros((4, 32), np.float32), "b.weight": np.zeros(32, np.float16)})
    data = json.loads(run(path, "-o", "json").output)
    assert data["parameters"] == 4 * 32 + 32
    assert data["quant_mix"] == {"F32": {"tensors": 1, "bytes": 512, "parameters": 128},
                                 "F16": {"tensors": 1, "bytes": 64, "parameters": 32}}
    assert data["file_type"] == "Q4_K_M"
    assert data["context_length"] == 2048
    assert data["chat_template"] is True and data["named_chat_templates"] == ["tool_use"]
    assert data["tokenizer"]["vocab_size"] == 20
    assert "tensors" not in data
    summary = json.loads(run(path, "-o", "json", "--all").output)["metadata"]["tokenizer.ggml.tokens"]
    assert summary["array_length"] == 20 and summary["first"][:2] == ["t0", "t1"]


def test_bad_input(tmp_path):
    res = run(tmp_path / "nope.gguf", ok=False)
    assert "nope.gguf" in res.output
    (tmp_path / "x.gguf").write_bytes(b"GGUF\x03\x00")
    res = run(tmp_path / "x.gguf", ok=False)
    assert "truncated" in res.output
