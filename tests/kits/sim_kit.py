"""Helpers for tests that run pyverbs-style programs inside a Simulation.

:func:`rc_pair` connects an RC QP on device ``a`` to one on device ``b``
(:func:`softverbs.testing.connected_pair`, with these tests' timers); :func:`stream`
sends ``n`` numbered SENDs from ``a`` to ``b`` and checks that every one arrives
exactly once, in order, with its bytes; :class:`Trace` is a tap that records what
leaves each device.
"""

from __future__ import annotations

from softverbs import SGE, RecvWR, SendWR, testing
from softverbs.enums import IBV_QPT_RC, IBV_WC_SUCCESS, IBV_WR_SEND
from softverbs.sim import Simulation
from softverbs.wire.packet import Packet

ACCESS = testing.ACCESS


Pair = testing.Pair


def rc_pair(sim: Simulation, mr_size: int = 1 << 16, **attrs: int) -> Pair:
    """Two connected RC QPs on devices ``a`` and ``b`` of ``sim``
    (:func:`softverbs.testing.connected_pair`), with these tests' timers:
    min_rnr_timer 12 unless ``attrs`` say otherwise."""
    return testing.connected_pair(testing.simulated(sim), IBV_QPT_RC, depth=256, mr_size=mr_size,
                                  **{"min_rnr_timer": 12, **attrs})  # fmt: skip


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
