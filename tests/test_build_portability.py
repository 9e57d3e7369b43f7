"""The C sources build with clang as well as GCC, and their macOS branches compile.

- x86-64 Linux with clang: every csrc/*.c with the package's flags, no warning, and the objects
  link into one shared library with no undefined symbol. (aarch64 with clang, and the clang-built
  NEON checker under qemu, are in test_neon_qemu.py.)
- macOS (arm64 and x86-64): there is no macOS SDK here, so `clang -target *-apple-macos11
  -fsyntax-only` runs over every file with Debian's glibc headers standing in for the SDK's C
  library, and a two-line <sys/sysctl.h> declaring sysctlbyname as macOS does. That compiles the
  __APPLE__ branches (dotprod from sysctlbyname("hw.optional.arm.FEAT_DotProd")) and proves no
  Linux-only header or call (getauxval, <sys/auxv.h>) is left unguarded; it is not a macOS build.
- Every build (setup.py loads csrc/build_ffi.py) compiles the C files side by side, one per core.

Needs Debian's clang (and libc6-dev-arm64-cross for the arm64 macOS headers); skipped, saying
so, without them.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CSRC = HERE.parent / "csrc"
SOURCES = sorted(CSRC.glob("*.c"))
ARM64_HEADERS = Path("/usr/aarch64-linux-gnu/include")
_spec = importlib.util.spec_from_file_location("neon_build", HERE / "neon" / "build.py")
neon_build = importlib.util.module_from_spec(_spec)  # its compile_args(): the package's flags
_spec.loader.exec_module(neon_build)
SYSCTL_H = """#include <stddef.h>
int sysctlbyname(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
"""


@pytest.fixture(scope="module")
def clang() -> str:
    cc = shutil.which("clang")
    if cc is None:
        pytest.skip("clang not installed (Debian package clang)")
    return cc


def _compile(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def test_clang_x86_64_builds_without_warnings(clang, tmp_path):
    objects = [str(tmp_path / (src.stem + ".o")) for src in SOURCES]
    runs = neon_build.compile_each([[clang, "--target=x86_64-linux-gnu", *neon_build.compile_args(), "-fPIC",
                                     f"-I{CSRC}", "-c", str(src), "-o", obj] for src, obj in zip(SOURCES, objects)])
    for src, r in zip(SOURCES, runs):
        assert r.returncode == 0, f"{src.name} does not compile with clang:\n{r.stderr}"
        assert r.stderr == "", f"{src.name}: clang warnings:\n{r.stderr}"
    r = _compile([clang, "--target=x86_64-linux-gnu", "-shared", "-Wl,--no-undefined", *objects,
                  "-o", str(tmp_path / "kernels.so"), "-lm", "-lpthread"])
    assert r.returncode == 0, f"the clang objects do not link into a library:\n{r.stderr}"


@pytest.fixture(scope="module")
def mac_stubs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("macos-stubs")
    (d / "sys").mkdir()
    (d / "sys" / "sysctl.h").write_text(SYSCTL_H)
    return d


@pytest.mark.parametrize("target", ["arm64-apple-macos11", "x86_64-apple-macos11"])
def test_macos_branches_compile(clang, mac_stubs, target):
    if target.startswith("arm64"):
        if not ARM64_HEADERS.is_dir():
            pytest.skip(f"{ARM64_HEADERS} missing (Debian package libc6-dev-arm64-cross)")
        libc = [f"-isystem{ARM64_HEADERS}"]
    else:
        libc = ["-isystem/usr/include/x86_64-linux-gnu", "-isystem/usr/include"]
    probe = _compile([clang, "-target", target, "-dM", "-E", "-x", "c", "/dev/null"])
    assert "#define __APPLE__ 1" in probe.stdout and "__linux__" not in probe.stdout
    for src in SOURCES:
        # -U__nonnull: clang's Darwin targets predefine it (nullability), glibc's headers define it
        r = _compile([clang, "-target", target, "-fsyntax-only", "-U__nonnull", "-nostdlibinc",
                      f"-isystem{mac_stubs}", *libc, *neon_build.compile_args(), f"-I{CSRC}", str(src)])
        assert r.returncode == 0, f"{src.name} does not compile for {target}:\n{r.stderr}"
        assert r.stderr == "", f"{src.name} ({target}): warnings:\n{r.stderr}"


def test_build_compiles_the_c_files_side_by_side(tmp_path, monkeypatch):
    """csrc/build_ffi.py (which setup.py loads at every install) makes distutils compile the
    extension's C files side by side, EDGELLM_BUILD_JOBS (default: the usable cores) at a time:
    with 2 jobs, each of two files' compilations waits at a barrier for the other (a one-by-one
    build breaks the barrier at its timeout), and compile returns every object, in the sources'
    order, as distutils' own does."""
    import threading

    from distutils.ccompiler import CCompiler, new_compiler

    monkeypatch.setattr(CCompiler, "compile", CCompiler.compile)  # put back after the test
    monkeypatch.setenv("EDGELLM_BUILD_JOBS", "2")
    spec = importlib.util.spec_from_file_location("edgellm_build_ffi", CSRC / "build_ffi.py")
    build_ffi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_ffi)
    assert CCompiler.compile is build_ffi._compile_in_parallel, "this setuptools' distutils lacks the hooks"

    sources = []
    for name, size in (("small.c", 1), ("large.c", 200)):  # the larger file is started first
        (tmp_path / name).write_text("int x;\n" * size)
        sources.append(str(tmp_path / name))
    meet = threading.Barrier(2, timeout=30)
    started = []

    def fake_compile(obj, src, ext, cc_args, extra_postargs, pp_opts):
        started.append(os.path.basename(src))
        meet.wait()  # BrokenBarrierError unless the other file is being compiled meanwhile
        Path(obj).write_text("")

    cc = new_compiler()
    cc._compile = fake_compile
    objects = cc.compile(sources, output_dir=str(tmp_path / "build"))
    assert [Path(o).stem for o in objects] == ["small", "large"]
    assert all(Path(o).exists() for o in objects)

    # one job: one after another, the largest first (the longest compile is not left for last)
    monkeypatch.setenv("EDGELLM_BUILD_JOBS", "1")
    started.clear()
    meet = threading.Barrier(1)
    cc.compile(sources, output_dir=str(tmp_path / "build1"))
    assert started == ["large.c", "small.c"]
