"""Hardware-like rings: send and receive queues, shared receive queues, CQs.

A :class:`WorkQueue` is a ring of ``size`` slots with three indices that only
grow:

* ``pi`` -- producer: the driver wrote a WQE there (``post_send``).
* ``db`` -- doorbell: the device may execute WQEs below it.  A deferred post
  advances ``pi`` but not ``db``.
* ``ci`` -- consumer as the *driver* sees it: advanced only when the
  application polls a CQE for the WQE at ``ci`` or a later one.

The ring is full when ``pi - ci == size``.  Because ``ci`` moves only on poll,
unsignaled WQEs keep their slots until a later signaled WQE's CQE is polled,
which is exactly the trap RDMAmojo describes (seed 000): fill a send queue
with unsignaled WRs and it can never drain again.  No special case does this;
it is the ring.

A :class:`CompletionQueue` is a ring of CQE records with a fixed capacity.
Pushing into a full CQ is an overrun: :meth:`CompletionQueue.push` reports it
and the device puts the CQ and its QPs into error.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from softverbs.enums import IBV_WC_SUCCESS

if TYPE_CHECKING:
    from softverbs.engine.memory import MemKey

#: One scatter/gather entry: (address, length, lkey).
Sge = tuple[int, int, int]


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


class SendWQE:
    """A send-queue entry: the WR as posted, plus the requester's progress."""

    __slots__ = (
        "ackd",
        "bind",
        "compare_add",
        "data",
        "fence",
        "imm",
        "index",
        "inline",
        "inv_rkey",
        "length",
        "local_op",
        "nop",
        "npkts",
        "opcode",
        "psn",
        "reason",
        "remote_addr",
        "remote_qkey",
        "remote_qpn",
        "rkey",
        "route",
        "rxd",
        "se",
        "sges",
        "signaled",
        "started",
        "status",
        "swap",
        "tx",
        "wr_id",
        "xrc_srqn",
    )

    def __init__(self, wr_id: int, opcode: int, signaled: bool, sges: list[Sge], length: int):
        self.wr_id = wr_id
        self.opcode = opcode
        self.signaled = signaled
        self.sges = sges
        self.length = length
        self.index = 0
        self.inline: bytes | None = None
        self.fence = False
        self.se = False
        self.imm = 0
        self.inv_rkey = 0
        self.rkey = 0
        self.remote_addr = 0
        self.compare_add = 0
        self.swap = 0
        self.remote_qpn = 0
        self.remote_qkey = 0
        self.route: Route | None = None
        self.xrc_srqn = 0
        #: BIND_MW: (mw key, mr key, new rkey, addr, length, access)
        self.bind: tuple[MemKey, MemKey, int, int, int, int] | None = None
        #: a provider's local WQE (IBV_WR_DRIVER1): run in send-queue order,
        #: returns None or why it failed
        self.local_op: Callable[[], str | None] | None = None
        self.nop = False  #: cancelled: completes as a NOP (cancel_posted_send_wrs)
        # requester progress
        self.started = False
        self.psn = 0
        self.npkts = 0
        self.tx = 0  #: packets of this WQE handed to the fabric in this pass
        self.rxd = 0  #: READ: response packets received in order
        self.ackd = False  #: every packet acknowledged (RC) or sent (UC/UD)
        self.data: Any = None  #: gathered payload, or READ/atomic target views
        self.status: int = IBV_WC_SUCCESS
        self.reason = ""  #: why it failed, in words


class RecvWQE:
    """A receive-queue or SRQ entry."""

    __slots__ = ("index", "length", "sges", "srq", "wr_id")

    def __init__(self, wr_id: int, sges: list[Sge], length: int) -> None:
        self.wr_id = wr_id
        self.sges = sges
        self.length = length
        self.index = 0
        self.srq: SharedRQ | None = None


class WorkQueue:
    """A send or receive queue ring (see the module docstring)."""

    __slots__ = ("ci", "db", "pi", "size", "slots")

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: list[Any] = [None] * size
        self.pi = 0
        self.db = 0
        self.ci = 0

    @property
    def used(self) -> int:
        return self.pi - self.ci

    def push(self, wqe: SendWQE | RecvWQE) -> None:
        wqe.index = self.pi
        self.slots[self.pi % self.size] = wqe
        self.pi += 1

    def get(self, index: int) -> Any:
        return self.slots[index % self.size]

    def release(self, index: int) -> None:
        """The application polled a CQE for the WQE at ``index``."""
        if index >= self.ci:
            self.ci = index + 1

    def reset(self) -> None:
        self.slots = [None] * self.size
        self.pi = self.db = self.ci = 0

    def resize(self, size: int) -> None:
        live = [self.get(i) for i in range(self.ci, self.pi)]
        self.size = size
        self.slots = [None] * size
        for i, wqe in enumerate(live, start=self.ci):
            self.slots[i % size] = wqe


class SharedRQ:
    """A shared receive queue: a pool of receive WQEs any attached QP may take.

    ``outstanding`` counts WQEs posted and not yet released by a poll (or a
    RESET), so the queue is full at ``outstanding == max_wr``.
    """

    __slots__ = ("armed_limit", "cq", "max_sge", "max_wr", "on_limit", "outstanding",
                 "owner", "pd", "posted", "srqn", "xrcd")  # fmt: skip

    def __init__(self, max_wr: int, max_sge: int, srqn: int = 0) -> None:
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.posted: deque[RecvWQE] = deque()
        self.outstanding = 0
        self.armed_limit = 0
        self.srqn = srqn
        self.xrcd: object = None
        self.cq: CompletionQueue | None = None  #: XRC SRQs complete into their own CQ
        self.on_limit: Callable[[SharedRQ], None] | None = None
        self.owner: Any = None  #: the verbs SRQ
        self.pd: object = None

    def modify(self, max_wr: int | None, limit: int | None) -> None:
        if max_wr is not None:
            self.max_wr = max_wr
        if limit is not None:
            self.armed_limit = limit

    def post(self, wqe: RecvWQE) -> None:
        wqe.srq = self
        self.posted.append(wqe)
        self.outstanding += 1

    def take(self) -> RecvWQE | None:
        if not self.posted:
            return None
        wqe = self.posted.popleft()
        if self.armed_limit and len(self.posted) < self.armed_limit:
            self.armed_limit = 0
            if self.on_limit is not None:
                self.on_limit(self)
        return wqe

    def release(self, index: int) -> None:
        self.outstanding -= 1


class CQE:
    """A completion record.  ``wq``/``index`` let a poll release ring slots."""

    __slots__ = (
        "byte_len",
        "imm",
        "index",
        "opcode",
        "qp",
        "qp_num",
        "reason",
        "sl",
        "slid",
        "solicited",
        "src_qp",
        "status",
        "vendor_err",
        "wc_flags",
        "wq",
        "wr_id",
    )

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
        self.wr_id = wr_id
        self.status = status
        self.opcode = opcode
        self.qp_num = qp_num
        self.byte_len = byte_len
        self.wc_flags = wc_flags
        self.imm = imm
        self.vendor_err = 0
        self.src_qp = 0
        self.sl = 0
        self.slid = 0
        self.solicited = False
        self.reason = ""
        self.qp: Any = None
        self.wq: WorkQueue | SharedRQ | None = None
        self.index = 0


class CompletionQueue:
    """A CQ ring.  ``push`` returns False on overrun (the CQ was full)."""

    __slots__ = ("armed", "capacity", "entries", "error", "notify", "owner", "solicited_only")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: deque[CQE] = deque()
        self.error = False
        self.armed = False
        self.solicited_only = False
        #: called (with the device lock held) when an armed CQ fires
        self.notify: Callable[[], None] | None = None
        self.owner: Any = None  #: the verbs CQ

    def push(self, cqe: CQE) -> bool:
        if self.error:
            return False
        if len(self.entries) >= self.capacity:
            self.error = True
            return False
        self.entries.append(cqe)
        if self.armed and (
            not self.solicited_only or cqe.solicited or cqe.status != IBV_WC_SUCCESS
        ):
            self.armed = False
            if self.notify is not None:
                self.notify()
        return True

    def take(self, n: int) -> list[CQE]:
        """Consume up to ``n`` CQEs (the driver's poll)."""
        entries = self.entries
        out: list[CQE] = []
        while entries and len(out) < n:
            out.append(entries.popleft())
        return out

    def pending(self) -> int:
        return len(self.entries)

    def arm(self, solicited_only: bool) -> None:
        self.armed = True
        self.solicited_only = solicited_only

    def purge(self, qp: object) -> list[CQE]:
        """Remove the un-polled CQEs of ``qp`` (RESET); returns them."""
        kept: deque[CQE] = deque()
        gone: list[CQE] = []
        for cqe in self.entries:
            (gone if cqe.qp is qp else kept).append(cqe)
        self.entries = kept
        return gone


def scatter(views: list[memoryview], offset: int, data: bytes | bytearray | memoryview) -> bool:
    """Store ``data`` at byte ``offset`` of the concatenation of ``views``.

    Returns False, storing nothing, when the data does not fit.
    """
    n = len(data)
    if len(views) == 1:
        view = views[0]
        if offset + n > len(view):
            return False
        view[offset : offset + n] = data
        return True
    if offset + n > sum(len(v) for v in views):
        return False
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
    return True
