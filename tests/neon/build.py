"""Cross-build of the NEON kernel checker (test_neon.c) for aarch64, linked statically so that
qemu-aarch64 runs it without an aarch64 sysroot.

The csrc files are compiled with the library's own flags (csrc/build_ffi.py's COMPILE_ARGS),
so the checker tests the code as the package builds it.

    python tests/neon/build.py OUT      # then: qemu-aarch64 -cpu max OUT
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CSRC = ROOT / "csrc"
CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"


def compile_args() -> list[str]:
    """COMPILE_ARGS of csrc/build_ffi.py, read without importing it (importing builds a cffi FFI)."""
    tree = ast.parse((CSRC / "build_ffi.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "COMPILE_ARGS" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise RuntimeError("COMPILE_ARGS not found in csrc/build_ffi.py")


# the compilers the checker is built with: GCC's cross compiler, and clang targeting the same
# Debian cross sysroot (headers and libraries of libc6-dev-arm64-cross)
COMPILERS = {"gcc": [CC], "clang": ["clang", "--target=aarch64-linux-gnu"]}


def build(out: Path, cc: str | list[str] = CC) -> Path:
    """Compile and statically link the checker into `out` with `cc` (a command or a command and
    its target options); raises CalledProcessError on failure."""
    cmd = [
        *([cc] if isinstance(cc, str) else cc), *compile_args(), "-static", f"-I{CSRC}",
        str(HERE / "test_neon.c"), *(str(p) for p in sorted(CSRC.glob("*.c"))),  # the whole library
        "-o", str(out), "-lm", "-pthread",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build.py OUT")
    try:
        print(build(Path(sys.argv[1])))
    except subprocess.CalledProcessError as e:
        sys.exit(e.stderr)
