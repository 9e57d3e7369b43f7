"""Where the engine reads the weights from (edgellm/weights.py): the file mapping or the huge-page
copy (EDGELLM_HUGEPAGES=0 keeps the mapping), mlock (LLM(mlock=True), `--mlock`) and its error
when the locked-memory limit is too low, and the paths that must degrade off Linux."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import edgellm
from edgellm import api, weights
from edgellm.cli import main
from edgellm.gguf_file import GGUFFile
from tiny_models import tiny_model

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("weights") / "tiny.gguf")


def _vm_locked_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1])
    raise AssertionError("no VmLck in /proc/self/status")


def _data_bytes(llm) -> int:
    t = llm.gguf.tensors.values()
    return max(x.offset + x.nbytes for x in t) - min(x.offset for x in t)


def _greedy(llm) -> list[int]:
    s = llm.session()
    ids = llm.tokenize("the cat sat")
    out = []
    for _ in range(4):
        nxt = int(s.feed(ids).argmax())
        out.append(nxt)
        ids = [nxt]
    return out


def test_hugepages_off_keeps_the_file_mapping(model, monkeypatch):
    """EDGELLM_HUGEPAGES=0: the engine reads the file's pages (no copy), with the same results."""
    if edgellm.kernels.backend_name() != "c":
        pytest.skip("the huge-page copy is the C engine's")
    monkeypatch.setenv("EDGELLM_HUGEPAGES", "0")
    plain = api.LLM(model, n_ctx=64)
    tokens_plain = _greedy(plain)
    assert not plain._store.in_huge_pages
    monkeypatch.setenv("EDGELLM_HUGEPAGES", "1")
    moved = api.LLM(model, n_ctx=64)
    assert _greedy(moved) == tokens_plain
    assert moved._store.in_huge_pages == weights._thp_available()


@pytest.mark.parametrize("huge", ["0", "1"])
def test_data_bytes_are_every_tensor_where_the_engine_reads_them(model, monkeypatch, huge):
    """data_bytes (the read loop's buffer) spans every tensor: the copy in huge pages when moved,
    the file's data section otherwise, with the file's bytes either way."""
    monkeypatch.setenv("EDGELLM_HUGEPAGES", huge)
    llm = api.LLM(model, n_ctx=64)
    llm._engine  # moves the weights where it can
    data = llm._store.data_bytes()
    assert data.nbytes == _data_bytes(llm)
    first = min(llm.gguf.tensors.values(), key=lambda t: t.offset)
    last = max(llm.gguf.tensors.values(), key=lambda t: t.offset + t.nbytes)
    assert bytes(data[:first.nbytes]) == bytes(llm.gguf.tensor_bytes(first.name).reshape(-1))
    assert bytes(data[data.nbytes - last.nbytes:]) == bytes(llm.gguf.tensor_bytes(last.name).reshape(-1))
    if huge == "1" and llm._store.in_huge_pages:
        assert data.ctypes.data != llm.gguf._u8.ctypes.data + first.offset


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmLck from /proc")
@pytest.mark.parametrize("huge", ["0", "1"])
def test_mlock_holds_the_weights_in_ram(model, monkeypatch, huge):
    """mlock=True locks the data section at load; after the huge-page copy the copy is what is
    locked (the file's pages were unlocked, not locked twice), and the results do not change."""
    monkeypatch.setenv("EDGELLM_HUGEPAGES", huge)
    gc.collect()  # locks of models from earlier tests are gone before we count
    before = _vm_locked_kib()
    llm = api.LLM(model, n_ctx=64, mlock=True)
    size = _data_bytes(llm)
    assert llm._store.locked_bytes == size
    assert _vm_locked_kib() - before >= size // 1024
    tokens = _greedy(llm)
    assert _vm_locked_kib() - before <= size // 1024 + 2 * 4  # one copy (+ partial pages at the ends)
    assert llm._store.locked_bytes == size
    assert tokens == _greedy(api.LLM(model, n_ctx=64))
    del llm


def _without_ipc_lock() -> list[str] | None:
    """A command prefix that runs a child without CAP_IPC_LOCK (which ignores RLIMIT_MEMLOCK):
    nothing for an ordinary user, setpriv for root; None when it cannot be had."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    return [setpriv, "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_MEMLOCK semantics checked on Linux")
def test_mlock_over_the_limit_is_a_clear_error(model):
    """With RLIMIT_MEMLOCK below the model's size, LLM(mlock=True) raises MemoryLockError naming
    the limit, and `edgellm generate --mlock` prints one line (no traceback)."""
    prefix = _without_ipc_lock()
    if prefix is None:
        pytest.skip("running as root without setpriv: CAP_IPC_LOCK cannot be dropped")
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (16384, 16384))
        from edgellm import LLM
        from edgellm.errors import MemoryLockError
        try:
            LLM({str(model)!r}, n_ctx=64, mlock=True)
        except MemoryLockError as e:
            print("ERR", e)
            sys.exit(0)
        print("no error")
        sys.exit(1)
    """)
    r = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RLIMIT_MEMLOCK" in r.stdout and "16 KiB" in r.stdout, r.stdout
    cli = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (16384, 16384))
        from edgellm.cli import main
        sys.argv = ["edgellm", "generate", {str(model)!r}, "-p", "the", "-n", "1", "-c", "64", "--mlock"]
        main()
    """)
    r = subprocess.run([*prefix, sys.executable, "-c", cli], capture_output=True, text=True, cwd=HERE)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("Error: mlock: cannot lock") and "ulimit -l" in r.stderr, r.stderr


def test_mlock_option_on_the_commands(model):
    """--mlock is accepted by run, generate and bench (and shown in their help)."""
    runner = CliRunner()
    for cmd in ("run", "generate", "bench"):
        r = runner.invoke(main, [cmd, "--help"])
        assert r.exit_code == 0 and "--mlock" in r.output, cmd
    r = runner.invoke(main, ["generate", str(model), "-p", "the", "-n", "2", "-c", "64", "--temp", "0", "--mlock"])
    assert r.exit_code == 0, r.output


def test_off_linux_no_huge_pages(model, monkeypatch):
    """Where there is no transparent huge page support (macOS, Windows), the store keeps the
    mapping and says so, without touching /sys or madvise."""
    monkeypatch.setattr(weights.sys, "platform", "darwin")
    assert weights._thp_available() is False
    store = weights.WeightStore(GGUFFile(model))
    assert store.move_to_huge_pages() is False and not store.in_huge_pages


def test_physical_cores_without_linux_interfaces(monkeypatch):
    """No sched_getaffinity and no /sys topology (macOS): the logical CPU count, at least 1."""
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    real_open = open

    def no_sys(path, *a, **k):
        if str(path).startswith("/sys/"):
            raise FileNotFoundError(path)
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", no_sys)
    assert api.physical_cores() == max(1, os.cpu_count() or 1)
