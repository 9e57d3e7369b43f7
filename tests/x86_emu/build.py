"""Build of the emulated x86 kernel checker (check_x86.c): the whole library with EL_X86_EMULATED,
the x86 kernel files on SIMDe's portable intrinsics (this directory's immintrin.h comes first on
the include path), with the library's flags but -O0 (SIMDe's large headers take a minute of
optimizing at -O1; unoptimized, the checker still runs in seconds).

    python tests/x86_emu/build.py OUT      # then: OUT
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CSRC = ROOT / "csrc"
CC = "gcc"
SIMDE_HEADER = Path("/usr/include/simde/x86/avx512.h")  # Debian's libsimde-dev
_spec = importlib.util.spec_from_file_location("neon_build", HERE.parent / "neon" / "build.py")
neon_build = importlib.util.module_from_spec(_spec)  # the library's flags, compile_each
_spec.loader.exec_module(neon_build)


def compile_args() -> list[str]:
    """csrc/build_ffi.py's COMPILE_ARGS (read as tests/neon/build.py does), at -O0."""
    return [a for a in neon_build.compile_args() if not a.startswith("-O")] + ["-O0"]


def build(out: Path, cc: str = CC) -> Path:
    """The checker and every csrc/*.c, each compiled to an object beside `out` (side by side, one
    per core), linked into `out`; raises CalledProcessError on failure."""
    args = [*compile_args(), "-DEL_X86_EMULATED", f"-I{HERE}", f"-I{HERE.parent}", f"-I{CSRC}"]
    sources = [HERE / "check_x86.c", *sorted(CSRC.glob("*.c"))]
    objects = [out.parent / f"{out.name}-{src.stem}.o" for src in sources]
    neon_build.compile_each([[cc, *args, "-c", str(src), "-o", str(obj)] for src, obj in zip(sources, objects)], check=True)
    subprocess.run([cc, *(str(o) for o in objects), "-o", str(out), "-lm", "-pthread"],
                   check=True, capture_output=True, text=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build.py OUT")
    try:
        print(build(Path(sys.argv[1])))
    except subprocess.CalledProcessError as e:
        sys.exit(e.stderr)
