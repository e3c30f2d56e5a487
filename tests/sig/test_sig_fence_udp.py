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

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from softverbs import (
    CQ,
    MR,
    PD,
    QP,
    SGE,
    Context,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    testing,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QPT_RC,
    IBV_SEND_FENCE,
    IBV_SEND_SIGNALED,
    IBV_WC_SUCCESS,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_RDMA_READ,
    IBV_WR_SEND,
)
from softverbs.fabric.faults import FaultInjector, FaultRule

DELAY = 0.3
ACCESS = (
    IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
)
SIZE = 4096


@pytest.fixture
def devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Context, Context]]:
    # 127.x.y.z all route through lo; a pair derived from the pid avoids other users of 4791
    x = 100 + os.getpid() % 100
    links = [
        {"name": "fence1", "addrs": [f"127.{x}.9.1"]},
        {"name": "fence2", "addrs": [f"127.{x}.9.2"]},
    ]
    cfg = tmp_path / "links.json"
    cfg.write_text(json.dumps({"links": links}))
    monkeypatch.setenv("SOFTVERBS_CONFIG", str(cfg))
    a, b = Context(name="fence1"), Context(name="fence2")
    yield a, b
    b.runtime.faults = None
    a.close()
    b.close()


class Side:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.pd = PD(ctx)
        self.cq = CQ(ctx, 64)
        init = QPInitAttr(qp_type=IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=QPCap(16, 16, 1, 1))
        attr = QPAttr()
        attr.qp_access_flags = ACCESS
        self.qp = QP(self.pd, init, attr)
        self.mr = MR(self.pd, 2 * SIZE, ACCESS)

    def connect(self, peer: Side) -> None:
        # timeout 18 (1.07 s): longer than DELAY, so a delayed response is no loss
        testing.connect_qp(self.qp, peer.qp.qp_num, testing.route(peer.ctx, 0),
                           qp_access_flags=ACCESS, timeout=18)  # fmt: skip


def _pair(devices: tuple[Context, Context], kinds: str) -> tuple[Side, Side]:
    a, b = Side(devices[0]), Side(devices[1])
    a.connect(b)
    b.connect(a)
    b.ctx.runtime.faults = FaultInjector([FaultRule(delay=DELAY, kinds=frozenset({kinds}))])
    return a, b


def _events(a: Side, b: Side, want_a: int, timeout: float = 10.0) -> list[tuple[str, int]]:
    """Poll both CQs; the order in which completions appeared, as (side, wr_id)."""
    out: list[tuple[str, int]] = []
    got_a = got_b = 0
    end = time.monotonic() + timeout
    while got_a < want_a or got_b < 1:
        assert time.monotonic() < end, f"timed out; saw {out}"
        for name, side in (("requester", a), ("responder", b)):
            n, wcs = side.cq.poll(4)
            for wc in wcs:
                assert wc.status == IBV_WC_SUCCESS, (name, wc)
                out.append((name, wc.wr_id))
            if name == "requester":
                got_a += n
            else:
                got_b += n
        time.sleep(0.001)
    return out


@pytest.mark.parametrize("fence", [True, False])
def test_fence_waits_for_an_earlier_read(devices: tuple[Context, Context], fence: bool) -> None:
    a, b = _pair(devices, "read_resp")
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
    order = _events(a, b, 2)
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


def test_fence_waits_for_an_earlier_atomic(devices: tuple[Context, Context]) -> None:
    a, b = _pair(devices, "atomic_ack")
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
    _events(a, b, 2)
    assert time.monotonic() - t0 >= DELAY * 0.9
    # the SEND gathered its buffer after the atomic's result landed there
    assert int.from_bytes(b.mr.read(8, SIZE), "little") == 41
    assert int.from_bytes(b.mr.read(8, 0), "little") == 42
