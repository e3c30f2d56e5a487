"""IBV_SEND_FENCE over the UDP fabric: a fenced WR waits for every earlier READ
and atomic of its send queue (SEMANTICS §5).

Two UDP (RoCEv2) devices on private loopback addresses, in this process, each
with its progress thread.  The responder's device delays every READ response
(or atomic ACK) by :data:`DELAY` -- fault injection, ``FaultRule(delay=...,
kinds={'read_resp'})``.  The requester READs a remote buffer into local
memory and then SENDs that local memory:

* with IBV_SEND_FENCE the SEND waits for the READ, so it carries the data
  just read, and arrives after the READ completes;
* without it the SEND overtakes the delayed READ and carries what the buffer
  held before -- which is why the fence exists.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from softverbs import SGE, RecvWR, SendWR, testing
from softverbs.enums import (
    IBV_QPT_RC,
    IBV_SEND_FENCE,
    IBV_SEND_SIGNALED,
    IBV_WC_SUCCESS,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_RDMA_READ,
    IBV_WR_SEND,
)
from softverbs.fabric.faults import FaultInjector, FaultRule
from softverbs.testing import Endpoint

DELAY = 0.3
SIZE = 4096


@pytest.fixture
def udp() -> Iterator[testing.World]:
    """Two UDP devices on loopback addresses of this test's own (testing.world)."""
    with testing.world("udp") as w:
        yield w
        for ctx in w.contexts:
            ctx.runtime.faults = None


def _pair(w: testing.World, kinds: str) -> tuple[Endpoint, Endpoint]:
    """An RC pair whose responder delays every packet of ``kinds`` by DELAY; a
    1.07 s ACK timeout (18) is longer than DELAY, so a delayed response is no loss."""
    pair = testing.connected_pair(w, IBV_QPT_RC, depth=16, mr_size=2 * SIZE, timeout=18)
    pair.b.ctx.runtime.faults = FaultInjector([FaultRule(delay=DELAY, kinds=frozenset({kinds}))])
    return pair.a, pair.b


def _events(w: testing.World, a: Endpoint, b: Endpoint, want_a: int,
            timeout: float = 10.0) -> list[tuple[str, int]]:  # fmt: skip
    """Poll both CQs; the order in which completions appeared, as (side, wr_id)."""
    out: list[tuple[str, int]] = []
    got = {"requester": 0, "responder": 0}

    def done() -> bool:
        for name, side in (("requester", a), ("responder", b)):
            n, wcs = side.cq.poll(4)
            for wc in wcs:
                assert wc.status == IBV_WC_SUCCESS, (name, wc)
                out.append((name, wc.wr_id))
            got[name] += n
        return got["requester"] >= want_a and got["responder"] >= 1

    try:
        testing.wait_until(w, done, timeout=timeout, what="the completions")
    except AssertionError as e:
        raise AssertionError(f"{e}; saw {out}") from None
    return out


@pytest.mark.parametrize("fence", [True, False])
def test_fence_waits_for_an_earlier_read(udp: testing.World, fence: bool) -> None:
    a, b = _pair(udp, "read_resp")
    b.mr.write(b"R" * SIZE, SIZE, 0)  # what the READ fetches
    a.mr.write(b"o" * SIZE, SIZE, SIZE)  # what the local buffer holds before
    b.qp.post_recv(RecvWR(7, 1, [SGE(b.mr.buf + SIZE, SIZE, b.mr.lkey)]))
    read = SendWR(1, IBV_WR_RDMA_READ, 1, sg=[SGE(a.mr.buf + SIZE, SIZE, a.mr.lkey)])
    read.set_wr_rdma(b.mr.rkey, b.mr.buf)
    flags = IBV_SEND_SIGNALED | (IBV_SEND_FENCE if fence else 0)
    read.next_wr = SendWR(
        2, IBV_WR_SEND, 1, sg=[SGE(a.mr.buf + SIZE, SIZE, a.mr.lkey)], send_flags=flags
    )
    t0 = time.monotonic()
    a.qp.post_send(read)
    order = _events(udp, a, b, 2)
    elapsed = time.monotonic() - t0
    assert [e for e in order if e[0] == "requester"] == [("requester", 1), ("requester", 2)]
    received = b.mr.read(SIZE, SIZE)
    if fence:
        # (which CQ the poll loop sees first is a race; what was sent is not)
        assert received == b"R" * SIZE, "the fenced SEND carries the data the READ brought"
        assert elapsed >= DELAY
    else:
        assert order[0] == ("responder", 7), order  # it overtook the delayed READ
        assert received == b"o" * SIZE
    assert b.ctx.runtime.faults.stats["delayed"] >= 1  # type: ignore[union-attr]


def test_fence_waits_for_an_earlier_atomic(udp: testing.World) -> None:
    a, b = _pair(udp, "atomic_ack")
    b.mr.write((41).to_bytes(8, "little"), 8, 0)
    b.qp.post_recv(RecvWR(7, 1, [SGE(b.mr.buf + SIZE, 8, b.mr.lkey)]))
    atomic = SendWR(1, IBV_WR_ATOMIC_FETCH_AND_ADD, 1, sg=[SGE(a.mr.buf, 8, a.mr.lkey)])
    atomic.set_wr_atomic(b.mr.rkey, b.mr.buf, 1, 0)
    atomic.next_wr = SendWR(
        2,
        IBV_WR_SEND,
        1,
        sg=[SGE(a.mr.buf, 8, a.mr.lkey)],
        send_flags=IBV_SEND_SIGNALED | IBV_SEND_FENCE,
    )
    t0 = time.monotonic()
    a.qp.post_send(atomic)
    _events(udp, a, b, 2)
    assert time.monotonic() - t0 >= DELAY * 0.9
    # the SEND gathered its buffer after the atomic's result landed there
    assert int.from_bytes(b.mr.read(8, SIZE), "little") == 41
    assert int.from_bytes(b.mr.read(8, 0), "little") == 42
