"""ARM NEON kernels (csrc/arm_neon*.c) without ARM hardware: cross-compiled for aarch64 and run
under qemu-user on CPU models with and without the dot product extension.

The checker (tests/neon/test_neon.c, linked with the whole library) compares every NEON kernel
with its generic twin, every gemm tile with the same level's vec_dot, and el_matmul with the
dispatched vec_dot; here we run it on three CPUs and check that the run-time
dispatch chose the level each CPU has (Cortex-A72 = Raspberry Pi 4: no sdot, so a wrong choice
dies of SIGILL; Cortex-A76 = Raspberry Pi 5 and `max`: sdot). Everything runs twice: built with
GCC's cross compiler and with clang (same flags, same cross sysroot).

Needs Debian's gcc-aarch64-linux-gnu, clang and qemu-user; skipped (saying so) when one is missing.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CSRC = HERE.parent / "csrc"


def _load_build():
    spec = importlib.util.spec_from_file_location("neon_build", HERE / "neon" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build = _load_build()


@pytest.fixture(scope="module", params=sorted(build.COMPILERS))
def cross_cc(request) -> list[str]:
    """The aarch64 compiler command: GCC's cross compiler, then clang for the same target."""
    if shutil.which(build.CC) is None:  # clang links against the same cross toolchain
        pytest.skip(f"{build.CC} not installed (Debian package gcc-aarch64-linux-gnu)")
    cmd = build.COMPILERS[request.param]
    if shutil.which(cmd[0]) is None:
        pytest.skip(f"{cmd[0]} not installed (Debian package {cmd[0]})")
    return cmd


@pytest.fixture(scope="module")
def qemu() -> str:
    q = shutil.which(build.QEMU)
    if q is None:
        pytest.skip(f"{build.QEMU} not installed (Debian package qemu-user)")
    return q


@pytest.fixture(scope="module")
def library(cross_cc, tmp_path_factory) -> list[tuple[Path, Path, str]]:
    """Every csrc/*.c compiled for aarch64 once per compiler: (source, object, warnings)."""
    try:
        return build.compile_library(tmp_path_factory.mktemp("neon-objects"), cc=cross_cc)
    except subprocess.CalledProcessError as e:
        pytest.fail(f"{e.cmd[-3]} does not compile for aarch64:\n{e.stderr}")


@pytest.fixture(scope="module")
def checker(cross_cc, library, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("neon") / "test_neon"
    try:
        build.link_checker(out, [o for _, o, _ in library], cc=cross_cc)
    except subprocess.CalledProcessError as e:
        pytest.fail(f"cross build of the NEON checker failed:\n{e.stderr}")
    return out


# the global symbols of the NEON files: the entry points dispatch.c and the checker call, and the
# registration each kernel file gives arm_neon.c; every kernel is static
NEON_EXPORTS = {
    "arm_neon.c": {"el_register_neon", "el_register_neon_level", "el_neon_has_dotprod"},
    "arm_neon_q32.c": {"el_neon_register_q32"},
    "arm_neon_kquants.c": {"el_neon_register_kquants"},
    "arm_neon_iq4.c": {"el_neon_register_iq4"},
    "arm_neon_attn.c": {"el_neon_register_vops"},
}


def test_every_csrc_file_compiles_for_aarch64(cross_cc, library, tmp_path):
    """The package's build (every csrc/*.c, its flags, no -march) works on aarch64 with GCC and
    with clang: every file without a warning, the x86 files compile to nothing there, each NEON
    file (arm_neon*.c, one translation unit per kind of kernel) to its kernels with only its
    entry points global, and the objects link into one shared library with no undefined symbol."""
    assert sorted(NEON_EXPORTS) == sorted(p.name for p in CSRC.glob("arm_neon*.c"))
    assert [src for src, _, _ in library] == sorted(CSRC.glob("*.c"))
    objects = []
    nm = shutil.which("aarch64-linux-gnu-nm") or "nm"
    for src, obj, warnings in library:
        objects.append(str(obj))
        assert warnings == "", f"{src.name} compiles with warnings ({cross_cc[0]}):\n{warnings}"
        defined = subprocess.run([nm, "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout
        if src.name.startswith("x86_"):
            assert defined.strip() == "", f"{src.name} defines symbols on aarch64:\n{defined}"
        if src.name in NEON_EXPORTS:
            exported = set(re.findall(r" [A-Z] (\S+)$", defined, re.M))
            assert exported == NEON_EXPORTS[src.name], f"{src.name}'s global symbols:\n{defined}"
            assert re.search(r" t ", defined), f"{src.name} compiled to no kernels:\n{defined}"
    r = subprocess.run(
        [*cross_cc, "-shared", "-Wl,--no-undefined", *objects, "-o", str(tmp_path / "kernels.so"), "-lm", "-lpthread"],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, f"the aarch64 objects do not link into a library:\n{r.stderr}"


@pytest.mark.parametrize(
    "cpu, has_dotprod",
    [("cortex-a72", False), ("cortex-a76", True), ("max", True)],
)
def test_neon_kernels_match_generic_twins(qemu, checker, cpu, has_dotprod):
    r = subprocess.run([qemu, "-cpu", cpu, str(checker)], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    if r.returncode in (-signal.SIGILL, 128 + signal.SIGILL):
        pytest.fail(f"illegal instruction on {cpu}: a kernel the CPU lacks was run\n{out}")
    assert r.returncode == 0, f"checker failed on {cpu} (exit {r.returncode}):\n{out}"
    want = "yes" if has_dotprod else "no"
    assert f"dotprod: {want}\n" in r.stdout, f"{cpu} should report dotprod: {want}\n{out}"
    assert f"dispatch: isa 3, level {'dotprod' if has_dotprod else 'neon'}\n" in r.stdout, out
    assert re.search(r"^el_matmul: \d+ checks, 0 failures$", r.stdout, re.M), out
    levels = dict(re.findall(r"^level (\w+): \d+ checks, (\d+) failures$", r.stdout, re.M))
    assert levels == ({"neon": "0", "dotprod": "0"} if has_dotprod else {"neon": "0"}), out
    assert re.search(r"^RESULT OK \(\d+ checks, 0 failures\)$", r.stdout, re.M), out
