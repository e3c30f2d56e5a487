"""Shared-memory rings between an application and the device service.

When a device is served by ``softverbsd``, its engine runs in the service
process but the application's queues stay hardware-like: they are rings in
memory both processes map (a ``memfd`` passed over the Unix socket), exactly
as a NIC's queues live in host memory.

* **Send / receive queue** (:class:`ShmWorkQueue`): the application writes
  WQEs into slots and moves ``pi``; ringing the doorbell writes ``db`` and
  sends a short socket message; the service reads slots below ``db``.  The
  consumer index ``ci`` (slots freed by polling) is the application's alone.
* **Shared receive queue** (:class:`ShmSharedRQ`): the application produces
  at ``pi``, the service consumes at ``taken``; ``outstanding`` (posted and
  not yet polled) is the application's count for ENOMEM.
* **Completion queue** (:class:`ShmCompletionQueue`): the service produces
  CQEs at ``pi``, the application consumes at ``ci``.  Arming writes a new
  arm sequence number (and the solicited-only bit); the service fires when
  it pushes a matching CQE while the arm sequence differs from the last one
  it fired, then records that one -- so each field has a single writer.  A
  CQ overrun is detected by the service from ``pi - ci`` and recorded in
  ``error``.  Removing a QP's un-polled CQEs (RESET, destroy) marks their
  slots dead; polling skips dead slots.

Each ring is one object with two faces: ``side="app"`` or ``side="device"``
decides which fields live in shared memory and which are local.  Writers
store a slot before publishing its index, readers read the index before the
slot; every index has a single writer.  On x86 (total store order) that is
all the ordering required; other architectures would need fences.

WQE and CQE layouts are fixed little-endian structs (below).  Pointers to
engine objects are replaced by numbers: a UD route is written out in full,
memory windows and regions by the service's handle numbers.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Callable
from typing import Any

from softverbs.engine.queues import CQE, RecvWQE, Route, SendWQE
from softverbs.enums import IBV_WC_SUCCESS

# --- memory ---------------------------------------------------------------


class SharedRegion:
    """An anonymous shared file, mapped here: ``fd`` can be sent to the service."""

    def __init__(self, size: int, fd: int | None = None, name: str = "softverbs") -> None:
        self.size = max(size, 1)
        if fd is None:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            os.ftruncate(fd, self.size)
        elif os.fstat(fd).st_size < self.size:
            os.close(fd)
            raise ValueError(f"shared file is smaller than the {self.size} bytes required")
        self.fd = fd
        self.mm = mmap.mmap(fd, self.size)
        self.view = memoryview(self.mm)

    def close(self) -> None:
        self.view.release()
        # A slice may still be referenced somewhere; the mapping then goes with it.
        with contextlib.suppress(BufferError):
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


# --- layouts ----------------------------------------------------------------

# ring header: pi, db/taken/ci, flags ...
_HDR = struct.Struct("<QQQQ")
HEADER_SIZE = 64

# send WQE: wr_id opcode flags nsge length imm inv_rkey rkey remote_addr compare swap
#           remote_qpn remote_qkey xrc_srqn
#           route: has dgid(16) sgid(16) sgid_index hop tclass flow port
#           bind: mw_handle mr_handle new_key addr length access
#           inline_len
_SEND = struct.Struct("<QBBHIIIIQQQIII B16s16sBBBIB IIIQQI I")
_SGE = struct.Struct("<QII")
_RECV = struct.Struct("<QHI")

F_SIGNALED, F_FENCE, F_SE, F_INLINE = 1, 2, 4, 8

# CQE: wr_id byte_len imm qp_num src_qp wc_flags vendor_err status opcode solicited
#      dead wq_kind wq_id index reason_len reason
_CQE = struct.Struct("<QIIIIIIHHBBBIQB71s")
CQE_SIZE = 128
_DEAD_OFFSET = struct.calcsize("<QIIIIIIHHB")  # the 'dead' byte within a CQE slot
assert _CQE.size <= CQE_SIZE

#: which ring a CQE releases a slot of
WQ_NONE, WQ_SQ, WQ_RQ, WQ_SRQ = 0, 1, 2, 3


def send_slot_size(max_sge: int, max_inline: int) -> int:
    raw = _SEND.size + max(max_sge, 1) * _SGE.size + max_inline
    return (raw + 63) & ~63


def recv_slot_size(max_sge: int) -> int:
    return (_RECV.size + max(max_sge, 1) * _SGE.size + 15) & ~15


def pack_send(buf: memoryview, off: int, wqe: SendWQE, handles: Callable[[Any], int]) -> None:
    """Serialize a send WQE; ``handles`` turns a MemKey into the service's number."""
    flags = (
        (F_SIGNALED if wqe.signaled else 0)
        | (F_FENCE if wqe.fence else 0)
        | (F_SE if wqe.se else 0)
        | (F_INLINE if wqe.inline is not None else 0)
    )
    r = wqe.route
    bind = wqe.bind
    inline = wqe.inline or b""
    _SEND.pack_into(
        buf, off, wqe.wr_id, wqe.opcode, flags, len(wqe.sges), wqe.length, wqe.imm,
        wqe.inv_rkey, wqe.rkey, wqe.remote_addr, wqe.compare_add, wqe.swap,
        wqe.remote_qpn, wqe.remote_qkey, wqe.xrc_srqn,
        1 if r is not None else 0,
        r.dgid if r else b"", r.sgid if r else b"", r.sgid_index if r else 0,
        r.hop_limit if r else 0, r.tclass if r else 0, r.flow_label if r else 0,
        r.port if r else 0,
        handles(bind[0]) if bind else 0, handles(bind[1]) if bind else 0,
        bind[2] if bind else 0, bind[3] if bind else 0, bind[4] if bind else 0,
        bind[5] if bind else 0,
        len(inline),
    )  # fmt: skip
    pos = off + _SEND.size
    for sge in wqe.sges:
        _SGE.pack_into(buf, pos, *sge)
        pos += _SGE.size
    buf[pos : pos + len(inline)] = inline


def unpack_send(buf: memoryview, off: int, resolve: Callable[[int], Any]) -> SendWQE:
    """The inverse of :func:`pack_send`; ``resolve`` turns handle numbers into MemKeys."""
    (wr_id, opcode, flags, nsge, length, imm, inv_rkey, rkey, remote_addr, compare, swap,
     rqpn, rqkey, srqn, has_route, dgid, sgid, sgid_index, hop, tclass, flow, port,
     mw_h, mr_h, new_key, baddr, blen, bacc, inline_len) = _SEND.unpack_from(buf, off)  # fmt: skip
    pos = off + _SEND.size
    sges = []
    for _ in range(nsge):
        sges.append(_SGE.unpack_from(buf, pos))
        pos += _SGE.size
    wqe = SendWQE(wr_id, opcode, bool(flags & F_SIGNALED), sges, length)
    wqe.fence = bool(flags & F_FENCE)
    wqe.se = bool(flags & F_SE)
    if flags & F_INLINE:
        wqe.inline = bytes(buf[pos : pos + inline_len])
    wqe.imm, wqe.inv_rkey, wqe.rkey = imm, inv_rkey, rkey
    wqe.remote_addr, wqe.compare_add, wqe.swap = remote_addr, compare, swap
    wqe.remote_qpn, wqe.remote_qkey, wqe.xrc_srqn = rqpn, rqkey, srqn
    if has_route:
        wqe.route = Route(bytes(dgid), bytes(sgid), sgid_index, hop, tclass, flow, port)
    if mw_h:
        mw, mr = resolve(mw_h), resolve(mr_h)
        wqe.bind = (mw, mr, new_key, baddr, blen, bacc) if mw is not None and mr is not None \
            else None  # fmt: skip
    return wqe


def pack_recv(buf: memoryview, off: int, wqe: RecvWQE) -> None:
    _RECV.pack_into(buf, off, wqe.wr_id, len(wqe.sges), wqe.length)
    pos = off + _RECV.size
    for sge in wqe.sges:
        _SGE.pack_into(buf, pos, *sge)
        pos += _SGE.size


def unpack_recv(buf: memoryview, off: int) -> RecvWQE:
    wr_id, nsge, length = _RECV.unpack_from(buf, off)
    pos = off + _RECV.size
    sges = []
    for _ in range(nsge):
        sges.append(_SGE.unpack_from(buf, pos))
        pos += _SGE.size
    return RecvWQE(wr_id, sges, length)


def pack_cqe(buf: memoryview, off: int, cqe: CQE, wq_kind: int, wq_id: int) -> None:
    reason = cqe.reason.encode("utf-8", "replace")[:71]
    _CQE.pack_into(
        buf, off, cqe.wr_id, cqe.byte_len, cqe.imm & 0xFFFFFFFF, cqe.qp_num, cqe.src_qp,
        cqe.wc_flags, cqe.vendor_err, cqe.status, cqe.opcode, int(cqe.solicited), 0,
        wq_kind, wq_id, cqe.index, len(reason), reason,
    )  # fmt: skip


def unpack_cqe(buf: memoryview, off: int) -> tuple[CQE, int, int, bool]:
    """(CQE, wq kind, wq id, dead)."""
    (wr_id, byte_len, imm, qp_num, src_qp, wc_flags, vendor_err, status, opcode, solicited,
     dead, wq_kind, wq_id, index, rlen, reason) = _CQE.unpack_from(buf, off)  # fmt: skip
    cqe = CQE(wr_id, status, opcode, qp_num, byte_len, wc_flags, imm)
    cqe.src_qp = src_qp
    cqe.vendor_err = vendor_err
    cqe.solicited = bool(solicited)
    cqe.index = index
    cqe.reason = reason[:rlen].decode("utf-8", "replace")
    return cqe, wq_kind, wq_id, bool(dead)


# --- rings -------------------------------------------------------------------


class _Ring:
    """Header + fixed-size slots in a SharedRegion."""

    def __init__(self, region: SharedRegion, size: int, slot: int) -> None:
        self.region = region
        self.buf = region.view
        self.size = size
        self.slot = slot

    @staticmethod
    def region_size(size: int, slot: int) -> int:
        return HEADER_SIZE + size * slot

    def _get(self, field: int) -> int:
        return int(struct.unpack_from("<Q", self.buf, field * 8)[0])

    def _set(self, field: int, value: int) -> None:
        struct.pack_into("<Q", self.buf, field * 8, value)

    def offset(self, index: int) -> int:
        return HEADER_SIZE + (index % self.size) * self.slot


class ShmWorkQueue(_Ring):
    """A send or receive queue in shared memory (engine ``WorkQueue`` interface).

    Header fields: 0 = pi, 1 = db.  ``ci`` is local to the application.
    """

    def __init__(self, region: SharedRegion, size: int, slot: int, send: bool,
                 handles: Callable[[Any], int] | None = None,
                 resolve: Callable[[int], Any] | None = None) -> None:  # fmt: skip
        super().__init__(region, size, slot)
        self.send = send
        self.ci = 0
        self.tag = (WQ_NONE, 0)  #: (WQ_SQ or WQ_RQ, QP number) for CQEs
        self._handles = handles or (lambda _k: 0)
        self._resolve = resolve or (lambda _h: None)

    @property
    def pi(self) -> int:
        return self._get(0)

    @pi.setter
    def pi(self, value: int) -> None:
        self._set(0, value)

    @property
    def db(self) -> int:
        return self._get(1)

    @db.setter
    def db(self, value: int) -> None:
        self._set(1, value)

    @property
    def used(self) -> int:
        return self.pi - self.ci

    def push(self, wqe: Any) -> None:
        pi = self.pi
        wqe.index = pi
        if self.send:
            pack_send(self.buf, self.offset(pi), wqe, self._handles)
        else:
            pack_recv(self.buf, self.offset(pi), wqe)
        self.pi = pi + 1

    def get(self, index: int) -> Any:
        off = self.offset(index)
        wqe = unpack_send(self.buf, off, self._resolve) if self.send else unpack_recv(self.buf, off)
        wqe.index = index
        return wqe

    def release(self, index: int) -> None:
        if index >= self.ci:
            self.ci = index + 1

    def reset(self) -> None:
        self.pi = 0
        self.db = 0
        self.ci = 0


class ShmSharedRQ(_Ring):
    """A shared receive queue in shared memory (engine ``SharedRQ`` interface).

    Header fields: 0 = pi (application), 1 = taken (service).  ``outstanding``
    is the application's count; the limit and everything the engine sets are
    the service's.
    """

    def __init__(self, region: SharedRegion, size: int, slot: int, max_sge: int) -> None:
        super().__init__(region, size, slot)
        self.max_wr = size
        self.max_sge = max_sge
        self.tag = (WQ_NONE, 0)  #: (WQ_SRQ, SRQ number) for CQEs
        self.outstanding = 0  # application side
        self.armed_limit = 0  # service side
        self.srqn = 0
        self.xrcd: object = None
        self.cq: Any = None
        self.pd: object = None
        self.owner: Any = None
        self.on_limit: Callable[[Any], None] | None = None

    def post(self, wqe: RecvWQE) -> None:
        pi = self._get(0)
        wqe.index = pi
        pack_recv(self.buf, self.offset(pi), wqe)
        self._set(0, pi + 1)
        self.outstanding += 1

    def take(self) -> RecvWQE | None:
        taken, pi = self._get(1), self._get(0)
        if taken >= pi:
            return None
        wqe = unpack_recv(self.buf, self.offset(taken))
        wqe.index = taken
        wqe.srq = self  # type: ignore[assignment]
        self._set(1, taken + 1)
        left = pi - taken - 1
        if self.armed_limit and left < self.armed_limit:
            self.armed_limit = 0
            if self.on_limit is not None:
                self.on_limit(self)
        return wqe

    def release(self, index: int) -> None:
        self.outstanding -= 1

    def modify(self, max_wr: int | None, limit: int | None) -> None:
        if limit is not None:
            self.armed_limit = limit


class ShmCompletionQueue(_Ring):
    """A CQ in shared memory (engine ``CompletionQueue`` interface).

    Header fields, each with one writer: 0 = pi (service), 1 = ci
    (application), 2 = arm request ``seq << 1 | solicited_only``
    (application), 3 = last fired arm sequence (service), 4 = error
    (service).  The application's ``take`` resolves which ring each CQE
    frees a slot of through ``wq_of(kind, id)``.
    """

    PI, CI, ARM, FIRED, ERROR = range(5)

    def __init__(self, region: SharedRegion, size: int,
                 wq_of: Callable[[int, int], Any] | None = None) -> None:  # fmt: skip
        super().__init__(region, size, CQE_SIZE)
        self.capacity = size
        self.notify: Callable[[], None] | None = None
        self.owner: Any = None
        self._wq_of = wq_of
        self.wq_ids: Callable[[Any], tuple[int, int]] = lambda _wq: (WQ_NONE, 0)

    # --- service side: engine interface ------------------------------------------
    @property
    def error(self) -> bool:
        return bool(self._get(self.ERROR))

    @error.setter
    def error(self, value: bool) -> None:
        self._set(self.ERROR, int(value))

    @property
    def armed(self) -> bool:
        return self._get(self.ARM) >> 1 != self._get(self.FIRED)

    def push(self, cqe: CQE) -> bool:
        if self._get(self.ERROR):
            return False
        pi, ci = self._get(self.PI), self._get(self.CI)
        if pi - ci >= self.capacity:
            self._set(self.ERROR, 1)
            return False
        kind, wq_id = self.wq_ids(cqe.wq)
        pack_cqe(self.buf, self.offset(pi), cqe, kind, wq_id)
        self._set(self.PI, pi + 1)
        arm = self._get(self.ARM)
        if arm >> 1 != self._get(self.FIRED) and (
            not arm & 1 or cqe.solicited or cqe.status != IBV_WC_SUCCESS
        ):
            self._set(self.FIRED, arm >> 1)
            if self.notify is not None:
                self.notify()
        return True

    def purge(self, qp: object) -> list[CQE]:
        """Mark ``qp``'s un-polled CQEs dead (RESET, destroy); the poller skips them."""
        qpn = getattr(qp, "qpn", -1)
        for i in range(self._get(self.CI), self._get(self.PI)):
            off = self.offset(i)
            cqe, _, _, dead = unpack_cqe(self.buf, off)
            if not dead and cqe.qp_num == qpn:
                self.buf[off + _DEAD_OFFSET] = 1
        return []

    # --- application side --------------------------------------------------------------
    def take(self, n: int) -> list[CQE]:
        ci, pi = self._get(self.CI), self._get(self.PI)
        out: list[CQE] = []
        while ci < pi and len(out) < n:
            cqe, kind, wq_id, dead = unpack_cqe(self.buf, self.offset(ci))
            ci += 1
            wq = self._wq_of(kind, wq_id) if self._wq_of is not None else None
            if dead:
                # The QP was reset: its own rings restarted, but an SRQ slot it
                # used is still the application's to give back.
                if kind == WQ_SRQ and wq is not None:
                    wq.release(cqe.index)
                continue
            cqe.wq = wq
            out.append(cqe)
        self._set(self.CI, ci)
        return out

    def pending(self) -> int:
        return self._get(self.PI) - self._get(self.CI)

    def arm(self, solicited_only: bool) -> None:
        seq = (self._get(self.ARM) >> 1) + 1
        self._set(self.ARM, seq << 1 | int(solicited_only))
