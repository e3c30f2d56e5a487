"""Requester: send WQEs in, request packets out.

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
4. *Acknowledged* (the completer, :mod:`.completer`; ``DONE``): ACKs
   are cumulative; READ and atomic WQEs are done when their responses
   arrive.  UC and UD WQEs are done when sent.
5. *Completed* (:meth:`.completer.Completer.complete`): strictly in posting
   order; a CQE is written if the WQE was signaled or ``FAILED``.

How much may be in flight, and when a packet may leave, is the congestion
control's to say (:mod:`.congestion`): a per-QP object the requester owns
(``Requester.cc``) and asks before it starts or transmits anything
(``window``, ``can_send``) and tells what it sent (``on_packet_sent``);
the completer feeds it only through the requester (:meth:`Requester.acked`
and :meth:`Requester.lost` call ``on_ack`` and ``on_loss``).  The default, a slow
restart, halves the usable window on a loss and gives it back as packets are
acknowledged; DCQCN paces by rate instead.  A paced requester that may not
send yet arms the QP's timer for the moment it may (``paced_until``).

The :class:`Requester` owns what starting needs: the next WQE and PSN, the
count of outstanding READs and atomics, the SQ's flow, the congestion
control.  It hands every WQE it starts to the completer
(:meth:`~.completer.Completer.track`), and asks of it only how many PSNs are
unacknowledged, whether it is idle or in an RNR back-off, and which WQEs are
started (their pending packets go first).  What the completer may ask or
tell it is the short list in :mod:`.completer`.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any

from softverbs.engine import psn as P
from softverbs.engine.core import ack_every
from softverbs.engine.observe import SQ
from softverbs.engine.rings import CQE, WR_DRIVER1, SendWQE, WqeState
from softverbs.engine.wr import WrClass, WrInfo, info_of, move, pending
from softverbs.enums import (
    IBV_QPS_ERR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
    IBV_WC_LOC_LEN_ERR,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_LOC_QP_OP_ERR,
    IBV_WC_MW_BIND_ERR,
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_LOCAL_INV,
)
from softverbs.wire.opcodes import Op
from softverbs.wire.packet import burst, new_packet

if TYPE_CHECKING:
    from softverbs.engine.completer import Completer
    from softverbs.engine.congestion import CongestionControl
    from softverbs.engine.qp import QPEngine
    from softverbs.engine.rings import WorkRing

class SigStop(IntEnum):
    """Signature pipelining (MLX5DV_QP_CREATE_SIG_PIPELINING): where the SQ is."""

    NONE = 0
    PENDING = 1  #: a transfer failed its signature check: stop before the next fence
    STOPPED = 2  #: stopped in SQD for it: post SQ_DRAINED once the started WQEs are done


# Enum members as module constants: a class attribute lookup of an enum member
# costs several times a global's, on the path of every WQE
_SIG_PENDING = SigStop.PENDING
_W_QUEUED = WqeState.QUEUED
_W_ACTIVE = WqeState.ACTIVE
_W_CANCELLED = WqeState.CANCELLED
_W_DONE = WqeState.DONE
_W_FAILED = WqeState.FAILED
_WR_SEND = WrClass.SEND
_WR_WRITE = WrClass.WRITE
_WR_READ = WrClass.READ
_WR_ATOMIC = WrClass.ATOMIC
_WR_LOCAL = WrClass.LOCAL
# The QP states the send queue's path compares with, read from ``qp._state``
# (the attribute behind the ``state`` property: a C struct read when compiled,
# where the property is a descriptor call)
_RTS = IBV_QPS_RTS
_SQD = IBV_QPS_SQD
_ERR = IBV_QPS_ERR
_SQE = IBV_QPS_SQE


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
        qp.hca.doorbells += 1
        self.fetch_sq()
        obs = qp.hca.observer
        if obs is not None and qp.sq is not None:
            obs.doorbell(qp, SQ, qp.sq.db)
        state: int = qp._state  # compiled, a C integer: the compares below are C compares
        if state in (_ERR, _SQE):
            self.flush_sq()
            return
        self.pump_sq(now)

    def pump_sq(self, now: float) -> None:
        """Transmit what the window allows and start what may start."""
        qp = self.qp
        sq = qp.sq
        comp = self.comp
        state: int = qp._state  # compiled, a C integer: the compares below are C compares
        if sq is None or (state != _RTS and state != _SQD) or comp.backing_off():
            return
        held = False  #: a WQE has packets left to send: later PSNs must wait for them
        cc = self.cc
        started = comp.started()
        for wqe in started if started else ():  # no iterator made for an empty queue
            if pending(wqe) and (not self._may_send(now) or not self._transmit(wqe, now)):
                held = True
                break
        while not held and self.sq_next < sq.seen_db and not self.blocked:
            state = qp._state  # the WQE started last may have moved the QP on
            if state != _RTS:
                break
            wqe = sq.get(self.sq_next)
            info = info_of(wqe.opcode)
            rd = info.rd
            if wqe.fence and self.sig is _SIG_PENDING:
                self._sig_stop()  # never past a fence after a signature error
                break
            if wqe.fence and self.rd_out:
                break
            if rd and self.rd_out >= max(1, qp.max_rd_atomic):
                break
            if qp.reliable and comp.unacked(self.npsn) >= cc.window(qp.window):
                break
            if not self._may_send(now):
                break
            self.sq_next += 1
            self._start(wqe, info, now)
            held = pending(wqe)  # a window-bound message, a long READ
        if self.sig is _SIG_PENDING and qp._state == _RTS and self.sq_next >= sq.db:
            self._sig_stop()  # nothing more to start: stop here
        comp.complete(now)
        if self.draining and qp._state == _SQD:
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

    # --- what the completer asks and tells -----------------------------------
    def started(self, psn: int) -> bool:
        """Whether ``psn`` was given to a request already (is before the next one)."""
        return P.diff(psn, self.npsn) < 0

    def rd_answered(self) -> None:
        """An outstanding READ or atomic got its last response."""
        self.rd_out -= 1

    def acked(self, npkts: int, now: float) -> None:
        """``npkts`` more packets were acknowledged: the congestion control hears of it."""
        self.cc.on_ack(npkts, now)

    def lost(self, now: float) -> None:
        """A go-back-N episode began: the congestion control hears of it."""
        self.cc.on_loss(now)

    # --- starting and transmitting ------------------------------------------
    def _start(self, wqe: SendWQE, info: WrInfo, now: float) -> None:
        """Resolve the WQE's memory, give it its PSNs, transmit what may go."""
        qp = self.qp
        obs = qp.hca.observer
        klass = info.klass
        comp = self.comp
        if klass is _WR_LOCAL or wqe.state == _W_CANCELLED:
            if wqe.state == _W_QUEUED:  # a NOP (cancelled) has nothing to do
                self._execute_local(wqe)
                if wqe.state == _W_QUEUED:
                    move(wqe, _W_DONE)
            comp.track(wqe)
            if obs is not None:
                obs.wqe_start(qp, wqe)
            return
        keys = qp.hca.keys
        seen = keys.integrity_errors
        error = self._resolve(wqe, klass)
        if keys.integrity_errors != seen:
            self.signature_failed()  # gathering through a signature key found a bad block
        if error is not None:
            comp.track(wqe)
            if obs is not None:
                obs.wqe_start(qp, wqe)
            return
        move(wqe, _W_ACTIVE)
        npkts = 1 if klass is _WR_ATOMIC else max(1, -(-wqe.length // qp.pmtu))
        wqe.npkts = npkts
        wqe.psn = self.npsn
        self.npsn = P.add(self.npsn, npkts)
        if info.rd:
            self.rd_out += 1
        comp.track(wqe)
        if obs is not None:
            obs.wqe_start(qp, wqe)
        self._transmit(wqe, now)

    def _resolve(self, wqe: SendWQE, klass: WrClass) -> int | None:
        """Resolve local memory; on failure mark the WQE failed (returns status)."""
        qp = self.qp
        if klass is _WR_SEND or klass is _WR_WRITE:
            if wqe.inline is not None:
                wqe.data = wqe.inline
            else:
                sges = wqe.sges
                if len(sges) == 1:  # most WQEs: the one SGE's view, no list and no copy
                    data = self._local(wqe, sges[0], False)
                else:
                    views = self._local_views(wqe, False)
                    data = None if views is None else b"".join(views)
                if data is None:
                    return wqe.status
                wqe.data = data
            if qp.is_ud and wqe.length > qp.pmtu:
                return self.fail(
                    wqe, IBV_WC_LOC_LEN_ERR,
                    f"a UD message of {wqe.length} bytes exceeds the path MTU {qp.pmtu}",
                )  # fmt: skip
            return None
        views = self._local_views(wqe, True)
        if views is None:
            return wqe.status
        if klass is _WR_ATOMIC:
            if wqe.length < 8:
                return self.fail(wqe, IBV_WC_LOC_LEN_ERR, "an atomic needs an 8-byte local buffer")
            views = [views[0][:8]] if len(views[0]) >= 8 else views
        wqe.data = views
        return None

    def _local_views(self, wqe: SendWQE, write: bool) -> list[Any] | None:
        """Each of ``wqe``'s SGEs as :meth:`_local` gives it, in order; None when
        one failed its key check (the WQE has then failed)."""
        views: list[Any] = []
        for sge in wqe.sges:
            v = self._local(wqe, sge, write)
            if v is None:
                return None
            views.append(v)
        return views

    def _local(self, wqe: SendWQE, sge: tuple[int, int, int], write: bool) -> Any:
        """One SGE ``(addr, length, lkey)`` of ``wqe`` as local memory, as
        :meth:`~.memory.KeyTable.local` gives it: the bytes to read (a memoryview)
        or, with ``write``, what the device stores into; None when the key check
        failed, and then the WQE has failed with ``IBV_WC_LOC_PROT_ERR``."""
        addr, length, lkey = sge
        qp = self.qp
        keys = qp.hca.keys
        v = keys.local(lkey, qp.pd, addr, length, write)
        if isinstance(v, str):
            self.fail(wqe, IBV_WC_LOC_PROT_ERR, v)
            return None
        return v

    def fail(self, wqe: SendWQE, status: int, reason: str) -> int:
        """``wqe`` failed: it completes in error when it reaches the head, and
        nothing starts until then (returns ``status``)."""
        move(wqe, _W_FAILED)
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
        info = info_of(wqe.opcode)
        klass = info.klass
        asked_all = True
        if klass is _WR_READ:
            asked_all = self._send_read(wqe)
        elif klass is _WR_ATOMIC:
            self._send_atomic(wqe)
        else:
            asked_all = self._send_message(wqe, info, now)
        if qp.reliable:
            self.comp.arm_ack_timer(now)
        elif asked_all:
            move(wqe, _W_DONE)  # UC, UD: done once its last packet is sent (a paced
            # message sends the rest when its pacing lets it, as RC does)
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
            room = window - self.comp.unacked(psn)
            if room <= 0:
                return False
            count = min(count, room)
            ack = ack_every(window)
        pmtu = qp.pmtu
        quantum = cc.quantum(pmtu)
        if quantum:
            count = min(count, quantum)
        data = wqe.data
        # the whole message in one burst (the usual case): its data as it is, no slice
        payload = data if i == 0 and count == n else data[i * pmtu : (i + count) * pmtu]
        if qp.is_ud:
            pkt = new_packet(0, wqe.remote_qpn, psn, payload)
            qp.address(pkt, wqe.route)
            qkey = wqe.remote_qkey
            pkt.qkey = qp.qkey if qkey & 0x80000000 else qkey
            pkt.src_qp = qp.qpn
        else:
            pkt = qp.new_request(0, psn, payload)
        if qp.is_xrc_send:
            pkt.srqn = wqe.xrc_srqn
        if info.klass is _WR_WRITE:
            pkt.va = wqe.remote_addr
            pkt.rkey = wqe.rkey
            pkt.dma_len = wqe.length
        pkt.imm = wqe.imm
        pkt.inv_rkey = wqe.inv_rkey
        pkt.se = wqe.se
        ops = info.ops[qp.transport]
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
        if qp.is_xrc_send:
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
        if qp.is_xrc_send:
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
        if self.comp.idle():
            self.draining = False
            if qp.en_sqd_async_notify or self.sig is SigStop.STOPPED:
                from softverbs.enums import IBV_EVENT_SQ_DRAINED

                self.sig = SigStop.NONE
                qp.hca.post_event(IBV_EVENT_SQ_DRAINED, qp)

    # --- signature pipelining (mlx5dv_qp_cancel_posted_send_wrs(3)) ---------------------
    def signature_failed(self) -> None:
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
        first = sq.seen_db
        sq.latch(everything)
        if self.cancelled:
            self.cancelled = _turn_cancelled(sq, first, self.cancelled)

    # --- flushing ------------------------------------------------------------------
    def flush_sq(self) -> None:
        """Complete every started and doorbelled WQE with WR_FLUSH_ERR, in order."""
        from softverbs.enums import IBV_WC_WR_FLUSH_ERR

        qp = self.qp
        sq = qp.sq
        if sq is None:
            return
        comp = self.comp
        flushed: list[SendWQE] = comp.take_all()
        while self.sq_next < sq.db:
            flushed.append(sq.get(self.sq_next))
            self.sq_next += 1
        for wqe in flushed:
            wqe.data = None  # as a completion drops it (Completer.complete)
            info = info_of(wqe.opcode)
            cqe = CQE(wqe.wr_id, IBV_WC_WR_FLUSH_ERR, info.wc_opcode, qp.qpn)
            cqe.reason = "flushed: the QP is in the error state"
            cqe.wq_kind, cqe.wq_handle = sq.tag
            cqe.index = wqe.index
            qp.push_cqe(qp.send_cq, cqe)
        self.rd_out = 0
        self.blocked = False
        comp.stop_timers()


def _turn_cancelled(sq: WorkRing, first: int,
                    cancelled: list[tuple[int, int]]) -> list[tuple[int, int]]:  # fmt: skip
    """Turn the WQEs fetched from ``first`` on that a cancel named before they were
    fetched (``cancelled``: (posted below, wr_id)); the cancels still to come."""
    for index in range(first, sq.db):
        wqe: SendWQE = sq.get(index)
        if any(index < below and wqe.wr_id == wr_id for below, wr_id in cancelled):
            _cancel(wqe)
    return [c for c in cancelled if c[0] > sq.db]


def _cancel(wqe: SendWQE) -> None:
    """Turn a WQE that has not started into a NOP (again: no change)."""
    if wqe.state == WqeState.QUEUED:
        move(wqe, WqeState.CANCELLED)
        wqe.length = 0
