"""Requester and completer: send WQEs in, request packets out, CQEs in order.

Life of a send WQE
------------------
Its :class:`~.rings.WqeState` moves as :data:`~.rings.WQE_MOVES` allows:

1. *Posted*: the driver writes it into the SQ ring; the doorbell moves
   ``sq.db`` past it, and the device fetches it (``QUEUED``).  A cancel
   (``mlx5dv_qp_cancel_posted_send_wrs``) may turn it into a NOP
   (``CANCELLED``) until it starts.
2. *Started* (:meth:`Requester.pump_sq`; ``ACTIVE``): taken from the ring in
   order, its local memory resolved and given a PSN range -- one PSN per
   packet, or per expected response packet for an RDMA READ.  A fenced WQE
   waits for every earlier READ and atomic; READs and atomics wait while
   ``max_rd_atomic`` of them are outstanding; nothing starts in SQD, or
   while a failed WQE waits to reach the head of the queue.  With signature
   pipelining, a transfer whose data failed a signature check (the key
   table's ``integrity_errors`` rose while it gathered or scattered) makes
   the QP stop itself in SQD before the next fenced WQE.  A cancelled WQE
   starts as a NOP and is ``DONE`` at once; so is a local operation.
3. *Transmitted*: packets go out while fewer than ``window`` PSNs are
   unacknowledged, as bursts (:mod:`softverbs.wire.packet`: segmentation
   offload).  The last packet of a message, and every
   :func:`~.core.ack_every`-th packet (a quarter window), asks for an ACK.  A
   long RDMA READ is asked for in pieces of at most ``window`` responses.
4. *Acknowledged* (:class:`Completer`; ``DONE``): ACKs are cumulative.  READ
   and atomic WQEs are done when their responses arrive; an ACK beyond an
   unanswered READ means its responses were lost, and the READ is retried
   (an implied NAK).  UC and UD WQEs are done when sent.
5. *Completed* (:meth:`Completer.complete`): strictly in posting order; a
   CQE is written if the WQE was signaled or ``FAILED``.  A failed WQE moves
   an RC QP to ERR and a UC/UD QP to SQE; the QP state machine then flushes
   the rest.

Recovery is go-back-N: on a PSN-sequence NAK, on an ACK timeout, or at the
end of an RNR back-off, transmission restarts from the first missing PSN.
Timeouts and sequence NAKs spend ``retry_cnt``; RNR NAKs spend
``rnr_retry`` (7 = forever).  Any forward progress refills both.

How much may be in flight, and when a packet may leave, is the congestion
control's to say (:mod:`.congestion`): a per-QP object the requester owns
(``Requester.cc``) and asks before it starts or transmits anything
(``window``, ``can_send``), tells what it sent (``on_packet_sent``), and
that the completer feeds (``on_ack``, ``on_loss``).  The default, a slow
restart, halves the usable window on a loss and gives it back as packets are
acknowledged; DCQCN paces by rate instead.  A paced requester that may not
send yet arms the QP's timer for the moment it may (``paced_until``).

The :class:`Requester` owns what starting needs: the next WQE and PSN, the
count of outstanding READs and atomics, the SQ's flow (:class:`SqFlow`).
The :class:`Completer` owns what finishing needs: the started WQEs in
order, the oldest unacknowledged PSN, the retry budgets and the timers.
"""

from __future__ import annotations

import sys
from collections import deque
from enum import IntEnum
from typing import TYPE_CHECKING

from softverbs.engine import psn as P
from softverbs.engine.core import ack_every
from softverbs.engine.observe import SQ
from softverbs.engine.rings import CQE, WQE_MOVES, WR_DRIVER1, SendWQE, WqeState, scatter
from softverbs.enums import (
    IBV_QPS_ERR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
    IBV_QPT_UD,
    IBV_QPT_XRC_SEND,
    IBV_WC_BIND_MW,
    IBV_WC_COMP_SWAP,
    IBV_WC_FETCH_ADD,
    IBV_WC_LOC_LEN_ERR,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_LOC_QP_OP_ERR,
    IBV_WC_LOCAL_INV,
    IBV_WC_MW_BIND_ERR,
    IBV_WC_RDMA_READ,
    IBV_WC_RDMA_WRITE,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_REM_INV_RD_REQ_ERR,
    IBV_WC_REM_INV_REQ_ERR,
    IBV_WC_REM_OP_ERR,
    IBV_WC_RETRY_EXC_ERR,
    IBV_WC_RNR_RETRY_EXC_ERR,
    IBV_WC_SEND,
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_BIND_MW,
    IBV_WR_LOCAL_INV,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_RDMA_WRITE_WITH_IMM,
    IBV_WR_SEND,
    IBV_WR_SEND_WITH_IMM,
    IBV_WR_SEND_WITH_INV,
)
from softverbs.wire.opcodes import (
    AETH_ACK,
    AETH_NAK,
    AETH_RNR_NAK,
    NAK_INVALID_RD_REQUEST,
    NAK_INVALID_REQUEST,
    NAK_PSN_SEQUENCE_ERROR,
    NAK_REMOTE_ACCESS_ERROR,
    NAK_REMOTE_OPERATIONAL_ERROR,
    OPINFO,
    Kind,
    Op,
    OpInfo,
    Transport,
    aeth_kind,
    aeth_value,
)
from softverbs.wire.packet import Burst, Packet, burst

if TYPE_CHECKING:
    from softverbs.engine.congestion import CongestionControl
    from softverbs.engine.qp import QPEngine

#: Atomics act on host-endian 64-bit words, as a NIC's DMA does on this host.
NATIVE = sys.byteorder


class WrClass(IntEnum):
    """How the requester executes a WR opcode."""

    SEND = 0
    WRITE = 1
    READ = 2
    ATOMIC = 3
    LOCAL = 4  #: executed inside the device: LOCAL_INV, BIND_MW


class WrInfo:
    """Static facts about one ``ibv_wr_opcode``."""

    __slots__ = ("imm", "inv", "klass", "wc_opcode")

    def __init__(self, klass: WrClass, wc_opcode: int, imm: bool = False, inv: bool = False):
        self.klass = klass
        self.wc_opcode = wc_opcode
        self.imm = imm
        self.inv = inv


#: verbs.h IBV_WC_DRIVER1: the completion of a provider's own local WQE
#: (IBV_WR_DRIVER1, executed through ``SendWQE.local_op``).  pyverbs exposes neither.
WC_DRIVER1 = 135

#: ibv_wr_opcode -> how to execute it and which WC opcode reports it.
WR_INFO: dict[int, WrInfo] = {
    IBV_WR_SEND: WrInfo(WrClass.SEND, IBV_WC_SEND),
    IBV_WR_SEND_WITH_IMM: WrInfo(WrClass.SEND, IBV_WC_SEND, imm=True),
    IBV_WR_SEND_WITH_INV: WrInfo(WrClass.SEND, IBV_WC_SEND, inv=True),
    IBV_WR_RDMA_WRITE: WrInfo(WrClass.WRITE, IBV_WC_RDMA_WRITE),
    IBV_WR_RDMA_WRITE_WITH_IMM: WrInfo(WrClass.WRITE, IBV_WC_RDMA_WRITE, imm=True),
    IBV_WR_RDMA_READ: WrInfo(WrClass.READ, IBV_WC_RDMA_READ),
    IBV_WR_ATOMIC_CMP_AND_SWP: WrInfo(WrClass.ATOMIC, IBV_WC_COMP_SWAP),
    IBV_WR_ATOMIC_FETCH_AND_ADD: WrInfo(WrClass.ATOMIC, IBV_WC_FETCH_ADD),
    IBV_WR_LOCAL_INV: WrInfo(WrClass.LOCAL, IBV_WC_LOCAL_INV),
    IBV_WR_BIND_MW: WrInfo(WrClass.LOCAL, IBV_WC_BIND_MW),
    WR_DRIVER1: WrInfo(WrClass.LOCAL, WC_DRIVER1),
}

# (class, imm, inv) -> operations for (FIRST, MIDDLE, LAST, ONLY)
_MSG_OPS: dict[tuple[WrClass, bool, bool], tuple[Op, Op, Op, Op]] = {
    (WrClass.SEND, False, False): (Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_ONLY),
    (WrClass.SEND, True, False): (
        Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST_WITH_IMMEDIATE, Op.SEND_ONLY_WITH_IMMEDIATE,
    ),
    (WrClass.SEND, False, True): (
        Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST_WITH_INVALIDATE, Op.SEND_ONLY_WITH_INVALIDATE,
    ),
    (WrClass.WRITE, False, False): (
        Op.RDMA_WRITE_FIRST, Op.RDMA_WRITE_MIDDLE, Op.RDMA_WRITE_LAST, Op.RDMA_WRITE_ONLY,
    ),
    (WrClass.WRITE, True, False): (
        Op.RDMA_WRITE_FIRST, Op.RDMA_WRITE_MIDDLE, Op.RDMA_WRITE_LAST_WITH_IMMEDIATE,
        Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    ),
}  # fmt: skip

#: NAK code -> the requester's WC status.
NAK_STATUS: dict[int, int] = {
    NAK_INVALID_REQUEST: IBV_WC_REM_INV_REQ_ERR,
    NAK_REMOTE_ACCESS_ERROR: IBV_WC_REM_ACCESS_ERR,
    NAK_REMOTE_OPERATIONAL_ERROR: IBV_WC_REM_OP_ERR,
    NAK_INVALID_RD_REQUEST: IBV_WC_REM_INV_RD_REQ_ERR,
}

NAK_REASON: dict[int, str] = {
    NAK_INVALID_REQUEST: "the responder NAKed the request as invalid",
    NAK_REMOTE_ACCESS_ERROR: "the responder NAKed a remote access error",
    NAK_REMOTE_OPERATIONAL_ERROR: "the responder NAKed a remote operational error",
    NAK_INVALID_RD_REQUEST: "the responder NAKed an invalid RD request",
}


def _msg_opcodes(transport: Transport, klass: WrClass, imm: bool,
                 inv: bool) -> tuple[int, int, int, int]:  # fmt: skip
    first, middle, last, only = _MSG_OPS[(klass, imm, inv)]
    return transport | first, transport | middle, transport | last, transport | only


class SigStop(IntEnum):
    """Signature pipelining (MLX5DV_QP_CREATE_SIG_PIPELINING): where the SQ is."""

    NONE = 0
    PENDING = 1  #: a transfer failed its signature check: stop before the next fence
    STOPPED = 2  #: stopped in SQD for it: post SQ_DRAINED once the started WQEs are done


def _move(wqe: SendWQE, new: WqeState) -> None:
    """Move ``wqe`` along :data:`~.rings.WQE_MOVES` (checked in debug runs)."""
    assert new in WQE_MOVES[wqe.state], f"WQE {wqe.wr_id}: {wqe.state.name} -> {new.name}"
    wqe.state = new


def _finished(wqe: SendWQE) -> bool:
    return wqe.state >= WqeState.CANCELLED


def _pending(wqe: SendWQE) -> bool:
    """Started, with packets still to send."""
    return wqe.state == WqeState.ACTIVE and wqe.tx < wqe.npkts


class Requester:
    """The send side of a QP: starts WQEs and sends their requests."""

    def __init__(self, qp: QPEngine) -> None:
        self.qp = qp
        self.comp: Completer  # set by the QP engine
        self.cancelled: list[tuple[int, int]] = []  #: (posted below, wr_id) turned into NOPs
        self.reset()

    def reset(self) -> None:
        """Forget all progress (RESET)."""
        sq = self.qp.sq
        self.sq_next = sq.db if sq is not None else 0  #: next WQE to start
        self.npsn = self.qp.sq_psn  #: PSN of the next new request packet
        self.rd_out = 0  #: outstanding RDMA READs and atomics
        self.blocked = False  #: a failed WQE waits to reach the head: start nothing
        self.draining = False  #: SQD: the started WQEs are finishing
        self.sig = SigStop.NONE
        self.cancelled = []
        #: the congestion control (a fresh one of the device's kind at every RESET)
        self.cc: CongestionControl = self.qp.hca.cc.new(self.qp.window)
        self.paced_until: float | None = None  #: the pacing wake-up the QP's timer waits for
        self.reported_rate = self.cc.rate()  #: the rate an observer last heard of
        self.sent_end = self.npsn  #: the PSN after the highest request packet ever sent
        self.resent_pkts = 0  #: request packets sent again (go-back-N)

    # --- entry points -------------------------------------------------------
    def doorbell(self, now: float) -> None:
        """The driver advanced ``sq.db``: fetch the new WQEs, then run."""
        qp = self.qp
        qp.hca.counters["doorbells"] += 1
        self.fetch_sq()
        obs = qp.hca.observer
        if obs is not None and qp.sq is not None:
            obs.doorbell(qp, SQ, qp.sq.db)
        if qp.state in (IBV_QPS_ERR, IBV_QPS_SQE):
            self.flush_sq()
            return
        self.pump_sq(now)

    def pump_sq(self, now: float) -> None:
        """Transmit what the window allows and start what may start."""
        qp = self.qp
        sq = qp.sq
        comp = self.comp
        if sq is None or qp.state not in (IBV_QPS_RTS, IBV_QPS_SQD) or comp.rnr_until is not None:
            return
        held = False  #: a WQE has packets left to send: later PSNs must wait for them
        cc = self.cc
        for wqe in comp.inflight:
            if _pending(wqe) and (not self._may_send(now) or not self._transmit(wqe, now)):
                held = True
                break
        while not held and self.sq_next < sq.db and qp.state == IBV_QPS_RTS and not self.blocked:
            wqe = sq.get(self.sq_next)
            info = WR_INFO[wqe.opcode]
            rd = info.klass in (WrClass.READ, WrClass.ATOMIC)
            if wqe.fence and self.sig is SigStop.PENDING:
                self._sig_stop()  # never past a fence after a signature error
                break
            if wqe.fence and self.rd_out:
                break
            if rd and self.rd_out >= max(1, qp.max_rd_atomic):
                break
            if qp.reliable and P.diff(self.npsn, comp.una) >= cc.window(qp.window):
                break
            if not self._may_send(now):
                break
            self.sq_next += 1
            self._start(wqe, info, now)
            held = _pending(wqe)  # a window-bound message, a long READ
        if self.sig is SigStop.PENDING and qp.state == IBV_QPS_RTS and self.sq_next >= sq.db:
            self._sig_stop()  # nothing more to start: stop here
        comp.complete(now)
        if qp.state == IBV_QPS_SQD and self.draining:
            self._check_drained()

    def _may_send(self, now: float) -> bool:
        """Whether the congestion control lets a packet leave now; if not, the
        QP's timer is armed for when it will (or, if the link paused the
        transmitter, it is woken when it resumes)."""
        if self.qp.hca.hold_tx(self.qp):
            return False
        cc = self.cc
        if cc.can_send(now):
            return True
        wake = cc.next_send_time()
        if wake is not None and self.paced_until != wake:
            self.paced_until = wake
            self.qp.arm(wake)
        return False

    # --- starting and transmitting ------------------------------------------
    def _start(self, wqe: SendWQE, info: WrInfo, now: float) -> None:
        """Resolve the WQE's memory, give it its PSNs, transmit what may go."""
        qp = self.qp
        obs = qp.hca.observer
        klass = info.klass
        inflight = self.comp.inflight
        if klass is WrClass.LOCAL or wqe.state == WqeState.CANCELLED:
            if wqe.state == WqeState.QUEUED:  # a NOP (cancelled) has nothing to do
                self._execute_local(wqe)
                if wqe.state == WqeState.QUEUED:
                    _move(wqe, WqeState.DONE)
            inflight.append(wqe)
            if obs is not None:
                obs.wqe_start(qp, wqe)
            return
        keys = qp.hca.keys
        seen = keys.integrity_errors
        error = self._resolve(wqe, klass)
        if keys.integrity_errors != seen:
            self._sig_failed()  # gathering through a signature key found a bad block
        if error is not None:
            inflight.append(wqe)
            if obs is not None:
                obs.wqe_start(qp, wqe)
            return
        _move(wqe, WqeState.ACTIVE)
        npkts = 1 if klass is WrClass.ATOMIC else max(1, -(-wqe.length // qp.pmtu))
        wqe.npkts = npkts
        wqe.psn = self.npsn
        self.npsn = P.add(self.npsn, npkts)
        if klass in (WrClass.READ, WrClass.ATOMIC):
            self.rd_out += 1
        inflight.append(wqe)
        if obs is not None:
            obs.wqe_start(qp, wqe)
        self._transmit(wqe, now)

    def _resolve(self, wqe: SendWQE, klass: WrClass) -> int | None:
        """Resolve local memory; on failure mark the WQE failed (returns status)."""
        qp = self.qp
        keys = qp.hca.keys
        if klass in (WrClass.SEND, WrClass.WRITE):
            if wqe.inline is not None:
                wqe.data = wqe.inline
            else:
                views: list[memoryview] = []
                for addr, length, lkey in wqe.sges:
                    v = keys.local(lkey, qp.pd, addr, length, False)
                    if isinstance(v, str):
                        return self.fail(wqe, IBV_WC_LOC_PROT_ERR, v)
                    views.append(v)
                wqe.data = views[0] if len(views) == 1 else b"".join(views)
            if qp.qp_type == IBV_QPT_UD and wqe.length > qp.pmtu:
                return self.fail(
                    wqe, IBV_WC_LOC_LEN_ERR,
                    f"a UD message of {wqe.length} bytes exceeds the path MTU {qp.pmtu}",
                )  # fmt: skip
            return None
        views = []
        for addr, length, lkey in wqe.sges:
            v = keys.local(lkey, qp.pd, addr, length, True)
            if isinstance(v, str):
                return self.fail(wqe, IBV_WC_LOC_PROT_ERR, v)
            views.append(v)
        if klass is WrClass.ATOMIC:
            if wqe.length < 8:
                return self.fail(wqe, IBV_WC_LOC_LEN_ERR, "an atomic needs an 8-byte local buffer")
            views = [views[0][:8]] if len(views[0]) >= 8 else views
        wqe.data = views
        return None

    def fail(self, wqe: SendWQE, status: int, reason: str) -> int:
        """``wqe`` failed: it completes in error when it reaches the head, and
        nothing starts until then (returns ``status``)."""
        _move(wqe, WqeState.FAILED)
        wqe.status = status
        wqe.reason = reason
        self.blocked = True
        return status

    def _execute_local(self, wqe: SendWQE) -> None:
        qp = self.qp
        keys = qp.hca.keys
        if wqe.local_op is not None:
            err = wqe.local_op()
            if err is not None:
                self.fail(wqe, IBV_WC_LOC_PROT_ERR, err)
        elif wqe.opcode == WR_DRIVER1:  # also what a WQE the device could not fetch becomes
            self.fail(wqe, IBV_WC_LOC_QP_OP_ERR, wqe.reason or "a driver WQE without an operation")
        elif wqe.opcode == IBV_WR_LOCAL_INV:
            err = keys.invalidate(wqe.inv_rkey, qp.pd)
            if err is not None:
                self.fail(wqe, IBV_WC_LOC_QP_OP_ERR, err)
        else:
            assert wqe.bind is not None
            mw, mr, new_key, addr, length, access = wqe.bind
            err = keys.bind(mw, mr, new_key, addr, length, access, qp.qpn, qp.pd)
            if err is not None:
                self.fail(wqe, IBV_WC_MW_BIND_ERR, err)

    def _transmit(self, wqe: SendWQE, now: float) -> bool:
        """Send this WQE's pending packets; False if the window closed."""
        qp = self.qp
        info = WR_INFO[wqe.opcode]
        klass = info.klass
        asked_all = True
        if klass is WrClass.READ:
            asked_all = self._send_read(wqe)
        elif klass is WrClass.ATOMIC:
            self._send_atomic(wqe)
        else:
            asked_all = self._send_message(wqe, info, now)
        if qp.reliable:
            self.comp.arm_ack_timer(now)
        else:
            _move(wqe, WqeState.DONE)  # UC, UD: done once sent
        return asked_all

    def _send_message(self, wqe: SendWQE, info: WrInfo, now: float) -> bool:
        """Send the message's pending packets as bursts (segmentation offload:
        one object for as many packets as the window allows); False if the
        window closed before the last one."""
        qp = self.qp
        n = wqe.npkts
        i = wqe.tx
        if i >= n:
            return True
        psn = P.add(wqe.psn, i)
        count = n - i
        ack = 0
        cc = self.cc
        if qp.reliable:
            window = cc.window(qp.window)
            room = window - P.diff(psn, self.comp.una)
            if room <= 0:
                return False
            count = min(count, room)
            ack = ack_every(window)
        pmtu = qp.pmtu
        quantum = cc.quantum(pmtu)
        if quantum:
            count = min(count, quantum)
        data = wqe.data
        payload = data if n == 1 else data[i * pmtu : (i + count) * pmtu]
        if qp.qp_type == IBV_QPT_UD:
            pkt = Packet(0, wqe.remote_qpn, psn, payload)
            qp.address(pkt, wqe.route)
            qkey = wqe.remote_qkey
            pkt.qkey = qp.qkey if qkey & 0x80000000 else qkey
            pkt.src_qp = qp.qpn
        else:
            pkt = qp.new_request(0, psn, payload)
        if qp.qp_type == IBV_QPT_XRC_SEND:
            pkt.srqn = wqe.xrc_srqn
        if info.klass is WrClass.WRITE:
            pkt.va = wqe.remote_addr
            pkt.rkey = wqe.rkey
            pkt.dma_len = wqe.length
        pkt.imm = wqe.imm
        pkt.inv_rkey = wqe.inv_rkey
        pkt.se = wqe.se
        ops = _msg_opcodes(qp.transport, info.klass, info.imm, info.inv)
        qp.send(burst(pkt, ops, i, count, n, pmtu, ack))
        again = P.diff(self.sent_end, psn)
        if again > 0:
            self.resent_pkts += min(again, count)
        if again < count:
            self.sent_end = P.add(psn, count)
        cc.on_packet_sent(min(wqe.length, (i + count) * pmtu) - i * pmtu, count, now)
        wqe.tx = i + count
        if quantum:
            if wqe.tx < n:
                self._may_send(now)  # paced: arm the wake-up for the rest
            obs = qp.hca.observer
            if obs is not None and cc.rate() != self.reported_rate:
                self.reported_rate = cc.rate()
                obs.rate(qp, self.reported_rate or 0.0, "increase")
        return wqe.tx >= n

    def _send_read(self, wqe: SendWQE) -> bool:
        """Ask for the READ's responses from the first missing one; True once all are asked.

        The responses are paced like requests: one READ request asks for at most
        ``window`` of them, up to the end of a ``window``-aligned piece of the READ,
        and the next piece is asked for when this one has arrived.  (A single request
        for a long READ makes the responder send it all at once, which overruns the
        receiver's socket buffer; every retry then sent the whole rest again.)  The
        later WQEs wait meanwhile, as their PSNs follow the READ's.  A piece asked
        again after a loss ends where the piece did, so the responder finds it in
        its replay cache.
        """
        if wqe.tx > wqe.rxd:
            return wqe.tx >= wqe.npkts  # a piece is outstanding: wait for its responses
        qp = self.qp
        piece = max(1, qp.window)
        start = wqe.rxd
        end = min(wqe.npkts, (start // piece + 1) * piece)
        done = start * qp.pmtu
        pkt = qp.new_request(qp.transport | Op.RDMA_READ_REQUEST, P.add(wqe.psn, start))
        if qp.qp_type == IBV_QPT_XRC_SEND:
            pkt.srqn = wqe.xrc_srqn
        pkt.va = wqe.remote_addr + done
        pkt.rkey = wqe.rkey
        pkt.dma_len = min(wqe.length, end * qp.pmtu) - done
        pkt.ackreq = True
        qp.send(pkt)
        wqe.tx = end
        return end >= wqe.npkts

    def _send_atomic(self, wqe: SendWQE) -> None:
        qp = self.qp
        op = Op.COMPARE_SWAP if wqe.opcode == IBV_WR_ATOMIC_CMP_AND_SWP else Op.FETCH_ADD
        pkt = qp.new_request(qp.transport | op, wqe.psn)
        if qp.qp_type == IBV_QPT_XRC_SEND:
            pkt.srqn = wqe.xrc_srqn
        pkt.va = wqe.remote_addr
        pkt.rkey = wqe.rkey
        pkt.swap_add = wqe.compare_add if op == Op.FETCH_ADD else wqe.swap
        pkt.compare = wqe.compare_add if op == Op.COMPARE_SWAP else 0
        pkt.ackreq = True
        qp.send(pkt)
        wqe.tx = 1

    def _check_drained(self) -> None:
        qp = self.qp
        if not self.comp.inflight:
            self.draining = False
            if qp.en_sqd_async_notify or self.sig is SigStop.STOPPED:
                from softverbs.enums import IBV_EVENT_SQ_DRAINED

                self.sig = SigStop.NONE
                qp.hca.post_event(IBV_EVENT_SQ_DRAINED, qp)

    # --- signature pipelining (mlx5dv_qp_cancel_posted_send_wrs(3)) ---------------------
    def _sig_failed(self) -> None:
        """This QP's transfer failed a signature check: with pipelining, stop the
        SQ before the next fenced WQE (pump_sq), or once nothing is left to start."""
        if self.qp.sig_pipelining:
            self.sig = SigStop.PENDING

    def _sig_stop(self) -> None:
        """Move to SQD by ourselves; SQ_DRAINED follows when the started WQEs are done."""
        qp = self.qp
        self.sig = SigStop.STOPPED
        qp.state = IBV_QPS_SQD
        self.draining = True
        qp.hca.counters["sig_pipelining_stops"] += 1
        qp.last_error = (
            "a transfer failed its signature check: the send queue stopped in SQD "
            "(signature pipelining); check the mkeys, cancel the responses, move to RTS"
        )

    def cancel_posted(self, wr_id: int) -> int:
        """Turn every posted, not yet started send WQE with ``wr_id`` into a NOP.

        A NOP completes successfully in order (with a CQE if it was signaled), or
        is flushed if the QP goes to ERR.  Returns how many were turned."""
        sq = self.qp.sq
        if sq is None:
            return 0
        n = 0
        for index in range(self.sq_next, sq.db):
            wqe: SendWQE = sq.get(index)
            if wqe.wr_id == wr_id:
                _cancel(wqe)
                n += 1
        # WQEs posted but not yet rung are still the application's: count them,
        # and turn them when the device fetches them.
        end = sq.posted()
        n += sum(1 for index in range(sq.db, end) if sq.peek_wr_id(index) == wr_id)
        if end > sq.db:
            self.cancelled.append((end, wr_id))
        return n

    def fetch_sq(self, everything: bool = False) -> None:
        """Fetch what the doorbell (or, with ``everything``, the posting) covers,
        and turn the WQEs that a cancel named before they were fetched."""
        sq = self.qp.sq
        if sq is None:
            return
        first = sq.db
        sq.latch(everything)
        if self.cancelled:
            for index in range(first, sq.db):
                wqe: SendWQE = sq.get(index)
                if any(index < below and wqe.wr_id == wr_id for below, wr_id in self.cancelled):
                    _cancel(wqe)
            self.cancelled = [c for c in self.cancelled if c[0] > sq.db]

    # --- flushing ------------------------------------------------------------------
    def flush_sq(self) -> None:
        """Complete every started and doorbelled WQE with WR_FLUSH_ERR, in order."""
        from softverbs.enums import IBV_WC_WR_FLUSH_ERR

        qp = self.qp
        sq = qp.sq
        if sq is None:
            return
        comp = self.comp
        pending: list[SendWQE] = list(comp.inflight)
        comp.inflight.clear()
        while self.sq_next < sq.db:
            pending.append(sq.get(self.sq_next))
            self.sq_next += 1
        for wqe in pending:
            info = WR_INFO[wqe.opcode]
            cqe = CQE(wqe.wr_id, IBV_WC_WR_FLUSH_ERR, info.wc_opcode, qp.qpn)
            cqe.reason = "flushed: the QP is in the error state"
            cqe.wq_kind, cqe.wq_handle = sq.tag
            cqe.index = wqe.index
            qp.push_cqe(qp.send_cq, cqe)
        self.rd_out = 0
        self.blocked = False
        comp.stop_timers()


def _cancel(wqe: SendWQE) -> None:
    """Turn a WQE that has not started into a NOP (again: no change)."""
    if wqe.state == WqeState.QUEUED:
        _move(wqe, WqeState.CANCELLED)
        wqe.length = 0


class Completer:
    """Finishes what the requester started: acknowledgements, responses,
    retransmission and the send CQEs, in posting order."""

    def __init__(self, qp: QPEngine) -> None:
        self.qp = qp
        self.req: Requester  # set by the QP engine
        self.inflight: deque[SendWQE] = deque()  #: started WQEs, in posting order
        self.reset()

    def reset(self) -> None:
        """Forget all progress (RESET)."""
        qp = self.qp
        self.inflight.clear()
        self.una = qp.sq_psn  #: oldest unacknowledged PSN
        self.retry_left = qp.retry_cnt
        self.rnr_left = qp.rnr_retry
        self.deadline: float | None = None  #: the ACK timer
        self.rnr_until: float | None = None  #: the end of an RNR back-off
        self.rnr_psn = 0
        self.resending = False  #: a go-back-N episode is under way: spend no more retries

    def next_deadline(self) -> float | None:
        if self.rnr_until is not None:
            return self.rnr_until
        return self.deadline

    def stop_timers(self) -> None:
        self.deadline = None
        self.rnr_until = None

    def arm_ack_timer(self, now: float) -> None:
        """Start the ACK timer if it is not running.  Armed even when the window
        closed part-way: a retransmission clears the deadline, and if it fills the
        window and is lost again, this timer is all that is left to notice (the
        responder NAKs a gap only once)."""
        if self.deadline is None:
            timeout = P.ack_timeout_s(self.qp.timeout)
            if timeout is not None:
                self.deadline = now + timeout
                self.qp.arm(self.deadline)

    # --- responses --------------------------------------------------------------
    def on_response(self, pkt: Packet, info: OpInfo, now: float) -> None:
        qp = self.qp
        if qp.state not in (IBV_QPS_RTS, IBV_QPS_SQD) or not self.inflight:
            qp.hca.counters["drop_unexpected_response"] += pkt.count
            return
        if pkt.count > 1:  # a burst of READ responses
            if not self._read_burst(pkt, now):  # type: ignore[arg-type]
                for seg in pkt.segments():  # one by one, exactly as sent singly
                    qp.receive(seg, OPINFO[seg.opcode], now)  # type: ignore[arg-type]
                return
        elif not self._response(pkt, info, now):
            return
        self.complete(now)
        self.req.pump_sq(now)

    def _read_burst(self, b: Burst, now: float) -> bool:
        """Take a whole burst of READ responses in one step -- when it is the
        answer the READ waits for next, continuing where it is, ending where
        its piece ends, with nothing unanswered before it; False, before any
        side effect, for anything else (the packets then go one by one)."""
        qp = self.qp
        wqe = self._find(b.psn)
        if wqe is None or WR_INFO[wqe.opcode].klass is not WrClass.READ or _finished(wqe):
            return False
        pmtu = qp.pmtu
        count = b.count
        expected = P.add(wqe.psn, wqe.rxd)
        piece = max(1, qp.window)
        end = min(wqe.npkts, (wqe.rxd // piece + 1) * piece)
        final = end == wqe.npkts
        size = len(b.payload)
        if (b.psn != expected or self.una != expected or b.seg != pmtu
                or b.first_index != 0 or count != b.msg_packets or wqe.rxd + count != end
                or size > count * pmtu or size <= (count - 1) * pmtu
                or (not final and size != count * pmtu)):  # fmt: skip
            return False
        keys = qp.hca.keys
        seen = keys.integrity_errors
        if not scatter(wqe.data, wqe.rxd * pmtu, b.payload, last=final):
            return False
        if keys.integrity_errors != seen:
            self.req._sig_failed()  # scattering into a signature key found a bad block
        wqe.rxd += count
        if final:
            _move(wqe, WqeState.DONE)
            self.req.rd_out -= 1
        self._progress(now, P.add(b.psn, count))
        return True

    def _response(self, pkt: Packet, info: OpInfo, now: float) -> bool:
        """One response packet; False if it was dropped at once."""
        counters = self.qp.hca.counters
        kind = info.kind
        if kind is Kind.ACK:
            k = aeth_kind(pkt.syndrome)
            if k == AETH_ACK:
                if P.diff(pkt.psn, self.una) < 0:
                    # Acknowledges nothing new (say, the re-ACK of a duplicate request).
                    counters["duplicate_response"] += 1
                elif P.diff(pkt.psn, self.req.npsn) >= 0:
                    counters["drop_unexpected_response"] += 1  # a PSN never sent
                    return False
                self._acked(pkt.psn, now)
            elif k == AETH_RNR_NAK:
                self._rnr_nak(pkt, now)
            elif k == AETH_NAK:
                self._nak(pkt, now)
            else:
                counters["drop_bad_aeth"] += 1
                return False
        elif kind is Kind.READ_RESP:
            self._read_response(pkt, info, now)
        else:
            self._atomic_ack(pkt, now)
        return True

    def _find(self, psn: int) -> SendWQE | None:
        for wqe in self.inflight:
            if wqe.npkts and 0 <= P.diff(psn, wqe.psn) < wqe.npkts:
                return wqe
        return None

    def _acked(self, psn: int, now: float) -> None:
        """Cumulative acknowledgement of every PSN up to ``psn``."""
        if P.diff(psn, self.una) < 0 or P.diff(psn, self.req.npsn) >= 0:
            return  # old (duplicate) or for a PSN never sent
        for wqe in self.inflight:
            if _finished(wqe) or not wqe.npkts:
                continue
            if P.diff(wqe.psn, psn) > 0:
                break
            if WR_INFO[wqe.opcode].klass in (WrClass.READ, WrClass.ATOMIC):
                # The responder is past this READ/atomic but its response is
                # missing: an implied NAK (IBA 9.7.5.1.5; mlx5 counts it by this name).
                self.qp.count("implied_nak_seq_err")
                self._progress(now, P.add(wqe.psn, wqe.rxd))
                self._retry(now, P.add(wqe.psn, wqe.rxd), "implied NAK")
                return
            if P.diff(P.add(wqe.psn, wqe.npkts - 1), psn) <= 0:
                _move(wqe, WqeState.DONE)
            else:
                break
        self._progress(now, P.add(psn, 1))

    def _progress(self, now: float, una: int) -> None:
        """The peer acknowledged every PSN before ``una``."""
        if P.diff(una, self.una) <= 0:
            return
        qp = self.qp
        self.req.cc.on_ack(P.diff(una, self.una), now)
        self.una = una
        self.retry_left = qp.retry_cnt
        self.rnr_left = qp.rnr_retry
        self.resending = False
        if P.diff(self.req.npsn, una) > 0:
            timeout = P.ack_timeout_s(qp.timeout)
            self.deadline = None if timeout is None else now + timeout
            if self.deadline is not None:
                qp.arm(self.deadline)
        else:
            self.deadline = None

    def _rnr_nak(self, pkt: Packet, now: float) -> None:
        qp = self.qp
        qp.count("rcvd_rnr_err")
        psn = pkt.psn
        self._acked(P.add(psn, -1), now)
        wqe = self._find(psn)
        if wqe is None:
            return
        if self.rnr_left == 0:
            qp.count("retry_rnr_exceeded_err")
            self._fail_remote(
                wqe, IBV_WC_RNR_RETRY_EXC_ERR,
                f"the responder had no receive WQE; rnr_retry={qp.rnr_retry} retries exhausted",
            )  # fmt: skip
            return
        if qp.rnr_retry != P.RNR_RETRY_INFINITE:
            self.rnr_left -= 1
        self.rnr_psn = psn
        self.rnr_until = now + P.RNR_TIMER_S[aeth_value(pkt.syndrome)]
        self.deadline = None
        qp.arm(self.rnr_until)

    def _nak(self, pkt: Packet, now: float) -> None:
        counters = self.qp.hca.counters
        code = aeth_value(pkt.syndrome)
        psn = pkt.psn
        if P.diff(psn, self.una) < 0 or P.diff(psn, self.req.npsn) >= 0:
            # A NAK names an unacknowledged PSN.  Any other is stale or bogus, and
            # going back to it would rewind nothing yet stop the retransmission timer.
            old = P.diff(psn, self.una) < 0
            counters["duplicate_response" if old else "drop_unexpected_response"] += 1
            return
        self._acked(P.add(psn, -1), now)
        if code == NAK_PSN_SEQUENCE_ERROR:
            self.qp.count("rcvd_seq_err")
            self._retry(now, psn, "PSN sequence error NAK")
            return
        wqe = self._find(psn)
        if wqe is None:
            counters["drop_unexpected_response"] += 1
            return
        status = NAK_STATUS.get(code, IBV_WC_REM_OP_ERR)
        self._fail_remote(wqe, status, NAK_REASON.get(code, f"NAK code {code}"))

    def _fail_remote(self, wqe: SendWQE, status: int, reason: str) -> None:
        if wqe.state == WqeState.ACTIVE:
            self.req.fail(wqe, status, reason)

    def _read_response(self, pkt: Packet, info: OpInfo, now: float) -> None:
        qp = self.qp
        counters = qp.hca.counters
        wqe = self._find(pkt.psn)
        if wqe is None or WR_INFO[wqe.opcode].klass is not WrClass.READ or _finished(wqe):
            counters["drop_unexpected_response"] += 1
            return
        expected = P.add(wqe.psn, wqe.rxd)
        if pkt.psn != expected:
            if P.diff(pkt.psn, expected) < 0:
                counters["duplicate_response"] += 1
            else:
                # Responses were lost.  The responder is past every PSN before this
                # one: that acknowledges earlier SENDs/WRITEs and retries from the
                # first unanswered READ/atomic, which may be an earlier WQE than this.
                self._acked(P.add(pkt.psn, -1), now)
            return
        # A READ is asked for in pieces (_send_read), and again from a middle PSN
        # after a loss; each answer starts with FIRST or ONLY, so FIRST is legal at any
        # PSN, but only the READ's first PSN must be FIRST, and LAST comes exactly at
        # the end of a piece.
        final = wqe.rxd == wqe.npkts - 1
        bad_first = wqe.rxd == 0 and not info.first
        if bad_first or info.last != (final or (wqe.rxd + 1) % max(1, qp.window) == 0):
            counters["drop_bad_read_response"] += 1
            return
        self._acked(P.add(wqe.psn, -1), now)
        if self.una != expected:
            # An earlier READ/atomic is still unanswered (_acked just retried it):
            # responses complete in PSN order, so this one must come again later.
            counters["drop_response_after_gap"] += 1
            return
        payload = pkt.payload
        pmtu = qp.pmtu
        if len(payload) > pmtu or (not final and len(payload) != pmtu):
            counters["drop_bad_read_response"] += 1
            return
        seen = qp.hca.keys.integrity_errors
        if not scatter(wqe.data, wqe.rxd * pmtu, payload, last=final):
            counters["drop_bad_read_response"] += 1
            return
        if qp.hca.keys.integrity_errors != seen:
            self.req._sig_failed()  # scattering into a signature key found a bad block
        wqe.rxd += 1
        if final:
            _move(wqe, WqeState.DONE)
            self.req.rd_out -= 1
        self._progress(now, P.add(pkt.psn, 1))

    def _atomic_ack(self, pkt: Packet, now: float) -> None:
        counters = self.qp.hca.counters
        wqe = self._find(pkt.psn)
        if wqe is None or WR_INFO[wqe.opcode].klass is not WrClass.ATOMIC or _finished(wqe):
            counters["drop_unexpected_response"] += 1
            return
        self._acked(P.add(wqe.psn, -1), now)
        if self.una != wqe.psn:  # an earlier READ/atomic is unanswered (see _read_response)
            counters["drop_response_after_gap"] += 1
            return
        view = wqe.data[0]
        view[:8] = pkt.orig.to_bytes(8, NATIVE)
        wqe.rxd = 1
        _move(wqe, WqeState.DONE)
        self.req.rd_out -= 1
        self._progress(now, P.add(pkt.psn, 1))

    # --- retransmission ---------------------------------------------------------
    def _retry(self, now: float, psn: int, why: str) -> None:
        """Go back to ``psn``, spending one ``retry_cnt`` once per episode."""
        if self.resending:
            return
        qp = self.qp
        if self.retry_left == 0:
            wqe = self._find(psn) or next((w for w in self.inflight if not _finished(w)), None)
            if wqe is not None:
                qp.count("retry_exceeded_err")
                self._fail_remote(
                    wqe, IBV_WC_RETRY_EXC_ERR,
                    f"{why}: retry_cnt={qp.retry_cnt} retries exhausted",
                )  # fmt: skip
            return
        self.retry_left -= 1
        self.resending = True
        self.req.cc.on_loss(now)
        qp.count("completer_retry_err")
        obs = qp.hca.observer
        if obs is not None:
            obs.retransmit(qp, psn, why)
        self.rewind(psn)
        self.deadline = None

    def rewind(self, psn: int) -> None:
        """Make every unacknowledged packet from ``psn`` on pending again."""
        for wqe in self.inflight:
            if _finished(wqe) or not wqe.npkts:
                continue
            end = P.diff(P.add(wqe.psn, wqe.npkts), psn)
            if end <= 0:
                continue  # entirely before psn
            if WR_INFO[wqe.opcode].klass in (WrClass.READ, WrClass.ATOMIC):
                wqe.tx = 0
            else:
                off = P.diff(psn, wqe.psn)
                wqe.tx = min(wqe.tx, max(0, off))
        # ``una`` is not moved here: only an acknowledgement may move it forward, and
        # ``psn`` can be past an unanswered READ (an RNR NAK behind it, say).

    def handle_timer(self, now: float) -> None:
        qp = self.qp
        if self.rnr_until is not None:
            if now < self.rnr_until:
                qp.arm(self.rnr_until)
                return
            self.rnr_until = None
            self.resending = False
            # An ACK during the back-off may have set an ACK deadline whose timer entry
            # was merged into this one: restart it with the retransmission, and arm it.
            self.deadline = None
            # Go back to the first unacknowledged PSN, not just to rnr_psn: a READ or
            # atomic before it whose response is missing (the RNR NAK implied its loss)
            # must go again too, or nothing is sent and no timer is left to notice.
            self.rewind(self.una)
            qp.count("rnr_retries")
            obs = qp.hca.observer
            if obs is not None:
                obs.retransmit(qp, self.una, "RNR back-off over")
            self.req.pump_sq(now)
            if self.deadline is not None:
                qp.arm(self.deadline)
            return
        if self.deadline is None:
            return
        if now < self.deadline:
            qp.arm(self.deadline)
            return
        self.deadline = None
        if not any(not _finished(w) and w.npkts for w in self.inflight):
            return
        qp.count("local_ack_timeout_err")
        self.resending = False
        self._retry(now, self.una, "local ACK timeout")
        self.resending = False
        self.complete(now)
        self.req.pump_sq(now)

    # --- completion -----------------------------------------------------------------
    def complete(self, now: float) -> None:
        """Write CQEs for the finished WQEs at the head, in posting order."""
        qp = self.qp
        inflight = self.inflight
        counters = qp.hca.counters
        obs = qp.hca.observer
        while inflight and _finished(inflight[0]):
            wqe = inflight.popleft()
            if obs is not None:
                obs.wqe_done(qp, wqe)
            ok = wqe.state != WqeState.FAILED
            info = WR_INFO[wqe.opcode]
            if wqe.state == WqeState.DONE and info.klass is WrClass.SEND:
                counters["rdma_sends"] += 1  # rxe: every completed SEND WQE
            if ok and not (wqe.signaled or qp.sq_sig_all):
                continue
            cqe = CQE(wqe.wr_id, wqe.status, info.wc_opcode, qp.qpn)
            if ok:
                cqe.byte_len = 8 if info.klass is WrClass.ATOMIC else wqe.length
            else:
                cqe.reason = wqe.reason
            cqe.wq_kind, cqe.wq_handle = qp.sq.tag  # type: ignore[union-attr]
            cqe.index = wqe.index
            qp.push_cqe(qp.send_cq, cqe)
            if not ok:
                counters["send_err" if qp.reliable else "send_queue_err"] += 1
                if qp.reliable:
                    qp.to_error(now)
                else:
                    qp.send_queue_error(now)
                return
