"""ProcessMemory and ProcessSpan: the service's copies through ``/proc/PID/mem``.

Run on this process's own ``/proc/self/mem`` (the service opens a client's the
same way), in both modes (``SOFTVERBS_PURE``): a copy of mapped pages is one
``pread``/``pwrite``; a copy that runs into a page the process unmapped stores
or reads what is mapped before it, reads zeros for the rest, and counts one
fault; a closed memory copies nothing and counts each refused copy.  A large
read lands in a reused buffer (``ReadBuffers``) that no one still holding a view
of an earlier read ever sees change."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator

import pytest
from procmem_kit import own_memory

from softverbs import hostmem
from softverbs.device import memory
from softverbs.device.memory import POOLED_READ, ProcessMemory, ProcessSpan, ReadBuffers
from softverbs.verbs.cq import CQ, CompChannel
from softverbs.verbs.device import Context

PAGE = mmap.PAGESIZE


@pytest.fixture
def mem() -> Iterator[ProcessMemory]:
    m = own_memory()
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


@pytest.mark.parametrize("start, stop, step", [
    (0, 200, None), (10, 50, None), (50, 50, None), (0, 0, None), (199, 200, None),
    (200, 200, None), (10, 50, 1), (50, 10, None), (150, 1000, None), (-20, None, None),
    (None, 30, None), (None, None, None), (-300, 5, None), (2**64, 2**64 + 1, None),
    (True, 5, None), (0, -1, None),
])  # fmt: skip
def test_span_slices_as_a_memoryview_slices(mem: ProcessMemory, pages: int,
                                            start: int | None, stop: int | None,
                                            step: int | None) -> None:  # fmt: skip
    """Every slice -- the two in-bounds integers the engine uses, read from the
    slice's fields, and any other, normalised as a sequence's -- cuts a span as
    it cuts a memoryview of the same bytes."""
    data = os.urandom(PAGE)
    _fill(pages, data)
    span = mem.span(pages + 100, 200, pinned=True)
    like = memoryview(data)[100:300][start:stop:step]
    part = span[start:stop:step]
    assert isinstance(part, ProcessSpan) and part.pin is span.pin
    assert len(part) == len(like) and bytes(part.read()) == bytes(like)
    if len(like):
        assert part.addr == pages + 100 + slice(start, stop, step).indices(200)[0]


def test_place_stores_the_body_then_the_tail_in_one_store(mem: ProcessMemory,
                                                         pages: int) -> None:  # fmt: skip
    """``ProcessSpan.place``: the same bytes as a slice assignment, out of bounds a
    ValueError, a store no longer than the tail one plain write."""
    _fill(pages, bytes(PAGE))
    span = mem.span(pages + 8, 1000)
    data = os.urandom(300)
    span.place(100, data, 64)
    assert ctypes.string_at(pages + 100, 320) == bytes(8) + data + bytes(12)
    span.place(0, b"\x55" * 40, 64)  # all of it is the tail
    assert ctypes.string_at(pages + 8, 40) == b"\x55" * 40
    words = memoryview(bytearray(range(200))).cast("I")  # 50 items of 4 bytes
    span.place(500, words, 64)
    assert ctypes.string_at(pages + 508, 200) == bytes(range(200))
    with pytest.raises(ValueError, match="outside"):
        span.place(990, b"x" * 11, 64)
    with pytest.raises(ValueError, match="outside"):  # 50 items, but 200 bytes
        span.place(900, words, 64)
    with pytest.raises(ValueError, match="wrong length"):
        span[900:950] = words
    span[0:200] = words
    assert ctypes.string_at(pages + 8, 200) == bytes(range(200))
    with pytest.raises(ValueError, match="outside"):
        span.place(-1, b"x", 64)
    assert mem.faults == 0


def test_place_into_an_unmapped_page_stores_the_mapped_part(mem: ProcessMemory,
                                                            pages: int) -> None:  # fmt: skip
    """A store running past the mapping: the body's mapped part is stored, then
    the tail is tried on its own (as two stores would) -- each refused piece one fault."""
    _fill(pages, bytes(2 * PAGE))
    mem.write_ordered(pages + 2 * PAGE - 100, b"\xab" * 300, 64)  # body: 100 mapped, 136 not
    assert ctypes.string_at(pages + 2 * PAGE - 101, 101) == b"\0" + b"\xab" * 100
    assert mem.faults == 2  # the body's rest and the tail
    mem.write_ordered(pages + 2 * PAGE - 200, b"\xcd" * 200, 64)  # all mapped
    assert ctypes.string_at(pages + 2 * PAGE - 200, 200) == b"\xcd" * 200
    assert mem.faults == 2
    mem.close()
    mem.write_ordered(pages, b"\xef" * 200, 64)
    assert ctypes.string_at(pages, 1) == b"\0" and mem.faults == 4


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


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> ReadBuffers:
    """A pool of read buffers of this test's own, room for four of 64 KiB."""
    buffers = ReadBuffers(4 * BIG)
    monkeypatch.setattr(memory, "READ_BUFFERS", buffers)
    return buffers


BIG = 64 << 10  #: a read large enough to go into a pooled buffer
assert BIG >= POOLED_READ


@pytest.fixture
def big() -> Iterator[int]:
    """Two BIG mappings, the second one's second half unmapped."""
    addr = hostmem.mmap(length=2 * BIG)
    hostmem.munmap(addr + BIG + BIG // 2, BIG // 2)
    yield addr
    hostmem.munmap(addr, BIG + BIG // 2)


def test_a_large_read_is_a_read_only_view_of_a_pooled_buffer(
    mem: ProcessMemory, big: int, pool: ReadBuffers
) -> None:
    data = os.urandom(BIG)
    _fill(big, data)
    got = mem.span(big, BIG).read()
    assert bytes(got) == data and got.readonly and len(got) == BIG
    assert pool.held == BIG and len(pool.rings[BIG]) == 1
    with pytest.raises(TypeError):
        got[0] = 1
    assert mem.faults == 0


def test_a_pooled_buffer_is_not_reused_while_any_view_of_it_lives(
    mem: ProcessMemory, big: int, pool: ReadBuffers
) -> None:
    first = os.urandom(BIG)
    _fill(big, first)
    snapshot = mem.span(big, BIG).read()
    packet = snapshot[BIG - 100 :]  # a slice of it, as a packet's payload is
    del snapshot
    _fill(big, bytes(BIG))
    again = mem.span(big, BIG).read()  # the memory changed; the slice must not
    assert bytes(packet) == first[BIG - 100 :]
    assert bytes(again) == bytes(BIG)
    assert len(pool.rings[BIG]) == 2
    del packet, again
    for _ in range(5):  # every view gone: the same two buffers serve every read
        assert bytes(mem.span(big, BIG).read()) == bytes(BIG)
    assert len(pool.rings[BIG]) == 2 and pool.held == 2 * BIG


def test_a_short_pooled_read_zeros_what_the_last_read_left(mem: ProcessMemory, big: int,
                                                           pool: ReadBuffers) -> None:  # fmt: skip
    _fill(big, b"\xcc" * BIG)
    assert bytes(mem.span(big, BIG).read()) == b"\xcc" * BIG  # the buffer now holds 0xcc
    tail = os.urandom(BIG // 2)
    _fill(big + BIG, tail)
    got = mem.span(big + BIG, BIG).read()  # its second half is unmapped
    assert len(pool.rings[BIG]) == 1  # the same buffer
    assert bytes(got) == tail + bytes(BIG // 2)
    assert mem.faults == 1


def test_pooled_reads_past_the_limit_are_fresh_copies(mem: ProcessMemory, big: int,
                                                      pool: ReadBuffers) -> None:  # fmt: skip
    data = os.urandom(BIG)
    _fill(big, data)
    held = [mem.span(big, BIG).read() for _ in range(6)]
    assert pool.held == 4 * BIG
    assert all(bytes(view) == data for view in held)
    assert len({id(view.obj) for view in held}) == 6  # six buffers, none shared


def test_release_drops_the_buffers_no_view_holds(mem: ProcessMemory, big: int,
                                                 pool: ReadBuffers) -> None:  # fmt: skip
    kept = mem.span(big, BIG).read()
    dropped = mem.span(big, BIG).read()
    mem.span(big, POOLED_READ).read()  # another size
    assert pool.held == 2 * BIG + POOLED_READ
    del dropped
    mem.close()  # its owner went: what no view holds goes back
    assert pool.held == BIG and pool.rings[BIG] == [kept.obj]
    assert pool.rings[POOLED_READ] == []


def test_a_closed_memory_reads_zeros_into_a_pooled_buffer(mem: ProcessMemory, big: int,
                                                          pool: ReadBuffers) -> None:  # fmt: skip
    _fill(big, b"\x11" * BIG)
    assert bytes(mem.span(big, BIG).read()) == b"\x11" * BIG
    mem.close()
    assert bytes(mem.span(big, BIG).read()) == bytes(BIG)
    assert mem.faults == 1


def test_threads_never_take_the_same_buffer(pool: ReadBuffers) -> None:
    """A UDP fabric's progress thread reads beside the service's: each view a
    thread holds keeps the bytes it wrote while the other thread takes buffers."""
    import sys
    import threading
    import time

    errors: list[str] = []
    start = threading.Barrier(2)

    def work(mark: int) -> None:
        start.wait()
        for _ in range(2000):
            view = pool.take(POOLED_READ)
            if view is None:
                continue
            view[:] = bytes([mark]) * POOLED_READ
            time.sleep(0)  # let the other thread run
            if view[0] != mark or view[-1] != mark:
                errors.append(f"thread {mark}: its buffer was taken by the other thread")
            del view

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(mark,)) for mark in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []


def test_two_threads_checking_mappings_each_read_their_own_answer(
        mem: ProcessMemory, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The service's loop and a UDP device's progress thread may check one
    process's mappings at once, each under its own device's lock, and the
    PROCMAP_QUERY ioctl lets go of the GIL: each check must read the answer to
    its own query.  The first thread is held just after its ioctl while the
    second checks another mapping -- what a thread switch there does."""
    import threading

    if mem.maps < 0:
        pytest.skip("no PROCMAP_QUERY on this kernel (Linux 6.11+)")
    # two mappings the kernel cannot merge (their protections differ)
    addrs = [hostmem.mmap(length=PAGE), hostmem.mmap(length=3 * PAGE, prot=mmap.PROT_READ)]
    try:
        want = [mem.backing(a) for a in addrs]
        assert None not in want and want[0] != want[1]
        real = memory._ioctl
        held, done = threading.Event(), threading.Event()
        got: dict[int, object] = {}

        def ioctl(fd: int, request: int, arg: bytearray) -> object:
            answer = real(fd, request, arg)
            if threading.current_thread().name == "first" and not held.is_set():
                held.set()
                assert done.wait(10), "the second check did not end"
            return answer

        def first() -> None:
            got[0] = mem.backing(addrs[0])

        def second() -> None:
            assert held.wait(10), "the first check did not reach its ioctl"
            got[1] = mem.backing(addrs[1])
            done.set()

        monkeypatch.setattr(memory, "_ioctl", ioctl)
        threads = [threading.Thread(target=first, name="first"),
                   threading.Thread(target=second, name="second")]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert got == {0: want[0], 1: want[1]}
    finally:
        hostmem.munmap(addrs[0], PAGE)
        hostmem.munmap(addrs[1], 3 * PAGE)


def test_a_cq_with_a_channel_fences_between_its_cqe_and_reading_the_arm() -> None:
    """An application arms a CQ that has a completion channel, from its own process:
    the device puts a full barrier between publishing a CQE and reading the arm
    (docs/rings.md, Arming); a CQ without a channel has nothing to fence."""
    with Context(name="sv0") as ctx:
        channel = CompChannel(ctx)
        armed, polled = CQ(ctx, 8, None, channel), CQ(ctx, 8)
        assert armed.ring.fence is memory.full_fence
        assert polled.ring.fence is None
        armed.close()
        assert armed.ring.fence is None, "a destroyed CQ fences nothing"
        polled.close()
        channel.close()
