"""QP states seen from a program: SQD draining, query, CQ overrun, constructor states."""

from __future__ import annotations

import errno

import pytest
from scenario_kit import (
    ALL_ACCESS,
    QKEY,
    assert_cq_empty,
    assert_no_event,
    check_wc,
    connect,
    expect_event,
    gid_index,
    make_pair,
    make_qp,
    modify_state,
    poll_exact,
    poll_n,
    raises_errno,
    recv_wr,
    send_wr,
    stats,
    wait_until,
    write_wr,
)

from softverbs import CQ, PD, QP, QPAttr, QPCap, QPInitAttr
from softverbs.enums import (
    IBV_EVENT_CQ_ERR,
    IBV_EVENT_QP_FATAL,
    IBV_EVENT_SQ_DRAINED,
    IBV_MTU_2048,
    IBV_QP_EN_SQD_ASYNC_NOTIFY,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_WC_RDMA_WRITE,
    IBV_WC_RECV,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
)

NOTIFY = {"en_sqd_async_notify": (IBV_QP_EN_SQD_ASYNC_NOTIFY, 1)}


# --- SQD ----------------------------------------------------------------------------------
def test_sqd_drains_in_flight_then_notifies(ctx):
    p = make_pair(ctx, IBV_QPT_RC, conn={"rnr_retry": 7}, conn_b={"min_rnr_timer": 1})
    a, b = p.a, p.b
    s0 = stats(ctx)
    a.qp.post_send(send_wr(1, a, 8))  # in flight: b has no receive, RNR NAKs
    wait_until(lambda: stats(ctx)["rcvd_rnr_err"] > s0["rcvd_rnr_err"], ctx, what="an RNR NAK")
    modify_state(a.qp, IBV_QPS_SQD, **NOTIFY)
    assert a.qp.qp_state == IBV_QPS_SQD
    attr, _ = a.qp.query()
    assert attr.qp_state == IBV_QPS_SQD
    assert attr.sq_draining == 1
    assert_no_event(ctx)  # WR 1 has not completed yet
    a.qp.post_send(send_wr(2, a, 8))  # posted in SQD: waits for SQD -> RTS
    b.qp.post_recv(recv_wr(10, b, 64))
    b.qp.post_recv(recv_wr(11, b, 64))
    check_wc(poll_n(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)
    expect_event(ctx, IBV_EVENT_SQ_DRAINED, a.qp)
    attr, _ = a.qp.query()
    assert attr.sq_draining == 0
    assert_cq_empty(a.scq, "WR 2 must wait for SQD -> RTS")
    check_wc(poll_exact(b.rcq, 1)[0], 10, IBV_WC_SUCCESS, IBV_WC_RECV)
    modify_state(a.qp, IBV_QPS_RTS)
    check_wc(poll_exact(a.scq, 1)[0], 2, IBV_WC_SUCCESS, IBV_WC_SEND)
    check_wc(poll_exact(b.rcq, 1)[0], 11, IBV_WC_SUCCESS, IBV_WC_RECV)
    assert_no_event(ctx)


def test_sqd_with_nothing_in_flight_notifies_at_once(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    modify_state(p.a.qp, IBV_QPS_SQD, **NOTIFY)
    expect_event(ctx, IBV_EVENT_SQ_DRAINED, p.a.qp)
    assert p.a.qp.query()[0].sq_draining == 0


def test_sqd_without_notify_posts_no_event(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    a.qp.post_send(write_wr(1, a, b, 8))
    modify_state(a.qp, IBV_QPS_SQD)
    assert_no_event(ctx)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)


@pytest.mark.parametrize("qp_type", [IBV_QPT_UC, IBV_QPT_UD])
def test_sqd_uc_ud(ctx, qp_type):
    p = make_pair(ctx, qp_type)
    a, b = p.a, p.b
    modify_state(a.qp, IBV_QPS_SQD, **NOTIFY)
    expect_event(ctx, IBV_EVENT_SQ_DRAINED, a.qp)
    wr = send_wr(1, a, 8)
    if qp_type == IBV_QPT_UD:
        wr.set_wr_ud(p.ah(), b.qp.qp_num, QKEY)
    b.qp.post_recv(recv_wr(5, b, 128))
    a.qp.post_send(wr)
    assert_cq_empty(a.scq)
    assert_cq_empty(b.rcq)
    modify_state(a.qp, IBV_QPS_RTS)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)
    check_wc(poll_exact(b.rcq, 1)[0], 5, IBV_WC_SUCCESS, IBV_WC_RECV)


# --- query ---------------------------------------------------------------------------------
def test_query_returns_the_attributes_set(ctx):
    p = make_pair(ctx, IBV_QPT_RC, connected=False, sq_sig_all=0, max_send_wr=9,
                  max_recv_wr=7, max_send_sge=3, max_recv_sge=2, max_inline_data=48)  # fmt: skip
    a, b = p.a, p.b
    connect(a.qp, b.qp.qp_num, timeout=13, retry_cnt=5, rnr_retry=6, min_rnr_timer=12,
            sq_psn=0x123, rq_psn=0x456, path_mtu=IBV_MTU_2048, max_rd_atomic=3)  # fmt: skip
    attr, init = a.qp.query()
    assert attr.qp_state == IBV_QPS_RTS
    assert attr.dest_qp_num == b.qp.qp_num
    assert attr.path_mtu == IBV_MTU_2048
    assert (attr.timeout, attr.retry_cnt, attr.rnr_retry) == (13, 5, 6)
    assert attr.min_rnr_timer == 12
    assert (attr.sq_psn, attr.rq_psn) == (0x123, 0x456)
    assert (attr.max_rd_atomic, attr.max_dest_rd_atomic) == (3, 3)
    assert attr.qp_access_flags == ALL_ACCESS
    assert attr.ah_attr.is_global == 1
    assert attr.ah_attr.gr.dgid == ctx.query_gid(1, gid_index(ctx))
    assert attr.ah_attr.gr.sgid_index == gid_index(ctx)
    assert attr.sq_draining == 0
    cap = attr.cap
    assert (cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge) == (9, 7, 3, 2)
    assert cap.max_inline_data == 48
    assert init.qp_type == IBV_QPT_RC
    assert init.sq_sig_all == 0
    assert init.send_cq is a.scq and init.recv_cq is a.rcq


# --- CQ overrun -------------------------------------------------------------------------------
def test_cq_overrun_moves_its_qps_to_err(ctx):
    pd = PD(ctx)
    small = CQ(ctx, 2)
    big1, big2 = CQ(ctx, 64), CQ(ctx, 64)
    a = make_qp(pd, IBV_QPT_RC, small, big1)  # sends complete into the small CQ
    c = make_qp(pd, IBV_QPT_RC, big2, small)  # receives complete into it
    b = make_qp(pd, IBV_QPT_RC, big2, big2)
    connect(a, b.qp_num)
    connect(b, a.qp_num)
    from softverbs import MR, SGE, SendWR

    mr = MR(pd, 4096, ALL_ACCESS)
    for i in range(3):  # 3 CQEs into a CQ of 2, none polled
        w = SendWR(i, 4, 1, sg=[SGE(mr.buf, 8, mr.lkey)])
        w.set_wr_rdma(mr.rkey, mr.buf + 1024)
        a.post_send(w)
    ev = expect_event(ctx, IBV_EVENT_CQ_ERR, small)
    assert ev.element is small
    fatal = {id(expect_event(ctx, IBV_EVENT_QP_FATAL).element) for _ in range(2)}
    assert fatal == {id(a), id(c)}
    assert a.qp_state == IBV_QPS_ERR
    assert c.qp_state == IBV_QPS_ERR
    assert b.qp_state == IBV_QPS_RTS
    assert small.error
    assert stats(ctx)["cq_overrun"] >= 1


def test_cq_exactly_full_is_not_an_overrun(ctx):
    p = make_pair(ctx, IBV_QPT_RC, cqe=4)
    a, b = p.a, p.b
    for i in range(4):
        a.qp.post_send(write_wr(i, a, b, 8))
    assert_no_event(ctx)
    assert [w.wr_id for w in poll_exact(a.scq, 4)] == [0, 1, 2, 3]
    for i in range(4):  # polled: room again
        a.qp.post_send(write_wr(10 + i, a, b, 8))
    assert [w.wr_id for w in poll_exact(a.scq, 4)] == [10, 11, 12, 13]
    assert a.qp.qp_state == IBV_QPS_RTS
    assert_no_event(ctx)


# --- the constructor with a QPAttr --------------------------------------------------------------
@pytest.mark.parametrize(
    ("qp_type", "state"), [(IBV_QPT_RC, IBV_QPS_INIT), (IBV_QPT_UC, IBV_QPS_INIT),
                           (IBV_QPT_UD, IBV_QPS_RTS)],
)  # fmt: skip
def test_constructor_with_qpattr(ctx, qp_type, state):
    pd = PD(ctx)
    cq = CQ(ctx, 8)
    init = QPInitAttr(qp_type=qp_type, scq=cq, rcq=cq, cap=QPCap(4, 4, 1, 1))
    assert QP(pd, init).qp_state == IBV_QPS_RESET
    attr = QPAttr()
    attr.qkey = QKEY
    attr.qp_access_flags = ALL_ACCESS
    qp = QP(pd, init, attr)
    assert qp.qp_state == state
    q, _ = qp.query()
    assert q.qp_state == state
    if qp_type == IBV_QPT_UD:
        assert q.qkey == QKEY


def test_illegal_transitions_are_einval(ctx):
    p = make_pair(ctx, IBV_QPT_RC, connected=False, to_init=False)
    qp = p.a.qp
    with raises_errno(errno.EINVAL, "RESET", "RTS", "not a legal transition"):
        modify_state(qp, IBV_QPS_RTS)
    assert qp.qp_state == IBV_QPS_RESET
    with raises_errno(errno.EINVAL, "requires"):
        modify_state(qp, IBV_QPS_INIT)  # without PKEY_INDEX, PORT, ACCESS_FLAGS
    modify_state(qp, IBV_QPS_ERR)
    with raises_errno(errno.EINVAL, "not a legal transition"):
        modify_state(qp, IBV_QPS_RTR)
    modify_state(qp, IBV_QPS_RESET)
    assert qp.qp_state == IBV_QPS_RESET


def test_first_packet_in_rtr_posts_comm_est(ctx):
    from softverbs.enums import IBV_EVENT_COMM_EST

    p = make_pair(ctx, IBV_QPT_RC, connected=False)
    a, b = p.a, p.b
    attr = QPAttr()
    attr.dest_qp_num = a.qp.qp_num
    attr.ah_attr = p.ah().attr
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 1
    b.qp.to_rtr(attr)
    connect(a.qp, b.qp.qp_num)
    b.qp.post_recv(recv_wr(1, b, 64))
    a.qp.post_send(send_wr(2, a, 8))
    expect_event(ctx, IBV_EVENT_COMM_EST, b.qp)
    check_wc(poll_exact(b.rcq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV)
    assert b.qp.qp_state == IBV_QPS_RTR
    connect(b.qp, a.qp.qp_num)
    b.qp.post_recv(recv_wr(3, b, 64))
    a.qp.post_send(send_wr(4, a, 8))
    poll_exact(b.rcq, 1)
    assert_no_event(ctx)  # only the first packet
