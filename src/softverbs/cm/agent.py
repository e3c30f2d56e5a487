"""The CM agent: what the kernel's ``rdma_cm`` and ``ib_cm`` do, in the device.

One :class:`CmAgent` serves one world of devices (a process's registry, a
simulation, or the device service).  It is two composed parts, as the
kernel's CM is two modules, each with its own state machine per ID
(:class:`~softverbs.cm.ids.CmId` holds both):

* **rdma_cm** -- this class: the CM IDs, the port spaces and the listeners,
  IP addresses resolved to devices and GIDs, multicast joins, options and
  the QP attributes of ``rdma_init_qp_attr``.  Its machine
  (:class:`RdmaState`: IDLE, ADDR_BOUND, ADDR_QUERY, ADDR_RESOLVED,
  ROUTE_QUERY, ROUTE_RESOLVED, CONNECT, DISCONNECT, LISTEN) is driven by the
  user's calls -- :data:`RDMA_TRANSITIONS` (:meth:`CmAgent.move`).
* **ib_cm** -- :class:`~softverbs.cm.ibcm.IbCm` (``agent.ib``): the MADs,
  their timers and the connection machine (:class:`CmState`: REQ_SENT,
  REP_RCVD, ESTABLISHED, DREQ_SENT, TIMEWAIT ...), driven by the MADs sent
  and received and by timeouts -- :data:`CM_TRANSITIONS`.  A MAD that its
  ID's state does not expect is counted (``cm_drop_unexpected``) and
  dropped, never raised.  What it hands up (a listener for a request, a new
  ID, an event, an rdma_cm state change) it asks of this class.

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
:meth:`IbCm.flush` (for user calls) or by QP1 itself (for received MADs
and timers, which already hold the device lock).  The order is always
device lock, then agent lock.

Commands take and return plain values (addresses as ``[ip, port]``, private
data as hex), so the same agent serves in-process users directly and other
processes through ``softverbsd`` (the ``CM_*`` records: :mod:`softverbs.cm.wire`).
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
from typing import Any

from softverbs.cm import mad
from softverbs.cm.gsi import GsiQP
from softverbs.cm.ibcm import IbCm
from softverbs.cm.ids import (
    IBOE_PACKET_LIFETIME,
    MAX_INITIATOR,
    MAX_RESPONDER,
    RDMA_MAX_INIT_DEPTH,
    RDMA_MAX_RESP_RES,
    RDMA_UDP_QKEY,
    Addr,
    CmId,
    DeviceCtx,
    Path,
    Sink,
    _addr_out,
)
from softverbs.cm.route import (
    Router,
    World,
    cm_error,
    gid_of,
    is_any,
    is_wildcard,
)
from softverbs.cm.states import (
    CONNECTED_STATES,
    RDMA_TRANSITIONS,
    C,
    RdmaState,
)
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
    RDMA_CM_EVENT_MULTICAST_JOIN,
    RDMA_CM_EVENT_ROUTE_RESOLVED,
    RDMA_MC_JOIN_FLAG_FULLMEMBER,
    RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
    RDMA_OPTION_ID,
    RDMA_OPTION_ID_ACK_TIMEOUT,
    RDMA_OPTION_ID_AFONLY,
    RDMA_OPTION_ID_REUSEADDR,
    RDMA_OPTION_ID_TOS,
    RDMA_PS_TCP,
    RDMA_PS_UDP,
)
from softverbs.errors import PyverbsRDMAError
from softverbs.wire.packet import IPV4_MAPPED_PREFIX

log = logging.getLogger(__name__)

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


def _first_v4_index(gids: list[bytes]) -> int:
    """The index of a device's first IPv4 (mapped) GID, else 0."""
    return next((i for i, g in enumerate(gids) if g[:12] == IPV4_MAPPED_PREFIX), 0)


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
        self.lock = threading.RLock()
        self.ids: dict[int, CmId] = {}
        self.devices: dict[str, DeviceCtx] = {}
        self.binds: dict[tuple[int, int], list[CmId]] = {}
        self._next_handle = 1
        self.routes = Router(world, self._gids_of)
        self._last_port = 0
        #: ib_cm: the connections' MADs, timers and states (it calls back into this one)
        self.ib = IbCm(self, hi_tid if hi_tid is not None else self.rng.randrange(1, 0x10000))

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
            gsi = GsiQP.attach(dev.hca, dev.mtu, self.ib, name)
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

    def move(self, cid: CmId, action: str, strict: bool = True) -> bool:
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
        port = self._take_port(cid, ip, port, dev)
        cid.src = (ip, port)
        cid.dev = dev
        self.move(cid, "bind")

    def _take_port(self, cid: CmId, ip: bytes, port: int, dev: str | None) -> int:
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
            self._check_port(cid, ip, dev, port, self.binds.get((ps, port), []),
                             cid.reuseaddr)  # fmt: skip
        self.binds.setdefault((ps, port), []).append(cid)
        cid.bound = (ps, port)
        return port

    @staticmethod
    def _check_port(cid: CmId, ip: bytes, dev: str | None, port: int, owners: list[CmId],
                    reuse: bool) -> None:  # fmt: skip
        """``cma_check_port``: may ``cid`` hold ``ip``:``port`` (on ``dev``) next
        to its other owners?  Two IDs that both set REUSEADDR share it; two AFONLY
        IDs of different families never conflict; otherwise a wildcard address
        (:func:`is_wildcard`) on either side is EADDRNOTAVAIL and the same
        address EADDRINUSE."""
        for other in owners:
            if other is cid or other.src is None:
                continue
            if reuse and other.reuseaddr:
                continue
            oip = other.src[0]
            if cid.afonly and other.afonly and len(ip) != len(oip):
                continue
            if is_wildcard(ip, dev) or is_wildcard(oip, other.dev):
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
            self.move(cid, "resolve_addr")
            cid.dst = d
            if status:
                self.move(cid, "addr_error")
                self.emit(cid, RDMA_CM_EVENT_ADDR_ERROR, status)
                return
            assert cid.src is not None and src_ip is not None
            cid.src = (src_ip, cid.src[1])
            cid.dev = dev
            self.move(cid, "addr_resolved")
            self.emit(cid, RDMA_CM_EVENT_ADDR_RESOLVED, 0, info=cid.info())

    def resolve_route(self, handle: int, timeout_ms: int = 2000, owner: object = None) -> None:
        with self.lock:
            cid = self._get(handle, owner)
            dev = cid.dev
        if dev is None:
            raise cm_error("resolve_route: resolve the address first", errno.EINVAL)
        ctx = self.device(dev)
        with self.lock:
            cid = self._get(handle, owner)
            self.move(cid, "resolve_route")
            assert cid.src is not None and cid.dst is not None
            sgid, dgid = gid_of(cid.src[0]), gid_of(cid.dst[0])
            gids = ctx.gids
            flow = (cid.src[1] * 31 + cid.dst[1]) & 0xFFFFF  # cma_get_roce_udp_flow_label
            plt = cid.timeout_opt - 1 if cid.timeout_set else IBOE_PACKET_LIFETIME
            cid.path = Path(sgid, dgid, gids.index(sgid) if sgid in gids else 0, ctx.mtu,
                            flow, 64, cid.tos, 0xFFFF, max(plt, 0))  # fmt: skip
            cid.av_timeout = cid.path.packet_life_time + 1
            self.move(cid, "route_resolved")
            self.emit(cid, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, info=cid.info())

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
                self._check_port(cid, cid.src[0], cid.dev, cid.src[1], self.binds[cid.bound],
                                 False)  # fmt: skip
            self.move(cid, "listen")
            cid.backlog = backlog
            self.ib.move(cid, "listen")
            return cid.info()

    def find_listener(self, ps: int, port: int, dst_ip: bytes, dev: str,
                       sidr: bool) -> CmId | None:  # fmt: skip
        for cid in self.binds.get((ps, port), []):
            if cid.state != RdmaState.LISTEN or cid.src is None:
                continue
            if cid.dev is not None and cid.dev != dev:
                continue
            ip = cid.src[0]
            # cma_match_private_data: a wildcard listener without AFONLY takes
            # both families; otherwise the request's family must be its own
            wild = is_wildcard(ip, cid.dev)
            if not (wild and not cid.afonly) and (
                    len(ip) != len(dst_ip) or not (wild or ip == dst_ip)):  # fmt: skip
                continue
            if sidr != (cid.qp_type == IBV_QPT_UD):
                continue
            return cid
        return None

    # --- connecting -----------------------------------------------------------------------
    def connect(self, handle: int, param: dict[str, Any], owner: object = None) -> None:
        with self.lock:
            cid = self._get(handle, owner)
            if cid.qp_type != IBV_QPT_UD:
                param = self.rd_atomic(cid, param, "connect", connecting=True)
            self.move(cid, "connect")
            try:
                if cid.qp_type == IBV_QPT_UD:
                    self.ib.send_sidr_req(cid, param)
                else:
                    self.ib.send_req(cid, param)
            except PyverbsRDMAError:
                self.move(cid, "connect_failed")
                raise
        self.ib.flush()

    def ctx_of(self, cid: CmId) -> DeviceCtx:
        ctx = self.devices.get(cid.dev or "")
        if ctx is None:
            raise cm_error("the CM ID is not bound to a device", errno.EINVAL)
        return ctx

    def accept(self, handle: int, param: dict[str, Any], owner: object = None) -> None:
        """``rdma_accept``, the passive side: a REP (RC) or a SIDR_REP (UD)."""
        with self.lock:
            cid = self._get(handle, owner)
            if cid.state != RdmaState.CONNECT:
                raise cm_error(f"accept: the CM ID is in state {cid.state.name}", errno.EINVAL)
            if cid.cm == C.SIDR_REQ_RCVD:
                self.ib.send_sidr_rep(cid, mad.SIDR_SUCCESS, param)
            elif cid.cm in (C.REQ_RCVD, C.MRA_REQ_SENT):
                self.ib.send_rep(cid, self.rd_atomic(cid, param, "accept"))
            else:
                raise cm_error(f"accept: the connection is in state {cid.cm.name}", errno.EINVAL)
        self.ib.flush()

    def establish(self, handle: int, owner: object = None) -> None:
        """``rdma_establish`` (and librdmacm after a CONNECT_RESPONSE on an ID
        with a QP): the active side's RTU."""
        with self.lock:
            cid = self._get(handle, owner)
            if cid.state != RdmaState.CONNECT or cid.cm not in (C.REP_RCVD, C.MRA_REP_SENT):
                raise cm_error(f"establish: the connection is in state {cid.cm.name}, not "
                               "REP_RCVD", errno.EINVAL)  # fmt: skip
            self.ib.send_rtu(cid)
        self.ib.flush()

    def reject(self, handle: int, private_data: str = "", owner: object = None) -> None:
        with self.lock:
            cid = self._get(handle, owner)
            self.ib.reject(cid, bytes.fromhex(private_data or ""))
        self.ib.flush()

    def disconnect(self, handle: int, owner: object = None) -> None:
        """``rdma_disconnect``: a DREQ, or the DREP to the peer's DREQ."""
        with self.lock:
            cid = self._get(handle, owner)
            if cid.state not in (RdmaState.CONNECT, RdmaState.DISCONNECT):
                raise cm_error(f"disconnect: the CM ID is in state {cid.state.name}",
                               errno.EINVAL)  # fmt: skip
            if cid.cm == C.ESTABLISHED:
                self.ib.send_dreq(cid)
            elif cid.cm == C.DREQ_RCVD:
                self.ib.send_drep(cid)
            # any other state: nothing to send, as rdma_disconnect ignores the error
        self.ib.flush()

    def destroy_id(self, handle: int, owner: object = None) -> None:
        """``rdma_destroy_id``: tell the peer as ``cm_destroy_id`` does, then forget."""
        with self.lock:
            cid = self._get(handle, owner)
            self._destroy(cid)
        self.ib.flush()

    def _destroy(self, cid: CmId) -> None:
        self.ib.destroy(cid)
        self.move(cid, "destroy", strict=False)
        self._release_port(cid)
        self.ids.pop(cid.handle, None)

    def drop_owner(self, owner: object) -> None:
        """A process is gone: destroy every ID it held."""
        with self.lock:
            for cid in [c for c in self.ids.values() if c.owner is owner]:
                self._destroy(cid)
        self.ib.flush()

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
            self.emit(cid, RDMA_CM_EVENT_MULTICAST_JOIN, 0, ud=ud, mc=_addr_out(a),
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

    # --- connection parameters and QP attributes --------------------------------------------
    @staticmethod
    def rd_atomic(cid: CmId, param: dict[str, Any], what: str,
                  connecting: bool = False) -> dict[str, Any]:  # fmt: skip
        """``param`` with its responder resources and initiator depth decided:
        what librdmacm's ``ucma_valid_param``, ``rdma_connect`` and
        ``rdma_accept`` decide, here once for both user halves.  A value above
        the device's is EINVAL; RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH (0xFF)
        leave the choice to the device: its limits when ``connecting``, else
        the ID's own -- when accepting, what the REQ asked for within the
        device's limits (set on the ID when the REQ arrived)."""
        out = dict(param)
        for key, limit, default, passive in (
            ("responder_resources", MAX_RESPONDER, RDMA_MAX_RESP_RES, cid.responder_resources),
            ("initiator_depth", MAX_INITIATOR, RDMA_MAX_INIT_DEPTH, cid.initiator_depth),
        ):  # fmt: skip
            value = int(param.get(key, default))
            if value == default:
                value = limit if connecting else passive
            elif value > limit:
                raise cm_error(f"{what}: {key} {value} exceeds the device's {limit}",
                               errno.EINVAL)  # fmt: skip
            out[key] = value
        return out

    def init_qp_attr(self, handle: int, qp_state: int,
                     responder_resources: int = RDMA_MAX_RESP_RES,
                     initiator_depth: int = RDMA_MAX_INIT_DEPTH,
                     owner: object = None) -> dict[str, Any]:  # fmt: skip
        """``rdma_init_qp_attr``: the attributes and mask for ``qp_state``.
        ``rdma_accept`` moves its QP before the REP carries its parameters,
        so it passes them here (as librdmacm overrides the kernel's answer
        with them); 0xFF is the ID's own."""
        with self.lock:
            cid = self._get(handle, owner)
            if cid.dev is None:
                raise cm_error("init_qp_attr: the CM ID has no device yet", errno.EINVAL)
            if cid.qp_type == IBV_QPT_UD:
                return self._qp_attr(cid, qp_state, 0, 0)
            asked = {"responder_resources": responder_resources,
                     "initiator_depth": initiator_depth}  # fmt: skip
            p = self.rd_atomic(cid, asked, "init_qp_attr")
            return self._qp_attr(cid, qp_state, p["responder_resources"], p["initiator_depth"])

    def _qp_attr(self, cid: CmId, qp_state: int, resources: int,
                 depth: int) -> dict[str, Any]:  # fmt: skip
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
                if resources:
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
                    max_dest_rd_atomic=resources, min_rnr_timer=0,
                )  # fmt: skip
                mask = (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN
                        | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
            else:
                attr.update(sq_psn=cid.sq_psn, retry_cnt=cid.retry_count,
                            rnr_retry=cid.rnr_retry_count, max_rd_atomic=depth,
                            timeout=cid.timeout_opt if cid.timeout_set else cid.av_timeout)
                mask = (IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY
                        | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_TIMEOUT)  # fmt: skip
        else:
            raise cm_error(f"no CM attributes for QP state {qp_state} while the connection "
                           f"is {cid.cm.name}", errno.EINVAL)  # fmt: skip
        return {"attr": attr, "mask": int(mask)}

    # --- events ----------------------------------------------------------------------------
    def emit(self, cid: CmId, event: int, status: int, target: CmId | None = None,
              **extra: Any) -> None:  # fmt: skip
        ev: dict[str, Any] = {"handle": (target or cid).handle, "event": int(event),
                              "status": int(status)}  # fmt: skip
        ev.update(extra)
        try:
            (target or cid).sink(ev)
        except Exception:  # a sink that fails (a dead client) must not stop the agent
            log.debug("CM event sink failed", exc_info=True)

    def new_child(self, listener: CmId, ctx: DeviceCtx, cma: mad.CmaHeader, qp_type: int,
               sid: int) -> CmId:  # fmt: skip
        handle = self._next_handle
        self._next_handle += 1
        child = CmId(handle, listener.ps, qp_type, listener.sink, listener.owner)
        self.ids[handle] = child
        child.listener = listener
        child.dev = ctx.name
        self.move(child, "req_received")
        assert listener.src is not None
        child.src = (cma.dst_ip, listener.src[1])
        child.dst = (cma.src_ip, cma.src_port)
        child.service_id = sid
        child.local_comm_id = self.ib.new_comm_id()
        self.ib.by_comm[child.local_comm_id] = child
        child.timeout_set, child.timeout_opt = listener.timeout_set, listener.timeout_opt
        return child

    # --- introspection -----------------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return [c.info() for c in self.ids.values()]
