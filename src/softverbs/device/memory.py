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
  permission and no root, and it reaches only that one process.  Copies of
  :data:`VM_COPY` bytes and more go around the descriptor, through
  ``process_vm_readv``/``process_vm_writev`` (one copy in the kernel where
  the descriptor makes two), wherever the service may ptrace the process:
  :meth:`ProcessMemory._vm_copy`, and docs/architecture.md, *Copies that
  bypass the descriptor*, for the right, the pid and the order.

Measured on this 2-core VM (see docs/architecture.md): a 4 KiB ``pread``
from another process costs 0.7 µs (a memoryview slice copy: 0.36 µs), and a
1 MiB read 130 µs into pages already mapped -- but 650 µs into fresh ones, so
large reads go into buffers that stay mapped (:class:`ReadBuffers`).

A :class:`ProcessSpan` is what the engine gets for such a region: ``len``,
slicing (another span, bounds-checked), slice assignment (a ``pwrite``) and
:meth:`ProcessSpan.read` (a ``pread``: into new bytes, or from 16 KiB on into
a reused buffer, a read-only view either way).  A key check makes one call
of it per access: :meth:`ProcessSpan.fetch` (the mapping check, then the
read, with no span made for the part) or :meth:`ProcessSpan.part` (the
check, then the part as a span to store into).  Every span
comes from a memory key's bounds check, so the device never touches
anything outside a registered region.  If the process unmaps the pages or
dies mid-transfer, the access fails inside the kernel: a read returns
zeros, a write goes nowhere, and :attr:`ProcessMemory.faults` counts it --
the service never raises, and never touches another process.

:class:`AddressSpace` is what the device asks of a process's memory reached by
address (a registration without a mapping, an implicit ODP key): this module's
:class:`ProcessMemory` for a client of the service, ``verbs.memory.SelfMemory``
for the device's own process.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import struct
import threading
from typing import Any, Protocol

from softverbs.engine import memory as engine_memory
from softverbs.engine.memory import Bytes
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_WRITE,
)

Buffer = bytes | bytearray | memoryview

#: The system calls of the copies, each read from ``os`` once: compiled, a module
#: global is a cached lookup, where ``os.pread`` is an attribute lookup on the module
#: per copy.  Tests replace these names here to see the calls the copies make.
_pread = os.pread
_preadv = os.preadv
_pwrite = os.pwrite
_pwritev = os.pwritev
#: the mapping checks' PROCMAP_QUERY (:meth:`ProcessMemory._query_at`), likewise
_ioctl = fcntl.ioctl


#: three ``struct iovec`` (base, length): the local buffer, then up to two remote pieces
_IOVECS = struct.Struct("=6Q")


class _Scratch(threading.local):
    """A thread's ``Py_buffer`` and iovecs for :meth:`ProcessMemory._vm_copy`, made once
    (the call releases the GIL: two threads never share them)."""

    def __init__(self) -> None:
        self.pybuf = _PyBuffer()
        self.where = ctypes.addressof(self.pybuf)
        self.iov = (ctypes.c_uint64 * 6)()
        self.at = ctypes.addressof(self.iov)


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (the stable buffer protocol's struct): how a copy finds
    the address of the bytes it is given, read-only ones included, through
    ``PyObject_GetBuffer`` -- ``ctypes.c_char.from_buffer`` takes writable ones only."""

    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_void_p), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]  # fmt: skip


def _vm_calls() -> tuple[Any, Any, Any, Any]:
    """libc's ``process_vm_readv`` and ``process_vm_writev`` and the interpreter's
    ``PyObject_GetBuffer`` and ``PyBuffer_Release``, through ``ctypes`` (the same
    calls compiled and interpreted); Nones where they cannot be found (then every
    copy goes through the descriptor)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        readv, writev = libc.process_vm_readv, libc.process_vm_writev
        get, release = ctypes.pythonapi.PyObject_GetBuffer, ctypes.pythonapi.PyBuffer_Release
    except (OSError, AttributeError):
        return None, None, None, None
    for call in (readv, writev):
        call.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                         ctypes.c_ulong, ctypes.c_ulong]  # fmt: skip
        call.restype = ctypes.c_ssize_t
    get.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
    get.restype = ctypes.c_int
    release.argtypes = [ctypes.c_void_p]
    release.restype = None
    return readv, writev, get, release


#: The system calls of the copies that bypass the descriptor (:meth:`ProcessMemory._vm_copy`);
#: None where there are none.  Tests replace these names too.
_process_vm_readv, _process_vm_writev, _get_buffer, _release_buffer = _vm_calls()
_SCRATCH = _Scratch()
#: ``signal.pidfd_send_signal``: signal 0 through the client's pidfd asks whether its
#: pid still names it (:meth:`ProcessMemory._vm_copy`)
_pidfd_send_signal: Any = getattr(signal, "pidfd_send_signal", None)
#: what ``process_vm_*`` answer when they can never work on a process: no right to
#: ptrace it (EPERM; EACCES from an LSM), it is gone or its leader has exited
#: (ESRCH), a kernel or seccomp filter without them (ENOSYS)
_VM_REFUSED = (errno.EPERM, errno.EACCES, errno.ESRCH, errno.ENOSYS)
#: Copies of at least this many bytes go through ``process_vm_readv`` /
#: ``process_vm_writev`` where the service may use them on the client: below it
#: the two checks and the ``ctypes`` call (about 2 µs) cost more than the kernel
#: saves (docs/performance.md, *Copies that bypass the descriptor*).
VM_COPY = 128 << 10
_VM_COPY = VM_COPY  # the same as a C integer (memory.pxd)


_FENCE = threading.Lock()


def full_fence() -> None:
    """A full memory barrier: every store before it is visible to other processes
    before any load after it, as shared rings need where each side stores one word
    and then loads the other's (a CQ's arm: docs/rings.md, *Arming*).  Python has no
    fence of its own; an uncontended lock's acquire is a locked read-modify-write
    (glibc's ``sem_wait`` fast path: ``lock cmpxchg`` on x86-64), which is one.
    About 65 ns."""
    _FENCE.acquire()
    _FENCE.release()


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


#: ``struct procmap_query`` (Linux 6.11+, ``<linux/fs.h>``): 9 u64, 4 u32, 2 u64
_PROCMAP_QUERY_FMT = struct.Struct("<9Q4I2Q")
#: ``PROCMAP_QUERY``: ``_IOWR('f', 17, struct procmap_query)``
_PROCMAP_QUERY = (3 << 30) | (_PROCMAP_QUERY_FMT.size << 16) | (ord("f") << 8) | 17
#: the argument of a query but for the address (word 2): its size, flags 0 (the
#: mapping covering the address), and zeros (no names asked for); each query
#: copies it (:meth:`ProcessMemory._query_at`)
_PROCMAP_ASK = bytearray(_PROCMAP_QUERY_FMT.pack(_PROCMAP_QUERY_FMT.size, 0, 0, *[0] * 12))
#: stores the address into a copy of :data:`_PROCMAP_ASK` (a bound method, taken once)
_PROCMAP_AT = struct.Struct("<Q").pack_into
#: the answer's fields, at offset 24: vma_start, vma_end, vma_flags, vma_page_size,
#: vma_offset, inode, dev_major, dev_minor
_PROCMAP_VMA = struct.Struct("<6Q2I")
_VMA_SHARED = 0x08  #: PROCMAP_QUERY_VMA_SHARED in vma_flags

#: What backs a mapping: (shared, device major, minor, inode, file offset minus
#: address) -- the same for every address the mapping covers; for anonymous
#: memory (inode 0) the last is 0.
Backing = tuple[int, int, int, int, int]


class Pin:
    """What backed a region when it was registered, and the check that it still does.

    A NIC pins a region's pages (``ib_umem_get``); the service cannot pin
    another process's pages, so it records what the region's address range
    was mapped to and, before every access, asks the kernel (one
    ``PROCMAP_QUERY`` ioctl on the process's ``/proc/<pid>/maps``, whose
    answer the service reuses until its next message:
    :func:`softverbs.engine.memory.new_pass`)
    whether it still is.  A range that was unmapped, or mapped to another file or another
    offset of it, or from shared to private, no longer is: the access fails
    and the region stays invalid.  An anonymous mapping replaced by another
    anonymous one with the same sharing cannot be told apart from outside the
    process (docs/architecture.md, *Registered memory and munmap*).

    :attr:`answer` makes the usual check one comparison of bytes: the
    kernel's whole answer (the mapping's start, end, flags, page size, file
    offset, inode and device) for a mapping that covered all of the region
    with the backing it was registered with.  The same answer again means the
    same mapping, so the region is still backed as registered; any other
    answer (the mapping split by ``mprotect``, grown by a neighbour, or gone)
    is judged field by field, and adopted when it passes."""

    __slots__ = ("answer", "segments")

    def __init__(self, segments: list[tuple[int, int, Backing]]) -> None:
        #: (start, end, backing) of each mapping the region lay in
        self.segments = segments
        #: a PROCMAP_QUERY answer (bytes 24-80) known to back all of the region as
        #: registered; None until one is seen (or for a region across mappings)
        self.answer: bytes | None = None


class AddressSpace(Protocol):
    """A process's memory as the device reaches it by address."""

    @property
    def pid(self) -> int:
        """The process, whose mappings a registration is checked against and
        pinned to; 0 for the device's own process (its caller's pages)."""
        ...

    def span(self, addr: int, length: int, pinned: bool = False) -> Bytes | str:
        """``length`` bytes at ``addr``, or why they cannot be reached; with
        ``pinned``, checked before every access to be backed as now (:class:`Pin`)."""
        ...

    def close(self) -> None:
        """Let go of the process's memory (its owner is gone)."""
        ...


class ProcessMemory:
    """One process's address space, through its ``/proc/<pid>/mem`` descriptor."""

    __slots__ = ("_good", "_seen", "_seen_pass", "closed", "faults", "fd", "maps", "pid",
                 "pidfd", "reuse", "vm", "vm_copies", "vm_why")  # fmt: skip

    def __init__(self, fd: int, pid: int = 0, reuse: bool = False) -> None:
        self.fd = fd
        self.pid = pid
        self.faults = 0  #: accesses the kernel refused (unmapped pages, process gone)
        self.closed = False
        #: reuse the kernel's answers until the next :func:`new_pass` (the service)
        self.reuse = reuse
        #: the mappings the kernel described since pass :attr:`_seen_pass`
        self._seen: list[tuple[int, int, Backing]] = []
        #: the :attr:`Pin.answer` values the kernel gave again since that pass
        self._good: set[bytes] = set()
        self._seen_pass = -1
        #: the process's /proc/<pid>/maps, for PROCMAP_QUERY (-1: none, no checks)
        self.maps = -1
        if pid:
            with contextlib.suppress(OSError):
                self.maps = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
            if self.maps >= 0 and not self._query_works():
                os.close(self.maps)
                self.maps = -1
        #: copies of at least :data:`VM_COPY` bytes may go through ``process_vm_*``
        #: (:meth:`_vm_copy`); False for good once they cannot
        self.vm = False
        self.vm_copies = 0  #: copies made through ``process_vm_readv``/``process_vm_writev``
        self.vm_why = "no pid"  #: why not, when :attr:`vm` is False
        #: the process's pidfd, from its first large copy while they may bypass the
        #: descriptor (:meth:`_vm_pidfd`)
        self.pidfd = -1
        if pid:
            self._vm_open(fd, pid)

    def _vm_open(self, fd: int, pid: int) -> None:
        """Let copies go through ``process_vm_*`` if this kernel and interpreter have
        what they need (the pidfd that names the process is taken at its first
        large copy: :meth:`_vm_pidfd`)."""
        if _process_vm_writev is None or _get_buffer is None or _pidfd_send_signal is None:
            self.vm_why = "no process_vm_readv/writev or pidfd here"
            return
        if self.maps < 0:  # the check that the descriptor's memory is still the process's
            self.vm_why = "no PROCMAP_QUERY on this kernel"
            return
        self.vm = True
        self.vm_why = ""

    def _vm_pidfd(self) -> bool:
        """Take a pidfd that names the process :attr:`fd` is the ``/proc/PID/mem`` of
        (docs/architecture.md, *Copies that bypass the descriptor*); False (and the
        descriptor for good) if there is none.

        The pidfd is opened first and the descriptor checked after: the
        descriptor's process existed before the pidfd was opened, and if it still
        has :attr:`pid` afterwards (the same ``/proc/PID/mem`` inode: a process
        that reuses a pid gets a new one) it had it throughout, so the pidfd
        names it.  Taken at the first large copy, not at HELLO: a client that
        never makes one holds no descriptor more in the service."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except (OSError, AttributeError) as exc:
            self._vm_refused(f"pidfd_open: {getattr(exc, 'strerror', None) or exc}")
            return False
        try:
            st, own = os.fstat(self.fd), os.stat(f"/proc/{self.pid}/mem")
            same = (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)
        except OSError:
            same = False
        if not same:
            os.close(pidfd)
            self._vm_refused(f"the memory descriptor is not /proc/{self.pid}/mem (or the "
                             f"process is gone)")  # fmt: skip
            return False
        self.pidfd = pidfd
        return True

    def _vm_refused(self, why: str) -> None:
        """``process_vm_*`` cannot work on this process: every copy goes through the
        descriptor from now on."""
        self.vm = False
        self.vm_why = why
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1

    def _vm_copy(self, data: Buffer, addr: int, cut: int, write: bool) -> int:
        """One ``process_vm_writev`` of ``data`` to ``addr`` (``write``) or one
        ``process_vm_readv`` from ``addr`` into ``data``; with ``0 < cut <
        len(data)`` the remote side is two pieces, ``[addr, addr + cut)`` then the
        rest -- the kernel copies remote iovecs in order, each in address order,
        and stops at the first that falls short (``process_vm_rw_core``), so the
        second lands last.  The bytes copied (a prefix: the caller copies the
        rest through the descriptor, as after a short ``pwrite``), or -1 when none
        was tried or the kernel refused (then the caller copies all of it).

        Before the copy, two checks that ``process_vm_*`` reaches the memory the
        descriptor reaches: the pidfd still names an unreaped process (signal
        0: the pid has not been freed, so it is not another process's), and the
        descriptor's memory is still the process's (one ``PROCMAP_QUERY`` on
        its ``/proc/PID/maps``, opened with the descriptor: ESRCH once that
        memory is gone, after an ``exec`` or an exit)."""
        if self.pidfd < 0 and not self._vm_pidfd():
            return -1
        try:
            _pidfd_send_signal(self.pidfd, 0)
        except OSError as exc:  # ESRCH: reaped; EPERM: no right to signal it either
            self._vm_refused("the process is gone" if exc.errno == errno.ESRCH
                             else f"pidfd_send_signal: {exc.strerror}")  # fmt: skip
            return -1
        try:
            self._query_at(addr)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                self._vm_refused("the process's memory is gone (exec or exit)")
            return -1  # nothing mapped at addr: the descriptor finds what it finds
        scratch = _SCRATCH  # this thread's
        pybuf = scratch.pybuf
        where = scratch.where
        try:
            _get_buffer(data, where, 1 if not write else 0)  # PyBUF_WRITABLE to read into
        except (BufferError, TypeError, ValueError):
            return -1
        try:
            n = pybuf.len
            if 0 < cut < n:
                _IOVECS.pack_into(scratch.iov, 0, pybuf.buf, n, addr, cut, addr + cut, n - cut)
                remote = 2
            else:
                _IOVECS.pack_into(scratch.iov, 0, pybuf.buf, n, addr, n, 0, 0)
                remote = 1
            at = scratch.at
            call = _process_vm_writev if write else _process_vm_readv
            done: int = call(self.pid, at, 1, at + 16, remote, 0)
        finally:
            _release_buffer(where)
        if done < 0:
            err = ctypes.get_errno()
            if err in _VM_REFUSED:
                self._vm_refused(f"process_vm_{'writev' if write else 'readv'}: "
                                 f"{os.strerror(err)}")  # fmt: skip
            return -1
        self.vm_copies += 1
        return done

    def copies(self) -> dict[str, object]:
        """How the service copies this process's memory, for ``softverbs service
        status``: ``process_vm`` (copies of at least :data:`VM_COPY` bytes through
        ``process_vm_readv``/``process_vm_writev``) or ``descriptor`` (all through
        ``/proc/PID/mem``, and why), the copies made the first way, and the faults."""
        return {"path": "process_vm" if self.vm else "descriptor", "why": self.vm_why,
                "process_vm_copies": self.vm_copies, "faults": self.faults}  # fmt: skip

    def _query_works(self) -> bool:
        """False on a kernel without PROCMAP_QUERY (before 6.11): no checks there."""
        buf = bytearray(_PROCMAP_QUERY_FMT.pack(_PROCMAP_QUERY_FMT.size, 0x10, 0, *[0] * 12))
        try:
            fcntl.ioctl(self.maps, _PROCMAP_QUERY, buf)
        except OSError as exc:
            return exc.errno not in (errno.ENOTTY, errno.EINVAL)
        return True

    def _ask(self, addr: int) -> bytearray | None:
        """One PROCMAP_QUERY for the mapping covering ``addr``: the kernel's answer
        (the whole ``struct procmap_query``, the mapping in bytes 24-80), or None if
        nothing is mapped there."""
        try:
            return self._query_at(addr)
        except OSError:
            return None

    def _query_at(self, addr: int) -> bytearray:
        """:meth:`_ask`'s PROCMAP_QUERY, raising the OSError the kernel refused it
        with (ENOENT: nothing mapped at ``addr``; ESRCH: the memory the maps
        descriptor was opened on is gone, after an ``exec`` or an exit).

        The argument is a new buffer per call, holding the answer after it:
        nothing is shared between calls, so two threads may ask at once -- the
        service's loop and a UDP device's progress thread can each reach one
        process's memory under its own device's lock, and the ioctl lets go of
        the GIL.  (A ``bytearray``: ``ioctl`` given ``bytes`` would return the
        answer too, but only after formatting the error of its first try, a
        writable buffer, which costs more than the rest of the check.)"""
        query = _PROCMAP_ASK.copy()
        _PROCMAP_AT(query, 16, addr)
        _ioctl(self.maps, _PROCMAP_QUERY, query)
        return query

    def _answer(self, answer: bytearray) -> tuple[int, int, Backing]:
        """(start, end, backing) of an answer of :meth:`_ask`."""
        got = _PROCMAP_VMA.unpack_from(answer, 24)
        start, end, flags, _, offset, inode, major, minor = got
        return start, end, (flags & _VMA_SHARED, major, minor, inode,
                            offset - start if inode else 0)  # fmt: skip

    def _new_pass(self, now: int) -> None:
        """Forget the kernel's answers of earlier passes (or of a faulted copy: -1)."""
        self._seen.clear()
        self._good.clear()
        self._seen_pass = now

    def backing(self, addr: int) -> tuple[int, int, Backing] | None:
        """(start, end, backing at ``addr``) of the mapping covering ``addr``; None if
        nothing is mapped there (or it cannot be asked)."""
        if self.maps < 0:
            return None
        if self.reuse:
            now = engine_memory.current_pass()
            if self._seen_pass == now:
                for seen in self._seen:
                    if seen[0] <= addr < seen[1]:
                        return seen
            else:
                self._new_pass(now)
        answer = self._ask(addr)
        if answer is None:
            return None
        got = self._answer(answer)
        if self.reuse:
            self._seen.append(got)
        return got

    def pin(self, addr: int, length: int) -> Pin | None:
        """What backs ``[addr, addr + length)`` now (None: no checks on this kernel,
        or the range is not mapped -- registration refuses that itself)."""
        if self.maps < 0 or length <= 0:
            return None
        segments: list[tuple[int, int, Backing]] = []
        pos, end = addr, addr + length
        answer = None
        while pos < end:  # asked afresh, outside any pass's answers: a registration
            answer = self._ask(pos)
            if answer is None:
                return None
            got = self._answer(answer)
            segments.append((pos, min(got[1], end), got[2]))
            pos = got[1]
        made = Pin(segments)
        if len(segments) == 1 and answer is not None:  # the answer for addr
            self._adopt(made, answer)
        return made

    def _adopt(self, pin: Pin, answer: bytearray) -> bytes | None:
        """If ``answer`` (:meth:`_ask`'s) backs all of ``pin``'s region as
        registered, its mapping becomes the pin's :attr:`Pin.answer` (and is returned)."""
        start, end, backed = self._answer(answer)
        segments = pin.segments
        if (len(segments) == 1 and start <= segments[0][0] and end >= segments[0][1]
                and backed == segments[0][2]):  # fmt: skip
            pin.answer = bytes(answer[24:80])
            return pin.answer
        return None

    def still_pinned(self, pin: Pin, addr: int, length: int) -> bool:
        """Is ``[addr, addr + length)`` (inside ``pin``'s range) backed as it was?

        The usual region lies in one mapping that has not changed since it was
        registered: one ioctl (none if this pass asked already) and one
        comparison of its answer's bytes with :attr:`Pin.answer`."""
        if self.maps < 0:
            return False
        answer = pin.answer
        if answer is not None:
            if self.reuse:
                now = engine_memory.current_pass()
                if self._seen_pass != now:
                    self._new_pass(now)
                elif answer in self._good:
                    return True
                else:  # a mapping this pass found changed holds its answer too
                    for seen in self._seen:
                        if seen[0] <= addr < seen[1]:
                            return self._still_pinned(pin, addr, length, seen)
            asked = self._ask(addr)
            if asked is None:
                return False  # nothing is mapped there now
            good = answer if asked.startswith(answer, 24) else self._adopt(pin, asked)
            if good is not None:
                if self.reuse:
                    self._good.add(good)
                return True
            got = self._answer(asked)
            if self.reuse:
                self._seen.append(got)
            return self._still_pinned(pin, addr, length, got)
        return self._still_pinned(pin, addr, length, None)

    def _still_pinned(self, pin: Pin, addr: int, length: int,
                      got: tuple[int, int, Backing] | None) -> bool:  # fmt: skip
        """:meth:`still_pinned` mapping by mapping (a region across mappings, or
        one whose mapping was split, or is gone); ``got``: the kernel's answer
        for ``addr`` if it was just asked."""
        pos, end = addr, addr + length
        for seg in pin.segments:
            while seg[0] <= pos < min(end, seg[1]):
                if got is None or not got[0] <= pos < got[1]:
                    got = self.backing(pos)
                    if got is None:
                        return False
                if got[2] != seg[2]:
                    return False
                pos = min(got[1], seg[1])
            if pos >= end:
                break
        return True

    def read(self, addr: int, length: int) -> bytes:
        """``length`` bytes at ``addr``: one ``pread`` when the pages are there; what
        the kernel refuses reads as zeros and counts in :attr:`faults`."""
        n = length  # compiled, a C integer; ``length`` goes to pread as it came
        if not self.closed:
            try:
                data = _pread(self.fd, length, addr)
            except OSError:
                data = b""
            if len(data) == n:
                return data
        else:
            data = b""
        return self._read_rest(data, addr, n)

    def _read_rest(self, data: bytes, addr: int, length: int) -> bytes:
        """:meth:`read` after a short first ``pread``: the rest as far as the kernel
        gives it, then zeros, and one fault."""
        done = len(data)
        parts = [data]
        while done < length and not self.closed:
            try:
                more = _pread(self.fd, length - done, addr + done)
            except OSError:
                break
            if not more:
                break
            parts.append(more)
            done += len(more)
        if done < length:
            parts.append(bytes(length - done))
            self.faults += 1
            self._new_pass(-1)  # the kernel says the mappings changed: ask it again
        return b"".join(parts)

    def read_pooled(self, addr: int, length: int) -> memoryview | None:
        """:meth:`read`, into a buffer of :data:`READ_BUFFERS` (a read-only view
        of it); None when the pool has no free buffer and no room for one."""
        view = READ_BUFFERS.take(length)
        if view is None:
            return None
        done = -1
        if not self.closed:
            if length >= _VM_COPY and self.vm:
                done = self._vm_copy(view, addr, 0, False)
            if done < 0:
                try:
                    done = _preadv(self.fd, [view], addr)
                except OSError:
                    done = 0
            if done == length:
                return view.toreadonly()
        self._read_rest_into(view, addr, done if done > 0 else 0)
        return view.toreadonly()

    def _read_rest_into(self, view: memoryview, addr: int, done: int) -> None:
        """:meth:`read_pooled` after a short first ``preadv`` of ``done`` bytes:
        the rest as far as the kernel gives it, then zeros, and one fault."""
        length = len(view)
        while done < length and not self.closed:
            try:
                n = _preadv(self.fd, [view[done:]], addr + done)
            except OSError:
                break
            if n <= 0:
                break
            done += n
        if done < length:
            view[done:] = bytes(length - done)
            self.faults += 1
            self._new_pass(-1)  # the kernel says the mappings changed: ask it again

    def write(self, addr: int, data: Buffer) -> None:
        """Store ``data`` at ``addr``: one ``pwrite`` when the pages are there; what
        the kernel refuses is not stored and counts in :attr:`faults`."""
        if type(data) is memoryview and data.itemsize != 1:
            data = data.cast("B")  # its length in bytes, as pwrite counts
        done = -1
        if not self.closed:
            n = len(data)  # bytes, or a memoryview of them (the engine's)
            if n >= _VM_COPY and self.vm:
                done = self._vm_copy(data, addr, 0, True)
            if done < 0:
                try:  # not contextlib.suppress: no context manager made per copy
                    done = _pwrite(self.fd, data, addr)
                except OSError:
                    done = 0
            if done == n:
                return
        self._write_rest(addr, data, done if done > 0 else 0)

    def _write_rest(self, addr: int, data: Buffer, done: int) -> None:
        """:meth:`write` after a short first ``pwrite`` of ``done`` bytes (or data
        that is not a byte buffer): the rest as far as the kernel takes it."""
        view = memoryview(data).cast("B")
        while done < len(view) and not self.closed:
            try:
                n = _pwrite(self.fd, view[done:], addr + done)
            except OSError:
                break
            if n <= 0:
                break
            done += n
        if done < len(view):
            self.faults += 1
            self._new_pass(-1)  # the kernel says the mappings changed: ask it again

    def write_ordered(self, addr: int, data: Buffer, tail: int) -> None:
        """:meth:`write`, with the last ``tail`` bytes of ``data`` stored after all
        the others (a message's last cache line: ``engine.rings.place``), in one
        system call: a ``pwritev`` of the two pieces.  ``/proc/PID/mem`` has a
        ``.write`` and no ``.write_iter``, so the kernel's ``pwritev`` on it
        (``do_loop_readv_writev``) is one ``mem_write`` per piece, in order,
        stopping at the first short one: two copies, the second after the first,
        as two ``pwrite`` calls would make them (docs/performance.md, *The last
        cache line last*)."""
        self._write_ordered(addr, _byte_view(data), tail)

    def _write_ordered(self, addr: int, view: memoryview, tail: int) -> None:
        """:meth:`write_ordered` of a view of bytes (:func:`_byte_view`)."""
        n = len(view)
        cut = n - tail
        if cut <= 0:
            self.write(addr, view)
            return
        done = -1
        if not self.closed:
            if n >= _VM_COPY and self.vm:  # one process_vm_writev of (body, tail), in order
                done = self._vm_copy(view, addr, cut, True)
            if done < 0:
                try:  # the two pieces in a tuple: pwritev takes any sequence
                    done = _pwritev(self.fd, (view[:cut], view[cut:]), addr)
                except OSError:
                    done = 0
            if done == n:
                return
        if done < 0:
            done = 0
        if done < cut:  # the body fell short: the rest of it, then the tail, each in order
            self._write_rest(addr, view[:cut], done)
            done = cut
        self._write_rest(addr + cut, view[cut:], done - cut)

    def span(self, addr: int, length: int, pinned: bool = False) -> ProcessSpan:
        """``length`` bytes at ``addr``; with ``pinned``, checked before every access
        to be backed as they are now (a registered region: :class:`Pin`)."""
        return ProcessSpan(self, addr, length, self.pin(addr, length) if pinned else None)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._vm_refused("closed")
            READ_BUFFERS.release()  # what its reads still hold stays until they go
            with contextlib.suppress(OSError):
                os.close(self.fd)
            if self.maps >= 0:
                with contextlib.suppress(OSError):
                    os.close(self.maps)
                self.maps = -1


#: Reads of at least this many bytes go into a reused buffer (:class:`ReadBuffers`).
POOLED_READ = 16 << 10
_POOLED_READ = POOLED_READ  # the same as a C integer for _read (memory.pxd)
#: The most bytes of read buffers the service keeps mapped.
READ_BUFFER_LIMIT = 256 << 20
#: Buffers :meth:`ReadBuffers.take` asks before it makes another.
_PROBES = 4


def _unshared(buf: bytearray) -> bool:
    """Does no view of ``buf`` exist any more?  A bytearray cannot change its
    length while a buffer of it is exported (BufferError), so deleting its last
    byte asks the interpreter exactly that in both modes; the byte is put back."""
    try:
        del buf[-1:]
    except BufferError:
        return False
    buf.append(0)  # within its allocation: no reallocation
    return True


class ReadBuffers:
    """The service's buffers for large reads of client memory, reused.

    The device snapshots a WQE's data when it starts the WQE, and holds the
    snapshot until the WQE completes (a retransmission sends it again): a
    few alive per QP, as many as its window lets start (about five 1 MiB
    WRITEs of ``ib_write_bw``), which the next reads find free and still in
    the cache.  Fresh buffers for them cost page faults: the allocator gives
    freed memory back to the kernel, and the next read copies into new zeroed
    pages (205 faults and 0.82 ms of the service's CPU per 1 MiB WRITE of
    ``ib_write_bw``, against 33 and 0.50 ms with the buffers kept,
    ``perf stat`` on the service; docs/performance.md).

    A buffer is handed out only as views (:class:`memoryview`), and is reused
    only when no view of it is left (:func:`_unshared`): the WQE's snapshot,
    the packets sliced from it, a queued datagram all hold one, so nothing that
    can still see the bytes sees them change.  Buffers are powers of two, one
    ring of them per size; WQEs complete in order, so the buffer after the one
    taken last is the likeliest free, and :meth:`take` asks at most
    :data:`_PROBES` of them before it makes another.  At most ``limit`` bytes
    are kept (past that a read allocates as it would without them), and
    :meth:`release` -- when a client goes -- drops those no view holds."""

    __slots__ = ("held", "limit", "lock", "next", "rings")

    def __init__(self, limit: int) -> None:
        self.rings: dict[int, list[bytearray]] = {}  #: the buffers of each size
        self.next: dict[int, int] = {}  #: each ring's next buffer to ask
        self.held = 0  #: bytes in :attr:`rings`
        self.limit = limit
        #: a UDP fabric's progress thread reads too: a buffer is found free and
        #: its view made in one step, so two threads never take the same one
        self.lock = threading.Lock()

    def take(self, length: int) -> memoryview | None:
        """A writable view of ``length`` bytes of a buffer no other view holds
        (it is this view's until the view and every view made from it are
        gone), or None when every buffer is held and there is no room for one."""
        self.lock.acquire()
        try:
            buf = self._find(length)
            return None if buf is None else memoryview(buf)[:length]
        finally:
            self.lock.release()

    def _find(self, length: int) -> bytearray | None:
        """:meth:`take`'s buffer, under its lock."""
        size = 1 << (length - 1).bit_length()
        ring = self.rings.get(size)
        if ring is None:
            ring = self.rings[size] = []
            self.next[size] = 0
        n = len(ring)
        start = self.next[size]
        if start >= n:
            start = 0
        i = start
        for _ in range(min(n, _PROBES)):
            buf = ring[i]
            i = i + 1 if i + 1 < n else 0
            if _unshared(buf):
                self.next[size] = i
                return buf
        if self.held + size > self.limit:
            return None
        buf = bytearray(size)
        ring.insert(start, buf)  # taken last: just before the oldest, which is asked next
        self.next[size] = start + 1
        self.held += size
        return buf

    def release(self) -> None:
        """Drop the buffers no view holds (their pages go back to the kernel)."""
        with self.lock:
            for size, ring in self.rings.items():
                kept = [buf for buf in ring if not _unshared(buf)]
                self.held -= size * (len(ring) - len(kept))
                ring[:] = kept
                self.next[size] = 0


#: the process's (the service's) buffers for large reads
READ_BUFFERS = ReadBuffers(READ_BUFFER_LIMIT)


class ProcessSpan:
    """``length`` bytes at ``addr`` of a process (see the module docstring)."""

    __slots__ = ("addr", "length", "mem", "pin")

    def __init__(self, mem: ProcessMemory, addr: int, length: int, pin: Pin | None = None) -> None:
        self.mem = mem
        self.addr = addr
        self.length = length
        self.pin = pin  #: a registered region's backing, checked by :meth:`still_mapped`

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: slice) -> ProcessSpan:
        return _cut(self, index)

    def __setitem__(self, index: slice, data: Buffer) -> None:
        start, stop, step = index.indices(self.length)
        # in bytes: a memoryview of wider items is stored as all of its bytes
        n = data.nbytes if type(data) is memoryview else len(data)
        if step != 1 or n != (stop - start if stop > start else 0):
            # as a memoryview: slice assignment never changes the length
            raise ValueError("memory span assignment: wrong length")
        self.mem.write(self.addr + start, data)

    def place(self, offset: int, data: Buffer, tail: int) -> None:
        """``self[offset : offset + len(data)] = data``, its last ``tail`` bytes
        stored after the rest (:meth:`ProcessMemory.write_ordered`: one system call)."""
        view = _byte_view(data)  # made once, for the bounds and the store
        n = len(view)  # bytes, as stored
        if offset < 0 or offset + n > self.length:
            raise ValueError(f"memory span store: [{offset}, +{n}) is outside "
                             f"[0, {self.length})")  # fmt: skip
        self.mem._write_ordered(self.addr + offset, view, tail)

    def read(self) -> memoryview:
        """The bytes as they are now (a copy, read-only; a large one in a buffer
        of :data:`READ_BUFFERS`, reused once nothing holds a view of it)."""
        return _read(self.mem, self.addr, self.length)

    def still_mapped(self) -> bool:
        """Is this span still backed as when its region was registered (:class:`Pin`)?"""
        return self.pin is None or self.mem.still_pinned(self.pin, self.addr, self.length)

    def fetch(self, offset: int, length: int) -> memoryview | None:
        """``self[offset : offset + length].read()`` if that part is still backed as
        registered, else None (``engine.memory.Span``: a key's read access, the
        check and the copy with no span made for the part)."""
        addr = _backed(self, offset, length)
        return None if addr is None else _read(self.mem, addr, length)

    def part(self, offset: int, length: int) -> ProcessSpan | None:
        """``self[offset : offset + length]`` if that part is still backed as
        registered, else None (``engine.memory.Span``: a key's write access)."""
        if _backed(self, offset, length) is None:
            return None
        return _subspan(self, offset, length)

    def __repr__(self) -> str:
        return f"<ProcessSpan pid={self.mem.pid} [{self.addr:#x}, +{self.length})>"


def _byte_view(data: Buffer) -> memoryview:
    """``data`` as a view of bytes: the engine's payload, already one, as it is."""
    view = data if type(data) is memoryview else memoryview(data)
    if view.itemsize != 1:
        view = view.cast("B")
    return view


def _read(mem: ProcessMemory, addr: int, length: int) -> memoryview:
    """:meth:`ProcessSpan.read` of ``length`` bytes at ``addr``."""
    n = length  # compiled, a C integer; ``length`` goes on as it came
    if n >= _POOLED_READ:
        got = mem.read_pooled(addr, n)
        if got is not None:
            return got
    return memoryview(mem.read(addr, length))


def _backed(span: ProcessSpan, offset: int, length: int) -> int | None:
    """The address of ``[offset, offset + length)`` of ``span`` if that part is still
    backed as registered (:meth:`ProcessSpan.still_mapped`, for a part), else None.
    The part must lie in the span (the engine's key checked its bounds; this keeps
    a span's own)."""
    if offset < 0 or length < 0 or offset + length > span.length:
        raise ValueError(f"memory span access: [{offset}, +{length}) is outside "
                         f"[0, {span.length})")  # fmt: skip
    addr = span.addr + offset
    pin = span.pin
    if pin is not None and not span.mem.still_pinned(pin, addr, length):
        return None
    return addr


def _cut(span: ProcessSpan, index: slice) -> ProcessSpan:
    """``span[index]``.  The engine slices a key's region with two integers inside
    it (``MemKey.slice``, once per SGE and per remote access): that slice is
    read from the slice's own fields (compiled, C struct reads), without
    ``slice.indices``' tuple; any other slice is normalised by ``indices`` as
    a sequence's would be."""
    start = index.start
    stop = index.stop
    if (index.step is None and type(start) is int and type(stop) is int
            and 0 <= start <= stop <= span.length):  # fmt: skip
        return _subspan(span, start, stop - start)
    start, stop, step = index.indices(span.length)
    if step != 1:
        raise ValueError("a memory span is sliced with step 1")
    return _subspan(span, start, stop - start if stop > start else 0)


def _subspan(span: ProcessSpan, start: int, length: int) -> ProcessSpan:
    """``length`` bytes of ``span`` from ``start``: a span made without
    ``__init__``'s argument handling (compiled, a C call)."""
    part = ProcessSpan.__new__(ProcessSpan)
    part.mem = span.mem
    part.addr = span.addr + start
    part.length = length
    part.pin = span.pin
    return part
