"""The device's authority: every object by handle, every request checked here.

A NIC trusts nothing its driver writes: the kernel and the firmware check
every command against what they own.  softverbs' :class:`Host` plays that
part for every kind of device -- in-process, UDP, and the host device served
by ``softverbsd`` -- so a request is judged in one place, against the
device's own state, under the device's lock:

* **Handles.**  Every object (context, PD, MR, MW, AH, completion channel,
  CQ, SRQ, XRC domain, QP) is created by an :class:`Owner` -- this process,
  or one process connected to the service -- and named by a handle.  Handles
  are unique across owners: naming another owner's object is ``EPERM``,
  naming nothing is ``EINVAL``, and an object is used only on its own device
  and with parents of its own owner.
* **Requests.**  Sizes, indices, bounds and access flags are checked
  against the device's limits (:data:`LIMITS`); a modify is judged by the QP
  state table against the QP's real state (:meth:`QPEngine.modify`);
  routes are resolved against the device's GID table.  Nothing a driver says
  about ring indices or object state is believed (:mod:`softverbs.engine.rings`).
* **Lifetimes.**  An object that others use cannot be destroyed (``EBUSY``).
  When an owner goes away -- ``Context.close`` of the last context, a process
  that exits or is killed -- :meth:`Host.close_owner` destroys what it held,
  users before what they use, and lets go of the XRC receive QPs it
  registered with (seed 002: those belong to the device and live while anyone
  holds them).

The operations and their records are declared in :mod:`softverbs.device.api`;
:meth:`Host.execute` runs one.  The in-process provider calls it directly;
the service decodes the same records from its clients' bytes.  What a
request needs beyond its record -- ring memory, the memory of a region, an
event sink -- comes as :class:`Resources`, built by whoever received it.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from softverbs.device import api
from softverbs.device.api import (
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
)
from softverbs.device.memory import WRITABLE_ACCESS, mapped
from softverbs.engine import observe
from softverbs.engine.hca import (
    HCA,
    MAX_MCAST_GRP,
    MAX_MCAST_QP_ATTACH,
    MAX_TOTAL_MCAST_QP_ATTACH,
    XrcDomain,
)
from softverbs.engine.memory import Bytes, MemKey, MemKind
from softverbs.engine.qp import QPEngine
from softverbs.engine.rings import (
    SGE,
    WQ_RQ,
    WQ_SQ,
    WQ_SRQ,
    WR_DRIVER1,
    CompletionRing,
    Route,
    SendWQE,
    SharedRecvRing,
    WorkRing,
    recv_slot_size,
    ring_slots,
    send_slot_size,
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
    IBV_EVENT_SRQ_LIMIT_REACHED,
    IBV_GID_TYPE_ROCE_V2,
    IBV_LINK_LAYER_ETHERNET,
    IBV_MTU_256,
    IBV_MTU_4096,
    IBV_MW_TYPE_1,
    IBV_MW_TYPE_2,
    IBV_PORT_ACTIVE,
    IBV_PORT_CM_SUP,
    IBV_QP_ACCESS_FLAGS,
    IBV_QP_ALT_PATH,
    IBV_QP_AV,
    IBV_QP_CREATE_BLOCK_SELF_MCAST_LB,
    IBV_QP_CUR_STATE,
    IBV_QP_DEST_QPN,
    IBV_QP_EN_SQD_ASYNC_NOTIFY,
    IBV_QP_MAX_DEST_RD_ATOMIC,
    IBV_QP_MAX_QP_RD_ATOMIC,
    IBV_QP_MIN_RNR_TIMER,
    IBV_QP_PATH_MIG_STATE,
    IBV_QP_PATH_MTU,
    IBV_QP_PKEY_INDEX,
    IBV_QP_PORT,
    IBV_QP_QKEY,
    IBV_QP_RATE_LIMIT,
    IBV_QP_RETRY_CNT,
    IBV_QP_RNR_RETRY,
    IBV_QP_RQ_PSN,
    IBV_QP_SQ_PSN,
    IBV_QP_STATE,
    IBV_QP_TIMEOUT,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTR,
    IBV_QPS_SQD,
    IBV_QPT_RAW_PACKET,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
    IBV_REREG_MR_CHANGE_ACCESS,
    IBV_REREG_MR_CHANGE_PD,
    IBV_REREG_MR_CHANGE_TRANSLATION,
    IBV_SRQ_LIMIT,
    IBV_SRQ_MAX_WR,
    IBV_SRQT_BASIC,
    IBV_SRQT_XRC,
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
    ibv_qp_state,
    ibv_qp_type,
    mtu_to_bytes,
)
from softverbs.errors import PyverbsRDMAError, ebusy, einval, eopnotsupp, eperm
from softverbs.sanitizer import SanitizeError, Sanitizer, Watch
from softverbs.sanitizer import parse as parse_sanitize
from softverbs.wire.packet import gid_text, is_multicast_gid

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


def inline_capacity(caps: api.QPCaps) -> int:
    """The ``max_inline_data`` a QP reports: what was asked, or the bytes its
    SGE list takes in the WQE if more -- as rxe does (the WQE holds either),
    so a QP made with max_inline_data=0 still takes small inline sends
    (librdmacm's rdma_xclient sends 16 inline bytes on such a QP).  The send
    slot (``send_slot_size``) has room for both."""
    return min(max(caps.max_inline_data, caps.max_send_sge * SGE.size), LIMITS["max_inline_data"])


def _range(name: str, value: int, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        raise einval(f"{name}={value!r} is out of range {lo}..{hi}")
    return value


def resolve_route(gids: list[bytes], av: api.AddressVector, what: str = "AH") -> Route:
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


def qp_values(dev: Device, a: api.QPAttrs, mask: int) -> dict[str, Any]:
    """The attributes ``mask`` names, checked and turned into engine values."""
    v: dict[str, Any] = {}
    if mask & IBV_QP_PKEY_INDEX:
        idx = _range("pkey_index", a.pkey_index, 0, len(PKEY_TABLE) - 1)
        v["pkey_index"] = idx
        v["pkey"] = PKEY_TABLE[idx]
    if mask & IBV_QP_PORT:
        _range("port_num", a.port_num, 1, 1)
    if mask & IBV_QP_QKEY:
        v["qkey"] = a.qkey
    if mask & IBV_QP_ACCESS_FLAGS:
        v["access"] = a.qp_access_flags
    if mask & IBV_QP_AV:
        v["route"] = resolve_route(dev.hca.gids, a.ah, "QP ah_attr")
    if mask & IBV_QP_PATH_MTU:
        mtu = _range("path_mtu", a.path_mtu, IBV_MTU_256, IBV_MTU_4096)
        v["pmtu"] = min(mtu_to_bytes(mtu), dev.info.mtu)
    if mask & IBV_QP_DEST_QPN:
        v["dest_qpn"] = _range("dest_qp_num", a.dest_qp_num, 0, 0xFFFFFF)
    if mask & IBV_QP_RQ_PSN:
        v["rq_psn"] = a.rq_psn & 0xFFFFFF
    if mask & IBV_QP_SQ_PSN:
        v["sq_psn"] = a.sq_psn & 0xFFFFFF
    if mask & IBV_QP_TIMEOUT:
        v["timeout"] = _range("timeout", a.timeout, 0, 31)
    if mask & IBV_QP_RETRY_CNT:
        v["retry_cnt"] = _range("retry_cnt", a.retry_cnt, 0, 7)
    if mask & IBV_QP_RNR_RETRY:
        v["rnr_retry"] = _range("rnr_retry", a.rnr_retry, 0, 7)
    if mask & IBV_QP_MIN_RNR_TIMER:
        v["min_rnr_timer"] = _range("min_rnr_timer", a.min_rnr_timer, 0, 31)
    if mask & IBV_QP_MAX_QP_RD_ATOMIC:
        v["max_rd_atomic"] = _range("max_rd_atomic", a.max_rd_atomic, 0,
                                    LIMITS["max_qp_rd_atom"])  # fmt: skip
    if mask & IBV_QP_MAX_DEST_RD_ATOMIC:
        v["max_dest_rd_atomic"] = _range("max_dest_rd_atomic", a.max_dest_rd_atomic, 0,
                                         LIMITS["max_qp_rd_atom"])  # fmt: skip
    if mask & IBV_QP_EN_SQD_ASYNC_NOTIFY:
        v["en_sqd_async_notify"] = bool(a.en_sqd_async_notify)
    if mask & IBV_QP_ALT_PATH:
        resolve_route(dev.hca.gids, a.alt_ah, "QP alt_ah_attr")
    if mask & IBV_QP_PATH_MIG_STATE:
        _range("path_mig_state", a.path_mig_state, 0, 2)
    return v


#: mask bit -> the QPAttrs fields a modify sets (what QUERY_QP reports back)
_REMEMBERED: tuple[tuple[int, tuple[str, ...]], ...] = (
    (IBV_QP_PKEY_INDEX, ("pkey_index",)),
    (IBV_QP_PORT, ("port_num",)),
    (IBV_QP_QKEY, ("qkey",)),
    (IBV_QP_ACCESS_FLAGS, ("qp_access_flags",)),
    (IBV_QP_PATH_MTU, ("path_mtu",)),
    (IBV_QP_DEST_QPN, ("dest_qp_num",)),
    (IBV_QP_RQ_PSN, ("rq_psn",)),
    (IBV_QP_SQ_PSN, ("sq_psn",)),
    (IBV_QP_TIMEOUT, ("timeout",)),
    (IBV_QP_RETRY_CNT, ("retry_cnt",)),
    (IBV_QP_RNR_RETRY, ("rnr_retry",)),
    (IBV_QP_MIN_RNR_TIMER, ("min_rnr_timer",)),
    (IBV_QP_MAX_QP_RD_ATOMIC, ("max_rd_atomic",)),
    (IBV_QP_MAX_DEST_RD_ATOMIC, ("max_dest_rd_atomic",)),
    (IBV_QP_EN_SQD_ASYNC_NOTIFY, ("en_sqd_async_notify",)),
    (IBV_QP_PATH_MIG_STATE, ("path_mig_state",)),
    (IBV_QP_ALT_PATH, ("alt_pkey_index", "alt_port_num", "alt_timeout", "alt_ah")),
    (IBV_QP_AV, ("ah",)),
    (IBV_QP_RATE_LIMIT, ("rate_limit",)),
)

#: The send_ops_flags a QP may be created with: every opcode softverbs executes
#: (ibv_qp_create_send_ops_flags: SEND .. BIND_MW, LOCAL_INV).
SUPPORTED_SEND_OPS = 0x3FF


def empty_attrs() -> api.QPAttrs:
    zero_av = api.AddressVector(bytes(16), 0, 0, 0, 0, 0, 1, 0, 0, 0, 0)
    alt = api.AddressVector(bytes(16), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    return api.QPAttrs(zero_av, alt, *([0] * 24))


# --- owners and their objects ---------------------------------------------------------------

AsyncSink = Callable[[api.AsyncEventRecord, str], None]
CompSink = Callable[[int], None]


@dataclass
class Resources:
    """What a request needs beyond its record, prepared by whoever received it."""

    sink: AsyncSink | CompSink | None = None  #: OPEN_DEVICE, CREATE_COMP_CHANNEL
    span: Bytes | None = None  #: REG_MR/REREG_MR from a mapping (else the process's memory)
    cq: CompletionRing | None = None  #: CREATE_CQ, RESIZE_CQ
    srq: SharedRecvRing | None = None  #: CREATE_SRQ, MODIFY_SRQ (resize)
    sq: WorkRing | None = None  #: CREATE_QP
    rq: WorkRing | None = None  #: CREATE_QP
    file_key: tuple[int, int] | None = None  #: OPEN_XRCD: the file's (st_dev, st_ino)
    file: Any = None  #: CAPTURE: a binary file open for writing
    text: str = ""  #: FAULTS: the rules
    release: list[Callable[[], None]] = field(default_factory=list)  #: run at destroy


class Obj:
    """One object of an owner."""

    __slots__ = ("ctx", "device", "engine", "handle", "info", "kind", "owner", "parents",
                 "release", "users")  # fmt: skip

    def __init__(self, owner: Owner, handle: int, kind: int, device: Device | None,
                 engine: Any, ctx: Obj | None) -> None:  # fmt: skip
        self.owner = owner
        self.handle = handle
        self.kind = kind
        self.device = device
        self.engine = engine  #: the engine object: QPEngine, MemKey, ring, XrcDomain ...
        self.ctx = ctx  #: the context whose event socket hears about it
        self.parents: list[Obj] = []
        self.users = 0  #: objects that use this one (destroying it is EBUSY)
        self.info: Any = None  #: kind-specific: a QP's attributes, a context's sink ...
        self.release: list[Callable[[], None]] = []  #: what to close when it goes

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, str(self.kind))

    def __repr__(self) -> str:
        return f"<{self.kind_name} {self.handle} of {self.owner}>"


class Owner:
    """Who holds objects: this process, or one process connected to the service."""

    def __init__(self, label: str, pid: int = 0, uid: int = 0, memory: Any = None) -> None:
        self.label = label
        self.pid = pid
        self.uid = uid
        self.memory = memory  #: the process's memory (device.memory.ProcessMemory), or None
        self.objects: dict[int, Obj] = {}
        self.closed = False
        #: names this owner to a forked child that joins it (HELLO_JOIN)
        self.token = int.from_bytes(os.urandom(8), "little")
        self.connections = 1  #: the service's connections that hold it
        self.release: list[Callable[[], None]] = []  #: what to close when it goes

    def __repr__(self) -> str:
        return self.label


@dataclass
class QPInfo:
    """What the device remembers of a QP for QUERY_QP."""

    caps: api.QPCaps
    sq_sig_all: int
    attrs: api.QPAttrs = field(default_factory=empty_attrs)


class Clock(Protocol):
    def now(self) -> float: ...


class DeviceRuntime(Protocol):
    """What drives a device: its lock, clock and progress loop (a fabric Runtime)."""

    @property
    def lock(self) -> Any: ...

    @property
    def clock(self) -> Clock: ...

    def progress(self) -> bool: ...


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
    def device_attrs(self) -> api.DeviceAttrs:
        f = self.info.features
        odp = 0x3F if f.on_demand_paging else 0  # send, recv, write, read, atomic, srq recv
        limits = {k: v for k, v in LIMITS.items() if k != "max_inline_data"}
        flags = DEVICE_CAP_FLAGS if f.srq_resize else DEVICE_CAP_FLAGS & ~IBV_DEVICE_SRQ_RESIZE
        return api.DeviceAttrs(
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

    def port_attrs(self) -> api.PortAttrs:
        from softverbs.enums import bytes_to_mtu

        counters = self.hca.counters
        return api.PortAttrs(
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
                                if o.kind == KIND_CTX and o.device is self), None)  # fmt: skip
                    if ctx is not None:
                        ctx.info(api.AsyncEventRecord(event_type, KIND_QP, 0, qpn), reason)
            return
        if isinstance(rec, Obj):
            _emit(rec, event_type, qpn, reason)


def _emit(rec: Obj, event_type: int, qpn: int, reason: str) -> None:
    ctx = rec.ctx
    if ctx is not None and ctx.info is not None and not rec.owner.closed:
        ctx.info(api.AsyncEventRecord(event_type, rec.kind, rec.handle, qpn), reason)


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
                 entries: Callable[[], list[api.DeviceEntry]]) -> None:  # fmt: skip
        self._open_device = open_device
        self.entries = entries
        self.devices: dict[str, Device] = {}
        self.owners: set[Owner] = set()
        self._handles: dict[int, Obj] = {}
        self._next_handle = 1
        self.lock = threading.RLock()
        self.stats: Counter[str] = Counter()
        #: the verbs sanitizer, once a process has asked for it (SANITIZE)
        self.sanitizer: Sanitizer | None = None
        self._handlers: dict[int, Callable[[Owner, Any, Resources], Any]] = {
            api.BY_NAME[name].code: getattr(self, name.lower()) for name in _HANDLED
        }
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

    # --- requests ------------------------------------------------------------------------------
    def execute(self, owner: Owner, op: api.Op[Any, Any], body: Any,
                res: Resources | None = None) -> tuple[Any, bytes]:  # fmt: skip
        """Run one operation for ``owner``: (its reply record, the reply's tail).

        Errors are PyverbsRDMAError with the errno a driver returns."""
        handler = self._handlers.get(op.code)
        if handler is None:
            raise eopnotsupp(f"{op.name} is not an operation of this device")
        if owner.closed:
            raise PyverbsRDMAError("the owner of this request is gone", errno.EIO)
        with self.lock:
            out = handler(owner, body, res if res is not None else Resources())
        return out if isinstance(out, tuple) else (out, b"")

    def obj(self, owner: Owner, handle: int, kind: int, device: Device | None = None,
            what: str = "") -> Obj:  # fmt: skip
        """``owner``'s object ``handle`` of ``kind`` (on ``device``), or EINVAL/EPERM."""
        rec = self._handles.get(handle)
        name = what or KIND_NAMES.get(kind, "object")
        if rec is None:
            raise einval(f"no {name} has handle {handle}")
        if rec.owner is not owner:
            raise eperm(f"{name} handle {handle} belongs to another process")
        if rec.kind != kind:
            raise einval(f"handle {handle} is a {rec.kind_name}, not a {name}")
        if device is not None and rec.device is not device:
            raise einval(f"the {name} (handle {handle}) is on device {rec.device.name if rec.device else '?'}, "  # noqa: E501
                         f"not {device.name}")  # fmt: skip
        return rec

    def _opt(self, owner: Owner, handle: int, kind: int, device: Device) -> Obj | None:
        return None if handle == 0 else self.obj(owner, handle, kind, device)

    def _new(self, owner: Owner, kind: int, device: Device | None, engine: Any,
             ctx: Obj | None, parents: tuple[Obj | None, ...] = ()) -> Obj:  # fmt: skip
        handle = self._next_handle
        while handle in self._handles or handle == 0:
            handle = (handle + 1) & 0xFFFFFFFF
        self._next_handle = (handle + 1) & 0xFFFFFFFF or 1
        rec = Obj(owner, handle, kind, device, engine, ctx)
        for parent in parents:
            if parent is not None:
                rec.parents.append(parent)
                parent.users += 1
        owner.objects[handle] = rec
        self._handles[handle] = rec
        self.stats[f"created_{rec.kind_name}"] += 1
        return rec

    @contextmanager
    def _on(self, dev: Device) -> Iterator[None]:
        """Under the device's lock; the engine runs after the request."""
        with dev.runtime.lock:
            try:
                yield
            finally:
                dev.runtime.progress()

    # --- sessions and queries ------------------------------------------------------------------
    def list_devices(self, owner: Owner, req: api.Empty, res: Resources) -> Any:
        entries = self.entries()
        tail = b"".join(e.pack() for e in entries)
        return api.ListDevicesReply(len(entries), 0), tail

    def open_device(self, owner: Owner, req: api.OpenDevice, res: Resources) -> api.OpenDeviceReply:
        entries = self.entries()
        if not any(e.name == req.name for e in entries):
            names = ", ".join(e.name for e in entries) or "none"
            raise PyverbsRDMAError(f"Failed to find device {req.name}; softverbs devices are: "
                                   f"{names}", errno.ENODEV)  # fmt: skip
        dev = self.device(req.name)
        rec = self._new(owner, KIND_CTX, dev, None, None)
        rec.ctx = rec
        rec.info = res.sink
        gids = sum(1 for g in dev.hca.gids if any(g))
        return api.OpenDeviceReply(dev.info.guid, rec.handle, self._index(dev), dev.info.mtu, gids)

    def _index(self, dev: Device) -> int:
        return next((e.index for e in self.entries() if e.name == dev.name), 0)

    def _ctx(self, owner: Owner, handle: int) -> Obj:
        return self.obj(owner, handle, KIND_CTX, what="device context")

    def query_device(self, owner: Owner, req: api.Ctx, res: Resources) -> api.DeviceAttrs:
        dev = self._ctx(owner, req.ctx).device
        assert dev is not None
        return dev.device_attrs()

    def _port(self, port: int, verb: str) -> None:
        if port != 1:
            raise einval(f"{verb}: port {port} does not exist; softverbs devices have one port, 1")

    def query_port(self, owner: Owner, req: api.QueryPort, res: Resources) -> api.PortAttrs:
        dev = self._ctx(owner, req.ctx).device
        assert dev is not None
        self._port(req.port, f"Failed to query port {req.port}")
        with dev.runtime.lock:
            return dev.port_attrs()

    def query_gid(self, owner: Owner, req: api.QueryGid, res: Resources) -> api.QueryGidReply:
        dev = self._ctx(owner, req.ctx).device
        assert dev is not None
        fail = f"Failed to query gid {req.index} of port {req.port}"
        self._port(req.port, fail)
        if not 0 <= req.index < GID_TABLE_LEN:
            raise einval(f"{fail}: the GID table has {GID_TABLE_LEN} entries")
        gids = dev.hca.gids
        raw = gids[req.index] if req.index < len(gids) else bytes(16)
        if not any(raw):
            raise PyverbsRDMAError(f"{fail}: the entry is empty", errno.ENODATA)
        return api.QueryGidReply(raw, int(IBV_GID_TYPE_ROCE_V2), dev.info.ifindex)

    def query_pkey(self, owner: Owner, req: api.QueryGid, res: Resources) -> api.QueryPkeyReply:
        fail = f"Failed to query pkey {req.index} of port {req.port}"
        self._ctx(owner, req.ctx)
        self._port(req.port, fail)
        if not 0 <= req.index < len(PKEY_TABLE):
            raise einval(fail)
        return api.QueryPkeyReply(PKEY_TABLE[req.index], 0)

    def counters(self, owner: Owner, req: api.Ctx, res: Resources) -> Any:
        dev = self._ctx(owner, req.ctx).device
        assert dev is not None
        with dev.runtime.lock:
            return api.Empty(), json.dumps(dev.counters()).encode()

    def status(self, owner: Owner, req: api.Empty, res: Resources) -> Any:
        return api.Empty(), json.dumps(self.describe()).encode()

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
                                         "device": rec.device.name if rec.device else "",
                                         "users": rec.users}  # fmt: skip
                if rec.ctx is not None and rec.ctx is not rec:
                    entry["ctxn"] = rec.ctx.handle
                pd = next((p for p in rec.parents if p.kind == KIND_PD), None)
                if pd is not None:
                    entry["pdn"] = pd.handle
                eng = rec.engine
                if rec.kind == KIND_QP and isinstance(eng, QPEngine):
                    entry.update(qpn=eng.qpn, type=_name(ibv_qp_type, eng.qp_type).replace(
                        "IBV_QPT_", ""), state=_name(ibv_qp_state, eng.state).replace(
                        "IBV_QPS_", ""))  # fmt: skip
                    # the PSNs the QP is at: the next it sends and the next it expects
                    entry.update(rqpn=eng.dest_qpn, sq_psn=eng.req.npsn, rq_psn=eng.resp.epsn,
                                 port=eng.port, counters=eng.qp_counters())  # fmt: skip
                elif rec.kind == KIND_MR and isinstance(eng, MemKey):
                    entry.update(lkey=eng.key, rkey=eng.key, length=eng.length, iova=eng.iova)
                elif rec.kind == KIND_CQ and isinstance(eng, CompletionRing):
                    entry.update(cqe=eng.capacity, waiting=eng.waiting())
                elif rec.kind == KIND_SRQ and isinstance(eng, SharedRecvRing):
                    entry.update(max_wr=eng.size, srqn=eng.srqn,
                                 xrc=any(p.kind == KIND_XRCD for p in rec.parents))
                    cq = next((p for p in rec.parents if p.kind == KIND_CQ), None)
                    if cq is not None:
                        entry["cqn"] = cq.handle
                objs.append(entry)
            owners.append({"label": o.label, "pid": o.pid, "uid": o.uid, "objects": objs})
        xrc = []
        for dev in self.devices.values():
            for qpn, refs in dev.hca.xrc_refs.items():
                xrc.append({"device": dev.name, "qpn": qpn, "holders": len(refs)})
        return {"devices": sorted(self.devices), "owners": owners, "xrc_rcv_qps": xrc,
                "stats": dict(self.stats)}  # fmt: skip

    # --- observing: packet capture and faults ---------------------------------------------------
    def capture(self, owner: Owner, req: api.CaptureReq, res: Resources) -> api.Handle:
        """Every packet to or from the device, written to ``res.file`` (pcap)."""
        from softverbs.fabric.pcap import PcapWriter

        ctx = self._ctx(owner, req.ctx)
        dev = ctx.device
        assert dev is not None
        if res.file is None:
            raise einval("CAPTURE: no file was passed")
        runtime: Any = dev.runtime
        if not hasattr(runtime, "add_tap"):
            raise eopnotsupp(f"CAPTURE: device {dev.name} cannot be tapped here")
        writer = PcapWriter(res.file, header=not req.flags & api.CAPTURE_APPEND)
        with runtime.lock:
            runtime.add_tap(writer, frozenset(bytes(g) for g in dev.hca.gids))
        rec = self._new(owner, KIND_CAPTURE, dev, writer, ctx, (ctx,))

        def stop() -> None:
            with runtime.lock:
                runtime.remove_tap(writer)
            writer.close()

        rec.release = [stop, *res.release]
        return api.Handle(rec.handle, 0)

    def faults(self, owner: Owner, req: api.Ctx, res: Resources) -> api.Empty:
        """Seeded faults on the packets ``owner``'s QPs send on the device
        (``SOFTVERBS_FAULTS`` rules; empty: none).  On a device several
        processes share, each one's rules act on its own packets only."""
        from softverbs.fabric.faults import parse_faults

        ctx = self._ctx(owner, req.ctx)
        dev = ctx.device
        assert dev is not None
        runtime: Any = dev.runtime
        if not hasattr(runtime, "faults"):
            raise eopnotsupp(f"FAULTS: device {dev.name} has no fault layer here")
        try:
            rules = parse_faults(res.text) if res.text.strip() else None
        except ValueError as exc:
            raise einval(f"FAULTS: {exc}") from None
        with runtime.lock:
            layer = runtime.faults
            if not isinstance(layer, OwnerFaults):
                layer = runtime.faults = OwnerFaults(self, layer)
            if rules is None:
                layer.rules.pop(owner, None)
            else:
                layer.rules[owner] = rules
        return api.Empty()

    # --- mlx5dv signature offload: mkeys, signature pipelining ---------------------------------
    def sanitize(self, owner: Owner, req: api.Empty, res: Resources) -> api.Empty:
        """Turn the verbs sanitizer on for ``owner``: reports go to ``res.file``."""
        try:
            options = parse_sanitize(res.text)
        except SanitizeError as exc:
            raise einval(str(exc)) from None
        if options is None or res.file is None:
            raise einval("SANITIZE: no options, or no file for the reports")
        if self.sanitizer is None:
            self.sanitizer = Sanitizer()
        for dev in self.devices.values():
            observe.attach_once(dev.hca, self.sanitizer)
            dev.hca.keys.on_unmapped = self.sanitizer.unmapped
        local = owner.pid == os.getpid()
        self.sanitizer.watches[owner] = Watch(res.file, options, owner.pid, local)
        owner.release.extend(res.release)  # the file stays open while the owner lives
        res.release = []
        return api.Empty()

    def create_mkey(self, owner: Owner, req: api.CreateMkey, res: Resources) -> api.MkeyReply:
        """An indirect mkey on the PD: invalid until a driver WQE configures it."""
        from softverbs.engine.signature import IndirectKey

        pd = self.obj(owner, req.pd, KIND_PD)
        dev = pd.device
        assert dev is not None
        if req.flags & ~api.MKEY_BLOCK_SIGNATURE:
            raise eopnotsupp(f"Failed to create mkey: flags {req.flags & ~api.MKEY_BLOCK_SIGNATURE:#x} "  # noqa: E501
                             "are not offered")  # fmt: skip
        if not 1 <= req.max_entries <= 0xFFFF:
            raise einval(f"Failed to create mkey: max_entries={req.max_entries} is not 1..65535")
        keys = dev.hca.keys
        with self._on(dev):
            key = keys.register(MemKind.MKEY, pd.engine, None, 0, 0, owner)
            key.valid = False
            key.xform = IndirectKey(keys)
            rec = self._new(owner, KIND_MKEY, dev, key, pd.ctx, (pd,))
            rec.info = req.max_entries

        def release() -> None:
            key.xform = None
            keys.unregister(key)

        rec.release = [release]
        return api.MkeyReply(rec.handle, key.key)

    def mkey_check(self, owner: Owner, req: api.Handle, res: Resources) -> api.MkeyErr:
        rec = self.obj(owner, req.handle, KIND_MKEY)
        assert rec.device is not None
        with self._on(rec.device):
            err = rec.engine.xform.take_error()
        if err is None:
            return api.MkeyErr(0, 0, 0, 0, 0)
        return api.MkeyErr(int(err.err_type), 0 if err.domain == "memory" else 1, err.expected,
                           err.actual, err.offset)  # fmt: skip

    def cancel_send(self, owner: Owner, req: api.CancelSend, res: Resources) -> api.Count:
        rec = self.obj(owner, req.qp, KIND_QP)
        eng = rec.engine
        assert rec.device is not None
        with self._on(rec.device):
            if not eng.sig_pipelining or eng.state != IBV_QPS_SQD:
                raise einval("cancel_posted_send_wrs: the QP must be a SIG_PIPELINING QP in SQD")
            return api.Count(eng.cancel_posted(req.wr_id), 0)

    # --- protection domains, memory ------------------------------------------------------------
    def alloc_pd(self, owner: Owner, req: api.Ctx, res: Resources) -> api.Handle:
        ctx = self._ctx(owner, req.ctx)
        rec = self._new(owner, KIND_PD, ctx.device, _PD(), ctx, (ctx,))
        return api.Handle(rec.handle, 0)

    def _span(self, owner: Owner, res: Resources, addr: int, length: int,
              access: int) -> Bytes:  # fmt: skip
        if res.span is not None:
            if len(res.span) != length:
                raise einval(f"the memory passed holds {len(res.span)} bytes, not {length}")
            return res.span
        if owner.memory is None:
            raise eopnotsupp("this process did not give the device access to its memory "
                             "(HELLO without /proc/self/mem): pass the region as a memfd")
        if addr + length > 1 << 64:
            raise einval(f"[{addr:#x}, +{length}) is not a valid address range")
        pid = getattr(owner.memory, "pid", 0)
        writable = bool(access & WRITABLE_ACCESS)
        if pid and not mapped(addr, length, pid, writable):
            what = "mapped writable" if writable else "mapped"
            raise PyverbsRDMAError(f"Failed to register memory: [{addr:#x}, +{length}) is not "
                                   f"{what} in process {pid}", errno.EFAULT)  # fmt: skip
        if not pid:
            mine: Bytes = owner.memory.span(addr, length)
            return mine
        # As ib_umem_get pins a region: every access first checks that the range is
        # still backed as it was registered.  An ODP region follows the mapping instead.
        span: Bytes = owner.memory.span(addr, length, pinned=not access & IBV_ACCESS_ON_DEMAND)
        return span

    def reg_mr(self, owner: Owner, req: api.RegMR, res: Resources) -> api.RegMRReply:
        pd = self.obj(owner, req.pd, KIND_PD)
        dev = pd.device
        assert dev is not None
        fail = f"Failed to register a MR. length: {req.length}, access flags: {req.access}"
        check_access(req.access, fail)
        implicit = req.flags & api.REG_MR_IMPLICIT
        if req.access & IBV_ACCESS_ON_DEMAND and not dev.info.features.on_demand_paging:
            raise eopnotsupp(f"{fail}: this device has no on-demand paging")
        with self._on(dev):
            if implicit:
                mem = owner.memory
                if mem is None:
                    raise eopnotsupp(f"{fail}: an implicit ODP MR needs the process's memory")

                def resolve(addr: int, length: int) -> Bytes | str:
                    if addr + length > 1 << 64:
                        return f"[{addr:#x}, +{length}) is not a valid address range"
                    span: Bytes = mem.span(addr, length)
                    return span

                key = dev.hca.keys.register_implicit(pd.engine, resolve, req.access)
            else:
                span = self._span(owner, res, req.addr, req.length, req.access)
                key = dev.hca.keys.register(MemKind.MR, pd.engine, span, req.iova, req.access)
            rec = self._new(owner, KIND_MR, dev, key, pd.ctx, (pd,))
            rec.release = res.release
            key.owner = rec
        return api.RegMRReply(rec.handle, key.key, key.key, 0)

    def rereg_mr(self, owner: Owner, req: api.ReregMR, res: Resources) -> api.Keys:
        rec = self.obj(owner, req.mr, KIND_MR)
        dev = rec.device
        assert dev is not None
        key: MemKey = rec.engine
        change = req.change
        if change & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD
                      | IBV_REREG_MR_CHANGE_ACCESS) or not change:  # fmt: skip
            raise einval(f"rereg MR: bad flags {change:#x}")
        new_pd = self.obj(owner, req.pd, KIND_PD, dev) if change & IBV_REREG_MR_CHANGE_PD else None
        access = check_access(req.access, "rereg MR") if change & IBV_REREG_MR_CHANGE_ACCESS \
            else None  # fmt: skip
        with self._on(dev):
            if key.binds:
                raise ebusy("rereg: memory windows are bound to this MR")
            if change & IBV_REREG_MR_CHANGE_TRANSLATION:
                final = access if access is not None else key.access
                span = self._span(owner, res, req.addr, req.length, final)
                key.view = span
                key.length = req.length
                for close in rec.release:
                    close()
                rec.release = res.release
            if access is not None:
                key.access = access
            if change & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS):
                base = req.addr if change & IBV_REREG_MR_CHANGE_TRANSLATION else key.iova
                key.iova = 0 if key.access & IBV_ACCESS_ZERO_BASED else base
            if new_pd is not None:
                old = rec.parents[0]
                old.users -= 1
                new_pd.users += 1
                rec.parents[0] = new_pd
                key.pd = new_pd.engine
            if change & IBV_REREG_MR_CHANGE_TRANSLATION:
                # new memory behind the region: a new key byte, so a peer holding
                # the old rkey never reaches it.  An access or PD change keeps the
                # keys, as on mlx5 (UMR) and rxe, and as rdma-core's tests expect
                # (test_mr_rereg_access uses the rkey exchanged before).
                dev.hca.keys.rekey(key)
        return api.Keys(key.key, key.key)

    def alloc_mw(self, owner: Owner, req: api.AllocMW, res: Resources) -> api.AllocMWReply:
        pd = self.obj(owner, req.pd, KIND_PD)
        dev = pd.device
        assert dev is not None
        kinds = {int(IBV_MW_TYPE_1): MemKind.MW1, int(IBV_MW_TYPE_2): MemKind.MW2}
        if req.type not in kinds:
            raise einval(f"Failed to allocate MW: type {req.type} is not 1 or 2")
        with self._on(dev):
            key = dev.hca.keys.register(kinds[req.type], pd.engine, None, 0, 0)
            rec = self._new(owner, KIND_MW, dev, key, pd.ctx, (pd,))
            key.owner = rec
        return api.AllocMWReply(rec.handle, key.key)

    def create_ah(self, owner: Owner, req: api.CreateAH, res: Resources) -> api.Handle:
        pd = self.obj(owner, req.pd, KIND_PD)
        dev = pd.device
        assert dev is not None
        route = resolve_route(dev.hca.gids, req.av, "Failed to create AH")
        rec = self._new(owner, KIND_AH, dev, route, pd.ctx, (pd,))
        rec.info = pd.engine
        return api.Handle(rec.handle, 0)

    # --- completion channels, CQs, SRQs ----------------------------------------------------------
    def create_comp_channel(self, owner: Owner, req: api.Ctx, res: Resources) -> api.Handle:
        ctx = self._ctx(owner, req.ctx)
        rec = self._new(owner, KIND_CHANNEL, ctx.device, None, ctx, (ctx,))
        rec.info = res.sink
        rec.release = res.release
        return api.Handle(rec.handle, 0)

    def create_cq(self, owner: Owner, req: api.CreateCQ, res: Resources) -> api.CreateCQReply:
        ctx = self._ctx(owner, req.ctx)
        dev = ctx.device
        assert dev is not None
        if not 1 <= req.cqe <= LIMITS["max_cqe"]:
            raise einval(f"Failed to create a CQ: cqe {req.cqe} is out of range; a CQ holds "
                         f"1..{LIMITS['max_cqe']} entries")  # fmt: skip
        if req.comp_vector != 0:
            raise einval(f"Failed to create a CQ: comp_vector {req.comp_vector} is out of range; "
                         "the device has 1 completion vector(s)")  # fmt: skip
        ring = res.cq
        if ring is None or ring.capacity != req.cqe:
            raise einval(f"Failed to create a CQ: no ring of {req.cqe} entries was passed")
        channel = self._opt(owner, req.channel, KIND_CHANNEL, dev)
        with self._on(dev):
            rec = self._new(owner, KIND_CQ, dev, ring, ctx, (ctx, channel))
            rec.release = res.release
            ring.owner = rec
            if channel is not None:
                sink: CompSink = channel.info
                handle = rec.handle
                ring.notify = lambda: sink(handle) if not owner.closed else None
        return api.CreateCQReply(rec.handle, req.cqe)

    def resize_cq(self, owner: Owner, req: api.ResizeCQ, res: Resources) -> api.CreateCQReply:
        rec = self.obj(owner, req.cq, KIND_CQ)
        dev = rec.device
        assert dev is not None
        ring: CompletionRing = rec.engine
        new = res.cq
        with self._on(dev):
            waiting = ring.waiting()
            if not 1 <= req.cqe <= LIMITS["max_cqe"] or req.cqe < waiting:
                raise einval(f"Failed to resize CQ: it must hold 1..{LIMITS['max_cqe']} entries "
                             f"and at least the {waiting} waiting to be polled; {req.cqe} was "
                             "asked")  # fmt: skip
            if new is None or new.capacity != req.cqe:
                raise einval(f"Failed to resize CQ: no ring of {req.cqe} entries was passed")
            ring.move_to(new.slots, new.hdr, req.cqe)
            for close in rec.release:
                close()
            rec.release = res.release
        return api.CreateCQReply(rec.handle, req.cqe)

    def create_srq(self, owner: Owner, req: api.CreateSRQ, res: Resources) -> api.CreateSRQReply:
        ctx = self._ctx(owner, req.ctx)
        dev = ctx.device
        assert dev is not None
        pd = self.obj(owner, req.pd, KIND_PD, dev)
        if req.srq_type not in (IBV_SRQT_BASIC, IBV_SRQT_XRC):
            raise eopnotsupp(f"SRQ type {req.srq_type} is not supported")
        _range("max_wr", req.max_wr, 1, LIMITS["max_srq_wr"])
        _range("max_sge", req.max_sge, 0, LIMITS["max_srq_sge"])
        if req.limit > req.max_wr:
            raise einval(f"srq_limit {req.limit} exceeds max_wr {req.max_wr}")
        xrcd = self._opt(owner, req.xrcd, KIND_XRCD, dev)
        cq = self._opt(owner, req.cq, KIND_CQ, dev)
        if req.srq_type == IBV_SRQT_XRC and (xrcd is None or cq is None):
            raise einval("an XRC SRQ needs an XRC domain and a CQ (SrqInitAttrEx.xrcd, .cq)")
        ring = res.srq
        if ring is None or ring.size != req.max_wr or ring.max_sge < req.max_sge:
            raise einval(f"create SRQ: no ring of {req.max_wr} WQEs with room for "
                         f"{req.max_sge} SGEs was passed")  # fmt: skip
        hca = dev.hca
        with self._on(dev):
            rec = self._new(owner, KIND_SRQ, dev, ring, ctx, (pd, xrcd, cq))
            rec.release = res.release
            ring.owner = rec
            ring.pd = pd.engine
            ring.tag = (WQ_SRQ, rec.handle)
            if req.srq_type == IBV_SRQT_XRC and xrcd is not None:
                ring.xrcd = xrcd.engine
                ring.cq = cq.engine if cq is not None else None
                ring.srqn = hca.alloc_srqn()
                hca.srqs[ring.srqn] = ring
            ring.set_limit(req.limit)
            ring.on_limit = lambda r: hca.post_event(IBV_EVENT_SRQ_LIMIT_REACHED, r)
        return api.CreateSRQReply(rec.handle, ring.srqn, req.max_wr, req.max_sge)

    def modify_srq(self, owner: Owner, req: api.ModifySRQ, res: Resources) -> api.Empty:
        rec = self.obj(owner, req.srq, KIND_SRQ)
        dev = rec.device
        assert dev is not None
        ring: SharedRecvRing = rec.engine
        if req.mask & ~(IBV_SRQ_LIMIT | IBV_SRQ_MAX_WR):
            raise einval(f"modify SRQ: unsupported mask bits {req.mask:#x}")
        with self._on(dev):
            max_wr = ring.size
            if req.mask & IBV_SRQ_MAX_WR:
                if not dev.info.features.srq_resize:
                    raise eopnotsupp("modify SRQ: this device cannot resize an SRQ")
                _range("max_wr", req.max_wr, 1, LIMITS["max_srq_wr"])
                new = res.srq
                if new is None or new.size != req.max_wr:
                    raise einval(f"modify SRQ: no ring of {req.max_wr} WQEs was passed")
                pending = ring.available()
                if req.max_wr < pending:
                    raise einval(f"modify SRQ: max_wr {req.max_wr} is below the {pending} "
                                 "WRs posted and not yet taken")  # fmt: skip
                max_wr = req.max_wr
            if req.mask & IBV_SRQ_LIMIT and req.limit > max_wr:
                raise einval(f"srq_limit {req.limit} exceeds max_wr {max_wr}")
            if req.mask & IBV_SRQ_MAX_WR and res.srq is not None:
                ring.move_to(res.srq.slots, res.srq.hdr, req.max_wr)
                for close in rec.release:
                    close()
                rec.release = res.release
            if req.mask & IBV_SRQ_LIMIT:
                ring.set_limit(req.limit)
        return api.Empty()

    def query_srq(self, owner: Owner, req: api.Handle, res: Resources) -> api.QuerySRQReply:
        rec = self.obj(owner, req.handle, KIND_SRQ)
        ring: SharedRecvRing = rec.engine
        return api.QuerySRQReply(ring.size, ring.max_sge, ring.armed_limit, 0)

    # --- XRC domains --------------------------------------------------------------------------
    def open_xrcd(self, owner: Owner, req: api.OpenXRCD, res: Resources) -> api.Handle:
        ctx = self._ctx(owner, req.ctx)
        dev = ctx.device
        assert dev is not None
        key = res.file_key
        hca = dev.hca
        with self._on(dev):
            domain = hca.xrcds.get(key) if key is not None else None
            if domain is not None:
                if req.oflags & os.O_CREAT and req.oflags & os.O_EXCL:
                    raise PyverbsRDMAError("Failed to allocate XRCD: the file already backs "
                                           "an XRC domain and O_EXCL was given", errno.EEXIST)
            else:
                if not req.oflags & os.O_CREAT:
                    raise einval("Failed to allocate XRCD: no XRC domain uses this file; "
                                 "pass O_CREAT to create one")  # fmt: skip
                domain = hca.open_xrcd(key)
            domain.refs += 1
            rec = self._new(owner, KIND_XRCD, dev, domain, ctx, (ctx,))
        return api.Handle(rec.handle, 0)

    # --- queue pairs -----------------------------------------------------------------------------
    def create_qp(self, owner: Owner, req: api.CreateQP, res: Resources) -> api.CreateQPReply:
        ctx = self._ctx(owner, req.ctx)
        dev = ctx.device
        assert dev is not None
        qp_type = req.qp_type
        if qp_type == IBV_QPT_RAW_PACKET:
            raise eopnotsupp("raw packet QPs are not supported by softverbs")
        if qp_type not in ALLOWED_OPCODES:
            raise einval(f"unknown QP type {qp_type}")
        tname = _name(ibv_qp_type, qp_type)
        if req.send_ops_flags & ~SUPPORTED_SEND_OPS:
            raise eopnotsupp(
                f"Failed to create QP: send_ops_flags {req.send_ops_flags & ~SUPPORTED_SEND_OPS:#x}"
                " are not supported; softverbs has no TSO and none of IBTA 1.5's memory "
                "placement operations (FLUSH, ATOMIC WRITE)"
            )
        if req.dv_flags & ~api.DV_SIG_PIPELINING:
            raise eopnotsupp(f"Failed to create QP: provider create flags "
                             f"{req.dv_flags & ~api.DV_SIG_PIPELINING:#x} are not offered "
                             "(softverbs: MLX5DV_QP_CREATE_SIG_PIPELINING)")  # fmt: skip
        if req.dv_flags and qp_type != IBV_QPT_RC:
            raise eopnotsupp("Failed to create QP: signature pipelining is for RC QPs")
        pd = self._opt(owner, req.pd, KIND_PD, dev)
        xrcd = self._opt(owner, req.xrcd, KIND_XRCD, dev)
        scq = self._opt(owner, req.send_cq, KIND_CQ, dev)
        rcq = self._opt(owner, req.recv_cq, KIND_CQ, dev)
        srq = self._opt(owner, req.srq, KIND_SRQ, dev)
        xrc = qp_type in (IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV)
        if qp_type == IBV_QPT_XRC_RECV:
            if xrcd is None:
                raise einval("an XRC receive QP needs an XRC domain (QPInitAttrEx(xrcd=...))")
        elif pd is None:
            raise einval(f"a {tname} QP needs a PD (QPInitAttrEx(pd=...))")
        if qp_type != IBV_QPT_XRC_RECV and scq is None:
            raise einval(f"a {tname} QP needs a send CQ")
        if not xrc and rcq is None:
            raise einval(f"a {tname} QP needs a receive CQ")
        if srq is not None and xrc:
            raise einval(f"a {tname} QP cannot use an SRQ")
        caps = req.caps
        for name, value, hi in (
            ("max_send_wr", caps.max_send_wr, LIMITS["max_qp_wr"]),
            ("max_recv_wr", caps.max_recv_wr, LIMITS["max_qp_wr"]),
            ("max_send_sge", caps.max_send_sge, LIMITS["max_sge"]),
            ("max_recv_sge", caps.max_recv_sge, LIMITS["max_sge"]),
            ("max_inline_data", caps.max_inline_data, LIMITS["max_inline_data"]),
        ):
            if value > hi:
                raise einval(f"cap.{name}={value!r} exceeds the device limit {hi}")
        has_sq = qp_type != IBV_QPT_XRC_RECV
        has_rq = not xrc and srq is None
        sq, rq = res.sq, res.rq
        self._check_ring(sq, has_sq, "send", ring_slots(caps.max_send_wr),
                         send_slot_size(caps.max_send_sge, caps.max_inline_data),
                         req.sq_slot)  # fmt: skip
        self._check_ring(rq, has_rq, "receive", ring_slots(caps.max_recv_wr),
                         recv_slot_size(caps.max_recv_sge), req.rq_slot)  # fmt: skip
        hca = dev.hca
        with self._on(dev):
            qpn = hca.alloc_qpn(xrc_recv=qp_type == IBV_QPT_XRC_RECV)
            pmtu = dev.info.mtu if qp_type == IBV_QPT_UD else min(1024, dev.info.mtu)
            eng = QPEngine(hca, qpn, qp_type, _engine(pd), _engine(scq), _engine(rcq), sq, rq,
                           _engine(srq), bool(req.sq_sig_all))
            eng.xrcd = xrcd.engine if xrcd is not None else None
            eng.set_attrs({"pmtu": pmtu})
            eng.sig_pipelining = bool(req.dv_flags & api.DV_SIG_PIPELINING)
            eng.block_self_mcast_lb = bool(req.create_flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB)
            rec = self._new(owner, KIND_QP, dev, eng, ctx, (pd, scq, rcq, srq, xrcd))
            rec.release = res.release
            rec.info = QPInfo(api.QPCaps(caps.max_send_wr, caps.max_recv_wr, caps.max_send_sge,
                                         caps.max_recv_sge,
                                         inline_capacity(caps) if has_sq else 0, 0),
                              req.sq_sig_all)  # fmt: skip
            eng.owner = rec
            hca.qps[qpn] = eng
            if sq is not None:
                sq.tag = (WQ_SQ, rec.handle)
                sq.fetch = self._fetcher(owner, dev, eng)
                sq.publish_state(eng.state)
            if rq is not None:
                rq.tag = (WQ_RQ, rec.handle)
            if qp_type == IBV_QPT_XRC_RECV:  # the device owns it; this handle holds it
                hca.xrc_refs.setdefault(qpn, set()).add(rec)
        return api.CreateQPReply(rec.info.caps, rec.handle, qpn)

    @staticmethod
    def _check_ring(ring: WorkRing | None, wanted: bool, what: str, size: int, least: int,
                    slot: int) -> None:  # fmt: skip
        if not wanted:
            if ring is not None:
                raise einval(f"create QP: this QP has no {what} queue, but a ring was passed")
            return
        if ring is None:
            raise einval(f"create QP: no {what} queue ring was passed")
        if ring.size != size:
            raise einval(f"create QP: the {what} queue ring has {ring.size} slots, not {size}")
        if slot and slot < least:
            raise einval(f"create QP: {what} queue slots of {slot} bytes are smaller than the "
                         f"{least} the capabilities need")  # fmt: skip

    def _fetcher(self, owner: Owner, dev: Device, eng: QPEngine) -> Callable[[SendWQE], str | None]:
        """What the device does with each send WQE it fetches: resolve the
        handles it names -- as this owner's objects, on this device -- or say
        why it cannot run."""
        handles = self._handles
        qp_type = eng.qp_type

        def fetch(wqe: SendWQE) -> str | None:
            if wqe.opcode == WR_DRIVER1:
                if qp_type != IBV_QPT_RC:
                    return "a provider (driver) WQE runs on RC QPs only"
            elif wqe.opcode not in ALLOWED_OPCODES.get(qp_type, ()):
                return f"opcode {wqe.opcode} is not executed on {_name(ibv_qp_type, qp_type)} QPs"
            if qp_type == IBV_QPT_UD:
                ah = handles.get(wqe.ah)
                if ah is None or ah.owner is not owner or ah.kind != KIND_AH or ah.device != dev:
                    return f"address handle {wqe.ah} is not one of this process's on {dev.name}"
                wqe.route = ah.engine
            if wqe.opcode == IBV_WR_BIND_MW:
                mw, mr = handles.get(wqe.bind_mw), handles.get(wqe.bind_mr)
                if (mw is None or mw.owner is not owner or mw.kind != KIND_MW or mr is None
                        or mr.owner is not owner or mr.kind != KIND_MR):  # fmt: skip
                    return "the bind names a window or region this process does not have"
                wqe.bind = (mw.engine, mr.engine, wqe.bind_rkey, wqe.bind_addr,
                            wqe.bind_length, wqe.bind_access)  # fmt: skip
            if wqe.opcode == WR_DRIVER1 and wqe.local_op is None:
                # A driver WQE names the object it acts on by handle: an mkey,
                # with its configuration in the WQE's inline data.
                op = handles.get(wqe.driver_op)
                if op is None or op.owner is not owner or op.kind != KIND_MKEY:
                    return f"driver WQE: mkey {wqe.driver_op} is not one of this process's"
                try:
                    wqe.local_op = mkey_configure(op.engine, eng.pd, wqe.inline or b"")
                except ValueError as exc:
                    return f"driver WQE: {exc}"
            return None

        return fetch

    def modify_qp(self, owner: Owner, req: api.ModifyQP, res: Resources) -> api.ModifyQPReply:
        rec = self.obj(owner, req.qp, KIND_QP)
        dev = rec.device
        assert dev is not None
        eng: QPEngine = rec.engine
        mask = req.mask
        a = req.attr
        new = a.qp_state if mask & IBV_QP_STATE else None
        if new is not None and new not in ibv_qp_state._value2member_map_:
            raise einval(f"qp_state {new} is not a QP state")
        cur = a.cur_qp_state if mask & IBV_QP_CUR_STATE else None
        if new == IBV_QPS_RESET and self.sanitizer is not None:
            self.sanitizer.leaving(rec, "moved to IBV_QPS_RESET")
        with self._on(dev):
            state = eng.modify(mask, new, cur, lambda: qp_values(dev, a, mask),
                               dev.runtime.clock.now())  # fmt: skip
            self._remember(rec, a, mask)
        return api.ModifyQPReply(state, 0)

    @staticmethod
    def _remember(rec: Obj, a: api.QPAttrs, mask: int) -> None:
        info: QPInfo | None = rec.info
        if info is None:
            return
        for bit, names in _REMEMBERED:
            if mask & bit:
                for n in names:
                    setattr(info.attrs, n, getattr(a, n))

    def query_qp(self, owner: Owner, req: api.Handle, res: Resources) -> api.QueryQPReply:
        rec = self.obj(owner, req.handle, KIND_QP)
        dev = rec.device
        assert dev is not None
        eng: QPEngine = rec.engine
        info: QPInfo = rec.info or QPInfo(api.QPCaps(0, 0, 0, 0, 0, 0), 0)
        with dev.runtime.lock:
            attrs = api.QPAttrs.unpack(info.attrs.pack())
            attrs.qp_state = attrs.cur_qp_state = eng.state
            attrs.sq_draining = int(eng.sq_draining())
        return api.QueryQPReply(attrs, info.caps, eng.state, info.sq_sig_all)

    def open_qp(self, owner: Owner, req: api.OpenQP, res: Resources) -> api.OpenQPReply:
        ctx = self._ctx(owner, req.ctx)
        dev = ctx.device
        assert dev is not None
        xrcd = self.obj(owner, req.xrcd, KIND_XRCD, dev)
        if req.qp_type != IBV_QPT_XRC_RECV:
            raise einval("ibv_open_qp opens XRC receive QPs only")
        with self._on(dev):
            eng = self._xrc_lookup(dev, xrcd.engine, req.qpn)
            rec = self._new(owner, KIND_QP, dev, eng, ctx, (xrcd,))
            dev.hca.xrc_refs.setdefault(eng.qpn, set()).add(rec)
        return api.OpenQPReply(rec.handle, eng.qpn, eng.state, 0)

    @staticmethod
    def _xrc_lookup(dev: Device, domain: XrcDomain, qpn: int) -> QPEngine:
        hca = dev.hca
        eng = hca.qps.get(qpn)
        if eng is None or not isinstance(eng, QPEngine):
            raise einval(f"QP {qpn:#x} does not exist")
        if eng.qp_type != IBV_QPT_XRC_RECV or qpn not in hca.xrc_refs:
            raise einval(f"QP {qpn:#x} is not an XRC receive QP")
        if eng.xrcd is not domain:
            raise einval(f"XRC receive QP {qpn:#x} belongs to another XRC domain")
        return eng

    def xrc_rcv_qp_alloc(self, owner: Owner, req: api.XrcRcvAlloc, res: Resources) -> api.QpnReply:
        """Create a receive QP in the domain, move it RESET->INIT->RTR and
        register the caller -- atomically, as ``ibv_xrc_rcv_qp_alloc``."""
        xrcd = self.obj(owner, req.xrcd, KIND_XRCD)
        dev = xrcd.device
        assert dev is not None
        if req.init.qp_state != IBV_QPS_INIT or req.rtr.qp_state != IBV_QPS_RTR:
            raise einval("xrc_rcv_qp_alloc: the steps must be RESET->INIT and INIT->RTR")
        hca = dev.hca
        with self._on(dev):
            eng = QPEngine(hca, hca.alloc_qpn(xrc_recv=True), IBV_QPT_XRC_RECV, None, None,
                           None, None, None, None, False)  # fmt: skip
            eng.xrcd = xrcd.engine
            eng.set_attrs({"pmtu": min(1024, dev.info.mtu)})
            hca.qps[eng.qpn] = eng
            try:
                for attrs, mask in ((req.init, req.init_mask), (req.rtr, req.rtr_mask)):
                    eng.modify(mask, attrs.qp_state, None,
                               lambda a=attrs, m=mask: qp_values(dev, a, m),  # type: ignore[misc]
                               dev.runtime.clock.now())  # fmt: skip
            except Exception:
                eng.reset()
                hca.qps.pop(eng.qpn, None)
                raise
            hca.xrc_refs.setdefault(eng.qpn, set()).add(owner)
        return api.QpnReply(eng.qpn, 0)

    def xrc_rcv_qp_register(self, owner: Owner, req: api.XrcQpn, res: Resources) -> api.Empty:
        """Once per process; registering again adds no reference."""
        xrcd = self.obj(owner, req.xrcd, KIND_XRCD)
        dev = xrcd.device
        assert dev is not None
        with self._on(dev):
            eng = self._xrc_lookup(dev, xrcd.engine, req.qpn)
            dev.hca.xrc_refs.setdefault(eng.qpn, set()).add(owner)
        return api.Empty()

    def xrc_rcv_qp_unregister(self, owner: Owner, req: api.XrcQpn, res: Resources) -> api.Empty:
        """The last registration destroys the QP."""
        xrcd = self.obj(owner, req.xrcd, KIND_XRCD)
        dev = xrcd.device
        assert dev is not None
        with self._on(dev):
            eng = self._xrc_lookup(dev, xrcd.engine, req.qpn)
            self._xrc_release(dev, eng, owner)
        return api.Empty()

    @staticmethod
    def _xrc_release(dev: Device, eng: QPEngine, holder: object) -> None:
        hca = dev.hca
        refs = hca.xrc_refs.get(eng.qpn)
        if refs is None:
            return
        refs.discard(holder)
        if not refs:
            eng.reset(clean_cqs=False)  # a destroy: its CQEs stay (engine/qp.py)
            hca.qps.pop(eng.qpn, None)
            hca.xrc_refs.pop(eng.qpn, None)

    # --- the data path ----------------------------------------------------------------------------
    # --- multicast -----------------------------------------------------------------------------
    def _mcast(self, owner: Owner, req: api.Mcast, verb: str) -> tuple[Device, QPEngine, bytes]:
        """The QP and group of an attach or detach, checked as the kernel's
        ``ib_attach_mcast`` checks them (EINVAL)."""
        rec = self.obj(owner, req.qp, KIND_QP)
        dev = rec.device
        assert dev is not None
        eng: QPEngine = rec.engine
        mgid = bytes(req.gid)
        if eng.qp_type != IBV_QPT_UD:
            raise einval(f"{verb}: QP {eng.qpn:#x} is {_name(ibv_qp_type, eng.qp_type)}; only UD "
                         "QPs are members of multicast groups")  # fmt: skip
        if not is_multicast_gid(mgid):
            raise einval(f"{verb}: {gid_text(mgid)} is not a multicast GID (ff00::/8, or an "
                         "IPv4-mapped 224.0.0.0/4 address)")  # fmt: skip
        return dev, eng, mgid

    def attach_mcast(self, owner: Owner, req: api.Mcast, res: Resources) -> api.Empty:
        dev, eng, mgid = self._mcast(owner, req, "ibv_attach_mcast")
        with self._on(dev):
            err = dev.hca.attach_mcast(eng, mgid)
        if err is not None:
            raise PyverbsRDMAError(f"ibv_attach_mcast: {err}", errno.ENOMEM)
        return api.Empty()

    def detach_mcast(self, owner: Owner, req: api.Mcast, res: Resources) -> api.Empty:
        dev, eng, mgid = self._mcast(owner, req, "ibv_detach_mcast")
        with self._on(dev):
            if not dev.hca.detach_mcast(eng, mgid):
                raise einval(f"ibv_detach_mcast: QP {eng.qpn:#x} is not attached to "
                             f"{gid_text(mgid)}")  # fmt: skip
        return api.Empty()

    def doorbell(self, owner: Owner, req: api.Doorbell, res: Resources) -> None:
        rec = self.obj(owner, req.qp, KIND_QP)
        dev = rec.device
        assert dev is not None
        with dev.runtime.lock:
            ring_doorbell(rec.engine, req.queue, dev.runtime.clock.now())
            dev.runtime.progress()

    # --- destruction ------------------------------------------------------------------------------
    def destroy(self, owner: Owner, req: api.Destroy, res: Resources) -> api.Empty:
        if req.kind not in _TEARDOWN:
            raise einval(f"destroy: unknown kind {req.kind}")
        rec = self.obj(owner, req.handle, req.kind)
        san = self.sanitizer
        if req.flags & api.DESTROY_CASCADE:
            for user in sorted(self._users_of(rec), key=lambda r: (_TEARDOWN[r.kind], -r.handle)):
                if san is not None:
                    san.destroying(user)
                self._destroy(user)
        if rec.users:
            raise ebusy(f"Failed to destroy {rec.kind_name} {rec.handle}: {rec.users} object(s) "
                        "still use it; destroy them first")  # fmt: skip
        if rec.kind == KIND_QP and not req.flags & api.DESTROY_CASCADE and rec.device is not None:
            groups = rec.device.hca.mcast_groups(rec.engine)
            if groups:  # the kernel's uverbs_free_qp: detach first
                raise ebusy(f"Failed to destroy QP {rec.engine.qpn:#x}: it is attached to "
                            f"{len(groups)} multicast group(s) ({gid_text(groups[0])} ...); "
                            "detach it first (ibv_detach_mcast)")  # fmt: skip
        if san is not None:
            san.destroying(rec)
        self._destroy(rec)
        if rec.kind == KIND_CTX:
            self._retire_idle()
        return api.Empty()

    def _retire_idle(self) -> None:
        """Tell :attr:`on_idle` of every device nothing uses any more."""
        if self.on_idle is None:
            return
        used = {o.device for o in self._handles.values()}
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
                bound = o.kind == KIND_MW and o.engine is not None and parent.kind == KIND_MR \
                    and o.engine.mr is parent.engine  # fmt: skip
                if (parent in o.parents or bound) and o not in found:
                    found.append(o)
                    frontier.append(o)
        return found

    def _destroy(self, rec: Obj) -> None:
        dev = rec.device
        eng = rec.engine
        if dev is not None:
            with dev.runtime.lock:
                try:
                    self._release_engine(dev, rec, eng)
                finally:
                    dev.runtime.progress()
        for parent in rec.parents:
            parent.users -= 1
        rec.parents = []
        rec.owner.objects.pop(rec.handle, None)
        self._handles.pop(rec.handle, None)
        rec.info = None
        rec.engine = None
        for close in rec.release:
            close()
        rec.release = []
        self.stats[f"destroyed_{rec.kind_name}"] += 1

    def _release_engine(self, dev: Device, rec: Obj, eng: Any) -> None:
        hca = dev.hca
        kind = rec.kind
        if kind == KIND_QP:
            if eng.qp_type == IBV_QPT_XRC_RECV and eng.qpn in hca.xrc_refs:
                self._xrc_release(dev, eng, rec)
            else:
                hca.detach_all(eng)
                eng.reset(clean_cqs=False)  # its CQEs stay to be polled (engine/qp.py)
                hca.qps.pop(eng.qpn, None)
            if eng.owner is rec:
                eng.owner = None
        elif kind == KIND_MR:
            if eng.binds:
                raise ebusy(f"Failed to dereg MR: {eng.binds} memory window(s) are still bound "
                            "to it; invalidate or deallocate them first")  # fmt: skip
            hca.keys.unregister(eng)
            eng.view = None  # the mapping it sliced can close now
            eng.owner = None
        elif kind == KIND_MW:
            if eng.mr is not None:
                eng.mr.binds -= 1
                eng.mr = None
            hca.keys.unregister(eng)
        elif kind == KIND_CQ:
            eng.set_error()
            eng.notify = None
            eng.owner = None
        elif kind == KIND_SRQ:
            srqn: int = eng.srqn
            if hca.srqs.get(srqn) is eng:
                del hca.srqs[srqn]
            eng.on_limit = None
            eng.owner = None
        elif kind == KIND_XRCD:
            hca.close_xrcd(eng)

    def close_owner(self, owner: Owner) -> None:
        """The owner is gone: destroy everything it held, users first."""
        with self.lock:
            if owner.closed:
                return
            if self.sanitizer is not None:
                self.sanitizer.closing(owner)
            owner.closed = True
            order = sorted(owner.objects.values(), key=lambda r: (_TEARDOWN[r.kind], -r.handle))
            for rec in order:
                try:
                    rec.users = 0
                    self._destroy(rec)
                except Exception:  # one object's cleanup must not strand the others
                    self.stats["cleanup_errors"] += 1
                    owner.objects.pop(rec.handle, None)
                    self._handles.pop(rec.handle, None)
            for dev in self.devices.values():
                with dev.runtime.lock:
                    for qpn, refs in list(dev.hca.xrc_refs.items()):
                        if owner in refs:
                            eng = dev.hca.qps.get(qpn)
                            if isinstance(eng, QPEngine):
                                self._xrc_release(dev, eng, owner)
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


def mkey_configure(key: Any, pd: object, data: bytes) -> Callable[[], str | None]:
    """The local operation of an mkey-configuring driver WQE: ``data`` (its
    inline bytes) decoded -- ValueError if malformed -- into what configures
    ``key`` when the WQE runs (in send-queue order)."""
    from softverbs.engine.signature import Escape, SigBlock, SigDomain, SigKind, auto_copy_mask

    head = api.MkeyConf.size()
    if len(data) < head:
        raise ValueError(f"an mkey configuration needs {head} bytes, the WQE has {len(data)}")
    conf: api.MkeyConf = api.MkeyConf.unpack(data)
    esize, dsize = api.MkeyEntry.size(), api.MkeySigDomain.size()
    need = head + conf.nentries * esize + (2 * dsize if conf.flags & api.MKEY_CONF_SIG else 0)
    if len(data) < need or conf.flags & ~15 or not 1 <= conf.repeat <= 0xFFFF:
        raise ValueError("the mkey configuration is malformed")
    entries = None
    if conf.flags & api.MKEY_CONF_LAYOUT:
        entries = []
        for i in range(conf.nentries):
            e: api.MkeyEntry = api.MkeyEntry.unpack(data, head + i * esize)
            entries.append((e.lkey, e.addr, e.count, e.skip))
    sig = None
    set_sig = bool(conf.flags & api.MKEY_CONF_SIG)
    if set_sig:
        base = head + conf.nentries * esize
        domains: list[SigDomain | None] = []
        for i in range(2):
            d: api.MkeySigDomain = api.MkeySigDomain.unpack(data, base + i * dsize)
            if not d.present:
                domains.append(None)
                continue
            if d.kind > 2 or d.escape > 2 or d.block_size not in (512, 4096):
                raise ValueError("a signature domain of the mkey configuration is malformed")
            domains.append(SigDomain(SigKind(d.kind), d.block_size, d.seed, d.app_tag, d.ref_tag,
                                     bool(d.ref_remap), Escape(d.escape)))  # fmt: skip
        if domains[0] is not None or domains[1] is not None:
            copy = conf.copy_mask
            if conf.flags & api.MKEY_CONF_AUTO_COPY:
                copy = auto_copy_mask(domains[0], domains[1])
            sig = SigBlock(domains[0], domains[1], conf.check_mask, copy)
    access = conf.access if conf.flags & api.MKEY_CONF_ACCESS else None
    repeat = conf.repeat
    xform = key.xform

    def configure() -> str | None:
        if key.xform is not xform:
            return "the mkey was destroyed"
        result: str | None = xform.configure(key, pd, entries, repeat, access, sig, set_sig)
        return result

    return configure


def ring_doorbell(eng: QPEngine, queue: int, now: float) -> None:
    """The application moved the doorbell index of one of ``eng``'s queues."""
    if queue == api.DB_SQ:
        if eng.sq is not None:
            eng.doorbell(now)
    elif queue == api.DB_RQ:
        eng.rq_doorbell(now)
    else:
        raise einval(f"doorbell: queue {queue} is neither the send (1) nor the receive (2) queue")


def _engine(rec: Obj | None) -> Any:
    return rec.engine if rec is not None else None


class _PD:
    """A protection domain's identity: the engine compares PDs by identity."""

    __slots__ = ()


#: Operations Host executes (by name); the others are the service's own.
_HANDLED = (
    "LIST_DEVICES", "OPEN_DEVICE", "QUERY_DEVICE", "QUERY_PORT", "QUERY_GID", "QUERY_PKEY",
    "ALLOC_PD", "DESTROY", "REG_MR", "REREG_MR", "ALLOC_MW", "CREATE_AH", "CREATE_COMP_CHANNEL",
    "CREATE_CQ", "RESIZE_CQ", "CREATE_SRQ", "MODIFY_SRQ", "QUERY_SRQ", "OPEN_XRCD",
    "CREATE_QP", "MODIFY_QP", "QUERY_QP", "OPEN_QP", "DOORBELL", "XRC_RCV_QP_ALLOC",
    "XRC_RCV_QP_REGISTER", "XRC_RCV_QP_UNREGISTER", "ATTACH_MCAST", "DETACH_MCAST",
    "COUNTERS", "STATUS", "CAPTURE", "FAULTS",
    "CREATE_MKEY", "MKEY_CHECK", "CANCEL_SEND", "SANITIZE",
)  # fmt: skip
