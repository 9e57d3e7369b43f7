"""Cross-build of the NEON kernel checker (test_neon.c) for aarch64, linked statically so that
qemu-aarch64 runs it without an aarch64 sysroot.

The csrc files are compiled with the library's own flags (csrc/build_ffi.py's COMPILE_ARGS),
so the checker tests the code as the package builds it.

    python tests/neon/build.py OUT      # then: qemu-aarch64 -cpu max OUT
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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


def _cmd(cc: str | list[str]) -> list[str]:
    return [cc] if isinstance(cc, str) else list(cc)


def compile_each(commands: list[list[str]], check: bool = False) -> list[subprocess.CompletedProcess]:
    """Run compiler commands side by side, one per core (the longest, x86_avx2.c's, is half of a
    serial build), the results in the commands' order; check: raise CalledProcessError on a failure."""
    with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        return list(pool.map(lambda cmd: subprocess.run(cmd, check=check, capture_output=True, text=True), commands))


def compile_library(out_dir: Path, cc: str | list[str] = CC) -> list[tuple[Path, Path, str]]:
    """Every csrc/*.c compiled to out_dir with the package's flags (and -fPIC, as a shared library
    needs): (source, object, the compiler's stderr) for each; raises CalledProcessError on failure."""
    sources = sorted(CSRC.glob("*.c"))
    objects = [out_dir / (src.stem + ".o") for src in sources]
    runs = compile_each([[*_cmd(cc), *compile_args(), "-fPIC", f"-I{CSRC}", "-c", str(src), "-o", str(obj)]
                         for src, obj in zip(sources, objects)], check=True)
    return [(src, obj, r.stderr) for src, obj, r in zip(sources, objects, runs)]


def link_checker(out: Path, objects: list[Path], cc: str | list[str] = CC) -> Path:
    """The checker (test_neon.c) statically linked with the library's objects into `out`."""
    cmd = [*_cmd(cc), *compile_args(), "-static", f"-I{CSRC}", f"-I{HERE.parent}", str(HERE / "test_neon.c"),
           *(str(o) for o in objects), "-o", str(out), "-lm", "-pthread"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def build(out: Path, cc: str | list[str] = CC) -> Path:
    """Compile and statically link the checker into `out` with `cc` (a command or a command and
    its target options); raises CalledProcessError on failure."""
    objects = compile_library(out.parent, cc)
    return link_checker(out, [o for _, o, _ in objects], cc)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build.py OUT")
    try:
        print(build(Path(sys.argv[1])))
    except subprocess.CalledProcessError as e:
        sys.exit(e.stderr)
