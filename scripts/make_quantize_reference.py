"""Write tests/fixtures/quant/llama_quantize.json: what llama.cpp's own quantizer makes of tiny
models, for tests/test_tool_quantize.py to hold `edgellm quantize` to.

For each model (tests/tiny_models.py's tiny_model with the keyword arguments listed below, F32
weights, deterministic from its seed) and each file type edgellm knows (quant_mix.FILE_TYPES),
llama_model_quantize of libllama.so (llama.cpp build 0c1e570, loaded with ctypes; its default
parameters as llama-quantize uses them: no importance matrix, no overrides) writes a file; the
JSON keeps the sha256 of the source file and of every output file.

    python scripts/make_quantize_reference.py [--lib /work/llamacpp/build/bin/libllama.so]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from tiny_models import tiny_model  # noqa: E402

from edgellm.quants import QType  # noqa: E402
from edgellm.tools.quant_mix import FILE_TYPES  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "quant" / "llama_quantize.json"

# the mixes' rules each model exercises
MODELS = {
    # grouped-query attention with n_gqa 4, 8 layers (use_more_bits, first-eighth rules), untied output
    "llama-gqa4": dict(arch="llama", n_layer=8, n_embd=256, n_head=8, n_head_kv=2, head_dim=32, n_ff=512, tied=False),
    # one KV head, embeddings tied to the output
    "llama-tied": dict(arch="llama", n_layer=3, n_embd=256, n_head=8, n_head_kv=1, head_dim=32, n_ff=768, tied=True),
    # rows of 96 and 48: every fallback
    "llama-rows96": dict(arch="llama", n_layer=2, n_embd=96, n_head=2, n_head_kv=2, head_dim=48, n_ff=48, tied=False),
    "gemma3": dict(arch="gemma3", n_layer=6, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, tied=True),
}


class QuantizeParams(ctypes.Structure):  # include/llama.h struct llama_model_quantize_params
    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int), ("output_tensor_type", ctypes.c_int),
                ("token_embedding_type", ctypes.c_int), ("allow_requantize", ctypes.c_bool),
                ("quantize_output_tensor", ctypes.c_bool), ("only_copy", ctypes.c_bool), ("pure", ctypes.c_bool),
                ("keep_split", ctypes.c_bool), ("dry_run", ctypes.c_bool), ("imatrix", ctypes.c_void_p),
                ("kv_overrides", ctypes.c_void_p), ("tt_overrides", ctypes.c_void_p),
                ("prune_layers", ctypes.c_void_p), ("max_buf_size", ctypes.c_size_t)]


def build_model(path: Path, spec: dict) -> Path:
    spec = dict(spec)
    return tiny_model(path, spec.pop("arch"), QType.F32, **spec)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=Path, default=Path("/work/llamacpp/build/bin/libllama.so"))
    args = ap.parse_args()
    lib = ctypes.CDLL(str(args.lib))
    lib.llama_backend_init()
    lib.llama_model_quantize_default_params.restype = QuantizeParams
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(QuantizeParams)]
    lib.llama_model_quantize.restype = ctypes.c_uint32

    out = {"models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in MODELS.items():
            src = build_model(Path(tmp) / f"{name}.gguf", spec)
            entry = {"tiny_model": spec, "source_sha256": sha256(src), "outputs": {}}
            for ft in FILE_TYPES.values():
                dst = Path(tmp) / f"{name}-{ft.name}.gguf"
                p = lib.llama_model_quantize_default_params()
                p.ftype, p.nthread = ft.ftype, 2
                if lib.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p)) != 0:
                    raise SystemExit(f"llama_model_quantize failed for {name} as {ft.name}")
                entry["outputs"][ft.name] = sha256(dst)
                dst.unlink()
            out["models"][name] = entry
            print(name, "done", flush=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
