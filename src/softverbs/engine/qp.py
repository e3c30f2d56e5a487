"""The QP engine: a requester, a completer and a responder, and the effects
of state changes.

:class:`QPEngine` is the QP (:class:`~.core.QPCore`: attributes, rings,
state) with its three parts, each an object that owns its own progress
(:mod:`.core` says who does what).  It routes packets in to them, and
carries out state changes.

Which transitions are legal, and which attributes each needs, is decided
by the state table in :mod:`.qpstate`, which :meth:`QPEngine.modify`
consults against the QP's own current state -- the device's, never what a
driver believes.  The rest of this module carries a transition out:

* **RESET** discards every WQE without a CQE and removes the QP's un-polled
  CQEs from its CQs (as mlx5 does); the rings start again at zero.
* **Destroy** discards the WQEs as RESET does, but the CQEs already in the CQs
  stay there to be polled, as on rxe (the kernel's ``ib_destroy_qp`` never
  touches a CQ; mlx5 cleans them).  Programs count on it: libfabric's RXM
  closes a connection's endpoint when its peer disconnects, destroying the QP,
  and only then reads the CQ for what that QP completed (``rxm_close_conn``);
  cleaning the CQ there lost a completion the program was waiting for, and
  ``fi_pingpong -e rdm`` hung.
* **ERR** (by modify, or by the engine itself) completes every outstanding
  WQE with ``IBV_WC_WR_FLUSH_ERR`` in posting order -- send queue, then the
  receive queue, or only the receive WQE it took from its SRQ, followed by
  ``IBV_EVENT_QP_LAST_WQE_REACHED``.  Later posts are flushed at once.
* **SQE** (UC and UD only) flushes the send queue; receives go on.
* **SQD** stops starting new send WQEs; once every started one is
  acknowledged, ``IBV_EVENT_SQ_DRAINED`` is posted if it was asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from softverbs.engine import psn as P
from softverbs.engine import qpstate
from softverbs.engine.completer import Completer
from softverbs.engine.core import QPCore
from softverbs.engine.observe import COMPLETER, RESPONDER, RQ
from softverbs.engine.requester import Requester, SigStop
from softverbs.engine.responder import Responder
from softverbs.engine.rings import CQE, WQ_SRQ
from softverbs.enums import (
    IBV_EVENT_COMM_EST,
    IBV_EVENT_QP_LAST_WQE_REACHED,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
)
from softverbs.wire.opcodes import OpInfo
from softverbs.wire.packet import Packet, udp_sport

#: States in which a responder accepts requests.
_RESPONDING = frozenset({IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE})


class QPEngine(QPCore):
    """One queue pair's transport (see the module docstring)."""

    def _make_parts(self) -> None:
        self.req = Requester(self)
        self.comp = Completer(self)
        self.req.comp = self.comp
        self.comp.req = self.req
        self.resp = Responder(self)

    # --- packets in --------------------------------------------------------------
    def receive(self, pkt: Packet, info: OpInfo, now: float) -> None:
        counters = self.hca.counters
        if self._state not in _RESPONDING:
            counters["drop_qp_state"] += pkt.count
            return
        if info.transport is not self.transport:  # Transport members: one each
            counters["drop_transport_mismatch"] += pkt.count
            return
        theirs = pkt.pkey  # compiled, C integers (qp.pxd): no Python arithmetic per packet
        ours = self.pkey
        if (theirs & 0x7FFF) != (ours & 0x7FFF) or not (theirs | ours) & 0x8000:
            counters["drop_bad_pkey"] += pkt.count
            return
        if info.request:
            if self.is_xrc_send:
                counters["drop_qp_state"] += pkt.count
                return
            if not self.comm_established:
                self.comm_established = True
                if self._state == IBV_QPS_RTR:
                    self.hca.post_event(IBV_EVENT_COMM_EST, self)
            rstate = self.resp.on_request(pkt, info, now)
            obs = self.hca.observer
            if obs is not None:
                obs.step(self, RESPONDER, rstate)
        else:
            if self._state == IBV_QPS_RTR or self.is_xrc_recv:
                counters["drop_qp_state"] += pkt.count
                return
            cstate = self.comp.on_response(pkt, info, now)
            obs = self.hca.observer
            if obs is not None:
                obs.step(self, COMPLETER, cstate)

    # --- doorbells, timers, ACKs: the device's calls -----------------------------
    def doorbell(self, now: float) -> None:
        """Send WQEs were posted: fetch them and run."""
        self.req.doorbell(now)

    def rq_doorbell(self, now: float) -> None:
        """Receive WQEs were posted: fetch them."""
        if self.rq is not None:
            self.rq.latch()
            obs = self.hca.observer
            if obs is not None:
                obs.doorbell(self, RQ, self.rq.db)
        if self.state == IBV_QPS_ERR:
            self.resp.flush(fetch=False)  # the latch above fetched this doorbell's WQEs

    def handle_timer(self, now: float) -> None:
        self.comp.handle_timer(now)
        req = self.req
        if req.paced_until is not None and now >= req.paced_until:
            req.paced_until = None  # the congestion control's pacing let packets go
            req.pump_sq(now)

    def next_deadline(self) -> float | None:
        deadline = self.comp.next_deadline()
        paced = self.req.paced_until
        if paced is not None and (deadline is None or paced < deadline):
            return paced
        return deadline

    def emit_ack(self) -> None:
        self.resp.emit_ack()

    def cancel_posted(self, wr_id: int) -> int:
        return self.req.cancel_posted(wr_id)

    def fetch_sq(self, everything: bool = False) -> None:
        self.req.fetch_sq(everything)

    # --- attributes ------------------------------------------------------------------
    def set_attrs(self, attrs: dict[str, Any]) -> None:
        """Apply validated attributes (names as in ``ibv_qp_attr``)."""
        for name, value in attrs.items():
            setattr(self, name, value)
            if name == "sq_psn":
                self.req.npsn = self.req.sent_end = self.comp.una = value
            elif name == "rq_psn":
                self.resp.epsn = value
            elif name == "retry_cnt":
                self.comp.retry_left = value
            elif name == "rnr_retry":
                self.comp.rnr_left = value
            elif name == "pmtu":
                self.window = self.hca.window_for(value)
                self.req.cc.reset(self.window)
        if "dest_qpn" in attrs or "route" in attrs:
            # rxe: rdma_get_udp_sport(the AV's flow label, qpn, dest qpn)
            fl = self.route.flow_label if self.route is not None else 0
            self.sport = udp_sport(self.qpn, self.dest_qpn, fl)

    # --- transitions --------------------------------------------------------------------
    def modify(self, mask: int, new: int | None, cur: int | None,
               values: Callable[[], dict[str, Any]], now: float) -> int:  # fmt: skip
        """``ibv_modify_qp``, judged here: the state table (:mod:`.qpstate`)
        against this QP's own current state; then ``values()`` checks and
        converts the attributes the mask names; then the transition.  Returns
        the new state; EINVAL names what is wrong, and nothing has changed."""
        new = qpstate.check(self.qp_type, self.state, mask, new, cur)
        self.set_attrs(values())
        self.set_state(new, now)
        return new

    def set_state(self, new: int, now: float) -> None:
        old = self.state
        req = self.req
        if new == IBV_QPS_RESET:
            self.reset()
        elif new == IBV_QPS_ERR:
            self.to_error(now)
        elif new == IBV_QPS_SQE:
            self.send_queue_error(now)
        elif new == IBV_QPS_SQD:
            self.state = IBV_QPS_SQD
            if old == IBV_QPS_RTS:
                req.draining = True
            req.pump_sq(now)
        elif new == IBV_QPS_RTS:
            self.state = IBV_QPS_RTS
            req.draining = False
            if req.sig is SigStop.STOPPED:
                req.sig = SigStop.NONE  # a signature stop's SQ_DRAINED is moot once resumed
            if old == IBV_QPS_SQE:
                req.blocked = False
            req.pump_sq(now)
        else:
            self.state = new
            if new == IBV_QPS_INIT:
                self.comm_established = False

    def reset(self, clean_cqs: bool = True) -> None:
        """RESET: drop all work without completions and clean the CQs; a
        destroy passes ``clean_cqs=False`` (its CQEs stay, see above)."""
        srq = self.srq

        def purged(cqe: CQE) -> None:
            if cqe.wq_kind == WQ_SRQ and srq is not None:
                srq.discarded()  # the application's slot comes back without a CQE

        if clean_cqs:
            for cq in {id(c): c for c in (self.send_cq, self.recv_cq) if c is not None}.values():
                cq.purge(self.qpn, purged)
        rqe = self.resp.rqe
        if rqe is not None and rqe.srq is not None:
            rqe.srq.discarded()
        if self.sq is not None:
            self.sq.discard()
        if self.rq is not None:
            self.rq.discard()
        self.state = IBV_QPS_RESET
        self.comm_established = False
        self.last_error = ""
        self.req.reset()
        self.comp.reset()
        self.resp.reset()

    def to_error(self, now: float) -> None:
        if self.state == IBV_QPS_ERR:
            return
        was_reset = self.state == IBV_QPS_RESET
        self.state = IBV_QPS_ERR
        self.flush_posted_sq()
        self.resp.flush()
        self.resp.replay.clear()
        if self.srq is not None and not was_reset:
            self.hca.post_event(IBV_EVENT_QP_LAST_WQE_REACHED, self)

    def fatal(self, event_type: int, now: float) -> None:
        """An error that moves the QP to ERR and posts ``event_type``: ERR is
        published first, so a process that reads the state when the event
        reaches it reads ERR."""
        if self.sq is not None:
            self.sq.publish_state(IBV_QPS_ERR)
        self.hca.post_event(event_type, self)
        self.to_error(now)

    def send_queue_error(self, now: float) -> None:
        self.state = IBV_QPS_SQE
        self.flush_posted_sq()

    def flush_posted_sq(self) -> None:
        """Flush every posted send WQE, deferred ones too: each was posted
        successfully, so each must complete (seed 003), and entering ERR or SQE
        completes every WR that has not completed (seed 001)."""
        self.req.fetch_sq(everything=True)
        self.req.flush_sq()

    # --- introspection ------------------------------------------------------------------
    def sq_draining(self) -> bool:
        return self.state == IBV_QPS_SQD and self.req.draining

    def outstanding_psns(self) -> int:
        return P.diff(self.req.npsn, self.comp.una)
