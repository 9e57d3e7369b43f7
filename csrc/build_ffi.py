"""cffi (API mode) builder for edgellm._kernels: every csrc/*.c file, declarations from csrc/api/*.h.

Run by setup.py at install time; `python csrc/build_ffi.py` builds in place for development.
"""

import glob
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import setuptools  # noqa: F401  (first, so that distutils below is setuptools' own, as cffi uses)
from cffi import FFI
from distutils.ccompiler import CCompiler

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _headers() -> list[str]:
    return sorted(glob.glob(os.path.join(HERE, "api", "*.h")))


def _cdef() -> str:
    parts = []
    for path in _headers():
        with open(path) as f:
            parts.append(f.read())
    return "\n".join(parts)


def _depends() -> list[str]:
    """Every header the sources include: a build whose .so is newer than all sources is skipped
    by build_ext unless a header it depends on changed too."""
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(HERE, "*.h")) + _headers())


def _sources() -> list[str]:
    # relative to the project root, where setup.py runs
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(HERE, "*.c")))


# No -march=native: one build runs on any CPU of its architecture; ISA-specific files raise
# their own target with pragmas / attributes and are chosen at run time.
# -g0 overrides the -g of Python's own CFLAGS: no debug info, a 20% faster build (what a
# Raspberry Pi user waits for at `pip install .`) and a smaller library.
COMPILE_ARGS = ["-O3", "-g0", "-std=gnu11", "-fno-strict-aliasing", "-ffp-contract=off", "-Wall",
                "-Wno-unused-function"]


def _jobs() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, int(os.environ.get("EDGELLM_BUILD_JOBS", n or 1)))


def _compile_in_parallel(self, sources, output_dir=None, macros=None, include_dirs=None, debug=False,
                         extra_preargs=None, extra_postargs=None, depends=None):
    """CCompiler.compile with the sources compiled side by side, one per core (EDGELLM_BUILD_JOBS),
    the largest first: distutils compiles one extension's files one after another, and x86_avx2.c
    alone is half of a 40 s build. Same commands, same objects, in the same order."""
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)
    todo = sorted(build, key=lambda obj: -os.path.getsize(build[obj][0]))
    with ThreadPoolExecutor(min(_jobs(), max(1, len(todo)))) as pool:
        for done in [pool.submit(self._compile, obj, *build[obj], cc_args, extra_postargs, pp_opts) for obj in todo]:
            done.result()
    return objects


# this file runs only in builds (setup.py loads it through cffi_modules; the development build below)
if all(hasattr(CCompiler, m) for m in ("_setup_compile", "_get_cc_args", "_compile")):
    CCompiler.compile = _compile_in_parallel


def make_builder(absolute: bool = False) -> FFI:
    ffi = FFI()
    ffi.cdef(_cdef())
    sources, depends = _sources(), _depends()
    if absolute:
        sources = [os.path.join(ROOT, s) for s in sources]
        depends = [os.path.join(ROOT, s) for s in depends]
    ffi.set_source(
        "edgellm._kernels",
        '#include "common.h"\n' + "\n".join(f'#include "api/{os.path.basename(p)}"' for p in _headers()),
        sources=sources,
        include_dirs=[HERE],
        depends=depends,
        extra_compile_args=COMPILE_ARGS,
        libraries=["m", "pthread"],
    )
    return ffi


ffibuilder = make_builder()

if __name__ == "__main__":
    # development build: writes src/edgellm/_kernels*.so
    so = make_builder(absolute=True).compile(tmpdir=os.path.join(ROOT, "build", "ffi"), verbose=False)
    dest = os.path.join(ROOT, "src", "edgellm", os.path.basename(so))
    shutil.copy(so, dest + ".tmp")
    os.replace(dest + ".tmp", dest)  # a new file: processes that mapped the old one keep it
    print("built", os.path.relpath(dest, ROOT))
