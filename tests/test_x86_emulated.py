"""The x86 kernels this CPU may lack (AVX-VNNI in csrc/x86_avx2.c, AVX-512 VNNI in
csrc/x86_avx512.c), run on SIMDe's portable implementations of the intrinsics: the library built
with EL_X86_EMULATED and tests/x86_emu/immintrin.h, checked by tests/x86_emu/check_x86.c against
the generic twins (vec_dot and the small-batch kernels bit for bit on quantized weights and on
random block bytes, gemm tiles equal to vec_dot, activation quantizers' bytes). On a CPU with the
features, tests/test_kernels_isa.py checks the same kernels natively.

Needs gcc on x86-64 and Debian's libsimde-dev (header-only); skipped, saying so, without them.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _load_build():
    spec = importlib.util.spec_from_file_location("x86_emu_build", HERE / "x86_emu" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build = _load_build()


def test_emulated_x86_kernels_match_generic_twins(tmp_path):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    if shutil.which(build.CC) is None:
        pytest.skip(f"{build.CC} not installed")
    if not build.SIMDE_HEADER.exists():
        pytest.skip(f"{build.SIMDE_HEADER} missing (Debian package libsimde-dev)")
    try:
        checker = build.build(tmp_path / "check_x86")
    except subprocess.CalledProcessError as e:
        pytest.fail(f"build of the emulated x86 checker failed:\n{e.stderr}")
    r = subprocess.run([str(checker)], capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    levels = dict(re.findall(r"^level (\w+): \d+ checks, (\d+) failures$", r.stdout, re.M))
    assert levels == {"avxvnni": "0", "avx512": "0"}, out
    assert re.search(r"^RESULT OK \(\d+ checks, 0 failures\)$", r.stdout, re.M), out
