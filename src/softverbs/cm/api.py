"""``pyverbs.cmid``: the RDMA CM as pyverbs exposes it, with librdmacm's semantics.

The objects (:class:`CMID`, :class:`CMEventChannel`, :class:`CMEvent`,
:class:`AddrInfo`, :class:`ConnParam`, :class:`UDParam`,
:class:`JoinMCAttrEx`) have pyverbs' names and constructor shapes.  Behind
them this module does what librdmacm does in user space:

* ``rdma_getaddrinfo`` (:class:`AddrInfo`) resolves names and services with
  the system resolver; the port space picks RC (TCP) or UD (UDP).
* The QP of a CM ID is an ordinary softverbs :class:`~softverbs.verbs.qp.QP`.
  Its state changes are made here, with the attributes the agent computes
  (``rdma_init_qp_attr``): INIT when it is created, RTR and RTS on accept or
  when the REP arrives, ERR on reject and disconnect -- as librdmacm does.
  This module computes no attribute and no default: the agent also decides
  the responder resources and initiator depth (0xFF: the device's choice),
  and ``accept`` passes its values with ``init_qp_attr`` (docs/cm.md).
* ``rdma_get_cm_event`` post-processing: a CONNECT_REQUEST creates the new
  CM ID; a CONNECT_RESPONSE on an ID with a QP moves the QP to RTS, sends
  the RTU and becomes ESTABLISHED (an ID without a QP reports it, and
  :meth:`CMID.establish` finishes); ADDR_RESOLVED binds the ID to the
  device's shared context and protection domain.
* IDs made by ``rdma_create_ep`` (:class:`CMID` from an :class:`AddrInfo`)
  are synchronous: each call waits for its event on a private channel, and
  an error event becomes an exception (a REJECT is ECONNREFUSED).

The agent that sends and receives the CM MADs runs in the device -- in this
process, or in ``softverbsd`` for served devices (:mod:`softverbs.cm.kernel`).
* Multicast: ``join_multicast`` asks the agent to join (a local join, as the
  kernel's rdma_cm does on RoCE); the MULTICAST_JOIN event carries the
  group's address vector, QP 0xFFFFFF and the Q_Key, and -- as librdmacm's
  ``ucma_process_join`` does -- the ID's QP is attached to the group when the
  event is read, unless the join was send-only (an attach that fails turns
  the event into MULTICAST_ERROR).  ``leave_multicast`` detaches the QP and
  leaves; leaving a group the ID did not join is EADDRNOTAVAIL.

softverbs additions: ``CMEventChannel.get_event(timeout)``,
``CMEvent(channel, timeout=...)``, ``CMEvent.status``, ``CMEvent.id``,
``CMEvent.listen_id``, ``CMID.qp``, ``CMID.src_addr``/``dst_addr``.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import threading
import weakref
from collections import deque
from typing import Any

from softverbs.cm.kernel import Kernel, kernel_for
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QP_STATE,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPT_RC,
    IBV_QPT_UD,
    IBV_SEND_SIGNALED,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
    RAI_NUMERICHOST,
    RAI_PASSIVE,
    RDMA_CM_EVENT_ADDR_ERROR,
    RDMA_CM_EVENT_ADDR_RESOLVED,
    RDMA_CM_EVENT_CONNECT_ERROR,
    RDMA_CM_EVENT_CONNECT_REQUEST,
    RDMA_CM_EVENT_CONNECT_RESPONSE,
    RDMA_CM_EVENT_DISCONNECTED,
    RDMA_CM_EVENT_ESTABLISHED,
    RDMA_CM_EVENT_MULTICAST_ERROR,
    RDMA_CM_EVENT_MULTICAST_JOIN,
    RDMA_CM_EVENT_REJECTED,
    RDMA_CM_EVENT_ROUTE_RESOLVED,
    RDMA_CM_EVENT_UNREACHABLE,
    RDMA_CM_JOIN_MC_ATTR_ADDRESS,
    RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
    RDMA_MC_JOIN_FLAG_FULLMEMBER,
    RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
    RDMA_OPTION_ID_ACK_TIMEOUT,
    RDMA_OPTION_ID_AFONLY,
    RDMA_OPTION_ID_REUSEADDR,
    RDMA_OPTION_ID_TOS,
    RDMA_PS_IPOIB,
    RDMA_PS_TCP,
    RDMA_PS_UDP,
    rdma_cm_event_type,
)
from softverbs.errors import PyverbsError, PyverbsRDMAError, PyverbsUserError, einval
from softverbs.verbs.base import PyverbsCM, PyverbsObject

#: rdma_cma.h: "the device decides" (the agent does: docs/cm.md)
RDMA_MAX_RESP_RES = 0xFF
RDMA_MAX_INIT_DEPTH = 0xFF
RDMA_UDP_QKEY = 0x01234567


def _kernel() -> Kernel:
    from softverbs.verbs import world

    return kernel_for(world.active())


def _fail(msg: str, exc: PyverbsRDMAError) -> PyverbsRDMAError:
    """pyverbs' message for the verb, keeping softverbs' reason and the errno."""
    reason = str(exc).split(". Errno:")[0]
    return PyverbsRDMAError(f"{msg}: {reason}", exc.error_code)


def _uint(name: str, value: Any, bits: int) -> int:
    """``value`` as the C unsigned field it fills, or PyverbsUserError."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << bits):
        raise PyverbsUserError(f"{name} must be an integer in 0..{(1 << bits) - 1}, "
                               f"got {value!r}")  # fmt: skip
    return value


def _qp_type_of(ps: int) -> int:
    """``ucma_get_qp_type``: the QP type a port space implies."""
    return IBV_QPT_RC if ps == RDMA_PS_TCP else IBV_QPT_UD if ps in (RDMA_PS_UDP, RDMA_PS_IPOIB) \
        else 0  # fmt: skip


# --------------------------------------------------------------------------
# device contexts shared by all CM IDs of this process (librdmacm's cma_device)

_devices: weakref.WeakKeyDictionary[Kernel, dict[str, tuple[Any, Any]]] = (
    weakref.WeakKeyDictionary()
)
_devices_lock = threading.Lock()


def _device(kernel: Kernel, name: str) -> tuple[Any, Any]:
    """(Context, PD) for device ``name``, opened once per process and world."""
    from softverbs.verbs.device import Context
    from softverbs.verbs.pd import PD

    with _devices_lock:
        table = _devices.setdefault(kernel, {})
        entry = table.get(name)
        if entry is not None and not entry[0].closed and not entry[1].closed:
            return entry
        ctx = Context(name=name)
        pd = PD(ctx)
        table[name] = (ctx, pd)
        return ctx, pd


def _reset_after_fork() -> None:
    global _devices, _devices_lock
    _devices = weakref.WeakKeyDictionary()
    _devices_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


# --------------------------------------------------------------------------
# parameters


class ConnParam(PyverbsObject):
    """``rdma_conn_param``: ``ConnParam(resources, depth, flow_control, retry,
    rnr_retry, srq, qp_num, data_len)``; private data of at most ``data_len``
    bytes is set with :meth:`set_private_data`."""

    def __init__(self, resources: int = 1, depth: int = 1, flow_control: int = 0,
                 retry: int = 5, rnr_retry: int = 5, srq: int = 0, qp_num: int = 0,
                 data_len: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.responder_resources = _uint("resources", resources, 8)
        self.initiator_depth = _uint("depth", depth, 8)
        self.flow_control = _uint("flow_control", flow_control, 8)
        self.retry_count = _uint("retry", retry, 8)
        self.rnr_retry_count = _uint("rnr_retry", rnr_retry, 8)
        self.srq = _uint("srq", srq, 8)
        self.qp_num = _uint("qp_num", qp_num, 32)
        self.data = bytearray(_uint("data_len", data_len, 8))
        self._private = b""

    @property
    def qpn(self) -> int:
        return self.qp_num

    @qpn.setter
    def qpn(self, val: int) -> None:
        self.qp_num = val

    @property
    def private_data(self) -> bytes:
        return self._private

    def set_private_data(self, data: bytes | bytearray | str) -> None:
        """Copy up to ``data_len`` bytes of ``data`` (pyverbs' rule)."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise PyverbsUserError(f"private data must be bytes, got {type(data).__name__}")
        n = min(len(self.data), len(data))
        if n == 0:
            return
        self.data[:] = bytes(len(self.data))
        self.data[:n] = data[:n]
        self._private = bytes(self.data[:n])

    def to_kernel(self) -> dict[str, Any]:
        return {"responder_resources": self.responder_resources,
                "initiator_depth": self.initiator_depth, "flow_control": self.flow_control,
                "retry_count": self.retry_count, "rnr_retry_count": self.rnr_retry_count,
                "srq": self.srq, "qp_num": self.qp_num,
                "private_data": self._private.hex()}  # fmt: skip

    def __str__(self) -> str:
        f = "{:<4}: {:<4}\n"
        return ("Connection parameters: \n"
                + f.format("responder resources", self.responder_resources)
                + f.format("initiator depth", self.initiator_depth)
                + f.format("flow control", self.flow_control)
                + f.format("retry count", self.retry_count)
                + f.format("rnr retry count", self.rnr_retry_count)
                + f.format("srq", self.srq) + f.format("qp number", self.qp_num))  # fmt: skip


class UDParam(PyverbsObject):
    """``rdma_ud_param`` of an event: ``UDParam(cm_event)`` -> qp_num, qkey, ah_attr."""

    def __init__(self, cm_event: CMEvent) -> None:
        super().__init__()
        if not isinstance(cm_event, CMEvent):
            raise PyverbsUserError(f"UDParam needs a CMEvent, got {type(cm_event).__name__}")
        ud = cm_event._ud or {}
        self._qp_num = int(ud.get("qp_num", 0))
        self._qkey = int(ud.get("qkey", 0))
        self._ah = dict(ud.get("ah_attr") or {})

    @property
    def qp_num(self) -> int:
        return self._qp_num

    @property
    def qkey(self) -> int:
        return self._qkey

    @property
    def ah_attr(self) -> Any:
        return _ah_attr(self._ah)


def _qp_attr_of(got: dict[str, Any]) -> tuple[Any, int]:
    """The agent's answer to ``init_qp_attr`` as (QPAttr, mask)."""
    from softverbs.verbs.addr import GID, AHAttr, GlobalRoute
    from softverbs.verbs.qp import QPAttr

    attr = QPAttr()
    for key, value in got["attr"].items():
        if key == "ah_attr":
            gr = GlobalRoute(dgid=GID.from_raw(bytes.fromhex(value["dgid"])),
                             flow_label=value["flow_label"], sgid_index=value["sgid_index"],
                             hop_limit=value["hop_limit"],
                             traffic_class=value["traffic_class"])  # fmt: skip
            attr.ah_attr = AHAttr(is_global=1, port_num=value["port_num"], gr=gr)
        else:
            setattr(attr, key, value)
    return attr, int(got["mask"])


def _ah_attr(d: dict[str, Any]) -> Any:
    from softverbs.verbs.addr import GID, AHAttr, GlobalRoute

    if not d:
        return AHAttr()
    gr = GlobalRoute(dgid=GID.from_raw(bytes.fromhex(d["dgid"])), flow_label=d["flow_label"],
                     sgid_index=d["sgid_index"], hop_limit=d["hop_limit"],
                     traffic_class=d["traffic_class"])  # fmt: skip
    return AHAttr(is_global=1, port_num=int(d.get("port_num", 1)), gr=gr)


class AddrInfo(PyverbsObject):
    """``rdma_getaddrinfo``: ``AddrInfo(src, dst, src_service, dst_service,
    port_space, flags)``.  With ``RAI_PASSIVE`` only the source is resolved
    (a wildcard address if ``src`` is None)."""

    def __init__(self, src: str | bytes | None = None, dst: str | bytes | None = None,
                 src_service: str | bytes | int | None = None,
                 dst_service: str | bytes | int | None = None, port_space: int = 0,
                 flags: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.port_space = _uint("port_space", port_space, 32) or RDMA_PS_TCP
        if self.port_space not in (RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IPOIB, 0x013F):
            raise PyverbsRDMAError("Failed to get Address Info: unknown port space "
                                   f"{port_space:#x}", errno.EINVAL)  # fmt: skip
        self.qp_type = _qp_type_of(self.port_space)
        self.flags = _uint("flags", flags, 32)
        for name, value in (("src", src), ("dst", dst)):
            if value is not None and not isinstance(value, (str, bytes)):
                raise PyverbsUserError(f"{name} must be a str, got {type(value).__name__}")
        self.src_addr: tuple[str, int] | None = None
        self.dst_addr: tuple[str, int] | None = None
        self._closed = False
        if flags & RAI_PASSIVE:
            self.src_addr = self._lookup(src, src_service, True)
            return
        if src is not None:
            self.src_addr = self._lookup(src, src_service, True)
        if dst is not None or dst_service is not None or src is None:
            self.dst_addr = self._lookup(dst, dst_service, False)
        if (self.src_addr is not None and self.dst_addr is not None
                and _family(self.src_addr[0]) != _family(self.dst_addr[0])):  # fmt: skip
            raise PyverbsRDMAError("Failed to get Address Info: source and destination are "
                                   "of different address families", errno.EINVAL)  # fmt: skip

    def _lookup(self, node: Any, service: Any, passive: bool) -> tuple[str, int]:
        if isinstance(node, bytes):
            node = node.decode()
        if isinstance(service, bytes):
            service = service.decode()
        flags = socket.AI_PASSIVE if passive else 0
        if self.flags & RAI_NUMERICHOST:
            flags |= socket.AI_NUMERICHOST
        kind = socket.SOCK_STREAM if self.port_space == RDMA_PS_TCP else socket.SOCK_DGRAM
        try:
            res = socket.getaddrinfo(node, service, socket.AF_UNSPEC, kind, 0, flags)
        except (socket.gaierror, UnicodeError, TypeError) as exc:
            code = errno.EADDRNOTAVAIL if isinstance(exc, socket.gaierror) else errno.EINVAL
            raise PyverbsRDMAError(f"Failed to get Address Info: {node!r}, {service!r}: {exc}",
                                   code) from None  # fmt: skip
        if node is None and passive:  # a passive wildcard: IPv4, as librdmacm's users expect
            res = sorted(res, key=lambda r: r[0] != socket.AF_INET)
        sockaddr = res[0][4]
        return str(sockaddr[0]).split("%")[0], int(sockaddr[1])

    def close(self) -> None:
        self._closed = True


def _family(ip: str) -> int:
    return ipaddress.ip_address(ip).version


class JoinMCAttrEx(PyverbsObject):
    """``rdma_cm_join_mc_attr_ex``: ``JoinMCAttrEx(addr, comp_mask, join_flags)``."""

    def __init__(self, addr: AddrInfo, comp_mask: int = 0, join_flags: int = 0) -> None:
        super().__init__()
        if not isinstance(addr, AddrInfo):
            raise PyverbsUserError(f"addr must be an AddrInfo, got {type(addr).__name__}")
        self.addr = addr
        self.comp_mask = _uint("comp_mask", comp_mask, 32)
        self.join_flags = _uint("join_flags", join_flags, 32)


# --------------------------------------------------------------------------
# the librdmacm side of one CM ID


class _Mcast:
    """librdmacm's ``cma_multicast``: one group an ID joined."""

    def __init__(self, addr: tuple[str, int], flags: int, context: int) -> None:
        self.addr = addr
        self.flags = flags
        self.context = context
        self.mgid: bytes | None = None  #: known from the MULTICAST_JOIN event
        self.attached = False

    def matches(self, raw: Any) -> bool:
        try:
            ip, port = raw
        except (TypeError, ValueError):
            return False
        return _same_ip(str(ip), self.addr[0]) and int(port) == self.addr[1]


def _same_ip(a: str, b: str) -> bool:
    return ipaddress.ip_address(a) == ipaddress.ip_address(b)


class _Id:
    """librdmacm's ``cma_id_private``: one CM ID and what user space holds for it."""

    def __init__(self, kernel: Kernel, handle: int, channel: CMEventChannel, sync: bool,
                 ps: int, qp_type: int) -> None:  # fmt: skip
        self.kernel = kernel
        self.handle = handle
        self.channel = channel
        self.sync = sync
        self.ps = ps
        self.qp_type = qp_type
        self.info: dict[str, Any] = {}
        self.ctx: Any = None
        self.pd: Any = None
        self.qp: Any = None
        self.srq: Any = None
        self.send_cq: Any = None
        self.recv_cq: Any = None
        self.send_channel: Any = None
        self.recv_channel: Any = None
        self.own_cqs: list[Any] = []
        self.qp_init_attr: Any = None
        self.event: CMEvent | None = None
        self.remote_ece = (0, 0)
        self.local_ece = (0, 0)
        self.connect_error = False
        self.destroyed = False
        #: librdmacm's ``cma_multicast`` list: the groups joined, in join order
        self.mcast: list[_Mcast] = []
        channel._attach(self)

    # --- kernel calls ---------------------------------------------------------------
    def call(self, cmd: str, what: str, **kw: Any) -> Any:
        if self.destroyed:
            raise PyverbsRDMAError(f"{what}: the CM ID was destroyed", errno.EINVAL)
        try:
            return self.kernel.call(cmd, handle=self.handle, **kw)
        except PyverbsRDMAError as exc:
            raise _fail(what, exc) from None

    @property
    def dev(self) -> str | None:
        dev = self.info.get("dev")
        return str(dev) if dev else None

    def attach_device(self, info: dict[str, Any]) -> None:
        """``ucma_query_addr``/``ucma_get_device``: the ID's device, shared context and PD."""
        self.info = dict(info)
        dev = self.dev
        if dev is None or self.ctx is not None:
            return
        ctx, pd = _device(self.kernel, dev)
        self.ctx = ctx
        if self.pd is None:
            self.pd = pd

    def query(self) -> None:
        self.attach_device(self.call("query", "Failed to query the CM ID"))

    # --- sync completion ----------------------------------------------------------------
    def complete(self) -> None:
        """``ucma_complete``: a synchronous ID waits for its event here."""
        if not self.sync:
            return
        if self.event is not None:
            self.event._ack_quietly()
            self.event = None
        ev = self.channel._next(None)
        self.event = ev
        if ev.status:
            if ev.event_type == RDMA_CM_EVENT_REJECTED:
                raise PyverbsRDMAError("the connection was rejected", errno.ECONNREFUSED)
            code = -ev.status if ev.status < 0 else ev.status
            raise PyverbsRDMAError(f"{ev.event_str()} (status {ev.status})", code)

    # --- the QP -----------------------------------------------------------------------
    def qp_attr(self, state: int, param: ConnParam | None = None) -> tuple[Any, int]:
        """The agent's attributes and mask for ``state`` (``rdma_init_qp_attr``);
        ``rdma_accept`` passes its parameters, which the agent decides on."""
        return _qp_attr_of(self.call(
            "init_qp_attr", "Failed to get QP attributes", qp_state=int(state),
            responder_resources=param.responder_resources if param else RDMA_MAX_RESP_RES,
            initiator_depth=param.initiator_depth if param else RDMA_MAX_INIT_DEPTH))

    def modify(self, state: int, param: ConnParam | None = None) -> None:
        self.qp.modify(*self.qp_attr(state, param))

    def modify_rtr_rts(self, param: ConnParam | None = None) -> None:
        """``ucma_modify_qp_rtr`` and ``ucma_modify_qp_rts``: INIT again (the
        access rights are known only now), RTR, RTS."""
        if self.qp is None:
            return
        for state in (IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS):
            self.modify(state, param)

    def modify_err(self) -> None:
        from softverbs.verbs.qp import QPAttr

        if self.qp is not None and not self.qp.closed:
            with contextlib.suppress(PyverbsError):
                self.qp.modify(QPAttr(qp_state=IBV_QPS_ERR), IBV_QP_STATE)

    def conn_to_kernel(self, param: ConnParam | None, what: str) -> dict[str, Any]:
        """``ucma_copy_conn_param_to_kern``: the parameters as given (the agent
        decides the responder resources and initiator depth, 0xFF its
        default), the QP number the ID's QP's.  A CM ID without a QP needs a
        ConnParam naming one (``ucma_valid_param``)."""
        if self.qp is None and param is None and self.ps == RDMA_PS_TCP:
            raise PyverbsRDMAError(f"{what}: a CM ID without a QP needs a ConnParam "
                                   "(with qp_num)", errno.EINVAL)  # fmt: skip
        qp_num = self.qp.qp_num if self.qp is not None else (param.qp_num if param else 0)
        if param is None:
            return {"qp_num": qp_num, "responder_resources": RDMA_MAX_RESP_RES,
                    "initiator_depth": RDMA_MAX_INIT_DEPTH, "retry_count": 7,
                    "rnr_retry_count": 7}  # fmt: skip
        out = param.to_kernel()
        out["qp_num"] = qp_num
        return out

    def create_qp(self, pd: Any, init: Any) -> None:
        """``rdma_create_qp``: CQs (with completion channels) if none are given,
        the QP, and its first transitions."""
        from softverbs.verbs.cq import CQ, CompChannel
        from softverbs.verbs.qp import QP, QPInitAttr

        if self.qp is not None:
            raise PyverbsRDMAError("Failed to Create QP: the CM ID already has a QP",
                                   errno.EINVAL)  # fmt: skip
        if self.ctx is None:
            raise PyverbsRDMAError("Failed to Create QP: the CM ID has no device yet; bind "
                                   "or resolve its address first", errno.EINVAL)  # fmt: skip
        pd = pd if pd is not None else self.pd
        if pd is None or pd.ctx is not self.ctx:
            raise PyverbsRDMAError("Failed to Create QP: the PD belongs to another device",
                                   errno.EINVAL)  # fmt: skip
        cap = init.cap
        scq, rcq = init.send_cq, init.recv_cq
        made: list[Any] = []
        try:
            if scq is None and self.send_cq is None and cap.max_send_wr:
                self.send_channel = CompChannel(self.ctx)
                self.send_cq = CQ(self.ctx, cap.max_send_wr, self, self.send_channel, 0)
                made += [self.send_cq, self.send_channel]
            if rcq is None and self.recv_cq is None and cap.max_recv_wr:
                self.recv_channel = CompChannel(self.ctx)
                self.recv_cq = CQ(self.ctx, cap.max_recv_wr, self, self.recv_channel, 0)
                made += [self.recv_cq, self.recv_channel]
            attr = QPInitAttr(qp_type=init.qp_type, qp_context=init.qp_context,
                              scq=scq or self.send_cq, rcq=rcq or self.recv_cq,
                              srq=init.srq or self.srq, cap=cap,
                              sq_sig_all=init.sq_sig_all)  # fmt: skip
            qp = QP(pd, attr)
            self.qp = qp
            try:
                if self.qp_type == IBV_QPT_UD or init.qp_type == IBV_QPT_UD:
                    self.modify(IBV_QPS_INIT)
                    self.modify(IBV_QPS_RTR)
                    self.modify(IBV_QPS_RTS)
                else:
                    self.modify(IBV_QPS_INIT)
            except PyverbsRDMAError:
                self.qp = None
                qp.close()
                raise
        except PyverbsRDMAError as exc:
            for obj in made:
                with contextlib.suppress(PyverbsError):
                    obj.close()
            if self.send_cq in made:
                self.send_cq = self.send_channel = None
            if self.recv_cq in made:
                self.recv_cq = self.recv_channel = None
            raise _fail("Failed to Create QP", exc) from None
        self.own_cqs = made
        self.pd = pd

    def destroy_qp(self) -> None:
        qp, self.qp = self.qp, None
        if qp is not None:
            with contextlib.suppress(PyverbsError):
                qp.close()
        for obj in self.own_cqs:
            with contextlib.suppress(PyverbsError):
                obj.close()
        self.own_cqs = []
        self.send_cq = self.recv_cq = self.send_channel = self.recv_channel = None

    def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        if self.event is not None:
            self.event._ack_quietly()
            self.event = None
        with contextlib.suppress(PyverbsRDMAError):
            self.kernel.call("destroy_id", handle=self.handle)
        self.kernel.unregister(self.handle)
        self.channel._detach(self)
        if self.sync:
            self.channel.close()


# --------------------------------------------------------------------------
# events


class CMEventChannel(PyverbsCM):
    """``rdma_event_channel``: where a CM ID's events arrive, in order."""

    close_rank = 90

    def __init__(self) -> None:
        super().__init__()
        self.kernel = _kernel()
        self._events: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._ids: weakref.WeakSet[_Id] = weakref.WeakSet()
        self._by_handle: dict[int, _Id] = {}

    @property
    def fd(self) -> int:
        return -1

    def _attach(self, idr: _Id) -> None:
        self._by_handle[idr.handle] = idr
        self.kernel.register(idr.handle, self)

    def _detach(self, idr: _Id) -> None:
        if self._by_handle.get(idr.handle) is idr:
            del self._by_handle[idr.handle]

    def push(self, event: dict[str, Any]) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def _raw(self, timeout: float | None) -> dict[str, Any]:
        self._check_open()
        devices = [i.dev for i in list(self._by_handle.values()) if i.dev]
        ok = self.kernel.wait(lambda: bool(self._events), timeout, self._cond,
                              [d for d in devices if d])  # fmt: skip
        if not ok:
            raise PyverbsRDMAError("Failed to get a CM event: none arrived in time", errno.EAGAIN)
        with self._cond:
            return self._events.popleft()

    def _next(self, timeout: float | None) -> CMEvent:
        """``rdma_get_cm_event``: the next event, after librdmacm's processing."""
        while True:
            raw = self._raw(timeout)
            ev = self._process(raw)
            if ev is not None:
                return ev

    def _process(self, raw: dict[str, Any]) -> CMEvent | None:
        idr = self._by_handle.get(int(raw["handle"]))
        if idr is None or idr.destroyed:
            return None
        etype = int(raw["event"])
        ev = CMEvent.__new__(CMEvent)
        CMEvent._setup(ev, etype, int(raw.get("status", 0)), idr, raw)
        if etype == RDMA_CM_EVENT_CONNECT_REQUEST:
            child = self._new_child(idr, raw["child"])
            ev._id = child
            ev._listen = idr
        elif etype == RDMA_CM_EVENT_CONNECT_RESPONSE:
            if idr.qp is not None:
                try:
                    idr.modify_rtr_rts()
                    idr.call("establish", "Failed to complete the connection")
                    ev._event_type = RDMA_CM_EVENT_ESTABLISHED
                except PyverbsRDMAError as exc:
                    idr.modify_err()
                    ev._event_type = RDMA_CM_EVENT_CONNECT_ERROR
                    ev._status = -abs(exc.error_code or errno.EINVAL)
                    idr.connect_error = True
            else:
                idr.connect_error = False
        elif etype in (RDMA_CM_EVENT_REJECTED, RDMA_CM_EVENT_DISCONNECTED):
            if idr.connect_error:
                return None
            if etype == RDMA_CM_EVENT_REJECTED:
                idr.modify_err()
        elif etype == RDMA_CM_EVENT_ADDR_RESOLVED:
            try:
                idr.attach_device(raw.get("info") or {})
            except PyverbsRDMAError as exc:
                ev._event_type = RDMA_CM_EVENT_ADDR_ERROR
                ev._status = -abs(exc.error_code or errno.ENODEV)
        elif etype == RDMA_CM_EVENT_ROUTE_RESOLVED:
            idr.info = dict(raw.get("info") or idr.info)
        elif etype == RDMA_CM_EVENT_UNREACHABLE and idr.qp is not None:
            idr.modify_err()
        elif etype == RDMA_CM_EVENT_MULTICAST_JOIN:
            self._process_join(idr, ev, raw)
        return ev

    @staticmethod
    def _process_join(idr: _Id, ev: CMEvent, raw: dict[str, Any]) -> None:
        """librdmacm's ``ucma_process_join``: remember the group's GID and attach
        the ID's QP to it (not for a send-only join); a failed attach makes the
        event MULTICAST_ERROR."""
        from softverbs.verbs.addr import GID

        mc = next((m for m in idr.mcast if m.matches(raw.get("mc"))), None)
        if mc is None:
            return
        ah = (ev._ud or {}).get("ah_attr") or {}
        mc.mgid = bytes.fromhex(str(ah.get("dgid", "")))
        if idr.qp is None or mc.flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER or mc.attached:
            return
        try:
            idr.qp.attach_mcast(GID.from_raw(mc.mgid))
            mc.attached = True
        except PyverbsError as exc:
            ev._event_type = RDMA_CM_EVENT_MULTICAST_ERROR
            ev._status = -abs(getattr(exc, "error_code", 0) or errno.EINVAL)

    def _new_child(self, listen: _Id, info: dict[str, Any]) -> _Id:
        """``ucma_process_conn_req``: the new connection's ID (a synchronous
        listener's children get channels of their own)."""
        channel = CMEventChannel() if listen.sync else self
        child = _Id(self.kernel, int(info["handle"]), channel, listen.sync, listen.ps,
                    int(info["qp_type"]))  # the agent's: RC for a REQ, UD for a SIDR_REQ
        child.attach_device(info)
        if listen.pd is not None and child.pd is not listen.pd and child.ctx is listen.ctx:
            child.pd = listen.pd
        return child

    def get_event(self, timeout: float | None = None) -> CMEvent:
        """The next event (softverbs: ``timeout`` in seconds; EAGAIN when it passes)."""
        return self._next(timeout)

    def _release(self) -> None:
        with self._cond:
            self._events.clear()


class CMEvent(PyverbsObject):
    """``rdma_cm_event``: ``CMEvent(channel)`` waits for the channel's next event."""

    def __init__(self, channel: CMEventChannel, timeout: float | None = None) -> None:
        if not isinstance(channel, CMEventChannel):
            raise PyverbsUserError(f"CMEvent needs a CMEventChannel, got {type(channel).__name__}")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, (int, float))):  # fmt: skip
            raise PyverbsUserError(f"timeout must be a number of seconds, got {timeout!r}")
        ev = channel._next(timeout)
        self.__dict__.update(ev.__dict__)

    def _setup(self, etype: int, status: int, idr: _Id, raw: dict[str, Any]) -> None:
        PyverbsObject.__init__(self)
        self._event_type = etype
        self._status = status
        self._id: _Id = idr
        self._listen: _Id | None = None
        conn = raw.get("conn")
        ud = raw.get("ud")
        self._conn: dict[str, Any] | None = dict(conn) if isinstance(conn, dict) else None
        self._ud: dict[str, Any] | None = dict(ud) if isinstance(ud, dict) else None
        data = (self._conn or self._ud or {}).get("private_data", "")
        self._private = bytes.fromhex(data or "")
        self._acked = False

    @property
    def event_type(self) -> int:
        return self._event_type

    @property
    def status(self) -> int:
        """The event's status: 0, a negative errno, or a REJ reason (softverbs addition)."""
        return self._status

    @property
    def private_data(self) -> bytes:
        return self._private

    @property
    def id(self) -> _Id:
        return self._id

    @property
    def listen_id(self) -> _Id | None:
        return self._listen

    @property
    def param(self) -> dict[str, Any]:
        """The conn or ud parameters of the event, as a dict (softverbs addition)."""
        return dict(self._conn or self._ud or {})

    def ack_cm_event(self) -> None:
        """``rdma_ack_cm_event``."""
        if self._acked:
            raise PyverbsRDMAError("Failed to Acknowledge Event - the event was already "
                                   "acknowledged", errno.EINVAL)  # fmt: skip
        self._acked = True

    def _ack_quietly(self) -> None:
        self._acked = True

    def close(self) -> None:
        if not self._acked:
            self._acked = True

    def event_str(self) -> str:
        if self._acked:
            return ""
        try:
            return str(rdma_cm_event_type(self._event_type).name)
        except ValueError:
            return "UNKNOWN EVENT"

    def __str__(self) -> str:
        return f"CMEvent({self.event_str() or self._event_type}, status={self._status})"


# --------------------------------------------------------------------------
# CM IDs


class CMID(PyverbsCM):
    """An RDMA CM ID: ``CMID(creator, qp_init_attr, pd, port_space, listen_id)``.

    * ``CMID(creator=AddrInfo(...), qp_init_attr=...)`` -- ``rdma_create_ep``:
      a synchronous ID, bound (passive) or connected-to-be with its QP.
    * ``CMID(creator=CMEventChannel(), port_space=...)`` -- ``rdma_create_id``.
    * ``CMID(creator=connect_request_event, listen_id=listener)`` -- the ID of
      a new connection.
    """

    close_rank = 5

    def __init__(self, creator: Any = None, qp_init_attr: Any = None, pd: Any = None,
                 port_space: int = RDMA_PS_TCP, listen_id: CMID | None = None) -> None:  # fmt: skip
        super().__init__()
        self._id: _Id | None = None
        self._ep = False
        self.mrs: weakref.WeakSet[Any] = weakref.WeakSet()
        if creator is None:
            return
        if isinstance(creator, AddrInfo):
            self._create_ep(creator, pd, qp_init_attr)
        elif isinstance(creator, CMEventChannel):
            creator._check_open()
            self._id = self._create_id(creator, port_space, False)
        elif isinstance(creator, CMEvent):
            if listen_id is None:
                raise PyverbsUserError("listen ID not provided")
            self._id = creator._id
        else:
            raise PyverbsRDMAError(f"Cannot create CM ID from {type(creator)}", errno.EINVAL)

    @staticmethod
    def _create_id(channel: CMEventChannel, ps: int, sync: bool) -> _Id:
        ps = _uint("port_space", ps, 32)
        qp_type = _qp_type_of(ps)
        try:
            handle = int(channel.kernel.call("create_id", ps=int(ps), qp_type=qp_type))
        except PyverbsRDMAError as exc:
            raise _fail("Failed to create CM ID", exc) from None
        return _Id(channel.kernel, handle, channel, sync, ps, qp_type)

    def _create_ep(self, ai: AddrInfo, pd: Any, init: Any) -> None:
        """``rdma_create_ep``."""
        self._ep = True
        idr = self._id = self._create_id(CMEventChannel(), ai.port_space, True)
        try:
            if ai.flags & RAI_PASSIVE:
                assert ai.src_addr is not None
                idr.attach_device(idr.call("bind_addr", "Failed to create CM ID",
                                           addr=list(ai.src_addr)))  # fmt: skip
                if pd is not None:
                    idr.pd = pd
                if init is not None:
                    idr.qp_init_attr = init
                return
            assert ai.dst_addr is not None
            idr.call("resolve_addr", "Failed to create CM ID",
                     src=list(ai.src_addr) if ai.src_addr else None, dst=list(ai.dst_addr),
                     timeout_ms=2000)  # fmt: skip
            idr.complete()
            idr.call("resolve_route", "Failed to create CM ID", timeout_ms=2000)
            idr.complete()
            if init is not None:
                init.qp_type = ai.qp_type
                idr.create_qp(pd, init)
        except PyverbsRDMAError:
            idr.destroy()
            self._id = None
            raise

    # --- properties -----------------------------------------------------------------------
    def _idr(self) -> _Id:
        if self._id is None or self._id.destroyed:
            raise PyverbsUserError("the CMID is closed or was never created")
        return self._id

    @property
    def dev_name(self) -> str:
        idr = self._idr()
        if idr.dev is None:
            raise PyverbsRDMAError("the CM ID is not bound to a device yet", errno.ENODEV)
        return idr.dev

    @property
    def port_num(self) -> int:
        return 1 if self._id is not None and self._id.dev else 0

    @property
    def event_channel(self) -> CMEventChannel | None:
        if self._id is None or self._ep:
            return None
        return self._id.channel

    @property
    def context(self) -> Any:
        return self._id.ctx if self._id is not None else None

    @property
    def pd(self) -> Any:
        return self._id.pd if self._id is not None else None

    @property
    def qpn(self) -> int | None:
        qp = self._id.qp if self._id is not None else None
        return int(qp.qp_num) if qp is not None else None

    @property
    def qp(self) -> Any:
        """The CM ID's QP, a softverbs QP (softverbs addition)."""
        return self._id.qp if self._id is not None else None

    @property
    def src_addr(self) -> tuple[str, int] | None:
        src = self._id.info.get("src") if self._id is not None else None
        return (str(src[0]), int(src[1])) if src else None

    @property
    def dst_addr(self) -> tuple[str, int] | None:
        dst = self._id.info.get("dst") if self._id is not None else None
        return (str(dst[0]), int(dst[1])) if dst else None

    # --- lifetime ---------------------------------------------------------------------
    def _release(self) -> None:
        for mr in list(self.mrs):
            with contextlib.suppress(PyverbsError):
                mr.close()
        idr, self._id = self._id, None
        if idr is not None:
            idr.destroy_qp()
            idr.destroy()

    # --- connection management ------------------------------------------------------------
    def get_request(self) -> CMID:
        """``rdma_get_request``: wait for a connection request on a synchronous listener."""
        idr = self._idr()
        if not idr.sync:
            raise PyverbsRDMAError("Failed to get request, no connection established: the "
                                   "CM ID is not synchronous", errno.EINVAL)  # fmt: skip
        if idr.event is not None:
            idr.event._ack_quietly()
            idr.event = None
        ev = idr.channel._next(None)
        if ev.event_type == RDMA_CM_EVENT_REJECTED:
            raise PyverbsRDMAError("Failed to get request, no connection established",
                                   errno.ECONNREFUSED)  # fmt: skip
        if ev.status:
            raise PyverbsRDMAError("Failed to get request, no connection established",
                                   abs(ev.status))  # fmt: skip
        if ev.event_type != RDMA_CM_EVENT_CONNECT_REQUEST:
            raise PyverbsRDMAError("Failed to get request, no connection established: got "
                                   f"{ev.event_str()}", errno.EINVAL)  # fmt: skip
        child = ev._id
        if idr.qp_init_attr is not None:
            child.create_qp(idr.pd, _copy_init(idr.qp_init_attr))
        child.event = ev
        out = CMID()
        out._id = child
        out._ep = True
        return out

    def bind_addr(self, lai: AddrInfo) -> None:
        """``rdma_bind_addr`` to the AddrInfo's source address."""
        idr = self._idr()
        if not isinstance(lai, AddrInfo):
            raise PyverbsUserError(f"bind_addr needs an AddrInfo, got {type(lai).__name__}")
        addr = lai.src_addr
        if addr is None:
            raise PyverbsRDMAError("Failed to Bind ID: the AddrInfo has no source address",
                                   errno.EINVAL)  # fmt: skip
        idr.attach_device(idr.call("bind_addr", "Failed to Bind ID", addr=list(addr)))

    def resolve_addr(self, rai: AddrInfo, timeout_ms: int = 2000) -> None:
        """``rdma_resolve_addr``: ADDR_RESOLVED (or ADDR_ERROR) follows."""
        idr = self._idr()
        if not isinstance(rai, AddrInfo) or rai.dst_addr is None:
            raise PyverbsRDMAError("Failed to Resolve Address: no destination address",
                                   errno.EINVAL)  # fmt: skip
        idr.call("resolve_addr", "Failed to Resolve Address",
                 src=list(rai.src_addr) if rai.src_addr else None, dst=list(rai.dst_addr),
                 timeout_ms=_uint("timeout_ms", timeout_ms, 32))  # fmt: skip
        idr.complete()

    def resolve_route(self, timeout_ms: int = 2000) -> None:
        """``rdma_resolve_route``: ROUTE_RESOLVED (or ROUTE_ERROR) follows."""
        idr = self._idr()
        idr.call("resolve_route", "Failed to Resolve Route",
                 timeout_ms=_uint("timeout_ms", timeout_ms, 32))  # fmt: skip
        idr.complete()

    def listen(self, backlog: int = 0) -> None:
        idr = self._idr()
        if isinstance(backlog, bool) or not isinstance(backlog, int):
            raise PyverbsUserError(f"backlog must be an int, got {backlog!r}")
        idr.attach_device(idr.call("listen", "Listen Failed", backlog=backlog))

    def connect(self, param: ConnParam | None = None) -> None:
        """``rdma_connect``: REQ (RC) or SIDR_REQ (UD)."""
        idr = self._idr()
        what = "Failed to Connect"
        if param is not None and not isinstance(param, ConnParam):
            raise PyverbsUserError(f"param must be a ConnParam, got {type(param).__name__}")
        idr.call("connect", what, param=idr.conn_to_kernel(param, what))
        idr.complete()

    def accept(self, param: ConnParam | None = None) -> None:
        """``rdma_accept``: moves the QP to RTS, then REP (RC) or SIDR_REP (UD)."""
        idr = self._idr()
        what = "Failed to Accept Connection"
        if param is not None and not isinstance(param, ConnParam):
            raise PyverbsUserError(f"param must be a ConnParam, got {type(param).__name__}")
        kparam = idr.conn_to_kernel(param, what)
        if idr.qp_type != IBV_QPT_UD:
            try:
                idr.modify_rtr_rts(param)
            except PyverbsRDMAError as exc:
                raise _fail(what, exc) from None
        try:  # UD: the agent gives the SIDR_REP the ID's Q_Key (RDMA_UDP_QKEY)
            idr.call("accept", what, param=kparam)
        except PyverbsRDMAError:
            idr.modify_err()
            raise
        if idr.qp_type == IBV_QPT_UD:
            return
        idr.complete()

    def establish(self) -> None:
        """``rdma_establish``: the active side without a QP sends the RTU."""
        idr = self._idr()
        if idr.qp is not None:
            raise PyverbsRDMAError("Failed to Complete an active connection request: the "
                                   "CM ID has a QP, which completes by itself", errno.EINVAL)
        idr.call("establish", "Failed to Complete an active connection request")

    def reject(self, private_data: bytes | str | None = None) -> None:
        idr = self._idr()
        if isinstance(private_data, str):
            private_data = private_data.encode()
        if private_data is not None and not isinstance(private_data, (bytes, bytearray)):
            raise PyverbsUserError(f"private data must be bytes, got {type(private_data).__name__}")
        idr.call("reject", "Failed to Reject Connection",
                 private_data=(private_data or b"").hex())  # fmt: skip

    def disconnect(self) -> None:
        """``rdma_disconnect``: QP to ERR, then DREQ (or the DREP to the peer's DREQ)."""
        idr = self._idr()
        idr.modify_err()
        idr.call("disconnect", "Failed to Disconnect")
        idr.complete()

    def set_local_ece(self, ece: Any) -> None:
        idr = self._idr()
        if idr.qp is not None or int(getattr(ece, "comp_mask", 0)) != 0:
            raise PyverbsRDMAError("Failed to set local ECE", errno.EINVAL)
        idr.local_ece = (int(ece.vendor_id), int(ece.options))

    def get_remote_ece(self) -> Any:
        idr = self._idr()
        if idr.qp is not None:
            raise PyverbsRDMAError("Failed to get remote ECE", errno.EINVAL)
        from softverbs.verbs.qp import ECE

        return ECE(vendor_id=idr.remote_ece[0], options=idr.remote_ece[1])

    def set_option(self, level: int, optname: int, optval: int, optlen: int) -> None:
        """``rdma_set_option``: ``optlen`` bytes of the integer ``optval``, as
        pyverbs copies them.  rdma-core 44's pyverbs takes ACK_TIMEOUT only;
        this one also TOS, REUSEADDR and AFONLY, with the kernel's rules (a
        uint8_t for TOS and ACK_TIMEOUT, an int for the others: EINVAL)."""
        if optname not in (RDMA_OPTION_ID_ACK_TIMEOUT, RDMA_OPTION_ID_TOS,
                           RDMA_OPTION_ID_REUSEADDR, RDMA_OPTION_ID_AFONLY):  # fmt: skip
            raise PyverbsUserError("Currently only RDMA_OPTION_ID_ACK_TIMEOUT, _TOS, _REUSEADDR "
                                   "and _AFONLY are supported in Pyverbs.")  # fmt: skip
        length = _uint("optlen", optlen, 32)
        if not 1 <= length <= 8:
            raise PyverbsUserError(f"optlen must be 1..8 (bytes of optval), got {optlen!r}")
        value = _uint("optval", optval, 64) & ((1 << (8 * length)) - 1)
        self._idr().call("set_option", "Failed to set option", level=_uint("level", level, 32),
                         name=optname, value=value, length=length)  # fmt: skip

    def join_multicast(self, addr: AddrInfo | None = None, mc_attr: JoinMCAttrEx | None = None,
                       context: int = 0) -> None:  # fmt: skip
        """``rdma_join_multicast`` (``addr``: its source address is the group) or
        ``rdma_join_multicast_ex`` (``mc_attr``); MULTICAST_JOIN follows, and
        reading it attaches the ID's QP to the group (module docstring)."""
        if addr is None and mc_attr is None:
            raise PyverbsUserError("Join to multicast must have AddrInfo or JoinMCAttrEx arguments")
        flags = int(RDMA_MC_JOIN_FLAG_FULLMEMBER)
        if mc_attr is not None:
            reserved = RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS << 1  # RDMA_CM_JOIN_MC_ATTR_RESERVED
            if mc_attr.comp_mask >= reserved:
                raise PyverbsRDMAError("Failed to Join multicast: comp_mask "
                                       f"{mc_attr.comp_mask:#x} has unknown bits",
                                       errno.ENOTSUP)  # fmt: skip
            if not mc_attr.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS:
                raise einval("Failed to Join multicast: comp_mask lacks "
                             "RDMA_CM_JOIN_MC_ATTR_ADDRESS")  # fmt: skip
            flags_given = mc_attr.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS
            if not flags_given or mc_attr.join_flags > RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER:
                raise einval("Failed to Join multicast: join flags must be given "
                             "(RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) and be "
                             "RDMA_MC_JOIN_FLAG_FULLMEMBER or _SENDONLY_FULLMEMBER")  # fmt: skip
            addr = mc_attr.addr
            flags = int(mc_attr.join_flags)
        assert addr is not None
        group = addr.src_addr or addr.dst_addr
        if group is None:
            raise einval("Failed to Join multicast: the AddrInfo has no address")
        idr = self._idr()
        mc = _Mcast(group, flags, _uint("context", context, 64))
        idr.mcast.append(mc)
        try:
            idr.call("join_multicast", "Failed to Join multicast", addr=list(group),
                     join_flags=flags)  # fmt: skip
        except PyverbsRDMAError:
            idr.mcast.remove(mc)
            raise
        idr.complete()

    def leave_multicast(self, addr: AddrInfo) -> None:
        """``rdma_leave_multicast``: detach the ID's QP from the group and leave it."""
        from softverbs.verbs.addr import GID

        if not isinstance(addr, AddrInfo):
            raise PyverbsUserError(f"addr must be an AddrInfo, got {type(addr).__name__}")
        idr = self._idr()
        group = addr.src_addr or addr.dst_addr
        mc = next((m for m in idr.mcast if group is not None and m.matches(group)), None)
        if mc is None:
            raise PyverbsRDMAError("Failed to leave multicast: the CM ID did not join "
                                   f"{group[0] if group else 'that group'}",
                                   errno.EADDRNOTAVAIL)  # fmt: skip
        idr.mcast.remove(mc)
        if mc.attached and idr.qp is not None and mc.mgid is not None:
            idr.qp.detach_mcast(GID.from_raw(mc.mgid))
            mc.attached = False
        idr.call("leave_multicast", "Failed to leave multicast", addr=list(mc.addr))

    # --- the QP -------------------------------------------------------------------------
    def create_qp(self, qp_init: Any) -> None:
        """``rdma_create_qp`` with the ID's PD."""
        from softverbs.verbs.qp import QPInitAttr

        if not isinstance(qp_init, QPInitAttr):
            raise PyverbsUserError(f"create_qp needs a QPInitAttr, got {type(qp_init).__name__}")
        idr = self._idr()
        idr.create_qp(idr.pd, qp_init)

    def query_qp(self, attr_mask: int) -> tuple[Any, Any]:
        qp = self._idr().qp
        if qp is None:
            raise PyverbsRDMAError("Failed to query QP: the CM ID has no QP", errno.EINVAL)
        return qp.query(attr_mask)  # type: ignore[no-any-return]

    def init_qp_attr(self, qp_state: int) -> tuple[Any, int]:
        """``rdma_init_qp_attr``: (QPAttr, mask) for moving an external QP."""
        return self._idr().qp_attr(qp_state)

    # --- memory -------------------------------------------------------------------------
    def _reg(self, size: int, access: int) -> Any:
        from softverbs.verbs.mr import MR

        idr = self._idr()
        if idr.pd is None:
            raise PyverbsRDMAError("Failed to register an MR: the CM ID has no device yet",
                                   errno.EINVAL)  # fmt: skip
        mr = MR(idr.pd, size, access)
        self.mrs.add(mr)
        return mr

    def reg_msgs(self, size: int) -> Any:
        """``rdma_reg_msgs``: an MR for sends and receives."""
        return self._reg(size, IBV_ACCESS_LOCAL_WRITE)

    def reg_read(self, size: int = 0) -> Any:
        """``rdma_reg_read``: an MR the peer may RDMA READ."""
        return self._reg(size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ)

    def reg_write(self, size: int = 0) -> Any:
        """``rdma_reg_write``: an MR the peer may RDMA WRITE."""
        return self._reg(size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

    # --- posting -------------------------------------------------------------------------
    def _qp_or_fail(self, what: str) -> Any:
        qp = self._idr().qp
        if qp is None:
            raise PyverbsRDMAError(f"{what}: the CM ID has no QP", errno.EINVAL)
        return qp

    def post_recv(self, mr: Any, length: int | None = None) -> None:
        from softverbs.verbs.wr import SGE, RecvWR

        idr = self._idr()
        wr = RecvWR(wr_id=0, num_sge=1, sg=[SGE(mr.buf, length or mr.length, mr.lkey)])
        try:
            if idr.srq is not None:
                idr.srq.post_recv(wr)
            else:
                self._qp_or_fail("Failed to Post Receive").post_recv(wr)
        except PyverbsRDMAError as exc:
            raise _fail("Failed to Post Receive", exc) from None

    def _post(self, what: str, wr: Any) -> None:
        qp = self._qp_or_fail(what)
        try:
            qp.post_send(wr)
        except PyverbsRDMAError as exc:
            raise _fail(what, exc) from None

    def post_send(self, mr: Any, flags: int = IBV_SEND_SIGNALED, length: int | None = None) -> None:
        from softverbs.verbs.wr import SGE, SendWR

        sge = SGE(mr.buf, length or mr.length, mr.lkey)
        self._post("Failed to Post Send",
                   SendWR(wr_id=0, opcode=IBV_WR_SEND, num_sge=1, sg=[sge], send_flags=flags))

    def post_read(self, mr: Any, length: int, remote_addr: int, rkey: int, flags: int = 0) -> None:
        from softverbs.verbs.wr import SGE, SendWR

        wr = SendWR(wr_id=0, opcode=IBV_WR_RDMA_READ, num_sge=1,
                    sg=[SGE(mr.buf, length, mr.lkey)], send_flags=flags)  # fmt: skip
        wr.set_wr_rdma(rkey, remote_addr)
        self._post("Failed to Post Read", wr)

    def post_write(self, mr: Any, length: int, remote_addr: int, rkey: int,
                   flags: int = 0) -> None:  # fmt: skip
        from softverbs.verbs.wr import SGE, SendWR

        wr = SendWR(wr_id=0, opcode=IBV_WR_RDMA_WRITE, num_sge=1,
                    sg=[SGE(mr.buf, length, mr.lkey)], send_flags=flags)  # fmt: skip
        wr.set_wr_rdma(rkey, remote_addr)
        self._post("Failed to Post Write", wr)

    def post_ud_send(self, mr: Any, ah: Any, rqpn: int = 0, flags: int = IBV_SEND_SIGNALED,
                     length: int | None = None) -> None:  # fmt: skip
        from softverbs.verbs.wr import SGE, SendWR

        wr = SendWR(wr_id=0, opcode=IBV_WR_SEND, num_sge=1,
                    sg=[SGE(mr.buf, length or mr.length, mr.lkey)], send_flags=flags)
        wr.set_wr_ud(ah, rqpn, RDMA_UDP_QKEY)  # fmt: skip
        self._post("Failed to Post Send", wr)

    def _get_comp(self, send: bool, what: str) -> Any:
        """``rdma_get_send_comp``/``rdma_get_recv_comp``: poll, arm, wait, poll."""
        idr = self._idr()
        cq = idr.send_cq if send else idr.recv_cq
        channel = idr.send_channel if send else idr.recv_channel
        if cq is None:
            raise PyverbsRDMAError(f"{what}: the CM ID has no CQ of its own", errno.EINVAL)
        try:
            while True:
                n, wcs = cq.poll(1)
                if n:
                    return wcs[0]
                if channel is None:
                    continue
                cq.req_notify()
                n, wcs = cq.poll(1)
                if n:
                    return wcs[0]
                channel.get_cq_event(cq)
                cq.ack_events(1)
        except PyverbsRDMAError as exc:
            raise _fail(what, exc) from None

    def get_recv_comp(self) -> Any:
        return self._get_comp(False, "Failed to retrieve receive completion")

    def get_send_comp(self) -> Any:
        return self._get_comp(True, "Failed to retrieve send completion")

    def __repr__(self) -> str:
        idr = self._id
        return f"<CMID handle={idr.handle if idr else None} dev={idr.dev if idr else None}>"


def _copy_init(init: Any) -> Any:
    from softverbs.verbs.qp import QPInitAttr

    return QPInitAttr(qp_type=init.qp_type, qp_context=init.qp_context, scq=init.send_cq,
                      rcq=init.recv_cq, srq=init.srq, cap=init.cap,
                      sq_sig_all=init.sq_sig_all)  # fmt: skip


__all__ = [
    "CMID",
    "AddrInfo",
    "CMEvent",
    "CMEventChannel",
    "ConnParam",
    "JoinMCAttrEx",
    "UDParam",
]
