"""ProcessMemory and ProcessSpan: the service's copies through ``/proc/PID/mem``.

Run on this process's own ``/proc/self/mem`` (the service opens a client's the
same way), in both modes (``SOFTVERBS_PURE``): a copy of mapped pages is one
``pread``/``pwrite``; a copy that runs into a page the process unmapped stores
or reads what is mapped before it, reads zeros for the rest, and counts one
fault; a closed memory copies nothing and counts each refused copy."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator

import pytest

from softverbs import hostmem
from softverbs.device.memory import ProcessMemory, ProcessSpan

PAGE = mmap.PAGESIZE


@pytest.fixture
def mem() -> Iterator[ProcessMemory]:
    m = ProcessMemory(os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC), os.getpid())
    yield m
    m.close()


@pytest.fixture
def pages() -> Iterator[int]:
    """Three pages, the last unmapped: [addr, addr + 2 * PAGE) is mapped."""
    addr = hostmem.mmap(length=3 * PAGE)
    hostmem.munmap(addr + 2 * PAGE, PAGE)
    yield addr
    hostmem.munmap(addr, 2 * PAGE)


def _fill(addr: int, data: bytes) -> None:
    ctypes.memmove(addr, data, len(data))


def test_read_and_write_mapped_pages(mem: ProcessMemory, pages: int) -> None:
    data = os.urandom(2 * PAGE)
    _fill(pages, data)
    got = mem.read(pages + 3, 2 * PAGE - 3)
    assert got == data[3:]
    mem.write(pages + 10, b"abcdef")
    assert ctypes.string_at(pages + 8, 10) == data[8:10] + b"abcdef" + data[16:18]
    assert mem.faults == 0


def test_read_into_an_unmapped_page_reads_zeros_for_it(mem: ProcessMemory, pages: int) -> None:
    data = os.urandom(2 * PAGE)
    _fill(pages, data)
    got = mem.read(pages + PAGE, 2 * PAGE)  # one mapped page, then one unmapped
    assert len(got) == 2 * PAGE
    assert got[:PAGE] == data[PAGE:]
    assert got[PAGE:] == bytes(PAGE)
    assert mem.faults == 1


def test_write_into_an_unmapped_page_stores_the_mapped_part(mem: ProcessMemory,
                                                            pages: int) -> None:  # fmt: skip
    _fill(pages, bytes(2 * PAGE))
    mem.write(pages + PAGE + PAGE // 2, b"\xab" * PAGE)  # half of it lies beyond the mapping
    assert ctypes.string_at(pages + PAGE, PAGE) == bytes(PAGE // 2) + b"\xab" * (PAGE // 2)
    assert mem.faults == 1


def test_write_of_a_wider_memoryview_stores_all_its_bytes(mem: ProcessMemory,
                                                          pages: int) -> None:  # fmt: skip
    _fill(pages, bytes(64))
    words = memoryview(bytearray(range(32))).cast("I")  # 8 items of 4 bytes
    mem.write(pages, words)
    assert ctypes.string_at(pages, 33) == bytes(range(32)) + b"\0"
    assert mem.faults == 0


def test_closed_memory_copies_nothing_and_counts(mem: ProcessMemory, pages: int) -> None:
    _fill(pages, b"\x11" * 16)
    mem.close()
    assert mem.read(pages, 16) == bytes(16)
    mem.write(pages, b"\x22" * 16)
    assert ctypes.string_at(pages, 16) == b"\x11" * 16
    assert mem.faults == 2


def test_span_slices_stay_inside_and_assignments_keep_the_length(mem: ProcessMemory,
                                                                 pages: int) -> None:  # fmt: skip
    data = os.urandom(PAGE)
    _fill(pages, data)
    span = mem.span(pages + 100, 200, pinned=True)
    assert isinstance(span, ProcessSpan) and len(span) == 200
    part = span[10:50]
    assert (part.addr, len(part), part.pin) == (pages + 110, 40, span.pin)
    assert bytes(part.read()) == data[110:150]
    assert len(span[150:1000]) == 50  # clamped to the span, as a memoryview's slice
    assert len(span[300:400]) == 0
    assert bytes(span[-20:].read()) == data[280:300]
    with pytest.raises(ValueError, match="step 1"):
        span[0:10:2]
    with pytest.raises(ValueError, match="wrong length"):
        span[0:10] = b"x" * 11
    span[190:] = b"y" * 10
    assert ctypes.string_at(pages + 290, 12) == b"y" * 10 + data[300:302]
    assert span.still_mapped()
    assert mem.faults == 0


def test_a_span_of_pages_unmapped_since_is_no_longer_mapped(mem: ProcessMemory) -> None:
    if mem.maps < 0:
        pytest.skip("this kernel has no PROCMAP_QUERY (Linux 6.11+): mappings are not checked")
    addr = hostmem.mmap(length=2 * PAGE)
    try:
        span = mem.span(addr, 2 * PAGE, pinned=True)
        assert span.still_mapped()
        hostmem.munmap(addr + PAGE, PAGE)
        assert span[:PAGE].still_mapped()
        assert not span.still_mapped()
        assert not span[PAGE:].still_mapped()
    finally:
        hostmem.munmap(addr, PAGE)
