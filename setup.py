"""Builds the C kernels through cffi (API mode). Without a working C compiler the install still
succeeds: edgellm then runs on its numba kernels and says so once at import."""

import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self):
        try:
            super().run()
        except Exception as exc:  # no compiler, missing headers, ...
            self._warn(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._warn(exc)

    @staticmethod
    def _warn(exc):
        print(f"WARNING: edgellm's C kernels could not be built ({exc}); "
              "edgellm will run on its numba kernels instead.", file=sys.stderr)


setup(
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
    cmdclass={"build_ext": OptionalBuildExt},
)
