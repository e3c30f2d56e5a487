"""The engine stores a message in increasing address order, its last cache line last.

The target memory here is a recording span (the interface of
:class:`softverbs.engine.memory.Span`, which the served device's
``/proc/PID/mem`` spans implement): every store the engine makes is logged
with its range, so the order is checked exactly rather than raced for (the
race itself is tests/native/test_lastbyte.py).  For WRITE, SEND and READ
responses, one packet and many, the stores must tile the message in
increasing order, and the last one must be within the message's last 64
bytes.
"""

from __future__ import annotations

import itertools
import os

import pytest
from engine_kit import BASE_B, Bench

from softverbs.device import memory as device_memory
from softverbs.device.memory import ProcessMemory
from softverbs.engine.rings import CACHE_LINE, place, scatter
from softverbs.enums import IBV_WC_SUCCESS, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_SEND

PMTU = 256
MEM = 1 << 16
RECV_OFF = MEM // 2


class Recorder:
    """A memory span over ``buf[base : base + length]`` logging each store."""

    def __init__(self, buf: bytearray, log: list[tuple[int, int]], base: int = 0,
                 length: int | None = None) -> None:  # fmt: skip
        self.buf = buf
        self.log = log
        self.base = base
        self.length = len(buf) - base if length is None else length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: slice) -> Recorder:
        start, stop, _ = index.indices(self.length)
        return Recorder(self.buf, self.log, self.base + start, max(0, stop - start))

    def __setitem__(self, index: slice, data: bytes | bytearray | memoryview) -> None:
        start, stop, _ = index.indices(self.length)
        assert stop - start == len(data)
        self.buf[self.base + start : self.base + stop] = data
        if stop > start:
            self.log.append((self.base + start, self.base + stop))

    def place(self, offset: int, data: bytes | bytearray | memoryview, tail: int) -> None:
        """The span's ordered store: its body, then its last ``tail`` bytes (a
        ``ProcessSpan`` makes the two one ``pwritev``; tests/device checks that)."""
        cut = len(data) - tail
        self[offset : offset + cut] = data[:cut]
        self[offset + cut : offset + len(data)] = data[cut:]

    def read(self) -> memoryview:
        return memoryview(bytes(self.buf[self.base : self.base + self.length]))

    def still_mapped(self) -> bool:
        return True  # a buffer of this process: never unmapped under the engine

    def fetch(self, offset: int, length: int) -> memoryview:
        return self[offset : offset + length].read()

    def part(self, offset: int, length: int) -> Recorder:
        return self[offset : offset + length]


def check_order(log: list[tuple[int, int]], start: int, size: int) -> None:
    """The stores tile ``[start, start + size)`` in increasing order, and the
    last one is at most the last 64 bytes (a store made before it is complete
    when it starts, so only the last store's own order is the CPU's)."""
    assert log, "nothing was stored"
    assert log[0][0] == start and log[-1][1] == start + size, log
    for (_, stop), (nxt, _) in itertools.pairwise(log):
        assert stop == nxt, f"stores out of address order or overlapping: {log}"
    assert log[-1][0] >= start + size - CACHE_LINE, f"the last store is over 64 bytes: {log}"


def pattern(n: int, seed: int = 1) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


SIZES = [1, 64, 65, 200, 256, 257, 1000, 17 * PMTU + 3, 64 * PMTU]


def recorded(node: object) -> list[tuple[int, int]]:
    log: list[tuple[int, int]] = []
    node.mr.view = Recorder(node.mem, log)  # type: ignore[attr-defined]
    return log


@pytest.mark.parametrize("size", SIZES)
def test_write_lands_in_order_last_line_last(size: int) -> None:
    b = Bench(pmtu=PMTU, mem_size=MEM)
    b.a.mem[:size] = pattern(size)
    log = recorded(b.b)
    b.a.post_send(IBV_WR_RDMA_WRITE, 0, size, remote=BASE_B + 100, rkey=b.b.mr.key)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    assert b.b.mem[100 : 100 + size] == pattern(size)
    check_order(log, 100, size)


@pytest.mark.parametrize("size", SIZES)
def test_send_lands_in_order_last_line_last(size: int) -> None:
    b = Bench(pmtu=PMTU, mem_size=MEM)
    b.a.mem[:size] = pattern(size, 2)
    log = recorded(b.b)
    b.b.post_recv(RECV_OFF, MEM - RECV_OFF)
    b.a.post_send(IBV_WR_SEND, 0, size)
    b.run()
    assert [c.status for c in b.b.poll_recv()] == [IBV_WC_SUCCESS]
    assert b.b.mem[RECV_OFF : RECV_OFF + size] == pattern(size, 2)
    check_order(log, RECV_OFF, size)


@pytest.mark.parametrize("size", SIZES)
def test_read_response_lands_in_order_last_line_last(size: int) -> None:
    b = Bench(pmtu=PMTU, mem_size=MEM)
    b.b.mem[200 : 200 + size] = pattern(size, 3)
    log = recorded(b.a)
    b.a.post_send(IBV_WR_RDMA_READ, RECV_OFF, size, remote=BASE_B + 200, rkey=b.b.mr.key)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    assert b.a.mem[RECV_OFF : RECV_OFF + size] == pattern(size, 3)
    check_order(log, RECV_OFF, size)


@pytest.mark.parametrize("lengths", [[4096], [10, 100, 3], [30, 30, 300], [1, 64, 1]])
@pytest.mark.parametrize("offset", [0, 5])
def test_scatter_stores_the_last_line_last(lengths: list[int], offset: int) -> None:
    """Over several views (a receive WQE's SGEs) the last 64 bytes may span two."""
    buf = bytearray(sum(lengths))
    log: list[tuple[int, int]] = []
    views, pos = [], 0
    for n in lengths:
        views.append(Recorder(buf, log, pos, n))
        pos += n
    size = len(buf) - offset
    assert scatter(views, offset, pattern(size), last=True)  # type: ignore[arg-type]
    assert buf[offset:] == pattern(size)
    check_order(log, offset, size)
    log.clear()
    assert not scatter(views, offset + 1, pattern(size), last=True)  # type: ignore[arg-type]
    assert log == [], "a message that does not fit stores nothing"


def test_place_on_process_memory_is_one_ordered_pwritev(monkeypatch: pytest.MonkeyPatch) -> None:
    """The served device's span (``/proc/PID/mem``): the message, then its last line,
    as the two pieces of one ``pwritev`` (the kernel writes them in order)."""
    target = bytearray(5000)
    addr = memoryview(target).cast("B")  # keep the buffer alive while its address is used
    import ctypes

    base = ctypes.addressof(ctypes.c_char.from_buffer(target))
    calls: list[tuple[str, int, list[int]]] = []
    real_pwrite, real_pwritev = os.pwrite, os.pwritev

    def pwrite(fd: int, data: memoryview, where: int) -> int:
        calls.append(("pwrite", where - base, [len(data)]))
        return real_pwrite(fd, data, where)

    def pwritev(fd: int, pieces: list[memoryview], where: int) -> int:
        calls.append(("pwritev", where - base, [len(p) for p in pieces]))
        return real_pwritev(fd, pieces, where)

    # the store's system calls, as device.memory reads them from os once (a copy through
    # any other name is one this does not see, and fails the counts below)
    assert (device_memory._pwrite, device_memory._pwritev) == (real_pwrite, real_pwritev)
    monkeypatch.setattr(device_memory, "_pwrite", pwrite)
    monkeypatch.setattr(device_memory, "_pwritev", pwritev)
    mem = ProcessMemory(os.open("/proc/self/mem", os.O_RDWR))
    try:
        place(mem.span(base, len(target)), 3, pattern(4097))  # type: ignore[arg-type]
        assert calls == [("pwritev", 3, [4097 - 64, 64])]
        assert target[3:4100] == pattern(4097) and mem.faults == 0
        calls.clear()
        place(mem.span(base, len(target)), 0, pattern(64))  # type: ignore[arg-type]
        assert calls == [("pwrite", 0, [64])], "a message of one line is one store"
    finally:
        mem.close()
        del addr
