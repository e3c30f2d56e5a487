"""The CM agent on a simulated fabric: handshakes, rejects, timeouts, bad MADs.

Every test runs two in-process devices ("a" at 10.0.0.1, "b" at 10.0.0.2) in
a :class:`~softverbs.sim.Simulation`: the virtual clock jumps from timer to
timer, so a connect that retries 15 times over 98 seconds takes no wall
time, and every run is the same.  The CM messages are real MADs on QP1 of
each device; the counters name each one sent and received.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

import pytest
from cm_kit import (
    A,
    B,
    DropMads,
    active,
    cm_counters,
    connect_pair,
    expect,
    fabric_counters,
    listener,
    qp_init,
    requested,
)

from softverbs.cm import mad
from softverbs.cm.agent import RDMA_UDP_QKEY
from softverbs.cm.api import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam, UDParam
from softverbs.cm.gsi import GsiQP
from softverbs.cm.states import CM_TRANSITIONS, RDMA_TRANSITIONS, CmState
from softverbs.enums import (
    IBV_QP_TIMEOUT,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    RAI_PASSIVE,
    RDMA_CM_EVENT_ADDR_ERROR,
    RDMA_CM_EVENT_ADDR_RESOLVED,
    RDMA_CM_EVENT_CONNECT_REQUEST,
    RDMA_CM_EVENT_CONNECT_RESPONSE,
    RDMA_CM_EVENT_DISCONNECTED,
    RDMA_CM_EVENT_ESTABLISHED,
    RDMA_CM_EVENT_REJECTED,
    RDMA_CM_EVENT_TIMEWAIT_EXIT,
    RDMA_CM_EVENT_UNREACHABLE,
    RDMA_OPTION_ID,
    RDMA_OPTION_ID_ACK_TIMEOUT,
    RDMA_PS_IPOIB,
    RDMA_PS_TCP,
    RDMA_PS_UDP,
)
from softverbs.errors import PyverbsRDMAError, PyverbsUserError
from softverbs.sim import Simulation
from softverbs.verbs.addr import AH
from softverbs.verbs.qp import QP, QPAttr

REQ_TIMEOUT_S = (2 * mad.ms_of(18) + mad.ms_of(20)) / 1000  # 6.144 s
SIDR_TIMEOUT_S = mad.ms_of(20) / 1000


@pytest.fixture
def sim() -> Iterator[Simulation]:
    with Simulation(devices=("a", "b")) as s:
        yield s


def test_rc_handshake_traffic_and_disconnect(sim: Simulation) -> None:
    p = connect_pair(7471)
    act, child = p["act"], p["child"]
    assert act.qp.qp_state == child.qp.qp_state == IBV_QPS_RTS
    assert (p["req"].param["qp_num"], p["est"].param["qp_num"]) == (act.qpn, child.qpn)
    assert act.dst_addr == (B, 7471) and child.src_addr == (B, 7471)
    assert child.dst_addr == act.src_addr and act.src_addr[0] == A
    # the passive QP receives from the active's starting PSN and vice versa
    a_attr, _ = act.query_qp(0)
    c_attr, _ = child.query_qp(0)
    assert a_attr.sq_psn == c_attr.rq_psn and c_attr.sq_psn == a_attr.rq_psn
    assert a_attr.dest_qp_num == child.qpn and c_attr.dest_qp_num == act.qpn
    rmr, smr = child.reg_msgs(64), act.reg_msgs(64)
    child.post_recv(rmr)
    smr.write(b"x" * 64, 64)
    act.post_send(smr)
    assert act.get_send_comp().status == 0
    assert child.get_recv_comp().byte_len == 64 and rmr.read(64, 0) == b"x" * 64
    child.disconnect()
    expect(p["ach"], RDMA_CM_EVENT_DISCONNECTED).ack_cm_event()
    act.disconnect()
    expect(p["pch"], RDMA_CM_EVENT_DISCONNECTED).ack_cm_event()
    assert act.qp.qp_state == child.qp.qp_state == IBV_QPS_ERR
    # both leave timewait after the ACK timeout 4.096 us * 2**19 -> 2 s
    expect(p["ach"], RDMA_CM_EVENT_TIMEWAIT_EXIT).ack_cm_event()
    expect(p["pch"], RDMA_CM_EVENT_TIMEWAIT_EXIT).ack_cm_event()
    sent = fabric_counters(sim)
    for msg in ("req", "rep", "rtu", "dreq", "drep"):
        assert sent[f"cm_tx_{msg}"] == sent[f"cm_rx_{msg}"] == 1, (msg, sent)
    assert "cm_retransmits" not in sent


def test_private_data_both_ways(sim: Simulation) -> None:
    req_param = ConnParam(data_len=56)
    req_param.set_private_data(b"from the client")
    rep_param = ConnParam(data_len=196)
    rep_param.set_private_data(b"from the server")
    p = connect_pair(7472, param=req_param, accept_param=rep_param)
    assert p["req"].private_data[:15] == b"from the client"
    assert len(p["req"].private_data) == mad.REQ_PRIVATE_DATA_SIZE - mad.CMA_HEADER_SIZE
    assert p["est"].private_data[:15] == b"from the server"
    assert len(p["est"].private_data) == mad.REP_PRIVATE_DATA_SIZE


def test_too_much_private_data_is_refused(sim: Simulation) -> None:
    _pch, _lst = listener(7473)
    _ach, act = active(7473)
    param = ConnParam(data_len=57)
    param.set_private_data(b"y" * 57)
    with pytest.raises(PyverbsRDMAError) as info:
        act.connect(param)
    assert info.value.error_code == errno.EINVAL


def test_reject_reaches_the_client_with_its_reason_and_data(sim: Simulation) -> None:
    _pch, _lst, ach, act, _req, child = requested(7474)
    child.reject(b"connection rejected")
    rej = expect(ach, RDMA_CM_EVENT_REJECTED)
    assert rej.status == mad.REJ_CONSUMER_DEFINED
    assert rej.private_data[:19] == b"connection rejected"
    assert len(rej.private_data) == mad.REJ_PRIVATE_DATA_SIZE
    assert act.qp.qp_state == IBV_QPS_ERR  # librdmacm moves the QP to ERR


def test_no_listener_is_an_invalid_service_id(sim: Simulation) -> None:
    listener(7475)  # b's CM is up, on another port
    ach, act = active(7476)
    act.connect(ConnParam())
    rej = expect(ach, RDMA_CM_EVENT_REJECTED)
    assert rej.status == mad.REJ_INVALID_SERVICE_ID
    assert fabric_counters(sim)["cm_rej_no_listener"] == 1


def test_a_req_between_two_listens_on_a_port_is_rejected_and_a_retry_connects(
    sim: Simulation,
) -> None:
    """perftest's ``-R``: the server listens on its port for a control connection,
    destroys that listener once it has accepted, and listens on the same port again
    only after a handshake over the control QP -- while the client connects its data
    QP as soon as the handshake is done.  A REQ that comes between the two listens
    finds no listener and is rejected with INVALID_SERVICE_ID (8), as the kernel's
    ``cm_match_req`` rejects it; perftest then retries with a new ID, which connects
    once the port listens again, the control connection untouched."""
    port = 7495

    def connect_on_listening_port() -> tuple[CMID, CMID, CMID]:
        """(the listener, the active ID, the passive ID), connected."""
        pch, lst = listener(port, ip="0.0.0.0")
        ach, act = active(port)
        act.connect(ConnParam())
        req = expect(pch, RDMA_CM_EVENT_CONNECT_REQUEST)
        passive = CMID(creator=req, listen_id=lst)
        req.ack_cm_event()
        passive.create_qp(qp_init(RDMA_PS_TCP))
        passive.accept(ConnParam())
        expect(ach, RDMA_CM_EVENT_ESTABLISHED).ack_cm_event()
        expect(pch, RDMA_CM_EVENT_ESTABLISHED).ack_cm_event()
        return lst, act, passive

    lst, act, control = connect_on_listening_port()
    lst.close()
    # the client's data connection comes before the server listens again
    ch1, early = active(port)
    early.connect(ConnParam())
    rej = expect(ch1, RDMA_CM_EVENT_REJECTED)
    assert rej.status == mad.REJ_INVALID_SERVICE_ID
    rej.ack_cm_event()
    early.close()
    assert fabric_counters(sim)["cm_rej_no_listener"] == 1
    # the port is free again: the connected child of the first listener holds none
    _, retry, data = connect_on_listening_port()
    for a, p in ((act, control), (retry, data)):
        assert a.qp.qp_state == p.qp.qp_state == IBV_QPS_RTS
        assert a.dst_addr == (B, port) and p.src_addr == (B, port)
    assert fabric_counters(sim)["cm_rej_no_listener"] == 1


def test_req_retries_then_unreachable_when_the_peer_is_absent(sim: Simulation) -> None:
    ach, act = active(7477)  # device b has no CM agent: QP1 does not exist there
    act.connect(ConnParam())
    start = sim.now
    ev = expect(ach, RDMA_CM_EVENT_UNREACHABLE, timeout=200)
    assert ev.status == -errno.ETIMEDOUT
    assert sim.now - start == pytest.approx(16 * REQ_TIMEOUT_S)
    counts = cm_counters(act)
    assert counts["cm_tx_req"] == 1 and counts["cm_retransmits"] == 15


def test_sidr_retries_then_unreachable(sim: Simulation) -> None:
    ach, act = active(7478, RDMA_PS_UDP)
    act.connect(ConnParam())
    start = sim.now
    assert expect(ach, RDMA_CM_EVENT_UNREACHABLE, timeout=200).status == -errno.ETIMEDOUT
    assert sim.now - start == pytest.approx(16 * SIDR_TIMEOUT_S)


def test_a_lost_req_is_retransmitted(sim: Simulation) -> None:
    sim.runtime.faults = DropMads(lambda pkt: True, limit=1)
    start = sim.now
    p = connect_pair(7479)
    assert sim.now - start == pytest.approx(REQ_TIMEOUT_S)
    assert cm_counters(p["act"])["cm_retransmits"] == 1
    assert p["act"].qp.qp_state == IBV_QPS_RTS


def test_a_lost_rtu_is_repaired_by_the_rep_retransmission(sim: Simulation) -> None:
    sim.runtime.faults = DropMads(lambda pkt: pkt.payload[17] == mad.ATTR_RTU, limit=1)
    connect_pair(7480)
    counts = fabric_counters(sim)
    assert counts["cm_retransmits"] == 1  # the passive resent its REP
    assert counts["cm_duplicate_rep"] == 1  # the active answered it with the RTU again
    assert counts["cm_rx_rtu"] == 1


def test_duplicate_req_gets_the_delayed_mra(sim: Simulation) -> None:
    pch, _lst, ach, _act, _req, child = requested(7481)
    child.create_qp(qp_init(RDMA_PS_TCP))
    # the passive takes its time: the REQ is resent, and the MRA asks for patience
    with pytest.raises(PyverbsRDMAError):
        CMEvent(ach, timeout=REQ_TIMEOUT_S + 1)
    counts = fabric_counters(sim)
    assert counts["cm_retransmits"] == 1 and counts["cm_tx_mra"] == 1
    assert counts["cm_rx_mra"] == 1 and counts["cm_duplicate_req"] == 1
    child.accept(ConnParam())
    expect(ach, RDMA_CM_EVENT_ESTABLISHED)
    expect(pch, RDMA_CM_EVENT_ESTABLISHED)


def test_lost_drep_ends_in_disconnected_with_etimedout(sim: Simulation) -> None:
    p = connect_pair(7482)
    sim.runtime.faults = DropMads(lambda pkt: pkt.payload[17] == mad.ATTR_DREP)
    p["act"].disconnect()
    expect(p["pch"], RDMA_CM_EVENT_DISCONNECTED)
    start = sim.now
    ev = expect(p["ach"], RDMA_CM_EVENT_DISCONNECTED, timeout=100)
    assert ev.status == -errno.ETIMEDOUT
    assert sim.now - start == pytest.approx(16 * mad.ms_of(19) / 1000)


def test_destroying_a_connected_id_disconnects_the_peer(sim: Simulation) -> None:
    p = connect_pair(7483)
    p["child"].close()
    expect(p["ach"], RDMA_CM_EVENT_DISCONNECTED)
    p["act"].disconnect()  # the DREP to the DREQ: the agent of a gone ID still sees it
    assert fabric_counters(sim)["cm_tx_drep"] == 1


def test_destroying_the_active_id_before_the_reply_rejects(sim: Simulation) -> None:
    pch, _lst, _ach, act, _req, child = requested(7484)
    act.close()
    rej = expect(pch, RDMA_CM_EVENT_REJECTED)
    assert rej.status == mad.REJ_TIMEOUT and rej.id is child._id


def test_ud_sidr_and_datagrams_both_ways(sim: Simulation) -> None:
    p = connect_pair(7485, RDMA_PS_UDP)
    act, child = p["act"], p["child"]
    ud = UDParam(p["est"])
    assert ud.qp_num == child.qpn and ud.qkey == RDMA_UDP_QKEY
    assert ud.ah_attr.dgid == "0000:0000:0000:0000:0000:ffff:0a00:0002"
    rmr, smr = child.reg_msgs(40 + 32), act.reg_msgs(40 + 32)
    child.post_recv(rmr)
    smr.write(b"c" * 32, 32)
    act.post_ud_send(smr, AH(act.pd, attr=ud.ah_attr), rqpn=ud.qp_num, length=32)
    assert act.get_send_comp().status == 0
    wc = child.get_recv_comp()
    assert wc.src_qp == act.qpn and rmr.read(32, 40) == b"c" * 32
    # the reply goes to the sender of the datagram: an AH from the WC and its GRH
    act.post_recv(smr)
    rmr.write(b"s" * 32, 32, 40)
    reply = AH(child.pd, wc=wc, port_num=1, grh=rmr.buf)
    child.post_ud_send(rmr, reply, rqpn=wc.src_qp, length=32)
    assert child.get_send_comp().status == 0
    assert act.get_recv_comp().src_qp == child.qpn
    counts = fabric_counters(sim)
    assert counts["cm_tx_sidr_req"] == counts["cm_rx_sidr_rep"] == 1


def test_ud_without_listener_and_ud_reject_are_unreachable(sim: Simulation) -> None:
    listener(7486, RDMA_PS_UDP)
    ach, act = active(7487, RDMA_PS_UDP)
    act.connect(ConnParam())
    assert expect(ach, RDMA_CM_EVENT_UNREACHABLE).status == mad.SIDR_UNSUPPORTED
    pch, lst = listener(7488, RDMA_PS_UDP)
    ach, act = active(7488, RDMA_PS_UDP)
    act.connect(ConnParam())
    req = expect(pch, RDMA_CM_EVENT_CONNECT_REQUEST)
    CMID(creator=req, listen_id=lst).reject(b"no")
    ev = expect(ach, RDMA_CM_EVENT_UNREACHABLE)
    assert ev.status == mad.SIDR_REJECT and ev.private_data[:2] == b"no"


def test_external_qp_connects_with_init_qp_attr_and_establish(sim: Simulation) -> None:
    from softverbs.verbs.cq import CQ

    pch, lst = listener(7489)
    ach, act = active(7489, qp=False)

    def ext_qp(cmid: CMID) -> QP:
        cq = CQ(cmid.context, 4, None, None, 0)
        init = qp_init(RDMA_PS_TCP)
        init.send_cq = init.recv_cq = cq
        qp = QP(cmid.pd, init, QPAttr())
        for state in (IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS):
            attr, mask = cmid.init_qp_attr(state)
            qp.modify(attr, mask)
        return qp

    with pytest.raises(PyverbsRDMAError):
        act.init_qp_attr(IBV_QPS_RTR)  # nothing to connect to yet
    aqp_cq = CQ(act.context, 4, None, None, 0)
    init = qp_init(RDMA_PS_TCP)
    init.send_cq = init.recv_cq = aqp_cq
    aqp = QP(act.pd, init, QPAttr())
    act.connect(ConnParam(qp_num=aqp.qp_num))
    req = expect(pch, RDMA_CM_EVENT_CONNECT_REQUEST)
    child = CMID(creator=req, listen_id=lst)
    cqp = ext_qp(child)
    child.accept(ConnParam(qp_num=cqp.qp_num))
    resp = expect(ach, RDMA_CM_EVENT_CONNECT_RESPONSE)
    assert resp.param["qp_num"] == cqp.qp_num
    for state in (IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS):
        attr, mask = act.init_qp_attr(state)
        aqp.modify(attr, mask)
    act.establish()
    expect(pch, RDMA_CM_EVENT_ESTABLISHED)
    assert aqp.qp_state == cqp.qp_state == IBV_QPS_RTS
    assert act.get_remote_ece().vendor_id == 0  # softverbs sends no ECE


def test_ack_timeout_option_reaches_the_qps(sim: Simulation) -> None:
    pch, lst = listener(7490)
    ach, act = active(7490)
    act.set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, 21, 1)
    act.connect(ConnParam())
    req = expect(pch, RDMA_CM_EVENT_CONNECT_REQUEST)
    child = CMID(creator=req, listen_id=lst)
    child.create_qp(qp_init(RDMA_PS_TCP))
    child.set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, 21, 1)
    child.accept(ConnParam())
    expect(ach, RDMA_CM_EVENT_ESTABLISHED)
    assert act.query_qp(IBV_QP_TIMEOUT)[0].timeout == 21
    assert child.query_qp(IBV_QP_TIMEOUT)[0].timeout == 21
    _uch, ud = active(7491, RDMA_PS_UDP)
    with pytest.raises(PyverbsRDMAError) as info:
        ud.set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, 21, 1)
    assert info.value.error_code == errno.EINVAL
    with pytest.raises(PyverbsUserError):
        ud.set_option(RDMA_OPTION_ID, 9, 1, 1)  # no such option


def test_addresses_and_ports(sim: Simulation) -> None:
    _ch, lst = listener(7492)
    with pytest.raises(PyverbsRDMAError) as info:
        listener(7492)
    assert info.value.error_code == errno.EADDRINUSE
    ch = CMEventChannel()
    cid = CMID(creator=ch)
    with pytest.raises(PyverbsRDMAError) as info:
        cid.bind_addr(AddrInfo(src="10.9.9.9", src_service="1", flags=RAI_PASSIVE))
    assert info.value.error_code == errno.EADDRNOTAVAIL
    with pytest.raises(PyverbsRDMAError):
        cid.resolve_route()  # no address yet
    cid.resolve_addr(AddrInfo(dst="10.9.9.9", dst_service="7"))
    assert expect(ch, RDMA_CM_EVENT_ADDR_ERROR).status == -errno.EHOSTUNREACH
    # an unspecified source: the destination's own device (loopback)
    ch2 = CMEventChannel()
    loop = CMID(creator=ch2)
    loop.resolve_addr(AddrInfo(dst=B, dst_service="7492"))
    expect(ch2, RDMA_CM_EVENT_ADDR_RESOLVED)
    assert loop.dev_name == "b" and loop.src_addr is not None and loop.src_addr[0] == B
    assert 32768 <= loop.src_addr[1] <= 60999
    with pytest.raises(PyverbsRDMAError) as info:
        CMID(creator=CMEventChannel(), port_space=RDMA_PS_IPOIB)
    assert info.value.error_code == errno.EPROTONOSUPPORT
    with pytest.raises(PyverbsRDMAError) as info:
        lst.join_multicast(addr=AddrInfo(src="230.0.0.1"))  # a listening RC ID
    assert info.value.error_code == errno.EINVAL
    with pytest.raises(PyverbsUserError):
        CMID(creator=CMEvent.__new__(CMEvent))


def test_loopback_connection_on_one_device(sim: Simulation) -> None:
    pch, _lst, ach, act, _req, child = requested(7493, src=A, dst=A)
    child.create_qp(qp_init(RDMA_PS_TCP))
    child.accept(ConnParam())
    expect(ach, RDMA_CM_EVENT_ESTABLISHED)
    expect(pch, RDMA_CM_EVENT_ESTABLISHED)
    assert act.dev_name == child.dev_name == "a"


def test_a_loopback_address_no_device_holds_binds_as_the_wildcard(sim: Simulation) -> None:
    """The kernel's cma_any_addr: rdma_bind_addr(127.0.0.1) acquires no device
    (even with an rxe on ``lo``), and the listener takes a request for any of
    its port's addresses on any device (what libfabric's verbs provider relies
    on when it binds 'localhost').  Here no device holds 127.0.0.1."""
    pch, lst = listener(7494, ip="127.0.0.1")
    assert lst.src_addr == ("127.0.0.1", 7494)
    with pytest.raises(PyverbsRDMAError) as info:
        lst.dev_name  # noqa: B018 -- bound to no device, as a wildcard is
    assert info.value.error_code == errno.ENODEV
    with pytest.raises(PyverbsRDMAError) as info:  # cma_check_port: it holds every address
        listener(7494, ip=B)
    assert info.value.error_code == errno.EADDRNOTAVAIL
    for dst, dev in ((B, "b"), (A, "a")):
        ach, act = active(7494, dst=dst)
        act.connect(ConnParam())
        req = expect(pch, RDMA_CM_EVENT_CONNECT_REQUEST)
        child = CMID(creator=req, listen_id=lst)
        assert child.dev_name == dev and child.src_addr == (dst, 7494)
        child.create_qp(qp_init(RDMA_PS_TCP))
        child.accept(ConnParam())
        expect(ach, RDMA_CM_EVENT_ESTABLISHED)
        expect(pch, RDMA_CM_EVENT_ESTABLISHED)


def _inject(sim: Simulation, dev: str, payload: bytes, opcode: int = 0x64,
            qkey: int = mad.GSI_QKEY) -> None:  # fmt: skip
    from softverbs.wire.packet import Packet

    hca = sim.registry.devices[dev].hca
    pkt = Packet(opcode, mad.GSI_QPN, 0, payload)
    pkt.qkey, pkt.src_qp = qkey, mad.GSI_QPN
    pkt.sgid = b"\x00" * 10 + b"\xff\xff" + bytes([10, 0, 0, 1])
    pkt.dgid = b"\x00" * 10 + b"\xff\xff" + bytes([10, 0, 0, 2])
    with sim.runtime.lock:
        sim.runtime.arrive(hca, pkt)
        sim.runtime.progress()


def test_malformed_mads_are_dropped_and_counted(sim: Simulation) -> None:
    _pch, lst = listener(7494)
    good = mad.Rep(local_comm_id=5, remote_comm_id=12345).encode()
    _inject(sim, "b", good[:100])
    _inject(sim, "b", good, opcode=0x65)  # SEND_ONLY with immediate
    _inject(sim, "b", good[:1] + b"\x04" + good[2:])  # not the CM class
    _inject(sim, "b", good[:16] + b"\x00\x77" + good[18:])  # no such attribute
    _inject(sim, "b", good[:16] + b"\x00\x19" + good[18:])  # LAP: not supported
    _inject(sim, "b", good)  # a REP for no connection
    _inject(sim, "b", mad.Req(private_data=b"\x05" * 92).encode())  # bad rdma_cm header
    _inject(sim, "b", good, qkey=0x1234)  # not the GSI Q_Key: the UD responder drops it
    _inject(sim, "b", mad.Dreq(local_comm_id=9, remote_comm_id=77).encode())
    counts = cm_counters(lst)
    for name in ("bad_length", "bad_opcode", "not_cm", "bad_attr", "unsupported_attr",
                 "unknown_rep", "bad_cma_header", "unknown_dreq"):  # fmt: skip
        assert counts[f"cm_drop_{name}"] == 1, (name, counts)
    assert counts["cm_tx_drep"] == 1  # a DREQ for no connection still gets its DREP
    gsi = sim.registry.devices["b"].hca.qps[mad.GSI_QPN]
    assert isinstance(gsi, GsiQP) and gsi.state == IBV_QPS_RTS
    connect_pair(7494 + 1)  # the agent goes on working


def test_state_tables_are_closed() -> None:
    """Every transition of the two tables leads to a state that exists, and every
    ib_cm state but the passive-side transients can be left again."""
    for (state, action), new in CM_TRANSITIONS.items():
        assert isinstance(state, CmState) and isinstance(new, CmState), action
    for (_state, _action), new in RDMA_TRANSITIONS.items():
        assert new is not None
    exits = {s for (s, _a) in CM_TRANSITIONS}
    stuck = set(CmState) - exits - {CmState.LISTEN}
    assert stuck == set(), stuck


def test_tcp_port_space_constants() -> None:
    assert mad.service_id(RDMA_PS_TCP, 1) == 0x0000000001060001
    assert mad.service_id(RDMA_PS_UDP, 1) == 0x0000000001110001


def test_docs_state_tables_are_generated_from_the_code() -> None:
    import re
    from pathlib import Path

    from softverbs.cm.states import cm_table_markdown

    text = (Path(__file__).resolve().parents[2] / "docs" / "cm.md").read_text()
    m = re.search(r"<!-- BEGIN GENERATED: cm-state-tables -->\n(.*?)\n"
                  r"<!-- END GENERATED: cm-state-tables -->", text, re.S)  # fmt: skip
    assert m, "docs/cm.md lost its generated block"
    assert m.group(1) == cm_table_markdown(), (
        "docs/cm.md is stale: regenerate it with softverbs.cm.states.cm_table_markdown()"
    )


# --- the responder resources and initiator depth: the agent decides them -------------------

MAX_RD = 128  # the device's max_qp_rd_atom and max_qp_init_rd_atom


def _rd(cid: CMID) -> tuple[int, int]:
    attr, _ = cid.query_qp(0)
    return attr.max_dest_rd_atomic, attr.max_rd_atomic


def test_device_defaults_when_both_sides_leave_the_choice(sim: Simulation) -> None:
    """0xFF (RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH) on connect: the device's
    limits; on accept: what the REQ asked for, within the device's limits."""
    p = connect_pair(7591, param=ConnParam(resources=0xFF, depth=0xFF),
                     accept_param=ConnParam(resources=0xFF, depth=0xFF))  # fmt: skip
    assert (p["req"].param["responder_resources"], p["req"].param["initiator_depth"]) == (
        MAX_RD, MAX_RD)
    assert _rd(p["child"]) == (MAX_RD, MAX_RD)
    assert _rd(p["act"]) == (MAX_RD, MAX_RD)


def test_accepted_values_reach_both_qps_crosswise(sim: Simulation) -> None:
    """rdma_accept's values go to its QP (passed with init_qp_attr, before the
    REP) and, through the REP, to the active side's QP crosswise."""
    p = connect_pair(7592, param=ConnParam(resources=6, depth=5),
                     accept_param=ConnParam(resources=3, depth=2))  # fmt: skip
    # an event's parameters are the receiver's view, crosswise (as the kernel's)
    assert (p["req"].param["responder_resources"], p["req"].param["initiator_depth"]) == (5, 6)
    assert _rd(p["child"]) == (3, 2)  # max_dest_rd_atomic = its resources, max_rd_atomic = depth
    assert (p["est"].param["responder_resources"], p["est"].param["initiator_depth"]) == (2, 3)
    assert _rd(p["act"]) == (2, 3)


def test_accept_defaults_follow_the_request(sim: Simulation) -> None:
    p = connect_pair(7593, param=ConnParam(resources=6, depth=5),
                     accept_param=ConnParam(resources=0xFF, depth=0xFF))  # fmt: skip
    # the passive side serves the active's depth and sends up to its resources
    assert _rd(p["child"]) == (5, 6)
    assert _rd(p["act"]) == (6, 5)


@pytest.mark.parametrize("field", ["resources", "depth"])
def test_values_above_the_device_are_refused_by_the_agent(sim: Simulation, field: str) -> None:
    _pch, _lst = listener(7594)
    _ach, act = active(7594)
    with pytest.raises(PyverbsRDMAError) as info:
        act.connect(ConnParam(**{field: MAX_RD + 1}))
    assert info.value.error_code == errno.EINVAL
    name = "responder_resources" if field == "resources" else "initiator_depth"
    assert f"{name} {MAX_RD + 1} exceeds the device's {MAX_RD}" in str(info.value)


def test_accept_above_the_device_is_refused_before_the_rep(sim: Simulation) -> None:
    _pch, _lst, _ach, _act, req, child = requested(7595)
    req.ack_cm_event()
    child.create_qp(qp_init(RDMA_PS_TCP))
    with pytest.raises(PyverbsRDMAError) as info:
        child.accept(ConnParam(resources=MAX_RD + 1))
    assert info.value.error_code == errno.EINVAL
    assert child.qp.qp_state == IBV_QPS_INIT  # nothing moved; no REP went out
    assert fabric_counters(sim)["cm_tx_rep"] == 0


def test_each_mad_goes_through_the_dispatch_checks(sim: Simulation) -> None:
    """ib_cm's one dispatch step (cm/ibcm.py ``_RX``) on an established connection's
    passive side: a MAD naming another connection of the peer's is unknown (a DREQ still
    gets its DREP), a repeat is counted, one its state does not take is unexpected --
    and none of them touches the connection."""
    seen: list[mad.CmMessage] = []
    sim.runtime.faults = DropMads(lambda pkt: bool(seen.append(mad.decode(bytes(pkt.payload)))))
    p = connect_pair(7496)
    rep = next(m for m in seen if isinstance(m, mad.Rep))
    ours, theirs = rep.local_comm_id, rep.remote_comm_id  # b (passive), a (active)
    before = cm_counters(p["child"])
    _inject(sim, "b", mad.Rep(local_comm_id=theirs ^ 1, remote_comm_id=ours).encode())
    _inject(sim, "b", mad.Rtu(local_comm_id=theirs, remote_comm_id=ours).encode())
    _inject(sim, "b", mad.Mra(local_comm_id=theirs, remote_comm_id=ours,
                              message_mraed=mad.MSG_REP).encode())  # fmt: skip
    _inject(sim, "b", mad.Dreq(local_comm_id=theirs ^ 1, remote_comm_id=ours).encode())
    after = cm_counters(p["child"])
    delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert delta == {"cm_rx_rep": 1, "cm_drop_unknown_rep": 1, "cm_rx_rtu": 1,
                     "cm_duplicate_rtu": 1, "cm_rx_mra": 1, "cm_drop_unexpected_mra": 1,
                     "cm_rx_dreq": 1, "cm_drop_unknown_dreq": 1, "cm_tx_drep": 1}, delta
    assert p["child"].qp.qp_state == IBV_QPS_RTS
    p["act"].disconnect()  # the real DREQ names both IDs: taken
    expect(p["pch"], RDMA_CM_EVENT_DISCONNECTED).ack_cm_event()
