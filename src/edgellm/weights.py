"""Where the C engine reads weights from: the file's memory map (zero copy, the default after
load), or - once the first context is made, on Linux with transparent huge pages - one copy of
the data section in 2 MB pages.

Why: decode streams every weight once per token, and with 4 KB pages of a file mapping every
page is a TLB miss; in huge pages the same Q8_0 matvec runs at the plain read loop's speed
(30.2 -> 34 GB/s single-threaded on this machine). The copy replaces the mapping rather than
adding to it: each chunk's file pages are dropped from the process (madvise DONTNEED; they stay
in the page cache) as soon as it is copied, so resident memory stays at about the file size.
EDGELLM_HUGEPAGES=0 turns it off (the engine then reads the file's own pages), and with it the
KV cache's move of its full slabs into huge pages (csrc/kv.c, el_kv_settle).

mlock=True (llama.cpp's --mlock) pins whichever copy the engine reads in RAM, so the kernel never
pages the weights out under memory pressure: the file's pages at load, the huge-page copy once it
is made (the file's pages are unlocked first, so they can still be dropped as they are copied).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys

import numpy as np

from .errors import MemoryLockError

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


def huge_pages_wanted() -> bool:
    """Whether the engine's memory (the weights' copy, the KV cache's full slabs) goes into 2 MB
    pages: the platform has transparent huge pages and EDGELLM_HUGEPAGES is not 0."""
    return os.environ.get("EDGELLM_HUGEPAGES", "1") != "0" and _thp_available()


def mem_available() -> int:
    """Bytes of memory the kernel says are available (0: unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _memlock_limit() -> str:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ImportError, AttributeError, ValueError, OSError):
        return "unknown"
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB"


def _page_span(arr: np.ndarray) -> tuple[int, int]:
    """(address, length) of the whole pages that hold arr."""
    page = mmap.PAGESIZE
    addr = arr.ctypes.data
    lo = addr // page * page
    return lo, (addr + arr.nbytes + page - 1) // page * page - lo


def _memlock(arr: np.ndarray, lock: bool) -> None:
    """mlock / munlock the pages of arr (libc's, through ctypes: Python has no binding)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.mlock if lock else libc.munlock
    except (OSError, AttributeError, TypeError):
        raise MemoryLockError(f"mlock is not available on this platform ({sys.platform})") from None
    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_size_t), ctypes.c_int
    addr, n = _page_span(arr)
    if fn(addr, n) == 0 or not lock:
        return
    err = ctypes.get_errno()
    if err in (errno.ENOMEM, errno.EPERM, errno.EAGAIN):
        raise MemoryLockError(
            f"mlock: cannot lock the {n / 2**20:.1f} MiB of weights in RAM ({os.strerror(err)}); the "
            f"locked-memory limit (RLIMIT_MEMLOCK, `ulimit -l`) is {_memlock_limit()}: raise it (e.g. "
            "`ulimit -l unlimited`, or memlock in /etc/security/limits.conf) or load without mlock")
    raise MemoryLockError(f"mlock of {n} bytes of weights failed: {os.strerror(err)}")


class WeightStore:
    """Tensor bytes for the engine, from the mapping or from the huge-page copy; with mlock=True
    the bytes in use are locked in RAM."""

    def __init__(self, gguf, *, mlock: bool = False):
        self.gguf = gguf
        self._copy: np.ndarray | None = None  # the data section, when moved
        self._base = 0                        # file offset of _copy[0]
        self._tried = False
        self._locked: np.ndarray | None = None  # the bytes mlock holds in RAM
        span = self._data_span()
        if mlock and span is not None:
            data = self.gguf._u8[span[0]:span[1]]
            _memlock(data, True)
            self._locked = data

    @property
    def in_huge_pages(self) -> bool:
        return self._copy is not None

    @property
    def locked_bytes(self) -> int:
        """Bytes of weights mlock holds in RAM (0 without mlock)."""
        return 0 if self._locked is None else self._locked.nbytes

    def _data_span(self) -> tuple[int, int] | None:
        """(start, end) file offsets of the tensor data, None for a file without tensors."""
        tensors = list(self.gguf.tensors.values())
        if not tensors:
            return None
        return min(t.offset for t in tensors), max(t.offset + t.nbytes for t in tensors)

    def data_bytes(self) -> np.ndarray:
        """Every tensor's bytes as one array, where the engine reads them (the huge-page copy or
        the mapping); empty for a file without tensors."""
        if self._copy is not None:
            return self._copy
        span = self._data_span()
        return self.gguf._u8[span[0]:span[1]] if span else self.gguf._u8[:0]

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
        if not huge_pages_wanted():
            return False
        span = self._data_span()
        if span is None:
            return False
        start, end = span
        size = end - start
        if size * 2 > mem_available():
            return False  # leave a big model to the page cache, which the kernel can reclaim
        try:
            anon = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            anon.madvise(mmap.MADV_HUGEPAGE)
        except (OSError, ValueError):
            return False
        raw = np.frombuffer(anon, dtype=np.uint8)
        skip = (-raw.ctypes.data) % HUGE
        dst = raw[skip:skip + size]
        mlock = self._locked is not None
        if mlock:  # locked pages cannot be dropped: unlock the file's now, lock the copy's below
            _memlock(self._locked, False)
            self._locked = None
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
        if mlock:
            _memlock(dst, True)
            self._locked = dst
        return True

