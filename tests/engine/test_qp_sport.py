"""UDP source ports as rxe chooses them, for every QP type.

rxe gives each QP a port when it creates it, 0xC000 + hash_32(qpn, 14), and
replaces it with ``rdma_get_udp_sport(flow label, qpn, dest qpn)`` when an
address vector names the peer (RC, UC, XRC).  A UD QP names no peer, so it
keeps the first port for good.  softverbs used to send UD from port 4791;
the receiver does not care, but ports are for ECMP entropy, and captures of
softverbs should look like rxe's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from softverbs import (
    AH,
    CQ,
    MR,
    PD,
    QP,
    SGE,
    AHAttr,
    Context,
    GlobalRoute,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
)
from softverbs.enums import IBV_ACCESS_LOCAL_WRITE, IBV_QPT_RC, IBV_QPT_UD, IBV_WC_SUCCESS
from softverbs.fabric.pcap import read_pcap
from softverbs.wire.codec import decode_frame
from softverbs.wire.packet import Packet, qp_sport, udp_sport

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
QKEY = 0x11111111


def test_qp_sport_values() -> None:
    assert qp_sport(0x13) == 53368  # golden ud_pingpong: QPN 0x13
    assert qp_sport(1) == 55410  # golden CM MADs: QP1
    assert all(0xC000 <= qp_sport(q) <= 0xFFFF for q in range(0, 1 << 24, 4099))


def test_rxe_ud_packets_leave_from_the_qp_port() -> None:
    path = GOLDEN / "ud_pingpong.pcap"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    pkts = []
    for _, raw in read_pcap(path):
        if len(raw) > 42 and raw[12:14] == b"\x08\x00" and raw[36:38] == b"\x12\xb7":
            pkts.append(decode_frame(raw))
    assert pkts
    for pkt in pkts:
        assert pkt.sport == qp_sport(pkt.src_qp)


class Tap:
    def __init__(self) -> None:
        self.pkts: list[Packet] = []

    def write_packet(self, pkt: Packet, ts: float | None = None) -> None:
        self.pkts.append(pkt)


def _qp(pd: PD, cq: CQ, qp_type: int) -> QP:
    attr = QPAttr()
    attr.qkey = QKEY
    init = QPInitAttr(qp_type=qp_type, scq=cq, rcq=cq, cap=QPCap(4, 4, 1, 1))
    return QP(pd, init, attr)


def _rc_send(pd: PD, cq: CQ, mr: MR, gid: object, completions: int,
             flow_label: int = 0) -> tuple[QP, QP]:  # fmt: skip
    """A connected RC pair on ``gid`` and one SEND between them; waits until ``cq``
    holds ``completions`` successful completions in all."""
    a, b = _qp(pd, cq, IBV_QPT_RC), _qp(pd, cq, IBV_QPT_RC)
    for me, peer in ((a, b), (b, a)):
        attr = QPAttr()
        attr.dest_qp_num = peer.qp_num
        attr.ah_attr = AHAttr(is_global=1, gr=GlobalRoute(dgid=gid, sgid_index=1,
                                                          flow_label=flow_label))  # fmt: skip
        me.to_rts(attr)
    b.post_recv(RecvWR(3, 1, [SGE(mr.buf, 100, mr.lkey)]))
    a.post_send(SendWR(4, num_sge=1, sg=[SGE(mr.buf + 200, 50, mr.lkey)]))
    statuses: list[int] = []
    for _ in range(100):
        statuses += [wc.status for wc in cq.poll(8)[1]]
        if len(statuses) == completions:
            break
    assert statuses == [IBV_WC_SUCCESS] * completions
    return a, b


@contextmanager
def _tapped() -> Iterator[tuple[Tap, PD, CQ, MR, object]]:
    """sv0 with a tap on its runtime: the tap, a PD, a CQ, an MR and GID 1."""
    with Context(name="sv0") as ctx:
        tap = Tap()
        ctx.runtime.add_tap(tap)
        try:
            pd, cq = PD(ctx), CQ(ctx, 16)
            yield tap, pd, cq, MR(pd, 256, IBV_ACCESS_LOCAL_WRITE), ctx.query_gid(1, 1)
        finally:
            ctx.runtime.remove_tap(tap)


def test_ud_and_rc_sends_use_rxe_ports() -> None:
    with _tapped() as (tap, pd, cq, mr, gid):
        # UD: one datagram
        tx, rx = _qp(pd, cq, IBV_QPT_UD), _qp(pd, cq, IBV_QPT_UD)
        rx.post_recv(RecvWR(1, 1, [SGE(mr.buf, 140, mr.lkey)]))
        ah = AH(pd, attr=AHAttr(is_global=1, gr=GlobalRoute(dgid=gid, sgid_index=1)))
        wr = SendWR(2, num_sge=1, sg=[SGE(mr.buf + 200, 50, mr.lkey)])
        wr.set_wr_ud(ah, rx.qp_num, QKEY)
        tx.post_send(wr)
        a, b = _rc_send(pd, cq, mr, gid, completions=4)  # with the UD pair's two
    ports = {(p.sqpn, p.dqpn): p.sport for p in tap.pkts}
    assert ports[(tx.qp_num, rx.qp_num)] == qp_sport(tx.qp_num)
    assert ports[(a.qp_num, b.qp_num)] == udp_sport(a.qp_num, b.qp_num)
    assert ports[(b.qp_num, a.qp_num)] == udp_sport(b.qp_num, a.qp_num)  # the ACK


def test_flow_label_is_taken_as_its_low_20_bits() -> None:
    """The ABI's flow label is 32 bits and the kernel takes any value (UCX
    passes ``~0``): the IPv6 header and rxe's port use its low 20 bits."""
    with _tapped() as (tap, pd, cq, mr, gid):
        route = GlobalRoute(dgid=gid, sgid_index=1, flow_label=0xFFFFFFFF)
        AH(pd, attr=AHAttr(is_global=1, gr=route))
        a, b = _rc_send(pd, cq, mr, gid, completions=2, flow_label=0xFFFFFFFF)
    ports = {(p.sqpn, p.dqpn): p.sport for p in tap.pkts}
    assert ports[(a.qp_num, b.qp_num)] == udp_sport(a.qp_num, b.qp_num, 0xFFFFF) == 0xFFC0
