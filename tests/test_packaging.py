"""What `python -m build` makes: an sdist that carries csrc/ (the wheel is built from it), and a
wheel that, installed into a fresh virtual environment, runs `edgellm generate` on its C kernels -
also on a CPU without AVX (qemu-x86_64 -cpu Nehalem), so nothing in it assumes the build
machine's CPU. And an install with no working C compiler falls back to numba with one warning."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from edgellm.quants import QType
from tiny_models import tiny_model

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=1200, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def fresh_venv(where: Path) -> Path:
    """A new virtual environment whose dependencies (numpy, numba, ...) come from the interpreter's
    site-packages, so no download is needed; edgellm itself is installed into it (by this pip:
    the venv gets none of its own, which saves half a minute)."""
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", where])
    return where / "bin"


def pip_install(bin_dir: Path, *args, **kw):
    return run([sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "--no-deps",
                "--disable-pip-version-check", *args], **kw)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", out, REPO])  # the sdist, then the wheel from it
    (sdist,), (wheel,) = list(out.glob("*.tar.gz")), list(out.glob("*.whl"))
    return sdist, wheel


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory):
    where = tmp_path_factory.mktemp("wheel-venv")
    bin_dir = fresh_venv(where / "venv")
    pip_install(bin_dir, "--force-reinstall", dist[1])
    model = tiny_model(where / "tiny.gguf", "llama", QType.Q4_K)
    return bin_dir, model, where


def greedy(model: Path) -> str:
    import edgellm

    return edgellm.LLM(model, n_ctx=64, n_threads=1).generate("the cat", max_tokens=6, temperature=0)


def test_sdist_carries_the_c_sources(dist):
    sdist, wheel = dist
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    wanted = {str(p.relative_to(REPO)) for p in (REPO / "csrc").rglob("*") if p.suffix in (".c", ".h", ".py")}
    assert wanted and wanted <= names, sorted(wanted - names)
    with zipfile.ZipFile(wheel) as z:
        assert any(n.startswith("edgellm/_kernels") and n.endswith(".so") for n in z.namelist())


def test_wheel_runs_generate_in_a_fresh_venv(installed):
    bin_dir, model, where = installed
    r = run([bin_dir / "edgellm", "generate", model, "-p", "the cat", "-n", "6", "--temp", "0", "-t", "1", "-v"],
            cwd=where)
    assert r.stdout == greedy(model) + "\n"
    assert "numba" not in r.stderr and "thread]" in r.stderr  # the C kernels ran


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("qemu-x86_64") is None,
                    reason="needs an x86_64 machine and qemu-x86_64 (Debian's qemu-user) to emulate a CPU without AVX")
def test_wheel_runs_on_a_cpu_without_avx(installed):
    """Nehalem (2008): SSE4.2, no AVX. The wheel's dispatch must pick its generic kernels there.
    OPENBLAS_CORETYPE: under qemu-user on some hosts (seen on AMD Zen 5) numpy's OpenBLAS picks
    an AVX2 kernel for the emulated Nehalem and `import numpy` dies of SIGILL before edgellm runs;
    naming the core gives it the kernels a real Nehalem gets."""
    bin_dir, model, where = installed
    env = dict(os.environ, OPENBLAS_CORETYPE="Nehalem")
    r = run(["qemu-x86_64", "-cpu", "Nehalem", bin_dir / "python", "-m", "edgellm", "generate", model,
             "-p", "the cat", "-n", "6", "--temp", "0", "-t", "1", "-v"], cwd=where, env=env)
    assert r.stdout == greedy(model) + "\n"
    assert "| generic, 1 thread]" in r.stderr


def test_install_without_a_c_compiler_falls_back_to_numba(dist, tmp_path):
    bin_dir = fresh_venv(tmp_path / "venv")
    env = dict(os.environ, CC="/bin/false", LDSHARED="/bin/false")
    r = pip_install(bin_dir, "-v", dist[0], env=env)
    assert "edgellm's C kernels could not be built" in r.stdout + r.stderr
    code = "import edgellm.kernels as k; print(k.backend_name(), k.backend_name())"
    r = run([bin_dir / "python", "-W", "always", "-c", code], cwd=tmp_path)
    assert r.stdout.split() == ["numba", "numba"]
    assert r.stderr.count("Warning") == 1 and "numba kernels" in r.stderr, r.stderr
