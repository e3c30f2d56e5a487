"""The CM agent's commands and events as the service protocol's records.

The agent (:class:`~softverbs.cm.agent.CmAgent`) takes and returns plain
Python values -- addresses as ``[ip text, port]``, private data as hex,
connection parameters and events as dicts -- because in-process users call
it directly (:class:`~softverbs.cm.kernel.LocalKernel`).  Processes that use
served devices reach it through ``softverbsd`` with one fixed record per
command (``CM_*`` in :mod:`softverbs.device.records`) and read its events as
:class:`~softverbs.device.records.CmEvent` records -- the C librdmacm fills and
reads the same structs from the generated ``protocol.h``.

:data:`COMMANDS` is the one table between the two: for each command its
operation, the agent method that serves it, and the four conversions --
the client's keyword arguments to the request record and back (the
service), the agent's result to the reply record and back (the client).
:func:`event_record` and :func:`event_dict` convert events.  A record that
does not hold what its command takes (an unknown address family, an
over-long private data length) is EINVAL, never a crash.
"""

from __future__ import annotations

import dataclasses
import errno
import ipaddress
import socket
from collections.abc import Callable
from typing import Any

from softverbs.cm.agent import CmAgent
from softverbs.cm.states import CmState, RdmaState
from softverbs.device import ops, records
from softverbs.enums import (
    IBV_QP_AV,
    QP_ATTR_MASK,
    RDMA_CM_EVENT_CONNECT_REQUEST,
)
from softverbs.errors import PyverbsRDMAError

_AF = {4: int(socket.AF_INET), 16: int(socket.AF_INET6)}
_LEN = {v: k for k, v in _AF.items()}


def _bad(what: str) -> PyverbsRDMAError:
    return PyverbsRDMAError(what, errno.EINVAL)


# --- addresses ---------------------------------------------------------------------------


def addr_record(value: Any) -> records.CmAddr:
    """``[ip text, port]`` (or None) as a CmAddr."""
    if value is None:
        return records.CmAddr(bytes(16), 0, 0, 0)
    text, port = value
    ip = ipaddress.ip_address(str(text).split("%")[0]).packed
    return records.CmAddr(ip.ljust(16, b"\0"), _AF[len(ip)], int(port), 0)


def addr_value(rec: records.CmAddr) -> list[Any] | None:
    """A CmAddr as ``[ip text, port]``; None for family 0."""
    if rec.family == 0:
        return None
    n = _LEN.get(rec.family)
    if n is None:
        raise _bad(f"address family {rec.family} is neither AF_INET nor AF_INET6")
    return [str(ipaddress.ip_address(rec.ip[:n])), rec.port]


# --- the ID's info -----------------------------------------------------------------------


def info_record(info: dict[str, Any]) -> records.CmIdInfo:
    has_path = info.get("sgid") is not None
    return records.CmIdInfo(
        addr_record(info.get("src")), addr_record(info.get("dst")),
        bytes.fromhex(info["sgid"]) if has_path else bytes(16),
        bytes.fromhex(info["dgid"]) if has_path else bytes(16),
        info.get("dev") or "", int(info["handle"]), int(info["ps"]), int(info["qp_type"]),
        int(info.get("port_num", 1)), int(info.get("sgid_index") or 0), int(has_path),
        int(RdmaState[info["state"]]), int(CmState[info["cm_state"]]),
    )  # fmt: skip


def info_dict(rec: records.CmIdInfo) -> dict[str, Any]:
    path = bool(rec.has_path)
    return {
        "handle": rec.handle, "dev": rec.dev or None, "port_num": rec.port_num, "ps": rec.ps,
        "qp_type": rec.qp_type, "src": addr_value(rec.src), "dst": addr_value(rec.dst),
        "sgid": rec.sgid.hex() if path else None, "dgid": rec.dgid.hex() if path else None,
        "sgid_index": rec.sgid_index if path else None,
        "state": RdmaState(rec.state).name, "cm_state": CmState(rec.cm_state).name,
    }  # fmt: skip


# --- connection parameters -----------------------------------------------------------------

#: the bytes CmConnParam.private_data holds
PRIVATE_DATA_MAX = 256
_CONN_U8 = ("responder_resources", "initiator_depth", "flow_control", "retry_count",
            "rnr_retry_count", "srq")  # fmt: skip


def conn_record(param: dict[str, Any] | None) -> records.CmConnParam:
    p = param or {}
    data = bytes.fromhex(str(p.get("private_data", "") or ""))
    if len(data) > PRIVATE_DATA_MAX:
        raise _bad(f"{len(data)} bytes of private data: at most {PRIVATE_DATA_MAX}")
    small = {k: int(p.get(k, 0)) & 0xFF for k in _CONN_U8}
    return records.CmConnParam(private_data=data, qp_num=int(p.get("qp_num", 0)),
                           qkey=int(p.get("qkey", 0) or 0), private_data_len=len(data),
                           reserved=0, **small)  # fmt: skip


def conn_dict(rec: records.CmConnParam) -> dict[str, Any]:
    if rec.private_data_len > PRIVATE_DATA_MAX:
        raise _bad(f"private_data_len {rec.private_data_len}: at most {PRIVATE_DATA_MAX}")
    out: dict[str, Any] = {k: getattr(rec, k) for k in _CONN_U8}
    out.update(qp_num=rec.qp_num, private_data=rec.private_data[: rec.private_data_len].hex())
    if rec.qkey:
        out["qkey"] = rec.qkey
    return out


def ah_record(ah: dict[str, Any] | None) -> records.AddressVector:
    if not ah:
        return records.AddressVector(bytes(16), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    return records.AddressVector(bytes.fromhex(ah["dgid"]), 0, 0, 0, 0, int(ah.get("is_global", 1)),
                             int(ah.get("port_num", 1)), int(ah["flow_label"]),
                             int(ah["sgid_index"]), int(ah["hop_limit"]),
                             int(ah["traffic_class"]))  # fmt: skip


def ah_dict(rec: records.AddressVector) -> dict[str, Any]:
    return {"dgid": rec.dgid.hex(), "sgid_index": rec.sgid_index, "flow_label": rec.flow_label,
            "hop_limit": rec.hop_limit, "traffic_class": rec.traffic_class,
            "port_num": rec.port_num, "is_global": rec.is_global}  # fmt: skip


# --- QP attributes ------------------------------------------------------------------------

#: the attribute each mask bit of rdma_init_qp_attr's answer names (the address
#: vector apart: it is a record of its own)
_QP_FIELDS = tuple((bit, name) for name, bit in QP_ATTR_MASK.items()
                   if name in {f.name for f in dataclasses.fields(records.QPAttrs)})  # fmt: skip


def qp_attr_record(got: dict[str, Any]) -> records.CmQpAttr:
    a = got["attr"]
    names = [f.name for f in dataclasses.fields(records.QPAttrs)]
    values: dict[str, Any] = {n: int(a.get(n, 0)) for n in names if n not in ("ah", "alt_ah")}
    values["port_num"] = int(a.get("port_num", 1))
    return records.CmQpAttr(records.QPAttrs(ah=ah_record(a.get("ah_attr")), alt_ah=ah_record(None),
                                    **values), int(got["mask"]), 0)  # fmt: skip


def qp_attr_dict(rec: records.CmQpAttr) -> dict[str, Any]:
    attr: dict[str, Any] = {name: getattr(rec.attr, name) for bit, name in _QP_FIELDS
                            if rec.mask & bit}  # fmt: skip
    if rec.mask & IBV_QP_AV:
        attr["ah_attr"] = ah_dict(rec.attr.ah)
    return {"attr": attr, "mask": rec.mask}


# --- events ----------------------------------------------------------------------------------


def event_record(ev: dict[str, Any]) -> records.CmEvent:
    """An agent event (dict) as the record an event channel's socket carries."""
    flags = 0
    info = ev.get("child") or ev.get("info")
    if info:
        flags |= records.CM_EVENT_INFO
    conn, ud = ev.get("conn"), ev.get("ud")
    if conn is not None:
        flags |= records.CM_EVENT_CONN
    elif ud is not None:
        flags |= records.CM_EVENT_UD
    ah = (ud or {}).get("ah_attr")
    if ah:
        flags |= records.CM_EVENT_AH
    if ev.get("mc") is not None:
        flags |= records.CM_EVENT_MC
    empty = records.CmIdInfo(addr_record(None), addr_record(None), bytes(16), bytes(16), "",
                         0, 0, 0, 0, 0, 0, 0, 0)  # fmt: skip
    return records.CmEvent(info_record(info) if info else empty, conn_record(conn or ud),
                       ah_record(ah), addr_record(ev.get("mc")), int(ev["handle"]),
                       int(ev["event"]), int(ev.get("status", 0)),
                       int(ev.get("join_flags", 0)), flags, 0)  # fmt: skip


def event_dict(rec: records.CmEvent) -> dict[str, Any]:
    """A CmEvent as the dict the agent emitted."""
    ev: dict[str, Any] = {"handle": rec.handle, "event": rec.event, "status": rec.status}
    if rec.flags & records.CM_EVENT_INFO:
        key = "child" if rec.event == RDMA_CM_EVENT_CONNECT_REQUEST else "info"
        ev[key] = info_dict(rec.info)
    if rec.flags & (records.CM_EVENT_CONN | records.CM_EVENT_UD):
        param = conn_dict(rec.param)
        if rec.flags & records.CM_EVENT_UD:
            param = {"private_data": param["private_data"], "qp_num": rec.param.qp_num,
                     "qkey": rec.param.qkey}  # fmt: skip
            if rec.flags & records.CM_EVENT_AH:
                param["ah_attr"] = ah_dict(rec.ah)
            ev["ud"] = param
        else:
            ev["conn"] = param
    if rec.flags & records.CM_EVENT_MC:
        ev["mc"] = addr_value(rec.mc)
        ev["join_flags"] = rec.join_flags
    return ev


# --- the commands ------------------------------------------------------------------------------

Kw = dict[str, Any]


def _empty(_: Any) -> records.Empty:
    return records.Empty()


def _none(_: Any) -> None:
    return None


def _handle(kw: Kw) -> records.Handle:
    return records.Handle(int(kw["handle"]), 0)


def _of_handle(r: Any) -> Kw:
    return {"handle": r.handle}


@dataclasses.dataclass(frozen=True)
class Command:
    """One agent command on the protocol (see the module docstring)."""

    op: records.Op[Any, Any]
    method: Callable[..., Any]  #: the CmAgent method (owner=, and sink= for a channel)
    request: Callable[[Kw], Any]  #: client: keyword arguments -> request record
    kwargs: Callable[[Any], Kw]  #: service: request record -> keyword arguments
    reply: Callable[[Any], Any] = _empty  #: service: the agent's result -> reply record
    result: Callable[[Any], Any] = _none  #: client: reply record -> the agent's result


A = CmAgent
COMMANDS: dict[str, Command] = {
    "create_id": Command(
        ops.CM_CREATE_ID, A.create_id,
        lambda kw: records.CmCreateId(int(kw["ps"]), int(kw["qp_type"]),
                                      int(kw.get("channel", 0)), 0),
        lambda r: {"ps": r.ps, "qp_type": r.qp_type, "channel": r.channel},
        lambda handle: records.Handle(int(handle), 0), lambda r: r.handle),
    "destroy_id": Command(ops.CM_DESTROY_ID, A.destroy_id, _handle, _of_handle),
    "migrate_id": Command(
        ops.CM_MIGRATE_ID, A.migrate_id,
        lambda kw: records.CmChannel(int(kw["handle"]), int(kw.get("channel", 0))),
        lambda r: {"handle": r.handle, "channel": r.channel}),
    "query": Command(ops.CM_QUERY, A.query, _handle, _of_handle, info_record, info_dict),
    "bind_addr": Command(
        ops.CM_BIND_ADDR, A.bind_addr,
        lambda kw: records.CmBind(addr_record(kw["addr"]), int(kw["handle"]), 0),
        lambda r: {"handle": r.handle, "addr": addr_value(r.addr)}, info_record, info_dict),
    "resolve_addr": Command(
        ops.CM_RESOLVE_ADDR, A.resolve_addr,
        lambda kw: records.CmResolveAddr(addr_record(kw.get("src")), addr_record(kw["dst"]),
                                     int(kw["handle"]), int(kw.get("timeout_ms", 2000))),
        lambda r: {"handle": r.handle, "src": addr_value(r.src), "dst": addr_value(r.dst),
                   "timeout_ms": r.timeout_ms}),
    "resolve_route": Command(
        ops.CM_RESOLVE_ROUTE, A.resolve_route,
        lambda kw: records.CmTimeout(int(kw["handle"]), int(kw.get("timeout_ms", 2000))),
        lambda r: {"handle": r.handle, "timeout_ms": r.timeout_ms}),
    "listen": Command(
        ops.CM_LISTEN, A.listen,
        lambda kw: records.CmListen(int(kw["handle"]), int(kw.get("backlog", 0))),
        lambda r: {"handle": r.handle, "backlog": r.backlog}, info_record, info_dict),
    "connect": Command(
        ops.CM_CONNECT, A.connect,
        lambda kw: records.CmConnect(conn_record(kw["param"]), int(kw["handle"]), 0),
        lambda r: {"handle": r.handle, "param": conn_dict(r.param)}),
    "accept": Command(
        ops.CM_ACCEPT, A.accept,
        lambda kw: records.CmConnect(conn_record(kw["param"]), int(kw["handle"]), 0),
        lambda r: {"handle": r.handle, "param": conn_dict(r.param)}),
    "establish": Command(ops.CM_ESTABLISH, A.establish, _handle, _of_handle),
    "reject": Command(
        ops.CM_REJECT, A.reject,
        lambda kw: records.CmConnect(conn_record({"private_data": kw.get("private_data", "")}),
                                 int(kw["handle"]), 0),
        lambda r: {"handle": r.handle, "private_data": conn_dict(r.param)["private_data"]}),
    "disconnect": Command(ops.CM_DISCONNECT, A.disconnect, _handle, _of_handle),
    "init_qp_attr": Command(
        ops.CM_INIT_QP_ATTR, A.init_qp_attr,
        lambda kw: records.CmQpState(int(kw["handle"]), int(kw["qp_state"]),
                                     int(kw.get("responder_resources", 0xFF)),
                                     int(kw.get("initiator_depth", 0xFF)), 0, 0),
        lambda r: {"handle": r.handle, "qp_state": r.qp_state,
                   "responder_resources": r.responder_resources,
                   "initiator_depth": r.initiator_depth}, qp_attr_record, qp_attr_dict),
    "set_option": Command(
        ops.CM_SET_OPTION, A.set_option,
        lambda kw: records.CmOption(int(kw["value"]), int(kw["handle"]), int(kw["level"]),
                                int(kw["name"]), int(kw.get("length") or 0)),
        lambda r: {"handle": r.handle, "level": r.level, "name": r.name, "value": r.value,
                   "length": r.length or None}),
    "join_multicast": Command(
        ops.CM_JOIN_MCAST, A.join_multicast,
        lambda kw: records.CmMcast(addr_record(kw["addr"]), int(kw["handle"]),
                               int(kw.get("join_flags", 0))),
        lambda r: {"handle": r.handle, "addr": addr_value(r.addr), "join_flags": r.join_flags}),
    "leave_multicast": Command(
        ops.CM_LEAVE_MCAST, A.leave_multicast,
        lambda kw: records.CmMcast(addr_record(kw["addr"]), int(kw["handle"]), 0),
        lambda r: {"handle": r.handle, "addr": addr_value(r.addr)}),
}  # fmt: skip
#: operation code -> command (what the service serves)
BY_OP: dict[int, Command] = {c.op.code: c for c in COMMANDS.values()}
