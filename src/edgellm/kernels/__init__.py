"""Kernels: the only package that knows about ISAs (C through cffi, or numba without a compiler)."""
