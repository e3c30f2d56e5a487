"""SEMANTICS §1: what post_send and post_recv accept in each QP state, and why not."""

from __future__ import annotations

import errno

import pytest
from scenario_kit import (
    RECV_OFF,
    Pair,
    assert_cq_empty,
    chain,
    check_wc,
    connect,
    make_pair,
    make_qp,
    modify_state,
    poll_exact,
    raises_errno,
    recv_wr,
    send_wr,
    write_wr,
)

from softverbs import CQ, MR, SGE, SRQ, QPAttr, RecvWR, SendWR, SrqAttr, SrqInitAttr
from softverbs.enums import (
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_SEND_INLINE,
    IBV_SEND_SIGNALED,
    IBV_WC_GRH,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_RDMA_WRITE,
    IBV_WC_RECV,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
    IBV_WC_WR_FLUSH_ERR,
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_RDMA_WRITE_WITH_IMM,
)

QP_TYPES = [IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD]
STATE_NAMES = {IBV_QPS_INIT: "INIT", IBV_QPS_RTR: "RTR"}


def _send_to(p: Pair, wr_id: int, length: int = 64, offset: int = 0,
             flags: int = IBV_SEND_SIGNALED) -> SendWR:  # fmt: skip
    """A SEND from a to b, addressed for UD when needed."""
    wr = send_wr(wr_id, p.a, length, offset, flags=flags)
    if p.qp_type == IBV_QPT_UD:
        wr.set_wr_ud(p.ah(), p.b.qp.qp_num, 0x11111111)
    return wr


def _recv_len(p: Pair, length: int) -> int:
    return length + (40 if p.qp_type == IBV_QPT_UD else 0)


# --- post_send: RESET, INIT, RTR -> EINVAL, nothing queued -------------------------------
@pytest.mark.parametrize("qp_type", QP_TYPES)
def test_post_send_before_rts_is_einval_and_queues_nothing(ctx, qp_type):
    p = make_pair(ctx, qp_type, connected=False, to_init=False, max_send_wr=2)
    a, b = p.a, p.b
    assert a.qp.qp_state == 0  # RESET
    with raises_errno(errno.EINVAL, "RESET", "RTS"):
        a.qp.post_send(_send_to(p, 1))
    init = QPAttr()
    init.qkey = 0x11111111
    init.qp_access_flags = 0
    a.qp.to_init(init)
    b.qp.to_init(init)
    assert a.qp.qp_state == IBV_QPS_INIT
    with raises_errno(errno.EINVAL, "INIT"):
        a.qp.post_send(_send_to(p, 2))
    if qp_type == IBV_QPT_UD:
        a.qp.to_rtr(init)
        b.qp.to_rtr(init)
    else:
        attr = QPAttr()
        attr.dest_qp_num = b.qp.qp_num
        attr.ah_attr = p.ah().attr
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 1
        a.qp.to_rtr(attr)
    assert a.qp.qp_state == IBV_QPS_RTR
    with raises_errno(errno.EINVAL, "RTR"):
        a.qp.post_send(_send_to(p, 3))
    # nothing was queued: in RTS the whole SQ (2 slots) is free and only new WRs run
    if qp_type == IBV_QPT_UD:
        a.qp.to_rts(init)
        b.qp.to_rts(init)
    else:
        connect(a.qp, b.qp.qp_num)
        connect(b.qp, a.qp.qp_num)
    assert_cq_empty(a.scq, "sender CQ after the refused posts")
    for i in (10, 11):
        b.qp.post_recv(recv_wr(i, b, 256))
    a.qp.post_send(chain(_send_to(p, 20), _send_to(p, 21)))
    wcs = poll_exact(a.scq, 2, what="sends")
    check_wc(wcs[0], 20, IBV_WC_SUCCESS, IBV_WC_SEND, qp=a.qp)
    check_wc(wcs[1], 21, IBV_WC_SUCCESS, IBV_WC_SEND, qp=a.qp)
    rwcs = poll_exact(b.rcq, 2, what="receives")
    assert [w.wr_id for w in rwcs] == [10, 11]


@pytest.mark.parametrize("qp_type", QP_TYPES)
def test_post_send_in_rts_executes(ctx, qp_type):
    p = make_pair(ctx, qp_type)
    p.a.write(b"payload-" * 8)
    p.b.qp.post_recv(recv_wr(7, p.b, 256))
    p.a.qp.post_send(_send_to(p, 8, 64))
    check_wc(poll_exact(p.a.scq, 1)[0], 8, IBV_WC_SUCCESS, IBV_WC_SEND, qp=p.a.qp)
    wc = poll_exact(p.b.rcq, 1)[0]
    check_wc(wc, 7, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=_recv_len(p, 64), qp=p.b.qp)
    skip = 40 if qp_type == IBV_QPT_UD else 0
    assert p.b.read(64, RECV_OFF + skip) == b"payload-" * 8


# --- SQD: queued, executed after SQD -> RTS -------------------------------------------------
@pytest.mark.parametrize("qp_type", QP_TYPES)
def test_post_send_in_sqd_waits_for_rts(ctx, qp_type):
    p = make_pair(ctx, qp_type)
    a, b = p.a, p.b
    b.qp.post_recv(recv_wr(1, b, 256))
    modify_state(a.qp, IBV_QPS_SQD)
    assert a.qp.qp_state == IBV_QPS_SQD
    a.write(b"S" * 32)
    a.qp.post_send(_send_to(p, 5, 32))
    assert_cq_empty(a.scq, "SQ in SQD")
    assert_cq_empty(b.rcq, "peer while sender is in SQD")
    modify_state(a.qp, IBV_QPS_RTS)
    check_wc(poll_exact(a.scq, 1)[0], 5, IBV_WC_SUCCESS, IBV_WC_SEND)
    check_wc(poll_exact(b.rcq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=_recv_len(p, 32))


# --- SQE (UC/UD) and ERR: accepted, then flushed -------------------------------------------
@pytest.mark.parametrize("qp_type", [IBV_QPT_UC, IBV_QPT_UD])
def test_post_send_in_sqe_is_flushed(ctx, qp_type):
    p = make_pair(ctx, qp_type, sq_sig_all=0)
    a = p.a
    bad = _send_to(p, 1)
    bad.sg = [SGE(a.mr.buf, 16, a.mr.lkey ^ 0x5A5A00)]  # an lkey that is not registered
    a.qp.post_send(bad)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_LOC_PROT_ERR, qp=a.qp)
    assert a.qp.qp_state == IBV_QPS_SQE
    a.qp.post_send(_send_to(p, 2, flags=0))  # unsignaled: flushed WRs complete anyway
    a.qp.post_send(_send_to(p, 3))
    wcs = poll_exact(a.scq, 2)
    check_wc(wcs[0], 2, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    check_wc(wcs[1], 3, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    assert_cq_empty(p.b.rcq, "peer of a QP in SQE")


@pytest.mark.parametrize("qp_type", QP_TYPES)
def test_post_in_err_is_accepted_then_flushed(ctx, qp_type):
    p = make_pair(ctx, qp_type, sq_sig_all=0)
    a = p.a
    modify_state(a.qp, IBV_QPS_ERR)
    assert a.qp.qp_state == IBV_QPS_ERR
    a.qp.post_send(chain(_send_to(p, 1, flags=0), _send_to(p, 2)))
    a.qp.post_recv(chain(recv_wr(3, a, 64), recv_wr(4, a, 64)))
    swcs = poll_exact(a.scq, 2, what="send CQ")
    rwcs = poll_exact(a.rcq, 2, what="recv CQ")
    for wc, wr_id in zip(swcs + rwcs, (1, 2, 3, 4), strict=True):
        check_wc(wc, wr_id, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    assert_cq_empty(p.b.rcq, "peer of a QP in ERR")


# --- post_recv rules -------------------------------------------------------------------
@pytest.mark.parametrize("qp_type", QP_TYPES)
def test_post_recv_in_reset_is_einval(ctx, qp_type):
    p = make_pair(ctx, qp_type, connected=False, to_init=False)
    with raises_errno(errno.EINVAL, "RESET", "INIT"):
        p.a.qp.post_recv(recv_wr(1, p.a, 64))


@pytest.mark.parametrize("qp_type", [IBV_QPT_RC, IBV_QPT_UC])
def test_post_recv_in_init_and_rtr_is_queued(ctx, qp_type):
    p = make_pair(ctx, qp_type, connected=False)
    a, b = p.a, p.b
    assert b.qp.qp_state == IBV_QPS_INIT
    b.qp.post_recv(recv_wr(1, b, 100, RECV_OFF))
    attr = QPAttr()
    attr.dest_qp_num = a.qp.qp_num
    attr.ah_attr = p.ah().attr
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 1
    b.qp.to_rtr(attr)
    assert b.qp.qp_state == IBV_QPS_RTR
    b.qp.post_recv(recv_wr(2, b, 100, RECV_OFF + 100))
    connect(a.qp, b.qp.qp_num)
    a.write(b"first" + b"second")
    a.qp.post_send(chain(send_wr(10, a, 5, 0), send_wr(11, a, 6, 5)))
    wcs = poll_exact(b.rcq, 2)
    check_wc(wcs[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=5)
    check_wc(wcs[1], 2, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=6)
    assert b.read(5, RECV_OFF) == b"first"
    assert b.read(6, RECV_OFF + 100) == b"second"
    assert b.qp.qp_state == IBV_QPS_RTR  # receiving does not move it


@pytest.mark.parametrize("qp_type", QP_TYPES)
def test_post_recv_in_sqd_is_queued_and_receives_go_on(ctx, qp_type):
    p = make_pair(ctx, qp_type)
    a, b = p.a, p.b
    modify_state(b.qp, IBV_QPS_SQD)
    b.qp.post_recv(recv_wr(9, b, 128))
    a.qp.post_send(_send_to(p, 1, 50))
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)
    check_wc(poll_exact(b.rcq, 1)[0], 9, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=_recv_len(p, 50))
    assert b.qp.qp_state == IBV_QPS_SQD


@pytest.mark.parametrize("qp_type", [IBV_QPT_UC, IBV_QPT_UD])
def test_post_recv_in_sqe_is_queued(ctx, qp_type):
    p = make_pair(ctx, qp_type)
    a, b = p.a, p.b
    bad = send_wr(1, b, 16)
    bad.sg = [SGE(b.mr.buf, 16, 0xDEAD00)]
    if qp_type == IBV_QPT_UD:
        bad.set_wr_ud(p.ah(), a.qp.qp_num, 0x11111111)
    b.qp.post_send(bad)
    check_wc(poll_exact(b.scq, 1)[0], 1, IBV_WC_LOC_PROT_ERR)
    assert b.qp.qp_state == IBV_QPS_SQE
    b.qp.post_recv(recv_wr(4, b, 128))
    a.qp.post_send(_send_to(p, 2, 30))
    check_wc(poll_exact(b.rcq, 1)[0], 4, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=_recv_len(p, 30))
    assert b.qp.qp_state == IBV_QPS_SQE


def test_post_recv_on_srq_qp_is_einval(ctx, pd):
    cq = CQ(ctx, 16)
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=8, max_sge=1)))
    qp = make_qp(pd, IBV_QPT_RC, cq, srq=srq)
    mr = MR(pd, 4096, 1)
    with raises_errno(errno.EINVAL, "SRQ"):
        qp.post_recv(RecvWR(1, 1, [SGE(mr.buf, 64, mr.lkey)]))
    srq.post_recv(RecvWR(1, 1, [SGE(mr.buf, 64, mr.lkey)]))  # the SRQ takes it


# --- inline checks of the WR itself ------------------------------------------------------
@pytest.mark.parametrize("qp_type", QP_TYPES)
def test_too_many_sges(ctx, qp_type):
    p = make_pair(ctx, qp_type, max_send_sge=2, max_recv_sge=2)
    a = p.a
    wr = _send_to(p, 1)
    wr.sg = [a.sge(i * 8, 8) for i in range(3)]
    with raises_errno(errno.EINVAL, "3 SGEs", "max_send_sge=2"):
        a.qp.post_send(wr)
    rwr = RecvWR(2, 3, [a.sge(RECV_OFF + i * 8, 8) for i in range(3)])
    with raises_errno(errno.EINVAL, "3 SGEs", "max_recv_sge=2"):
        a.qp.post_recv(rwr)
    assert_cq_empty(a.scq)
    assert_cq_empty(a.rcq)


@pytest.mark.parametrize("qp_type", QP_TYPES)
def test_inline_too_long(ctx, qp_type):
    p = make_pair(ctx, qp_type, max_inline_data=32, max_send_sge=1)
    wr = _send_to(p, 1, 33, flags=IBV_SEND_SIGNALED | IBV_SEND_INLINE)
    with raises_errno(errno.EINVAL, "33 bytes of inline data", "max_inline_data=32"):
        p.a.qp.post_send(wr)
    assert_cq_empty(p.a.scq)


def test_inline_capacity_is_at_least_the_sge_list(ctx):
    """As rxe: a WQE holds its SGE list or inline data, so a QP reports (and
    takes) max(max_inline_data, 16 * max_send_sge) inline bytes -- what
    rdma_xclient, which asks for 0 and sends 16, relies on."""
    p = make_pair(ctx, IBV_QPT_RC, max_inline_data=0, max_send_sge=1)
    assert p.a.qp.query()[0].cap.max_inline_data == 16
    p.b.qp.post_recv(recv_wr(1, p.b, 64))
    p.a.write(b"sixteen bytes!!!")
    p.a.qp.post_send(_send_to(p, 2, 16, flags=IBV_SEND_SIGNALED | IBV_SEND_INLINE))
    check_wc(poll_exact(p.a.scq, 1)[0], 2, IBV_WC_SUCCESS)
    check_wc(poll_exact(p.b.rcq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV)
    assert p.b.read(16, RECV_OFF) == b"sixteen bytes!!!"


@pytest.mark.parametrize(
    ("qp_type", "opcode"),
    [
        (IBV_QPT_UC, IBV_WR_RDMA_READ),
        (IBV_QPT_UC, IBV_WR_ATOMIC_CMP_AND_SWP),
        (IBV_QPT_UC, IBV_WR_ATOMIC_FETCH_AND_ADD),
        (IBV_QPT_UD, IBV_WR_RDMA_WRITE),
        (IBV_QPT_UD, IBV_WR_RDMA_WRITE_WITH_IMM),
        (IBV_QPT_UD, IBV_WR_RDMA_READ),
        (IBV_QPT_UD, IBV_WR_ATOMIC_FETCH_AND_ADD),
    ],
)
def test_opcode_not_allowed_for_qp_type(ctx, qp_type, opcode):
    p = make_pair(ctx, qp_type)
    wr = send_wr(1, p.a, 8, opcode=opcode)
    wr.set_wr_rdma(p.b.mr.rkey, p.b.mr.buf)
    tname = {IBV_QPT_UC: "IBV_QPT_UC", IBV_QPT_UD: "IBV_QPT_UD"}[qp_type]
    with raises_errno(errno.EINVAL, "is not supported on", tname):
        p.a.qp.post_send(wr)
    assert_cq_empty(p.a.scq)


# --- WR lists stop at the first bad WR ----------------------------------------------------
def test_send_list_stops_at_first_bad_wr(ctx):
    p = make_pair(ctx, IBV_QPT_RC, max_send_sge=1)
    a, b = p.a, p.b
    a.write(b"A" * 16 + b"B" * 16 + b"C" * 16)
    good1 = write_wr(1, a, b, 16, 0, 0)
    bad = write_wr(2, a, b, 16, 16, 16)
    bad.sg = [a.sge(16, 8), a.sge(24, 8)]  # 2 SGEs > max_send_sge=1
    after = write_wr(3, a, b, 16, 32, 32)
    bad_wr = send_wr(0, a, 1)
    with raises_errno(errno.EINVAL, "WR #1", "wr_id=2", "max_send_sge=1"):
        a.qp.post_send(chain(good1, bad, after), bad_wr)
    assert bad_wr.wr_id == 2
    wc = poll_exact(a.scq, 1)[0]
    check_wc(wc, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, byte_len=16)
    assert b.read(48, 0) == b"A" * 16 + bytes(32)  # the WR after the bad one never ran
    assert a.qp.qp_state == IBV_QPS_RTS


def test_recv_list_stops_at_first_bad_wr(ctx):
    p = make_pair(ctx, IBV_QPT_RC, max_recv_sge=1)
    a, b = p.a, p.b
    bad = RecvWR(11, 2, [b.sge(RECV_OFF, 8), b.sge(RECV_OFF + 8, 8)])
    bad_wr = recv_wr(0, b, 1)
    with raises_errno(errno.EINVAL, "WR #1", "wr_id=11", "max_recv_sge=1"):
        b.qp.post_recv(chain(recv_wr(10, b, 64), bad, recv_wr(12, b, 64)), bad_wr)
    assert bad_wr.wr_id == 11
    a.qp.post_send(chain(send_wr(1, a, 8), send_wr(2, a, 8, flags=IBV_SEND_SIGNALED)))
    # only WR 10 was posted: the first SEND lands in it, the second finds no receive
    wc = poll_exact(b.rcq, 1)[0]
    check_wc(wc, 10, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=8)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)
    b.qp.post_recv(recv_wr(13, b, 64))  # the RNR-retried second SEND now lands
    check_wc(poll_exact(b.rcq, 1)[0], 13, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=8)
    check_wc(poll_exact(a.scq, 1)[0], 2, IBV_WC_SUCCESS, IBV_WC_SEND)


def test_send_list_stops_at_full_queue(ctx):
    p = make_pair(ctx, IBV_QPT_RC, max_send_wr=2)
    a, b = p.a, p.b
    bad_wr = send_wr(0, a, 1)
    wrs = [write_wr(i, a, b, 8, 0, i * 8) for i in range(1, 4)]
    with raises_errno(errno.ENOMEM, "WR #2", "wr_id=3", "send queue is full"):
        a.qp.post_send(chain(*wrs), bad_wr)
    assert bad_wr.wr_id == 3
    assert [w.wr_id for w in poll_exact(a.scq, 2)] == [1, 2]


def test_ud_send_has_grh(ctx):
    p = make_pair(ctx, IBV_QPT_UD)
    p.b.qp.post_recv(recv_wr(1, p.b, 128))
    p.a.qp.post_send(_send_to(p, 2, 16))
    wc = poll_exact(p.b.rcq, 1)[0]
    assert wc.wc_flags & IBV_WC_GRH


# --- queues of 0 WRs ---------------------------------------------------------------------
def test_zero_length_queues(ctx):
    """max_send_wr=0 or max_recv_wr=0 is a valid QP (as on rxe, which reports
    0 back): qperf's one-sided tests make them.  A post to such a queue fails
    with ENOMEM, as to a full one; the other direction works."""
    p = make_pair(ctx, IBV_QPT_RC, connected=False)
    pd = p.pd
    # a sends and never receives; b receives and never sends
    a_qp = make_qp(pd, IBV_QPT_RC, p.a.scq, p.a.rcq, max_recv_wr=0)
    b_qp = make_qp(pd, IBV_QPT_RC, p.b.scq, p.b.rcq, max_send_wr=0)
    assert (a_qp.query()[0].cap.max_recv_wr, b_qp.query()[0].cap.max_send_wr) == (0, 0)
    connect(a_qp, b_qp.qp_num)
    connect(b_qp, a_qp.qp_num)
    a, b = p.a, p.b
    a.qp, b.qp = a_qp, b_qp
    with raises_errno(errno.ENOMEM, "max_send_wr=0"):
        b.qp.post_send(send_wr(1, b, 8))
    with raises_errno(errno.ENOMEM, "max_recv_wr=0"):
        a.qp.post_recv(recv_wr(2, a, 8))
    a.write(b"written by a", 0)
    b.qp.post_recv(recv_wr(3, b, 64))
    a.qp.post_send(chain(write_wr(4, a, b, 12, 0, 256), send_wr(5, a, 12)))
    assert [w.wr_id for w in poll_exact(a.scq, 2)] == [4, 5]
    check_wc(poll_exact(b.rcq, 1)[0], 3, IBV_WC_SUCCESS, IBV_WC_RECV)
    assert b.read(12, 256) == b.read(12, RECV_OFF) == b"written by a"
    # b, with no send queue, still answers a's READ (the responder needs none)
    b.write(b"read back", 512)
    rd = write_wr(6, a, b, 9, 1024, 512, opcode=IBV_WR_RDMA_READ)
    a.qp.post_send(rd)
    check_wc(poll_exact(a.scq, 1)[0], 6, IBV_WC_SUCCESS)
    assert a.read(9, 1024) == b"read back"
    assert_cq_empty(b.scq)
