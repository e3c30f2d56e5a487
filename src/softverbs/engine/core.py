"""What the three parts of a QP engine share: the QP itself.

A QP engine is split the way a NIC's transport is, into three objects that
each own their state (:class:`~.qp.QPEngine` holds one of each):

* the **requester** (:class:`.requester.Requester`) turns send WQEs into
  request packets, within the window and the READ/atomic limit;
* the **completer** (:class:`.completer.Completer`) consumes ACKs, NAKs and
  READ or atomic responses, keeps the retransmission and RNR timers, and
  writes send CQEs in posting order;
* the **responder** (:class:`.responder.Responder`) checks and executes
  incoming requests, consumes receive WQEs and answers with ACKs, NAKs and
  responses.

:class:`QPCore` holds what all of them read: the QP's attributes, its rings
and CQs, its state, and the link to the device (:class:`HCAPort`) through
which packets leave, timers are armed and async events are posted.  The
engine is sans-IO: every entry point takes ``now`` (seconds, from an
injected clock) and nothing here reads a clock, sleeps or touches a socket.
"""

from __future__ import annotations

import sys
from collections import Counter, deque
from typing import TYPE_CHECKING, Any, Protocol

from softverbs.engine.memory import KeyTable
from softverbs.engine.rings import (
    CQE,
    CompletionRing,
    Route,
    SharedRecvRing,
    WorkRing,
)
from softverbs.enums import (
    IBV_QPS_ERR,
    IBV_QPS_RESET,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
    IBV_WC_SUCCESS,
    IBV_WC_WR_FLUSH_ERR,
)
from softverbs.wire.opcodes import OpInfo, Transport
from softverbs.wire.packet import Packet, new_packet, qp_sport

if TYPE_CHECKING:
    from softverbs.engine.congestion import CCConfig
    from softverbs.engine.hca import DeviceCounters
    from softverbs.engine.observe import Observer


class HCAPort(Protocol):
    """What a QP engine needs from its device."""

    keys: KeyTable
    counters: DeviceCounters
    # the hot counters (hca.HOT_COUNTERS), added to directly
    sent_pkts: int
    rcvd_pkts: int
    doorbells: int
    rdma_sends: int
    rdma_recvs: int
    ack_deferred: int
    observer: Observer | None
    cc: CCConfig

    @property
    def outbox(self) -> deque[Packet]: ...

    def queue(self, pkt: Packet) -> None: ...
    def schedule(self, qp: QPCore, deadline: float) -> None: ...
    def window_for(self, pmtu: int) -> int: ...
    def defer_ack(self, qp: QPCore) -> None: ...
    def post_event(self, event_type: int, element: Any) -> None: ...
    def cq_overrun(self, cq: CompletionRing) -> None: ...
    def find_srq(self, srqn: int) -> SharedRecvRing | None: ...
    def hold_tx(self, qp: QPCore) -> bool: ...


#: Atomics act on host-endian 64-bit words, as a NIC's DMA does on this host.
NATIVE = sys.byteorder

#: QP type -> BTH transport prefix.
TRANSPORT_OF: dict[int, Transport] = {
    IBV_QPT_RC: Transport.RC,
    IBV_QPT_UC: Transport.UC,
    IBV_QPT_UD: Transport.UD,
    IBV_QPT_XRC_SEND: Transport.XRC,
    IBV_QPT_XRC_RECV: Transport.XRC,
}

#: Unacknowledged packets a requester keeps in flight at most (a pacing window).  A
#: UDP device keeps fewer where its socket's receive buffer would overflow
#: (:meth:`HCA.window_for <softverbs.engine.hca.HCA.window_for>`).
DEFAULT_WINDOW = 1024
#: The smallest window a receive buffer makes: below it, a message crawls anyway.
MIN_WINDOW = 4
#: A long message asks for an ACK this many times per window, besides on its last
#: packet, so that an ACK is on its way back long before the window closes.
ACKS_PER_WINDOW = 4
_ACKS = ACKS_PER_WINDOW  # a C constant compiled (core.pxd): ack_every's divisor, per message


def ack_every(window: int) -> int:
    """Every how many packets a long message asks for an ACK, for this window."""
    return max(1, window // _ACKS)


#: What each QP counts of itself (``rdma statistic qp``), by rxe's device-wide names:
#: its packets (a burst counts each of its packets), then the rare events.
QP_COUNTERS = (
    "sent_pkts", "rcvd_pkts", "out_of_seq_request", "duplicate_request", "send_rnr_err",
    "rcvd_rnr_err", "rcvd_seq_err", "implied_nak_seq_err", "completer_retry_err",
    "local_ack_timeout_err", "rnr_retries", "retry_exceeded_err", "retry_rnr_exceeded_err",
    "rp_cnp_handled",
)  # fmt: skip


class QPCore:
    """Attributes, rings and device link of one QP (see module docstring)."""

    def __init__(
        self,
        hca: HCAPort,
        qpn: int,
        qp_type: int,
        pd: object,
        send_cq: CompletionRing | None,
        recv_cq: CompletionRing | None,
        sq: WorkRing | None,
        rq: WorkRing | None,
        srq: SharedRecvRing | None,
        sq_sig_all: bool,
        owner: Any = None,
    ) -> None:
        self.hca = hca
        self.qpn = qpn
        self.qp_type = qp_type
        self.transport = TRANSPORT_OF[qp_type]
        self.reliable = qp_type in (IBV_QPT_RC, IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV)
        # the type tests of every message and packet, made once (compiled, C flags
        # read in the struct rather than an IntEnum compared with a module global)
        self.is_ud = qp_type == IBV_QPT_UD
        self.is_xrc_send = qp_type == IBV_QPT_XRC_SEND
        self.is_xrc_recv = qp_type == IBV_QPT_XRC_RECV
        self.pd = pd
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.sq = sq
        self.rq = rq
        self.srq = srq
        self.sq_sig_all = sq_sig_all
        self.owner = owner  #: who holds it (the device's record), for async events
        self.xrcd: object = None
        self._state: int = IBV_QPS_RESET
        if sq is not None:
            sq.publish_state(IBV_QPS_RESET)
        # --- attributes set by modify ------------------------------------
        self.port = 1
        self.pkey_index = 0
        self.pkey = 0xFFFF
        self.qkey = 0
        self.access = 0  #: qp_access_flags: remote rights of the responder
        self.dest_qpn = 0
        self.route: Route | None = None
        self.pmtu = 1024
        self.sq_psn = 0
        self.rq_psn = 0
        self.timeout = 0
        self.retry_cnt = 7
        self.rnr_retry = 7
        self.min_rnr_timer = 0
        self.max_rd_atomic = 1
        self.max_dest_rd_atomic = 1
        self.en_sqd_async_notify = False
        self.sport = qp_sport(qpn)  #: rxe's; RC/UC get udp_sport() with their peer
        self.window = hca.window_for(self.pmtu)  #: set again with the path MTU
        self.comm_established = False
        #: stop the SQ in SQD after a transfer fails its signature check (mlx5dv
        #: MLX5DV_QP_CREATE_SIG_PIPELINING; see Requester.pump_sq)
        self.sig_pipelining = False
        #: IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: not a receiver of its own multicast sends
        self.block_self_mcast_lb = False
        self.last_error = ""  #: why the QP last left RTS by itself, in words
        self.cnp_sent_at = -1.0  #: when this QP last sent a CNP (DCQCN's notification point)
        self.timer_at: float | None = None  #: deadline of the live timer entry
        self.timer_token = 0
        # --- per-QP counters (QP_COUNTERS): one integer add per packet or burst on
        # the data path, the rare events in a Counter beside the device's
        self.sent_pkts = 0
        self.rcvd_pkts = 0
        self.rare_counts: Counter[str] = Counter()
        self._make_parts()

    def _make_parts(self) -> None:
        """The subclass's parts, made last by the constructor it inherits
        (QPEngine: its requester, completer and responder), so that the QP's
        constructor and its parameters are written once, here."""

    @property
    def state(self) -> int:
        return self._state

    @state.setter
    def state(self, value: int) -> None:
        """Every state change is published in the send ring's header, where the
        application's driver reads it (the device moves QPs to ERR by itself)."""
        old = self._state
        self._state = value
        if self.sq is not None:
            self.sq.publish_state(value)
        obs = self.hca.observer
        if obs is not None and old != value:
            obs.state(self, old, value)

    # --- device links -------------------------------------------------------
    def receive(self, pkt: Packet, info: OpInfo, now: float) -> None:
        """One packet (or burst) in: :class:`~softverbs.engine.qp.QPEngine`'s.
        Declared here so that the device, and a part splitting a burst, holding
        the QP as a QPCore call it by C call (core.pxd)."""
        raise NotImplementedError

    def send(self, pkt: Packet) -> None:
        self.sent_pkts += pkt.count
        self.hca.queue(pkt)
        obs = self.hca.observer
        if obs is not None:
            obs.packet_out(self, pkt)

    def count(self, name: str) -> None:
        """One rare event, counted on the device and on this QP."""
        self.hca.counters[name] += 1
        self.rare_counts[name] += 1

    def qp_counters(self) -> dict[str, int]:
        """This QP's counters (QP_COUNTERS, in order, zeros included)."""
        out = dict.fromkeys(QP_COUNTERS, 0)
        out.update(self.rare_counts)
        out["sent_pkts"] = self.sent_pkts
        out["rcvd_pkts"] = self.rcvd_pkts
        return out

    def arm(self, deadline: float) -> None:
        self.hca.schedule(self, deadline)

    def push_cqe(self, cq: CompletionRing | None, cqe: CQE) -> None:
        if cq is None:
            return
        if self.reliable and self.sq is not None and cqe.status not in (
            IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR,
        ):  # fmt: skip
            # An error completion of a reliable QP is followed by its move to ERR
            # (SEMANTICS 4): publish ERR first, so that an application that polls
            # the error CQE -- concurrently, in its own process -- then reads ERR.
            self.sq.publish_state(IBV_QPS_ERR)
        if cq.error:
            self.hca.counters["cqe_dropped_cq_error"] += 1
            return
        if not cq.push(cqe):
            self.hca.cq_overrun(cq)
            return
        obs = self.hca.observer
        if obs is not None:
            obs.cqe(self, cq, cqe)

    def new_request(self, opcode: int, psn: int, payload: Any = b"") -> Packet:
        """A request packet addressed to the connected peer."""
        pkt = new_packet(opcode, self.dest_qpn, psn, payload)
        self.address(pkt, self.route)
        return pkt

    def address(self, pkt: Packet, route: Route | None) -> None:
        pkt.pkey = self.pkey
        pkt.sqpn = self.qpn
        pkt.sport = self.sport
        if route is not None:
            pkt.sgid = route.sgid
            pkt.dgid = route.dgid
            pkt.hop_limit = route.hop_limit
            ect = self.hca.cc.ect  # DCQCN: ECN-capable, whatever the AH's ECN bits
            pkt.tclass = (route.tclass & 0xFC) | ect if ect else route.tclass
            pkt.flow_label = route.flow_label
        else:
            pkt.tclass = self.hca.cc.ect

    def reply(self, req: Packet, opcode: int, psn: int, payload: Any = b"") -> Packet:
        """A response packet back to the sender of ``req``."""
        pkt = new_packet(opcode, self.dest_qpn, psn, payload)
        pkt.pkey = self.pkey
        pkt.sqpn = self.qpn
        pkt.sport = self.sport or req.sport
        pkt.sgid = req.dgid
        pkt.dgid = req.sgid
        pkt.hop_limit = 64
        pkt.tclass = self.hca.cc.ect
        return pkt

    def success(self, cqe: CQE) -> bool:
        return cqe.status == IBV_WC_SUCCESS
