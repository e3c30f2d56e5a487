"""UD multicast on every kind of device: ``ibv_attach_mcast``/``ibv_detach_mcast``,
a SEND to QP 0xFFFFFF reaching each attached QP with its GRH, and rdma-core's
errno rules (EINVAL for a QP that is not UD, a GID that is not multicast, a
detach of a QP that is not attached; EBUSY for destroying an attached QP)."""

from __future__ import annotations

import errno
import ipaddress
import random

import pytest
from scenario_kit import (
    AH,
    CQ,
    MR,
    QKEY,
    RECV_OFF,
    AHAttr,
    Context,
    Side,
    assert_cq_empty,
    check_wc,
    gid_index,
    make_pair,
    make_qp,
    poll_exact,
    raises_errno,
    recv_wr,
    send_wr,
    stats,
    wait_until,
)

from softverbs import GID, GlobalRoute
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_QPT_RC,
    IBV_QPT_UD,
    IBV_WC_GRH,
    IBV_WC_RECV,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
)

MCAST_QPN = 0xFFFFFF


def _group() -> tuple[str, GID]:
    """A multicast group of this test alone (tests run in parallel on one host)."""
    ip = f"230.{random.randint(0, 255)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
    return ip, GID(f"::ffff:{ip}")


def _mc_ah(ctx: Context, pd, mgid: GID) -> AH:
    index = gid_index(ctx)
    gr = GlobalRoute(dgid=mgid, sgid_index=index, hop_limit=1)
    return AH(pd, attr=AHAttr(is_global=1, port_num=1, gr=gr))


def _third(ctx: Context, pd) -> Side:
    cq = CQ(ctx, 64)
    qp = make_qp(pd, IBV_QPT_UD, cq, cq)
    mr = MR(pd, 1 << 16, IBV_ACCESS_LOCAL_WRITE)
    return Side(qp, cq, cq, mr)


def test_device_offers_multicast(ctx):
    attr = ctx.query_device()
    assert attr.max_mcast_grp == 8192  # rxe's limits
    assert attr.max_mcast_qp_attach == 56
    assert attr.max_total_mcast_qp_attach == 0x70000


def test_send_reaches_every_attached_qp_with_its_grh(ctx):
    p = make_pair(ctx, IBV_QPT_UD)
    a, b = p.a, p.b
    c = _third(ctx, p.pd)
    ip, mgid = _group()
    b.qp.attach_mcast(mgid)
    c.qp.attach_mcast(mgid)
    c.qp.attach_mcast(mgid)  # again: no error, still one membership (rxe)
    for side in (b, c):
        side.qp.post_recv(recv_wr(7, side, 40 + 64))
    a.write(b"to the whole group")
    wr = send_wr(1, a, 18)
    wr.set_wr_ud(_mc_ah(ctx, p.pd, mgid), MCAST_QPN, QKEY)
    a.qp.post_send(wr)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)
    for side in (b, c):
        wc = poll_exact(side.rcq, 1, what="the multicast SEND")[0]
        check_wc(wc, 7, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=40 + 18, qp=side.qp)
        assert wc.wc_flags & IBV_WC_GRH
        assert wc.src_qp == a.qp.qp_num
        grh = side.read(40, RECV_OFF)
        # IPv4: 20 zero bytes, then the IPv4 header; its destination is the group
        assert grh[:20] == bytes(20)
        assert grh[36:40] == ipaddress.IPv4Address(ip).packed
        assert side.read(18, RECV_OFF + 40) == b"to the whole group"
    assert_cq_empty(c.rcq, "one attachment, one copy")
    assert_cq_empty(a.rcq, "the sender is not a member")


def test_detach_stops_delivery_and_a_group_without_members_drops(ctx):
    p = make_pair(ctx, IBV_QPT_UD)
    a, b = p.a, p.b
    _, mgid = _group()
    b.qp.attach_mcast(mgid)
    b.qp.detach_mcast(mgid)
    b.qp.post_recv(recv_wr(7, b, 40 + 64))
    s0 = stats(ctx)
    wr = send_wr(1, a, 16)
    wr.set_wr_ud(_mc_ah(ctx, p.pd, mgid), MCAST_QPN, QKEY)
    a.qp.post_send(wr)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)
    if ctx.kind == "udp":  # type: ignore[attr-defined]
        # the device left the IP group: the datagram goes nowhere on this host
        assert_cq_empty(b.rcq, "a detached QP receives nothing", settle=0.2)
        return
    wait_until(lambda: stats(ctx)["drop_mcast_no_member"] > s0["drop_mcast_no_member"], ctx,
               what="drop_mcast_no_member")  # fmt: skip
    assert_cq_empty(b.rcq, "a detached QP receives nothing")
    # attached again, it receives the next one
    b.qp.attach_mcast(mgid)
    a.qp.post_send(wr)
    check_wc(poll_exact(b.rcq, 1)[0], 7, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=56)
    b.qp.detach_mcast(mgid)


def test_errno_rules(ctx, pd):
    _, mgid = _group()
    cq = CQ(ctx, 16)
    rc = make_qp(pd, IBV_QPT_RC, cq, cq)
    ud = make_qp(pd, IBV_QPT_UD, cq, cq)
    with raises_errno(errno.EINVAL, "only UD"):
        rc.attach_mcast(mgid)
    with raises_errno(errno.EINVAL, "not a multicast GID"):
        ud.attach_mcast(ctx.query_gid(1, gid_index(ctx)))
    with raises_errno(errno.EINVAL, "not a multicast GID"):
        ud.attach_mcast(GID("::ffff:192.168.0.1"))
    with raises_errno(errno.EINVAL, "not attached"):
        ud.detach_mcast(mgid)
    ud.attach_mcast(GID("ff0e::1:2"))  # an IPv6 group GID is one too
    ud.detach_mcast(GID("ff0e::1:2"))
    ud.attach_mcast(mgid)
    ud.detach_mcast(mgid)
    with raises_errno(errno.EINVAL, "not attached"):
        ud.detach_mcast(mgid)


def test_attached_qp_close_detaches(ctx, pd):
    """pyverbs' close() cleans up (as a process exit does); the C library's
    ibv_destroy_qp gets EBUSY instead (tests/native)."""
    _, mgid = _group()
    cq = CQ(ctx, 16)
    ud = make_qp(pd, IBV_QPT_UD, cq, cq)
    ud.attach_mcast(mgid)
    ud.close()
    ud2 = make_qp(pd, IBV_QPT_UD, cq, cq)
    with raises_errno(errno.EINVAL, "not attached"):
        ud2.detach_mcast(mgid)


@pytest.mark.parametrize("bad", ["not a GID", None])
def test_bad_arguments_are_user_errors(ctx, pd, bad):
    from softverbs import PyverbsUserError

    cq = CQ(ctx, 16)
    ud = make_qp(pd, IBV_QPT_UD, cq, cq)
    with pytest.raises((PyverbsUserError, TypeError)):
        ud.attach_mcast(bad)  # type: ignore[arg-type]


def test_block_self_mcast_lb(ctx, pd):
    """A member created with IBV_QP_CREATE_BLOCK_SELF_MCAST_LB does not get its
    own sends (mckey -l); the group's other members do."""
    from softverbs import QP, QPAttr, QPCap, QPInitAttrEx
    from softverbs.enums import (
        IBV_QP_CREATE_BLOCK_SELF_MCAST_LB,
        IBV_QP_INIT_ATTR_CREATE_FLAGS,
        IBV_QP_INIT_ATTR_PD,
    )

    _, mgid = _group()
    cq = CQ(ctx, 64)
    init = QPInitAttrEx(qp_type=IBV_QPT_UD, pd=pd, scq=cq, rcq=cq,
                        cap=QPCap(max_send_wr=4, max_recv_wr=4),
                        comp_mask=IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
                        create_flags=IBV_QP_CREATE_BLOCK_SELF_MCAST_LB)  # fmt: skip
    attr = QPAttr()
    attr.qkey = QKEY
    qp = QP(ctx, init, attr)
    mr = MR(pd, 1 << 16, IBV_ACCESS_LOCAL_WRITE)
    me = Side(qp, cq, cq, mr)
    other = _third(ctx, pd)
    for side in (me, other):
        side.qp.attach_mcast(mgid)
        side.qp.post_recv(recv_wr(7, side, 40 + 64))
    wr = send_wr(1, me, 16)
    wr.set_wr_ud(_mc_ah(ctx, pd, mgid), MCAST_QPN, QKEY)
    me.qp.post_send(wr)
    check_wc(poll_exact(other.rcq, 1)[0], 7, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=56)
    wcs = poll_exact(cq, 1)  # the send's completion only
    check_wc(wcs[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)
    assert_cq_empty(cq, "its own send is not looped back", settle=0.1)
    for side in (me, other):
        side.qp.detach_mcast(mgid)
