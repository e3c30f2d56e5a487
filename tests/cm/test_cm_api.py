"""``pyverbs.cmid`` objects as pyverbs programs use them, on the in-process device.

Synchronous endpoints (``CMID(creator=AddrInfo(...))``) block in their calls,
so the server side runs in a thread, as two processes would run it; the
in-process fabric moves the MADs of both.
"""

from __future__ import annotations

import dataclasses
import errno
import threading
from collections.abc import Callable
from typing import Any

import pytest

from softverbs.cm.api import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam, UDParam
from softverbs.enums import (
    IBV_QPS_RTS,
    IBV_QPT_RC,
    IBV_QPT_UD,
    RAI_NUMERICHOST,
    RAI_PASSIVE,
    RDMA_CM_EVENT_ADDR_RESOLVED,
    RDMA_PS_TCP,
    RDMA_PS_UDP,
)
from softverbs.errors import PyverbsRDMAError, PyverbsUserError
from softverbs.verbs.qp import QPCap, QPInitAttr

IP = "127.0.0.1"  #: sv0's address


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _endpoints(port: int) -> tuple[CMID, CMID]:
    init = QPInitAttr(qp_type=IBV_QPT_RC, cap=QPCap(max_send_wr=2, max_recv_wr=2))
    server = CMID(creator=AddrInfo(src=IP, src_service=str(port), port_space=RDMA_PS_TCP,
                                   flags=RAI_PASSIVE), qp_init_attr=init)  # fmt: skip
    server.listen()
    client = CMID(creator=AddrInfo(src=IP, dst=IP, dst_service=str(port),
                                   port_space=RDMA_PS_TCP),
                  qp_init_attr=QPInitAttr(qp_type=IBV_QPT_RC, cap=QPCap()))  # fmt: skip
    return server, client


def test_synchronous_endpoints_connect_move_data_and_disconnect() -> None:
    server, client = _endpoints(17471)
    assert client.qp is not None and client.event_channel is None
    assert client.dev_name == "sv0" and client.context is not None and client.pd is not None

    def serve() -> CMID:
        child = server.get_request()
        assert child.qp is not None  # made from the listener's qp_init_attr
        child.accept()
        return child

    t, out = _in_thread(serve)
    client.connect()
    t.join(10)
    assert "error" not in out, out.get("error")
    child: CMID = out["result"]
    assert client.qp.qp_state == child.qp.qp_state == IBV_QPS_RTS
    rmr, smr = child.reg_msgs(32), client.reg_msgs(32)
    child.post_recv(rmr)
    smr.write(b"ping" * 8, 32)
    client.post_send(smr)
    assert client.get_send_comp().status == 0
    assert child.get_recv_comp().byte_len == 32 and rmr.read(4, 0) == b"ping"
    # each side's synchronous disconnect returns when it saw DISCONNECTED
    t, out = _in_thread(child.disconnect)
    client.disconnect()
    t.join(10)
    assert "error" not in out, out.get("error")
    for cm in (child, client, server):
        cm.close()
        cm.close()  # idempotent


def test_synchronous_connect_refused_by_reject() -> None:
    server, client = _endpoints(17472)

    def refuse() -> None:
        server.get_request().reject(b"no")

    t, out = _in_thread(refuse)
    with pytest.raises(PyverbsRDMAError) as info:
        client.connect()
    t.join(10)
    assert "error" not in out
    assert info.value.error_code == errno.ECONNREFUSED
    server.close()
    client.close()


def test_get_request_needs_a_synchronous_listener() -> None:
    cm = CMID(creator=CMEventChannel())
    with pytest.raises(PyverbsRDMAError) as info:
        cm.get_request()
    assert info.value.error_code == errno.EINVAL


def test_addrinfo() -> None:
    ai = AddrInfo(src=IP, src_service="7471", flags=RAI_PASSIVE, port_space=RDMA_PS_UDP)
    assert ai.src_addr == (IP, 7471) and ai.dst_addr is None and ai.qp_type == IBV_QPT_UD
    wild = AddrInfo(src_service="7471", flags=RAI_PASSIVE)
    assert wild.src_addr == ("0.0.0.0", 7471) and wild.qp_type == IBV_QPT_RC
    both = AddrInfo(src=IP, dst=IP, dst_service="99")
    assert both.src_addr == (IP, 0) and both.dst_addr == (IP, 99)
    only_src = AddrInfo(src="230.0.0.1")  # a multicast group, as rdma-core's tests make one
    assert only_src.src_addr == ("230.0.0.1", 0) and only_src.dst_addr is None
    with pytest.raises(PyverbsRDMAError):
        AddrInfo(dst="not a host name at all.invalid", dst_service="1", flags=RAI_NUMERICHOST)
    with pytest.raises(PyverbsRDMAError):
        AddrInfo(src="::1", dst=IP, dst_service="1")
    ai.close()


def test_connparam_follows_pyverbs() -> None:
    p = ConnParam()
    assert (p.responder_resources, p.initiator_depth, p.retry_count, p.rnr_retry_count) == (
        1, 1, 5, 5)  # fmt: skip
    p.set_private_data(b"ignored")  # data_len 0: nothing is kept
    assert p.private_data == b""
    q = ConnParam(data_len=4, qp_num=7)
    q.set_private_data(b"abcdefgh")
    assert q.private_data == b"abcd" and q.qpn == 7
    q.qpn = 9
    assert q.qp_num == 9 and "qp number" in str(q)


def test_events_are_acknowledged_once_and_typed() -> None:
    ch = CMEventChannel()
    cm = CMID(creator=ch)
    cm.resolve_addr(AddrInfo(src=IP, dst=IP, dst_service="17473"))
    ev = CMEvent(ch, timeout=5)
    assert ev.event_type == RDMA_CM_EVENT_ADDR_RESOLVED and ev.status == 0
    assert ev.event_str() == "RDMA_CM_EVENT_ADDR_RESOLVED"
    ev.ack_cm_event()
    assert ev.event_str() == ""
    with pytest.raises(PyverbsRDMAError):
        ev.ack_cm_event()
    with pytest.raises(PyverbsRDMAError) as info:
        CMEvent(ch, timeout=0.05)
    assert info.value.error_code == errno.EAGAIN
    with pytest.raises(PyverbsUserError):
        UDParam(None)  # type: ignore[arg-type]
    with pytest.raises(PyverbsUserError):
        CMEvent(None)  # type: ignore[arg-type]
    with pytest.raises(PyverbsRDMAError):
        CMID(creator=object())
    cm.close()
    with pytest.raises(PyverbsUserError):
        cm.resolve_route()


class _FakeService:
    """Just enough of softverbsd for the CM request handler."""

    def __init__(self) -> None:
        from softverbs.verbs.registry import Registry

        self.registry = Registry()
        self.sent: list[dict[str, Any]] = []

    def device(self, name: str) -> Any:
        return self.registry.open(name)

    def cm_event(self, client: Any, channel: int, event: dict[str, Any]) -> None:
        self.sent.append(event)


def _bad_requests() -> list[tuple[Any, Any, int]]:
    from softverbs.cm import wire
    from softverbs.device import ops, records

    addr = wire.addr_record(["127.0.0.1", 7000])
    nowhere = records.CmAddr(bytes(16), 7, 1, 0)  # an unknown family
    none = wire.addr_record(None)
    long_data = dataclasses.replace(wire.conn_record({}), private_data_len=200 + 100)
    return [
        (ops.CM_BIND_ADDR, records.CmBind(nowhere, 1, 0), errno.EINVAL),
        (ops.CM_BIND_ADDR, records.CmBind(none, 1, 0), errno.EINVAL),
        (ops.CM_RESOLVE_ADDR, records.CmResolveAddr(addr, none, 1, 2000), errno.EINVAL),
        (ops.CM_RESOLVE_ADDR, records.CmResolveAddr(nowhere, addr, 1, 2000), errno.EINVAL),
        (ops.CM_CREATE_ID, records.CmCreateId(0x999, 2, 0, 0), errno.EPROTONOSUPPORT),
        (ops.CM_CONNECT, records.CmConnect(long_data, 1, 0), errno.EINVAL),
        (ops.CM_ACCEPT, records.CmConnect(wire.conn_record({}), 1, 0), errno.EINVAL),
        (ops.CM_ESTABLISH, records.Handle(1, 0), errno.EINVAL),
        (ops.CM_REJECT, records.CmConnect(wire.conn_record({}), 1, 0), errno.EINVAL),
        (ops.CM_INIT_QP_ATTR, records.CmQpState(1, 1, 0xFF, 0xFF, 0, 0), errno.EINVAL),
        (ops.CM_SET_OPTION, records.CmOption(1, 1, 0, 99, 4), errno.ENOSYS),
        (ops.CM_JOIN_MCAST, records.CmMcast(none, 1, 0), errno.EINVAL),
        (ops.CM_LEAVE_MCAST, records.CmMcast(addr, 1, 0), errno.EADDRNOTAVAIL),
        (ops.CM_QUERY, records.Handle(99, 0), errno.ENOENT),
    ]


@pytest.mark.parametrize("op,req,code", _bad_requests(), ids=lambda v: getattr(v, "name", ""))
def test_the_service_handler_refuses_bad_requests(op: Any, req: Any, code: int) -> None:
    """A CM_* record that does not hold what its command takes is an errno, never a crash."""
    from softverbs.cm import service as cm_service
    from softverbs.device import ops, records

    svc, client = _FakeService(), _FakeService()
    # a real ID of this client, for the requests that name handle 1
    got = cm_service.handle(svc, client, ops.CM_CREATE_ID.code, records.CmCreateId(0x106, 2, 0, 0))
    assert got == records.Handle(1, 0)
    with pytest.raises(PyverbsRDMAError) as info:
        cm_service.handle(svc, client, op.code, req)
    assert info.value.error_code == code, info.value
    other = _FakeService()
    with pytest.raises(PyverbsRDMAError) as info:  # another client cannot name our ID
        cm_service.handle(svc, other, ops.CM_QUERY.code, records.Handle(1, 0))
    assert info.value.error_code == errno.ENOENT
    cm_service.drop(svc, client)


def test_every_agent_command_is_one_cm_operation() -> None:
    """The service's CM table covers every CM_* operation, each with its agent method."""
    from softverbs.cm import wire
    from softverbs.cm.agent import CmAgent
    from softverbs.device import ops

    served = {c.op for c in wire.COMMANDS.values()}
    assert served == set(ops.CM_OPS) - {ops.CM_EVENTS}
    for name, cmd in wire.COMMANDS.items():
        assert cmd.method is getattr(CmAgent, name)


def test_events_and_answers_survive_their_records() -> None:
    """What the agent says, packed as the protocol's records and read back, is the same."""
    from softverbs.cm import wire
    from softverbs.device import records

    info = {"handle": 3, "dev": "sv0", "port_num": 1, "ps": 0x106, "qp_type": 2,
            "src": ["10.0.0.1", 7000], "dst": ["fe80::1", 9], "sgid": "aa" * 16,
            "dgid": "bb" * 16, "sgid_index": 1, "state": "CONNECT", "cm_state": "REQ_RCVD"}
    conn = {"responder_resources": 1, "initiator_depth": 2, "flow_control": 1,
            "retry_count": 7, "rnr_retry_count": 6, "srq": 0, "qp_num": 0x11,
            "private_data": "0102"}
    ah = {"dgid": "cc" * 16, "sgid_index": 0, "flow_label": 5, "hop_limit": 64,
          "traffic_class": 0, "port_num": 1, "is_global": 1}
    events = [
        {"handle": 1, "event": 4, "status": 0, "child": info, "conn": conn},
        {"handle": 1, "event": 0, "status": 0, "info": dict(info, sgid=None, dgid=None,
                                                            sgid_index=None)},
        {"handle": 2, "event": 9, "status": 0,
         "ud": {"private_data": "", "qp_num": 0xFFFFFF, "qkey": 0x1234, "ah_attr": ah},
         "mc": ["239.1.1.1", 0], "join_flags": 0},
        {"handle": 2, "event": 8, "status": 28, "conn": dict(conn, private_data="ff" * 148)},
    ]
    for ev in events:
        rec = records.CmEvent.unpack(wire.event_record(ev).pack())
        assert wire.event_dict(rec) == ev
    got = {"attr": {"qp_state": 3, "ah_attr": ah, "path_mtu": 3, "dest_qp_num": 7,
                    "rq_psn": 9, "max_dest_rd_atomic": 1, "min_rnr_timer": 0}, "mask": 0}
    from softverbs.enums import (
        IBV_QP_AV,
        IBV_QP_DEST_QPN,
        IBV_QP_MAX_DEST_RD_ATOMIC,
        IBV_QP_MIN_RNR_TIMER,
        IBV_QP_PATH_MTU,
        IBV_QP_RQ_PSN,
        IBV_QP_STATE,
    )

    got["mask"] = int(IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN
                      | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
    rec2 = records.CmQpAttr.unpack(wire.qp_attr_record(got).pack())
    assert wire.qp_attr_dict(rec2) == got
    assert wire.info_dict(records.CmIdInfo.unpack(wire.info_record(info).pack())) == info
