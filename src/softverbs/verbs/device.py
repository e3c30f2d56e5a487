"""Devices and contexts: ``get_device_list``, ``Context``, device queries.

A *device* is one soft HCA in this process: an engine
(:class:`~softverbs.engine.hca.HCA`) driven by a runtime (the in-process
fabric, or a UDP socket).  Devices are opened lazily by name; several
:class:`Context` objects on one device share its QP numbers, keys and
counters, as several ``ibv_open_device`` calls on one NIC do.

With no configuration there is one device, ``sv0``, on the in-process
fabric.  Its GID table is shaped like rxe's: index 0 holds a link-local IPv6
GID derived from the device's MAC, index 1 the IPv4-mapped GID of its
address.  Both are RoCEv2 GIDs.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import weakref
from collections import deque
from dataclasses import dataclass, fields
from typing import Any

from softverbs.device import ops, records
from softverbs.device.core import DEVICE_CAP_FLAGS as DEVICE_CAP_FLAGS
from softverbs.device.core import GID_TABLE_LEN, PKEY_TABLE, STANDARD_COUNTERS
from softverbs.device.core import LIMITS as LIMITS
from softverbs.device.core import MAX_MSG_SZ as MAX_MSG_SZ
from softverbs.enums import (
    IBV_GID_TYPE_ROCE_V2,
    IBV_GID_TYPE_SYSFS_ROCE_V2,
    IBV_NODE_CA,
    IBV_TRANSPORT_IB,
    ibv_event_type,
)
from softverbs.errors import PyverbsRDMAError, PyverbsUserError, einval
from softverbs.verbs import world
from softverbs.verbs.base import PyverbsCM, PyverbsObject, as_int, as_uint, require
from softverbs.verbs.device_ex import DeviceAttrEx, GIDEntry, ODPCaps, QueryDeviceExInput
from softverbs.verbs.gid import GID
from softverbs.verbs.provider import Attach, Provider, destroy
from softverbs.verbs.registry import SoftDevice


def ip_to_gid(addr: str) -> bytes:
    ip = ipaddress.ip_address(addr)
    if ip.version == 4:
        return b"\x00" * 10 + b"\xff\xff" + ip.packed
    return ip.packed


class Device(PyverbsObject):
    """An entry of :func:`get_device_list` (pyverbs ``Device``)."""

    def __init__(self, name: bytes, guid: int, node_type: int, transport_type: int, index: int):
        super().__init__()
        self._name = name
        self._guid = guid
        self._node_type = node_type
        self._transport_type = transport_type
        self._index = index

    @property
    def name(self) -> bytes:
        return self._name

    @property
    def guid(self) -> int:
        return self._guid

    @property
    def node_type(self) -> int:
        return self._node_type

    @property
    def transport_type(self) -> int:
        return self._transport_type

    @property
    def index(self) -> int:
        return self._index

    def __repr__(self) -> str:
        return f"Device({self._name.decode()!r}, guid={self._guid:#018x})"


def get_device_list() -> list[Device]:
    """The soft devices visible to this process (or to the active simulation)."""
    return [
        Device(spec.name.encode(), spec.guid, IBV_NODE_CA, IBV_TRANSPORT_IB, index)
        for index, spec in enumerate(world.active().specs())
    ]


def _attrs_str(obj: object) -> str:
    return "".join(f"{f.name:<28}: {getattr(obj, f.name)}\n" for f in fields(obj))  # type: ignore[arg-type]


@dataclass(slots=True)
class DeviceAttr:
    """``ibv_device_attr`` (``Context.query_device``)."""

    fw_version: str
    node_guid: int
    sys_image_guid: int
    max_mr_size: int
    page_size_cap: int
    vendor_id: int
    vendor_part_id: int
    hw_ver: int
    max_qp: int
    max_qp_wr: int
    device_cap_flags: int
    max_sge: int
    max_sge_rd: int
    max_cq: int
    max_cqe: int
    max_mr: int
    max_pd: int
    max_qp_rd_atom: int
    max_ee_rd_atom: int
    max_res_rd_atom: int
    max_qp_init_rd_atom: int
    max_ee_init_rd_atom: int
    atomic_caps: int
    max_ee: int
    max_rdd: int
    max_mw: int
    max_raw_ipv6_qps: int
    max_raw_ethy_qp: int
    max_mcast_grp: int
    max_mcast_qp_attach: int
    max_total_mcast_qp_attach: int
    max_ah: int
    max_fmr: int
    max_map_per_fmr: int
    max_srq: int
    max_srq_wr: int
    max_srq_sge: int
    max_pkeys: int
    local_ca_ack_delay: int
    phys_port_cnt: int

    def __str__(self) -> str:
        return _attrs_str(self)


@dataclass(slots=True)
class PortAttr:
    """``ibv_port_attr`` (``Context.query_port``)."""

    state: int
    max_mtu: int
    active_mtu: int
    gid_tbl_len: int
    port_cap_flags: int
    max_msg_sz: int
    bad_pkey_cntr: int
    qkey_viol_cntr: int
    pkey_tbl_len: int
    lid: int
    sm_lid: int
    lmc: int
    max_vl_num: int
    sm_sl: int
    subnet_timeout: int
    init_type_reply: int
    active_width: int
    active_speed: int
    phys_state: int
    link_layer: int
    flags: int
    port_cap_flags2: int
    active_speed_ex: int

    def __str__(self) -> str:
        return _attrs_str(self)


class AsyncEvent(PyverbsObject):
    """An asynchronous event (``ibv_async_event``).

    Beyond pyverbs' ``event_type``, softverbs says which object it concerns
    (``element``: a QP, CQ or SRQ object, or a port number) and why
    (``reason``).
    """

    def __init__(self, event_type: int = 0, element: Any = None, reason: str = "") -> None:
        super().__init__()
        self._event_type = event_type
        self.element = element
        self.reason = reason

    @property
    def event_type(self) -> int:
        return self._event_type

    def ack(self) -> None:
        """Acknowledge the event (nothing to release in softverbs)."""

    def __str__(self) -> str:
        try:
            name = ibv_event_type(self._event_type).name
        except ValueError:
            name = str(self._event_type)
        return f"{'Event Type':<24}: {name:<20}\n"


class UContext:
    """The handle namespace of one opened device, shared with its imports.

    ``ibv_import_device`` opens a second context on the *same* device file
    (``cmd_fd``), and ``ibv_import_pd`` / ``ibv_import_mr`` / ``ibv_import_dm``
    then name that context's objects by handle.  softverbs does the same in
    one process: every context has a real file descriptor (``cmd_fd``), a
    context imported from a duplicate of it shares this namespace, and a
    handle finds the very object it names.
    """

    def __init__(self) -> None:
        self._next = 1
        self._objs: dict[int, weakref.ReferenceType[Any]] = {}
        self.fds = 0  #: open cmd_fds of this namespace (the context's and its imports')

    def add(self, obj: Any) -> int:
        handle = self._next
        self._next += 1
        self._objs[handle] = weakref.ref(obj)
        return handle

    def remove(self, obj: Any) -> None:
        for handle, ref in list(self._objs.items()):
            if ref() is obj:
                del self._objs[handle]

    def lookup(self, cls: type[Any], handle: Any, fail: str) -> Any:
        """The live object of type ``cls`` named ``handle``, or EINVAL."""
        ref = self._objs.get(handle) if isinstance(handle, int) else None
        obj: Any = ref() if ref is not None else None
        if obj is None or not isinstance(obj, cls) or obj.closed:
            raise PyverbsRDMAError(f"{fail}: no {cls.__name__} has handle {handle!r} in this "
                                   "device context", errno.EINVAL)  # fmt: skip
        return obj

    def by_lkey(self, lkey: int) -> Any:
        """The open object of this namespace that holds local key ``lkey`` (an
        MR: the only keyed kind a namespace holds), or None."""
        for ref in self._objs.values():
            obj = ref()
            if obj is not None and not obj.closed and getattr(obj, "lkey", None) == lkey:
                return obj
        return None


#: cmd_fd inode -> (device, namespace) of the context that owns it
_CMD_FDS: dict[tuple[int, int], tuple[Any, UContext]] = {}


def _new_cmd_fd(name: str) -> int:
    """A file descriptor of its own for a context (a memfd, or a pipe's read end)."""
    try:
        return os.memfd_create(f"softverbs-{name}", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        r, w = os.pipe()
        os.close(w)
        return r


def _fd_key(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _close_cmd_fd(fd: int, ucontext: UContext) -> None:
    """Close a context's ``cmd_fd``; forget the namespace when no descriptor of it is left."""
    with contextlib.suppress(OSError):
        key = _fd_key(fd)
        os.close(fd)
        ucontext.fds -= 1
        if ucontext.fds <= 0 and _CMD_FDS.get(key, (None, None))[1] is ucontext:
            del _CMD_FDS[key]


class Context(PyverbsCM):
    """An open device (pyverbs ``Context``): ``Context(name='sv0')``, or
    ``Context(cmd_fd=fd)`` to import a context from a duplicate of another
    one's ``cmd_fd`` (``ibv_import_device``)."""

    close_rank = 100

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        name = kwargs.get("name")
        cmd_fd = kwargs.get("cmd_fd")
        self._registry = world.active()
        if cmd_fd is not None:
            self._import(cmd_fd)
        else:
            if name is None:
                raise PyverbsUserError("Device name must be provided")
            if isinstance(name, bytes):
                name = name.decode()
            if not isinstance(name, str):
                raise PyverbsUserError(f"Device name must be a str, got {type(name).__name__}")
            self.name: str = name
            self.device: SoftDevice = self._registry.open(name)
            self.ucontext = UContext()
            self._imported_fd = False
            self._cmd_fd = _new_cmd_fd(name)
            _CMD_FDS[_fd_key(self._cmd_fd)] = (self.device, self.ucontext)
        # as ibv_close_device: the descriptor goes with the context, closed or collected
        self.ucontext.fds += 1
        self._fd_closer = weakref.finalize(self, _close_cmd_fd, self._cmd_fd, self.ucontext)
        self.provider: Provider = self.device.provider
        #: the device's engine when it runs in this process (for tools and tests)
        self.hca = self.device.hca
        self.runtime = self.device.runtime
        self.lock = self.runtime.lock
        self.events: deque[AsyncEvent] = deque()
        #: this context's objects by device handle, for the events that name them
        self.objects: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        reply = self.provider.call(ops.OPEN_DEVICE, records.OpenDevice(self.name),
                                   Attach(sink=self._on_event))  # fmt: skip
        self.handle: int = reply.ctx
        self.device.contexts.add(self)

    def register(self, obj: Any, handle: int) -> int:
        """Remember ``obj`` by its device handle (events name it so); returns the handle."""
        self.objects[handle] = obj
        return handle

    def _on_event(self, rec: records.AsyncEventRecord, reason: str) -> None:
        """The device's async event for an object of this context."""
        element = self.objects.get(rec.handle) if rec.handle else None
        if element is None and rec.kind == records.KIND_QP:
            element = _ForeignQP(rec.qpn, reason)  # a device-owned XRC QP, by number
        self.events.append(AsyncEvent(rec.event_type, element, reason))

    def _import(self, cmd_fd: Any) -> None:
        cmd_fd = as_int(cmd_fd, "cmd_fd")
        try:
            found = _CMD_FDS.get(_fd_key(cmd_fd))
        except OSError as exc:
            raise PyverbsRDMAError(f"Failed to import device: fd {cmd_fd}: {exc.strerror}",
                                   exc.errno or errno.EBADF) from None  # fmt: skip
        devices = getattr(self._registry, "devices", {})
        if found is None or found[0] not in devices.values():
            raise PyverbsRDMAError(f"Failed to import device: fd {cmd_fd} is not the command "
                                   "fd of an open softverbs context", errno.EINVAL)  # fmt: skip
        self.device, self.ucontext = found
        self.name = self.device.name
        self._cmd_fd = cmd_fd  # ibv_import_device takes the descriptor over
        self._imported_fd = True

    @property
    def cmd_fd(self) -> int:
        """The context's command file descriptor (``ibv_context.cmd_fd``)."""
        self._check_open()
        return self._cmd_fd

    @property
    def context(self) -> int:
        return id(self)

    # --- queries ------------------------------------------------------------
    @property
    def num_comp_vectors(self) -> int:
        return 1

    def _attrs(self) -> records.DeviceAttrs:
        return self.provider.call(ops.QUERY_DEVICE, records.Ctx(self.handle, 0))

    def query_device(self) -> DeviceAttr:
        self._check_open()
        a = self._attrs()
        names = {f.name for f in fields(DeviceAttr)}
        values = {k: v for k, v in vars(a).items() if k in names}
        return DeviceAttr(fw_version=a.fw_ver, atomic_caps=a.atomic_cap,
                          max_raw_ipv6_qps=a.max_raw_ipv6_qp, **values)  # fmt: skip

    def query_device_ex(self, ex_input: Any = None) -> DeviceAttrEx:
        """``ibv_query_device_ex``: the device attributes and extended caps."""
        self._check_open()
        if ex_input is not None:
            require(ex_input, QueryDeviceExInput, "ex_input")
            if ex_input.comp_mask:
                raise PyverbsRDMAError(f"Failed to query EX device {self.name}",
                                       errno.EINVAL)  # fmt: skip
        attr = self.query_device()
        a = self._attrs()
        odp = ODPCaps(a.odp_general_caps, a.odp_rc_caps, a.odp_uc_caps, a.odp_ud_caps,
                      a.odp_xrc_caps)  # fmt: skip
        return DeviceAttrEx(
            orig_attr=attr, odp_caps=odp, xrc_odp_caps=odp.xrc_odp_caps,
            device_cap_flags_ex=a.device_cap_flags_ex, max_dm_size=a.max_dm_size,
            phys_port_cnt_ex=attr.phys_port_cnt,
        )  # fmt: skip

    def _gid_entries(self) -> list[GIDEntry]:
        ifindex = self._ifindex()
        return [
            GIDEntry.from_raw(raw, index, 1, IBV_GID_TYPE_ROCE_V2, ifindex)
            for index, raw in enumerate(self.provider.gids)
            if any(raw)
        ]

    def query_gid_table(self, max_entries: int, flags: int = 0) -> list[GIDEntry]:
        """``ibv_query_gid_table``: every valid GID of every port.

        As the C call, an error carries a *negative* errno: -EINVAL when
        ``max_entries`` is smaller than the number of valid GIDs.
        """
        self._check_open()
        for what, value in (("max_entries", max_entries), ("flags", flags)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise PyverbsUserError(f"{what} must be an int, got {type(value).__name__}")
        entries = self._gid_entries()
        if max_entries < 0 or flags or len(entries) > max_entries:
            raise PyverbsRDMAError("Failed to query gid tables of the device", -errno.EINVAL)
        return entries

    def query_gid_ex(self, port_num: int, gid_index: int, flags: int = 0) -> GIDEntry:
        """``ibv_query_gid_ex``: one GID entry; ENODATA for an empty index."""
        self._check_open()
        fail = f"Failed to query gid table of port {port_num} in index {gid_index}"
        self._port(port_num, fail)
        if isinstance(gid_index, bool) or not isinstance(gid_index, int):
            raise PyverbsUserError(f"gid_index must be an int, got {type(gid_index).__name__}")
        if flags or not 0 <= gid_index < GID_TABLE_LEN:
            raise PyverbsRDMAError(fail, errno.EINVAL)
        for entry in self._gid_entries():
            if entry.gid_index == gid_index:
                return entry
        raise PyverbsRDMAError(fail, errno.ENODATA)

    def query_rt_values_ex(self, comp_mask: int = 1) -> tuple[int, int]:
        """``ibv_query_rt_values_ex``: softverbs devices keep no hardware clock."""
        self._check_open()
        raise PyverbsRDMAError("Failed to query real time values: softverbs devices have no "
                               "hardware clock", errno.EOPNOTSUPP)  # fmt: skip

    def _port(self, port_num: int, failed: str) -> None:
        # ``failed`` is pyverbs' message for the verb: programs match on it
        as_uint(port_num, 32, "port_num")
        if port_num != 1:
            raise einval(
                f"{failed}: port {port_num} does not exist; softverbs devices have one port, 1"
            )

    def _ifindex(self) -> int:
        gids = self.provider.gids
        index = 1 if len(gids) > 1 and any(gids[1]) else 0
        return self.provider.call(ops.QUERY_GID, records.QueryGid(self.handle, 1, index, 0)).ifindex

    def query_port(self, port_num: int) -> PortAttr:
        self._check_open()
        self._port(port_num, f"Failed to query port {port_num}")
        a = self.provider.call(ops.QUERY_PORT, records.QueryPort(self.handle, port_num))
        return PortAttr(**{f.name: getattr(a, f.name) for f in fields(PortAttr)})

    def query_gid(self, port_num: int, index: int) -> Any:
        self._check_open()
        self._port(port_num, f"Failed to query gid {index} of port {port_num}")
        if not 0 <= as_int(index, "index") < GID_TABLE_LEN:
            raise PyverbsRDMAError(f"Failed to query gid {index} of port {port_num}", 22)
        gids = self.provider.gids
        raw = gids[index] if index < len(gids) else bytes(16)
        return GID.from_raw(raw)

    def query_gid_type(self, port_num: int, index: int) -> int:
        self._check_open()
        self._port(port_num, f"Failed to query gid type of port {port_num} and gid index {index}")
        if not 0 <= as_uint(index, 32, "index") < len(self.provider.gids):
            raise PyverbsRDMAError(
                f"Failed to query gid type of port {port_num} and gid index {index}", 61
            )
        return IBV_GID_TYPE_SYSFS_ROCE_V2

    def query_pkey(self, port_num: int, index: int) -> int:
        self._port(port_num, f"Failed to query pkey {index} of port {port_num}")
        if not 0 <= as_int(index, "index") < len(PKEY_TABLE):
            raise PyverbsRDMAError(f"Failed to query pkey {index} of port {port_num}", 22)
        return PKEY_TABLE[index]

    def get_pkey_index(self, port_num: int, pkey: int) -> int:
        self._port(port_num, f"Failed to get pkey index of pkey = {pkey} of port {port_num}")
        if as_int(pkey, "pkey") not in PKEY_TABLE:
            raise PyverbsRDMAError(f"Failed to get pkey index of pkey = {pkey} of port {port_num}")
        return PKEY_TABLE.index(pkey)

    # --- async events ---------------------------------------------------------
    def get_async_event(self, timeout: float | None = None) -> AsyncEvent:
        """Wait for the next async event of this context.

        ``timeout`` (seconds) is a softverbs addition; without it the call
        blocks like ``ibv_get_async_event``.  On timeout: EAGAIN.
        """
        self._check_open()
        if not self.runtime.wait_for(lambda: bool(self.events), timeout):
            raise PyverbsRDMAError("Failed to get async event: none arrived in time", 11)
        with self.lock:
            return self.events.popleft()

    def _release(self) -> None:
        self.device.contexts.discard(self)
        self._fd_closer()
        if not self._imported_fd:
            with contextlib.suppress(PyverbsRDMAError):  # the service may be gone
                destroy(self.provider, records.KIND_CTX, self.handle)
        self._registry.release(self.device)


class _ForeignQP:
    """The element of an event of a device-owned XRC receive QP this process
    holds by registration, not through a QP object: its number."""

    def __init__(self, qpn: int, reason: str) -> None:
        self.qpn = self.qp_num = qpn
        self.last_error = reason


def counters(ctx: Context) -> dict[str, int]:
    """The device's counters (rxe ``hw_counters`` names where one exists)."""
    ctx._check_open()
    _, tail = ctx.provider.call_tail(ops.COUNTERS, records.Ctx(ctx.handle, 0))
    out = dict.fromkeys(STANDARD_COUNTERS, 0)
    out.update({str(k): int(v) for k, v in json.loads(tail).items()})
    return out
