"""`edgellm quantize`: bytes against ggml's reference quantizer output and gguf-py's quantizers,
llama.cpp's type mixes (reproducing the mixes of the two real model files), metadata carried
over with its value types, fallbacks, overrides, refusals, and no half-written output."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from gguf_builders import VT, write_gguf

from edgellm import gguf_writer
from edgellm.gguf_file import GGUFFile
from edgellm.kernels import quant_ops
from edgellm.quants import QType
from edgellm.tools import quantize as quantize_mod
from edgellm.tools.commands import quantize
from edgellm.tools.quant_mix import FILE_TYPES, parse_file_type, parse_override, plan, tensor_order

pytestmark = pytest.mark.skipif(quant_ops.c_module() is None, reason="C kernels not built")

SRC = str(Path(gguf_writer.__file__).resolve().parents[1])  # so child processes import this edgellm
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
SEARCHING_TYPES = (*K_TYPES, "IQ4_NL", "IQ4_XS")  # quantizers that try many scales per block: slow oracles
GGUF_PY_QUANTIZERS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16")  # types gguf-py can quantize
ALL_FILE_TYPES = list(FILE_TYPES)


def run(*args, ok=True):
    res = CliRunner().invoke(quantize, [str(a) for a in args] + ["-q"])
    if ok:
        assert res.exit_code == 0, res.output
    else:
        assert res.exit_code == 1, res.output
        assert "Traceback" not in res.output
    return res


# --- a tiny llama-shaped model ------------------------------------------------------------------

EXTRA_KV = {  # one pair of every value type, to see each carried over with its type
    "test.u8": (VT.UINT8, 200), "test.i8": (VT.INT8, -5), "test.u16": (VT.UINT16, 60000),
    "test.i16": (VT.INT16, -30000), "test.u32": (VT.UINT32, 4_000_000_000), "test.i32": (VT.INT32, -7),
    "test.f32": (VT.FLOAT32, 0.1), "test.bool": (VT.BOOL, True), "test.str": (VT.STRING, "héllo"),
    "test.u64": (VT.UINT64, 2**63 + 5), "test.i64": (VT.INT64, -(2**40)), "test.f64": (VT.FLOAT64, 0.1),
    "test.arr_i32": (VT.ARRAY, [1, -2, 3], VT.INT32), "test.arr_f32": (VT.ARRAY, [0.5, 1.5], VT.FLOAT32),
    "test.arr_str": (VT.ARRAY, ["a", "", "ç"], VT.STRING),
    "general.file_type": (VT.UINT32, 0),
    "general.quantization_version": (VT.UINT32, 2),
}


def tiny_model(path, *, n_layer=8, n_embd=256, n_ff=512, n_head=4, n_head_kv=4, n_vocab=64, tied=False,
               dtype=np.float32, alignment=None, seed=0, nan_in=None):
    rng = np.random.default_rng(seed)

    def w(rows, cols):  # numpy order [ne1, ne0]
        x = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
        x[:, ::7] *= 10  # some outliers, so quantizers have work to do
        return x.astype(dtype)

    kv_dim = n_embd // n_head * n_head_kv
    t = {"token_embd.weight": w(n_vocab, n_embd), "output_norm.weight": np.ones(n_embd, np.float32)}
    if not tied:
        t["output.weight"] = w(n_vocab, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        t.update({
            p + "attn_norm.weight": np.ones(n_embd, np.float32),
            p + "attn_q.weight": w(n_embd, n_embd), p + "attn_k.weight": w(kv_dim, n_embd),
            p + "attn_v.weight": w(kv_dim, n_embd), p + "attn_output.weight": w(n_embd, n_embd),
            p + "ffn_norm.weight": np.ones(n_embd, np.float32),
            p + "ffn_gate.weight": w(n_ff, n_embd), p + "ffn_up.weight": w(n_ff, n_embd),
            p + "ffn_down.weight": w(n_embd, n_ff),
        })
    if nan_in:
        t[nan_in] = t[nan_in].copy()
        t[nan_in][-1, 3] = np.nan
    meta = {
        "llama.block_count": (VT.UINT32, n_layer), "llama.embedding_length": (VT.UINT32, n_embd),
        "llama.feed_forward_length": (VT.UINT32, n_ff), "llama.attention.head_count": (VT.UINT32, n_head),
        "llama.attention.head_count_kv": (VT.UINT32, n_head_kv), "llama.context_length": (VT.UINT32, 256),
        **EXTRA_KV,
    }
    return write_gguf(path, meta, t, alignment=alignment)


def f32_of(g: GGUFFile, name: str) -> np.ndarray:
    """A tensor of the source file as float32 rows, widened by gguf-py (the oracle's reading)."""
    t = g.tensors[name]
    raw = g.tensor_bytes(name)
    if t.qtype == QType.F32:
        return raw.view(np.float32).reshape(t.rows, t.shape[0])
    return gguf_dequantize(raw, gguf.GGMLQuantizationType(int(t.qtype))).reshape(t.rows, t.shape[0])


def expected_bytes(x: np.ndarray, t: QType) -> np.ndarray:
    """What ggml's reference quantizer writes for float32 rows x: gguf-py where it has a
    quantizer, numpy's rounding for F16, else the C reference twin (tested byte-exact against
    ggml's output in test_quants_*)."""
    if t == QType.F32:
        return x.view(np.uint8)
    if t == QType.F16:
        return x.astype(np.float16).view(np.uint8)
    if t.name in GGUF_PY_QUANTIZERS:
        return gguf_quantize(x, gguf.GGMLQuantizationType(int(t)))
    return quant_ops.quantize_rows(t, x)


def check_output(src_path, dst_path, ft_name, row_step=1, **plan_kw):
    """Every tensor of dst: the planned type, and the bytes of converting src's tensor to it
    (where the oracle is our own C twin, on every row_step-th row and the last)."""
    with GGUFFile(src_path) as src, GGUFFile(dst_path) as dst:
        names = tensor_order(src.tensors)
        assert list(dst.tensors) == names  # llama.cpp's order
        decisions = plan(src.metadata, [(n, src.tensors[n].shape, src.tensors[n].qtype) for n in names],
                         parse_file_type(ft_name), **plan_kw)
        for d in decisions:
            out = dst.tensors[d.name]
            assert out.qtype == d.target, d.name
            assert out.shape == src.tensors[d.name].shape
            got = dst.tensor_bytes(d.name)
            if d.converts:
                x = f32_of(src, d.name)
                if d.target.name in SEARCHING_TYPES and row_step > 1:
                    rows = np.r_[0 : len(x) : row_step, len(x) - 1]
                    x, got = x[rows], got[rows]
                want = expected_bytes(np.ascontiguousarray(x), d.target)
            else:
                want = src.tensor_bytes(d.name)
            assert np.array_equal(got, want.reshape(got.shape)), f"{d.name} as {d.target.name}"
        return decisions


# --- bytes ----------------------------------------------------------------------------------------

def test_bytes_equal_ggml_reference_output(tmp_path, fixtures_dir):
    """The 16 rows ggml's quantizers were run on, quantized through the tool with --pure."""
    ref = np.load(fixtures_dir / "quant" / "reference_quants.npz")
    src = write_gguf(tmp_path / "in.gguf", {}, {"blk.0.ffn_up.weight": ref["input"]})
    file_type = {"Q3_K": "Q3_K_S", "Q4_K": "Q4_K_S", "Q5_K": "Q5_K_S"}
    for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", *K_TYPES, "IQ4_NL", "IQ4_XS"):
        ft = file_type.get(name, name)
        out = tmp_path / f"{name}.gguf"
        run(src, out, ft, "--pure")
        with GGUFFile(out) as g:
            t = g.tensors["blk.0.ffn_up.weight"]
            assert t.qtype == QType[name]
            assert np.array_equal(g.tensor_bytes(t.name), ref[name]), name


@pytest.mark.parametrize("ft", ALL_FILE_TYPES)
def test_every_type_from_f32(tmp_path, ft):
    src = tiny_model(tmp_path / "in.gguf")
    run(src, tmp_path / "out.gguf", ft)
    check_output(src, tmp_path / "out.gguf", ft)


@pytest.mark.parametrize("ft", ["Q4_K_M", "Q8_0", "BF16", "F32"])
def test_from_f16_with_gqa_and_tied_embeddings(tmp_path, ft):
    src = tiny_model(tmp_path / "in.gguf", dtype=np.float16, n_head_kv=1, tied=True, n_layer=4)
    run(src, tmp_path / "out.gguf", ft)
    check_output(src, tmp_path / "out.gguf", ft)


@pytest.mark.parametrize("ft", ["Q5_K_M", "F16"])
def test_from_bf16(tmp_path, ft):
    src = tiny_model(tmp_path / "in.gguf", n_layer=2)
    run(src, tmp_path / "bf16.gguf", "BF16")  # not a quantized type: no --allow-requantize needed
    run(tmp_path / "bf16.gguf", tmp_path / "out.gguf", ft)
    check_output(tmp_path / "bf16.gguf", tmp_path / "out.gguf", ft)


def test_requantize_needs_the_flag(tmp_path):
    src = tiny_model(tmp_path / "in.gguf", n_layer=2)
    run(src, tmp_path / "q8.gguf", "Q8_0")
    res = run(tmp_path / "q8.gguf", tmp_path / "q4.gguf", "Q4_K_M", ok=False)
    assert "--allow-requantize" in res.output and "Q8_0" in res.output
    assert not (tmp_path / "q4.gguf").exists()
    run(tmp_path / "q8.gguf", tmp_path / "q4.gguf", "Q4_K_M", "--allow-requantize")
    check_output(tmp_path / "q8.gguf", tmp_path / "q4.gguf", "Q4_K_M")
    # same type: a copy, which needs no flag
    run(tmp_path / "q8.gguf", tmp_path / "q8b.gguf", "Q8_0")
    check_output(tmp_path / "q8.gguf", tmp_path / "q8b.gguf", "Q8_0")


def test_slabs_and_threads_do_not_change_the_bytes(tmp_path, monkeypatch):
    src = tiny_model(tmp_path / "in.gguf", n_layer=2)
    run(src, tmp_path / "a.gguf", "Q4_K_M", "-t", "1")
    monkeypatch.setattr(quantize_mod, "SLAB_VALUES", 3 * 256 + 17)  # many slabs, uneven splits
    run(src, tmp_path / "b.gguf", "Q4_K_M", "-t", "3")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


# --- metadata and layout ------------------------------------------------------------------------

@pytest.mark.parametrize("alignment", [None, 64])
def test_metadata_carried_over_with_types(tmp_path, alignment):
    src = tiny_model(tmp_path / "in.gguf", n_layer=1, alignment=alignment)
    run(src, tmp_path / "out.gguf", "Q5_K_M")
    a, b = gguf.GGUFReader(src), gguf.GGUFReader(tmp_path / "out.gguf")
    keys_a = [k for k in a.fields if not k.startswith("GGUF.")]
    keys_b = [k for k in b.fields if not k.startswith("GGUF.")]
    moved = ["general.quantization_version", "general.file_type"]
    assert keys_b == [k for k in keys_a if k not in moved] + moved  # llama.cpp sets these last
    for k in keys_a:
        fa, fb = a.fields[k], b.fields[k]
        assert fa.types == fb.types, k
        if k != "general.file_type":
            assert fa.contents() == fb.contents(), k
    assert b.fields["general.file_type"].contents() == 17  # LLAMA_FTYPE_MOSTLY_Q5_K_M
    assert b.fields["general.file_type"].types == [gguf.GGUFValueType.UINT32]
    with GGUFFile(tmp_path / "out.gguf") as g:  # our reader checks offsets and alignment
        assert g.alignment == (alignment or 32)
        assert all(t.offset % g.alignment == 0 for t in g.tensors.values())
        assert g.file_size == g.data_offset + sum(-(-t.nbytes // g.alignment) * g.alignment
                                                  for t in g.tensors.values())


# --- against llama.cpp's own quantizer -------------------------------------------------------------

def _llama_quantize_reference(fixtures_dir):
    return json.loads((fixtures_dir / "quant" / "llama_quantize.json").read_text())["models"]


@pytest.fixture(scope="module")
def llama_reference_models(fixtures_dir, tmp_path_factory):
    """The tiny models scripts/make_quantize_reference.py gave to llama_model_quantize, rebuilt."""
    from tiny_models import tiny_model as tiny_engine_model

    d = tmp_path_factory.mktemp("llama-quantize")
    paths = {}
    for name, m in _llama_quantize_reference(fixtures_dir).items():
        spec = dict(m["tiny_model"])
        path = tiny_engine_model(d / f"{name}.gguf", spec.pop("arch"), QType.F32, **spec)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert digest == m["source_sha256"], f"{name}: the tiny model builder changed; rerun scripts/make_quantize_reference.py"
        paths[name] = path
    return paths


@pytest.mark.parametrize("ft", ALL_FILE_TYPES)
def test_files_equal_llama_quantize(fixtures_dir, llama_reference_models, tmp_path, ft):
    """Every file type, on tiny llama (GQA, tied embeddings, rows that force every fallback) and
    gemma3 models: the output file is byte for byte the one llama.cpp's llama_model_quantize wrote
    (metadata, tensor order, types, quantized bytes)."""
    for name, m in _llama_quantize_reference(fixtures_dir).items():
        out = tmp_path / f"{name}.gguf"
        quantize_mod.quantize_model(llama_reference_models[name], out, parse_file_type(ft), n_threads=2)
        assert hashlib.sha256(out.read_bytes()).hexdigest() == m["outputs"][ft], name


# --- the mixes ------------------------------------------------------------------------------------

def types_of(path):
    with GGUFFile(path) as g:
        return {n: t.qtype.name for n, t in g.tensors.items()}


MORE_BITS_8 = {0, 3, 6, 7}  # use_more_bits(i, 8): i < 1, i >= 7 or (i - 1) % 3 == 2


@pytest.mark.parametrize("ft, expect", [
    ("Q4_K_M", lambda i, kind: "Q6_K" if kind in ("attn_v", "ffn_down") and i in MORE_BITS_8 else "Q4_K"),
    ("Q5_K_M", lambda i, kind: "Q6_K" if kind in ("attn_v", "ffn_down") and i in MORE_BITS_8 else "Q5_K"),
    ("Q4_K_S", lambda i, kind: "Q5_K" if (kind == "attn_v" and i < 4) or (kind == "ffn_down" and i < 1)
     else "Q4_K"),
    ("Q3_K_M", lambda i, kind: {"attn_v": "Q5_K" if i < 2 else "Q4_K", "ffn_down": "Q4_K",
                                "attn_output": "Q4_K"}.get(kind, "Q3_K")),
    ("Q3_K_L", lambda i, kind: {"attn_v": "Q5_K", "ffn_down": "Q5_K", "attn_output": "Q5_K"}.get(kind, "Q3_K")),
    ("Q2_K", lambda i, kind: "Q3_K" if kind in ("attn_v", "ffn_down", "attn_output") else "Q2_K"),
    ("Q4_0", lambda i, kind: "Q4_0"),
    ("IQ4_NL", lambda i, kind: "Q5_K" if kind == "ffn_down" and i < 1 else "IQ4_NL"),
    ("IQ4_XS", lambda i, kind: "Q5_K" if kind == "ffn_down" and i < 1 else "IQ4_XS"),
])
def test_layer_mix(tmp_path, ft, expect):
    """llama_tensor_get_type_impl, read off by hand for 8 layers and no GQA."""
    src = tiny_model(tmp_path / "in.gguf")
    run(src, tmp_path / "out.gguf", ft)
    got = types_of(tmp_path / "out.gguf")
    default = FILE_TYPES[ft].default.name
    assert got["output.weight"] == "Q6_K"
    assert got["token_embd.weight"] == default  # not tied: the embeddings keep the default
    assert got["output_norm.weight"] == "F32"
    for i in range(8):
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            assert got[f"blk.{i}.{kind}.weight"] == expect(i, kind), (i, kind)
        assert got[f"blk.{i}.attn_norm.weight"] == "F32"


@pytest.mark.parametrize("ft, attn_v", [("Q2_K", "Q4_K"), ("IQ4_NL", "Q5_K"), ("IQ4_XS", "Q5_K")])
def test_gqa_and_tied_embeddings(tmp_path, ft, attn_v):
    src = tiny_model(tmp_path / "in.gguf", n_head=8, n_head_kv=2, tied=True, n_layer=2)
    run(src, tmp_path / "out.gguf", ft)
    got = types_of(tmp_path / "out.gguf")
    assert got["token_embd.weight"] == "Q6_K"  # tied to the output: the output's type
    assert got["blk.0.attn_v.weight"] == got["blk.1.attn_v.weight"] == attn_v  # n_gqa >= 4
    check_output(src, tmp_path / "out.gguf", ft)


@pytest.mark.parametrize("ft", ["Q4_K_M", "IQ4_NL", "IQ4_XS"])
def test_eight_expert_rules(ft):
    """Models with 8 experts: attn_v and attn_k get Q8_0, attn_output Q5_K (llama.cpp's rules
    for these mixes), the expert tensors the mix's default."""
    meta = {"general.architecture": "llama", "llama.block_count": 2, "llama.expert_count": 8,
            "llama.attention.head_count": 4, "llama.attention.head_count_kv": 4}
    names = [f"blk.{i}.{k}" for i in range(2) for k in ("attn_k.weight", "attn_output.weight", "attn_v.weight",
                                                        "ffn_up_exps.weight")]
    tensors = [(n, (256, 256, 8) if "exps" in n else (256, 256), QType.F32) for n in tensor_order(names)]
    got = {d.name: d.target.name for d in plan(meta, tensors, parse_file_type(ft))}
    default = FILE_TYPES[ft].default.name
    for i in range(2):
        assert got[f"blk.{i}.attn_v.weight"] == got[f"blk.{i}.attn_k.weight"] == "Q8_0"
        assert got[f"blk.{i}.attn_output.weight"] == "Q5_K"
        assert got[f"blk.{i}.ffn_up_exps.weight"] == default


def test_pure_and_overrides(tmp_path):
    src = tiny_model(tmp_path / "in.gguf")
    run(src, tmp_path / "pure.gguf", "Q4_K_M", "--pure")
    got = types_of(tmp_path / "pure.gguf")
    assert {v for k, v in got.items() if "norm" not in k} == {"Q4_K"}
    run(src, tmp_path / "ov.gguf", "Q4_K_M", "--tensor-type", "ATTN_V=q8_0", "--tensor-type", r"blk\.1\.ffn=Q5_0")
    got = types_of(tmp_path / "ov.gguf")
    assert got["blk.0.attn_v.weight"] == got["blk.1.attn_v.weight"] == "Q8_0"
    assert got["blk.1.ffn_up.weight"] == got["blk.1.ffn_down.weight"] == "Q5_0"
    assert got["blk.0.ffn_down.weight"] == "Q6_K"  # the mix still applies elsewhere
    # as in llama.cpp, a tensor set by hand does not advance the mix's layer counter: blk.2's
    # ffn_down is the second one the mix sees (not in MORE_BITS_8), blk.4's the third (is)
    assert got["blk.2.ffn_down.weight"] == "Q4_K" and got["blk.4.ffn_down.weight"] == "Q6_K"
    check_output(src, tmp_path / "ov.gguf", "Q4_K_M", overrides=[
        parse_override(s)
        for s in ("ATTN_V=q8_0", r"blk\.1\.ffn=Q5_0")])


def test_fallback_for_rows_not_divisible_by_256(tmp_path):
    # rows of 96 (a multiple of 32) and of 48 (not even that)
    src = tiny_model(tmp_path / "in.gguf", n_layer=1, n_embd=96, n_ff=48, n_head=2, n_head_kv=2)
    res = run(src, tmp_path / "out.gguf", "Q4_K_M", "--tensor-type", "attn_q=q5_k", ok=True)
    got = types_of(tmp_path / "out.gguf")
    assert got["blk.0.attn_k.weight"] == "Q5_0"  # Q4_K -> Q5_0
    assert got["blk.0.attn_v.weight"] == "Q8_0"  # layer 0 gets Q6_K -> Q8_0
    assert got["blk.0.attn_q.weight"] == "Q5_1"  # override Q5_K -> Q5_1
    assert got["blk.0.ffn_down.weight"] == "F16"  # 48 % 32 != 0: Q6_K -> Q8_0 does not fit either
    assert got["output.weight"] == "Q8_0"  # 96 % 256: the output's Q8_0 rule
    assert "falling back" in res.output
    check_output(src, tmp_path / "out.gguf", "Q4_K_M", overrides=[
        parse_override("attn_q=q5_k")])


@pytest.mark.parametrize("ft", ["IQ4_XS", "IQ4_NL"])
def test_iq4_fallbacks(tmp_path, ft):
    """IQ4_XS rows of 96 fall back to IQ4_NL (llama.cpp's 256-to-32 fallback); rows of 48 fit
    neither and become F16. The output gets Q8_0 both ways: its rule when the rows do not fit
    the default type (IQ4_XS), else Q6_K, whose fallback is Q8_0 (IQ4_NL)."""
    src = tiny_model(tmp_path / "in.gguf", n_layer=1, n_embd=96, n_ff=48, n_head=2, n_head_kv=2)
    run(src, tmp_path / "out.gguf", ft)
    got = types_of(tmp_path / "out.gguf")
    assert got["blk.0.attn_q.weight"] == got["blk.0.ffn_up.weight"] == "IQ4_NL"
    assert got["blk.0.ffn_down.weight"] == "F16"
    assert got["output.weight"] == "Q8_0"
    check_output(src, tmp_path / "out.gguf", ft)


# --- refusals and failures ------------------------------------------------------------------------

def test_output_equal_to_input_is_refused(tmp_path):
    src = tiny_model(tmp_path / "in.gguf", n_layer=1)
    before = src.read_bytes()
    res = run(src, tmp_path / "." / "in.gguf", "Q8_0", ok=False)
    assert "input" in res.output
    os.symlink(src, tmp_path / "link.gguf")
    run(src, tmp_path / "link.gguf", "Q8_0", ok=False)
    assert src.read_bytes() == before


@pytest.mark.parametrize("args, msg", [
    (["Q4_K_X"], "unknown quantization type"),
    (["Q4_K_M", "--tensor-type", "attn_v"], "PATTERN=TYPE"),
    (["Q4_K_M", "--tensor-type", "attn_v=q9_0"], "unknown tensor type"),
    (["Q4_K_M", "--tensor-type", "(=q8_0"], "bad pattern"),
])
def test_bad_options(tmp_path, args, msg):
    src = tiny_model(tmp_path / "in.gguf", n_layer=1)
    res = run(src, tmp_path / "out.gguf", *args, ok=False)
    assert msg in res.output
    assert not (tmp_path / "out.gguf").exists()


def test_bad_input_files(tmp_path):
    res = run(tmp_path / "missing.gguf", tmp_path / "out.gguf", "Q8_0", ok=False)
    assert "no such file" in res.output
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    res = run(tmp_path / "junk.gguf", tmp_path / "out.gguf", "Q8_0", ok=False)
    assert "not a GGUF file" in res.output
    src = tiny_model(tmp_path / "in.gguf", n_layer=1)
    res = run(src, tmp_path / "nodir" / "out.gguf", "Q8_0", ok=False)
    assert "nodir" in res.output


def leftovers(d):
    return sorted(p.name for p in d.iterdir() if p.name not in ("in.gguf",))


def test_failure_midway_leaves_no_file(tmp_path):
    src = tiny_model(tmp_path / "in.gguf", n_layer=3, nan_in="blk.2.ffn_up.weight")
    res = run(src, tmp_path / "out.gguf", "Q4_K_M", ok=False)
    assert "blk.2.ffn_up.weight" in res.output and "NaN" in res.output
    assert leftovers(tmp_path) == []
    # an existing file of that name is left as it was
    (tmp_path / "out.gguf").write_bytes(b"old")
    run(src, tmp_path / "out.gguf", "Q4_K_M", ok=False)
    assert (tmp_path / "out.gguf").read_bytes() == b"old"
    assert leftovers(tmp_path) == ["out.gguf"]


def test_disk_full_leaves_no_file(tmp_path, monkeypatch):
    src = tiny_model(tmp_path / "in.gguf", n_layer=2)
    calls = []
    real_write = gguf_writer.GGUFStreamWriter.write

    def write(self, data):
        calls.append(1)
        if len(calls) == 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(self, data)

    monkeypatch.setattr(gguf_writer.GGUFStreamWriter, "write", write)
    res = run(src, tmp_path / "out.gguf", "Q8_0", ok=False)
    assert "No space left on device" in res.output
    assert leftovers(tmp_path) == []


def test_interrupt_leaves_no_file(tmp_path, monkeypatch):
    src = tiny_model(tmp_path / "in.gguf", n_layer=2)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(quantize_mod, "_copy_tensor", interrupted)
    with pytest.raises(KeyboardInterrupt):
        quantize_mod.quantize_model(src, tmp_path / "out.gguf", parse_file_type("Q8_0"))
    assert leftovers(tmp_path) == []


# --- real models ----------------------------------------------------------------------------------

@pytest.mark.real
def test_plan_reproduces_the_real_files_mixes(real_model):
    """Both real files were made by llama-quantize (SmolLM2 as Q4_1, Gemma 3 as Q4_K_M, both with
    rows of 576 / 640 that force fallbacks): planning their file type from their own tensor list
    gives back every tensor's stored type."""
    _, path, _ = real_model
    with GGUFFile(path) as g:
        ft = {1: "F16", 3: "Q4_1", 15: "Q4_K_M"}[g.metadata["general.file_type"]]
        names = tensor_order(g.tensors)
        decisions = plan(g.metadata, [(n, g.tensors[n].shape, g.tensors[n].qtype) for n in names],
                         parse_file_type(ft))
        assert [d.name for d in decisions if d.converts] == []
        assert sum("falling back" in d.note for d in decisions) > 0


@pytest.fixture(scope="module")
def smollm2_f16(smollm2_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("smol") / "smollm2-f16.gguf"
    res = run(smollm2_path, out, "F16", ok=False)  # it is Q4_1: refused without the flag
    assert "--allow-requantize" in res.output
    run(smollm2_path, out, "F16", "--allow-requantize")
    return out


@pytest.mark.real
def test_real_f16_is_the_widened_q4_1(smollm2_path, smollm2_f16):
    check_output(smollm2_path, smollm2_f16, "F16")


@pytest.mark.real
@pytest.mark.parametrize("ft", ALL_FILE_TYPES)
def test_real_model_every_type(smollm2_f16, tmp_path, ft):
    out = tmp_path / f"{ft}.gguf"
    run(smollm2_f16, out, ft)
    check_output(smollm2_f16, out, ft, row_step=7)


def _log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


# one file holding every weight type; K types need SmolLM2's 1536-wide ffn_down rows
EVERY_TYPE_OVERRIDES = ["attn_q=q4_0", "attn_k=q4_1", "attn_v=q5_0", "attn_output=q5_1", "ffn_gate=bf16",
                        "ffn_up=f16", r"blk\.[0-4]\.ffn_down=q2_k", r"blk\.[5-9]\.ffn_down=q3_k",
                        r"blk\.1[0-4]\.ffn_down=q4_k", r"blk\.1[5-9]\.ffn_down=q5_k",
                        r"blk\.2[0-3]\.ffn_down=iq4_nl", r"blk\.2[4-6]\.ffn_down=iq4_xs", "ffn_down=q6_k"]


@pytest.mark.real
@pytest.mark.slow
def test_quantized_files_load_and_generate(smollm2_f16, tmp_path, fixtures_dir):
    """A file holding every weight type loads and generates in edgellm, and computes what its
    weights say: the same file widened back to F16 (the same values) gives nearly the same
    next-token distributions. A misplaced or misread tensor would put the two nats apart; what
    remains is the engine's activation quantization (measured: about 0.01 nats)."""
    from edgellm.api import LLM

    ids = json.loads((fixtures_dir / "reference" / "smollm2-135m-instruct-q4_1.public.json").read_text())[
        "teacher_forced"]["ids"][:24]
    mixed, wide = tmp_path / "mixed.gguf", tmp_path / "mixed-f16.gguf"
    run(smollm2_f16, mixed, "Q8_0", *[a for o in EVERY_TYPE_OVERRIDES for a in ("--tensor-type", o)])
    assert set(types_of(mixed).values()) == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                             "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"}
    run(mixed, wide, "F16", "--allow-requantize")
    with LLM(mixed, n_ctx=32, n_threads=2) as llm:
        text = llm.generate(ids[:8], max_tokens=4, temperature=0)
        assert isinstance(text, str)
        assert llm.last_stats.generated_tokens == 4 or llm.last_stats.stop_reason == "eog"
        lq = _log_softmax(llm.logits(ids))
    with LLM(wide, n_ctx=32, n_threads=2) as llm:
        lw = _log_softmax(llm.logits(ids))
    kld = float((np.exp(lw) * (lw - lq)).sum(axis=1).mean())
    assert 0 <= kld < 0.05, kld


@pytest.mark.real
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak RSS from /proc")
def test_memory_stays_bounded(gemma3_path, tmp_path):
    """Gemma 3's token embeddings alone are 168M values (640 MiB as float32); converting the whole
    model to F16 (a 520 MiB output) in a fresh process keeps its peak memory far below that."""
    code = (
        "import re, sys\n"
        "from edgellm.tools.quantize import quantize_model\n"
        "from edgellm.tools.quant_mix import parse_file_type\n"
        "quantize_model(sys.argv[1], sys.argv[2], parse_file_type('F16'), allow_requantize=True)\n"
        # VmHWM: this process image's peak resident set (ru_maxrss would include the forking parent's)
        "print(re.search(r'VmHWM:\\s*(\\d+) kB', open('/proc/self/status').read()).group(1))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(gemma3_path), str(tmp_path / "f16.gguf")],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC})
    assert out.returncode == 0, out.stderr
    peak_mib = int(out.stdout.split()[-1]) // 1024
    assert peak_mib < 300, peak_mib
    with GGUFFile(tmp_path / "f16.gguf") as g:
        assert g.tensors["token_embd.weight"].qtype == QType.F16
