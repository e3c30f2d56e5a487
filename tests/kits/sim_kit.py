"""Helpers for tests that run pyverbs-style programs inside a Simulation.

:func:`rc_pair` connects an RC QP on device ``a`` to one on device ``b``
(:mod:`softverbs.testing`'s endpoints, with these tests' timers); :func:`stream`
sends ``n`` numbered SENDs from ``a`` to ``b`` and checks that every one arrives
exactly once, in order, with its bytes; :class:`Trace` is a tap that records what
leaves each device.
"""

from __future__ import annotations

from dataclasses import dataclass

from softverbs import SGE, Context, RecvWR, SendWR, testing
from softverbs.enums import IBV_QPT_RC, IBV_WC_SUCCESS, IBV_WR_SEND
from softverbs.wire.packet import Packet

ACCESS = testing.ACCESS


Side = testing.Endpoint


@dataclass
class Pair:
    a: Side
    b: Side


def side(ctx: Context, mr_size: int, depth: int = 256) -> Side:
    return testing.endpoint(ctx, IBV_QPT_RC, depth, mr_size)


def connect(me: Side, peer: Side, **attrs: int) -> None:
    """RTS towards ``peer`` with these tests' timers (min_rnr_timer 12), over GID 1."""
    testing.connect(me, peer, **{"min_rnr_timer": 12, **attrs})


def rc_pair(mr_size: int = 1 << 16, **attrs: int) -> Pair:
    """Two connected RC QPs, on devices ``a`` and ``b`` of the active simulation."""
    a = side(Context(name="a"), mr_size)
    b = side(Context(name="b"), mr_size)
    connect(a, b, **attrs)
    connect(b, a, **attrs)
    return Pair(a, b)


def stream(pair: Pair, n: int, size: int = 16, window: int = 32, slots: int = 64) -> None:
    """Send ``n`` numbered messages a -> b; each must arrive once, in order, intact."""
    a, b = pair.a, pair.b
    for i in range(slots):
        b.qp.post_recv(RecvWR(i, 1, [SGE(b.mr.buf + i * size, size, b.mr.lkey)]))
    posted = done = got = 0
    while got < n:
        while posted < n and posted - done < window:
            slot = posted % slots
            a.mr.write(_payload(posted, size), size, slot * size)
            a.qp.post_send(SendWR(posted, IBV_WR_SEND, 1,
                                  sg=[SGE(a.mr.buf + slot * size, size, a.mr.lkey)]))  # fmt: skip
            posted += 1
        for wc in a.cq.poll(64)[1]:
            assert wc.status == IBV_WC_SUCCESS, wc
            assert wc.wr_id == done, f"send completion {wc.wr_id}, expected {done}"
            done += 1
        for wc in b.cq.poll(64)[1]:
            assert wc.status == IBV_WC_SUCCESS, wc
            slot = wc.wr_id % slots
            data = b.mr.read(size, slot * size)
            assert data == _payload(got, size), f"message {got}: got {data[:8].hex()}..."
            got += 1
            b.qp.post_recv(RecvWR(wc.wr_id + slots, 1,
                                  [SGE(b.mr.buf + slot * size, size, b.mr.lkey)]))  # fmt: skip
    while done < n:
        for wc in a.cq.poll(64)[1]:
            assert wc.status == IBV_WC_SUCCESS, wc
            done += 1


def _payload(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


class Trace:
    """A tap: (opcode, psn, dqpn, ts) of every packet a device hands to the fabric."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, float | None]] = []

    def write_packet(self, pkt: Packet, ts: float | None = None) -> None:
        self.rows.append((pkt.opcode, pkt.psn, pkt.dqpn, ts))
