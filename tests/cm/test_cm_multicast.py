"""RDMA CM multicast on a simulated fabric: ``join_multicast``(_ex) and
``leave_multicast`` as librdmacm and the kernel's rdma_cm do them on RoCE.

Two in-process devices ("a" at 10.0.0.1, "b" at 10.0.0.2); each joins the
group with a UD CM ID, as rdma-core's ``rdmacm_multicast_traffic`` and
mckey do, and a SEND to QP 0xFFFFFF reaches the members.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

import pytest
from cm_kit import A, B, expect, listener, qp_init

from softverbs.cm.agent import RDMA_UDP_QKEY
from softverbs.cm.api import CMID, AddrInfo, CMEventChannel, JoinMCAttrEx, UDParam
from softverbs.enums import (
    RDMA_CM_EVENT_ADDR_RESOLVED,
    RDMA_CM_EVENT_MULTICAST_JOIN,
    RDMA_CM_JOIN_MC_ATTR_ADDRESS,
    RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
    RDMA_MC_JOIN_FLAG_FULLMEMBER,
    RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
    RDMA_PS_UDP,
)
from softverbs.errors import PyverbsRDMAError
from softverbs.sim import Simulation
from softverbs.verbs.addr import AH

GROUP = "230.0.0.2"
MCAST_QPN = 0xFFFFFF
GRH = 40


@pytest.fixture
def sim() -> Iterator[Simulation]:
    with Simulation(devices=("a", "b")) as s:
        yield s


def member(src: str, group: str = GROUP, flags: int | None = None,
           qp: bool = True) -> tuple[CMEventChannel, CMID, UDParam]:  # fmt: skip
    """A UD CM ID on ``src``'s device that resolved ``group`` and joined it."""
    ch = CMEventChannel()
    cid = CMID(creator=ch, port_space=RDMA_PS_UDP)
    cid.resolve_addr(AddrInfo(src=src, dst=group, port_space=RDMA_PS_UDP))
    expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED).ack_cm_event()
    if qp:
        cid.create_qp(qp_init(RDMA_PS_UDP))
    if flags is None:
        cid.join_multicast(addr=AddrInfo(src=group))
    else:
        mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS
        cid.join_multicast(mc_attr=JoinMCAttrEx(AddrInfo(src=group), mask, flags))
    ev = expect(ch, RDMA_CM_EVENT_MULTICAST_JOIN)
    ud = UDParam(ev)
    ev.ack_cm_event()
    return ch, cid, ud


def send(cid: CMID, ud: UDParam, data: bytes) -> None:
    mr = cid.reg_msgs(len(data))
    mr.write(data, len(data))
    cid.post_ud_send(mr, AH(cid.pd, attr=ud.ah_attr), rqpn=MCAST_QPN, length=len(data))
    assert cid.get_send_comp().status == 0


def test_join_event_carries_the_groups_ud_param(sim: Simulation) -> None:
    _, cid, ud = member(A)
    assert ud.qp_num == MCAST_QPN
    assert ud.qkey == RDMA_UDP_QKEY
    ah = ud.ah_attr
    assert ah.is_global == 1
    # RoCEv2: the group's IPv4-mapped address; the kernel's hop limit for it
    assert str(ah.gr.dgid) == "0000:0000:0000:0000:0000:ffff:e600:0002"
    assert ah.gr.hop_limit == 64
    assert cid.query_qp(0)[0].qkey == RDMA_UDP_QKEY


def test_send_reaches_members_on_both_devices_until_they_leave(sim: Simulation) -> None:
    _, sender, ud = member(A)
    _, receiver, _ = member(B)
    rmr = receiver.reg_msgs(GRH + 64)
    smr = sender.reg_msgs(GRH + 64)
    receiver.post_recv(rmr)
    sender.post_recv(smr)  # the sender joined as a full member: it hears itself too
    send(sender, ud, b"m" * 32)
    wc = receiver.get_recv_comp()
    assert wc.status == 0 and wc.byte_len == GRH + 32 and wc.src_qp == sender.qpn
    assert rmr.read(32, GRH) == b"m" * 32
    assert sender.get_recv_comp().byte_len == GRH + 32
    # after leaving, the receiver's QP is detached: the next SEND is not delivered
    receiver.leave_multicast(AddrInfo(src=GROUP))
    receiver.post_recv(rmr)
    sender.post_recv(smr)
    send(sender, ud, b"n" * 32)
    assert sender.get_recv_comp().byte_len == GRH + 32
    assert receiver.qp.rcq.poll(1)[0] == 0  # nothing for the detached QP
    with pytest.raises(PyverbsRDMAError) as info:
        receiver.leave_multicast(AddrInfo(src=GROUP))
    assert info.value.error_code == errno.EADDRNOTAVAIL


def test_send_only_join_does_not_attach(sim: Simulation) -> None:
    _, sender, ud = member(A, flags=RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
    _, receiver, _ = member(B, flags=RDMA_MC_JOIN_FLAG_FULLMEMBER)
    rmr = receiver.reg_msgs(GRH + 16)
    smr = sender.reg_msgs(GRH + 16)
    receiver.post_recv(rmr)
    sender.post_recv(smr)
    send(sender, ud, b"s" * 16)
    assert receiver.get_recv_comp().byte_len == GRH + 16
    assert sender.qp.rcq.poll(1)[0] == 0  # send-only: the sender's QP is not a member
    copies = sum(d.hca.counters["mcast_rcvd_pkts"] for d in sim.registry.devices.values())
    assert copies == 1  # one device has a member: b


def test_errors(sim: Simulation) -> None:
    ch = CMEventChannel()
    idle = CMID(creator=ch, port_space=RDMA_PS_UDP)
    with pytest.raises(PyverbsRDMAError) as info:  # neither bound nor resolved
        idle.join_multicast(addr=AddrInfo(src=GROUP))
    assert info.value.error_code == errno.EINVAL
    _, lst = listener(7600)  # an RC ID
    with pytest.raises(PyverbsRDMAError) as info:
        lst.join_multicast(addr=AddrInfo(src=GROUP))
    assert info.value.error_code == errno.EINVAL
    _, cid, _ = member(A)
    with pytest.raises(PyverbsRDMAError) as info:
        cid.join_multicast(addr=AddrInfo(src=B))  # a unicast address
    assert info.value.error_code == errno.EINVAL and "not a multicast address" in str(info.value)
    with pytest.raises(PyverbsRDMAError) as info:
        cid.join_multicast(mc_attr=JoinMCAttrEx(AddrInfo(src=GROUP), 1 << 2, 0))
    assert info.value.error_code == errno.ENOTSUP
    with pytest.raises(PyverbsRDMAError) as info:
        cid.join_multicast(mc_attr=JoinMCAttrEx(AddrInfo(src=GROUP),
                                                RDMA_CM_JOIN_MC_ATTR_ADDRESS, 0))  # fmt: skip
    assert info.value.error_code == errno.EINVAL
    with pytest.raises(PyverbsRDMAError) as info:
        cid.leave_multicast(AddrInfo(src="230.9.9.9"))
    assert info.value.error_code == errno.EADDRNOTAVAIL
