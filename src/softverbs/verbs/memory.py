"""Real process memory for memory regions.

An MR covers real memory: its ``buf`` is the buffer's address in this
process, SGEs carry addresses, and the engine moves data through
``memoryview`` slices of that memory.  Three ways to get it:

* :func:`allocate` -- fresh, zeroed, page-aligned anonymous memory (what
  pyverbs' ``MR(pd, length, access)`` does with posix_memalign);
* :func:`from_buffer` -- any writable buffer-protocol object (bytearray,
  mmap, numpy array): the region is that object's memory, pinned while
  registered;
* :func:`from_address` -- memory the caller already owns, by address, as
  ``ibv_reg_mr(addr, ...)``.  The range is checked against the process's
  memory map first, so a bad address is EFAULT, not a crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
from typing import Any

from softverbs.device.memory import WRITABLE_ACCESS, mapped
from softverbs.errors import PyverbsRDMAError, einval


class Memory:
    """A registered range: its address, a byte view, and what keeps it alive.

    ``region``/``offset``: where the bytes lie in a shared file (a memfd the
    device service can map), when they do."""

    __slots__ = ("addr", "keepalive", "offset", "region", "view")

    def __init__(self, view: memoryview, addr: int, keepalive: object, region: Any = None,
                 offset: int = 0) -> None:  # fmt: skip
        self.view = view
        self.addr = addr
        self.keepalive = keepalive
        self.region = region
        self.offset = offset

    def release(self) -> None:
        """Drop the view; close the mapping if we allocated it."""
        self.view.release()
        if isinstance(self.keepalive, mmap.mmap):
            # A view handed out to the application may still be alive.
            with contextlib.suppress(BufferError):
                self.keepalive.close()


def address_of(view: memoryview) -> int:
    """The address of a writable buffer's first byte."""
    if view.readonly:
        raise einval("cannot register a read-only buffer; pass a writable one (bytearray, mmap)")
    if len(view) == 0:
        return 0
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def allocate(length: int) -> Memory:
    if length < 0:
        raise einval(f"MR length {length} is negative")
    mm = mmap.mmap(-1, max(length, 1))
    view = memoryview(mm)[:length]
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    return Memory(view, addr, mm)


def from_buffer(buf: object) -> Memory:
    try:
        view = memoryview(buf)  # type: ignore[arg-type]
    except TypeError:
        raise einval(f"{type(buf).__name__} does not support the buffer protocol") from None
    if not view.c_contiguous:
        raise einval("the buffer must be C-contiguous")
    view = view.cast("B")
    return Memory(view, address_of(view), buf)


def from_address(addr: int, length: int, access: int = 0) -> Memory:
    """``length`` bytes at ``addr``: EFAULT unless they are mapped, and writable
    if ``access`` lets anything write them (as the kernel pins them)."""
    if addr <= 0 or length < 0:
        raise einval(f"invalid address {addr:#x} / length {length}")
    writable = bool(access & WRITABLE_ACCESS)
    if not mapped(addr, length, writable=writable):
        what = "mapped writable" if writable else "mapped"
        raise PyverbsRDMAError(
            f"Failed to register memory: [{addr:#x}, +{length}) is not {what} in this process",
            errno.EFAULT,
        )
    arr = (ctypes.c_char * length).from_address(addr)
    return Memory(memoryview(arr).cast("B"), addr, arr)


class SelfMemory:
    """This process's address space, as the device reaches it in-process: for
    implicit ODP keys, and registrations by address (a
    :class:`softverbs.device.memory.AddressSpace`)."""

    pid = 0  #: the device's own process: no other process's mappings to check

    def span(self, addr: int, length: int, pinned: bool = False) -> memoryview | str:
        """The bytes at ``addr``; ``pinned`` asks nothing more here: the caller
        holds its own pages."""
        return implicit_resolver(addr, length)

    def close(self) -> None:
        """Nothing to release."""


def implicit_resolver(addr: int, length: int) -> memoryview | str:
    """The bytes ``[addr, addr+length)`` of this process, for an implicit ODP
    key, or why they cannot be reached (not mapped: the page fault fails)."""
    if length == 0:
        return memoryview(b"")
    if addr <= 0 or length < 0 or not mapped(addr, length):
        return f"[{addr:#x}, +{length}) is not mapped in this process"
    return memoryview((ctypes.c_char * length).from_address(addr)).cast("B")


def touch(addr: int, length: int) -> None:
    """Fault in every page of ``[addr, addr+length)`` (EFAULT if not mapped)."""
    if length <= 0:
        return
    if not mapped(addr, length):
        raise PyverbsRDMAError(
            f"Failed to advise MR: [{addr:#x}, +{length}) is not mapped in this process",
            errno.EFAULT,
        )
    page = mmap.PAGESIZE
    for pos in range(addr - addr % page, addr + length, page):
        ctypes.string_at(max(pos, addr), 1)


# --- device memory (ibv_alloc_dm): the pool a provider keeps per device ------------------

#: Bytes of device memory each softverbs device has.
MAX_DM_SIZE = 256 * 1024

#: Device memory is accessed in 32-bit words.
DM_WORD = 4


class DmPool:
    """The device memory of one device: a byte array and its allocations."""

    def __init__(self, size: int = MAX_DM_SIZE, region: Any = None) -> None:
        self.size = size
        #: the bytes: this process's, or a shared file the device service maps (``region``)
        self.region = region
        self.memory: bytearray | memoryview = region.view[:size] if region is not None \
            else bytearray(size)  # fmt: skip
        self._used: dict[int, int] = {}  #: start -> length

    def alloc(self, length: int, log_align: int) -> int | None:
        """The start of ``length`` free bytes aligned to ``2**log_align``, or None."""
        align = 1 << max(log_align, 2)  # every allocation is at least word aligned
        pos = 0
        for start in sorted(self._used):
            pos = -(-pos // align) * align
            if pos + length <= start:
                break
            pos = max(pos, start + self._used[start])
        pos = -(-pos // align) * align
        if pos + length > self.size:
            return None
        self._used[pos] = length
        self.memory[pos : pos + length] = bytes(length)
        return pos

    def free(self, start: int) -> None:
        self._used.pop(start, None)

    def view(self, start: int, length: int) -> memoryview:
        return memoryview(self.memory)[start : start + length]
