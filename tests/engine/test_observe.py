"""The engine's observer hooks (softverbs.engine.observe): what a trace or a
sanitizer sees of one RC SEND that first meets an RNR NAK."""

from __future__ import annotations

from typing import Any

from engine_kit import Bench

from softverbs.engine import observe
from softverbs.enums import (
    IBV_EVENT_QP_FATAL,
    IBV_QPS_ERR,
    IBV_QPS_RTS,
    IBV_WC_RECV,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
    IBV_WR_SEND,
)


class Recorder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.log: list[tuple[Any, ...]] = []

    def doorbell(self, qp: Any, queue: str, index: int) -> None:
        self.log.append(("doorbell", qp.qpn, queue, index))

    def wqe_start(self, qp: Any, wqe: Any) -> None:
        self.log.append(("wqe_start", qp.qpn, wqe.wr_id, wqe.psn, wqe.npkts))

    def wqe_done(self, qp: Any, wqe: Any) -> None:
        self.log.append(("wqe_done", qp.qpn, wqe.wr_id))

    def packet_out(self, qp: Any, pkt: Any) -> None:
        self.log.append(("out", qp.qpn, pkt.opcode, pkt.psn, pkt.count))

    def packet_in(self, qp: Any, pkt: Any) -> None:
        self.log.append(("in", qp.qpn, pkt.opcode, pkt.psn, pkt.count))

    def step(self, qp: Any, part: str, state: Any) -> None:
        self.log.append(("step", qp.qpn, part, state.name))

    def retransmit(self, qp: Any, psn: int, why: str) -> None:
        self.log.append(("retransmit", qp.qpn, psn, why))

    def cqe(self, qp: Any, cq: Any, cqe: Any) -> None:
        self.log.append(("cqe", qp.qpn, cqe.wr_id, cqe.status, cqe.opcode))

    def state(self, qp: Any, old: int, new: int) -> None:
        self.log.append(("state", qp.qpn, old, new))

    def event(self, event_type: int, element: Any) -> None:
        self.log.append(("event", event_type))

    def kinds(self) -> list[str]:
        return [e[0] for e in self.log]


def test_hooks_see_a_send_through_an_rnr_nak() -> None:
    b = Bench(pmtu=256, min_rnr_timer=1)
    ra, rb = Recorder("a"), Recorder("b")
    observe.attach(b.a.hca, ra)
    observe.attach(b.b.hca, rb)
    qa, qb = b.a.qp.qpn, b.b.qp.qpn
    b.a.post_send(IBV_WR_SEND, 0, 600, wr_id=7)
    b.pump()  # no receive posted: RNR NAK
    b.b.post_recv(1024, 1024, wr_id=9)
    b.run()
    assert ra.log[0] == ("doorbell", qa, "sq", 1)
    assert ra.log[1] == ("wqe_start", qa, 7, 0, 3)
    assert ("out", qa, b.a.qp.transport | 0x00, 0, 3) in ra.log  # SEND_FIRST burst of 3
    assert ("retransmit", qa, 0, "RNR back-off over") in ra.log
    # a response's step record follows what handling it did (here: the CQE)
    assert ra.log[-1] == ("step", qa, "completer", "ACK")
    assert ra.log[-3:-1] == [("wqe_done", qa, 7), ("cqe", qa, 7, IBV_WC_SUCCESS, IBV_WC_SEND)]
    steps_a = [e[2:] for e in ra.log if e[0] == "step"]
    assert steps_a == [("completer", "RNR_RETRY"), ("completer", "ACK")]
    # the responder's checks: the first try stopped at CHK_RESOURCE (no receive WQE)
    steps_b = [e[2:] for e in rb.log if e[0] == "step"]
    assert steps_b[0] == ("responder", "ERR_RNR")
    assert steps_b[-1] == ("responder", "DONE")
    assert ("doorbell", qb, "rq", 1) in rb.log
    assert ("cqe", qb, 9, IBV_WC_SUCCESS, IBV_WC_RECV) in rb.log
    assert rb.log[-1][:3] == ("out", qb, b.b.qp.transport | 0x11)  # the coalesced ACK, last
    assert rb.kinds().count("in") >= 2  # the first try and the retry


def test_several_observers_and_detach() -> None:
    b = Bench(pmtu=256)
    r1, r2 = Recorder("1"), Recorder("2")
    observe.attach(b.a.hca, r1)
    observe.attach(b.a.hca, r2)
    b.a.qp.set_state(IBV_QPS_ERR, 0.0)
    assert r1.log == r2.log == [("state", b.a.qp.qpn, IBV_QPS_RTS, IBV_QPS_ERR)]
    observe.detach(b.a.hca, r1)
    assert b.a.hca.observer is r2
    b.a.hca.post_event(IBV_EVENT_QP_FATAL, b.a.qp)
    assert r1.log[-1][0] == "state" and r2.log[-1] == ("event", IBV_EVENT_QP_FATAL)
    observe.detach(b.a.hca, r2)
    assert b.a.hca.observer is None
