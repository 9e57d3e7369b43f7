"""Kernels: the only package that knows about ISAs.

Two backends run the same engine protocol (`batch.views()` filled, then `decode(n, n_seqs, mb)`,
over KV blocks; `kv_reserve`, `kv_copy_block`, `kv_clear_block`, `kv_shift`, `kv_positions`, `set_threads`, `isa`;
see kernels/cengine.py):
- "c": csrc/ built through cffi at install; the ISA path (generic, avx2, avx512, neon) is chosen
  at run time from CPU features, or forced with EDGELLM_ISA.
- "numba": pure Python + numba, for installs without a C compiler (slow, but complete).
EDGELLM_BACKEND=c|numba forces one.
"""

from __future__ import annotations

import os
import warnings

from ..errors import EdgeLLMError

ISA_NAMES = ("generic", "avx2", "avx512", "neon")
ISA_FEATURES = ((1, "dotprod"),)  # bits of el_isa_features(): optional CPU features a path uses
_warned = False

# The model features (models.base.FEATURES) each engine's forward pass implements; a model that
# needs another is refused with a line naming it.
_FORWARD_FEATURES = frozenset({
    "qkv_bias", "attn_out_bias", "qk_norm_head", "post_norms", "attn_softcap", "final_softcap", "sliding_window",
    "rope_freqs", "rope_linear", "rope_yarn", "embd_scale", "q_scale", "gelu", "output_bias", "rope_skip",
    "residual_scale", "logit_scale", "fused_qkv", "fused_gate_up", "longrope", "qk_norm_all", "no_pre_norm",
    "attn_temp", "moe", "shared_expert", "shared_expert_gate",
    # gemma4's (csrc/gemma4.c and per-layer sizes in engine.c / kv.c / attention.c; numba_engine's twins)
    "layer_sizes", "kv_shared", "v_from_k", "v_norm", "rope_freqs_layers", "per_layer_embd", "layer_out_scale",
    # qwen35's (csrc/delta_net.c and recurrent state slots; numba_delta_net's twins)
    "attn_out_gate", "delta_net"})
ENGINE_FEATURES = {"c": _FORWARD_FEATURES, "numba": _FORWARD_FEATURES}


def c_module():
    """(ffi, lib) of the compiled kernels, or None where they were not built."""
    try:
        from .. import _kernels  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _kernels.ffi, _kernels.lib


def _apply_isa(lib) -> None:
    """The kernel path EDGELLM_ISA names, else the best this CPU runs - also after an engine made
    earlier in the process was forced to another one (the choice is process-wide in the C library;
    it is only rewritten when it changes)."""
    want = os.environ.get("EDGELLM_ISA", "").strip().lower()
    if not want:
        if lib.el_get_isa() != lib.el_cpu_isa_best():
            lib.el_set_isa(-1)
        return
    if want not in ISA_NAMES:
        raise EdgeLLMError(f"EDGELLM_ISA={want!r}: expected one of {', '.join(ISA_NAMES)}")
    got = ISA_NAMES[lib.el_set_isa(ISA_NAMES.index(want))]
    if got != want:
        raise EdgeLLMError(f"EDGELLM_ISA={want}: this CPU cannot run it (best: {ISA_NAMES[lib.el_cpu_isa_best()]})")


class BatchArrays:
    """An engine's preallocated el_batch arrays (csrc/api/engine.h): a step fills views of them
    (`views`), so a decode call allocates nothing and hands the C engine fixed pointers."""

    def __init__(self, n_batch: int, max_blocks: int):
        import numpy as np

        self.max_blocks = max_blocks
        self.token = np.zeros(n_batch, dtype=np.int32)
        self.pos = np.zeros(n_batch, dtype=np.int32)
        self.seq = np.zeros(n_batch, dtype=np.int32)
        self.want = np.zeros(n_batch, dtype=np.int8)
        self.seq_len = np.zeros(n_batch, dtype=np.int32)
        self.tables = np.zeros(2 * n_batch * max_blocks, dtype=np.int32)
        self.rs_slot = np.full(n_batch, -1, dtype=np.int32)  # recurrent state slot per sequence

    def views(self, n: int, n_seqs: int, mb: int):
        """(token, pos, seq, want, seq_len, tables [2, n_seqs, mb]) for a step of n rows."""
        return (self.token[:n], self.pos[:n], self.seq[:n], self.want[:n], self.seq_len[:n_seqs],
                self.tables[:2 * n_seqs * mb].reshape(2, n_seqs, mb))


def out_rows(engine, out, n_out: int):
    """Where an engine writes n_out rows of logits: the caller's array (C-contiguous float32
    [>= n_out, n_vocab]), else the engine's own growing buffer (engine._new_out; valid until its
    next step)."""
    import numpy as np

    if out is not None:
        if out.dtype != np.float32 or not out.flags.c_contiguous or out.shape[0] < n_out \
                or out.shape[1:] != (engine.n_vocab,):
            raise ValueError("out must be C-contiguous float32 [>= rows wanted, n_vocab]")
        return out[:n_out]
    if engine._out.shape[0] < n_out:  # grown to what a step asks, no more: a row of a large vocabulary is 1 MB
        engine._out = engine._new_out(n_out)
    return engine._out[:n_out]


def backend_name() -> str:
    """The backend engines will use: EDGELLM_BACKEND, else C when built, else numba."""
    global _warned
    want = os.environ.get("EDGELLM_BACKEND", "").strip().lower()
    if want not in ("", "c", "numba"):
        raise EdgeLLMError(f"EDGELLM_BACKEND={want!r}: expected 'c' or 'numba'")
    if want == "numba":
        return "numba"
    if c_module() is not None:
        return "c"
    if want == "c":
        raise EdgeLLMError("EDGELLM_BACKEND=c but the C kernels were not built (no compiler at install?)")
    if not _warned:
        warnings.warn("edgellm's C kernels are not built; running on the (slower) numba kernels", stacklevel=3)
        _warned = True
    return "numba"


def available_isas() -> list[str]:
    """The C kernel paths this CPU can run, generic first (empty without the C kernels)."""
    m = c_module()
    if m is None:
        return []
    best = m[1].el_cpu_isa_best()
    if ISA_NAMES[best] == "neon":
        return ["generic", "neon"]
    return list(ISA_NAMES[: best + 1])


def isa_name() -> str:
    if backend_name() == "numba":
        return "numba"
    ffi, lib = c_module()
    _apply_isa(lib)
    return ISA_NAMES[lib.el_get_isa()]


def isa_label(isa: str) -> str:
    """`isa` with the optional CPU features its kernels use, as the CLI and `edgellm bench` print
    it: "neon+dotprod" on a Raspberry Pi 5 / Apple M1, "neon" on a Pi 4; other paths unchanged."""
    m = c_module()
    if m is None or isa not in ISA_NAMES or ISA_NAMES[m[1].el_get_isa()] != isa:
        return isa
    bits = m[1].el_isa_features()
    return "+".join([isa] + [name for bit, name in ISA_FEATURES if bits & bit])


def create_engine(gguf, cfg, weights, *, n_ctx: int, n_batch: int, n_threads: int, store=None, cache_types=None):
    """An engine over gguf's tensors; `store` (weights.WeightStore) says where the C engine reads
    them (default: straight from the file's mapping); cache_types: (keys, values) QTypes of the
    KV cache (default f16, f16). UnsupportedModelError when the model needs a feature the engine
    does not implement."""
    from ..models.base import check_features
    from ..quants import QType

    types = tuple(cache_types or (QType.F16, QType.F16))
    backend = backend_name()
    check_features(cfg, weights, ENGINE_FEATURES[backend], backend)
    if backend == "c":
        from ..weights import WeightStore
        from .cengine import CEngine

        ffi, lib = c_module()
        _apply_isa(lib)
        return CEngine(store or WeightStore(gguf), cfg, weights, n_ctx=n_ctx, n_batch=n_batch,
                       n_threads=n_threads, lib=lib, ffi=ffi, cache_types=types)
    from .numba_engine import NumbaEngine

    return NumbaEngine(gguf, cfg, weights, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, cache_types=types)
