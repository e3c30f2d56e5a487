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

Each ring is one object with two faces, the application's and the
device's (``device=True``), which decide which fields live in shared memory
and which are local.  Writers store a slot before publishing its index,
readers read the index before the slot; every index has a single writer and
is read and written as one aligned 8-byte word (:meth:`SharedRegion.words`
-- never with ``struct``, which clears a field before writing it).  On x86
(total store order) that is all the ordering required; other architectures
would need fences.

WQE and CQE layouts are fixed little-endian structs (below).  Pointers to
engine objects are replaced by numbers: a UD route is written out in full,
memory windows and regions by the service's handle numbers.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
from collections.abc import Callable
from typing import Any

from softverbs.engine.queues import CQE, RecvWQE, Route, SendWQE
from softverbs.engine.requester import WR_INFO
from softverbs.enums import IBV_WC_SUCCESS, IBV_WR_BIND_MW, IBV_WR_LOCAL_INV
from softverbs.errors import eopnotsupp

_OPCODES = frozenset(WR_INFO)
_log = logging.getLogger("softverbsd")

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
        self.closed = False
        self._words: list[memoryview] = []

    def words(self, nbytes: int) -> memoryview:
        """The first ``nbytes`` as native 64-bit words (a ring header).

        Indices shared between processes must be read and written whole:
        ``struct.pack_into`` clears its target before it writes, so a reader
        in the other process can see 0 in the middle of an update (a CQ
        consumer index read as 0 looks like an overrun).  A ``'Q'``
        memoryview item is stored and loaded as one aligned 8-byte access.
        """
        words = self.view[:nbytes].cast("Q")
        self._words.append(words)
        return words

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for words in self._words:
            words.release()
        self.view.release()
        # A slice may still be referenced somewhere; the mapping then goes with it.
        with contextlib.suppress(BufferError):
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


# --- layouts ----------------------------------------------------------------

# ring header: eight native 64-bit words (pi, db/taken/ci, ...; see each ring),
# accessed only as whole words (SharedRegion.words)
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


class CorruptWQE(ValueError):
    """A slot holds something post_send never writes."""


def unpack_send(buf: memoryview, off: int, resolve: Callable[[int], Any],
                slot: int | None = None) -> SendWQE:  # fmt: skip
    """The inverse of :func:`pack_send`; ``resolve`` turns handle numbers into MemKeys.

    With ``slot`` (the device side) the WQE is checked: a slot the
    application scribbled on raises :class:`CorruptWQE` instead of handing
    the engine something post_send would never have written.
    """
    (wr_id, opcode, flags, nsge, length, imm, inv_rkey, rkey, remote_addr, compare, swap,
     rqpn, rqkey, srqn, has_route, dgid, sgid, sgid_index, hop, tclass, flow, port,
     mw_h, mr_h, new_key, baddr, blen, bacc, inline_len) = _SEND.unpack_from(buf, off)  # fmt: skip
    if slot is not None:
        if opcode not in _OPCODES:
            raise CorruptWQE(f"opcode {opcode} is not a send opcode")
        room = slot - _SEND.size
        if nsge * _SGE.size + (inline_len if flags & F_INLINE else 0) > room:
            raise CorruptWQE(f"{nsge} SGEs and {inline_len} inline bytes overflow the slot")
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
    if slot is not None and opcode == IBV_WR_BIND_MW and wqe.bind is None:
        raise CorruptWQE("the bind names a window or region this process does not have")
    return wqe


def poisoned(wr_id: int, why: str) -> SendWQE:
    """What the device executes instead of a corrupt WQE: a local operation
    that fails (LOCAL_INV of key 0, never valid), so the WR completes with
    ``IBV_WC_LOC_QP_OP_ERR`` and the QP goes to ERR -- the application's
    ring is its own business, the service goes on."""
    wqe = SendWQE(wr_id, IBV_WR_LOCAL_INV, True, [], 0)
    wqe.inv_rkey = 0
    return wqe


def pack_recv(buf: memoryview, off: int, wqe: RecvWQE) -> None:
    _RECV.pack_into(buf, off, wqe.wr_id, len(wqe.sges), wqe.length)
    pos = off + _RECV.size
    for sge in wqe.sges:
        _SGE.pack_into(buf, pos, *sge)
        pos += _SGE.size


def unpack_recv(buf: memoryview, off: int, slot: int | None = None) -> RecvWQE:
    wr_id, nsge, length = _RECV.unpack_from(buf, off)
    if slot is not None:  # the device side: never read past the slot
        nsge = min(nsge, (slot - _RECV.size) // _SGE.size)
        length = 0
    pos = off + _RECV.size
    sges = []
    for _ in range(nsge):
        sges.append(_SGE.unpack_from(buf, pos))
        pos += _SGE.size
    if slot is not None:
        length = sum(s[1] for s in sges)
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
        self.hdr = region.words(HEADER_SIZE)
        self.size = size
        self.slot = slot

    @staticmethod
    def region_size(size: int, slot: int) -> int:
        return HEADER_SIZE + size * slot

    def _get(self, field: int) -> int:
        return int(self.hdr[field])

    def _set(self, field: int, value: int) -> None:
        self.hdr[field] = value

    def offset(self, index: int) -> int:
        return HEADER_SIZE + (index % self.size) * self.slot


class ShmWorkQueue(_Ring):
    """A send or receive queue in shared memory (engine ``WorkQueue`` interface).

    Header fields: 0 = pi, 1 = db.  ``ci`` is local to the application.

    On the device side (``device=True``) the doorbell index the engine reads
    is the service's own copy, taken from shared memory only when a doorbell
    message arrives (:meth:`latch`) and never more than one ring's worth
    ahead of the last one, and every WQE is checked as it is read: an
    application that scribbles on its ring hurts only its own QP.
    """

    def __init__(self, region: SharedRegion, size: int, slot: int, send: bool,
                 handles: Callable[[Any], int] | None = None,
                 resolve: Callable[[int], Any] | None = None,
                 device: bool = False) -> None:  # fmt: skip
        super().__init__(region, size, slot)
        self.send = send
        self.ci = 0
        self.tag = (WQ_NONE, 0)  #: (WQ_SQ or WQ_RQ, QP number) for CQEs
        self.device = device
        self._db = 0  #: device side: the doorbell as last latched
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
        return self._db if self.device else self._get(1)

    @db.setter
    def db(self, value: int) -> None:
        if self.device:
            # Never behind, never past what was posted, never more than a
            # ring ahead: pi and db are the application's to write.
            self._db = max(self._db, min(value, self._get(0), self._db + self.size))
        else:
            self._set(1, value)

    def latch(self) -> None:
        """Device side: a doorbell rang; take the application's ``db``."""
        self.db = self._get(1)

    # Header field 2 mirrors the QP's state (plus one; 0 = not published), so
    # that the application sees the device move its QP to ERR without asking.
    def publish_state(self, state: int) -> None:
        if not self.region.closed:
            self._set(2, state + 1)

    def published_state(self) -> int | None:
        value = self._get(2)
        return value - 1 if value else None

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
        if not self.send:
            wqe: Any = unpack_recv(self.buf, off, self.slot if self.device else None)
        elif not self.device:
            wqe = unpack_send(self.buf, off, self._resolve)
        else:
            try:
                wqe = unpack_send(self.buf, off, self._resolve, self.slot)
            except CorruptWQE as exc:
                wqe = poisoned(_SEND.unpack_from(self.buf, off)[0], str(exc))
        wqe.index = index
        return wqe

    def release(self, index: int) -> None:
        if index >= self.ci:
            self.ci = index + 1

    def reset(self) -> None:
        self.pi = 0
        self._set(1, 0)
        self._db = 0
        self.ci = 0


class ShmSharedRQ(_Ring):
    """A shared receive queue in shared memory (engine ``SharedRQ`` interface).

    Header fields: 0 = pi (application), 1 = taken (service), 2 = the armed
    ``srq_limit`` (service: armed by a ``modify_srq`` request, disarmed when
    it fires, read by the application's ``query``).  ``outstanding`` is the
    application's count; everything the engine sets is the service's.  The
    application arms the limit through ``on_modify`` (a request: the device
    owns the limit); resizing is not offered (EOPNOTSUPP).
    """

    def __init__(self, region: SharedRegion, size: int, slot: int, max_sge: int,
                 device: bool = False) -> None:  # fmt: skip
        super().__init__(region, size, slot)
        self.max_wr = size
        self.max_sge = max_sge
        self.device = device
        self.tag = (WQ_NONE, 0)  #: (WQ_SRQ, SRQ number) for CQEs
        self.outstanding = 0  # application side
        self.on_modify: Callable[[int], None] | None = None  # application side
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
        if self.region.closed:
            return None
        taken, pi = self._get(1), self._get(0)
        if taken >= pi:
            return None
        wqe = unpack_recv(self.buf, self.offset(taken), self.slot)
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

    @property
    def armed_limit(self) -> int:
        return 0 if self.region.closed else self._get(2)

    @armed_limit.setter
    def armed_limit(self, value: int) -> None:
        if not self.region.closed:
            self._set(2, value)

    def modify(self, max_wr: int | None, limit: int | None) -> None:
        if self.device:
            if limit is not None:
                self.armed_limit = limit
            return
        if max_wr is not None and max_wr != self.max_wr:
            raise eopnotsupp("resizing an SRQ is not supported on a device served by "
                             "softverbsd; create it with the max_wr it needs")  # fmt: skip
        if limit is not None and self.on_modify is not None:
            self.on_modify(limit)


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
                 wq_of: Callable[[int, int], Any] | None = None,
                 device: bool = False) -> None:  # fmt: skip
        super().__init__(region, size, CQE_SIZE)
        self.device = device
        self._capacity = size
        self.notify: Callable[[], None] | None = None
        self.owner: Any = None
        self._wq_of = wq_of
        self.wq_ids: Callable[[Any], tuple[int, int]] = lambda _wq: (WQ_NONE, 0)

    @property
    def capacity(self) -> int:
        return self._capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        """``CQ.resize``: the service sized the ring; it cannot be resized."""
        if value != self._capacity:
            raise eopnotsupp("resizing a CQ is not supported on a device served by "
                             "softverbsd; create it with the cqe it needs")  # fmt: skip

    # --- service side: engine interface ------------------------------------------
    @property
    def error(self) -> bool:
        return not self.region.closed and bool(self._get(self.ERROR))

    @error.setter
    def error(self, value: bool) -> None:
        if not self.region.closed:
            self._set(self.ERROR, int(value))

    @property
    def armed(self) -> bool:
        return self._get(self.ARM) >> 1 != self._get(self.FIRED)

    def push(self, cqe: CQE) -> bool:
        if self.region.closed:  # its process is gone; nobody will poll it
            return True
        buf, hdr = self.buf, self.hdr
        pi, ci, error = hdr[0], hdr[1], hdr[4]
        if error:
            return False
        if pi - ci >= self.capacity:
            _log.warning("CQ overrun: %d CQEs written, %d polled, capacity %d (%r)", pi, ci,
                         self.capacity, self.owner)  # fmt: skip
            self._set(self.ERROR, 1)
            return False
        kind, wq_id = self.wq_ids(cqe.wq)
        pack_cqe(buf, self.offset(pi), cqe, kind, wq_id)
        hdr[0] = pi + 1
        # The arm request is read after the CQE is published: an application
        # that arms and then finds the CQ empty is sure to get its event.
        arm, fired = hdr[2], hdr[3]
        if arm >> 1 != fired and (
            not arm & 1 or cqe.solicited or cqe.status != IBV_WC_SUCCESS
        ):
            self._set(self.FIRED, arm >> 1)
            if self.notify is not None:
                self.notify()
        return True

    def purge(self, qp: object) -> list[CQE]:
        """Mark ``qp``'s un-polled CQEs dead (RESET, destroy); the poller skips them."""
        qpn = getattr(qp, "qpn", -1)
        if self.region.closed:
            return []
        pi = self._get(self.PI)
        for i in range(max(self._get(self.CI), pi - self.capacity), pi):
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
