"""``pyverbs.cmid`` objects as pyverbs programs use them, on the in-process device.

Synchronous endpoints (``CMID(creator=AddrInfo(...))``) block in their calls,
so the server side runs in a thread, as two processes would run it; the
in-process fabric moves the MADs of both.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from typing import Any

import pytest

from softverbs.cm import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam, UDParam
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

    def send(self, msg: dict[str, Any]) -> None:
        self.sent.append(msg)


@pytest.mark.parametrize(
    "msg",
    [
        {"cmd": "connect", "args": {"handle": 1, "param": 5}},
        {"cmd": "connect", "args": {"handle": "x", "param": {}}},
        {"cmd": "bind_addr", "args": {"handle": 1, "addr": "nonsense"}},
        {"cmd": "bind_addr", "args": {"handle": 1, "addr": ["127.0.0.1", 1 << 40]}},
        {"cmd": "resolve_addr", "args": {"handle": 1, "src": None, "dst": [1, 2, 3]}},
        {"cmd": "create_id", "args": {"ps": "tcp", "qp_type": 2}},
        {"cmd": "create_id", "args": {"ps": 0x106, "qp_type": 2, "bogus": 1}},
        {"cmd": "_destroy", "args": {}},
        {"cmd": "accept", "args": {"handle": 1, "param": {"private_data": "zz"}}},
        {"cmd": "reject", "args": {"handle": 1, "private_data": 7}},
        {"cmd": "nope"},
        {"cmd": "query", "args": []},
    ],
)
def test_the_service_handler_refuses_bad_requests_with_einval(msg: dict[str, Any]) -> None:
    from softverbs.cm import service as cm_service

    svc, client = _FakeService(), _FakeService()
    # a real ID of this client, for the requests that name handle 1
    cm_service.handle(svc, client, {"cmd": "create_id", "args": {"ps": 0x106, "qp_type": 2}})
    with pytest.raises(PyverbsRDMAError) as info:
        cm_service.handle(svc, client, msg)
    assert info.value.error_code in (errno.EINVAL, errno.ENOENT, errno.EPROTONOSUPPORT)
    other = _FakeService()
    with pytest.raises(PyverbsRDMAError) as info:  # another client cannot name our ID
        cm_service.handle(svc, other, {"cmd": "query", "args": {"handle": 1}})
    assert info.value.error_code == errno.ENOENT
    cm_service.drop(svc, client)
