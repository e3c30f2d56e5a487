"""Responder: checks and executes incoming requests.

For RC and XRC every request packet goes through the same steps
(IBA 9.7.5.1, 9.7.5.2):

1. **PSN check.**  The expected PSN (``epsn``) is executed.  An earlier PSN
   is a duplicate: a SEND or WRITE is ACKed again, a READ is executed again
   from the requested PSN, an atomic is answered again from the replay
   cache (``max_dest_rd_atomic`` entries, oldest evicted).  A later PSN means
   packets were lost: one PSN-sequence NAK per gap, then silence until the
   expected PSN arrives.
2. **Opcode sequence.**  Inside a multi-packet message only MIDDLE and LAST
   of the same kind may come; outside one, only FIRST or ONLY.  Anything
   else is an invalid request.
3. **Resources.**  A SEND, or a WRITE with immediate, needs a receive WQE
   (own RQ, SRQ, or the XRC SRQ named in the XRCETH).  None: an RNR NAK
   carrying ``min_rnr_timer``; the PSN is not consumed.
4. **Access and bounds** through the key table.  Failures are NAKed (remote
   access error, invalid request) and move this QP to ERR with an async
   event, or complete the receive WQE in error (length, local protection).
5. **Execute**, then ACK when the request asked for one (AckReq), with the
   count of completed messages (MSN).

UC has no ACKs: a PSN gap drops the rest of the message and the responder
resynchronises on the next FIRST or ONLY, reusing the receive WQE of the
dropped message.

Between packets a responder is in one :class:`Msg` state -- outside any
message, inside a SEND or a WRITE, or (UC) dropping the rest of one -- and,
on RC, it remembers whether it has NAKed the current gap.

UD messages are single packets checked against the QKEY; the receive buffer
gets the 40-byte GRH first.  Drops are counted, never raised.

Steps
-----
Each request's handling ends in one :class:`RespState`, named after rxe's
``RESPST_*`` and after the check that stopped it (``CHK_PSN``,
``CHK_OP_SEQ``, ``CHK_RESOURCE``, ``CHK_LENGTH``, ``CHK_RKEY``):
:meth:`Responder.on_request` returns it, and the QP engine hands it to an
observer (``step``), so a ``SOFTVERBS_TRACE`` says what became of every
request.
"""

from __future__ import annotations

from collections import deque
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from softverbs.engine import psn as P
from softverbs.engine.core import NATIVE
from softverbs.engine.rings import CQE, RecvWQE, place, scatter
from softverbs.enums import (
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_EVENT_QP_ACCESS_ERR,
    IBV_EVENT_QP_REQ_ERR,
    IBV_WC_GRH,
    IBV_WC_LOC_LEN_ERR,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_LOC_QP_OP_ERR,
    IBV_WC_RECV,
    IBV_WC_RECV_RDMA_WITH_IMM,
    IBV_WC_REM_INV_REQ_ERR,
    IBV_WC_SUCCESS,
    IBV_WC_WITH_IMM,
    IBV_WC_WITH_INV,
    IBV_WC_WR_FLUSH_ERR,
)
from softverbs.wire.opcodes import (
    AETH_ACK,
    AETH_CREDIT_INVALID,
    AETH_NAK,
    AETH_RNR_NAK,
    NAK_INVALID_REQUEST,
    NAK_PSN_SEQUENCE_ERROR,
    NAK_REMOTE_ACCESS_ERROR,
    NAK_REMOTE_OPERATIONAL_ERROR,
    OPINFO,
    Kind,
    Op,
    OpInfo,
    aeth_syndrome,
)
from softverbs.wire.packet import Burst, Packet, burst

if TYPE_CHECKING:
    from softverbs.engine.qp import QPEngine

_MASK64 = (1 << 64) - 1
_GRH_LEN = 40
_ACK_SYNDROME = aeth_syndrome(AETH_ACK, AETH_CREDIT_INVALID)
_OP_ACK = Op.ACKNOWLEDGE  # a global, not an enum class attribute lookup, per ACK

# replay cache entry fields
_R_PSN, _R_NPKTS, _R_KIND, _R_VA, _R_RKEY, _R_LEN, _R_ORIG = range(7)

#: Marker returned by _take_rqe when an XRC SRQ number is not acceptable.
_XRC_BAD_SRQ = RecvWQE(0, [], 0)

# Plain ints: the checks run for every request (IntFlag arithmetic is slow).
_REMOTE_RIGHT: dict[Kind, int] = {
    Kind.WRITE: int(IBV_ACCESS_REMOTE_WRITE),
    Kind.READ_REQ: int(IBV_ACCESS_REMOTE_READ),
    Kind.ATOMIC: int(IBV_ACCESS_REMOTE_ATOMIC),
}



class RespState(IntEnum):
    """Where the responder's handling of one request ended (rxe: ``RESPST_*``)."""

    DONE = 1  #: passed every check and executed (its ACK, if asked for, coalesced)
    BURST = 2  #: a burst: the packets that continue the message at once, the rest alone
    DUPLICATE_REQUEST = 3  #: CHK_PSN: an earlier PSN, answered again (or too old: dropped)
    ERR_PSN_OUT_OF_SEQ = 4  #: CHK_PSN: a later PSN: NAKed once per gap; UC: message dropped
    ERR_OP_SEQ = 5  #: CHK_OP_SEQ: the opcode does not fit the message in progress
    ERR_RNR = 6  #: CHK_RESOURCE: no receive WQE: an RNR NAK (RC); dropped (UC, UD)
    ERR_SRQ = 7  #: CHK_RESOURCE: the XRC SRQ named is not in this QP's domain
    ERR_RQE = 8  #: CHK_RESOURCE: the receive WQE is malformed or its SGEs are refused
    ERR_LENGTH = 9  #: CHK_LENGTH: a payload or message length that does not fit
    ERR_RKEY_VIOLATION = 10  #: CHK_RKEY: the QP's rights, the R_Key or its bounds refuse it
    ERR_MISALIGNED_ATOMIC = 11  #: CHK_RKEY: an atomic's address is not 8-byte aligned
    ERR_INVALIDATE_RKEY = 12  #: a SEND with invalidate names a key it may not invalidate
    ERR_QKEY = 13  #: UD: the Q_Key does not match: dropped


class Msg(IntEnum):
    """Where the responder is between packets."""

    IDLE = 0  #: outside any message: a FIRST or an ONLY may come
    SEND = 1  #: inside a multi-packet SEND: its MIDDLE or LAST may come
    WRITE = 2  #: inside a multi-packet RDMA WRITE
    DROPPING = 3  #: UC: the rest of a message is dropped, until a FIRST or ONLY


#: the message kind -> the state inside such a message
_INSIDE: dict[Kind, Msg] = {Kind.SEND: Msg.SEND, Kind.WRITE: Msg.WRITE}

# Enum members as module constants: a class attribute lookup of an IntEnum
# member costs several times a global's, on the path of every packet
_K_ATOMIC = Kind.ATOMIC
_K_READ_REQ = Kind.READ_REQ
_K_SEND = Kind.SEND
_K_WRITE = Kind.WRITE
_MSG_DROPPING = Msg.DROPPING
_MSG_IDLE = Msg.IDLE
_MSG_SEND = Msg.SEND
_MSG_WRITE = Msg.WRITE
_R_DONE = RespState.DONE
_R_BURST = RespState.BURST
_R_DUPLICATE = RespState.DUPLICATE_REQUEST
_R_PSN_OUT_OF_SEQ = RespState.ERR_PSN_OUT_OF_SEQ
_R_OP_SEQ = RespState.ERR_OP_SEQ
_R_RNR = RespState.ERR_RNR
_R_SRQ = RespState.ERR_SRQ
_R_RQE = RespState.ERR_RQE
_R_LENGTH = RespState.ERR_LENGTH
_R_RKEY = RespState.ERR_RKEY_VIOLATION
_R_MISALIGNED = RespState.ERR_MISALIGNED_ATOMIC
_R_INVALIDATE = RespState.ERR_INVALIDATE_RKEY
_R_QKEY = RespState.ERR_QKEY


class Responder:
    """The receive side of a QP (see the module docstring)."""

    def __init__(self, qp: QPEngine) -> None:
        self.qp = qp
        self.replay: deque[tuple[int, int, int, int, int, int, int]] = deque()
        self.reset()

    def reset(self) -> None:
        """Forget all progress (RESET)."""
        qp = self.qp
        self.epsn = qp.rq_psn  #: the next PSN to execute
        self.msn = 0  #: messages completed (the AETH's MSN)
        self.rq_next = qp.rq.db if qp.rq is not None else 0  #: next receive WQE
        self.msg = _MSG_IDLE
        self.nak_sent = False  #: RC: the current gap was NAKed; silent until it closes
        self.rqe: RecvWQE | None = None  #: the receive WQE of the message in progress
        self.views: list[memoryview] = []  #: its buffers
        self.off = 0  #: bytes of the message received so far
        self.wview: memoryview | None = None  #: WRITE: the target of the message
        self.wkey = 0  #: WRITE: the rkey it came through (the sanitizer asks)
        self.ack_req: Packet | None = None  #: the request whose coalesced ACK is due
        self.ack_psn = 0  #: the PSN that ACK acknowledges
        self.replay.clear()

    def on_request(self, pkt: Packet, info: OpInfo, now: float) -> RespState:
        """Check and execute one request (or a burst); where its handling ended."""
        if pkt.count > 1:
            self._burst(pkt, now)  # type: ignore[arg-type]
            return _R_BURST
        qp = self.qp
        if qp.reliable:
            return self._rc_receive(pkt, info, now)
        if qp.is_ud:
            return self._ud_receive(pkt, info, now)
        return self._uc_receive(pkt, info, now)

    # --- RC / XRC ---------------------------------------------------------------
    def _rc_receive(self, pkt: Packet, info: OpInfo, now: float) -> RespState:
        d = P.diff(pkt.psn, self.epsn)
        if d < 0:
            self._duplicate(pkt, info)
            return _R_DUPLICATE
        if d > 0:
            self.qp.count("out_of_seq_request")
            if not self.nak_sent:
                self.nak_sent = True
                self._send_nak(pkt, NAK_PSN_SEQUENCE_ERROR, self.epsn)
            return _R_PSN_OUT_OF_SEQ
        kind = info.kind
        if self._out_of_sequence(info):
            self._fail(pkt, NAK_INVALID_REQUEST, now, "unexpected opcode in the message sequence")
            return _R_OP_SEQ
        if kind is _K_SEND:
            return self._recv_send(pkt, info, now)
        if kind is _K_WRITE:
            return self._recv_write(pkt, info, now)
        if kind is _K_READ_REQ:
            return self._recv_read(pkt, now)
        return self._recv_atomic(pkt, info, now)

    def _out_of_sequence(self, info: OpInfo) -> bool:
        """A FIRST or ONLY inside a message, or a MIDDLE or LAST outside one or of
        another kind."""
        msg = self.msg
        if msg is _MSG_SEND:
            return info.first or info.kind is not _K_SEND
        if msg is _MSG_WRITE:
            return info.first or info.kind is not _K_WRITE
        return not info.first

    def _accept(self, pkt: Packet, n: int = 1, asked: bool | None = None) -> None:
        """``n`` packets from ``pkt`` on executed: consume their PSNs, and ACK
        the last of them if any asked (``asked``; default: ``pkt.ackreq``)."""
        self.epsn = P.add(self.epsn, n)
        self.nak_sent = False
        qp = self.qp
        if qp.reliable:
            if pkt.ackreq if asked is None else asked:
                if self.ack_req is None:
                    qp.hca.defer_ack(qp)
                    n -= 1
                self.ack_req = pkt
                self.ack_psn = P.add(self.epsn, -1)
            qp.hca.ack_deferred += n  # coalesced into one ACK

    def emit_ack(self) -> None:
        """Send the coalesced ACK (see HCA.outbox)."""
        req = self.ack_req
        if req is not None:
            self.ack_req = None
            self._send_ack(req, self.ack_psn)

    # --- bursts (segmentation offload; see softverbs.wire.packet) ------------------------
    def _burst(self, b: Burst, now: float) -> None:
        """Execute a burst: the packets that continue what this responder
        expects, in one step -- one key and bounds check, one copy --, then the
        rest one by one, the message's last packet always among them (it
        completes the message, and may carry the immediate).  The one-by-one
        path is the per-packet responder itself, so every PSN, NAK and error
        is exactly what the packets sent singly would have met."""
        qp = self.qp
        count = b.count
        info = OPINFO[b.last_opcode]
        body = count - 1 if info is None or info.last else count
        done = self._burst_body(b, body, now) if b.seg == qp.pmtu else 0
        for j in range(done, count):
            seg = b.segment(j)
            qp.receive(seg, OPINFO[seg.opcode], now)  # type: ignore[arg-type]

    def _burst_body(self, b: Burst, k: int, now: float) -> int:
        """Execute up to ``k`` leading packets of ``b`` (none of them the
        message's last) at once, and ask for the ACK any of them asks for;
        how many it took.  Anything unusual -- a PSN
        other than the expected one, a sequence error, a buffer too small --
        takes none (before any side effect), and the packets go one by one."""
        info = OPINFO[b.opcode]
        assert info is not None
        kind = info.kind
        first = info.first
        # the message kinds are one object each: compared by identity, no dict lookup
        if kind is _K_WRITE:
            inside = _MSG_WRITE
        elif kind is _K_SEND:
            inside = _MSG_SEND
        else:
            return 0
        if b.psn != self.epsn:
            return 0
        msg = self.msg
        if self.qp.reliable:
            if self._out_of_sequence(info):
                return 0
        elif msg is _MSG_DROPPING or (msg is not _MSG_IDLE if first else inside is not msg):
            return 0  # UC: a resynchronisation, a dropped message: one by one
        seg = b.seg
        size = k * seg
        if inside is _MSG_WRITE:
            if first:
                if size > b.dma_len:
                    return 0
                got = self._remote(b, _K_WRITE, b.va, b.dma_len, now)
                if got is _R_RKEY:
                    return 1  # the first packet failed (NAKed, or dropped on UC)
                self.wview = got
                self.wkey = b.rkey
                self.off = 0
            view = self.wview
            off = self.off
            if view is None or off + size > len(view):
                return 0
            payload = b.payload
            view[off : off + size] = payload if len(payload) == size else payload[:size]
        else:
            if first:
                if self._begin_recv(b, now) is not None:
                    return 1  # RNR NAK, or the receive WQE failed
                self.off = 0
            room = -self.off
            for v in self.views:
                room += len(v)
            k = min(k, room // seg)
            if k == 0:
                return 0  # the per-packet path reuses the WQE taken above
            size = k * seg
            scatter(self.views, self.off, b.payload[:size])
        self.off += size
        self.msg = inside
        every = b.ack_every
        index = b.first_index
        self._accept(b, k, every > 0 and (index + k) // every > index // every)
        return k

    # --- ACKs and NAKs ----------------------------------------------------------------
    def _send_ack(self, req: Packet, psn: int) -> None:
        qp = self.qp
        ack = qp.reply(req, qp.transport | _OP_ACK, psn)
        ack.syndrome = _ACK_SYNDROME
        ack.msn = self.msn
        qp.send(ack)

    def _send_nak(self, req: Packet, code: int, psn: int) -> None:
        qp = self.qp
        nak = qp.reply(req, qp.transport | _OP_ACK, psn)
        nak.syndrome = aeth_syndrome(AETH_NAK, code)
        nak.msn = self.msn
        qp.send(nak)

    def _rnr(self, pkt: Packet) -> None:
        qp = self.qp
        qp.count("send_rnr_err")
        nak = qp.reply(pkt, qp.transport | Op.ACKNOWLEDGE, pkt.psn)
        nak.syndrome = aeth_syndrome(AETH_RNR_NAK, qp.min_rnr_timer)
        nak.msn = self.msn
        qp.send(nak)
        # The RNR NAK already sends the requester back to this PSN: the requests
        # it had pipelined behind it are dropped without a PSN-sequence NAK, which
        # would cost it a retry_cnt for a loss that never happened (as qib/hfi1).
        self.nak_sent = True

    def _fail(
        self,
        pkt: Packet,
        code: int,
        now: float,
        reason: str,
        rqe_status: int = 0,
    ) -> None:
        """A responder error: NAK it, report it, and move this QP to ERR."""
        qp = self.qp
        counters = qp.hca.counters
        counters[_FAIL_COUNTER.get(code, "resp_error")] += 1
        if qp.reliable:
            self._send_nak(pkt, code, pkt.psn)
        rqe = self.rqe
        if rqe_status and rqe is not None:
            self.rqe = None
            self._complete_rqe(rqe, rqe_status, 0, reason=reason)
        qp.last_error = reason  # before the event: the event carries it as its reason
        event = _FAIL_EVENT.get(code)
        if event is None:
            qp.to_error(now)
        else:
            qp.fatal(event, now)

    # --- receive WQEs -------------------------------------------------------------
    def _take_rqe(self, pkt: Packet) -> RecvWQE | None:
        qp = self.qp
        if qp.is_xrc_recv:
            srq = qp.hca.find_srq(pkt.srqn)
            if srq is None or srq.xrcd is None or srq.xrcd is not qp.xrcd:
                return _XRC_BAD_SRQ
            return srq.take()
        if qp.srq is not None:
            return qp.srq.take()
        rq = qp.rq
        if rq is None:
            return None
        # the doorbell word is in shared memory: read it now, as a NIC reads the
        # doorbell record when a SEND finds no WQE, rather than wait for the
        # doorbell message (the SEND's own doorbell may have been read first)
        if self.rq_next >= rq.seen_db and not rq.latch():
            return None
        rqe: RecvWQE = rq.get(self.rq_next)
        self.rq_next += 1
        return rqe

    def _rqe_pd(self, pkt: Packet) -> object:
        """The PD memory checks use: an XRC responder uses its SRQ's PD."""
        qp = self.qp
        if qp.is_xrc_recv:
            srq = qp.hca.find_srq(pkt.srqn)
            return getattr(srq, "pd", None)
        return qp.pd

    def _rqe_views(self, rqe: RecvWQE, pd: object) -> list[memoryview] | str:
        """Where the message goes, or why it cannot (see :meth:`_rqe_status`)."""
        if rqe.bad:
            return f"a malformed receive WQE: {rqe.bad}"
        views: list[memoryview] = []
        keys = self.qp.hca.keys
        for addr, length, lkey in rqe.sges:
            v = keys.local(lkey, pd, addr, length, True)
            if isinstance(v, str):
                return v
            views.append(v)
        return views

    def _complete_rqe(
        self,
        rqe: RecvWQE,
        status: int,
        byte_len: int,
        opcode: int = IBV_WC_RECV,
        flags: int = 0,
        imm: int = 0,
        src_qp: int = 0,
        solicited: bool = False,
        reason: str = "",
    ) -> None:
        qp = self.qp
        cqe = CQE(rqe.wr_id, status, opcode, qp.qpn, byte_len, flags, imm)
        cqe.src_qp = src_qp if src_qp else qp.dest_qpn
        cqe.solicited = solicited
        cqe.reason = reason
        srq = rqe.srq
        ring = srq if srq is not None else qp.rq
        if ring is not None:
            cqe.wq_kind, cqe.wq_handle = ring.tag
        cqe.index = rqe.index
        if status == IBV_WC_SUCCESS:
            qp.hca.rdma_recvs += 1  # rxe: every completed receive WQE
        cq = srq.cq if srq is not None and srq.cq is not None else qp.recv_cq
        qp.push_cqe(cq, cqe)

    def _begin_recv(self, pkt: Packet, now: float) -> RespState | None:
        """Take a receive WQE for a new message; None, or where the packet ended."""
        qp = self.qp
        rqe = self.rqe  # UC: reuse the WQE of a dropped message
        if rqe is None:
            rqe = self._take_rqe(pkt)
        if rqe is _XRC_BAD_SRQ:
            qp.hca.counters["drop_xrc_bad_srq"] += 1
            self._fail(
                pkt, NAK_INVALID_REQUEST, now, f"XRC SRQ {pkt.srqn:#x} is not in this domain"
            )
            return _R_SRQ
        if rqe is None:
            if qp.reliable:
                self._rnr(pkt)
            else:
                qp.hca.counters["drop_no_rqe"] += 1
                self.msg = _MSG_DROPPING
            return _R_RNR
        views = self._rqe_views(rqe, self._rqe_pd(pkt))
        if isinstance(views, str):
            self.rqe = rqe
            self._fail(pkt, NAK_REMOTE_OPERATIONAL_ERROR, now, views, _rqe_status(rqe))
            return _R_RQE
        self.rqe = rqe
        self.views = views
        return None

    # --- SEND ----------------------------------------------------------------------
    def _recv_send(self, pkt: Packet, info: OpInfo, now: float) -> RespState:
        qp = self.qp
        last = info.last  # read once: an OpInfo field is an attribute lookup by name
        if info.first:
            stop = self._begin_recv(pkt, now)
            if stop is not None:
                return stop
            self.off = 0
        payload = pkt.payload
        n = len(payload)
        if n > qp.pmtu or (not last and n != qp.pmtu):
            self._fail(pkt, NAK_INVALID_REQUEST, now, f"packet payload of {n} bytes is illegal")
            return _R_LENGTH
        if not scatter(self.views, self.off, payload, last=last):
            self._fail(
                pkt, NAK_INVALID_REQUEST, now,
                "the message is longer than the receive WQE", IBV_WC_LOC_LEN_ERR,
            )  # fmt: skip
            return _R_LENGTH
        self.off += n
        if not last:
            self.msg = _MSG_SEND
            self._accept(pkt)
            return _R_DONE
        rqe = self.rqe
        assert rqe is not None
        flags = 0
        imm = 0
        if info.imm:
            flags = IBV_WC_WITH_IMM
            imm = pkt.imm
        elif info.inv:
            err = qp.hca.keys.invalidate(pkt.inv_rkey, self._rqe_pd(pkt), qp.qpn)
            if err is not None:
                self._fail(pkt, NAK_INVALID_REQUEST, now, err, IBV_WC_REM_INV_REQ_ERR)
                return _R_INVALIDATE
            flags = IBV_WC_WITH_INV
            imm = pkt.inv_rkey
        self.rqe = None
        self.msg = _MSG_IDLE
        self.msn = P.add(self.msn, 1)
        self._complete_rqe(rqe, IBV_WC_SUCCESS, self.off, IBV_WC_RECV, flags, imm,
                           solicited=pkt.se)  # fmt: skip
        self._accept(pkt)
        return _R_DONE

    # --- WRITE ---------------------------------------------------------------------
    def _recv_write(self, pkt: Packet, info: OpInfo, now: float) -> RespState:
        last = info.last  # read once: an OpInfo field is an attribute lookup by name
        if info.first:
            got = self._remote(pkt, _K_WRITE, pkt.va, pkt.dma_len, now)
            if got is _R_RKEY:
                return RespState.ERR_RKEY_VIOLATION
            self.wview = got
            self.wkey = pkt.rkey
            self.off = 0
        if info.imm and last:
            stop = self._begin_recv(pkt, now)
            if stop is not None:
                return stop
        view = self.wview
        assert view is not None
        payload = pkt.payload
        n = len(payload)
        off = self.off
        pmtu = self.qp.pmtu
        if n > pmtu or (not last and n != pmtu) or off + n > len(view):
            self._fail(
                pkt, NAK_INVALID_REQUEST, now, "RDMA WRITE payload does not match its DMA length"
            )
            return _R_LENGTH
        if last and off + n != len(view):
            self._fail(pkt, NAK_INVALID_REQUEST, now, "RDMA WRITE ended before its DMA length")
            return _R_LENGTH
        if last:
            place(view, off, payload)
        else:
            view[off : off + n] = payload
        self.off = off + n
        if not last:
            self.msg = _MSG_WRITE
            self._accept(pkt)
            return _R_DONE
        self.msg = _MSG_IDLE
        self.wview = None
        self.msn = P.add(self.msn, 1)
        if info.imm:
            rqe = self.rqe
            assert rqe is not None
            self.rqe = None
            self._complete_rqe(rqe, IBV_WC_SUCCESS, self.off, IBV_WC_RECV_RDMA_WITH_IMM,
                               IBV_WC_WITH_IMM, pkt.imm, solicited=pkt.se)  # fmt: skip
        self._accept(pkt)
        return _R_DONE

    def _remote(self, pkt: Packet, kind: Kind, va: int, length: int, now: float) -> Any:
        """Check the QP's remote rights and the key: the memory, or (NAKed, or
        dropped on UC) ERR_RKEY_VIOLATION."""
        qp = self.qp
        right = _REMOTE_RIGHT[kind]
        if not qp.access & right:
            reason = f"QP {qp.qpn:#x} does not allow remote {kind.name.lower()}s"
        elif length == 0 and kind is not _K_ATOMIC:
            # zero-length: the R_Key is not checked; writable, as a WRITE stores into it
            return memoryview(bytearray())
        else:
            got = qp.hca.keys.remote(pkt.rkey, self._rqe_pd(pkt), qp.qpn, va, length, right)
            if not isinstance(got, str):
                return got
            reason = got
        if qp.reliable:
            self._fail(pkt, NAK_REMOTE_ACCESS_ERROR, now, reason)
        else:
            qp.hca.counters["drop_uc_access"] += 1
            self.msg = _MSG_DROPPING
        return _R_RKEY

    # --- READ ----------------------------------------------------------------------
    def _recv_read(self, pkt: Packet, now: float) -> RespState:
        view = self._remote(pkt, _K_READ_REQ, pkt.va, pkt.dma_len, now)
        if view is _R_RKEY:
            return RespState.ERR_RKEY_VIOLATION
        n = max(1, -(-pkt.dma_len // self.qp.pmtu))
        self._remember((pkt.psn, n, _K_READ_REQ, pkt.va, pkt.rkey, pkt.dma_len, 0))
        self.epsn = P.add(self.epsn, n)
        self.nak_sent = False
        self.msn = P.add(self.msn, 1)
        self._read_respond(pkt, view, pkt.psn)
        return _R_DONE

    def _read_respond(self, req: Packet, view: memoryview, psn: int) -> None:
        """The READ's responses, as one burst."""
        qp = self.qp
        pmtu = qp.pmtu
        n = max(1, -(-len(view) // pmtu))
        t = qp.transport
        ops = (t | Op.RDMA_READ_RESPONSE_FIRST, t | Op.RDMA_READ_RESPONSE_MIDDLE,
               t | Op.RDMA_READ_RESPONSE_LAST, t | Op.RDMA_READ_RESPONSE_ONLY)  # fmt: skip
        rsp = qp.reply(req, 0, psn, view)
        rsp.syndrome = _ACK_SYNDROME
        rsp.msn = self.msn
        qp.send(burst(rsp, ops, 0, n, n, pmtu, 0))

    # --- atomics -------------------------------------------------------------------
    def _recv_atomic(self, pkt: Packet, info: OpInfo, now: float) -> RespState:
        if pkt.va & 7:
            self._fail(
                pkt, NAK_INVALID_REQUEST, now, f"atomic address {pkt.va:#x} is not 8-byte aligned"
            )
            return _R_MISALIGNED
        view = self._remote(pkt, _K_ATOMIC, pkt.va, 8, now)
        if view is _R_RKEY:
            return RespState.ERR_RKEY_VIOLATION
        orig = int.from_bytes(view, NATIVE)
        if info.op is Op.COMPARE_SWAP:
            if orig == pkt.compare:
                view[:] = (pkt.swap_add & _MASK64).to_bytes(8, NATIVE)
        else:
            view[:] = ((orig + pkt.swap_add) & _MASK64).to_bytes(8, NATIVE)
        self._remember((pkt.psn, 1, _K_ATOMIC, pkt.va, pkt.rkey, 8, orig))
        self.epsn = P.add(self.epsn, 1)
        self.nak_sent = False
        self.msn = P.add(self.msn, 1)
        self._send_atomic_ack(pkt, orig)
        return _R_DONE

    def _send_atomic_ack(self, req: Packet, orig: int) -> None:
        qp = self.qp
        ack = qp.reply(req, qp.transport | Op.ATOMIC_ACKNOWLEDGE, req.psn)
        ack.syndrome = _ACK_SYNDROME
        ack.msn = self.msn
        ack.orig = orig
        qp.send(ack)

    def _remember(self, entry: tuple[int, int, int, int, int, int, int]) -> None:
        replay = self.replay
        replay.append(entry)
        while len(replay) > max(1, self.qp.max_dest_rd_atomic):
            replay.popleft()

    # --- duplicates ------------------------------------------------------------------
    def _duplicate(self, pkt: Packet, info: OpInfo) -> None:
        qp = self.qp
        counters = qp.hca.counters
        qp.count("duplicate_request")
        kind = info.kind
        if kind is _K_READ_REQ or kind is _K_ATOMIC:
            for entry in self.replay:
                off = P.diff(pkt.psn, entry[_R_PSN])
                if entry[_R_KIND] == kind and 0 <= off < entry[_R_NPKTS]:
                    break
            else:
                counters["drop_duplicate_too_old"] += 1
                return
            if kind is _K_ATOMIC:
                self._send_atomic_ack(pkt, entry[_R_ORIG])
                return
            # Execute the READ again from the requested PSN (IBA 9.7.5.1.2).
            got = qp.hca.keys.remote(
                pkt.rkey, self._rqe_pd(pkt), qp.qpn, pkt.va, pkt.dma_len, IBV_ACCESS_REMOTE_READ
            )
            if isinstance(got, str):
                counters["drop_duplicate_read_denied"] += 1
                return
            self._read_respond(pkt, got, pkt.psn)
            return
        self._send_ack(pkt, P.add(self.epsn, -1))

    # --- UC -------------------------------------------------------------------------------
    def _uc_receive(self, pkt: Packet, info: OpInfo, now: float) -> RespState:
        in_order = pkt.psn == self.epsn and self.msg is not _MSG_DROPPING
        if info.first:
            if self.msg is not _MSG_IDLE or not in_order:
                self.qp.hca.counters["uc_resync"] += 1
            self.msg = _MSG_IDLE
            self.epsn = pkt.psn
        elif not in_order or _INSIDE.get(info.kind) is not self.msg:
            self.qp.hca.counters["drop_uc_missing_packet"] += 1
            self.msg = _MSG_DROPPING
            self.wview = None
            return _R_PSN_OUT_OF_SEQ
        if info.kind is _K_SEND:
            return self._recv_send(pkt, info, now)
        return self._recv_write(pkt, info, now)

    # --- UD -------------------------------------------------------------------------------
    def _ud_receive(self, pkt: Packet, info: OpInfo, now: float) -> RespState:
        qp = self.qp
        counters = qp.hca.counters
        if pkt.qkey != qp.qkey:
            counters["qkey_violation"] += 1
            return _R_QKEY
        rqe = self._take_rqe(pkt)
        if rqe is None:
            counters["drop_no_rqe"] += 1
            return _R_RNR
        payload = pkt.payload
        total = _GRH_LEN + len(payload)
        views = self._rqe_views(rqe, qp.pd)
        if isinstance(views, str):
            self._complete_rqe(rqe, _rqe_status(rqe), 0, reason=views)
            qp.to_error(now)
            return _R_RQE
        if total > rqe.length:
            self._complete_rqe(
                rqe, IBV_WC_LOC_LEN_ERR, 0,
                reason=f"a UD message of {len(payload)} bytes + 40-byte GRH exceeds "
                f"the receive WQE's {rqe.length} bytes",
            )  # fmt: skip
            qp.to_error(now)
            return _R_LENGTH
        from softverbs.wire.codec import grh_bytes

        scatter(views, 0, grh_bytes(pkt))
        scatter(views, _GRH_LEN, payload, last=True)
        flags = IBV_WC_GRH
        if info.imm:
            flags |= IBV_WC_WITH_IMM
        self._complete_rqe(rqe, IBV_WC_SUCCESS, total, IBV_WC_RECV, flags, pkt.imm,
                           src_qp=pkt.src_qp, solicited=pkt.se)  # fmt: skip
        return _R_DONE

    # --- flushing -------------------------------------------------------------------------
    def flush(self, fetch: bool = True) -> None:
        """Complete the receive WQE in progress and every fetched one with
        WR_FLUSH_ERR, in order (ERR).  With ``fetch``, first read the doorbell
        record (entering ERR); a doorbell has fetched already, and one doorbell
        fetches -- so flushes -- at most one ring's worth (docs/rings.md)."""
        qp = self.qp
        rqe = self.rqe
        self.rqe = None
        self.msg = _MSG_IDLE
        self.wview = None
        if rqe is not None:
            self._flush_rqe(rqe)
        rq = qp.rq
        if rq is None or qp.srq is not None:
            return
        # Receive WQEs posted without a doorbell message (docs/rings.md) are
        # flushed too: read the doorbell record, as a NIC entering ERR does.
        if fetch:
            rq.latch()
        while self.rq_next < rq.db:
            self._flush_rqe(rq.get(self.rq_next))
            self.rq_next += 1

    def _flush_rqe(self, rqe: Any) -> None:
        qp = self.qp
        cqe = CQE(rqe.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, qp.qpn)
        cqe.reason = "flushed: the QP is in the error state"
        srq = rqe.srq
        ring = srq if srq is not None else qp.rq
        if ring is not None:
            cqe.wq_kind, cqe.wq_handle = ring.tag
        cqe.index = rqe.index
        cq = srq.cq if srq is not None and srq.cq is not None else qp.recv_cq
        qp.push_cqe(cq, cqe)


_FAIL_COUNTER = {
    NAK_INVALID_REQUEST: "resp_invalid_request",
    NAK_REMOTE_ACCESS_ERROR: "resp_remote_access_err",
    NAK_REMOTE_OPERATIONAL_ERROR: "resp_local_err",
}

#: NAK code -> the affiliated event the responder's QP posts when it fails with it
_FAIL_EVENT = {
    NAK_REMOTE_ACCESS_ERROR: IBV_EVENT_QP_ACCESS_ERR,
    NAK_INVALID_REQUEST: IBV_EVENT_QP_REQ_ERR,
}


def _rqe_status(rqe: RecvWQE) -> int:
    """The status of a receive WQE the message cannot use: a malformed slot is
    the QP's own error (LOC_QP_OP_ERR, as a send WQE's); an SGE the keys refuse
    is a protection error (LOC_PROT_ERR)."""
    return IBV_WC_LOC_QP_OP_ERR if rqe.bad else IBV_WC_LOC_PROT_ERR
