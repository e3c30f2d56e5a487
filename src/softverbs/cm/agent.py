"""The CM agent: what the kernel's ``rdma_cm`` and ``ib_cm`` do, in the device.

One :class:`CmAgent` serves one world of devices (a process's registry, a
simulation, or the device service).  It keeps the CM IDs, the port spaces
and the listeners, resolves IP addresses to devices and GIDs, and runs two
state machines per ID, as the kernel does:

* the **rdma_cm** machine (:class:`RdmaState`: IDLE, ADDR_BOUND, ADDR_QUERY,
  ADDR_RESOLVED, ROUTE_QUERY, ROUTE_RESOLVED, CONNECT, DISCONNECT, LISTEN),
  driven by the user's calls -- :data:`RDMA_TRANSITIONS`;
* the **ib_cm** machine (:class:`CmState`: REQ_SENT, REP_RCVD, ESTABLISHED,
  DREQ_SENT, TIMEWAIT ...), driven by the MADs sent and received and by
  timeouts -- :data:`CM_TRANSITIONS`.  A MAD that its ID's state does not
  expect is counted (``cm_drop_unexpected``) and dropped, never raised.

Messages travel as IBTA CM MADs (:mod:`softverbs.cm.mad`) through QP1
(:mod:`softverbs.cm.gsi`).  Retransmission follows ib_cm: a REQ is resent
every ``2 * 2**(packet life - 8) + 2**(response timeout - 8)`` ms, up to 15
times, then the ID reports UNREACHABLE; REP, DREQ and SIDR_REQ likewise.
MRAs are "delayed" as rdma_cm asks (sent only when a duplicate REQ or REP
shows the peer is waiting).  A DREQ for an unknown connection is answered
with a DREP, as the kernel does, so a peer whose ID is gone still
disconnects at once.

Locking.  The agent has one lock.  It never takes a device lock itself:
sends and timer changes are queued per device and pushed into QP1 by
:meth:`CmAgent.flush` (for user calls) or by QP1 itself (for received MADs
and timers, which already hold the device lock).  The order is always
device lock, then agent lock.

Commands take and return JSON-friendly values, so the same agent serves
in-process users directly and other processes through ``softverbsd``.
Events are dicts handed to the ID's *sink*; the user-side library
(:mod:`softverbs.cm.api`) turns them into ``rdma_cm_event`` objects.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from softverbs.cm import mad
from softverbs.cm.gsi import GsiQP
from softverbs.cm.route import (
    Router,
    World,
    cm_error,
    gid_of,
    is_any,
)
from softverbs.cm.states import (
    CM_TRANSITIONS,
    CONNECTED_STATES,
    RDMA_TRANSITIONS,
    C,
    CmState,
    RdmaState,
)
from softverbs.engine.rings import Route
from softverbs.enums import (
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QP_ACCESS_FLAGS,
    IBV_QP_AV,
    IBV_QP_DEST_QPN,
    IBV_QP_MAX_DEST_RD_ATOMIC,
    IBV_QP_MAX_QP_RD_ATOMIC,
    IBV_QP_MIN_RNR_TIMER,
    IBV_QP_PATH_MTU,
    IBV_QP_PKEY_INDEX,
    IBV_QP_PORT,
    IBV_QP_QKEY,
    IBV_QP_RETRY_CNT,
    IBV_QP_RNR_RETRY,
    IBV_QP_RQ_PSN,
    IBV_QP_SQ_PSN,
    IBV_QP_STATE,
    IBV_QP_TIMEOUT,
    IBV_QPS_INIT,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPT_RC,
    IBV_QPT_UD,
    RDMA_CM_EVENT_ADDR_ERROR,
    RDMA_CM_EVENT_ADDR_RESOLVED,
    RDMA_CM_EVENT_CONNECT_REQUEST,
    RDMA_CM_EVENT_CONNECT_RESPONSE,
    RDMA_CM_EVENT_DISCONNECTED,
    RDMA_CM_EVENT_ESTABLISHED,
    RDMA_CM_EVENT_MULTICAST_JOIN,
    RDMA_CM_EVENT_REJECTED,
    RDMA_CM_EVENT_ROUTE_RESOLVED,
    RDMA_CM_EVENT_TIMEWAIT_EXIT,
    RDMA_CM_EVENT_UNREACHABLE,
    RDMA_MC_JOIN_FLAG_FULLMEMBER,
    RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
    RDMA_OPTION_ID,
    RDMA_OPTION_ID_ACK_TIMEOUT,
    RDMA_OPTION_ID_AFONLY,
    RDMA_OPTION_ID_REUSEADDR,
    RDMA_OPTION_ID_TOS,
    RDMA_PS_TCP,
    RDMA_PS_UDP,
    bytes_to_mtu,
)
from softverbs.errors import PyverbsRDMAError
from softverbs.wire.packet import IPV4_MAPPED_PREFIX

log = logging.getLogger(__name__)

#: librdmacm's Q_Key for RDMA_PS_UDP QPs (``RDMA_UDP_QKEY``).
RDMA_UDP_QKEY = 0x01234567
#: rdma_cm's choices (``cma.c``): CM response timeout, retries, RoCE packet life.
CM_RESPONSE_TIMEOUT = 20
MAX_CM_RETRIES = 15
IBOE_PACKET_LIFETIME = 18
#: ``CMA_CM_MRA_SETTING``: a delayed MRA asking for 2**24 * 4.096 us.
MRA_SERVICE_TIMEOUT = 24
#: The local CA ACK delay softverbs devices report (query_device).
LOCAL_CA_ACK_DELAY = 15
EPHEMERAL_PORTS = (32768, 60999)
#: rdma_set_option's value sizes (ucma_set_option_id): any other optlen is EINVAL
OPTION_LENGTHS = {RDMA_OPTION_ID_TOS: 1, RDMA_OPTION_ID_REUSEADDR: 4, RDMA_OPTION_ID_AFONLY: 4,
                  RDMA_OPTION_ID_ACK_TIMEOUT: 1}  # fmt: skip


def bindv6only() -> bool:
    """``net.ipv6.bindv6only``: whether a wildcard IPv6 bind without
    RDMA_OPTION_ID_AFONLY is IPv6 only (rdma_bind_addr reads the same)."""
    try:
        with open("/proc/sys/net/ipv6/bindv6only") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


#: the destination QP of a multicast group (``rdma_ud_param.qp_num`` of a join)
MCAST_QPN = 0xFFFFFF
#: the hop limit of an IPv4 group on RoCEv2 (the kernel's IPV6_DEFAULT_HOPLIMIT)
MCAST_HOP_LIMIT = 64

Addr = tuple[bytes, int]  #: (packed IP, port)
Sink = Callable[[dict[str, Any]], None]


@dataclass
class Path:
    """The one path of a connection (an SA path record, for RoCE)."""

    sgid: bytes
    dgid: bytes
    sgid_index: int
    mtu: int  #: ibv_mtu code
    flow_label: int = 0
    hop_limit: int = 64
    tclass: int = 0
    pkey: int = 0xFFFF
    packet_life_time: int = IBOE_PACKET_LIFETIME


@dataclass
class DeviceCtx:
    """One device the agent uses: its engine, runtime and QP1."""

    name: str
    device: Any  #: a SoftDevice whose engine runs in this process
    gsi: GsiQP

    @property
    def runtime(self) -> Any:
        return self.device.runtime

    @property
    def gids(self) -> list[bytes]:
        return list(self.device.hca.gids)

    @property
    def mtu(self) -> int:
        return int(bytes_to_mtu(self.device.mtu))

    @property
    def guid(self) -> int:
        return int(self.device.guid)


class CmId:
    """One CM ID: rdma_cm's ``rdma_id_private`` and ib_cm's ``cm_id_private``."""

    def __init__(self, handle: int, ps: int, qp_type: int, sink: Sink, owner: object) -> None:
        self.handle = handle
        self.ps = ps
        self.qp_type = qp_type
        self.sink = sink
        self.owner = owner
        self.state = RdmaState.IDLE
        self.cm = CmState.IDLE
        self.dev: str | None = None
        self.src: Addr | None = None
        self.dst: Addr | None = None
        self.path: Path | None = None
        self.listener: CmId | None = None
        self.backlog = 0
        self.bound: tuple[int, int] | None = None  #: (port space, port) held
        # ib_cm
        self.local_comm_id = 0
        self.remote_comm_id = 0
        self.remote_ca_guid = 0
        self.tid = 0
        self.service_id = 0
        self.qp_num = 0
        self.srq = 0
        self.remote_qpn = 0
        self.seq_num = 0  #: the PSN this side receives from (REQ/REP starting PSN)
        self.sq_psn = 0  #: the PSN this side sends from (the peer's starting PSN)
        self.responder_resources = 0
        self.initiator_depth = 0
        self.retry_count = 7
        self.rnr_retry_count = 7
        self.flow_control = 0
        self.av_timeout = IBOE_PACKET_LIFETIME + 1
        self.timeout_set = False
        self.timeout_opt = 0
        self.tos = 0
        self.reuseaddr = False  #: RDMA_OPTION_ID_REUSEADDR
        self.afonly = False  #: a wildcard bind takes its own family only
        self.afonly_set = False  #: RDMA_OPTION_ID_AFONLY was given (else bind decides)
        self.qkey = 0
        self.max_cm_retries = MAX_CM_RETRIES
        self.rep_timeout_ms = mad.ms_of(CM_RESPONSE_TIMEOUT)
        # the one outstanding retransmittable MAD, or timewait
        self.msg: bytes | None = None
        self.route: Route | None = None
        self.retries_left = 0
        self.msg_timeout = 0.0
        self.deadline: float | None = None
        self.timer = ""  #: "mad" or "timewait"
        #: multicast groups joined: (group address, join flags), in join order
        self.mcast: list[tuple[Addr, int]] = []

    @property
    def family(self) -> int:
        addr = self.src or self.dst
        return 0 if addr is None else (4 if len(addr[0]) == 4 else 6)

    def info(self) -> dict[str, Any]:
        """What ``ucma_query_route`` tells the user-side library."""
        p = self.path
        return {
            "handle": self.handle, "dev": self.dev, "port_num": 1, "ps": self.ps,
            "qp_type": self.qp_type, "src": _addr_out(self.src), "dst": _addr_out(self.dst),
            "sgid": p.sgid.hex() if p else None, "dgid": p.dgid.hex() if p else None,
            "sgid_index": p.sgid_index if p else None, "state": self.state.name,
            "cm_state": self.cm.name,
        }  # fmt: skip

    def __repr__(self) -> str:
        return f"<CmId {self.handle} {self.state.name}/{self.cm.name} dev={self.dev}>"


def _first_v4_index(gids: list[bytes]) -> int:
    """The index of a device's first IPv4 (mapped) GID, else 0."""
    return next((i for i, g in enumerate(gids) if g[:12] == IPV4_MAPPED_PREFIX), 0)


def _addr_out(addr: Addr | None) -> list[Any] | None:
    if addr is None:
        return None
    return [str(ipaddress.ip_address(addr[0])), addr[1]]


def addr_in(value: Any) -> Addr | None:
    """(packed IP, port) from ``[ip text, port]`` or None."""
    if value is None:
        return None
    try:
        text, port = value
        ip = ipaddress.ip_address(str(text).split("%")[0]).packed
    except (TypeError, ValueError):
        raise cm_error(f"not an address: {value!r}", errno.EINVAL) from None
    if not isinstance(port, int) or not 0 <= port <= 0xFFFF:
        raise cm_error(f"not a port: {port!r}", errno.EINVAL)
    return ip, port


def need_addr(value: Any, what: str) -> Addr:
    """``addr_in``, where an address must be given (else EINVAL)."""
    a = addr_in(value)
    if a is None:
        raise cm_error(f"{what}: no address given", errno.EINVAL)
    return a


class CmAgent:
    """rdma_cm + ib_cm for one world of devices (see the module docstring)."""

    def __init__(self, world: World, rng: random.Random | None = None,
                 hi_tid: int | None = None) -> None:  # fmt: skip
        self.world = world
        self.rng = rng or random.Random()
        self.hi_tid = hi_tid if hi_tid is not None else self.rng.randrange(1, 0x10000)
        self.lock = threading.RLock()
        self.ids: dict[int, CmId] = {}
        self.devices: dict[str, DeviceCtx] = {}
        self.binds: dict[tuple[int, int], list[CmId]] = {}
        self.by_comm: dict[int, CmId] = {}
        self.by_remote: dict[tuple[int, int], CmId] = {}
        self.pending: dict[str, list[tuple[bytes, Route]]] = {}
        self._next_handle = 1
        self.routes = Router(world, self._gids_of)
        self._last_port = 0

    # --- devices -------------------------------------------------------------------
    def _gids_of(self, name: str) -> list[bytes] | None:
        ctx = self.devices.get(name)
        return ctx.gids if ctx is not None else None

    def device(self, name: str) -> DeviceCtx:
        """The agent's view of device ``name``; attaches QP1 on first use.

        Call without the agent lock held (it takes the device's lock)."""
        ctx = self.devices.get(name)
        dev = self.world.open(name)
        if ctx is not None and ctx.device is dev and dev.hca.qps.get(mad.GSI_QPN) is ctx.gsi:
            return ctx
        if dev.hca is None:
            raise cm_error(f"device {name} runs in another process", errno.ENODEV)
        with dev.runtime.lock:
            gsi = GsiQP.attach(dev.hca, dev.mtu, self, name)
        ctx = DeviceCtx(name, dev, gsi)
        with self.lock:
            self.devices[name] = ctx
        return ctx

    # --- ids ----------------------------------------------------------------------------
    def create_id(self, ps: int, qp_type: int, sink: Sink, owner: object = None) -> int:
        if ps not in (RDMA_PS_TCP, RDMA_PS_UDP):
            raise cm_error(f"port space {ps:#x} is not supported: softverbs' RDMA CM speaks "
                           "RDMA_PS_TCP and RDMA_PS_UDP", errno.EPROTONOSUPPORT)  # fmt: skip
        with self.lock:
            handle = self._next_handle
            self._next_handle += 1
            self.ids[handle] = CmId(handle, ps, qp_type, sink, owner)
            return handle

    def _get(self, handle: int, owner: object) -> CmId:
        cid = self.ids.get(handle) if isinstance(handle, int) else None
        if cid is None or cid.owner is not owner:
            raise cm_error(f"no CM ID {handle!r}", errno.ENOENT)
        return cid

    def migrate_id(self, handle: int, sink: Sink, owner: object = None) -> None:
        """``rdma_migrate_id``: the ID's later events go to ``sink``."""
        with self.lock:
            self._get(handle, owner).sink = sink

    def query(self, handle: int, owner: object = None) -> dict[str, Any]:
        with self.lock:
            return self._get(handle, owner).info()

    def _rdma(self, cid: CmId, action: str, strict: bool = True) -> bool:
        """Move the ID by :data:`RDMA_TRANSITIONS` -- the only place its state
        changes.  Not in the table: EINVAL if ``strict``, else no move (False)."""
        new = RDMA_TRANSITIONS.get((cid.state, action))
        if new is None:
            if strict:
                raise cm_error(f"{action}: the CM ID is in state {cid.state.name}",
                               errno.EINVAL)  # fmt: skip
            return False
        cid.state = new
        return True

    def _cm(self, cid: CmId, action: str) -> bool:
        new = CM_TRANSITIONS.get((cid.cm, action))
        if new is None:
            return False
        cid.cm = new
        return True

    # --- binding ------------------------------------------------------------------------
    def bind_addr(self, handle: int, addr: Any, owner: object = None) -> dict[str, Any]:
        a = need_addr(addr, "bind_addr")
        dev = None if is_any(a[0]) else self.routes.bind_device(a[0])
        if dev is not None:
            self.device(dev)
        with self.lock:
            cid = self._get(handle, owner)
            self._bind(cid, a, dev)
            return cid.info()

    def _bind(self, cid: CmId, a: Addr, dev: str | None) -> None:
        if cid.state != RdmaState.IDLE:
            raise cm_error(f"bind: the CM ID is in state {cid.state.name}", errno.EINVAL)
        ip, port = a
        if not cid.afonly_set:  # rdma_bind_addr: IPv4 is always, IPv6 as the sysctl says
            cid.afonly = len(ip) == 4 or bindv6only()
        port = self._take_port(cid, ip, port)
        cid.src = (ip, port)
        cid.dev = dev
        self._rdma(cid, "bind")

    def _take_port(self, cid: CmId, ip: bytes, port: int) -> int:
        """rdma_cm's port space: ``cma_alloc_any_port`` / ``cma_use_port``."""
        ps = cid.ps
        if port == 0:
            low, high = EPHEMERAL_PORTS
            n = high - low + 1
            start = self.rng.randrange(n)
            for i in range(n):
                cand = low + (start + i) % n
                if (ps, cand) not in self.binds and cand != self._last_port:
                    port = cand
                    break
            else:
                raise cm_error("no free port in the ephemeral range", errno.EADDRNOTAVAIL)
            self._last_port = port
        else:
            self._check_port(cid, ip, port, self.binds.get((ps, port), []), cid.reuseaddr)
        self.binds.setdefault((ps, port), []).append(cid)
        cid.bound = (ps, port)
        return port

    @staticmethod
    def _check_port(cid: CmId, ip: bytes, port: int, owners: list[CmId], reuse: bool) -> None:
        """``cma_check_port``: may ``cid`` hold ``ip``:``port`` next to its
        other owners?  Two IDs that both set REUSEADDR share it; two AFONLY IDs
        of different families never conflict; otherwise a wildcard address
        on either side is EADDRNOTAVAIL and the same address EADDRINUSE."""
        for other in owners:
            if other is cid or other.src is None:
                continue
            if reuse and other.reuseaddr:
                continue
            oip = other.src[0]
            if cid.afonly and other.afonly and len(ip) != len(oip):
                continue
            if is_any(ip) or is_any(oip):
                raise cm_error(f"port {port} is already bound (a wildcard address is "
                               "involved)", errno.EADDRNOTAVAIL)  # fmt: skip
            if oip == ip:
                raise cm_error(f"{ipaddress.ip_address(ip)}:{port} is already in use",
                               errno.EADDRINUSE)  # fmt: skip

    def _release_port(self, cid: CmId) -> None:
        if cid.bound is None:
            return
        owners = self.binds.get(cid.bound, [])
        if cid in owners:
            owners.remove(cid)
        if not owners:
            self.binds.pop(cid.bound, None)
        cid.bound = None

    # --- address and route resolution ----------------------------------------------------
    def resolve_addr(self, handle: int, src: Any, dst: Any, timeout_ms: int = 2000,
                     owner: object = None) -> None:  # fmt: skip
        d = need_addr(dst, "resolve_addr")
        s = addr_in(src)
        with self.lock:
            cid = self._get(handle, owner)
            bound_dev, bound_src = cid.dev, cid.src
            state = cid.state
        if state not in (RdmaState.IDLE, RdmaState.ADDR_BOUND):
            raise cm_error(f"resolve_addr: the CM ID is in state {state.name}", errno.EINVAL)
        if s is not None and is_any(s[0]) and s[1] == 0:
            s = None
        if state == RdmaState.IDLE:
            src_ip = s[0] if s is not None else None
            src_port = s[1] if s is not None else 0
        else:
            assert bound_src is not None
            src_ip = None if is_any(bound_src[0]) else bound_src[0]
            src_port = bound_src[1]
        if src_ip is not None and len(src_ip) != len(d[0]):
            raise cm_error("resolve_addr: source and destination families differ", errno.EINVAL)
        dev = bound_dev
        if src_ip is not None and dev is None:
            dev = self.routes.bind_device(src_ip)
        status, dev, src_ip = self.routes.resolve(dev, src_ip, d[0])
        if dev is not None:
            self.device(dev)
        with self.lock:
            cid = self._get(handle, owner)
            if cid.state == RdmaState.IDLE:
                wild = bytes(len(d[0]))
                self._bind(cid, (src_ip if status == 0 and src_ip else wild, src_port), None)
            self._rdma(cid, "resolve_addr")
            cid.dst = d
            if status:
                self._rdma(cid, "addr_error")
                self._emit(cid, RDMA_CM_EVENT_ADDR_ERROR, status)
                return
            assert cid.src is not None and src_ip is not None
            cid.src = (src_ip, cid.src[1])
            cid.dev = dev
            self._rdma(cid, "addr_resolved")
            self._emit(cid, RDMA_CM_EVENT_ADDR_RESOLVED, 0, info=cid.info())

    def resolve_route(self, handle: int, timeout_ms: int = 2000, owner: object = None) -> None:
        with self.lock:
            cid = self._get(handle, owner)
            dev = cid.dev
        if dev is None:
            raise cm_error("resolve_route: resolve the address first", errno.EINVAL)
        ctx = self.device(dev)
        with self.lock:
            cid = self._get(handle, owner)
            self._rdma(cid, "resolve_route")
            assert cid.src is not None and cid.dst is not None
            sgid, dgid = gid_of(cid.src[0]), gid_of(cid.dst[0])
            gids = ctx.gids
            flow = (cid.src[1] * 31 + cid.dst[1]) & 0xFFFFF  # cma_get_roce_udp_flow_label
            plt = cid.timeout_opt - 1 if cid.timeout_set else IBOE_PACKET_LIFETIME
            cid.path = Path(sgid, dgid, gids.index(sgid) if sgid in gids else 0, ctx.mtu,
                            flow, 64, cid.tos, 0xFFFF, max(plt, 0))  # fmt: skip
            cid.av_timeout = cid.path.packet_life_time + 1
            self._rdma(cid, "route_resolved")
            self._emit(cid, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, info=cid.info())

    # --- listening ------------------------------------------------------------------------
    def listen(self, handle: int, backlog: int = 0, owner: object = None) -> dict[str, Any]:
        with self.lock:
            cid = self._get(handle, owner)
            dev = cid.dev
            if cid.state == RdmaState.IDLE:
                self._bind(cid, (bytes(4), 0), None)
        # A listener on a wildcard address listens on every device (cma_listen_on_all).
        for name in [dev] if dev is not None else [s.name for s in self.world.specs()]:
            with contextlib.suppress(PyverbsRDMAError):
                self.device(name)
        with self.lock:
            cid = self._get(handle, owner)
            if cid.reuseaddr and cid.bound is not None and cid.src is not None:
                # cma_bind_listen: a listener shares its port with no one
                self._check_port(cid, cid.src[0], cid.src[1], self.binds[cid.bound], False)
            self._rdma(cid, "listen")
            cid.backlog = backlog
            self._cm(cid, "listen")
            return cid.info()

    def _find_listener(self, ps: int, port: int, dst_ip: bytes, dev: str,
                       sidr: bool) -> CmId | None:  # fmt: skip
        for cid in self.binds.get((ps, port), []):
            if cid.state != RdmaState.LISTEN or cid.src is None:
                continue
            if cid.dev is not None and cid.dev != dev:
                continue
            ip = cid.src[0]
            # cma_match_private_data: a wildcard listener without AFONLY takes
            # both families; otherwise the request's family must be its own
            if not (is_any(ip) and not cid.afonly) and (
                    len(ip) != len(dst_ip) or not (is_any(ip) or ip == dst_ip)):  # fmt: skip
                continue
            if sidr != (cid.qp_type == IBV_QPT_UD):
                continue
            return cid
        return None

    # --- connecting -----------------------------------------------------------------------
    def connect(self, handle: int, param: dict[str, Any], owner: object = None) -> None:
        with self.lock:
            cid = self._get(handle, owner)
            self._rdma(cid, "connect")
            try:
                if cid.qp_type == IBV_QPT_UD:
                    self._send_sidr_req(cid, param)
                else:
                    self._send_req(cid, param)
            except PyverbsRDMAError:
                self._rdma(cid, "connect_failed")
                raise
        self.flush()

    def _now(self, cid: CmId) -> float:
        ctx = self.devices.get(cid.dev or "")
        return float(ctx.runtime.clock.now()) if ctx is not None else 0.0

    def _ctx(self, cid: CmId) -> DeviceCtx:
        ctx = self.devices.get(cid.dev or "")
        if ctx is None:
            raise cm_error("the CM ID is not bound to a device", errno.EINVAL)
        return ctx

    def _new_comm_id(self) -> int:
        while True:
            comm = self.rng.randrange(1, 1 << 32)
            if comm not in self.by_comm:
                return comm

    def _private(self, param: dict[str, Any], limit: int) -> bytes:
        data = bytes.fromhex(str(param.get("private_data", "") or ""))
        if len(data) > limit:
            raise cm_error(f"{len(data)} bytes of private data exceed the {limit} this "
                           "message carries", errno.EINVAL)  # fmt: skip
        return data

    def _send_req(self, cid: CmId, param: dict[str, Any]) -> None:
        ctx = self._ctx(cid)
        p, src, dst = cid.path, cid.src, cid.dst
        assert p is not None and src is not None and dst is not None
        user = self._private(param, mad.REQ_PRIVATE_DATA_SIZE - mad.CMA_HEADER_SIZE)
        cma = mad.CmaHeader(src[0], dst[0], src[1]).encode()
        cid.qp_num = int(param.get("qp_num", 0))
        cid.srq = int(param.get("srq", 0))
        cid.responder_resources = int(param.get("responder_resources", 0))
        cid.initiator_depth = int(param.get("initiator_depth", 0))
        cid.retry_count = min(7, int(param.get("retry_count", 7)))
        cid.rnr_retry_count = min(7, int(param.get("rnr_retry_count", 7)))
        cid.flow_control = int(param.get("flow_control", 0))
        cid.seq_num = self.rng.randrange(1 << 24)
        cid.local_comm_id = self._new_comm_id()
        cid.tid = mad.tid_for(self.hi_tid, cid.local_comm_id)
        cid.service_id = mad.service_id(cid.ps, dst[1])
        req = mad.Req(
            tid=cid.tid, local_comm_id=cid.local_comm_id, service_id=cid.service_id,
            local_ca_guid=ctx.guid, local_qpn=cid.qp_num,
            responder_resources=cid.responder_resources, initiator_depth=cid.initiator_depth,
            remote_cm_response_timeout=CM_RESPONSE_TIMEOUT,
            transport_service_type=0, end_to_end_flow_control=cid.flow_control & 1,
            starting_psn=cid.seq_num, local_cm_response_timeout=CM_RESPONSE_TIMEOUT,
            retry_count=cid.retry_count, pkey=p.pkey, path_mtu=p.mtu,
            rnr_retry_count=cid.rnr_retry_count, max_cm_retries=MAX_CM_RETRIES,
            srq=1 if cid.srq else 0, primary_local_gid=p.sgid, primary_remote_gid=p.dgid,
            primary_flow_label=p.flow_label, primary_traffic_class=p.tclass,
            primary_hop_limit=p.hop_limit,
            primary_local_ack_timeout=mad.ack_timeout(LOCAL_CA_ACK_DELAY, p.packet_life_time),
            private_data=cma + user,
        )  # fmt: skip
        self._cm(cid, "tx_req")
        self.by_comm[cid.local_comm_id] = cid
        timeout = 2 * mad.ms_of(p.packet_life_time) + mad.ms_of(CM_RESPONSE_TIMEOUT)
        self._send(cid, req, timeout, MAX_CM_RETRIES)

    def _send_sidr_req(self, cid: CmId, param: dict[str, Any]) -> None:
        p, src, dst = cid.path, cid.src, cid.dst
        assert p is not None and src is not None and dst is not None
        user = self._private(param, mad.SIDR_REQ_PRIVATE_DATA_SIZE - mad.CMA_HEADER_SIZE)
        cma = mad.CmaHeader(src[0], dst[0], src[1]).encode()
        cid.qp_num = int(param.get("qp_num", 0))
        cid.local_comm_id = self._new_comm_id()
        cid.tid = mad.tid_for(self.hi_tid, cid.local_comm_id)
        cid.service_id = mad.service_id(cid.ps, dst[1])
        req = mad.SidrReq(tid=cid.tid, request_id=cid.local_comm_id, pkey=p.pkey,
                          service_id=cid.service_id, private_data=cma + user)  # fmt: skip
        self._cm(cid, "tx_sidr_req")
        self.by_comm[cid.local_comm_id] = cid
        self._send(cid, req, mad.ms_of(CM_RESPONSE_TIMEOUT), MAX_CM_RETRIES)

    def accept(self, handle: int, param: dict[str, Any], owner: object = None) -> None:
        """``rdma_accept``, the passive side: a REP (RC) or a SIDR_REP (UD)."""
        with self.lock:
            cid = self._get(handle, owner)
            if cid.state != RdmaState.CONNECT:
                raise cm_error(f"accept: the CM ID is in state {cid.state.name}", errno.EINVAL)
            if cid.cm == C.SIDR_REQ_RCVD:
                self._send_sidr_rep(cid, mad.SIDR_SUCCESS, param)
            elif cid.cm in (C.REQ_RCVD, C.MRA_REQ_SENT):
                self._send_rep(cid, param)
            else:
                raise cm_error(f"accept: the connection is in state {cid.cm.name}", errno.EINVAL)
        self.flush()

    def establish(self, handle: int, owner: object = None) -> None:
        """``rdma_establish`` (and librdmacm after a CONNECT_RESPONSE on an ID
        with a QP): the active side's RTU."""
        with self.lock:
            cid = self._get(handle, owner)
            if cid.state != RdmaState.CONNECT or cid.cm not in (C.REP_RCVD, C.MRA_REP_SENT):
                raise cm_error(f"establish: the connection is in state {cid.cm.name}, not "
                               "REP_RCVD", errno.EINVAL)  # fmt: skip
            self._send_rtu(cid)
        self.flush()

    def _send_rep(self, cid: CmId, param: dict[str, Any]) -> None:
        ctx = self._ctx(cid)
        user = self._private(param, mad.REP_PRIVATE_DATA_SIZE)
        if "qp_num" in param:
            cid.qp_num = int(param["qp_num"])
        cid.srq = int(param.get("srq", cid.srq))
        if "responder_resources" in param:
            cid.responder_resources = int(param["responder_resources"])
        if "initiator_depth" in param:
            cid.initiator_depth = int(param["initiator_depth"])
        rnr = min(7, int(param.get("rnr_retry_count", 7)))
        rep = mad.Rep(
            tid=cid.tid, local_comm_id=cid.local_comm_id, remote_comm_id=cid.remote_comm_id,
            local_qpn=cid.qp_num, starting_psn=cid.seq_num,
            responder_resources=cid.responder_resources, initiator_depth=cid.initiator_depth,
            target_ack_delay=LOCAL_CA_ACK_DELAY,
            end_to_end_flow_control=int(param.get("flow_control", 0)) & 1,
            rnr_retry_count=rnr, srq=1 if cid.srq else 0, local_ca_guid=ctx.guid,
            private_data=user,
        )  # fmt: skip
        self._cm(cid, "tx_rep")
        self._send(cid, rep, cid.rep_timeout_ms, cid.max_cm_retries)

    def _send_rtu(self, cid: CmId) -> None:
        rtu = mad.Rtu(tid=cid.tid, local_comm_id=cid.local_comm_id,
                      remote_comm_id=cid.remote_comm_id)  # fmt: skip
        self._cancel(cid)
        self._cm(cid, "tx_rtu")
        self._send(cid, rtu)

    def _send_sidr_rep(self, cid: CmId, status: int, param: dict[str, Any]) -> None:
        user = self._private(param, mad.SIDR_REP_PRIVATE_DATA_SIZE)
        if status == mad.SIDR_SUCCESS:
            if "qp_num" in param:
                cid.qp_num = int(param["qp_num"])
            qkey = int(param.get("qkey", 0) or 0)
            if cid.qkey and qkey and qkey != cid.qkey:
                raise cm_error(f"qkey {qkey:#x} differs from the ID's {cid.qkey:#x}",
                               errno.EINVAL)  # fmt: skip
            cid.qkey = cid.qkey or qkey or RDMA_UDP_QKEY
        rep = mad.SidrRep(tid=cid.tid, request_id=cid.remote_comm_id, sidr_status=status,
                          qpn=cid.qp_num if status == mad.SIDR_SUCCESS else 0,
                          service_id=cid.service_id,
                          qkey=cid.qkey if status == mad.SIDR_SUCCESS else 0,
                          private_data=user)  # fmt: skip
        self._cm(cid, "tx_sidr_rep")
        self._forget_remote(cid)
        self._send(cid, rep)

    def reject(self, handle: int, private_data: str = "", owner: object = None) -> None:
        with self.lock:
            cid = self._get(handle, owner)
            data = bytes.fromhex(private_data or "")
            if cid.cm == C.SIDR_REQ_RCVD:
                self._send_sidr_rep(cid, mad.SIDR_REJECT, {"private_data": data.hex()})
            elif cid.cm in (C.REQ_RCVD, C.MRA_REQ_SENT, C.REP_RCVD, C.MRA_REP_SENT):
                if len(data) > mad.REJ_PRIVATE_DATA_SIZE:
                    raise cm_error("private data longer than a REJ carries", errno.EINVAL)
                msg = mad.MSG_REQ if cid.cm in (C.REQ_RCVD, C.MRA_REQ_SENT) else mad.MSG_REP
                self._send_rej(cid, mad.REJ_CONSUMER_DEFINED, msg, data)
                self._cm(cid, "tx_rej")
                self._forget_remote(cid)
            else:
                raise cm_error(f"reject: the connection is in state {cid.cm.name}", errno.EINVAL)
        self.flush()

    def _send_rej(self, cid: CmId, reason: int, msg: int, data: bytes = b"") -> None:
        ari, ari_len = b"", 0
        if reason == mad.REJ_TIMEOUT:  # the ARI names us: the peer may not know our comm ID
            ari, ari_len = self._ctx(cid).guid.to_bytes(8, "big"), 8
        rej = mad.Rej(tid=cid.tid, local_comm_id=cid.local_comm_id,
                      remote_comm_id=cid.remote_comm_id, message_rejected=msg, reason=reason,
                      reject_info_length=ari_len, ari=ari, private_data=data)  # fmt: skip
        self._cancel(cid)
        self._send(cid, rej)

    def disconnect(self, handle: int, owner: object = None) -> None:
        """``rdma_disconnect``: a DREQ, or the DREP to the peer's DREQ."""
        with self.lock:
            cid = self._get(handle, owner)
            if cid.state not in (RdmaState.CONNECT, RdmaState.DISCONNECT):
                raise cm_error(f"disconnect: the CM ID is in state {cid.state.name}",
                               errno.EINVAL)  # fmt: skip
            if cid.cm == C.ESTABLISHED:
                self._send_dreq(cid)
            elif cid.cm == C.DREQ_RCVD:
                self._send_drep(cid)
            # any other state: nothing to send, as rdma_disconnect ignores the error
        self.flush()

    def _send_dreq(self, cid: CmId) -> None:
        dreq = mad.Dreq(tid=mad.tid_for(self.hi_tid, cid.local_comm_id),
                        local_comm_id=cid.local_comm_id, remote_comm_id=cid.remote_comm_id,
                        remote_qpn=cid.remote_qpn)  # fmt: skip
        self._cm(cid, "tx_dreq")
        self._send(cid, dreq, mad.ms_of(cid.av_timeout), cid.max_cm_retries)

    def _send_drep(self, cid: CmId) -> None:
        drep = mad.Drep(tid=cid.tid, local_comm_id=cid.local_comm_id,
                        remote_comm_id=cid.remote_comm_id)  # fmt: skip
        self._cm(cid, "tx_drep")
        self._send(cid, drep)
        self._timewait(cid)

    def destroy_id(self, handle: int, owner: object = None) -> None:
        """``rdma_destroy_id``: tell the peer as ``cm_destroy_id`` does, then forget."""
        with self.lock:
            cid = self._get(handle, owner)
            self._destroy(cid)
        self.flush()

    def _destroy(self, cid: CmId) -> None:
        state = cid.cm
        with contextlib.suppress(PyverbsRDMAError):
            if state in (C.REQ_SENT, C.MRA_REQ_RCVD):
                self._send_rej(cid, mad.REJ_TIMEOUT, mad.MSG_REQ)
            elif state in (C.REQ_RCVD, C.MRA_REQ_SENT, C.REP_RCVD, C.MRA_REP_SENT,
                           C.REP_SENT, C.MRA_REP_RCVD):  # fmt: skip
                msg = mad.MSG_REQ if state in (C.REQ_RCVD, C.MRA_REQ_SENT) else mad.MSG_REP
                self._send_rej(cid, mad.REJ_CONSUMER_DEFINED, msg)
            elif state == C.ESTABLISHED:
                self._send_dreq(cid)  # sent once; the ID then leaves (cm_enter_timewait)
            elif state == C.DREQ_RCVD:
                self._send_drep(cid)
            elif state == C.SIDR_REQ_RCVD:
                self._send_sidr_rep(cid, mad.SIDR_REJECT, {})
        self._cancel(cid)
        self._rdma(cid, "destroy", strict=False)
        self._release_port(cid)
        self._forget_remote(cid)
        if self.by_comm.get(cid.local_comm_id) is cid:
            del self.by_comm[cid.local_comm_id]
        self.ids.pop(cid.handle, None)

    def drop_owner(self, owner: object) -> None:
        """A process is gone: destroy every ID it held."""
        with self.lock:
            for cid in [c for c in self.ids.values() if c.owner is owner]:
                self._destroy(cid)
        self.flush()

    def _forget_remote(self, cid: CmId) -> None:
        key = (cid.remote_comm_id, cid.remote_ca_guid)
        if self.by_remote.get(key) is cid:
            del self.by_remote[key]

    # --- multicast ------------------------------------------------------------------------
    def join_multicast(self, handle: int, addr: Any, join_flags: int = 0,
                       owner: object = None) -> dict[str, Any]:  # fmt: skip
        """``rdma_join_multicast(_ex)``: what the kernel's rdma_cm does on RoCE
        (``cma_iboe_join_multicast``) -- there is no SA: the join is local.

        The group's GID is the IPv4-mapped group address (RoCEv2); the Q_Key
        RDMA_UDP_QKEY; the hop limit 64.  MULTICAST_JOIN follows at once, its
        ``ud`` the address vector of the group, QP 0xFFFFFF and the Q_Key; the
        user's library attaches the ID's QP to the group when it sees it (as
        librdmacm does), unless the join was send-only.  The UDP fabric joins
        the IP group when the QP attaches (:mod:`softverbs.fabric.udp`)."""
        a = need_addr(addr, "join_multicast")
        ip = a[0]
        with self.lock:
            cid = self._get(handle, owner)
            if cid.state not in (RdmaState.ADDR_BOUND, RdmaState.ADDR_RESOLVED) or cid.dev is None:
                raise cm_error(f"join_multicast: the CM ID is in state {cid.state.name}; bind it "
                               "to a local address or resolve one first", errno.EINVAL)  # fmt: skip
            if cid.qp_type != IBV_QPT_UD:
                raise cm_error("join_multicast: multicast needs a UD CM ID (RDMA_PS_UDP)",
                               errno.EINVAL)  # fmt: skip
            if join_flags not in (RDMA_MC_JOIN_FLAG_FULLMEMBER,
                                  RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER):  # fmt: skip
                raise cm_error(f"join_multicast: join flags {join_flags} are not a join "
                               "state", errno.EINVAL)  # fmt: skip
            if is_any(ip):
                raise cm_error("join_multicast: the group address is the wildcard address",
                               errno.EINVAL)  # fmt: skip
            ipa = ipaddress.ip_address(ip)
            if len(ip) != 4:
                raise cm_error(f"join_multicast: {ipa}: IPv6 groups are not joined on RoCEv2 "
                               "(the kernel's rdma_cm refuses them too); use an IPv4 group",
                               errno.EOPNOTSUPP)  # fmt: skip
            if not ipa.is_multicast:
                raise cm_error(f"join_multicast: {ipa} is not a multicast address "
                               "(224.0.0.0/4)", errno.EINVAL)  # fmt: skip
            gids = self._gids_of(cid.dev) or []
            src = cid.src[0] if cid.src is not None and not is_any(cid.src[0]) else None
            sgid = gid_of(src) if src is not None else None
            sgid_index = gids.index(sgid) if sgid in gids else _first_v4_index(gids)
            cid.qkey = cid.qkey or RDMA_UDP_QKEY
            cid.mcast.append((a, int(join_flags)))
            ah = {"dgid": gid_of(ip).hex(), "sgid_index": sgid_index, "flow_label": 0,
                  "hop_limit": MCAST_HOP_LIMIT, "traffic_class": cid.tos, "port_num": 1,
                  "is_global": 1}  # fmt: skip
            ud = {"qp_num": MCAST_QPN, "qkey": cid.qkey, "ah_attr": ah, "private_data": ""}
            self._emit(cid, RDMA_CM_EVENT_MULTICAST_JOIN, 0, ud=ud, mc=_addr_out(a),
                       join_flags=int(join_flags))  # fmt: skip
            return {"mgid": gid_of(ip).hex(), "qkey": cid.qkey}

    def leave_multicast(self, handle: int, addr: Any, owner: object = None) -> None:
        """``rdma_leave_multicast``: forget the join (the user's library has
        detached the QP).  EADDRNOTAVAIL if the ID did not join ``addr``."""
        a = addr_in(addr)
        with self.lock:
            cid = self._get(handle, owner)
            for i, (joined, _) in enumerate(cid.mcast):
                if joined == a:
                    del cid.mcast[i]
                    return
        raise cm_error("leave_multicast: the CM ID did not join that group", errno.EADDRNOTAVAIL)

    # --- options and QP attributes -------------------------------------------------------
    def set_option(self, handle: int, level: int, name: int, value: int,
                   length: int | None = None, owner: object = None) -> None:  # fmt: skip
        """``rdma_set_option`` at level RDMA_OPTION_ID, with the kernel's rules
        (ucma_set_option_id): ``length`` is the caller's optlen (checked when
        given), an unknown level or name is ENOSYS."""
        with self.lock:
            cid = self._get(handle, owner)
            if level != RDMA_OPTION_ID:
                raise cm_error(f"option level {level} is not supported: softverbs' RDMA CM "
                               "has RDMA_OPTION_ID only", errno.ENOSYS)  # fmt: skip
            want = OPTION_LENGTHS.get(name)
            if want is None:
                raise cm_error(f"option {name} is not supported", errno.ENOSYS)
            if length is not None and length != want:
                raise cm_error(f"option {name} takes a value of {want} bytes, not {length}",
                               errno.EINVAL)  # fmt: skip
            value = int(value)
            if name == RDMA_OPTION_ID_ACK_TIMEOUT:
                if cid.qp_type != IBV_QPT_RC:
                    raise cm_error("the ACK timeout applies to RC only", errno.EINVAL)
                cid.timeout_opt = value & 0xFF
                cid.timeout_set = True
            elif name == RDMA_OPTION_ID_TOS:
                cid.tos = value & 0xFF
            elif name == RDMA_OPTION_ID_REUSEADDR:
                # rdma_set_reuseaddr: turned on in any state but LISTEN, off only in IDLE
                if cid.state != RdmaState.IDLE and (not value or cid.state == RdmaState.LISTEN):
                    raise cm_error(f"REUSEADDR={int(bool(value))} in state {cid.state.name}",
                                   errno.EINVAL)  # fmt: skip
                cid.reuseaddr = bool(value)
            else:  # RDMA_OPTION_ID_AFONLY: rdma_set_afonly, before the ID is resolved
                if cid.state not in (RdmaState.IDLE, RdmaState.ADDR_BOUND):
                    raise cm_error(f"AFONLY in state {cid.state.name}", errno.EINVAL)
                cid.afonly = bool(value)
                cid.afonly_set = True

    def init_qp_attr(self, handle: int, qp_state: int,
                     owner: object = None) -> dict[str, Any]:  # fmt: skip
        """``rdma_init_qp_attr``: the attributes and mask for ``qp_state``."""
        with self.lock:
            cid = self._get(handle, owner)
            if cid.dev is None:
                raise cm_error("init_qp_attr: the CM ID has no device yet", errno.EINVAL)
            return self._qp_attr(cid, qp_state)

    def _qp_attr(self, cid: CmId, qp_state: int) -> dict[str, Any]:
        attr: dict[str, Any] = {"qp_state": qp_state, "port_num": 1, "pkey_index": 0}
        if cid.qp_type == IBV_QPT_UD:
            if qp_state == IBV_QPS_INIT:
                cid.qkey = cid.qkey or RDMA_UDP_QKEY
                attr["qkey"] = cid.qkey
                mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY
            elif qp_state == IBV_QPS_RTR:
                mask = IBV_QP_STATE
            elif qp_state == IBV_QPS_RTS:
                attr["sq_psn"] = 0
                mask = IBV_QP_STATE | IBV_QP_SQ_PSN
            else:
                raise cm_error(f"no CM attributes for QP state {qp_state}", errno.EINVAL)
            return {"attr": attr, "mask": int(mask)}
        connected = cid.cm in CONNECTED_STATES
        if qp_state == IBV_QPS_INIT:
            access = 0
            if connected:
                access = IBV_ACCESS_REMOTE_WRITE
                if cid.responder_resources:
                    access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
            attr["qp_access_flags"] = int(access)
            mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT
        elif qp_state in (IBV_QPS_RTR, IBV_QPS_RTS) and connected:
            p = cid.path
            assert p is not None
            if qp_state == IBV_QPS_RTR:
                attr.update(
                    ah_attr={"dgid": p.dgid.hex(), "sgid_index": p.sgid_index,
                             "flow_label": p.flow_label, "hop_limit": p.hop_limit,
                             "traffic_class": p.tclass, "port_num": 1, "is_global": 1},
                    path_mtu=p.mtu, dest_qp_num=cid.remote_qpn, rq_psn=cid.seq_num,
                    max_dest_rd_atomic=cid.responder_resources, min_rnr_timer=0,
                )  # fmt: skip
                mask = (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN
                        | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
            else:
                attr.update(sq_psn=cid.sq_psn, retry_cnt=cid.retry_count,
                            rnr_retry=cid.rnr_retry_count, max_rd_atomic=cid.initiator_depth,
                            timeout=cid.timeout_opt if cid.timeout_set else cid.av_timeout)
                mask = (IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY
                        | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_TIMEOUT)  # fmt: skip
        else:
            raise cm_error(f"no CM attributes for QP state {qp_state} while the connection "
                           f"is {cid.cm.name}", errno.EINVAL)  # fmt: skip
        return {"attr": attr, "mask": int(mask)}

    # --- sending, timers ----------------------------------------------------------------
    def _send(self, cid: CmId, msg: mad.CmMessage, timeout_ms: int = 0, retries: int = 0) -> None:
        """Queue ``msg`` to the peer; with ``timeout_ms``, keep it for retransmission."""
        ctx = self._ctx(cid)
        p = cid.path
        assert p is not None
        data = msg.encode()
        route = ctx.gsi.route_to(p.dgid, p.sgid)
        self.pending.setdefault(ctx.name, []).append((data, route))
        ctx.device.hca.counters[f"cm_tx_{msg.NAME.lower()}"] += 1
        if timeout_ms:
            cid.msg, cid.route, cid.retries_left = data, route, retries
            cid.msg_timeout = timeout_ms / 1000.0
            cid.deadline = self._now(cid) + cid.msg_timeout
            cid.timer = "mad"

    def _reply(self, ctx: DeviceCtx, msg: mad.CmMessage, sgid: bytes, dgid: bytes) -> None:
        """Answer a MAD that belongs to no ID (REJ, DREP, SIDR_REP)."""
        self.pending.setdefault(ctx.name, []).append((msg.encode(), ctx.gsi.route_to(sgid, dgid)))
        ctx.device.hca.counters[f"cm_tx_{msg.NAME.lower()}"] += 1

    def _cancel(self, cid: CmId) -> None:
        cid.msg = None
        cid.route = None
        cid.deadline = None
        cid.timer = ""

    def _timewait(self, cid: CmId) -> None:
        self._cancel(cid)
        cid.deadline = self._now(cid) + mad.ms_of(cid.av_timeout) / 1000.0
        cid.timer = "timewait"

    def deadline(self, gsi: GsiQP) -> float | None:
        """The agent's next deadline on ``gsi``'s device."""
        with self.lock:
            times = [c.deadline for c in self.ids.values()
                     if c.deadline is not None and c.dev == gsi.device]  # fmt: skip
        return min(times) if times else None

    def on_timer(self, gsi: GsiQP, now: float) -> None:
        with self.lock:
            for cid in [c for c in self.ids.values() if c.dev == gsi.device]:
                if cid.deadline is None or cid.deadline > now:
                    continue
                if cid.timer == "timewait":
                    self._cancel(cid)
                    self._cm(cid, "timewait_exit")
                    if cid.state == RdmaState.DISCONNECT:
                        self._emit(cid, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0)
                elif cid.retries_left > 0 and cid.msg is not None and cid.route is not None:
                    cid.retries_left -= 1
                    cid.deadline = now + cid.msg_timeout
                    self.pending.setdefault(gsi.device, []).append((cid.msg, cid.route))
                    gsi.hca.counters["cm_retransmits"] += 1
                else:
                    self._timed_out(cid)
        self._push(gsi, now)

    def _timed_out(self, cid: CmId) -> None:
        state = cid.cm
        self._cancel(cid)
        self._cm(cid, "timeout")
        etimedout = -errno.ETIMEDOUT
        if state in (C.REQ_SENT, C.MRA_REQ_RCVD, C.SIDR_REQ_SENT):
            self._emit(cid, RDMA_CM_EVENT_UNREACHABLE, etimedout)
        elif state in (C.REP_SENT, C.MRA_REP_RCVD):
            self._forget_remote(cid)
            self._emit(cid, RDMA_CM_EVENT_UNREACHABLE, etimedout)
        elif state == C.DREQ_SENT:
            self._timewait(cid)
            if self._rdma(cid, "disconnected", strict=False):
                self._emit(cid, RDMA_CM_EVENT_DISCONNECTED, etimedout)

    def flush(self) -> None:
        """Push queued MADs into QP1 and re-arm timers (no locks held by the caller)."""
        for ctx in list(self.devices.values()):
            rt = ctx.runtime
            with rt.lock:
                now = rt.clock.now()
                self._push(ctx.gsi, now)
                rt.progress()

    def _push(self, gsi: GsiQP, now: float) -> None:
        """Send what is queued for ``gsi``'s device (its lock held, not the agent's)."""
        with self.lock:
            out = self.pending.pop(gsi.device, [])
        for data, route in out:
            gsi.send_mad(data, route, now)
        gsi.arm_agent_timer()

    # --- events ----------------------------------------------------------------------------
    def _emit(self, cid: CmId, event: int, status: int, target: CmId | None = None,
              **extra: Any) -> None:  # fmt: skip
        ev: dict[str, Any] = {"handle": (target or cid).handle, "event": int(event),
                              "status": int(status)}  # fmt: skip
        ev.update(extra)
        try:
            (target or cid).sink(ev)
        except Exception:  # a sink that fails (a dead client) must not stop the agent
            log.debug("CM event sink failed", exc_info=True)

    # --- receiving ---------------------------------------------------------------------------
    def on_mad(self, gsi: GsiQP, data: bytes, sgid: bytes, dgid: bytes, now: float) -> None:
        counters = gsi.hca.counters
        try:
            msg = mad.decode(data)
        except mad.MadError as exc:
            counters[f"cm_drop_{exc.reason}"] += 1
            return
        counters[f"cm_rx_{msg.NAME.lower()}"] += 1
        ctx = self.devices.get(gsi.device)
        if ctx is None:
            counters["cm_drop_no_agent"] += 1
            return
        handler = getattr(self, f"_rx_{msg.NAME.lower()}")
        with self.lock:
            handler(ctx, msg, sgid, dgid, now)
        self._push(gsi, now)

    def _by_comm(self, ctx: DeviceCtx, comm_id: int, what: str) -> CmId | None:
        cid = self.by_comm.get(comm_id)
        if cid is None or cid.dev != ctx.name:
            ctx.device.hca.counters[f"cm_drop_unknown_{what}"] += 1
            return None
        return cid

    def _unexpected(self, ctx: DeviceCtx, what: str) -> None:
        ctx.device.hca.counters[f"cm_drop_unexpected_{what}"] += 1

    def _duplicate(self, ctx: DeviceCtx, what: str) -> None:
        ctx.device.hca.counters[f"cm_duplicate_{what}"] += 1

    def _rx_req(self, ctx: DeviceCtx, req: mad.Req, sgid: bytes, dgid: bytes, now: float) -> None:
        assert isinstance(req, mad.Req)
        old = self.by_remote.get((req.local_comm_id, req.local_ca_guid))
        if old is not None:
            self._duplicate(ctx, "req")
            if old.cm == C.MRA_REQ_SENT:  # the delayed MRA goes out now
                self._send(old, mad.Mra(tid=old.tid, local_comm_id=old.local_comm_id,
                                        remote_comm_id=old.remote_comm_id,
                                        message_mraed=mad.MSG_REQ,
                                        service_timeout=MRA_SERVICE_TIMEOUT))  # fmt: skip
            return
        ps, port = mad.split_service_id(req.service_id)
        try:
            cma = mad.CmaHeader.decode(req.private_data)
        except mad.MadError as exc:
            ctx.device.hca.counters[f"cm_drop_{exc.reason}"] += 1
            return
        listener = self._find_listener(ps, port, cma.dst_ip, ctx.name, sidr=False)
        if listener is None or req.transport_service_type != 0:
            rej = mad.Rej(tid=req.tid, remote_comm_id=req.local_comm_id,
                          message_rejected=mad.MSG_REQ, reason=mad.REJ_INVALID_SERVICE_ID)
            self._reply(ctx, rej, sgid, dgid)  # fmt: skip
            ctx.device.hca.counters["cm_rej_no_listener"] += 1
            return
        child = self._child(listener, ctx, cma, IBV_QPT_RC, req.service_id)
        self._cm(child, "rx_req")
        child.tid = req.tid
        child.remote_comm_id = req.local_comm_id
        child.remote_ca_guid = req.local_ca_guid
        child.remote_qpn = req.local_qpn
        child.sq_psn = req.starting_psn
        child.seq_num = self.rng.randrange(1 << 24)
        child.responder_resources = req.initiator_depth
        child.initiator_depth = req.responder_resources
        child.retry_count = req.retry_count
        child.rnr_retry_count = req.rnr_retry_count
        child.flow_control = req.end_to_end_flow_control
        child.srq = req.srq
        child.max_cm_retries = req.max_cm_retries
        child.rep_timeout_ms = mad.ms_of(req.local_cm_response_timeout)
        gids = ctx.gids
        sg = req.primary_remote_gid
        plt = max(req.primary_local_ack_timeout - 1, 0)
        child.path = Path(sg, req.primary_local_gid, gids.index(sg) if sg in gids else 0,
                          min(req.path_mtu, ctx.mtu) or ctx.mtu, req.primary_flow_label,
                          req.primary_hop_limit, req.primary_traffic_class, req.pkey, plt)
        child.av_timeout = mad.ack_timeout(LOCAL_CA_ACK_DELAY, plt)  # fmt: skip
        self.by_remote[(child.remote_comm_id, child.remote_ca_guid)] = child
        self._cm(child, "mra_delayed")
        conn = {"private_data": req.private_data[mad.CMA_HEADER_SIZE:].hex(),
                "responder_resources": req.initiator_depth,
                "initiator_depth": req.responder_resources,
                "flow_control": req.end_to_end_flow_control, "retry_count": req.retry_count,
                "rnr_retry_count": req.rnr_retry_count, "srq": req.srq,
                "qp_num": req.local_qpn}  # fmt: skip
        self._emit(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, target=listener,
                   child=child.info(), conn=conn)  # fmt: skip

    def _child(self, listener: CmId, ctx: DeviceCtx, cma: mad.CmaHeader, qp_type: int,
               sid: int) -> CmId:  # fmt: skip
        handle = self._next_handle
        self._next_handle += 1
        child = CmId(handle, listener.ps, qp_type, listener.sink, listener.owner)
        self.ids[handle] = child
        child.listener = listener
        child.dev = ctx.name
        self._rdma(child, "req_received")
        assert listener.src is not None
        child.src = (cma.dst_ip, listener.src[1])
        child.dst = (cma.src_ip, cma.src_port)
        child.service_id = sid
        child.local_comm_id = self._new_comm_id()
        self.by_comm[child.local_comm_id] = child
        child.timeout_set, child.timeout_opt = listener.timeout_set, listener.timeout_opt
        return child

    def _rx_rep(self, ctx: DeviceCtx, rep: mad.Rep, sgid: bytes, dgid: bytes, now: float) -> None:
        assert isinstance(rep, mad.Rep)
        cid = self._by_comm(ctx, rep.remote_comm_id, "rep")
        if cid is None:
            return
        if cid.cm == C.ESTABLISHED and rep.local_comm_id == cid.remote_comm_id:
            self._duplicate(ctx, "rep")  # our RTU was lost: send it again
            self._send(cid, mad.Rtu(tid=cid.tid, local_comm_id=cid.local_comm_id,
                                    remote_comm_id=cid.remote_comm_id))  # fmt: skip
            return
        if cid.cm == C.MRA_REP_SENT:
            self._duplicate(ctx, "rep")
            self._send(cid, mad.Mra(tid=cid.tid, local_comm_id=cid.local_comm_id,
                                    remote_comm_id=cid.remote_comm_id,
                                    message_mraed=mad.MSG_REP,
                                    service_timeout=MRA_SERVICE_TIMEOUT))  # fmt: skip
            return
        if not self._cm(cid, "rx_rep"):
            self._unexpected(ctx, "rep")
            return
        self._cancel(cid)
        cid.remote_comm_id = rep.local_comm_id
        cid.remote_ca_guid = rep.local_ca_guid
        cid.remote_qpn = rep.local_qpn
        cid.sq_psn = rep.starting_psn
        cid.initiator_depth = rep.responder_resources
        cid.responder_resources = rep.initiator_depth
        cid.rnr_retry_count = rep.rnr_retry_count
        cid.av_timeout = mad.ack_timeout(rep.target_ack_delay, max(cid.av_timeout - 1, 0))
        self._cm(cid, "mra_delayed")
        conn = {"private_data": rep.private_data.hex(),
                "responder_resources": rep.initiator_depth,
                "initiator_depth": rep.responder_resources,
                "flow_control": rep.end_to_end_flow_control, "retry_count": cid.retry_count,
                "rnr_retry_count": rep.rnr_retry_count, "srq": rep.srq,
                "qp_num": rep.local_qpn}  # fmt: skip
        self._emit(cid, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, conn=conn)

    def _rx_rtu(self, ctx: DeviceCtx, rtu: mad.Rtu, sgid: bytes, dgid: bytes, now: float) -> None:
        assert isinstance(rtu, mad.Rtu)
        cid = self._by_comm(ctx, rtu.remote_comm_id, "rtu")
        if cid is None:
            return
        if cid.cm == C.ESTABLISHED:
            self._duplicate(ctx, "rtu")
            return
        if not self._cm(cid, "rx_rtu"):
            self._unexpected(ctx, "rtu")
            return
        self._cancel(cid)
        conn = {"private_data": rtu.private_data.hex()}
        self._emit(cid, RDMA_CM_EVENT_ESTABLISHED, 0, conn=conn)

    def _rx_rej(self, ctx: DeviceCtx, rej: mad.Rej, sgid: bytes, dgid: bytes, now: float) -> None:
        assert isinstance(rej, mad.Rej)
        if rej.reason == mad.REJ_TIMEOUT and rej.reject_info_length >= 8:
            # cm_acquire_rejected_id: the sender may not have known our comm ID;
            # the ARI carries its CA GUID, which with its comm ID names the connection.
            guid = int.from_bytes(rej.ari[:8], "big")
            cid = self.by_remote.get((rej.local_comm_id, guid))
            if cid is None or cid.dev != ctx.name:
                ctx.device.hca.counters["cm_drop_unknown_rej"] += 1
                return
        else:
            cid = self._by_comm(ctx, rej.remote_comm_id, "rej")
            if cid is None:
                return
        if not self._cm(cid, "rx_rej"):
            self._unexpected(ctx, "rej")
            return
        self._cancel(cid)
        self._forget_remote(cid)
        if cid.cm == C.TIMEWAIT:
            self._timewait(cid)
        conn = {"private_data": rej.private_data.hex()}
        self._emit(cid, RDMA_CM_EVENT_REJECTED, rej.reason, conn=conn)

    def _rx_mra(self, ctx: DeviceCtx, mra: mad.Mra, sgid: bytes, dgid: bytes, now: float) -> None:
        assert isinstance(mra, mad.Mra)
        cid = self._by_comm(ctx, mra.remote_comm_id, "mra")
        if cid is None:
            return
        if cid.cm in (C.MRA_REQ_RCVD, C.MRA_REP_RCVD):
            self._duplicate(ctx, "mra")
            return
        if not self._cm(cid, "rx_mra"):
            self._unexpected(ctx, "mra")
            return
        # The peer needs more time: the outstanding REQ/REP waits longer before a resend.
        if cid.deadline is not None:
            cid.msg_timeout = (mad.ms_of(mra.service_timeout) + mad.ms_of(cid.av_timeout)) / 1e3
            cid.deadline = now + cid.msg_timeout

    def _rx_dreq(self, ctx: DeviceCtx, dreq: mad.Dreq, sgid: bytes, dgid: bytes,
                 now: float) -> None:  # fmt: skip
        assert isinstance(dreq, mad.Dreq)
        cid = self.by_comm.get(dreq.remote_comm_id)
        if cid is None or cid.dev != ctx.name or cid.remote_comm_id != dreq.local_comm_id:
            # cm_issue_drep: a DREQ for a connection we no longer know still gets its DREP
            ctx.device.hca.counters["cm_drop_unknown_dreq"] += 1
            drep = mad.Drep(tid=dreq.tid, local_comm_id=dreq.remote_comm_id,
                            remote_comm_id=dreq.local_comm_id)  # fmt: skip
            self._reply(ctx, drep, sgid, dgid)
            return
        if cid.cm == C.TIMEWAIT:
            self._duplicate(ctx, "dreq")
            self._send(cid, mad.Drep(tid=dreq.tid, local_comm_id=cid.local_comm_id,
                                     remote_comm_id=cid.remote_comm_id))  # fmt: skip
            return
        if cid.cm == C.DREQ_RCVD:
            self._duplicate(ctx, "dreq")
            return
        if not self._cm(cid, "rx_dreq"):
            self._unexpected(ctx, "dreq")
            return
        self._cancel(cid)
        cid.tid = dreq.tid
        if self._rdma(cid, "disconnected", strict=False):
            conn = {"private_data": dreq.private_data.hex()}
            self._emit(cid, RDMA_CM_EVENT_DISCONNECTED, 0, conn=conn)

    def _rx_drep(self, ctx: DeviceCtx, drep: mad.Drep, sgid: bytes, dgid: bytes,
                 now: float) -> None:  # fmt: skip
        assert isinstance(drep, mad.Drep)
        cid = self._by_comm(ctx, drep.remote_comm_id, "drep")
        if cid is None:
            return
        if not self._cm(cid, "rx_drep"):
            self._unexpected(ctx, "drep")
            return
        self._timewait(cid)
        if self._rdma(cid, "disconnected", strict=False):
            conn = {"private_data": drep.private_data.hex()}
            self._emit(cid, RDMA_CM_EVENT_DISCONNECTED, 0, conn=conn)

    def _rx_sidr_req(self, ctx: DeviceCtx, req: mad.SidrReq, sgid: bytes, dgid: bytes,
                     now: float) -> None:  # fmt: skip
        assert isinstance(req, mad.SidrReq)
        old = self.by_remote.get((req.request_id, int.from_bytes(sgid[8:], "big")))
        if old is not None:
            self._duplicate(ctx, "sidr_req")
            return
        ps, port = mad.split_service_id(req.service_id)
        try:
            cma = mad.CmaHeader.decode(req.private_data)
        except mad.MadError as exc:
            ctx.device.hca.counters[f"cm_drop_{exc.reason}"] += 1
            return
        listener = self._find_listener(ps, port, cma.dst_ip, ctx.name, sidr=True)
        if listener is None:
            rep = mad.SidrRep(tid=req.tid, request_id=req.request_id,
                              sidr_status=mad.SIDR_UNSUPPORTED, service_id=req.service_id)
            self._reply(ctx, rep, sgid, dgid)  # fmt: skip
            ctx.device.hca.counters["cm_rej_no_listener"] += 1
            return
        child = self._child(listener, ctx, cma, IBV_QPT_UD, req.service_id)
        self._cm(child, "rx_sidr_req")
        child.tid = req.tid
        child.remote_comm_id = req.request_id
        child.remote_ca_guid = int.from_bytes(sgid[8:], "big")
        gids = ctx.gids
        child.path = Path(dgid, sgid, gids.index(dgid) if dgid in gids else 0, ctx.mtu,
                          pkey=req.pkey)  # fmt: skip
        self.by_remote[(child.remote_comm_id, child.remote_ca_guid)] = child
        ud = {"private_data": req.private_data[mad.CMA_HEADER_SIZE:].hex(), "qp_num": 0,
              "qkey": 0}  # fmt: skip
        self._emit(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, target=listener,
                   child=child.info(), ud=ud)  # fmt: skip

    def _rx_sidr_rep(self, ctx: DeviceCtx, rep: mad.SidrRep, sgid: bytes, dgid: bytes,
                     now: float) -> None:  # fmt: skip
        assert isinstance(rep, mad.SidrRep)
        cid = self._by_comm(ctx, rep.request_id, "sidr_rep")
        if cid is None:
            return
        if not self._cm(cid, "rx_sidr_rep"):
            self._unexpected(ctx, "sidr_rep")
            return
        self._cancel(cid)
        if self.by_comm.get(cid.local_comm_id) is cid:
            del self.by_comm[cid.local_comm_id]
        if rep.sidr_status != mad.SIDR_SUCCESS:
            self._emit(cid, RDMA_CM_EVENT_UNREACHABLE, rep.sidr_status,
                       ud={"private_data": rep.private_data.hex()})  # fmt: skip
            return
        if cid.qkey and rep.qkey != cid.qkey:
            self._emit(cid, RDMA_CM_EVENT_ADDR_ERROR, -errno.EINVAL)
            return
        cid.qkey = rep.qkey
        p = cid.path
        assert p is not None
        ah = {"dgid": p.dgid.hex(), "sgid_index": p.sgid_index, "flow_label": p.flow_label,
              "hop_limit": p.hop_limit, "traffic_class": p.tclass, "port_num": 1,
              "is_global": 1}  # fmt: skip
        ud = {"private_data": rep.private_data.hex(), "qp_num": rep.qpn, "qkey": rep.qkey,
              "ah_attr": ah}  # fmt: skip
        self._emit(cid, RDMA_CM_EVENT_ESTABLISHED, 0, ud=ud)

    # --- introspection -----------------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return [c.info() for c in self.ids.values()]
