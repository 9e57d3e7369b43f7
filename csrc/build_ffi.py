"""cffi (API mode) builder for edgellm._kernels: every csrc/*.c file, declarations from csrc/api/*.h.

Run by setup.py at install time; `python csrc/build_ffi.py` builds in place for development.
"""

import glob
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))


def _cdef() -> str:
    parts = []
    for path in sorted(glob.glob(os.path.join(HERE, "api", "*.h"))):
        with open(path) as f:
            parts.append(f.read())
    return "\n".join(parts)


def _sources() -> list[str]:
    # relative to the project root, where setup.py (and the dev build below) run
    return sorted(os.path.join("csrc", os.path.basename(p)) for p in glob.glob(os.path.join(HERE, "*.c")))


def _compile_args() -> list[str]:
    args = ["-O3", "-std=gnu11", "-fno-strict-aliasing", "-Wall", "-Wno-unused-function"]
    # No -march=native: one build runs on any CPU of its architecture; ISA-specific files raise
    # their own target with pragmas / attributes and are chosen at run time (kernels/dispatch).
    return args


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "edgellm._kernels",
    "#include \"common.h\"\n" + "\n".join(
        f'#include "api/{os.path.basename(p)}"' for p in sorted(glob.glob(os.path.join(HERE, "api", "*.h")))),
    sources=_sources(),
    include_dirs=[HERE],
    extra_compile_args=_compile_args(),
    libraries=["m", "pthread"],
)

if __name__ == "__main__":
    # development build: writes src/edgellm/_kernels*.so
    os.chdir(os.path.join(HERE, ".."))
    so = ffibuilder.compile(tmpdir="build/ffi", verbose=False)
    import shutil
    shutil.copy(so, os.path.join("src", "edgellm", os.path.basename(so)))
    print("built", os.path.join("src", "edgellm", os.path.basename(so)))
