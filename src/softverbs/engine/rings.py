"""Rings: send, receive and shared receive queues, and completion queues.

Every queue of every kind of device is one of the three ring classes here:
:class:`WorkRing` (a send or a receive queue), :class:`SharedRecvRing` (an
SRQ) and :class:`CompletionRing` (a CQ).  Each has two faces, as a NIC's
queues do: the *application's* (the driver: ``verbs/`` in Python, or the C
``libibverbs``), which produces WQEs and consumes CQEs, and the *device's*
(the engine), which consumes WQEs and produces CQEs.  The two faces meet in
a 64-byte header of eight 64-bit words and an array of slots.

Indices only grow (they are never reset; a slot is ``index % size``), and
each header word has exactly one writer:

=========  ======================  =========================================
ring       application writes      device writes
=========  ======================  =========================================
SQ, RQ     0 ``pi``, 1 ``db``       2 QP state + 1 (0: not yet published)
SRQ        0 ``pi``                 1 ``taken``, 2 armed ``srq_limit``,
                                    3 WQEs discarded without a CQE (RESET)
CQ         1 ``ci``, 2 arm request  0 ``pi``, 3 last arm fired, 4 error
           (``seq << 1 | solicited_only``)
=========  ======================  =========================================

* **Send/receive queue.**  ``post`` writes a WQE at ``pi`` and moves
  ``pi``; the doorbell moves ``db``.  The device *fetches* the WQEs below
  ``db`` when it is told of a doorbell (:meth:`WorkRing.latch`): it copies
  them into its own memory, checking each, exactly as a NIC fetches WQEs by
  DMA.  A WQE changed after its doorbell is therefore never seen, and one
  the application scribbled on becomes a WQE that fails (``IBV_WC_LOC_QP_OP_ERR``)
  instead of reaching the engine.  The consumer index ``ci`` is the
  application's own: it moves only when the application *polls* a CQE of
  the WQE at ``ci`` or a later one, so a queue full of unsignaled WQEs never
  drains -- seed 000's trap follows from the ring, with no special case.
* **Shared receive queue.**  The device takes WQEs at ``taken`` (read when
  it needs one; an SRQ has no doorbell here).  When fewer than the armed
  limit remain it posts ``IBV_EVENT_SRQ_LIMIT_REACHED`` once and disarms.
* **Completion queue.**  The device writes CQEs at ``pi``; a CQE that would
  make ``pi - ci`` exceed the capacity is an *overrun*: the device sets
  ``error`` and the CQ takes no more.  Arming writes a new sequence number;
  the device fires when it pushes a matching CQE (any, or a solicited or
  failed one) while that sequence differs from the last fired.  RESET and
  destroy mark a QP's unpolled CQEs *dead*; polling skips them.

The device keeps a private copy of every index it relies on and never
trusts the application's words beyond what they can honestly mean: a
doorbell is clamped to ``[db seen, min(pi, db seen + size)]``, a ``ci`` to
``[ci seen, pi]``.  A lying application can only hurt its own queues.

**Slots** hold either Python objects (:class:`ObjectSlots`: the device and
the application in one process, nothing to encode) or the fixed byte
layouts below (:class:`SendSlots`, :class:`RecvSlots`, :class:`CQESlots`:
shared memory with another process, which may be written in C).  Which
store a ring uses changes nothing else: the index logic above is this one
implementation, and the same tests check both stores.

Memory ordering (shared rings): a writer stores a slot before it stores
the index that publishes it; a reader loads the index before the slot.
Index words are aligned 8-byte words stored and loaded whole
(:meth:`SharedRegion.words`; in C, ``__atomic_store_n(..., __ATOMIC_RELEASE)``
and ``__atomic_load_n(..., __ATOMIC_ACQUIRE)``).  All fields are
little-endian.  ``docs/rings.md`` gives every layout byte by byte.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
from collections.abc import Callable
from enum import IntEnum
from typing import Annotated, Any, Literal, Protocol, TypeVar

from softverbs.enums import IBV_WC_SUCCESS
from softverbs.layout import U8, U16, U32, U64, Record

if __debug__:
    import sys

    assert sys.byteorder == "little", "softverbs' shared rings are little-endian"

#: One scatter/gather entry: (address, length, lkey).
Sge = tuple[int, int, int]

HEADER_SIZE = 64  #: bytes of a ring header: eight 64-bit words
#: the seals of every memfd a process makes for the device (docs/rings.md): never
#: shorter (the service requires it), never longer, and no seal may be changed
SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL

#: Which ring a CQE gives a slot back to when it is polled (CQE field ``wq_kind``).
WQ_NONE, WQ_SQ, WQ_RQ, WQ_SRQ = 0, 1, 2, 3

#: Send WQE flags (send slot byte 9).
F_SIGNALED, F_FENCE, F_SOLICITED, F_INLINE = 1, 2, 4, 8
_SEND_FLAGS = F_SIGNALED | F_FENCE | F_SOLICITED | F_INLINE
# the same as C integers for SendSlots.read (rings.pxd): the public names stay
# Python objects for everyone else
_F_SIGNALED, _F_FENCE, _F_SOLICITED, _F_INLINE = F_SIGNALED, F_FENCE, F_SOLICITED, F_INLINE

#: CQE flags (CQE byte 47).
CQE_DEAD, CQE_SOLICITED = 1, 2
# the same as C integers for CQESlots.write (rings.pxd)
_CQE_DEAD, _CQE_SOLICITED = CQE_DEAD, CQE_SOLICITED


# --- records ---------------------------------------------------------------------------------


class Route:
    """Where a QP's or an AH's packets go: the GRH fields of RoCEv2."""

    __slots__ = ("dgid", "flow_label", "hop_limit", "port", "sgid", "sgid_index", "tclass")

    def __init__(
        self,
        dgid: bytes,
        sgid: bytes,
        sgid_index: int = 0,
        hop_limit: int = 64,
        tclass: int = 0,
        flow_label: int = 0,
        port: int = 1,
    ) -> None:
        self.dgid = dgid
        self.sgid = sgid
        self.sgid_index = sgid_index
        self.hop_limit = hop_limit
        self.tclass = tclass
        self.flow_label = flow_label
        self.port = port


class WqeState(IntEnum):
    """Where a send WQE is in the requester (:data:`WQE_MOVES` says where it may go).

    The last three are *finished*: the WQE completes when it reaches the head
    of the queue -- successfully, or in error."""

    QUEUED = 0  #: fetched from the ring, not started
    ACTIVE = 1  #: started: packets out, or to go, and not yet acknowledged
    CANCELLED = 2  #: turned into a NOP before it started (cancel_posted_send_wrs)
    DONE = 3  #: executed, and acknowledged (RC) or sent (UC, UD)
    FAILED = 4  #: failed: completes in error


#: the legal moves of a send WQE
WQE_MOVES: dict[WqeState, frozenset[WqeState]] = {
    WqeState.QUEUED: frozenset(
        {WqeState.CANCELLED, WqeState.ACTIVE, WqeState.DONE, WqeState.FAILED}
    ),
    WqeState.ACTIVE: frozenset({WqeState.DONE, WqeState.FAILED}),
    WqeState.CANCELLED: frozenset(),
    WqeState.DONE: frozenset(),
    WqeState.FAILED: frozenset(),
}

#: a new WQE's state, as a module constant: an enum member read from its class costs
#: several times a global's, and every posted WQE starts here
_QUEUED = WqeState.QUEUED


class SendWQE:
    """A send-queue entry: the WR as posted, plus the requester's progress.

    The application fills the first group of fields; objects are named by
    the handles the device gave them (``ah``, ``bind_mw``, ``bind_mr``,
    ``driver_op``).  When the device fetches the WQE it resolves those into
    ``route``, ``bind`` and ``local_op``, and the requester keeps its
    progress in the last group.
    """

    __slots__ = (
        "ah", "bind", "bind_access", "bind_addr", "bind_length", "bind_mr",
        "bind_mw", "bind_rkey", "caller", "compare_add", "data", "driver_op", "fence",
        "imm", "index", "inline", "inv_rkey", "length", "local_op", "npkts", "opcode",
        "psn", "reason", "remote_addr", "remote_qkey", "remote_qpn", "rkey", "route", "rxd",
        "se", "sges", "signaled", "state", "status", "swap", "tx", "wr_id", "xrc_srqn",
    )  # fmt: skip

    # The fields after ``length`` are the ones a send slot carries besides the
    # SGEs; everyone else names the few it sets.
    def __init__(self, wr_id: int, opcode: int, signaled: bool, sges: list[Sge], length: int,
                 inline: bytes | None = None, fence: bool = False, se: bool = False,
                 imm: int = 0, inv_rkey: int = 0, rkey: int = 0, xrc_srqn: int = 0,
                 remote_addr: int = 0, compare_add: int = 0, swap: int = 0, ah: int = 0,
                 remote_qpn: int = 0, remote_qkey: int = 0, bind_mw: int = 0, bind_mr: int = 0,
                 bind_rkey: int = 0, bind_addr: int = 0, bind_length: int = 0,
                 bind_access: int = 0, driver_op: int = 0, caller: int = 0) -> None:  # fmt: skip
        self._fill(wr_id, opcode, signaled, sges, length, inline, fence, se, imm, inv_rkey, rkey,
                   xrc_srqn, remote_addr, compare_add, swap, ah, remote_qpn, remote_qkey,
                   bind_mw, bind_mr, bind_rkey, bind_addr, bind_length, bind_access, driver_op,
                   caller)  # fmt: skip

    # Every field stored once.  SendSlots.read fills a new WQE (``SendWQE.__new__``)
    # through this directly: compiled, a C call with every argument in place on a
    # WQE made by tp_new, without the constructor's argument parsing.
    def _fill(self, wr_id: int, opcode: int, signaled: bool, sges: list[Sge], length: int,
              inline: bytes | None, fence: bool, se: bool, imm: int, inv_rkey: int, rkey: int,
              xrc_srqn: int, remote_addr: int, compare_add: int, swap: int, ah: int,
              remote_qpn: int, remote_qkey: int, bind_mw: int, bind_mr: int, bind_rkey: int,
              bind_addr: int, bind_length: int, bind_access: int, driver_op: int,
              caller: int) -> None:  # fmt: skip
        self.wr_id = wr_id
        self.opcode = opcode
        self.signaled = signaled
        self.sges = sges
        self.length = length
        self.index = 0
        self.inline = inline
        self.fence = fence
        self.se = se
        self.imm = imm
        self.inv_rkey = inv_rkey
        self.rkey = rkey
        self.remote_addr = remote_addr
        self.compare_add = compare_add
        self.swap = swap
        self.ah = ah  #: UD: the address handle
        self.remote_qpn = remote_qpn
        self.remote_qkey = remote_qkey
        self.xrc_srqn = xrc_srqn
        self.bind_mw = bind_mw  #: BIND_MW: the window, the region, the window's new rkey ...
        self.bind_mr = bind_mr
        self.bind_rkey = bind_rkey
        self.bind_addr = bind_addr
        self.bind_length = bind_length
        self.bind_access = bind_access
        self.driver_op = driver_op  #: IBV_WR_DRIVER1: the provider operation's handle
        self.caller = caller  #: where the program posted it (sanitizer reports)
        # resolved by the device when it fetches the WQE
        self.route: Route | None = None
        #: BIND_MW: (mw key, mr key, new rkey, addr, length, access)
        self.bind: tuple[Any, Any, int, int, int, int] | None = None
        #: a provider's local WQE (IBV_WR_DRIVER1): run in send-queue order,
        #: returns None or why it failed
        self.local_op: Callable[[], str | None] | None = None
        # requester progress
        self.state = _QUEUED
        self.psn = 0
        self.npkts = 0
        self.tx = 0  #: packets of this WQE handed to the fabric in this pass
        self.rxd = 0  #: READ: response packets received in order
        #: gathered payload (the snapshot), or READ/atomic target views; dropped
        #: when the WQE completes or is flushed
        self.data: Any = None
        self.status: int = IBV_WC_SUCCESS
        self.reason = ""  #: why it failed, in words

    @property
    def flags(self) -> int:
        return ((F_SIGNALED if self.signaled else 0) | (F_FENCE if self.fence else 0)
                | (F_SOLICITED if self.se else 0)
                | (F_INLINE if self.inline is not None else 0))  # fmt: skip


class RecvWQE:
    """A receive-queue or SRQ entry."""

    __slots__ = ("bad", "index", "length", "sges", "srq", "wr_id")

    def __init__(self, wr_id: int, sges: list[Sge], length: int) -> None:
        self.wr_id = wr_id
        self.sges = sges
        self.length = length
        self.index = 0
        self.srq: SharedRecvRing | None = None
        #: why the slot did not hold a WQE the driver could have written ("": it did)
        self.bad = ""


class CQE:
    """A completion record.  ``wq_kind``/``wq_handle``/``index`` let the
    application's poll give the WQE's slot back."""

    __slots__ = ("byte_len", "dead", "imm", "index", "opcode", "pkey_index", "qp_num", "reason",
                 "sl", "slid", "solicited", "src_qp", "status", "vendor_err", "wc_flags",
                 "wq_handle", "wq_kind", "wr_id")  # fmt: skip

    def __init__(
        self,
        wr_id: int,
        status: int,
        opcode: int,
        qp_num: int,
        byte_len: int = 0,
        wc_flags: int = 0,
        imm: int = 0,
    ) -> None:
        self._init(wr_id, status, opcode, qp_num, byte_len, wc_flags, imm)

    def _init(self, wr_id: int, status: int, opcode: int, qp_num: int, byte_len: int,
              wc_flags: int, imm: int) -> None:  # fmt: skip
        """A new CQE's fields: the constructor's and :func:`new_cqe`'s one list
        (compiled a C method, so new_cqe fills a CQE by a C call)."""
        self.wr_id = wr_id
        self.status = status
        self.opcode = opcode
        self.qp_num = qp_num
        self.byte_len = byte_len
        self.wc_flags = wc_flags
        self.imm = imm
        self.vendor_err = 0
        self.src_qp = 0
        self.pkey_index = 0
        self.sl = 0
        self.slid = 0
        self.solicited = False
        self.reason = ""
        self.wq_kind = WQ_NONE
        self.wq_handle = 0
        self.index = 0
        self.dead = False


def new_cqe(wr_id: int, status: int, opcode: int, qp_num: int, byte_len: int = 0,
            wc_flags: int = 0, imm: int = 0) -> CQE:  # fmt: skip
    """``CQE(wr_id, status, opcode, qp_num, ...)``, as the engine makes one per
    completion: compiled, the object is made by the type's tp_new and filled
    by a C call (:meth:`CQE._init`), without the constructor's call through the
    type and its argument parsing."""
    c = CQE.__new__(CQE)
    c._init(wr_id, status, opcode, qp_num, byte_len, wc_flags, imm)
    return c


# --- slot stores -----------------------------------------------------------------------------

T = TypeVar("T")


class CorruptSlot(ValueError):
    """A slot holds something the application's driver never writes
    (``wr_id``: the slot's wr_id, so the failure completes under it)."""

    def __init__(self, message: str, wr_id: int = 0) -> None:
        super().__init__(message)
        self.wr_id = wr_id


class SlotStore(Protocol[T]):
    """Where a ring's entries live."""

    def write(self, index: int, item: T) -> None: ...
    def read(self, index: int) -> T: ...


class ObjectSlots:
    """Slots holding Python objects: the application and the device in one process.

    Not generic (``Any`` items): compiled, it is an extension type (rings.pxd) whose
    ``write`` and ``read`` -- a WQE posted and fetched, a CQE pushed and taken, six
    a message -- run without a Python class's attribute lookups."""

    __slots__ = ("items", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: list[Any] = [None] * size

    def write(self, index: int, item: Any) -> None:
        self.items[index % self.size] = item

    def read(self, index: int) -> Any:
        item = self.items[index % self.size]
        if item is None:
            raise CorruptSlot("an empty slot")
        return item

    def resized(self, size: int, first: int, end: int) -> ObjectSlots:
        new = ObjectSlots(size)
        for i in range(first, end):
            new.items[i % size] = self.items[i % self.size]
        return new


class SharedRegion:
    """An anonymous shared file (a memfd), mapped here.

    The application creates it and passes ``fd`` to the device service,
    which maps the same pages (``SharedRegion(size, fd=...)``).  A region
    made here is sealed (:data:`SIZE_SEALS`): its size never changes.
    """

    def __init__(self, size: int, fd: int | None = None, name: str = "softverbs") -> None:
        self.size = max(size, 1)
        if fd is None:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, self.size)
            # The device service maps only sealed memfds (a shorter file would
            # make its accesses fault): the size is fixed for the region's life.
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SIZE_SEALS)
        else:
            st = os.fstat(fd)
            if st.st_size < self.size:
                raise ValueError(f"the shared file has {st.st_size} bytes, "
                                 f"{self.size} are required")  # fmt: skip
        self.fd = fd
        self.mm = mmap.mmap(fd, self.size)
        self.view = memoryview(self.mm)
        self.closed = False
        self._casts: list[memoryview] = []  #: released at close
        self.slots: list[PackedSlots] = []  #: the slots laid out in it, detached at close

    def words(self, nbytes: int = HEADER_SIZE) -> memoryview:
        """The first ``nbytes`` as 64-bit words (a ring header).

        Indices shared between processes must be stored and loaded whole:
        ``struct.pack_into`` clears a field before it writes it, so the other
        process could read 0 in the middle of an update.  A ``'Q'``
        memoryview item is one aligned 8-byte access.
        """
        return self.cast("Q", nbytes)

    def cast(self, fmt: Literal["B", "H", "I", "Q"], nbytes: int | None = None) -> memoryview:
        """The first ``nbytes`` (by default every whole item of the region) as an
        array of ``fmt`` items (``"Q"``, ``"I"``, ``"H"`` or ``"B"``, in the host's
        byte order, as the C library's structs), released when the region closes."""
        if nbytes is None:
            nbytes = self.size - self.size % struct.calcsize(fmt)
        view = self.view[:nbytes].cast(fmt)
        self._casts.append(view)
        return view

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for slots in self.slots:
            slots.detach()  # compiled, their typed views hold the casts' buffers
        for view in self._casts:
            view.release()
        self.view.release()
        with contextlib.suppress(BufferError):  # a slice may still be alive: it goes with it
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def local_header() -> memoryview:
    """A header for a ring whose two faces live in this process."""
    return memoryview(bytearray(HEADER_SIZE)).cast("Q")


class PackedSlots:
    """Fixed-size slots in a :class:`SharedRegion`, after its header."""

    __slots__ = ("buf", "size", "slot", "u8", "u16", "u32", "u64")

    def __init__(self, region: SharedRegion, size: int, slot: int) -> None:
        if HEADER_SIZE + size * slot > region.size:
            raise ValueError(f"{size} slots of {slot} bytes do not fit in {region.size} bytes")
        self.buf = region.view
        self.size = size
        self.slot = slot
        # the same bytes as arrays of each width a slot's fields have: compiled,
        # typed memoryviews (rings.pxd), so a field is one C load or store at
        # ``Record.index_of`` plus the slot's offset over the width
        self.u8 = region.cast("B")
        self.u16 = region.cast("H")
        self.u32 = region.cast("I")
        self.u64 = region.cast("Q")
        region.slots.append(self)

    def detach(self) -> None:
        """Let go of the region's memory, which is being unmapped: a slot read or
        written after this raises (IndexError; ``buf``, released, ValueError)."""
        self.u8, self.u16, self.u32, self.u64 = (
            memoryview(bytearray()).cast("B"), memoryview(bytearray()).cast("H"),
            memoryview(bytearray()).cast("I"), memoryview(bytearray()).cast("Q"))  # fmt: skip

    def offset(self, index: int) -> int:
        return _HDR + (index % self.size) * self.slot

    def _sges(self, pos: int, count: int, sges: list[Sge]) -> int:
        """Append the ``count`` SGEs at byte ``pos`` of the slots (a WQE's, after its
        header) to ``sges`` as (addr, length, lkey); the sum of their lengths."""
        length = 0
        for _i in range(count):
            n = self.u32[(pos >> 2) + _SGE_LENGTH]
            sges.append((self.u64[(pos >> 3) + _SGE_ADDR], n, self.u32[(pos >> 2) + _SGE_LKEY]))
            length += n
            pos += _SGE
        return length

    @staticmethod
    def region_size(size: int, slot: int) -> int:
        return HEADER_SIZE + size * slot


class RingHeader(Record):
    """The first 64 bytes of every ring: eight index words (see the table above)."""

    word0: U64
    word1: U64
    word2: U64
    word3: U64
    word4: U64
    word5: U64
    word6: U64
    word7: U64


class SendWQEHeader(Record):
    """A send WQE slot: this header, ``num_sge`` :class:`SGEntry`, then inline data."""

    DOCS = {
        "opcode": "ibv_wr_opcode",
        "flags": "F_SIGNALED, F_FENCE, F_SOLICITED, F_INLINE",
        "inline_len": "bytes of inline data after the SGEs (with F_INLINE)",
        "imm_data": "*_WITH_IMM: the ImmDt value as a host integer (C: be32toh(wr.imm_data))",
        "invalidate_rkey": "SEND_WITH_INV, LOCAL_INV",
        "rkey": "RDMA and atomic operations",
        "remote_srqn": "XRC send QPs: the remote XRC SRQ",
        "ah": "UD: the address handle's handle",
        "bind_mw": "BIND_MW: the window's handle",
        "bind_mr": "BIND_MW: the region's handle",
        "bind_rkey": "BIND_MW: the window's new rkey",
        "driver_op": "IBV_WR_DRIVER1: the provider operation's handle",
        "caller": "where the program posted it, for sanitizer reports (0: unknown)",
    }
    wr_id: U64
    opcode: U8
    flags: U8
    num_sge: U16
    inline_len: U32
    imm_data: U32
    invalidate_rkey: U32
    rkey: U32
    remote_srqn: U32
    remote_addr: U64
    compare_add: U64
    swap: U64
    ah: U32
    remote_qpn: U32
    remote_qkey: U32
    bind_mw: U32
    bind_mr: U32
    bind_rkey: U32
    bind_addr: U64
    bind_length: U64
    bind_access: U32
    driver_op: U32
    caller: U64
    reserved0: U64
    reserved1: U64


class SGEntry(Record):
    """``ibv_sge``."""

    addr: U64
    length: U32
    lkey: U32


class RecvWQEHeader(Record):
    """A receive WQE slot: this header, then ``num_sge`` :class:`SGEntry`."""

    wr_id: U64
    num_sge: U32
    reserved: U32


class CQEntry(Record):
    """A CQE slot: 128 bytes, the last 72 the failure's reason (UTF-8, NUL-padded)."""

    DOCS = {
        "imm_data": "the ImmDt value (C: htobe32 into wc.imm_data), or the invalidated rkey",
        "wq_kind": "which ring the CQE frees a slot of: WQ_NONE, WQ_SQ, WQ_RQ, WQ_SRQ",
        "flags": "CQE_DEAD (skip it: its QP was reset), CQE_SOLICITED",
        "wq_handle": "the QP's handle (WQ_SQ, WQ_RQ) or the SRQ's (WQ_SRQ)",
        "wqe_index": "the low 32 bits of the WQE's ring index",
        "reason": "why it failed, in words (softverbs' WC.reason)",
    }
    wr_id: U64
    status: U32
    opcode: U32
    vendor_err: U32
    byte_len: U32
    imm_data: U32
    qp_num: U32
    src_qp: U32
    wc_flags: U32
    pkey_index: U16
    slid: U16
    sl: U8
    dlid_path_bits: U8
    wq_kind: U8
    flags: U8
    wq_handle: U32
    wqe_index: U32
    reason: Annotated[bytes, "72s"]


RECORDS: tuple[type[Record], ...] = (RingHeader, SendWQEHeader, SGEntry, RecvWQEHeader, CQEntry)

SEND_HEADER = SendWQEHeader._struct
SGE = SGEntry._struct
RECV_HEADER = RecvWQEHeader._struct
CQE_FIELDS = struct.Struct("<" + "".join(f.code for f in CQEntry._fields[:-1]))


CQE_SIZE = CQEntry.size()
REASON_BYTES = CQE_SIZE - CQE_FIELDS.size
# the same sizes as C integers for the slot classes (rings.pxd); the public names
# above stay Python objects for everyone else
_HDR, _SEND_HDR, _SGE, _RECV_HDR, _CQE = (HEADER_SIZE, SEND_HEADER.size, SGE.size,
                                          RECV_HEADER.size, CQE_SIZE)  # fmt: skip
_CQE_FLAGS_OFFSET = next(f.offset for f in CQEntry._fields if f.name == "flags")
_CQE_QPN_OFFSET = next(f.offset for f in CQEntry._fields if f.name == "qp_num")
# A CQE's fields at their index in the slot as an array of their width (Record.index_of):
# CQESlots.write stores each with one typed store, no struct call (C constants, rings.pxd)
_CQ_WR_ID = CQEntry.index_of("wr_id")
_CQ_STATUS, _CQ_OPCODE, _CQ_VENDOR_ERR, _CQ_BYTE_LEN, _CQ_IMM, _CQ_QP_NUM, _CQ_SRC_QP = (
    CQEntry.index_of("status"), CQEntry.index_of("opcode"), CQEntry.index_of("vendor_err"),
    CQEntry.index_of("byte_len"), CQEntry.index_of("imm_data"), CQEntry.index_of("qp_num"),
    CQEntry.index_of("src_qp"))  # fmt: skip
_CQ_WC_FLAGS, _CQ_WQ_HANDLE, _CQ_WQE_INDEX = (
    CQEntry.index_of("wc_flags"), CQEntry.index_of("wq_handle"), CQEntry.index_of("wqe_index"))
_CQ_PKEY_INDEX, _CQ_SLID = CQEntry.index_of("pkey_index"), CQEntry.index_of("slid")
_CQ_SL, _CQ_DLID_BITS, _CQ_WQ_KIND, _CQ_FLAGS = (
    CQEntry.index_of("sl"), CQEntry.index_of("dlid_path_bits"), CQEntry.index_of("wq_kind"),
    CQEntry.index_of("flags"))  # fmt: skip
#: the reason's place as 64-bit words (it is 8-byte aligned, a whole number of words)
_CQ_REASON, _CQ_REASON_WORDS = CQE_FIELDS.size // 8, REASON_BYTES // 8
assert CQE_FIELDS.size % 8 == 0 and REASON_BYTES % 8 == 0
# A send WQE's fields, a receive WQE's and an SGE's, the same way: SendSlots.read and
# RecvSlots.read load each with one typed load, no struct call and no tuple
_SQ_WR_ID, _SQ_REMOTE_ADDR, _SQ_COMPARE, _SQ_SWAP, _SQ_BIND_ADDR, _SQ_BIND_LEN, _SQ_CALLER = (
    SendWQEHeader.index_of("wr_id"), SendWQEHeader.index_of("remote_addr"),
    SendWQEHeader.index_of("compare_add"), SendWQEHeader.index_of("swap"),
    SendWQEHeader.index_of("bind_addr"), SendWQEHeader.index_of("bind_length"),
    SendWQEHeader.index_of("caller"))  # fmt: skip
_SQ_OPCODE, _SQ_FLAGS, _SQ_NUM_SGE = (
    SendWQEHeader.index_of("opcode"), SendWQEHeader.index_of("flags"),
    SendWQEHeader.index_of("num_sge"))  # fmt: skip
_SQ_INLINE_LEN, _SQ_IMM, _SQ_INV_RKEY, _SQ_RKEY, _SQ_SRQN, _SQ_AH, _SQ_RQPN, _SQ_RQKEY = (
    SendWQEHeader.index_of("inline_len"), SendWQEHeader.index_of("imm_data"),
    SendWQEHeader.index_of("invalidate_rkey"), SendWQEHeader.index_of("rkey"),
    SendWQEHeader.index_of("remote_srqn"), SendWQEHeader.index_of("ah"),
    SendWQEHeader.index_of("remote_qpn"), SendWQEHeader.index_of("remote_qkey"))  # fmt: skip
_SQ_MW, _SQ_MR, _SQ_BIND_RKEY, _SQ_BIND_ACCESS, _SQ_DRIVER_OP = (
    SendWQEHeader.index_of("bind_mw"), SendWQEHeader.index_of("bind_mr"),
    SendWQEHeader.index_of("bind_rkey"), SendWQEHeader.index_of("bind_access"),
    SendWQEHeader.index_of("driver_op"))  # fmt: skip
_RQ_WR_ID, _RQ_NUM_SGE = RecvWQEHeader.index_of("wr_id"), RecvWQEHeader.index_of("num_sge")
_SGE_ADDR, _SGE_LENGTH, _SGE_LKEY = (
    SGEntry.index_of("addr"), SGEntry.index_of("length"), SGEntry.index_of("lkey"))
assert SEND_HEADER.size == 128 and CQE_SIZE == 128 and RingHeader.size() == HEADER_SIZE
assert RECV_HEADER.size % 8 == 0 and SGE.size == 16


def send_slot_size(max_sge: int, max_inline: int) -> int:
    """Bytes of one send WQE slot: a multiple of 64."""
    raw = SEND_HEADER.size + max(max_sge, 1) * SGE.size + max_inline
    return (raw + 63) & ~63


def recv_slot_size(max_sge: int) -> int:
    """Bytes of one receive WQE slot: a multiple of 16."""
    return (RECV_HEADER.size + max(max_sge, 1) * SGE.size + 15) & ~15


class SendSlots(PackedSlots):
    """Send WQEs in their byte layout."""

    __slots__ = ("opcodes",)

    def __init__(self, region: SharedRegion, size: int, slot: int,
                 opcodes: frozenset[int]) -> None:  # fmt: skip
        if slot < _SEND_HDR + _SGE:
            raise ValueError(f"a send slot of {slot} bytes is smaller than a header and one SGE")
        super().__init__(region, size, slot)
        self.opcodes = opcodes  #: what the device accepts

    def write(self, index: int, w: SendWQE) -> None:
        off = self.offset(index)
        inline = w.inline or b""
        SEND_HEADER.pack_into(
            self.buf, off, w.wr_id, w.opcode, w.flags, len(w.sges), len(inline), w.imm,
            w.inv_rkey, w.rkey, w.xrc_srqn, w.remote_addr, w.compare_add, w.swap, w.ah,
            w.remote_qpn, w.remote_qkey, w.bind_mw, w.bind_mr, w.bind_rkey, w.bind_addr,
            w.bind_length, w.bind_access, w.driver_op, w.caller, 0, 0,
        )  # fmt: skip
        pos = off + SEND_HEADER.size
        for sge in w.sges:
            SGE.pack_into(self.buf, pos, *sge)
            pos += SGE.size
        self.buf[pos : pos + len(inline)] = inline

    def read(self, index: int) -> SendWQE:
        off = self.offset(index)
        # each field one load from the view of its width (compiled, a C load; no
        # struct call, no tuple): the slot's offset in items of each width, plus the
        # field's index (the _SQ_* constants, from SendWQEHeader)
        w8, w4, w2 = off >> 3, off >> 2, off >> 1
        wr_id = self.u64[w8 + _SQ_WR_ID]
        opcode = self.u8[off + _SQ_OPCODE]
        flags = self.u8[off + _SQ_FLAGS]
        if opcode not in self.opcodes:
            raise CorruptSlot(f"opcode {opcode} is not a send opcode this device executes", wr_id)
        if flags & ~_SEND_FLAGS:
            raise CorruptSlot(f"unknown send flags {flags & ~_SEND_FLAGS:#x}", wr_id)
        nsge = self.u16[w2 + _SQ_NUM_SGE]
        inline_len = self.u32[w4 + _SQ_INLINE_LEN] if flags & _F_INLINE else 0
        if _SEND_HDR + nsge * _SGE + inline_len > self.slot:
            raise CorruptSlot(f"{nsge} SGEs and {inline_len} inline bytes overflow the "
                              f"{self.slot}-byte slot", wr_id)  # fmt: skip
        pos = off + _SEND_HDR
        sges: list[Sge] = []
        length = self._sges(pos, nsge, sges)
        inline = None
        if flags & _F_INLINE:
            pos += nsge * _SGE
            inline = bytes(self.buf[pos : pos + inline_len])
            length = inline_len
        # the WQE is filled once, every field stored once (compiled, a C call storing
        # into the extension type's struct: no constructor's argument parsing)
        w = SendWQE.__new__(SendWQE)
        w._fill(wr_id, opcode, (flags & _F_SIGNALED) != 0, sges, length, inline,
                (flags & _F_FENCE) != 0, (flags & _F_SOLICITED) != 0,
                self.u32[w4 + _SQ_IMM], self.u32[w4 + _SQ_INV_RKEY], self.u32[w4 + _SQ_RKEY],
                self.u32[w4 + _SQ_SRQN], self.u64[w8 + _SQ_REMOTE_ADDR],
                self.u64[w8 + _SQ_COMPARE], self.u64[w8 + _SQ_SWAP], self.u32[w4 + _SQ_AH],
                self.u32[w4 + _SQ_RQPN], self.u32[w4 + _SQ_RQKEY], self.u32[w4 + _SQ_MW],
                self.u32[w4 + _SQ_MR], self.u32[w4 + _SQ_BIND_RKEY],
                self.u64[w8 + _SQ_BIND_ADDR], self.u64[w8 + _SQ_BIND_LEN],
                self.u32[w4 + _SQ_BIND_ACCESS], self.u32[w4 + _SQ_DRIVER_OP],
                self.u64[w8 + _SQ_CALLER])  # fmt: skip
        return w


class RecvSlots(PackedSlots):
    """Receive WQEs in their byte layout."""

    __slots__ = ()

    def __init__(self, region: SharedRegion, size: int, slot: int) -> None:
        if slot < _RECV_HDR + _SGE:
            raise ValueError(f"a receive slot of {slot} bytes is smaller than a header and one SGE")
        super().__init__(region, size, slot)

    def write(self, index: int, w: RecvWQE) -> None:
        off = self.offset(index)
        RECV_HEADER.pack_into(self.buf, off, w.wr_id, len(w.sges), 0)
        pos = off + RECV_HEADER.size
        for sge in w.sges:
            SGE.pack_into(self.buf, pos, *sge)
            pos += SGE.size

    def read(self, index: int) -> RecvWQE:
        off = self.offset(index)
        # typed loads, as SendSlots.read
        wr_id = self.u64[(off >> 3) + _RQ_WR_ID]
        nsge = self.u32[(off >> 2) + _RQ_NUM_SGE]
        if _RECV_HDR + nsge * _SGE > self.slot:
            # more SGEs than the slot holds: a malformed WQE, which completes
            # with LOC_QP_OP_ERR under its wr_id (see poisoned())
            bad = RecvWQE(wr_id, [], 0)
            bad.bad = f"{nsge} SGEs overflow the {self.slot}-byte slot"
            return bad
        sges: list[Sge] = []
        length = self._sges(off + _RECV_HDR, nsge, sges)
        return RecvWQE(wr_id, sges, length)


class CQESlots(PackedSlots):
    """CQEs in their byte layout."""

    __slots__ = ()

    def __init__(self, region: SharedRegion, size: int) -> None:
        super().__init__(region, size, CQE_SIZE)

    def write(self, index: int, c: CQE) -> None:
        # each field one store into the slot through the view of its width (compiled,
        # a C store; no struct call, no argument tuple): the slot's offset in items of
        # each width, plus the field's index (the _CQ_* constants, from CQEntry)
        off = self.offset(index)
        w8, w4, w2 = off >> 3, off >> 2, off >> 1
        flags = 0  # compiled, a C integer: the flag constants are C constants (rings.pxd)
        if c.dead:
            flags = _CQE_DEAD
        if c.solicited:
            flags |= _CQE_SOLICITED
        try:
            self.u64[w8 + _CQ_WR_ID] = c.wr_id
            self.u32[w4 + _CQ_STATUS] = c.status
            self.u32[w4 + _CQ_OPCODE] = c.opcode
            self.u32[w4 + _CQ_VENDOR_ERR] = c.vendor_err
            self.u32[w4 + _CQ_BYTE_LEN] = c.byte_len
            self.u32[w4 + _CQ_IMM] = c.imm & 0xFFFFFFFF
            self.u32[w4 + _CQ_QP_NUM] = c.qp_num
            self.u32[w4 + _CQ_SRC_QP] = c.src_qp
            self.u32[w4 + _CQ_WC_FLAGS] = c.wc_flags
            self.u16[w2 + _CQ_PKEY_INDEX] = c.pkey_index
            self.u16[w2 + _CQ_SLID] = c.slid
            self.u8[off + _CQ_SL] = c.sl
            self.u8[off + _CQ_DLID_BITS] = 0
            self.u8[off + _CQ_WQ_KIND] = c.wq_kind
            self.u8[off + _CQ_FLAGS] = flags
            self.u32[w4 + _CQ_WQ_HANDLE] = c.wq_handle
            self.u32[w4 + _CQ_WQE_INDEX] = c.index & 0xFFFFFFFF
        except (OverflowError, ValueError):  # compiled and interpreted raise differently
            raise ValueError(f"a field of the CQE of wr_id {c.wr_id!r} (QP {c.qp_num!r}) does "
                             "not fit its slot") from None
        # the reason: UTF-8, cut to its bytes and NUL-padded (as struct's "72s")
        for i in range(w8 + _CQ_REASON, w8 + _CQ_REASON + _CQ_REASON_WORDS):
            self.u64[i] = 0
        reason = c.reason
        if reason:
            text = reason.encode("utf-8", "replace")[:REASON_BYTES]
            start = off + CQE_FIELDS.size
            self.buf[start : start + len(text)] = text

    def read(self, index: int) -> CQE:
        off = self.offset(index)
        (wr_id, status, opcode, vendor_err, byte_len, imm, qp_num, src_qp, wc_flags, pkey_index,
         slid, sl, _dlid_bits, wq_kind, flags, wq_handle, wqe_index) = CQE_FIELDS.unpack_from(
            self.buf, off)  # fmt: skip
        c = CQE(wr_id, status, opcode, qp_num, byte_len, wc_flags, imm)
        c.vendor_err, c.src_qp, c.pkey_index = vendor_err, src_qp, pkey_index
        c.slid, c.sl = slid, sl
        c.wq_kind, c.wq_handle, c.index = wq_kind, wq_handle, wqe_index
        c.solicited = bool(flags & CQE_SOLICITED)
        c.dead = bool(flags & CQE_DEAD)
        start = off + CQE_FIELDS.size
        c.reason = bytes(self.buf[start : start + REASON_BYTES]).rstrip(b"\0").decode(
            "utf-8", "replace")  # fmt: skip
        return c

    def qp_num(self, index: int) -> int:
        value: int = struct.unpack_from("<I", self.buf, self.offset(index) + _CQE_QPN_OFFSET)[0]
        return value

    def kill(self, index: int) -> None:
        self.buf[self.offset(index) + _CQE_FLAGS_OFFSET] |= CQE_DEAD


# --- the rings -----------------------------------------------------------------------------------


# The words of each ring's header (docs/rings.md; the classes' PI, DB, ... and
# C_CONSTANTS' SQ_PI, ...), as module constants: the device reads them per WQE and
# per CQE, and a class attribute lookup costs several times a global's.
_W_PI, _W_DB, _W_STATE = 0, 1, 2
_S_PI, _S_TAKEN, _S_LIMIT, _S_DISCARDED = 0, 1, 2, 3
_C_PI, _C_CI, _C_ARM, _C_FIRED, _C_ERROR = 0, 1, 2, 3, 4

#: Beyond any index a ring reaches (2**62 WQEs or CQEs), and within the C integer the
#: compiled rings keep their indices in.
MAX_INDEX = (1 << 62) - 1


def start_index(word: int) -> int:
    """A header word the device starts counting from when it takes a ring over.  The
    application's memory may hold anything: a word no ring can reach starts it at 0
    (the indices it then publishes are its own; what the application claims later is
    bounded as it is read)."""
    value = int(word)
    return value if 0 <= value <= MAX_INDEX else 0


class WorkRing:
    """A send or receive queue (see the module docstring).

    ``tag`` is (``WQ_SQ`` or ``WQ_RQ``, the QP's handle): what the CQEs of
    this ring carry so the application's poll can give slots back.
    ``fetch`` is the device's hook for each fetched WQE (resolving handles);
    it returns None, or why the WQE cannot run.
    """

    PI, DB, STATE = _W_PI, _W_DB, _W_STATE

    __slots__ = ("capacity", "ci", "fetch", "fetched", "hdr", "seen_db", "size", "slots", "tag")

    def __init__(self, size: int, slots: SlotStore[Any], hdr: memoryview,
                 tag: tuple[int, int] = (WQ_NONE, 0)) -> None:  # fmt: skip
        self.size = size
        #: application: how many WQEs a post may hold -- the QP's max_*_wr,
        #: which is below ``size`` only for a queue of 0 WRs (see ring_slots)
        self.capacity = size
        self.slots = slots
        self.hdr = hdr
        self.tag = tag
        self.ci = 0  #: application: slots below this were released by a poll
        self.seen_db = start_index(hdr[_W_DB])  #: device: the doorbell as last fetched
        self.fetched: list[Any] = [None] * size  #: device: its copies of fetched WQEs
        self.fetch: Callable[[Any], str | None] | None = None

    # --- the application's face -----------------------------------------------------------
    @property
    def pi(self) -> int:
        return int(self.hdr[_W_PI])

    @property
    def used(self) -> int:
        return self.pi - self.ci

    def push(self, wqe: Any) -> None:
        """Write ``wqe`` at ``pi`` and publish it (the caller checked ``used``)."""
        pi = int(self.hdr[_W_PI])
        wqe.index = pi
        self.slots.write(pi, wqe)
        self.hdr[_W_PI] = pi + 1

    def ring(self, upto: int) -> bool:
        """Move the doorbell index to ``upto``; False if it is already there."""
        if upto <= self.hdr[_W_DB]:
            return False
        self.hdr[_W_DB] = upto
        return True

    def release(self, index: int) -> None:
        """The application polled a CQE for the WQE at ``index``.

        A packed CQE carries the low 32 bits of the index; the WQE was
        posted below ``pi`` and less than 2**32 WQEs ago, which fixes the rest."""
        pi = int(self.hdr[_W_PI])
        index = pi - ((pi - index) & 0xFFFFFFFF)
        if index >= self.ci:
            self.ci = index + 1

    def forget(self) -> None:
        """RESET, application side: every slot is free again."""
        self.ci = self.pi

    def published_state(self) -> int | None:
        value = int(self.hdr[_W_STATE])
        return value - 1 if value else None

    # --- the device's face ------------------------------------------------------------------
    @property
    def db(self) -> int:
        """The doorbell index the device has fetched up to."""
        return self.seen_db

    def _bound(self, value: int) -> int:
        """``value`` clamped to what the application can honestly have posted."""
        seen = self.seen_db
        top = seen + self.size  # the least of this, pi and value, but never below seen
        pi = int(self.hdr[_W_PI])
        if pi < top:
            top = pi
        if value < top:
            top = value
        return top if top > seen else seen

    def latch(self, everything: bool = False) -> int:
        """Fetch the WQEs below the doorbell (or below ``pi``); how many.

        One pass over the doorbell's WQEs, with what each needs (the slots,
        the device's hook, the fetched list) read once per doorbell."""
        seen = self.seen_db
        new = self._bound(int(self.hdr[_W_PI] if everything else self.hdr[_W_DB]))
        slots, fetch, fetched, size = self.slots, self.fetch, self.fetched, self.size
        for i in range(seen, new):
            try:
                wqe = slots.read(i)
                why = fetch(wqe) if fetch is not None else None
            except CorruptSlot as exc:
                wqe, why = SendWQE(exc.wr_id, 0, True, [], 0), str(exc)
            if why is not None:
                wqe = poisoned(wqe, why)
            wqe.index = i
            fetched[i % size] = wqe
        self.seen_db = new
        return new - seen

    def get(self, index: int) -> Any:
        """The fetched WQE at ``index`` (below :attr:`db`)."""
        return self.fetched[index % self.size]

    def posted(self) -> int:
        """How far the application has posted (``pi``, bounded)."""
        return self._bound(int(self.hdr[_W_PI]))

    def peek_wr_id(self, index: int) -> int | None:
        """The wr_id of a posted WQE the device has not fetched (None: unreadable)."""
        try:
            return int(self.slots.read(index).wr_id)
        except CorruptSlot:
            return None

    def discard(self) -> None:
        """RESET, device side: drop every posted WQE unseen."""
        self.seen_db = self._bound(int(self.hdr[_W_PI]))
        self.fetched = [None] * self.size

    def publish_state(self, state: int) -> None:
        self.hdr[_W_STATE] = state + 1


class SharedRecvRing:
    """A shared receive queue (see the module docstring)."""

    PI, TAKEN, LIMIT, DISCARDED = _S_PI, _S_TAKEN, _S_LIMIT, _S_DISCARDED

    __slots__ = ("cq", "hdr", "max_sge", "on_limit", "owner", "pd", "posted", "released",
                 "seen_taken", "size", "slots", "srqn", "tag", "xrcd")  # fmt: skip

    def __init__(self, size: int, max_sge: int, slots: SlotStore[Any], hdr: memoryview,
                 srqn: int = 0) -> None:  # fmt: skip
        self.size = size
        self.max_sge = max_sge
        self.slots = slots
        self.hdr = hdr
        self.srqn = srqn
        self.tag = (WQ_SRQ, 0)
        self.posted = 0  #: application: WQEs posted
        self.released = 0  #: application: WQEs whose CQE it polled
        self.seen_taken = start_index(hdr[_S_TAKEN])  #: device
        self.on_limit: Callable[[SharedRecvRing], None] | None = None
        # set by the device: who may use it and where it completes
        self.pd: object = None
        self.xrcd: object = None
        self.cq: CompletionRing | None = None  #: XRC SRQs complete into their own CQ
        self.owner: Any = None

    # --- the application's face -----------------------------------------------------------
    @property
    def max_wr(self) -> int:
        return self.size

    @property
    def outstanding(self) -> int:
        """WQEs posted and not yet given back by a poll (or a RESET)."""
        return self.posted - self.released - int(self.hdr[_S_DISCARDED])

    def post(self, wqe: RecvWQE) -> None:
        pi = int(self.hdr[_S_PI])
        wqe.index = pi
        self.slots.write(pi, wqe)
        self.hdr[_S_PI] = pi + 1
        self.posted += 1

    def release(self, index: int) -> None:
        self.released += 1

    @property
    def armed_limit(self) -> int:
        return int(self.hdr[_S_LIMIT])

    # --- the device's face ------------------------------------------------------------------
    def take(self) -> RecvWQE | None:
        """The next posted WQE, or None; fires the limit event when it is crossed."""
        taken = self.seen_taken
        pi = max(taken, min(int(self.hdr[_S_PI]), taken + self.size))
        if taken >= pi:
            return None
        wqe: RecvWQE = self.slots.read(taken)
        wqe.index = taken
        wqe.srq = self
        self.seen_taken = taken + 1
        self.hdr[_S_TAKEN] = taken + 1
        limit = int(self.hdr[_S_LIMIT])
        if limit and pi - taken - 1 < limit:
            self.hdr[_S_LIMIT] = 0
            if self.on_limit is not None:
                self.on_limit(self)
        return wqe

    def set_limit(self, limit: int) -> None:
        self.hdr[_S_LIMIT] = limit

    def move_to(self, slots: SlotStore[Any], hdr: memoryview, size: int) -> None:
        """Resize, device side: copy the WQEs not yet taken (at the same
        indices) and the header into new memory, then use it."""
        taken = self.seen_taken
        end = max(taken, min(int(self.hdr[_S_PI]), taken + self.size))
        for i in range(taken, end):
            slots.write(i, self.slots.read(i))
        for word in range(len(hdr)):
            hdr[word] = self.hdr[word]
        self.adopt(slots, hdr, size)

    def adopt(self, slots: SlotStore[Any], hdr: memoryview, size: int) -> None:
        """Resize, application side: the device moved the ring here."""
        self.slots, self.hdr, self.size = slots, hdr, size

    def discarded(self, count: int = 1) -> None:
        """WQEs taken and dropped without a CQE (their QP was reset)."""
        self.hdr[_S_DISCARDED] = int(self.hdr[_S_DISCARDED]) + count

    def available(self) -> int:
        taken = self.seen_taken
        return max(0, min(int(self.hdr[_S_PI]), taken + self.size) - taken)


class CompletionRing:
    """A completion queue (see the module docstring)."""

    PI, CI, ARM, FIRED, ERROR = _C_PI, _C_CI, _C_ARM, _C_FIRED, _C_ERROR

    __slots__ = ("capacity", "error", "fence", "fired", "hdr", "notify", "owner", "seen_ci",
                 "slots", "tail")  # fmt: skip

    def __init__(self, capacity: int, slots: SlotStore[CQE], hdr: memoryview) -> None:
        self.capacity = capacity
        self.slots = slots
        self.hdr = hdr
        # device-private copies of the words it writes or trusts
        self.tail = start_index(hdr[_C_PI])  #: next CQE index
        self.seen_ci = start_index(hdr[_C_CI])
        self.fired = start_index(hdr[_C_FIRED])
        self.error = bool(hdr[_C_ERROR])
        #: called when an armed CQ fires (a completion event)
        self.notify: Callable[[], None] | None = None
        #: a full memory barrier, called between publishing a CQE and reading the
        #: arm request, where another process arms this CQ (None in one process)
        self.fence: Callable[[], None] | None = None
        self.owner: Any = None

    # --- the device's face ------------------------------------------------------------------
    def _ci(self) -> int:
        # the application's word, anything from 0 to 2**64-1 ('Q'), bounded by the
        # tail and never below what was seen; compiled, all of it on C integers
        word = self.hdr[_C_CI]
        ci = self.tail if word >= self.tail else word
        if ci < self.seen_ci:
            ci = self.seen_ci
        self.seen_ci = ci
        return ci

    def push(self, cqe: CQE) -> bool:
        """Write ``cqe``; False on overrun (the CQ is now in error) or if in error."""
        if self.error:
            return False
        tail = self.tail
        if tail - self._ci() >= self.capacity:
            self.error = True
            self.hdr[_C_ERROR] = 1
            return False
        self.slots.write(tail, cqe)
        self.tail = tail + 1
        self.hdr[_C_PI] = tail + 1
        # The arm request is read after the CQE is published: an application
        # that arms and then finds the CQ empty is sure to get its event.  Each side
        # stores a word and then loads the other's, so each needs a full barrier
        # between the two (x86 lets a load pass an earlier store): where another
        # process arms this CQ, the device gives it one (fence).
        fence = self.fence
        if fence is not None:
            fence()
        arm = int(self.hdr[_C_ARM])
        if arm >> 1 != self.fired and (
            not arm & 1 or cqe.solicited or cqe.status != IBV_WC_SUCCESS
        ):
            self.fired = arm >> 1
            self.hdr[_C_FIRED] = self.fired
            if self.notify is not None:
                self.notify()
        return True

    def unpolled(self) -> range:
        """The indices of the CQEs written and not yet polled."""
        return range(max(self._ci(), self.tail - self.capacity), self.tail)

    def purge(self, qpn: int, dead: Callable[[CQE], None] | None = None) -> None:
        """Mark the unpolled CQEs of QP ``qpn`` dead (RESET, destroy).

        ``dead`` sees each one (to give an SRQ slot back)."""
        slots = self.slots
        for i in self.unpolled():
            if isinstance(slots, CQESlots):
                if slots.qp_num(i) == qpn:
                    if dead is not None:
                        dead(slots.read(i))
                    slots.kill(i)
            else:
                cqe = slots.read(i)
                if cqe.qp_num == qpn and not cqe.dead:
                    cqe.dead = True
                    if dead is not None:
                        dead(cqe)

    def move_to(self, slots: SlotStore[CQE], hdr: memoryview, capacity: int) -> None:
        """Resize, device side: copy the unpolled CQEs (at the same indices) and
        the header into new memory, then use it (the caller checked they fit)."""
        for i in range(self._ci(), self.tail):
            slots.write(i, self.slots.read(i))
        for word in range(len(hdr)):
            hdr[word] = self.hdr[word]
        self.adopt(slots, hdr, capacity)

    def adopt(self, slots: SlotStore[CQE], hdr: memoryview, capacity: int) -> None:
        """Resize, application side: the device moved the ring here."""
        self.slots, self.hdr, self.capacity = slots, hdr, capacity

    def set_error(self) -> None:
        """Destroyed: take nothing more."""
        self.error = True
        self.hdr[_C_ERROR] = 1

    def waiting(self) -> int:
        """CQEs written and not yet polled, as the device sees it."""
        return self.tail - self._ci()

    # --- the application's face -----------------------------------------------------------
    def take(self, n: int) -> list[CQE]:
        """Consume up to ``n`` live CQEs (dead ones are skipped)."""
        hdr = self.hdr
        ci, pi = int(hdr[_C_CI]), int(hdr[_C_PI])
        out: list[CQE] = []
        read = self.slots.read
        while ci < pi and len(out) < n:
            cqe = read(ci)
            ci += 1
            if not cqe.dead:
                out.append(cqe)
        hdr[_C_CI] = ci
        return out

    def pending(self) -> int:
        return int(self.hdr[_C_PI]) - int(self.hdr[_C_CI])

    def arm(self, solicited_only: bool) -> None:
        seq = (int(self.hdr[_C_ARM]) >> 1) + 1
        self.hdr[_C_ARM] = seq << 1 | int(solicited_only)

    @property
    def in_error(self) -> bool:
        """The application's view of ``error``."""
        return bool(self.hdr[_C_ERROR])


#: Constants a C implementation of the application's side needs (protocol.h).
C_CONSTANTS: dict[str, int] = {}

#: verbs.h ``IBV_WR_DRIVER1``: a provider's own local WQE (an mlx5 UMR, say),
#: run through ``SendWQE.local_op``; pyverbs exposes no such opcode.
WR_DRIVER1 = 11
C_CONSTANTS.update(
    HEADER_SIZE=HEADER_SIZE, WQ_NONE=WQ_NONE, WQ_SQ=WQ_SQ, WQ_RQ=WQ_RQ, WQ_SRQ=WQ_SRQ,
    F_SIGNALED=F_SIGNALED, F_FENCE=F_FENCE, F_SOLICITED=F_SOLICITED, F_INLINE=F_INLINE,
    CQE_DEAD=CQE_DEAD, CQE_SOLICITED=CQE_SOLICITED, CQE_SIZE=CQE_SIZE,
    REASON_BYTES=REASON_BYTES, WR_DRIVER1=WR_DRIVER1,
    SQ_PI=0, SQ_DB=1, SQ_STATE=2, SQ_POLLED=3, SRQ_PI=0, SRQ_TAKEN=1, SRQ_LIMIT=2, SRQ_DISCARDED=3,
    CQ_PI=0, CQ_CI=1, CQ_ARM=2, CQ_FIRED=3, CQ_ERROR=4,
)
#: what each of :data:`C_CONSTANTS` is (docs/rings.md's table)
C_CONSTANT_DOCS: dict[str, str] = {
    "HEADER_SIZE": "bytes of a ring's header (eight 64-bit words)",
    "WQ_NONE": "CQEntry.wq_kind: the CQE frees no slot",
    "WQ_SQ": "CQEntry.wq_kind: it frees a slot of QP `wq_handle`'s send queue",
    "WQ_RQ": "CQEntry.wq_kind: it frees a slot of QP `wq_handle`'s receive queue",
    "WQ_SRQ": "CQEntry.wq_kind: it releases one WQE of SRQ `wq_handle`",
    "F_SIGNALED": "SendWQEHeader.flags: IBV_SEND_SIGNALED",
    "F_FENCE": "SendWQEHeader.flags: IBV_SEND_FENCE",
    "F_SOLICITED": "SendWQEHeader.flags: IBV_SEND_SOLICITED",
    "F_INLINE": "SendWQEHeader.flags: IBV_SEND_INLINE (`inline_len` bytes follow the header)",
    "CQE_DEAD": "CQEntry.flags: skip this CQE (its QP was reset)",
    "CQE_SOLICITED": "CQEntry.flags: a solicited completion",
    "CQE_SIZE": "bytes of a CQ slot",
    "REASON_BYTES": "bytes of CQEntry.reason",
    "WR_DRIVER1": "SendWQEHeader.opcode IBV_WR_DRIVER1: a provider's WQE (`driver_op`)",
    "SQ_PI": "send/receive queue header word: `pi`",
    "SQ_DB": "send/receive queue header word: `db`",
    "SQ_STATE": "send queue header word: the QP's state + 1 (0: not published)",
    "SQ_POLLED": "send queue header word: nonzero while the device polls `db` (no DOORBELL "
                 "message needed)",
    "SRQ_PI": "SRQ header word: `pi`",
    "SRQ_TAKEN": "SRQ header word: `taken`",
    "SRQ_LIMIT": "SRQ header word: `limit`",
    "SRQ_DISCARDED": "SRQ header word: `discarded`",
    "CQ_PI": "CQ header word: `pi`",
    "CQ_CI": "CQ header word: `ci`",
    "CQ_ARM": "CQ header word: `arm`",
    "CQ_FIRED": "CQ header word: `fired`",
    "CQ_ERROR": "CQ header word: `error`",
}


def poisoned(wqe: Any, why: str) -> Any:
    """What the device runs instead of a WQE it cannot run: for a send WQE, a
    driver WQE with no operation, which completes with ``IBV_WC_LOC_QP_OP_ERR``
    and ``why`` as its reason, in order, and moves the QP to error; for a
    receive WQE, one marked bad, which the message that takes it completes
    with ``IBV_WC_LOC_QP_OP_ERR`` (a malformed WQE: the QP's own error, not a
    protection one) and the QP goes to error.  The application's ring is its
    own business; the device goes on."""
    wr_id = getattr(wqe, "wr_id", 0)
    if wqe is None or isinstance(wqe, SendWQE):
        bad = SendWQE(wr_id, WR_DRIVER1, True, [], 0)
        bad.reason = why
        return bad
    rbad = RecvWQE(wr_id, [], 0)
    rbad.bad = why
    return rbad


# --- construction ------------------------------------------------------------------------------


def ring_slots(max_wr: int) -> int:
    """The slots of the ring of a send or receive queue of ``max_wr`` WRs.

    A queue of 0 WRs is valid (as on rxe, which reports it back as 0: qperf
    makes such QPs for one-sided tests); its ring still has one slot, never
    used, because every post finds the queue full (ENOMEM) against the QP's
    capability.  The C library, the service and the device all size rings
    by this rule."""
    return max(max_wr, 1)


def local_work_ring(size: int) -> WorkRing:
    return WorkRing(size, ObjectSlots(size), local_header())


def local_srq(size: int, max_sge: int) -> SharedRecvRing:
    return SharedRecvRing(size, max_sge, ObjectSlots(size), local_header())


def local_cq(capacity: int) -> CompletionRing:
    return CompletionRing(capacity, ObjectSlots(capacity), local_header())


def shared_work_ring(region: SharedRegion, size: int, slot: int, send: bool,
                     opcodes: frozenset[int] = frozenset()) -> WorkRing:  # fmt: skip
    slots: SlotStore[Any] = (SendSlots(region, size, slot, opcodes) if send
                             else RecvSlots(region, size, slot))  # fmt: skip
    return WorkRing(size, slots, region.words())


def shared_srq(region: SharedRegion, size: int, slot: int, max_sge: int) -> SharedRecvRing:
    return SharedRecvRing(size, max_sge, RecvSlots(region, size, slot), region.words())


def shared_cq(region: SharedRegion, capacity: int) -> CompletionRing:
    return CompletionRing(capacity, CQESlots(region, capacity), region.words())


#: The cache line: the unit a NIC's DMA writes make visible whole.  A
#: message's bytes in its last line are stored after all of its others.
CACHE_LINE = 64


def scatter(views: list[memoryview], offset: int, data: bytes | bytearray | memoryview,
            last: bool = False) -> bool:  # fmt: skip
    """Store ``data`` at byte ``offset`` of the concatenation of ``views``.

    Returns False, storing nothing, when the data does not fit.

    ``last``: ``data`` ends a message (the last packet of a WRITE or SEND, the
    last READ response, a UD datagram).  Its last :data:`CACHE_LINE` bytes
    are then stored by a second copy, after the first has stored the rest, so
    a program that polls a message's last byte (perftest's ``*_lat``, uDAPL's
    ``dtest -W``) finds every byte before it in place -- as hardware, which
    writes in increasing address order, guarantees.  One copy would not: the
    kernel's copy behind a ``/proc/PID/mem`` ``pwrite`` (``rep movsb``), and
    glibc's ``memcpy`` for a shared mapping, may make the end visible before
    the beginning.  Two copies one after the other are ordered: on x86-64
    string operations' stores are not reordered with a later copy's stores,
    and the served path's copies are two system calls.  The earlier packets
    of a message were stored by earlier calls, so they are in place too.
    The last 64 bytes hold all of the last line whatever the alignment."""
    n = len(data)
    if last and n > CACHE_LINE:
        if offset + n > sum(len(v) for v in views):
            return False
        if len(views) == 1 and _ordered_store(views[0], offset, data):
            return True
        cut = n - CACHE_LINE
        whole = memoryview(data)
        _scatter(views, offset, whole[:cut])
        _scatter(views, offset + cut, whole[cut:])
        return True
    if offset + n > sum(len(v) for v in views):
        return False
    _scatter(views, offset, data)
    return True


def _scatter(views: list[memoryview], offset: int, data: bytes | bytearray | memoryview) -> None:
    """``data`` at ``offset`` of the concatenation of ``views`` (it fits)."""
    n = len(data)
    if len(views) == 1:
        views[0][offset : offset + n] = data
        return
    pos = 0
    for view in views:
        size = len(view)
        if offset >= size:
            offset -= size
            continue
        take = min(size - offset, n - pos)
        view[offset : offset + take] = data[pos : pos + take]
        pos += take
        offset = 0
        if pos == n:
            break


def _ordered_store(view: memoryview, offset: int, data: bytes | bytearray | memoryview) -> bool:
    """Store a message's ``data`` (longer than a line) at ``offset`` of ``view``, its
    last line after the rest, through the view's own ordered store if it has one (a
    :class:`~softverbs.engine.memory.Span`'s ``place``: one system call on the served
    device); False, storing nothing, if it has none (a memoryview, a signature
    key's writer): the caller then makes the two stores itself."""
    # the hook is looked up on the view's type (a span's class), and called as a method:
    # no bound method made per store
    if type(view) is memoryview or getattr(type(view), "place", None) is None:
        return False
    view.place(offset, data, CACHE_LINE)
    return True


def place(view: memoryview, offset: int, data: bytes | bytearray | memoryview) -> None:
    """``view[offset : offset + len(data)] = data``, ending a message: the last
    :data:`CACHE_LINE` bytes stored last (see :func:`scatter`).  ``view`` is a
    memoryview or a memory span (:class:`softverbs.engine.memory.Span`), whose
    ``place`` makes the two copies one system call (``device/memory.py``)."""
    n = len(data)
    if n > CACHE_LINE:
        if _ordered_store(view, offset, data):
            return
        cut = n - CACHE_LINE
        # the engine's payload is already a view: slice it, no second view of it
        whole = data if type(data) is memoryview else memoryview(data)
        view[offset : offset + cut] = whole[:cut]
        view[offset + cut : offset + n] = whole[cut:]
    else:
        view[offset : offset + n] = data
