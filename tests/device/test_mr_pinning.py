"""Registering memory by address checks it as the kernel's ``ib_umem_get`` pins it:
pages that are not mapped are EFAULT, and so are read-only pages when the access
lets anything write them (LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC, MW_BIND).
Without the check, a RECV or an RDMA WRITE into such memory would crash the
process that holds an in-process device (C programs on the served device are
checked by tests/native/resize.c).

The served device also checks, before each access to a region registered by
address, that the range is still backed as registered (``device/memory.py``'s
``Pin``): what keeps the pages passes, an unmapped or replaced range fails."""

from __future__ import annotations

import errno
import functools
import mmap
import random
from collections.abc import Iterator
from typing import Any

import pytest

from softverbs import MR, PD, Context, PyverbsRDMAError, hostmem
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_READ,
    IBV_REREG_MR_CHANGE_TRANSLATION,
)

PAGE = mmap.PAGESIZE


@pytest.fixture
def pd() -> Iterator[PD]:
    with Context(name="sv0") as ctx:
        p = PD(ctx)
        yield p
        p.close()


@pytest.fixture
def read_only() -> Iterator[int]:
    addr = hostmem.mmap(length=PAGE, prot=mmap.PROT_READ)
    yield addr
    hostmem.munmap(addr, PAGE)


def test_read_only_pages_register_for_reading_only(pd: PD, read_only: int) -> None:
    MR(pd, PAGE, IBV_ACCESS_REMOTE_READ, address=read_only).close()
    with pytest.raises(PyverbsRDMAError) as exc:
        MR(pd, PAGE, IBV_ACCESS_LOCAL_WRITE, address=read_only)
    assert exc.value.error_code == errno.EFAULT
    assert "not mapped writable" in str(exc.value)


def test_pages_not_mapped_are_efault(pd: PD) -> None:
    addr = hostmem.mmap(length=2 * PAGE)
    hostmem.munmap(addr + PAGE, PAGE)  # the second page goes
    try:
        MR(pd, PAGE, IBV_ACCESS_LOCAL_WRITE, address=addr).close()
        with pytest.raises(PyverbsRDMAError) as exc:
            MR(pd, 2 * PAGE, 0, address=addr)
        assert exc.value.error_code == errno.EFAULT
    finally:
        hostmem.munmap(addr, PAGE)


def test_rereg_to_read_only_pages_for_writing_is_efault(pd: PD, read_only: int) -> None:
    mr = MR(pd, PAGE, IBV_ACCESS_LOCAL_WRITE)
    with pytest.raises(PyverbsRDMAError) as exc:
        mr.rereg(IBV_REREG_MR_CHANGE_TRANSLATION, addr=read_only, length=PAGE)
    assert exc.value.error_code == errno.EFAULT
    mr.close()


def test_in_process_registration_by_address_of_unmapped_pages_is_efault(pd: PD) -> None:
    """REG_MR with neither a mapping nor a pid reaches the device's own process
    through its ``AddressSpace`` (``verbs.memory.SelfMemory``), whose answer for
    pages that are not mapped is a reason, not bytes: EFAULT, no key."""
    from softverbs.device import ops, records
    from softverbs.verbs.provider import Attach

    addr = hostmem.mmap(length=PAGE)
    hostmem.munmap(addr, PAGE)
    body = records.RegMR(addr, PAGE, addr, 0, pd.device_pd, IBV_ACCESS_LOCAL_WRITE, 0, 0)
    with pytest.raises(PyverbsRDMAError) as exc:
        pd.ctx.provider.call(ops.REG_MR, body, Attach())
    assert exc.value.error_code == errno.EFAULT
    assert f"{addr:#x}" in str(exc.value) and "not mapped" in str(exc.value)


# --- the served device's check that a region is still mapped as registered ----------------


def _own_memory() -> Iterator[object]:
    import os

    from softverbs.device.memory import ProcessMemory

    mem = ProcessMemory(os.open("/proc/self/mem", os.O_RDWR), os.getpid())
    if mem.maps < 0:
        mem.close()
        pytest.skip("no PROCMAP_QUERY on this kernel (Linux 6.11+): the check is off")
    yield mem
    mem.close()


own_memory = pytest.fixture(_own_memory)


def _memfd(length: int) -> int:
    import os

    fd = os.memfd_create("pin", os.MFD_CLOEXEC)
    os.ftruncate(fd, length)
    return fd


def test_a_pinned_span_survives_what_keeps_its_pages(own_memory: Any) -> None:
    """mprotect splitting the mapping, a neighbour mapped next to it: same backing."""
    import ctypes

    addr = hostmem.mmap(length=3 * PAGE)
    span = own_memory.span(addr, 3 * PAGE, pinned=True)
    assert span.still_mapped()
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(addr + PAGE, PAGE, mmap.PROT_READ) == 0  # three mappings now
    assert span.still_mapped() and span[PAGE : 2 * PAGE].still_mapped()
    hostmem.munmap(addr, 3 * PAGE)


def test_a_pinned_span_fails_once_unmapped_or_replaced(own_memory: Any) -> None:
    import os

    addr = hostmem.mmap(length=2 * PAGE)
    span = own_memory.span(addr, 2 * PAGE, pinned=True)
    hostmem.munmap(addr + PAGE, PAGE)  # half of it
    assert span[:PAGE].still_mapped() and not span.still_mapped()
    fd = _memfd(PAGE)
    hostmem.mmap(addr + PAGE, PAGE, flags=mmap.MAP_SHARED | hostmem.MAP_FIXED_, fd=fd)
    assert not span.still_mapped() and not span[PAGE:].still_mapped()
    hostmem.munmap(addr, 2 * PAGE)
    os.close(fd)


def test_a_pinned_span_follows_its_mapping_as_it_grows(own_memory: Any) -> None:
    """The check's fast path compares the kernel's whole answer for the region's
    mapping with the one it had: a mapping grown by a neighbour (merged with it)
    answers differently yet backs the region as before, and the new answer is
    the one compared from then on; a region across mappings has none."""
    addr = hostmem.mmap(length=3 * PAGE)
    hostmem.munmap(addr + 2 * PAGE, PAGE)
    try:
        span = own_memory.span(addr, PAGE, pinned=True)
        assert span.pin.answer is not None and span.still_mapped()
        first = span.pin.answer
        hostmem.mmap(addr + 2 * PAGE, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                     | hostmem.MAP_FIXED_)  # fmt: skip
        assert span.still_mapped() and span[: PAGE // 2].still_mapped()
        assert span.pin.answer != first  # the grown mapping's answer, adopted
        assert own_memory.span(addr, 3 * PAGE, pinned=True).pin.answer is not None
        fd = _memfd(PAGE)
        hostmem.mmap(addr, PAGE, flags=mmap.MAP_SHARED | hostmem.MAP_FIXED_, fd=fd)
        import os

        os.close(fd)
        assert not span.still_mapped() and not span[PAGE // 2 :].still_mapped()
    finally:
        hostmem.munmap(addr, 3 * PAGE)


def test_a_span_across_mappings_is_checked_mapping_by_mapping(own_memory: Any) -> None:
    import ctypes

    addr = hostmem.mmap(length=2 * PAGE)
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    try:
        assert libc.mprotect(addr + PAGE, PAGE, mmap.PROT_READ) == 0
        span = own_memory.span(addr, 2 * PAGE, pinned=True)
        assert span.pin.answer is None and len(span.pin.segments) == 2
        assert span.still_mapped()
        hostmem.munmap(addr + PAGE, PAGE)
        assert span[:PAGE].still_mapped() and not span.still_mapped()
    finally:
        hostmem.munmap(addr, 2 * PAGE)


def test_a_file_region_fails_when_mapped_at_another_offset(own_memory: Any) -> None:
    import os

    fd = _memfd(4 * PAGE)
    addr = hostmem.mmap(length=PAGE, flags=mmap.MAP_SHARED, fd=fd)
    span = own_memory.span(addr, PAGE, pinned=True)
    assert span.still_mapped()
    hostmem.mmap(addr, PAGE, flags=mmap.MAP_SHARED | hostmem.MAP_FIXED_, fd=fd, offset=PAGE)
    assert not span.still_mapped()
    hostmem.mmap(addr, PAGE, flags=mmap.MAP_SHARED | hostmem.MAP_FIXED_, fd=fd)
    assert span.still_mapped()  # the same pages of the same file again: what a pin keeps
    hostmem.munmap(addr, PAGE)
    os.close(fd)


def test_a_key_whose_memory_went_stays_invalid_and_counts() -> None:
    """KeyTable: a span that reports its memory gone fails the access -- local
    (the requester's LOC_PROT_ERR) and remote (REM_ACCESS_ERR) alike -- counts
    ``mr_unmapped`` and tells ``on_unmapped`` once; the key stays invalid."""
    from collections import Counter

    from softverbs.engine.memory import KeyTable, MemKind
    from softverbs.enums import IBV_ACCESS_REMOTE_WRITE

    class Span:
        mapped = True

        def __len__(self) -> int:
            return 4096

        def __getitem__(self, index: slice) -> Span:
            return self

        def __setitem__(self, index: slice, data: object) -> None:
            raise AssertionError("written after its memory went")

        def read(self) -> memoryview:
            return memoryview(bytes(4096))

        def still_mapped(self) -> bool:
            return self.mapped

        def fetch(self, offset: int, length: int) -> memoryview | None:
            return self.read()[offset : offset + length] if self.mapped else None

        def part(self, offset: int, length: int) -> Span | None:
            return self if self.mapped else None

    counters: Counter[str] = Counter()
    keys = KeyTable(functools.partial(random.Random(0).getrandbits, 8), counters)
    told: list[str] = []
    keys.on_unmapped = lambda mk, why: told.append(why)
    pd, span = object(), Span()
    access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
    mk = keys.register(MemKind.MR, pd, span, 0x1000, access)
    assert keys.local(mk.key, pd, 0x1000, 64, True) is span
    span.mapped = False
    why = keys.local(mk.key, pd, 0x1000, 64, True)
    assert isinstance(why, str) and "mr-unmapped" in why
    span.mapped = True  # what is mapped there now is not what was registered
    assert isinstance(keys.remote(mk.key, pd, 1, 0x1000, 64, IBV_ACCESS_REMOTE_WRITE), str)
    assert counters["mr_unmapped"] == 2 and len(told) == 1


def test_the_service_asks_again_after_each_message_and_each_fault(own_memory: Any) -> None:
    """With ``reuse`` (the service's memory of a client), the kernel's answer
    holds until the service serves its next message (``new_pass``) or a copy
    faults: within one pass an unmap is not seen, after it always."""
    import os

    from softverbs.device.memory import ProcessMemory
    from softverbs.engine.memory import new_pass

    mem = ProcessMemory(os.open("/proc/self/mem", os.O_RDWR), os.getpid(), reuse=True)
    try:
        new_pass()
        addr = hostmem.mmap(length=2 * PAGE)
        span = mem.span(addr, 2 * PAGE, pinned=True)
        assert span.still_mapped()
        hostmem.munmap(addr + PAGE, PAGE)
        assert span.still_mapped()  # the same pass: the answer it had
        new_pass()  # the next message
        assert not span.still_mapped() and span[:PAGE].still_mapped()
        hostmem.munmap(addr, PAGE)
        assert span[:PAGE].still_mapped()  # the same pass again
        assert bytes(span[:PAGE].read()) == bytes(PAGE) and mem.faults == 1
        assert not span[:PAGE].still_mapped()  # the fault made it ask the kernel
    finally:
        mem.close()
