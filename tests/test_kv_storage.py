"""The C engine's KV storage (csrc/kv.c): blocks keep their bytes wherever the pool put them -
across slabs, across the reservations the pool grows into, and after their slabs were moved into
huge pages (el_kv_settle) - for every cache type, with and without sliding-window layers."""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest

import edgellm
from edgellm.quants import QType
from edgellm.weights import huge_pages_wanted
from tiny_models import tiny_model

SLAB = 64           # blocks per slab (csrc/engine_internal.h SLAB_BLOCKS)
FIRST_EXTENT = 64   # slabs the first reservation holds (kv.c EXTENT_MIN_SLABS)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("kvstore")
    return {"llama": tiny_model(d / "l.gguf", "llama", QType.Q8_0),
            "gemma3": tiny_model(d / "g.gguf", "gemma3", QType.Q4_0)}


def _engine(path, types):
    llm = edgellm.LLM(path, n_ctx=256, n_batch=32, n_threads=1, cache_type_k=types[0], cache_type_v=types[1])
    if llm.backend == "numba":
        pytest.skip("the C engine's storage")
    return llm, llm._engine


def _kernel_collapses() -> bool:
    """MADV_COLLAPSE: Linux 6.1 and later, with transparent huge pages not off."""
    if platform.system() != "Linux" or not huge_pages_wanted():
        return False
    m = re.match(r"(\d+)\.(\d+)", platform.release())
    return m is not None and (int(m[1]), int(m[2])) >= (6, 1)


@pytest.mark.parametrize("arch,types", [("llama", ("f16", "f16")), ("llama", ("q8_0", "q4_0")),
                                        ("gemma3", ("q4_0", "q8_0"))])
def test_blocks_keep_their_bytes_across_slabs_reservations_and_huge_pages(models, arch, types):
    llm, eng = _engine(models[arch], types)
    rng = np.random.default_rng(0)
    groups = (0, 1) if eng.has_swa else (0,)
    # past the first reservation: the pool grows into a second one
    n = (FIRST_EXTENT + 3) * SLAB
    for g in groups:
        assert eng.kv_reserve(g, 4 * SLAB) >= 4 * SLAB
        assert eng.kv_reserve(g, n) >= n
    # every block gets bytes of its own (positions included): each slab's first and last
    # blocks, the reservations' edges, and some between
    probe = sorted({0, 1, SLAB - 1, SLAB, 5 * SLAB - 1, FIRST_EXTENT * SLAB - 1, FIRST_EXTENT * SLAB,
                    n - 1} | set(rng.integers(0, n, 20).tolist()))
    want = {}
    for g in groups:
        size = eng.kv_block_bytes(g)
        for b in range(n):  # all of them written: as a pool that handed out blocks [0, n)
            data = rng.integers(0, 256, size, dtype=np.uint8)
            if types[0] == "f16" or types[1] == "f16":  # keep halves finite (any bits copy, but be plain)
                data[1::2] &= 0x3B
            eng.kv_write_block(g, b, data.tobytes())
            if b in probe:
                want[g, b] = data.tobytes()
    for g, b in want:
        assert eng.kv_read_block(g, b) == want[g, b], f"group {g} block {b}"
    moved = sum(eng.kv_settle(g, n) for g in groups)
    for g, b in want:
        assert eng.kv_read_block(g, b) == want[g, b], f"group {g} block {b} after settling"
    if _kernel_collapses():
        assert moved >= 2 << 20, "full slabs were not moved into huge pages"
    # settling again moves nothing more; a bad group is refused
    assert sum(eng.kv_settle(g, n) for g in groups) == 0
    assert llm._engine.lib.el_kv_settle(eng._eng, 2, n) == -2


def test_generation_is_the_same_with_and_without_huge_kv_pages(models, monkeypatch):
    """A sequence long enough to fill slabs (the pool settles them as it goes) decodes the same
    tokens as one whose KV cache stays in small pages."""
    prompt = list(range(1, 200)) * 8  # 1592 tokens: 99 blocks, one full slab and more
    out = {}
    for huge in ("1", "0"):
        monkeypatch.setenv("EDGELLM_HUGEPAGES", huge)
        llm = edgellm.LLM(models["gemma3"], n_ctx=2048, n_batch=256, n_threads=2)
        out[huge] = llm.generate(prompt, max_tokens=24, temperature=0)
        assert llm._pool.groups[0].settled >= SLAB + 1
    assert out["1"] == out["0"]
