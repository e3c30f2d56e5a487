"""Completer: acknowledgements and responses in, send CQEs out, in posting order.

The completer finishes what the requester (:mod:`.requester`) started.  It
owns the started WQEs in posting order (:meth:`Completer.track` hands each
one over), the oldest unacknowledged PSN (``una``), the retry budgets and
the two timers (the ACK timeout and the end of an RNR back-off).

ACKs are cumulative.  READ and atomic WQEs are done when their responses
arrive; an ACK beyond an unanswered READ means its responses were lost, and
the READ is retried (an implied NAK).  Recovery is go-back-N: on a
PSN-sequence NAK, on an ACK timeout, or at the end of an RNR back-off,
transmission restarts from the first missing PSN (:meth:`Completer.rewind`;
the requester sends again what is pending).  Timeouts and sequence NAKs
spend ``retry_cnt``; RNR NAKs spend ``rnr_retry`` (7 = forever).  Any
forward progress refills both.  CQEs are written strictly in posting order
(:meth:`Completer.complete`); a failed WQE moves an RC QP to ERR and a UC/UD
QP to SQE.

What it needs of the requester is a small surface: whether a PSN was ever
given to a request (:meth:`~.requester.Requester.started`), the news that a
READ or atomic is answered (``rd_answered``) or that a scatter failed a
signature check (``signature_failed``), failing a WQE (``fail``), sending
what may go now (``pump_sq``); and it feeds the requester's congestion
control through ``acked`` and ``lost``.  The requester asks of it only
what :meth:`Completer.track`, :meth:`~Completer.unacked`,
:meth:`~Completer.idle`, :meth:`~Completer.backing_off` and
:meth:`~Completer.started` answer.

Steps
-----
Each response's handling ends in one :class:`CompState` (named after rxe's
``COMPST_*``), which :meth:`Completer.on_response` returns; the QP engine
hands it to an observer (``step``), so a ``SOFTVERBS_TRACE`` says what
became of every response.
"""

from __future__ import annotations

from collections import deque
from enum import IntEnum
from typing import TYPE_CHECKING

from softverbs.engine import psn as P
from softverbs.engine.core import NATIVE
from softverbs.engine.rings import SendWQE, WqeState, new_cqe, scatter
from softverbs.engine.wr import WrClass, finished, info_of, move
from softverbs.enums import (
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_REM_INV_RD_REQ_ERR,
    IBV_WC_REM_INV_REQ_ERR,
    IBV_WC_REM_OP_ERR,
    IBV_WC_RETRY_EXC_ERR,
    IBV_WC_RNR_RETRY_EXC_ERR,
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
    OpInfo,
    aeth_kind,
    aeth_value,
)

if TYPE_CHECKING:
    from softverbs.engine.qp import QPEngine
    from softverbs.engine.requester import Requester
    from softverbs.wire.packet import Burst, Packet

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


class CompState(IntEnum):
    """Where the completer's handling of one response ended (rxe: ``COMPST_*``)."""

    ACK = 1  #: an ACK: every PSN up to its own acknowledged (COMP_ACK)
    READ = 2  #: a READ response placed in the READ's buffers
    ATOMIC = 3  #: an atomic's original value placed in its buffer
    BURST = 4  #: READ responses in one step, or taken apart: each packet its own record
    DUPLICATE = 5  #: for PSNs already acknowledged: nothing new
    ERROR_RETRY = 6  #: go-back-N: a PSN-sequence NAK, or a response after lost ones
    RNR_RETRY = 7  #: an RNR NAK: the back-off starts
    ERROR = 8  #: the WQE fails: an error NAK, or the retries are spent
    UNEXPECTED = 9  #: no outstanding READ or atomic asked for it: dropped
    BAD_RESPONSE = 10  #: a READ response out of its sequence or of a wrong length: dropped
    AFTER_GAP = 11  #: an earlier READ or atomic is unanswered: dropped, to come again
    INVALID = 12  #: a PSN never sent, an unknown AETH, nothing in flight: dropped at once


# module constants: an IntEnum member read from its class costs several times a global
_C_ACK = CompState.ACK
_C_READ = CompState.READ
_C_ATOMIC = CompState.ATOMIC
_C_BURST = CompState.BURST
_C_DUPLICATE = CompState.DUPLICATE
_C_ERROR_RETRY = CompState.ERROR_RETRY
_C_RNR_RETRY = CompState.RNR_RETRY
_C_ERROR = CompState.ERROR
_C_UNEXPECTED = CompState.UNEXPECTED
_C_BAD_RESPONSE = CompState.BAD_RESPONSE
_C_AFTER_GAP = CompState.AFTER_GAP
_C_INVALID = CompState.INVALID
_K_ACK = Kind.ACK
_K_READ_RESP = Kind.READ_RESP
_W_DONE = WqeState.DONE
_W_ACTIVE = WqeState.ACTIVE
_W_FAILED = WqeState.FAILED
_WR_READ = WrClass.READ
_WR_ATOMIC = WrClass.ATOMIC
_WR_SEND = WrClass.SEND
_RTS = IBV_QPS_RTS
_SQD = IBV_QPS_SQD
# the AETH kinds every ACK is compared with: C constants compiled (completer.pxd)
_AETH_ACK = AETH_ACK
_AETH_RNR_NAK = AETH_RNR_NAK
_AETH_NAK = AETH_NAK


class Completer:
    """Finishes what the requester started: acknowledgements, responses,
    retransmission and the send CQEs, in posting order."""

    def __init__(self, qp: QPEngine) -> None:
        self.qp = qp
        self.req: Requester  # set by the QP engine
        self.inflight: deque[SendWQE] = deque()  #: started WQEs, in posting order
        #: its ``popleft``, bound once (the deque is only ever cleared): compiled, a call
        #: of a bound method where ``inflight.popleft()`` looked the method up per WQE
        self._popleft = self.inflight.popleft
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

    # --- what the requester asks ---------------------------------------------------
    def track(self, wqe: SendWQE) -> None:
        """A WQE started (or failed, or was a local one): it is this part's to finish."""
        self.inflight.append(wqe)

    def started(self) -> deque[SendWQE]:
        """The started WQEs, oldest first (the requester sends what they have pending)."""
        return self.inflight

    def idle(self) -> bool:
        """Every started WQE is completed."""
        return not self.inflight

    def unacked(self, psn: int) -> int:
        """How many PSNs before ``psn`` are not acknowledged yet."""
        return P.diff(psn, self.una)

    def backing_off(self) -> bool:
        """An RNR back-off is under way: nothing may be sent until it ends."""
        return self.rnr_until is not None

    def take_all(self) -> list[SendWQE]:
        """Every started WQE, now no longer this part's (flushing)."""
        wqes = list(self.inflight)
        self.inflight.clear()
        return wqes

    # --- timers ------------------------------------------------------------------------
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
                seconds: float = timeout  # compiled, C doubles: one C add, the field boxed once
                deadline: float = now + seconds
                self.deadline = deadline
                self.qp.arm(deadline)

    # --- responses --------------------------------------------------------------
    def on_response(self, pkt: Packet, info: OpInfo, now: float) -> CompState:
        """Handle one response (or a burst of them); where its handling ended."""
        qp = self.qp
        # qp._state: the attribute behind the property (a C struct read when compiled)
        if (qp._state != _RTS and qp._state != _SQD) or not self.inflight:
            qp.hca.counters["drop_unexpected_response"] += pkt.count
            return _C_INVALID
        if pkt.count > 1:  # a burst of READ responses
            state = _C_BURST
            if not self._read_burst(pkt, now):  # type: ignore[arg-type]
                for seg in pkt.segments():  # one by one, exactly as sent singly
                    qp.receive(seg, OPINFO[seg.opcode], now)  # type: ignore[arg-type]
                return state
        else:
            state = self._response(pkt, info, now)
            if state is _C_INVALID:
                return state
        if (state is _C_AFTER_GAP or state is _C_DUPLICATE or state is _C_ERROR_RETRY) \
                and self.deadline is not None:  # fmt: skip
            # No progress, but the responder is at work on requests of ours: ones
            # sent before a loss (answered while the retry waits behind them), or a
            # retry's replay.  The ACK timer measures its silence, so it starts
            # again, as rxe's completer re-arms it on every response it takes in;
            # otherwise a responder with a long queue sees a retry of every
            # outstanding READ per timeout, each a queue longer, until retry_cnt
            # is spent (tests/engine/test_read_pacing.py).
            timeout = P.ack_timeout_s(qp.timeout)
            if timeout is not None:
                self.deadline = now + timeout
        self.complete(now)
        self.req.pump_sq(now)
        return state

    def _read_burst(self, b: Burst, now: float) -> bool:
        """Take a whole burst of READ responses in one step -- when it is the
        answer the READ waits for next, continuing where it is, ending where
        its piece ends, with nothing unanswered before it; False, before any
        side effect, for anything else (the packets then go one by one)."""
        qp = self.qp
        wqe = self._find(b.psn)
        if wqe is None or info_of(wqe.opcode).klass is not _WR_READ or finished(wqe):
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
            self.req.signature_failed()  # scattering into a signature key found a bad block
        wqe.rxd += count
        if final:
            move(wqe, _W_DONE)
            self.req.rd_answered()
        self._progress(now, P.add(b.psn, count))
        return True

    def _response(self, pkt: Packet, info: OpInfo, now: float) -> CompState:
        """One response packet; INVALID if it was dropped at once."""
        counters = self.qp.hca.counters
        kind = info.kind
        if kind is _K_ACK:
            k = aeth_kind(pkt.syndrome)
            if k == _AETH_ACK:
                if P.diff(pkt.psn, self.una) < 0:
                    # Acknowledges nothing new (say, the re-ACK of a duplicate request).
                    counters["duplicate_response"] += 1
                    return _C_DUPLICATE
                if not self.req.started(pkt.psn):
                    counters["drop_unexpected_response"] += 1  # a PSN never sent
                    return _C_INVALID
                return self._acked(pkt.psn, now)
            if k == _AETH_RNR_NAK:
                return self._rnr_nak(pkt, now)
            if k == _AETH_NAK:
                return self._nak(pkt, now)
            counters["drop_bad_aeth"] += 1
            return _C_INVALID
        if kind is _K_READ_RESP:
            return self._read_response(pkt, info, now)
        return self._atomic_ack(pkt, now)

    def _find(self, psn: int) -> SendWQE | None:
        for wqe in self.inflight:
            if wqe.npkts and 0 <= P.diff(psn, wqe.psn) < wqe.npkts:
                return wqe
        return None

    def _acked(self, psn: int, now: float) -> CompState:
        """Cumulative acknowledgement of every PSN up to ``psn``: ACK, or what
        an implied NAK on the way did (ERROR_RETRY, ERROR)."""
        if P.diff(psn, self.una) < 0 or not self.req.started(psn):
            return _C_ACK  # old (duplicate) or for a PSN never sent: nothing to do
        for wqe in self.inflight:
            if finished(wqe) or not wqe.npkts:
                continue
            if P.diff(wqe.psn, psn) > 0:
                break
            info = info_of(wqe.opcode)
            if info.rd:
                # The responder is past this READ/atomic but its response is
                # missing: an implied NAK (IBA 9.7.5.1.5; mlx5 counts it by this name).
                self.qp.count("implied_nak_seq_err")
                self._progress(now, P.add(wqe.psn, wqe.rxd))
                return self._retry(now, P.add(wqe.psn, wqe.rxd), "implied NAK")
            if P.diff(P.add(wqe.psn, wqe.npkts - 1), psn) <= 0:
                move(wqe, _W_DONE)
            else:
                break
        self._progress(now, P.add(psn, 1))
        return _C_ACK

    def _progress(self, now: float, una: int) -> None:
        """The peer acknowledged every PSN before ``una``."""
        if P.diff(una, self.una) <= 0:
            return
        qp = self.qp
        req = self.req
        req.acked(P.diff(una, self.una), now)
        self.una = una
        self.retry_left = qp.retry_cnt
        self.rnr_left = qp.rnr_retry
        self.resending = False
        # una is at most the next new PSN (only sent PSNs are acknowledged), so
        # "una was started" is "something is still unacknowledged"
        if req.started(una):
            timeout = P.ack_timeout_s(qp.timeout)
            self.deadline = None if timeout is None else now + timeout
            if self.deadline is not None:
                qp.arm(self.deadline)
        else:
            self.deadline = None

    def _rnr_nak(self, pkt: Packet, now: float) -> CompState:
        qp = self.qp
        qp.count("rcvd_rnr_err")
        psn = pkt.psn
        state = self._acked(P.add(psn, -1), now)
        wqe = self._find(psn)
        if wqe is None:
            return state
        if self.rnr_left == 0:
            qp.count("retry_rnr_exceeded_err")
            self._fail_remote(
                wqe, IBV_WC_RNR_RETRY_EXC_ERR,
                f"the responder had no receive WQE; rnr_retry={qp.rnr_retry} retries exhausted",
            )  # fmt: skip
            return _C_ERROR
        if qp.rnr_retry != P.RNR_RETRY_INFINITE:
            self.rnr_left -= 1
        self.rnr_psn = psn
        self.rnr_until = now + P.RNR_TIMER_S[aeth_value(pkt.syndrome)]
        self.deadline = None
        qp.arm(self.rnr_until)
        return _C_RNR_RETRY

    def _nak(self, pkt: Packet, now: float) -> CompState:
        counters = self.qp.hca.counters
        code = aeth_value(pkt.syndrome)
        psn = pkt.psn
        if P.diff(psn, self.una) < 0 or not self.req.started(psn):
            # A NAK names an unacknowledged PSN.  Any other is stale or bogus, and
            # going back to it would rewind nothing yet stop the retransmission timer.
            if P.diff(psn, self.una) < 0:
                counters["duplicate_response"] += 1
                return _C_DUPLICATE
            counters["drop_unexpected_response"] += 1
            return _C_UNEXPECTED
        state = self._acked(P.add(psn, -1), now)
        if code == NAK_PSN_SEQUENCE_ERROR:
            self.qp.count("rcvd_seq_err")
            return self._retry(now, psn, "PSN sequence error NAK")
        wqe = self._find(psn)
        if wqe is None:
            counters["drop_unexpected_response"] += 1
            return state
        status = NAK_STATUS.get(code, IBV_WC_REM_OP_ERR)
        self._fail_remote(wqe, status, NAK_REASON.get(code, f"NAK code {code}"))
        return _C_ERROR

    def _fail_remote(self, wqe: SendWQE, status: int, reason: str) -> None:
        if wqe.state == _W_ACTIVE:
            self.req.fail(wqe, status, reason)

    def _read_response(self, pkt: Packet, info: OpInfo, now: float) -> CompState:
        qp = self.qp
        counters = qp.hca.counters
        wqe = self._find(pkt.psn)
        if wqe is None or info_of(wqe.opcode).klass is not _WR_READ or finished(wqe):
            counters["drop_unexpected_response"] += 1
            return _C_UNEXPECTED
        expected = P.add(wqe.psn, wqe.rxd)
        if pkt.psn != expected:
            if P.diff(pkt.psn, expected) < 0:
                counters["duplicate_response"] += 1
                return _C_DUPLICATE
            # Responses were lost.  The responder is past every PSN before this
            # one: that acknowledges earlier SENDs/WRITEs and retries from the
            # first unanswered READ/atomic, which may be an earlier WQE than this.
            return self._acked(P.add(pkt.psn, -1), now)
        # A READ is asked for in pieces (_send_read), and again from a middle PSN
        # after a loss; each answer starts with FIRST or ONLY, so FIRST is legal at any
        # PSN, but only the READ's first PSN must be FIRST, and LAST comes exactly at
        # the end of a piece.
        final = wqe.rxd == wqe.npkts - 1
        bad_first = wqe.rxd == 0 and not info.first
        if bad_first or info.last != (final or (wqe.rxd + 1) % max(1, qp.window) == 0):
            counters["drop_bad_read_response"] += 1
            return _C_BAD_RESPONSE
        self._acked(P.add(wqe.psn, -1), now)
        if self.una != expected:
            # An earlier READ/atomic is still unanswered (_acked just retried it):
            # responses complete in PSN order, so this one must come again later.
            counters["drop_response_after_gap"] += 1
            return _C_AFTER_GAP
        payload = pkt.payload
        pmtu = qp.pmtu
        if len(payload) > pmtu or (not final and len(payload) != pmtu):
            counters["drop_bad_read_response"] += 1
            return _C_BAD_RESPONSE
        seen = qp.hca.keys.integrity_errors
        if not scatter(wqe.data, wqe.rxd * pmtu, payload, last=final):
            counters["drop_bad_read_response"] += 1
            return _C_BAD_RESPONSE
        if qp.hca.keys.integrity_errors != seen:
            self.req.signature_failed()  # scattering into a signature key found a bad block
        wqe.rxd += 1
        if final:
            move(wqe, _W_DONE)
            self.req.rd_answered()
        self._progress(now, P.add(pkt.psn, 1))
        return _C_READ

    def _atomic_ack(self, pkt: Packet, now: float) -> CompState:
        counters = self.qp.hca.counters
        wqe = self._find(pkt.psn)
        if wqe is None or info_of(wqe.opcode).klass is not _WR_ATOMIC or finished(wqe):
            counters["drop_unexpected_response"] += 1
            return _C_UNEXPECTED
        self._acked(P.add(wqe.psn, -1), now)
        if self.una != wqe.psn:  # an earlier READ/atomic is unanswered (see _read_response)
            counters["drop_response_after_gap"] += 1
            return _C_AFTER_GAP
        view = wqe.data[0]
        view[:8] = pkt.orig.to_bytes(8, NATIVE)
        wqe.rxd = 1
        move(wqe, _W_DONE)
        self.req.rd_answered()
        self._progress(now, P.add(pkt.psn, 1))
        return _C_ATOMIC

    # --- retransmission ---------------------------------------------------------
    def _retry(self, now: float, psn: int, why: str) -> CompState:
        """Go back to ``psn``, spending one ``retry_cnt`` once per episode:
        ERROR_RETRY, or ERROR when none is left."""
        if self.resending:
            return _C_ERROR_RETRY  # the episode under way goes back already
        qp = self.qp
        if self.retry_left == 0:
            wqe = self._find(psn) or next((w for w in self.inflight if not finished(w)), None)
            if wqe is not None:
                qp.count("retry_exceeded_err")
                self._fail_remote(
                    wqe, IBV_WC_RETRY_EXC_ERR,
                    f"{why}: retry_cnt={qp.retry_cnt} retries exhausted",
                )  # fmt: skip
            return _C_ERROR
        self.retry_left -= 1
        self.resending = True
        self.req.lost(now)
        qp.count("completer_retry_err")
        obs = qp.hca.observer
        if obs is not None:
            obs.retransmit(qp, psn, why)
        self.rewind(psn)
        self.deadline = None
        return _C_ERROR_RETRY

    def rewind(self, psn: int) -> None:
        """Make every unacknowledged packet from ``psn`` on pending again."""
        for wqe in self.inflight:
            if finished(wqe) or not wqe.npkts:
                continue
            end = P.diff(P.add(wqe.psn, wqe.npkts), psn)
            if end <= 0:
                continue  # entirely before psn
            if info_of(wqe.opcode).rd:
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
        if not any(not finished(w) and w.npkts for w in self.inflight):
            return
        qp.count("local_ack_timeout_err")
        # A timeout always goes back and spends a retry, even during an episode; the
        # episode then goes on until progress, as after a NAK: the responses to what
        # was asked before the timeout are no news of a further loss (rxe's
        # started_retry), and each new episode would ask for everything again.
        self.resending = False
        self._retry(now, self.una, "local ACK timeout")
        self.complete(now)
        self.req.pump_sq(now)

    # --- completion -----------------------------------------------------------------
    def complete(self, now: float) -> None:
        """Write CQEs for the finished WQEs at the head, in posting order."""
        qp = self.qp
        inflight = self.inflight
        obs = qp.hca.observer
        while inflight and finished(inflight[0]):
            wqe = self._popleft()
            # Its data goes with it: no retry can need a snapshot now, and the SQ's
            # copy of the WQE lives until its slot is fetched again, a whole ring
            # later -- ib_write_bw's 128 1 MiB WRITEs kept 128 MiB of snapshots
            # alive, and every copy into them went to DRAM (docs/performance.md)
            wqe.data = None
            if obs is not None:
                obs.wqe_done(qp, wqe)
            ok = wqe.state != _W_FAILED
            info = info_of(wqe.opcode)
            if wqe.state == _W_DONE and info.klass is _WR_SEND:
                qp.hca.rdma_sends += 1  # rxe: every completed SEND WQE
            if ok and not (wqe.signaled or qp.sq_sig_all):
                continue
            cqe = new_cqe(wqe.wr_id, wqe.status, info.wc_opcode, qp.qpn)
            if ok:
                cqe.byte_len = 8 if info.klass is _WR_ATOMIC else wqe.length
            else:
                cqe.reason = wqe.reason
            tag = qp.sq.tag  # type: ignore[union-attr]
            cqe.wq_kind, cqe.wq_handle = tag  # compiled a tuple: unpacked without an iterator
            cqe.index = wqe.index
            qp.push_cqe(qp.send_cq, cqe)
            if not ok:
                qp.hca.counters["send_err" if qp.reliable else "send_queue_err"] += 1
                if qp.reliable:
                    qp.to_error(now)
                else:
                    qp.send_queue_error(now)
                return
