"""Build of the emulated x86 kernel checker (check_x86.c): the whole library with EL_X86_EMULATED,
the x86 kernel files on SIMDe's portable intrinsics (this directory's immintrin.h comes first on
the include path), with the library's flags but -O0 (SIMDe's large headers take a minute of
optimizing at -O1; unoptimized, the checker still runs in seconds).

    python tests/x86_emu/build.py OUT      # then: OUT
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CSRC = ROOT / "csrc"
CC = "gcc"
SIMDE_HEADER = Path("/usr/include/simde/x86/avx512.h")  # Debian's libsimde-dev


def compile_args() -> list[str]:
    """csrc/build_ffi.py's COMPILE_ARGS (read as tests/neon/build.py does), at -O0."""
    sys.path.insert(0, str(HERE.parent / "neon"))
    from build import compile_args as library_args  # tests/neon/build.py

    return [a for a in library_args() if not a.startswith("-O")] + ["-O0"]


def build(out: Path, cc: str = CC) -> Path:
    cmd = [cc, *compile_args(), "-DEL_X86_EMULATED", f"-I{HERE}", f"-I{CSRC}", str(HERE / "check_x86.c"),
           *(str(p) for p in sorted(CSRC.glob("*.c"))), "-o", str(out), "-lm", "-pthread"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build.py OUT")
    try:
        print(build(Path(sys.argv[1])))
    except subprocess.CalledProcessError as e:
        sys.exit(e.stderr)
