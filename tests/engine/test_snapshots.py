"""A send WQE's snapshot lives until the WQE completes, and no longer.

The device reads a SEND's or WRITE's data when it starts the WQE (the
snapshot, ``SendWQE.data``; a large one in a buffer of the service's
``ReadBuffers``) and sends it again from there on a retry.  Once the WQE
completes, nothing can need it; but the SQ keeps its copy of the WQE until
the slot is fetched again, a whole ring later.  Held there, ``ib_write_bw``'s
128 posted 1 MiB WRITEs kept 128 MiB of snapshots alive and every copy into
them missed the cache (docs/performance.md, *Snapshots dropped at completion*).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pytest
from engine_kit import ALL_ACCESS, BASE_A, DELIVER, DROP, Bench, is_request
from procmem_kit import own_memory, own_read_buffers

from softverbs.device.memory import POOLED_READ, ProcessMemory, ReadBuffers
from softverbs.engine.memory import MemKind
from softverbs.enums import IBV_WC_SUCCESS, IBV_WR_RDMA_WRITE, IBV_WR_SEND
from softverbs.wire.packet import Packet

PMTU = 1024
SIZE = 4 * POOLED_READ  #: a WRITE large enough for its snapshot to go into a pooled buffer
N = 8


def pattern(i: int, n: int) -> bytes:
    return bytes((i * 37 + j * 11) & 0xFF for j in range(n))


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> ReadBuffers:
    """Read buffers of this test's own."""
    return own_read_buffers(monkeypatch, 64 * SIZE)


@pytest.fixture
def process_mem() -> Iterator[ProcessMemory]:
    m = own_memory()
    yield m
    m.close()


def served_sender(b: Bench, mem: ProcessMemory, source: bytearray) -> None:
    """A's region as the service sees a client's: ``source`` through ``/proc/PID/mem``,
    so every WQE's data is read into a snapshot (of the pool, when large)."""
    addr = ctypes.addressof(ctypes.c_char.from_buffer(source))
    span = mem.span(addr, len(source))
    b.a.mr = b.a.hca.keys.register(MemKind.MR, b.a.pd, span, BASE_A, ALL_ACCESS)


def test_completed_writes_leave_their_snapshot_buffers_free(
    pool: ReadBuffers, process_mem: ProcessMemory
) -> None:
    """One WRITE after another: each completed one's buffer serves the next."""
    source = bytearray(b"".join(pattern(i, SIZE) for i in range(N)))
    b = Bench(pmtu=PMTU, mem_size=N * SIZE)
    served_sender(b, process_mem, source)
    for i in range(N):
        b.a.post_send(IBV_WR_RDMA_WRITE, i * SIZE, SIZE, remote=b.b.addr(i * SIZE),
                      rkey=b.b.mr.key)  # fmt: skip
        b.run()
        b.log.clear()  # the bench's record of the packets holds views of the snapshot
        assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    assert b.b.mem == source
    assert len(pool.rings[SIZE]) == 1, "a completed WRITE's snapshot is not held"
    assert all(b.a.sq.get(i).data is None for i in range(N))


def test_a_retransmission_sends_the_snapshot_then_it_is_dropped(
    pool: ReadBuffers, process_mem: ProcessMemory
) -> None:
    """A lost packet is sent again from the snapshot taken at the start -- the
    bytes as they were then, whatever the application stored since -- and the
    snapshot is dropped only once the WQE completes."""
    source = bytearray(pattern(1, SIZE))
    b = Bench(pmtu=PMTU, mem_size=SIZE, timeout=10)
    served_sender(b, process_mem, source)
    lost = {"n": 0}

    def policy(seq: int, src: str, pkt: Packet) -> str:
        if src == "a" and is_request(pkt) and pkt.psn == 3 and lost["n"] == 0:
            lost["n"] += 1
            source[:] = bytes(SIZE)  # changed after the snapshot: not what is sent
            return DROP
        return DELIVER

    b.policy = policy
    b.b.post_recv(0, SIZE)
    b.a.post_send(IBV_WR_SEND, 0, SIZE)
    started = b.a.sq.get(0)  # the device's copy of the WQE
    assert started.data is not None
    b.run()
    assert lost["n"] == 1 and b.a.qp.req.resent_pkts > 0
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    assert bytes(b.b.mem) == pattern(1, SIZE)
    assert started.data is None
