"""Where the C engine reads weights from: the file's memory map (zero copy, the default after
load), or - once the first context is made, on Linux with transparent huge pages - one copy of
the data section in 2 MB pages.

Why: decode streams every weight once per token, and with 4 KB pages of a file mapping every
page is a TLB miss; in huge pages the same Q8_0 matvec runs at the plain read loop's speed
(30.2 -> 34 GB/s single-threaded on this machine). The copy replaces the mapping rather than
adding to it: each chunk's file pages are dropped from the process (madvise DONTNEED; they stay
in the page cache) as soon as it is copied, so resident memory stays at about the file size.
EDGELLM_HUGEPAGES=0 turns it off.
"""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np

HUGE = 2 << 20
CHUNK = 4 << 20  # file pages resident at once while copying (peak RSS)


def _thp_available() -> bool:
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class WeightStore:
    """Tensor bytes for the engine, from the mapping or from the huge-page copy."""

    def __init__(self, gguf):
        self.gguf = gguf
        self._copy: np.ndarray | None = None  # the data section, when moved
        self._base = 0                        # file offset of _copy[0]
        self._tried = False

    @property
    def in_huge_pages(self) -> bool:
        return self._copy is not None

    def tensor_bytes(self, name: str) -> np.ndarray:
        if self._copy is None:
            return self.gguf.tensor_bytes(name)
        t = self.gguf.tensors[name]
        start = t.offset - self._base
        return self._copy[start:start + t.nbytes].reshape(t.rows, t.row_bytes)

    def move_to_huge_pages(self) -> bool:
        """Copy the tensor data into huge pages once (where the platform allows). True if done."""
        if self._tried:
            return self._copy is not None
        self._tried = True
        if os.environ.get("EDGELLM_HUGEPAGES", "1") == "0" or not _thp_available():
            return False
        tensors = list(self.gguf.tensors.values())
        if not tensors:
            return False
        start = min(t.offset for t in tensors)
        end = max(t.offset + t.nbytes for t in tensors)
        size = end - start
        if size * 2 > _mem_available():
            return False  # leave a big model to the page cache, which the kernel can reclaim
        try:
            anon = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            anon.madvise(mmap.MADV_HUGEPAGE)
        except (OSError, ValueError):
            return False
        raw = np.frombuffer(anon, dtype=np.uint8)
        skip = (-raw.ctypes.data) % HUGE
        dst = raw[skip:skip + size]
        src = self.gguf._u8
        mm = self.gguf._mm
        page = mmap.PAGESIZE
        for o in range(0, size, CHUNK):
            n = min(CHUNK, size - o)
            dst[o:o + n] = src[start + o:start + o + n]
            lo = (start + o + page - 1) // page * page  # whole pages inside what was copied
            hi = (start + o + n) // page * page
            if hi > lo:
                mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        dst.flags.writeable = False
        self._copy, self._base = dst, start
        self._anon = anon  # keeps the mapping alive with the arrays
        return True

    def lock(self) -> str | None:
        """Pin the weights the engine reads in RAM (mlock, as llama.cpp's --mlock), so the kernel
        never pages them out; None when done, else why not (the caller warns and goes on)."""
        import ctypes
        import ctypes.util

        arr = self._copy if self._copy is not None else self.gguf._u8
        name = ctypes.util.find_library("c")
        if not name or arr is None or not arr.nbytes:
            return "mlock is not available here"
        libc = ctypes.CDLL(name, use_errno=True)
        page = mmap.PAGESIZE
        lo = arr.ctypes.data // page * page
        n = arr.ctypes.data + arr.nbytes - lo
        if libc.mlock(ctypes.c_void_p(lo), ctypes.c_size_t(n)) != 0:
            err = ctypes.get_errno()
            return (f"mlock of {n / 2**20:.0f} MiB failed ({os.strerror(err)}); raise the locked-memory limit "
                    f"(ulimit -l) to pin the model in RAM")
        self.locked = n
        return None
