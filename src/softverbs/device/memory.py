"""Reaching an application's memory from the device service.

A NIC reaches registered memory by DMA, wherever it lives.  The device
service is another process, so it reaches a client's memory in one of two
ways, chosen per memory region:

* **A shared mapping.**  Memory that softverbs' Python driver allocates
  for ``MR(pd, length, access)`` lives in a memfd that the service maps
  too; the engine then moves bytes through ``memoryview`` slices, exactly
  as in-process.
* **The process's own address space.**  Any other memory -- a bytearray,
  an mmap, a numpy array, pyverbs' ``address=``, a C program's ``malloc``
  -- is reached through the descriptor of ``/proc/self/mem`` that the
  client opened and passed with ``HELLO``.  ``pread``/``pwrite`` on it from
  the service read and write the client's pages.  The kernel checked the
  right to open it when the *client* opened it, so this needs no ptrace
  permission and no root, and it reaches only that one process.

Measured on this 2-core VM (see docs/architecture.md): a 4 KiB ``pread``
from another process costs 0.7 µs (a memoryview slice copy: 0.36 µs), and
1 MiB reads run at about 9 GB/s, so the data path is not the bottleneck.

A :class:`ProcessSpan` is what the engine gets for such a region: ``len``,
slicing (another span, bounds-checked), slice assignment (a ``pwrite``) and
:meth:`ProcessSpan.read` (a ``pread`` into a fresh buffer).  Every span
comes from a memory key's bounds check, so the device never touches
anything outside a registered region.  If the process unmaps the pages or
dies mid-transfer, the access fails inside the kernel: a read returns
zeros, a write goes nowhere, and :attr:`ProcessMemory.faults` counts it --
the service never raises, and never touches another process.
"""

from __future__ import annotations

import contextlib
import os

from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_WRITE,
)

Buffer = bytes | bytearray | memoryview


#: the access flags that need writable pages (the kernel's ib_access_writable)
WRITABLE_ACCESS = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC
                   | IBV_ACCESS_MW_BIND)  # fmt: skip


def mapped(addr: int, length: int, pid: int | str = "self", writable: bool = False) -> bool:
    """Is ``[addr, addr + length)`` mapped in process ``pid`` (``/proc/PID/maps``),
    and writable there if ``writable``?

    Registration checks it, as the kernel's ``ib_umem_get`` fails with EFAULT
    on pages it cannot pin (for writing, if the access lets anything write).
    True when the map cannot be read: then there is no way to check here."""
    end = addr + length
    try:
        with open(f"/proc/{pid}/maps") as f:
            ranges = []
            for line in f:
                span, perms = line.split(None, 2)[:2]
                start, end_ = span.split("-")
                ranges.append((int(start, 16), int(end_, 16), perms[1] == "w"))
    except OSError:
        return True
    pos = addr
    for lo, hi, w in sorted(ranges):
        if lo <= pos < hi:
            if writable and not w:
                return False
            pos = hi
            if pos >= end:
                return True
    return pos >= end


class ProcessMemory:
    """One process's address space, through its ``/proc/<pid>/mem`` descriptor."""

    __slots__ = ("closed", "faults", "fd", "pid")

    def __init__(self, fd: int, pid: int = 0) -> None:
        self.fd = fd
        self.pid = pid
        self.faults = 0  #: accesses the kernel refused (unmapped pages, process gone)
        self.closed = False

    def read(self, addr: int, length: int) -> bytearray:
        buf = bytearray(length)
        done = 0
        if not self.closed:
            with contextlib.suppress(OSError):
                view = memoryview(buf)
                while done < length:
                    n = os.preadv(self.fd, [view[done:]], addr + done)
                    if n <= 0:
                        break
                    done += n
        if done < length:
            self.faults += 1
        return buf

    def write(self, addr: int, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        done = 0
        if not self.closed:
            with contextlib.suppress(OSError):
                while done < len(view):
                    n = os.pwrite(self.fd, view[done:], addr + done)
                    if n <= 0:
                        break
                    done += n
        if done < len(view):
            self.faults += 1

    def span(self, addr: int, length: int) -> ProcessSpan:
        return ProcessSpan(self, addr, length)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                os.close(self.fd)


class ProcessSpan:
    """``length`` bytes at ``addr`` of a process (see the module docstring)."""

    __slots__ = ("addr", "length", "mem")

    def __init__(self, mem: ProcessMemory, addr: int, length: int) -> None:
        self.mem = mem
        self.addr = addr
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: slice) -> ProcessSpan:
        start, stop, step = index.indices(self.length)
        if step != 1:
            raise ValueError("a memory span is sliced with step 1")
        return ProcessSpan(self.mem, self.addr + start, max(0, stop - start))

    def __setitem__(self, index: slice, data: Buffer) -> None:
        start, stop, step = index.indices(self.length)
        if step != 1 or len(data) != max(0, stop - start):
            # as a memoryview: slice assignment never changes the length
            raise ValueError("memory span assignment: wrong length")
        self.mem.write(self.addr + start, data)

    def read(self) -> memoryview:
        """The bytes as they are now (a copy)."""
        return memoryview(self.mem.read(self.addr, self.length))

    def __repr__(self) -> str:
        return f"<ProcessSpan pid={self.mem.pid} [{self.addr:#x}, +{self.length})>"
