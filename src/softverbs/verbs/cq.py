"""Completion queues, completion channels and work completions (pyverbs ``cq``).

``CQ.poll`` is where the application consumes completions -- and where send
and receive queue slots are given back (see :mod:`softverbs.engine.queues`):
polling the CQE of a WQE releases that WQE's slot and every earlier one of
the same queue.  A send queue full of unsignaled WQEs therefore never drains.
"""

from __future__ import annotations

import errno
from collections import deque
from typing import Any

from softverbs.device import ops, records
from softverbs.engine.rings import CQE, CompletionRing, WorkRing
from softverbs.enums import (
    IBV_WC_BAD_RESP_ERR,
    IBV_WC_FATAL_ERR,
    IBV_WC_GENERAL_ERR,
    IBV_WC_INV_EEC_STATE_ERR,
    IBV_WC_INV_EECN_ERR,
    IBV_WC_LOC_ACCESS_ERR,
    IBV_WC_LOC_EEC_OP_ERR,
    IBV_WC_LOC_LEN_ERR,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_LOC_QP_OP_ERR,
    IBV_WC_LOC_RDD_VIOL_ERR,
    IBV_WC_MW_BIND_ERR,
    IBV_WC_REM_ABORT_ERR,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_REM_INV_RD_REQ_ERR,
    IBV_WC_REM_INV_REQ_ERR,
    IBV_WC_REM_OP_ERR,
    IBV_WC_RESP_TIMEOUT_ERR,
    IBV_WC_RETRY_EXC_ERR,
    IBV_WC_RNR_RETRY_EXC_ERR,
    IBV_WC_SUCCESS,
    IBV_WC_TM_ERR,
    IBV_WC_TM_RNDV_INCOMPLETE,
    IBV_WC_WR_FLUSH_ERR,
)
from softverbs.errors import PyverbsRDMAError, einval
from softverbs.verbs.base import PyverbsCM, PyverbsObject, as_count, require
from softverbs.verbs.device import LIMITS, Context
from softverbs.verbs.provider import Attach, destroy, forked_error

#: libibverbs' ``ibv_wc_status_str`` texts.
WC_STATUS_STR: dict[int, str] = {
    IBV_WC_SUCCESS: "success",
    IBV_WC_LOC_LEN_ERR: "local length error",
    IBV_WC_LOC_QP_OP_ERR: "local QP operation error",
    IBV_WC_LOC_EEC_OP_ERR: "local EE context operation error",
    IBV_WC_LOC_PROT_ERR: "local protection error",
    IBV_WC_WR_FLUSH_ERR: "Work Request Flushed Error",
    IBV_WC_MW_BIND_ERR: "memory management operation error",
    IBV_WC_BAD_RESP_ERR: "bad response error",
    IBV_WC_LOC_ACCESS_ERR: "local access error",
    IBV_WC_REM_INV_REQ_ERR: "remote invalid request error",
    IBV_WC_REM_ACCESS_ERR: "remote access error",
    IBV_WC_REM_OP_ERR: "remote operation error",
    IBV_WC_RETRY_EXC_ERR: "transport retry counter exceeded",
    IBV_WC_RNR_RETRY_EXC_ERR: "RNR retry counter exceeded",
    IBV_WC_LOC_RDD_VIOL_ERR: "local RDD violation error",
    IBV_WC_REM_INV_RD_REQ_ERR: "remote invalid RD request",
    IBV_WC_REM_ABORT_ERR: "aborted error",
    IBV_WC_INV_EECN_ERR: "invalid EE context number",
    IBV_WC_INV_EEC_STATE_ERR: "invalid EE context state",
    IBV_WC_FATAL_ERR: "fatal error",
    IBV_WC_RESP_TIMEOUT_ERR: "response timeout error",
    IBV_WC_GENERAL_ERR: "general error",
    IBV_WC_TM_ERR: "TM error",
    IBV_WC_TM_RNDV_INCOMPLETE: "TM software rendezvous",
}


_WITH_IMM = 2  # IBV_WC_WITH_IMM


def be32_field(value: int) -> int:
    """A ``__be32`` field holding the 32-bit value ``value``, read as a host integer
    (what pyverbs returns for ``imm_data``): the bytes swapped on this host."""
    import sys

    v = value & 0xFFFFFFFF
    return int.from_bytes(v.to_bytes(4, "big"), sys.byteorder)


def wc_status_str(status: int) -> str:
    """``ibv_wc_status_str``."""
    return WC_STATUS_STR.get(status, "unknown")


class WC(PyverbsObject):
    """A work completion (``ibv_wc``).

    Beyond pyverbs: ``reason`` says in words why a completion failed (empty on
    success), and ``invalidated_rkey`` names the union member of ``imm_data``.
    """

    __slots__ = (
        "byte_len",
        "dlid_path_bits",
        "imm_data",
        "opcode",
        "pkey_index",
        "qp_num",
        "reason",
        "sl",
        "slid",
        "src_qp",
        "status",
        "vendor_err",
        "wc_flags",
        "wr_id",
    )

    def __init__(
        self,
        wr_id: int = 0,
        status: int = 0,
        opcode: int = 0,
        vendor_err: int = 0,
        byte_len: int = 0,
        qp_num: int = 0,
        src_qp: int = 0,
        imm_data: int = 0,
        wc_flags: int = 0,
        pkey_index: int = 0,
        slid: int = 0,
        sl: int = 0,
        dlid_path_bits: int = 0,
    ) -> None:
        self.wr_id = wr_id
        self.status = status
        self.opcode = opcode
        self.vendor_err = vendor_err
        self.byte_len = byte_len
        self.qp_num = qp_num
        self.src_qp = src_qp
        self.imm_data = imm_data
        self.wc_flags = wc_flags
        self.pkey_index = pkey_index
        self.slid = slid
        self.sl = sl
        self.dlid_path_bits = dlid_path_bits
        self.reason = ""

    @classmethod
    def from_cqe(cls, cqe: CQE) -> WC:
        return _fill_wc(cls.__new__(cls), cqe)

    @property
    def invalidated_rkey(self) -> int:
        return self.imm_data

    def __repr__(self) -> str:
        extra = f", reason={self.reason!r}" if self.reason else ""
        return (
            f"WC(wr_id={self.wr_id}, status={wc_status_str(self.status)!r}, "
            f"opcode={self.opcode}, byte_len={self.byte_len}, qp_num={self.qp_num:#x}{extra})"
        )

    def __str__(self) -> str:
        f = "{:22}: {:<20}\n"
        return (
            "WC:\n" + f.format("WR ID", self.wr_id)
            + f.format("status", wc_status_str(self.status)) + f.format("opcode", self.opcode)
            + f.format("vendor error", self.vendor_err) + f.format("byte length", self.byte_len)
            + f.format("QP num", self.qp_num) + f.format("source QP", self.src_qp)
            + f.format("WC flags", self.wc_flags) + f.format("imm_data", self.imm_data)
            + (f.format("reason", self.reason) if self.reason else "")
        )  # fmt: skip


def _fill_wc(wc: WC, cqe: CQE) -> WC:
    """``wc`` with the fields of ``cqe`` (typed in cq.pxd: C struct reads and writes)."""
    wc.wr_id = cqe.wr_id
    wc.status = cqe.status
    wc.opcode = cqe.opcode
    wc.vendor_err = cqe.vendor_err
    wc.byte_len = cqe.byte_len
    wc.qp_num = cqe.qp_num
    wc.src_qp = cqe.src_qp
    # ibv_wc.imm_data is a __be32 (the ImmDt bytes as they came); the
    # invalidated rkey sharing its place is host order
    wc.imm_data = be32_field(cqe.imm) if cqe.wc_flags & _WITH_IMM else cqe.imm
    wc.wc_flags = cqe.wc_flags
    wc.pkey_index = 0
    wc.slid = cqe.slid
    wc.sl = cqe.sl
    wc.dlid_path_bits = 0
    wc.reason = cqe.reason
    return wc


def _give_back(cqes: list[CQE], rings: dict[tuple[int, int], Any]) -> None:
    """Give each polled CQE's WQE slot back to its queue (``rings``: the device's
    queues by (kind, handle)).

    The CQEs of a poll mostly come from one queue, which is looked up once per
    run of them.  A send or receive queue (``WorkRing``) completes its WQEs in
    the order they were posted, and releasing one releases every earlier slot,
    so it is told once per run, with the run's last CQE; an SRQ counts every
    CQE.  Compiled, the CQEs are read as C structs (``cq.pxd``)."""
    kind = handle = -1
    wq: Any = None
    pending: WorkRing | None = None  # a queue whose run's last CQE is not yet released
    last = 0
    for cqe in cqes:
        if cqe.wq_kind:
            if cqe.wq_kind != kind or cqe.wq_handle != handle:
                if pending is not None:
                    pending.release(last)
                    pending = None
                kind = cqe.wq_kind
                handle = cqe.wq_handle
                wq = rings.get((kind, handle))
            if type(wq) is WorkRing:
                pending = wq
                last = cqe.index
            elif wq is not None:
                wq.release(cqe.index)
    if pending is not None:
        pending.release(last)


class CompChannel(PyverbsCM):
    """A completion event channel: ``CompChannel(ctx)``."""

    close_rank = 70

    def __init__(self, context: Context) -> None:
        super().__init__()
        require(context, Context, "context")
        self.context = context
        self._ctx = context
        self.pending: deque[CQBase] = deque()
        attach = Attach(sink=self._fire_handle)
        self.dev_handle: int = context.provider.call(
            ops.CREATE_COMP_CHANNEL, records.Ctx(context.handle, 0), attach).handle
        self._fd = attach.fd_out
        context.add_ref(self)

    @property
    def fd(self) -> int:
        """The channel's file descriptor: readable when an event waits (a served
        device's event socket); -1 on an in-process device, which has none."""
        return self._fd

    def get_cq_event(self, expected_cq: CQBase, timeout: float | None = None) -> None:
        """Wait for the next completion event (``ibv_get_cq_event``).

        ``timeout`` (seconds) is a softverbs addition; on timeout: EAGAIN.
        """
        self._check_open()
        rt = self.context.runtime
        if not rt.wait_for(lambda: bool(self.pending), timeout):
            raise PyverbsRDMAError("Failed to get CQ event: none arrived in time", 11)
        with rt.lock:
            cq = self.pending.popleft()
        if cq is not expected_cq:
            raise PyverbsRDMAError("Received event on an unexpected CQ")
        cq.num_events += 1

    def _fire_handle(self, cq_handle: int) -> None:
        """The device's completion event for CQ ``cq_handle``."""
        cq = self.context.objects.get(cq_handle)
        if isinstance(cq, CQBase):
            self.pending.append(cq)

    def _release(self) -> None:
        destroy(self.context.provider, records.KIND_CHANNEL, self.dev_handle)


class CQBase(PyverbsCM):
    """What CQ and CQEX share: the ring, the channel, the comp vector, close().

    pyverbs' ``CQ`` and ``CQEX`` are unrelated classes; a QP, an SRQ or a WQ
    takes either.  This common base is how softverbs says "either".
    """

    close_rank = 60

    def __init__(
        self,
        context: Context,
        cqe: Any,
        cq_context: Any = None,
        channel: CompChannel | None = None,
        comp_vector: Any = 0,
    ) -> None:
        super().__init__()
        require(context, Context, "context")
        context._check_open()
        cqe = as_count(cqe, "cqe")
        comp_vector = as_count(comp_vector, "comp_vector")
        if not 1 <= cqe <= LIMITS["max_cqe"]:
            raise einval(f"Failed to create a CQ: cqe {cqe} is out of range; a CQ holds "
                         f"1..{LIMITS['max_cqe']} entries")  # fmt: skip
        if channel is not None:
            require(channel, CompChannel, "channel")
            channel._check_open()
        if not 0 <= comp_vector < context.num_comp_vectors:
            raise einval(
                f"Failed to create a CQ: comp_vector {comp_vector} is out of range; the "
                f"device has {context.num_comp_vectors} completion vector(s)"
            )
        self.context = context
        self._ctx = context
        self.channel = channel
        self.cq_context = cq_context
        self.comp_vector = comp_vector
        self.num_events = 0
        provider = context.provider
        self.ring: CompletionRing = provider.cq_ring(cqe)
        body = records.CreateCQ(context.handle, cqe, channel.dev_handle if channel else 0,
                                comp_vector)
        try:
            self.dev_handle: int = provider.call(ops.CREATE_CQ, body, Attach(cq=self.ring)).cq
        except BaseException:
            provider.free_ring(self.ring)
            raise
        context.register(self, self.dev_handle)
        if channel is not None:
            channel.add_ref(self)
        context.add_ref(self)

    @property
    def cqe(self) -> int:
        return self.ring.capacity

    @property
    def comp_channel(self) -> CompChannel | None:
        return self.channel

    @property
    def handle(self) -> int:
        return id(self) & 0xFFFFFFFF

    def _take(self, num_entries: int) -> list[CQE]:
        """Consume up to ``num_entries`` CQEs and give their WQ slots back."""
        if self.context.provider.forked:
            raise forked_error("poll")
        ring = self.ring
        rt = self.context.runtime
        rings = self.context.device.rings
        with rt.lock:
            rt.progress()
            cqes = ring.take(num_entries)
            if not cqes:
                rt.idle_step()  # a virtual clock moves on when the poller finds nothing
                cqes = ring.take(num_entries)
            _give_back(cqes, rings)
        return cqes

    def req_notify(self, solicited_only: bool = False) -> None:
        """Arm the CQ: the next (solicited) completion posts one event."""
        self._check_open()
        if self.channel is None:
            raise einval("req_notify needs a CQ created with a completion channel")
        with self.context.lock:  # its release is the full barrier after the arm
            self.ring.arm(bool(solicited_only))  # (docs/rings.md, Arming)

    def ack_events(self, num_events: int) -> None:
        self.num_events = max(0, self.num_events - num_events)

    def _release(self) -> None:
        provider = self.context.provider
        destroy(provider, records.KIND_CQ, self.dev_handle)
        provider.free_ring(self.ring)

    @property
    def error(self) -> bool:
        """True after an overrun (a softverbs addition)."""
        return self.ring.in_error

    def __str__(self) -> str:
        f = "{:22}: {:<20}\n"
        return f"{type(self).__name__}\n" + f.format("Handle", self.handle) + f.format(
            "CQEs", self.cqe
        )


class CQ(CQBase):
    """A completion queue: ``CQ(ctx, cqe, cq_context, channel, comp_vector)``."""

    def poll(self, num_entries: int = 1) -> tuple[int, list[WC]]:
        """Take up to ``num_entries`` completions: ``(npolled, [WC, ...])``."""
        self._check_open()
        out = [_fill_wc(WC.__new__(WC), cqe)
               for cqe in self._take(as_count(num_entries, "num_entries"))]  # fmt: skip
        return len(out), out

    def resize(self, cqe: int) -> None:
        """``ibv_resize_cq``: EINVAL below the completions waiting to be polled."""
        self._check_open()
        cqe = as_count(cqe, "cqe")
        with self.context.lock:
            waiting = self.ring.pending()
            if not 1 <= cqe <= LIMITS["max_cqe"] or cqe < waiting:
                raise PyverbsRDMAError(
                    f"Failed to resize CQ: it must hold 1..{LIMITS['max_cqe']} entries and "
                    f"at least the {waiting} waiting to be polled; {cqe} was asked",
                    errno.EINVAL,
                )
            provider = self.context.provider
            new = provider.cq_ring(cqe)
            try:
                provider.call(ops.RESIZE_CQ, records.ResizeCQ(self.dev_handle, cqe), Attach(cq=new))
            except BaseException:
                provider.free_ring(new)
                raise
            provider.adopt_cq(self.ring, new)
