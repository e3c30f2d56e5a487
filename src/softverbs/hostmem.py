"""Raw process memory by address: pyverbs' ``mem_alloc`` and ``dma_util`` helpers.

pyverbs programs (rdma-core's tests among them) allocate buffers with
``posix_memalign`` or ``mmap`` and then hand the *address* to ``MR(...,
address=...)``, ``SGE(addr, ...)`` or a parent domain's allocator.  These
helpers do the same thing with the C library, through :mod:`ctypes`: the
memory is real, the address is the one the program gets, and softverbs'
devices reach it by that address (an MR registered on it covers exactly those
bytes).

Addresses are checked where a bad one would crash the interpreter rather
than fail: reads and writes by address go through
:func:`softverbs.device.memory.mapped`, and fail with EFAULT when the range is
not mapped.  ``mmap``/``munmap``/``madvise`` are the system calls themselves,
with their errors reported as pyverbs does (``MemoryError`` for a failed
mapping, ``PyverbsRDMAError`` with errno for madvise).

``dma_util``: a soft device has no DMA engine and no MMIO registers.  Its
"device" reads memory through the same Python objects the program writes,
under one lock, so the CPU and device views are always ordered and the
barriers have nothing to wait for.  ``mmio_write*_as_be`` store the value
big-endian at the address, which is what the C helpers do to a doorbell
register.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap as _mmap
import os
import sys
from typing import Any

from softverbs.errors import PyverbsRDMAError, PyverbsUserError

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]  # fmt: skip
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.restype = None
_libc.free.argtypes = [ctypes.c_void_p]
_libc.posix_memalign.restype = ctypes.c_int
_libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                 ctypes.c_size_t]  # fmt: skip

_MAP_FAILED = ctypes.c_void_p(-1).value

PROT_EXEC_ = _mmap.PROT_EXEC
PROT_READ_ = _mmap.PROT_READ
PROT_WRITE_ = _mmap.PROT_WRITE
PROT_NONE_ = 0
MAP_PRIVATE_ = _mmap.MAP_PRIVATE
MAP_SHARED_ = _mmap.MAP_SHARED
MAP_FIXED_ = 0x10
MAP_ANONYMOUS_ = _mmap.MAP_ANONYMOUS
MAP_STACK_ = getattr(_mmap, "MAP_STACK", 0x20000)
MAP_LOCKED_ = 0x2000
MAP_HUGETLB_ = 0x40000
MAP_POPULATE_ = getattr(_mmap, "MAP_POPULATE", 0x8000)
MAP_NORESERVE_ = 0x4000
MAP_GROWSDOWN_ = 0x100
MADV_DONTNEED_ = 4


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PyverbsUserError(f"{what} must be an int, got {type(value).__name__}")
    return value


def _checked(addr: Any, length: Any, what: str) -> tuple[int, int]:
    """``addr``/``length`` as ints, and EFAULT unless the range is mapped."""
    from softverbs.device.memory import mapped

    addr = _int(addr, "addr")
    length = _int(length, "length")
    if length < 0:
        raise PyverbsUserError(f"{what}: length {length} is negative")
    if length and (addr <= 0 or not mapped(addr, length)):
        raise PyverbsRDMAError(f"{what}: [{addr:#x}, +{length}) is not mapped in this process",
                               errno.EFAULT)  # fmt: skip
    return addr, length


# --- pyverbs.mem_alloc ----------------------------------------------------------------------
def mmap(
    addr: int = 0,
    length: int = 100,
    prot: int = PROT_READ_ | PROT_WRITE_,
    flags: int = MAP_PRIVATE_ | MAP_ANONYMOUS_,
    fd: int = 0,
    offset: int = 0,
) -> int:
    """``mmap(2)``: the address of the new mapping; MemoryError if it failed."""
    args = [_int(v, n) for v, n in ((addr, "addr"), (length, "length"), (prot, "prot"),
                                     (flags, "flags"), (fd, "fd"), (offset, "offset"))]  # fmt: skip
    ptr = _libc.mmap(*args)
    if ptr is None or ptr == _MAP_FAILED:
        raise MemoryError("Failed to mmap memory")
    return int(ptr)


def munmap(addr: int, length: int) -> None:
    """``munmap(2)``; MemoryError if it failed."""
    if _libc.munmap(_int(addr, "addr"), _int(length, "length")):
        raise MemoryError("Failed to munmap requested memory")


def madvise(addr: int, length: int, flags: int = MADV_DONTNEED_) -> None:
    """``madvise(2)`` (default MADV_DONTNEED: drop the pages, as ODP tests do)."""
    if _libc.madvise(_int(addr, "addr"), _int(length, "length"), _int(flags, "flags")):
        err = ctypes.get_errno()
        raise PyverbsRDMAError(f"Failed to madvise memory. Errno: {err}, {os.strerror(err)}",
                               err)  # fmt: skip


def malloc(size: int) -> int:
    ptr = _libc.malloc(_int(size, "size"))
    if not ptr:
        raise MemoryError("Failed to allocate memory")
    return int(ptr)


def posix_memalign(size: int, alignment: int = 8) -> int:
    """``posix_memalign(3)`` and a zero fill: the address of ``size`` bytes."""
    ptr = ctypes.c_void_p()
    ret = _libc.posix_memalign(ctypes.byref(ptr), _int(alignment, "alignment"),
                               _int(size, "size"))  # fmt: skip
    if ret or ptr.value is None:
        raise MemoryError(f"Failed to allocate memory ({os.strerror(ret) if ret else 'NULL'})")
    ctypes.memset(ptr.value, 0, size)
    return int(ptr.value)


def free(ptr: int) -> None:
    _libc.free(_int(ptr, "ptr"))


def _store(addr: int, offset: int, data: bytes, what: str) -> None:
    addr, _ = _checked(addr + offset, len(data), what)
    ctypes.memmove(addr, data, len(data))


def writebe32(addr: int, val: int, offset: int = 0) -> None:
    """Store ``val`` big-endian at ``addr`` + 4 * ``offset``."""
    _store(_int(addr, "addr"), 4 * _int(offset, "offset"),
           (_int(val, "val") & 0xFFFFFFFF).to_bytes(4, "big"), "writebe32")  # fmt: skip


def writebe64(addr: int, val: int, offset: int = 0) -> None:
    """Store ``val`` big-endian at ``addr`` + 8 * ``offset``."""
    _store(_int(addr, "addr"), 8 * _int(offset, "offset"),
           (_int(val, "val") & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big"), "writebe64")  # fmt: skip


def write(addr: int, data: str | bytes, length: int, offset: int = 0) -> None:
    """Copy ``length`` bytes of ``data`` to ``addr`` + ``offset``."""
    if not isinstance(data, (str, bytes, bytearray, memoryview)):
        raise PyverbsUserError(f"data must be str or bytes, got {type(data).__name__}")
    raw = data.encode() if isinstance(data, str) else bytes(data)
    length = _int(length, "length")
    if not 0 <= length <= len(raw):
        raise PyverbsUserError(f"length {length} is longer than the data ({len(raw)} bytes)")
    _store(_int(addr, "addr"), _int(offset, "offset"), raw[:length], "write")


def read(addr: int, length: int, offset: int = 0) -> bytes:
    """``length`` bytes at ``addr`` + ``offset``."""
    start, length = _checked(_int(addr, "addr") + _int(offset, "offset"), length, "read")
    return ctypes.string_at(start, length) if length else b""


def read32(addr: int, offset: int = 0) -> int:
    """The native 32-bit value at ``addr`` + 4 * ``offset``."""
    return int.from_bytes(read(addr, 4, 4 * _int(offset, "offset")), sys.byteorder)


def read64(addr: int, offset: int = 0) -> int:
    """The native 64-bit value at ``addr`` + 8 * ``offset``."""
    return int.from_bytes(read(addr, 8, 8 * _int(offset, "offset")), sys.byteorder)


# --- pyverbs.dma_util ------------------------------------------------------------------------
def udma_to_dev_barrier() -> None:
    """Order CPU stores before device reads: always the case here (see the module doc)."""


def udma_from_dev_barrier() -> None:
    """Order device writes before CPU loads: always the case here (see the module doc)."""


def mmio_write64_as_be(addr: int, val: int) -> None:
    writebe64(addr, val)


def mmio_write32_as_be(addr: int, val: int) -> None:
    writebe32(addr, val)
