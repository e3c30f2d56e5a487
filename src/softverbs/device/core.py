"""The device's authority: every object by handle, every request dispatched here.

A NIC trusts nothing its driver writes: the kernel and the firmware check
every command against what they own.  softverbs' :class:`Host` plays that
part for every kind of device -- in-process, UDP, and the host device served
by ``softverbsd`` -- so a request is judged in one place, against the
device's own state, under the device's lock.  As the kernel splits its
uverbs objects into ``uverbs_std_types_*.c``, the device layer is split by
object kind:

* :mod:`softverbs.device.ops` -- the ops table: one declaration per
  operation naming its records, its handler, what it takes beyond its record
  and the objects it creates and uses.  Dispatch, the service's descriptor
  rules, the C header and the protocol document all come from it.
* one module of handlers per kind: :mod:`~softverbs.device.context` (the
  device, its port, counters, capture, faults, the sanitizer),
  :mod:`~softverbs.device.pd` (PDs, AHs), :mod:`~softverbs.device.mr` (MRs,
  MWs, mkeys), :mod:`~softverbs.device.cq` (completion channels, CQs),
  :mod:`~softverbs.device.srq`, :mod:`~softverbs.device.xrc` (XRC domains
  and receive QPs) and :mod:`~softverbs.device.qp`.  Each also declares its
  kind's record (an :class:`Obj` subclass with its engine typed) and what
  destroying one releases.
* this module -- the :class:`Host`: owners, handles, lifetimes and dispatch,
  and the device rules several kinds share (:data:`LIMITS`, access flags,
  routes).

What the Host guarantees:

* **Handles.**  Every object is created by an :class:`Owner` -- this
  process, or one process connected to the service -- and named by a handle.
  Handles are unique across owners: naming another owner's object is
  ``EPERM``, naming nothing is ``EINVAL``, and an object is used only on its
  own device and with parents of its own owner (:meth:`Host.obj`).
* **Requests.**  Sizes, indices, bounds and access flags are checked
  against the device's limits; a modify is judged by the QP state table
  against the QP's real state (:meth:`QPEngine.modify`); routes are resolved
  against the device's GID table.  Nothing a driver says about ring indices
  or object state is believed (:mod:`softverbs.engine.rings`).
* **Lifetimes.**  An object that others use cannot be destroyed (``EBUSY``).
  When an owner goes away -- ``Context.close`` of the last context, a process
  that exits or is killed -- :meth:`Host.close_owner` destroys what it held,
  users before what they use, and lets go of the XRC receive QPs it
  registered with (seed 002: those belong to the device and live while anyone
  holds them).

:meth:`Host.execute` runs one operation.  The in-process provider calls it
directly; the service decodes the same records from its clients' bytes.
What a request needs beyond its record -- ring memory, the memory of a
region, an event sink -- comes as :class:`Resources`, built by whoever
received it.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, BinaryIO, ClassVar, Protocol, TypeVar

from softverbs.device import records
from softverbs.device.memory import AddressSpace, ProcessMemory
from softverbs.device.records import (
    KIND_AH,
    KIND_CAPTURE,
    KIND_CHANNEL,
    KIND_CQ,
    KIND_CTX,
    KIND_MKEY,
    KIND_MR,
    KIND_MW,
    KIND_NAMES,
    KIND_PD,
    KIND_QP,
    KIND_SRQ,
    KIND_XRCD,
    Rep,
    Req,
)
from softverbs.engine import observe
from softverbs.engine.hca import (
    HCA,
    MAX_MCAST_GRP,
    MAX_MCAST_QP_ATTACH,
    MAX_TOTAL_MCAST_QP_ATTACH,
)
from softverbs.engine.memory import Bytes
from softverbs.engine.qp import QPEngine
from softverbs.engine.rings import (
    CompletionRing,
    Route,
    SharedRecvRing,
    WorkRing,
)
from softverbs.enums import (
    IBV_ACCESS_FLUSH_GLOBAL,
    IBV_ACCESS_FLUSH_PERSISTENT,
    IBV_ACCESS_HUGETLB,
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_ON_DEMAND,
    IBV_ACCESS_RELAXED_ORDERING,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_ACCESS_ZERO_BASED,
    IBV_ATOMIC_HCA,
    IBV_DEVICE_BAD_PKEY_CNTR,
    IBV_DEVICE_BAD_QKEY_CNTR,
    IBV_DEVICE_CHANGE_PHY_PORT,
    IBV_DEVICE_MEM_MGT_EXTENSIONS,
    IBV_DEVICE_MEM_WINDOW,
    IBV_DEVICE_MEM_WINDOW_TYPE_2B,
    IBV_DEVICE_PORT_ACTIVE_EVENT,
    IBV_DEVICE_RC_RNR_NAK_GEN,
    IBV_DEVICE_SRQ_RESIZE,
    IBV_DEVICE_SYS_IMAGE_GUID,
    IBV_DEVICE_UD_AV_PORT_ENFORCE,
    IBV_DEVICE_XRC,
    IBV_LINK_LAYER_ETHERNET,
    IBV_MTU_4096,
    IBV_PORT_ACTIVE,
    IBV_PORT_CM_SUP,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
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
from softverbs.errors import PyverbsRDMAError, ebusy, einval, eopnotsupp, eperm
from softverbs.sanitizer import Sanitizer
from softverbs.wire.packet import gid_text

# --- what a softverbs device has -----------------------------------------------------------

GID_TABLE_LEN = 16
PKEY_TABLE = (0xFFFF,)
MAX_MSG_SZ = 1 << 31
FW_VERSION = "0.0.0"
VENDOR_ID = 0xFFFFFF

#: Device limits, reported by query_device and enforced here.
LIMITS: dict[str, int] = {
    "max_qp": 0x10000,
    "max_qp_wr": 0x4000,
    "max_sge": 32,
    "max_sge_rd": 32,
    "max_cq": 0x4000,
    "max_cqe": 0x8000 - 1,
    "max_mr": 0x40000,
    "max_pd": 0x10000,
    "max_qp_rd_atom": 128,
    "max_qp_init_rd_atom": 128,
    "max_res_rd_atom": 0x10000,
    "max_mw": 0x10000,
    "max_ah": 0x8000,
    "max_srq": 0x10000,
    "max_srq_wr": 0x4000,
    "max_srq_sge": 27,
    "max_pkeys": len(PKEY_TABLE),
    "max_inline_data": 0x400,
    "max_mcast_grp": MAX_MCAST_GRP,
    "max_mcast_qp_attach": MAX_MCAST_QP_ATTACH,
}

DEVICE_CAP_FLAGS = int(
    IBV_DEVICE_BAD_PKEY_CNTR | IBV_DEVICE_BAD_QKEY_CNTR | IBV_DEVICE_CHANGE_PHY_PORT
    | IBV_DEVICE_UD_AV_PORT_ENFORCE | IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID
    | IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_MEM_MGT_EXTENSIONS
    | IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_XRC
)  # fmt: skip

#: Counters every device reports, even at zero (rxe's hw_counters names where one exists).
STANDARD_COUNTERS = (
    "sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "rcvd_rnr_err",
    "send_rnr_err", "rcvd_seq_err", "retry_exceeded_err", "retry_rnr_exceeded_err",
    "completer_retry_err", "send_err", "rdma_sends", "rdma_recvs", "ack_deferred",
    "link_downed", "doorbells", "mr_unmapped",
    # DCQCN, by mlx5's names: the notification point's, then the reaction point's
    "np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored",
)  # fmt: skip

MAX_DM_SIZE = 256 * 1024

SUPPORTED_ACCESS = int(
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED
    | IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB | IBV_ACCESS_RELAXED_ORDERING
)  # fmt: skip
#: Rights softverbs knows but has no device support for (no FLUSH operation).
UNSUPPORTED_ACCESS = int(IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT)

_ALL_OPS = frozenset({IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_SEND_WITH_INV, IBV_WR_RDMA_WRITE,
                      IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP,
                      IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_LOCAL_INV, IBV_WR_BIND_MW})  # fmt: skip
#: WR opcodes each QP type executes (a provider's driver WQE is built by the provider).
ALLOWED_OPCODES: dict[int, frozenset[int]] = {
    IBV_QPT_RC: _ALL_OPS,
    IBV_QPT_XRC_SEND: _ALL_OPS,
    IBV_QPT_UC: frozenset({IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE,
                           IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_LOCAL_INV, IBV_WR_BIND_MW}),
    IBV_QPT_UD: frozenset({IBV_WR_SEND, IBV_WR_SEND_WITH_IMM}),
    IBV_QPT_XRC_RECV: frozenset(),
}  # fmt: skip


@dataclass
class Features:
    """What a device can do beyond the basics, by where its engine runs."""

    on_demand_paging: bool = True  #: ODP MRs and implicit ODP (ibv_query_device_ex)
    device_memory: bool = True  #: ibv_alloc_dm
    srq_resize: bool = True  #: ibv_modify_srq with IBV_SRQ_MAX_WR


@dataclass
class DeviceInfo:
    """What identifies a device and its port."""

    name: str
    guid: int
    mtu: int  #: the port's active MTU, in bytes
    netdev: str = ""
    ifindex: int = 0
    kind: int = 0  #: api.DeviceEntry.kind: 0 the host device, 1 a UDP link, 2 in-process
    features: Features = field(default_factory=Features)


# --- rules --------------------------------------------------------------------------------


def _name(enum: Any, value: int) -> str:
    try:
        return str(enum(value).name)
    except ValueError:
        return str(value)


def check_access(access: int, what: str = "MR") -> int:
    """The verbs rules for access flags (IBA 10.6.3.1); ``what`` prefixes the error."""
    unknown = access & ~(SUPPORTED_ACCESS | UNSUPPORTED_ACCESS)
    if access < 0 or unknown:
        raise einval(f"{what}: unknown access flag bits {unknown:#x}")
    if access & UNSUPPORTED_ACCESS:
        raise eopnotsupp(f"{what}: softverbs devices do not support the FLUSH operation "
                         "(IBV_ACCESS_FLUSH_GLOBAL / IBV_ACCESS_FLUSH_PERSISTENT)")  # fmt: skip
    if access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) and not (
        access & IBV_ACCESS_LOCAL_WRITE
    ):
        raise einval(
            f"{what}: IBV_ACCESS_REMOTE_WRITE and IBV_ACCESS_REMOTE_ATOMIC require "
            "IBV_ACCESS_LOCAL_WRITE (the device writes into the region)"
        )
    return access



def _range(name: str, value: int, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        raise einval(f"{name}={value!r} is out of range {lo}..{hi}")
    return value


def resolve_route(gids: list[bytes], av: records.AddressVector, what: str = "AH") -> Route:
    """An address vector as a route, or EINVAL saying what is wrong.

    On RoCE every address is global: the GRH (the IP header) names the
    destination GID, so an address vector without one is refused, as the
    kernel refuses it for rxe (``rdma_check_ah_attr``).  The flow label field
    is 32 bits wide in the ABI, and the kernel takes any value: the IPv6 header
    holds its low 20 bits, and so does the route here (UCX passes
    ``~(factor * path)``, all ones for its first path).
    """
    if av.port_num != 1:
        raise einval(f"{what}: port {av.port_num} does not exist; use port_num=1")
    if not av.is_global:
        raise einval(
            f"{what}: RoCE needs a global route: set is_global=1 and a GlobalRoute "
            "with the destination GID (LID-only addressing is InfiniBand-only)"
        )
    index = av.sgid_index
    if not 0 <= index < len(gids) or not any(gids[index]):
        raise einval(f"{what}: sgid_index {index} is not a valid GID index; this device has "
                     f"GIDs 0..{len(gids) - 1}")  # fmt: skip
    if av.dgid == bytes(16):
        raise einval(f"{what}: the destination GID is all zeros")
    return Route(dgid=bytes(av.dgid), sgid=gids[index], sgid_index=index,
                 hop_limit=_range("hop_limit", av.hop_limit, 0, 255),
                 tclass=_range("traffic_class", av.traffic_class, 0, 255),
                 flow_label=_range("flow_label", av.flow_label, 0, 0xFFFFFFFF) & 0xFFFFF,
                 port=1)  # fmt: skip



# --- owners and their objects ---------------------------------------------------------------

AsyncSink = Callable[[records.AsyncEventRecord, str], None]
CompSink = Callable[[int], None]


@dataclass
class Resources:
    """What a request needs beyond its record, prepared by whoever received it
    (the service by its descriptor rule for the operation's ``takes``)."""

    events: AsyncSink | None = None  #: ASYNC_SOCKET: where a context's async events go
    completions: CompSink | None = None  #: COMP_SOCKET: where a channel's events go
    span: Bytes | None = None  #: REGION: a mapping (else the process's memory)
    #: the asking process's memory when it is not the owner's: a forked child that
    #: joined its parent's owner registers its own pages, as ib_umem_get pins the
    #: caller's (None: the owner's memory)
    memory: AddressSpace | None = None
    cq: CompletionRing | None = None  #: CQ_RING
    srq: SharedRecvRing | None = None  #: SRQ_RING
    sq: WorkRing | None = None  #: QP_RINGS
    rq: WorkRing | None = None  #: QP_RINGS
    file_key: tuple[int, int] | None = None  #: XRCD_FILE: the file's (st_dev, st_ino)
    file: BinaryIO | None = None  #: PCAP_FILE, REPORT_FILE: open for writing
    text: str = ""  #: RULES_TEXT, REPORT_FILE: the text after the record
    release: list[Callable[[], None]] = field(default_factory=list)  #: run at destroy


class Obj:
    """One object of an owner; each kind's subclass (in its kind's module)
    types its :attr:`engine` and says what destroying it releases."""

    KIND: ClassVar[int] = 0
    __slots__ = ("ctx", "device", "engine", "handle", "owner", "parents", "release", "users")

    engine: object  #: the engine object: QPEngine, MemKey, ring, XrcDomain ... (None: none)

    def __init__(self, owner: Owner, device: Device, ctx: CtxObj | None) -> None:
        self.owner = owner
        self.handle = 0  #: given by Host.add
        self.device = device
        self.ctx = ctx  #: the context whose event socket hears about it
        self.engine = None
        self.parents: list[Obj] = []
        self.users = 0  #: objects that use this one (destroying it is EBUSY)
        self.release: list[Callable[[], None]] = []  #: what to close when it goes

    @property
    def kind(self) -> int:
        return self.KIND

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.KIND, str(self.KIND))

    def teardown(self, hca: HCA) -> None:
        """Let go of the engine's part (under the device's lock); EBUSY leaves
        the object as it was."""

    def uses(self, other: Obj) -> bool:
        """Whether this object uses ``other`` in a way its parents do not say
        (a window bound to a region)."""
        return False

    def describe(self, entry: dict[str, Any]) -> None:
        """Add this kind's fields to its entry of :meth:`Host.describe`."""

    def __repr__(self) -> str:
        return f"<{self.kind_name} {self.handle} of {self.owner}>"


class CtxObj(Obj):
    """A device context: its owner's objects' async events go to its sink."""

    KIND = KIND_CTX
    __slots__ = ("sink",)

    def __init__(self, owner: Owner, device: Device, sink: AsyncSink | None) -> None:
        super().__init__(owner, device, None)
        self.ctx = self
        self.sink = sink

    def teardown(self, hca: HCA) -> None:
        self.sink = None  # no event reaches a context that is gone


O = TypeVar("O", bound=Obj)

#: every kind's record class, by kind number (each kind's module adds its own)
KINDS: dict[int, type[Obj]] = {KIND_CTX: CtxObj}


def kind_class(cls: type[O]) -> type[O]:
    """Class decorator: ``cls`` is the record of kind ``cls.KIND``."""
    KINDS[cls.KIND] = cls
    return cls


class Owner:
    """Who holds objects: this process, or one process connected to the service."""

    def __init__(self, label: str, pid: int = 0, uid: int = 0,
                 memory: AddressSpace | None = None) -> None:  # fmt: skip
        self.label = label
        self.pid = pid
        self.uid = uid
        self.memory = memory  #: the process's memory, or None (none given to the device)
        self.objects: dict[int, Obj] = {}
        self.closed = False
        #: names this owner to a forked child that joins it (HELLO_JOIN)
        self.token = int.from_bytes(os.urandom(8), "little")
        self.connections = 1  #: the service's connections that hold it
        self.release: list[Callable[[], None]] = []  #: what to close when it goes

    def __repr__(self) -> str:
        return self.label


class Clock(Protocol):
    def now(self) -> float: ...


class DeviceRuntime(Protocol):
    """What drives a device: its lock, clock and progress loop (a fabric Runtime)."""

    @property
    def lock(self) -> Any: ...

    @property
    def clock(self) -> Clock: ...

    def progress(self) -> bool: ...

    def next_deadline(self) -> float | None: ...


class Device:
    """One device: its engine (:class:`HCA`), its port, and who drives it."""

    def __init__(self, info: DeviceInfo, hca: HCA, runtime: DeviceRuntime) -> None:
        self.info = info
        self.hca = hca
        self.runtime = runtime
        self.host: Host | None = None
        hca.on_event = self._on_event

    @property
    def name(self) -> str:
        return self.info.name

    # --- queries ---------------------------------------------------------------------------
    def device_attrs(self) -> records.DeviceAttrs:
        f = self.info.features
        odp = 0x3F if f.on_demand_paging else 0  # send, recv, write, read, atomic, srq recv
        limits = {k: v for k, v in LIMITS.items() if k != "max_inline_data"}
        flags = DEVICE_CAP_FLAGS if f.srq_resize else DEVICE_CAP_FLAGS & ~IBV_DEVICE_SRQ_RESIZE
        return records.DeviceAttrs(
            fw_ver=FW_VERSION, node_guid=self.info.guid, sys_image_guid=self.info.guid,
            max_mr_size=(1 << 64) - 1, page_size_cap=0xFFFFF000,
            max_dm_size=MAX_DM_SIZE if f.device_memory else 0, device_cap_flags_ex=flags,
            vendor_id=VENDOR_ID, vendor_part_id=0, hw_ver=0, device_cap_flags=flags,
            max_ee_rd_atom=0, max_ee_init_rd_atom=0, atomic_cap=int(IBV_ATOMIC_HCA), max_ee=0,
            max_rdd=0, max_raw_ipv6_qp=0, max_raw_ethy_qp=0,
            max_total_mcast_qp_attach=MAX_TOTAL_MCAST_QP_ATTACH,
            max_fmr=0, max_map_per_fmr=0, local_ca_ack_delay=15, phys_port_cnt=1,
            max_inline_data=LIMITS["max_inline_data"],
            odp_general_caps=3 if f.on_demand_paging else 0,  # IBV_ODP_SUPPORT | IMPLICIT
            odp_rc_caps=odp, odp_uc_caps=odp, odp_ud_caps=odp, odp_xrc_caps=odp, reserved=0,
            **limits,
        )  # fmt: skip

    def port_attrs(self) -> records.PortAttrs:
        from softverbs.enums import bytes_to_mtu

        counters = self.hca.counters
        return records.PortAttrs(
            max_msg_sz=MAX_MSG_SZ, state=int(IBV_PORT_ACTIVE), max_mtu=int(IBV_MTU_4096),
            active_mtu=int(bytes_to_mtu(self.info.mtu)), gid_tbl_len=GID_TABLE_LEN,
            port_cap_flags=int(IBV_PORT_CM_SUP), bad_pkey_cntr=counters["drop_bad_pkey"],
            qkey_viol_cntr=counters["qkey_violation"], pkey_tbl_len=len(PKEY_TABLE), lid=0,
            sm_lid=0, lmc=0, max_vl_num=1, sm_sl=0, subnet_timeout=0, init_type_reply=0,
            active_width=1, active_speed=0x80, phys_state=5,
            link_layer=int(IBV_LINK_LAYER_ETHERNET), flags=0, port_cap_flags2=0,
            active_speed_ex=0,
        )  # fmt: skip

    def counters(self) -> dict[str, int]:
        out = dict.fromkeys(STANDARD_COUNTERS, 0)
        out.update(self.hca.counters)
        return out

    # --- events ----------------------------------------------------------------------------
    def _on_event(self, event_type: int, element: Any) -> None:
        """Route an engine event to the context that owns its object."""
        reason = getattr(element, "last_error", "") or ""
        rec = getattr(element, "owner", None)
        qpn = int(getattr(element, "qpn", 0))
        if isinstance(element, QPEngine) and element.qp_type == IBV_QPT_XRC_RECV:
            # A device-owned XRC receive QP: every owner that holds it hears
            # of it once -- by its handle if it has one, else by QP number.
            told: set[Owner] = set()
            holders = self.hca.xrc_refs.get(element.qpn, set())
            for holder in sorted(holders, key=lambda h: not isinstance(h, Obj)):
                owner = holder.owner if isinstance(holder, Obj) else holder
                if not isinstance(owner, Owner) or owner in told:
                    continue
                told.add(owner)
                if isinstance(holder, Obj):
                    _emit(holder, event_type, qpn, reason)
                else:
                    ctx = next((o for o in owner.objects.values()
                                if isinstance(o, CtxObj) and o.device is self), None)  # fmt: skip
                    if ctx is not None and ctx.sink is not None:
                        ctx.sink(records.AsyncEventRecord(event_type, KIND_QP, 0, qpn), reason)
            return
        if isinstance(rec, Obj):
            _emit(rec, event_type, qpn, reason)


def _emit(rec: Obj, event_type: int, qpn: int, reason: str) -> None:
    ctx = rec.ctx
    if ctx is not None and ctx.sink is not None and not rec.owner.closed:
        ctx.sink(records.AsyncEventRecord(event_type, rec.KIND, rec.handle, qpn), reason)


#: Teardown order when an owner goes: users before what they use.
_TEARDOWN = {KIND_CAPTURE: 0, KIND_QP: 1, KIND_MKEY: 2, KIND_MW: 3, KIND_AH: 4, KIND_SRQ: 5,
             KIND_MR: 6, KIND_CQ: 7, KIND_CHANNEL: 8, KIND_XRCD: 9, KIND_PD: 10,
             KIND_CTX: 11}  # fmt: skip


class Host:
    """Every device of one world, and every owner's objects on them (module docstring).

    ``open_device(name)`` builds a device on first use; ``list_devices()``
    says which exist.  Both come from the world's registry.
    """

    def __init__(self, open_device: Callable[[str], Device],
                 entries: Callable[[], list[records.DeviceEntry]]) -> None:  # fmt: skip
        self._open_device = open_device
        self.entries = entries
        self.devices: dict[str, Device] = {}
        self.owners: set[Owner] = set()
        self.handles: dict[int, Obj] = {}
        self._next_handle = 1
        #: objects made and destroyed, by kind: a kind's count moves whenever the set of
        #: objects of that kind changes (the service lists a process's QPs again then)
        self.changes: Counter[int] = Counter()
        self.lock = threading.RLock()
        self.stats: Counter[str] = Counter()
        #: the verbs sanitizer, once a process has asked for it (SANITIZE)
        self.sanitizer: Sanitizer | None = None
        #: told of a device that no object uses any more (no context, no QP left in
        #: its engine): the world may stop it (a UDP device frees its addresses)
        self.on_idle: Callable[[Device], None] | None = None

    # --- owners ------------------------------------------------------------------------------
    def add_owner(self, owner: Owner) -> Owner:
        with self.lock:
            self.owners.add(owner)
        return owner

    def owner_by_token(self, token: int) -> Owner | None:
        with self.lock:
            return next((o for o in self.owners if o.token == token and not o.closed), None)

    def device(self, name: str) -> Device:
        with self.lock:
            dev = self.devices.get(name)
            if dev is None:
                dev = self._open_device(name)
                dev.host = self
                self.devices[name] = dev
                if self.sanitizer is not None:
                    observe.attach_once(dev.hca, self.sanitizer)
                    dev.hca.keys.on_unmapped = self.sanitizer.unmapped
            return dev

    # --- dispatch ------------------------------------------------------------------------------
    def execute(self, owner: Owner, op: records.Op[Req, Rep], body: Req,
                res: Resources | None = None) -> records.Reply[Rep]:  # fmt: skip
        """Run one operation for ``owner`` by its declared handler: its reply.

        Errors are PyverbsRDMAError with the errno a driver returns."""
        handler = op.handler
        if handler is None:
            raise eopnotsupp(f"{op.name} is not an operation of this device")
        if owner.closed:
            raise PyverbsRDMAError("the owner of this request is gone", errno.EIO)
        with self.lock:
            out = handler(self, owner, body, res if res is not None else Resources())
        return out if isinstance(out, records.Reply) else records.Reply(out)

    # --- handles -------------------------------------------------------------------------------
    def obj(self, owner: Owner, handle: int, cls: type[O], device: Device | None = None,
            what: str = "") -> O:  # fmt: skip
        """``owner``'s object ``handle`` of kind ``cls`` (on ``device``), or EINVAL/EPERM."""
        rec = self.handles.get(handle)
        if (rec is not None and rec.owner is owner and isinstance(rec, cls)
                and (device is None or rec.device is device)):  # fmt: skip
            return rec  # every doorbell and request comes this way: no message built
        name = what or KIND_NAMES.get(cls.KIND, "object")
        if rec is None:
            raise einval(f"no {name} has handle {handle}")
        if rec.owner is not owner:
            raise eperm(f"{name} handle {handle} belongs to another process")
        if not isinstance(rec, cls):
            raise einval(f"handle {handle} is a {rec.kind_name}, not a {name}")
        assert device is not None  # the one check left
        raise einval(f"the {name} (handle {handle}) is on device {rec.device.name}, "
                     f"not {device.name}")  # fmt: skip

    def opt(self, owner: Owner, handle: int, cls: type[O], device: Device) -> O | None:
        """As :meth:`obj`, but handle 0 is none."""
        return None if handle == 0 else self.obj(owner, handle, cls, device)

    def ctx(self, owner: Owner, handle: int) -> CtxObj:
        return self.obj(owner, handle, CtxObj, what="device context")

    def add(self, rec: O, parents: tuple[Obj | None, ...] = ()) -> O:
        """Give ``rec`` a handle: it is its owner's now, and uses ``parents``."""
        handle = self._next_handle
        while handle in self.handles or handle == 0:
            handle = (handle + 1) & 0xFFFFFFFF
        self._next_handle = (handle + 1) & 0xFFFFFFFF or 1
        rec.handle = handle
        for parent in parents:
            if parent is not None:
                rec.parents.append(parent)
                parent.users += 1
        rec.owner.objects[handle] = rec
        self.handles[handle] = rec
        self.changes[rec.KIND] += 1
        self.stats[f"created_{rec.kind_name}"] += 1
        return rec

    @contextmanager
    def on(self, dev: Device) -> Iterator[None]:
        """Under the device's lock; the engine runs after the request."""
        with dev.runtime.lock:
            try:
                yield
            finally:
                dev.runtime.progress()

    def describe(self, skip: set[Owner] | None = None) -> dict[str, Any]:
        """Every owner (but ``skip``) and object, for `softverbs service status`
        and `softverbs res`.  An object's ``pdn``, ``cqn``, ``ctxn`` ... are the
        handles of the objects it was made with, as ``rdma res`` numbers them;
        ``users`` counts the objects made with it (a QP uses its CQ twice when
        it both sends and receives on it, as in the kernel)."""
        owners = []
        for o in sorted(self.owners - (skip or set()), key=lambda o: o.pid):
            objs = []
            for rec in sorted(o.objects.values(), key=lambda r: r.handle):
                entry: dict[str, Any] = {"kind": rec.kind_name, "handle": rec.handle,
                                         "device": rec.device.name, "users": rec.users}  # fmt: skip
                if rec.ctx is not None and rec.ctx is not rec:
                    entry["ctxn"] = rec.ctx.handle
                pd = next((p for p in rec.parents if p.KIND == KIND_PD), None)
                if pd is not None:
                    entry["pdn"] = pd.handle
                rec.describe(entry)
                objs.append(entry)
            mine: dict[str, Any] = {"label": o.label, "pid": o.pid, "uid": o.uid, "objects": objs}
            if isinstance(o.memory, ProcessMemory):  # how the service copies its memory
                mine["copies"] = o.memory.copies()
            owners.append(mine)
        xrc = []
        for dev in self.devices.values():
            for qpn, refs in dev.hca.xrc_refs.items():
                xrc.append({"device": dev.name, "qpn": qpn, "holders": len(refs)})
        return {"devices": sorted(self.devices), "owners": owners, "xrc_rcv_qps": xrc,
                "stats": dict(self.stats)}  # fmt: skip

    # --- lifetimes ------------------------------------------------------------------------------
    def destroy(self, owner: Owner, req: records.Destroy, res: Resources) -> records.Empty:
        """DESTROY: the object ``req`` names, once nothing uses it (or, with
        DESTROY_CASCADE, after what uses it)."""
        cls = KINDS.get(req.kind)
        if cls is None or req.kind not in _TEARDOWN:
            raise einval(f"destroy: unknown kind {req.kind}")
        rec = self.obj(owner, req.handle, cls)
        san = self.sanitizer
        if req.flags & records.DESTROY_CASCADE:
            for user in sorted(self._users_of(rec), key=lambda r: (_TEARDOWN[r.KIND], -r.handle)):
                if san is not None:
                    san.destroying(user)
                self._destroy(user)
        if rec.users:
            raise ebusy(f"Failed to destroy {rec.kind_name} {rec.handle}: {rec.users} object(s) "
                        "still use it; destroy them first")  # fmt: skip
        eng = rec.engine
        if isinstance(eng, QPEngine) and not req.flags & records.DESTROY_CASCADE:
            groups = rec.device.hca.mcast_groups(eng)
            if groups:  # the kernel's uverbs_free_qp: detach first
                raise ebusy(f"Failed to destroy QP {eng.qpn:#x}: it is attached to "
                            f"{len(groups)} multicast group(s) ({gid_text(groups[0])} ...); "
                            "detach it first (ibv_detach_mcast)")  # fmt: skip
        if san is not None:
            san.destroying(rec)
        self._destroy(rec)
        if isinstance(rec, CtxObj):
            self._retire_idle()
        return records.Empty()

    def _retire_idle(self) -> None:
        """Tell :attr:`on_idle` of every device nothing uses any more."""
        if self.on_idle is None:
            return
        used = {o.device for o in self.handles.values()}
        for dev in list(self.devices.values()):
            if dev not in used and not dev.hca.qps:
                self.on_idle(dev)

    @staticmethod
    def _users_of(rec: Obj) -> list[Obj]:
        """Every object of ``rec``'s owner that uses it, directly or not (a
        window bound to a region uses that region)."""
        found: list[Obj] = []
        frontier = [rec]
        objs = list(rec.owner.objects.values())
        while frontier:
            parent = frontier.pop()
            for o in objs:
                if (parent in o.parents or o.uses(parent)) and o not in found:
                    found.append(o)
                    frontier.append(o)
        return found

    def _destroy(self, rec: Obj) -> None:
        dev = rec.device
        with dev.runtime.lock:
            try:
                rec.teardown(dev.hca)
            finally:
                dev.runtime.progress()
        for parent in rec.parents:
            parent.users -= 1
        rec.parents = []
        rec.owner.objects.pop(rec.handle, None)
        self.handles.pop(rec.handle, None)
        self.changes[rec.KIND] += 1
        for close in rec.release:
            close()
        rec.release = []
        self.stats[f"destroyed_{rec.kind_name}"] += 1

    def close_owner(self, owner: Owner) -> None:
        """The owner is gone: destroy everything it held, users first."""
        with self.lock:
            if owner.closed:
                return
            if self.sanitizer is not None:
                self.sanitizer.closing(owner)
            owner.closed = True
            order = sorted(owner.objects.values(), key=lambda r: (_TEARDOWN[r.KIND], -r.handle))
            for rec in order:
                try:
                    rec.users = 0
                    self._destroy(rec)
                except Exception:  # one object's cleanup must not strand the others
                    self.stats["cleanup_errors"] += 1
                    owner.objects.pop(rec.handle, None)
                    self.handles.pop(rec.handle, None)
                    self.changes[rec.KIND] += 1
            for dev in self.devices.values():
                with dev.runtime.lock:
                    for qpn, refs in list(dev.hca.xrc_refs.items()):
                        if owner in refs:
                            eng = dev.hca.qps.get(qpn)
                            if isinstance(eng, QPEngine):
                                xrc_release(dev.hca, eng, owner)
                    dev.runtime.progress()
            for dev in self.devices.values():
                layer = getattr(dev.runtime, "faults", None)
                if isinstance(layer, OwnerFaults):
                    layer.rules.pop(owner, None)
            if owner.memory is not None:
                owner.memory.close()
            for close in owner.release:
                close()
            owner.release = []
            self.owners.discard(owner)
            self._retire_idle()


def xrc_release(hca: HCA, eng: QPEngine, holder: object) -> None:
    """``holder`` (an owner, or a QP handle's record) lets go of the
    device-owned XRC receive QP ``eng``; the last one destroys it."""
    refs = hca.xrc_refs.get(eng.qpn)
    if refs is None:
        return
    refs.discard(holder)
    if not refs:
        eng.reset(clean_cqs=False)  # a destroy: its CQEs stay (engine/qp.py)
        hca.qps.pop(eng.qpn, None)
        hca.xrc_refs.pop(eng.qpn, None)


class OwnerFaults:
    """A fabric's fault layer when owners set faults of their own: each
    owner's rules act on the packets its QPs send; other packets meet the
    layer that was there before (the service's ``SOFTVERBS_FAULTS``)."""

    def __init__(self, host: Host, base: Any) -> None:
        self.host = host
        self.base = base
        self.rules: dict[Owner, Any] = {}

    def process(self, pkt: Any, now: float) -> list[tuple[float, Any]]:
        for dev in self.host.devices.values():
            if pkt.sgid in dev.hca.gids:
                eng = dev.hca.qps.get(pkt.sqpn)
                rec = getattr(eng, "owner", None)
                rules = self.rules.get(rec.owner) if isinstance(rec, Obj) else None
                if rules is not None:
                    result: list[tuple[float, Any]] = rules.process(pkt, now)
                    return result
                break
        if self.base is not None:
            out: list[tuple[float, Any]] = self.base.process(pkt, now)
            return out
        return [(now, pkt)]
