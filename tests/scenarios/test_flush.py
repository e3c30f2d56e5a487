"""Seed 001 / SEMANTICS §4: flushing work queues, RESET, SRQs, full receive queues."""

from __future__ import annotations

import errno
import time
from types import SimpleNamespace

import pytest
from scenario_kit import (
    RECV_OFF,
    DropFilter,
    assert_cq_empty,
    assert_no_event,
    chain,
    check_wc,
    connect,
    expect_event,
    inproc_only,
    make_pair,
    make_qp,
    modify_state,
    poll_exact,
    poll_n,
    raises_errno,
    recv_wr,
    reset_and_reconnect,
    send_wr,
    write_wr,
)

from softverbs import CQ, MR, PD, SGE, SRQ, RecvWR, SendWR, SrqAttr, SrqInitAttr
from softverbs.enums import (
    IBV_EVENT_QP_ACCESS_ERR,
    IBV_EVENT_QP_LAST_WQE_REACHED,
    IBV_EVENT_SRQ_LIMIT_REACHED,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTS,
    IBV_QPS_SQE,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_SEND_SIGNALED,
    IBV_SRQ_LIMIT,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_RECV,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
    IBV_WC_WR_FLUSH_ERR,
)
from softverbs.wire.opcodes import Op


def _stalled_pair(ctx, **kw):
    """An RC pair whose peer (b) stays in INIT: a's requests are never answered.

    A long ACK timeout (code 20, about 4 s) keeps a's WRs outstanding.
    """
    p = make_pair(ctx, IBV_QPT_RC, connected=False, **kw)
    connect(p.a.qp, p.b.qp.qp_num, timeout=20)
    assert p.b.qp.qp_state == IBV_QPS_INIT
    return p


# --- modify to ERR ---------------------------------------------------------------------
def test_modify_to_err_flushes_sq_and_rq_in_order(ctx):
    p = _stalled_pair(ctx, sq_sig_all=0)
    a, b = p.a, p.b
    a.qp.post_send(chain(
        write_wr(1, a, b, 8, flags=IBV_SEND_SIGNALED),
        write_wr(2, a, b, 8, flags=0),  # unsignaled: flushed anyway
        send_wr(3, a, 8, flags=IBV_SEND_SIGNALED),
    ))  # fmt: skip
    a.qp.post_recv(chain(recv_wr(11, a, 64), recv_wr(12, a, 64), recv_wr(13, a, 64)))
    assert_cq_empty(a.scq, "nothing completes while the peer is silent")
    modify_state(a.qp, IBV_QPS_ERR)
    assert a.qp.qp_state == IBV_QPS_ERR
    swcs = poll_exact(a.scq, 3, what="flushed sends")
    rwcs = poll_exact(a.rcq, 3, what="flushed receives")
    for wc, wr_id in zip(swcs, (1, 2, 3), strict=True):
        check_wc(wc, wr_id, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    for wc, wr_id in zip(rwcs, (11, 12, 13), strict=True):
        check_wc(wc, wr_id, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    assert_no_event(ctx)  # there is no "flush done" event: the user counts CQEs
    assert_cq_empty(a.scq)
    assert_cq_empty(a.rcq)


def test_flush_on_shared_cq_counts_exactly(ctx):
    p = _stalled_pair(ctx, shared_cq=True, sq_sig_all=1)
    a = p.a
    for i in range(5):
        a.qp.post_send(send_wr(i, a, 8))
    for i in range(7):
        a.qp.post_recv(recv_wr(100 + i, a, 8))
    modify_state(a.qp, IBV_QPS_ERR)
    wcs = poll_exact(a.scq, 12)
    assert all(w.status == IBV_WC_WR_FLUSH_ERR for w in wcs)
    sends = [w.wr_id for w in wcs if w.wr_id < 100]
    recvs = [w.wr_id for w in wcs if w.wr_id >= 100]
    assert sends == list(range(5))
    assert recvs == [100 + i for i in range(7)]


def test_completed_wrs_are_not_flushed(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    b.qp.post_recv(chain(recv_wr(1, b, 64), recv_wr(2, b, 64)))
    a.qp.post_send(send_wr(10, a, 8))
    check_wc(poll_exact(b.rcq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV)
    modify_state(b.qp, IBV_QPS_ERR)
    check_wc(poll_exact(b.rcq, 1)[0], 2, IBV_WC_WR_FLUSH_ERR, qp=b.qp)


def test_posts_in_err_are_flushed(ctx):
    p = make_pair(ctx, IBV_QPT_RC, sq_sig_all=0)
    a, b = p.a, p.b
    modify_state(a.qp, IBV_QPS_ERR)
    a.qp.post_send(write_wr(1, a, b, 8, flags=0))
    a.qp.post_recv(recv_wr(2, a, 8))
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    check_wc(poll_exact(a.rcq, 1)[0], 2, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    assert b.read(8, 0) == bytes(8)


# --- RESET ----------------------------------------------------------------------------
def test_reset_discards_outstanding_without_cqes(ctx):
    p = _stalled_pair(ctx)
    a = p.a
    for i in range(3):
        a.qp.post_send(send_wr(i, a, 8))
        a.qp.post_recv(recv_wr(10 + i, a, 8))
    modify_state(a.qp, IBV_QPS_RESET)
    assert a.qp.qp_state == IBV_QPS_RESET
    assert_cq_empty(a.scq, "RESET makes no send CQE")
    assert_cq_empty(a.rcq, "RESET makes no receive CQE")
    assert_no_event(ctx)


def test_err_then_reset_at_once_removes_the_flushed_cqes(ctx):
    """Seed 001 (Gregory): ERR then RESET right away: the flush CQEs are gone too."""
    p = _stalled_pair(ctx)
    a = p.a
    for i in range(3):
        a.qp.post_send(send_wr(i, a, 8))
        a.qp.post_recv(recv_wr(10 + i, a, 8))
    modify_state(a.qp, IBV_QPS_ERR)
    modify_state(a.qp, IBV_QPS_RESET)
    assert_cq_empty(a.scq, "flushed send CQEs removed by RESET")
    assert_cq_empty(a.rcq, "flushed receive CQEs removed by RESET")
    # and the slots are free: the full queues can be posted again after INIT
    from softverbs import QPAttr

    attr = QPAttr()
    attr.qp_access_flags = 0
    a.qp.to_init(attr)
    for i in range(16):
        a.qp.post_recv(recv_wr(100 + i, a, 8))


def _two_sends_on_one_cq(ctx):
    """Two connected RC QPs with one CQ for everything: a posts two SENDs (wr_id 0, 1)
    that b receives (wr_id 100, 101), four CQEs in all."""
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    a_qp = make_qp(pd, IBV_QPT_RC, cq)
    b_qp = make_qp(pd, IBV_QPT_RC, cq)
    connect(a_qp, b_qp.qp_num)
    connect(b_qp, a_qp.qp_num)
    mr = MR(pd, 4096, 1)
    for i in range(2):
        b_qp.post_recv(RecvWR(100 + i, 1, [SGE(mr.buf + 1024, 64, mr.lkey)]))
        a_qp.post_send(SendWR(i, num_sge=1, sg=[SGE(mr.buf, 8, mr.lkey)]))
    return cq, a_qp, b_qp


def test_reset_removes_unpolled_cqes_of_that_qp_only(ctx):
    cq, a_qp, b_qp = _two_sends_on_one_cq(ctx)
    # 4 CQEs wait in the CQ: 2 sends of a, 2 receives of b
    modify_state(a_qp, IBV_QPS_RESET)
    wcs = poll_exact(cq, 2)
    assert [(w.wr_id, w.qp_num, w.status) for w in wcs] == [
        (100, b_qp.qp_num, IBV_WC_SUCCESS), (101, b_qp.qp_num, IBV_WC_SUCCESS),
    ]  # fmt: skip


def test_destroy_leaves_the_qps_cqes_to_be_polled(ctx):
    """Unlike RESET, destroying a QP leaves what it completed in the CQ, as on
    rxe: libfabric's RXM destroys a connection's QP on the peer's disconnect
    and reads the CQ afterwards (fi_pingpong -e rdm hung when they were
    removed)."""
    cq, a_qp, b_qp = _two_sends_on_one_cq(ctx)
    a_qpn, b_qpn = a_qp.qp_num, b_qp.qp_num
    deadline = time.monotonic() + 10
    while cq.ring.pending() < 4 and time.monotonic() < deadline:
        time.sleep(0.01)  # a served or UDP device completes on its own time
    assert cq.ring.pending() == 4, "the four CQEs are in the CQ before either QP goes"
    k, wcs = cq.poll(1)
    assert k == 1
    a_qp.close()
    b_qp.close()
    wcs += poll_exact(cq, 3)
    assert sorted((w.qp_num, w.wr_id, w.status) for w in wcs) == [
        (a_qpn, 0, IBV_WC_SUCCESS), (a_qpn, 1, IBV_WC_SUCCESS),
        (b_qpn, 100, IBV_WC_SUCCESS), (b_qpn, 101, IBV_WC_SUCCESS),
    ]  # fmt: skip
    assert_cq_empty(cq, "four CQEs, each once")


def test_reset_then_reconnect_works_again(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    a.qp.post_send(write_wr(1, a, b, 8))
    modify_state(a.qp, IBV_QPS_ERR)
    modify_state(b.qp, IBV_QPS_ERR)
    reset_and_reconnect(a.qp, b.qp)
    assert_cq_empty(a.scq, "the unpolled CQE was removed by RESET")
    a.write(b"again!!!")
    b.qp.post_recv(recv_wr(5, b, 64))
    a.qp.post_send(send_wr(6, a, 8))
    check_wc(poll_exact(a.scq, 1)[0], 6, IBV_WC_SUCCESS, IBV_WC_SEND)
    check_wc(poll_exact(b.rcq, 1)[0], 5, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=8)
    assert b.read(8, RECV_OFF) == b"again!!!"


# --- automatic ERR -----------------------------------------------------------------------
def test_remote_access_error_moves_both_qps_to_err(ctx):
    p = make_pair(ctx, IBV_QPT_RC, sq_sig_all=0)
    a, b = p.a, p.b
    b.qp.post_recv(chain(recv_wr(20, b, 64), recv_wr(21, b, 64)))
    a.qp.post_recv(recv_wr(30, a, 64))
    bad = write_wr(1, a, b, 8, flags=0)
    bad.set_wr_rdma(b.mr.rkey, b.mr.buf + b.mr.length - 4)  # runs past the end of the MR
    a.qp.post_send(chain(bad, send_wr(2, a, 8, flags=0)))
    swcs = poll_exact(a.scq, 2)
    check_wc(swcs[0], 1, IBV_WC_REM_ACCESS_ERR, qp=a.qp)
    check_wc(swcs[1], 2, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    check_wc(poll_exact(a.rcq, 1)[0], 30, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    assert a.qp.qp_state == IBV_QPS_ERR
    assert b.qp.qp_state == IBV_QPS_ERR
    ev = expect_event(ctx, IBV_EVENT_QP_ACCESS_ERR, b.qp)
    assert "outside" in ev.reason
    rwcs = poll_exact(b.rcq, 2)
    check_wc(rwcs[0], 20, IBV_WC_WR_FLUSH_ERR, qp=b.qp)
    check_wc(rwcs[1], 21, IBV_WC_WR_FLUSH_ERR, qp=b.qp)
    assert_no_event(ctx)


@pytest.mark.parametrize("qp_type", [IBV_QPT_UC, IBV_QPT_UD])
def test_uc_ud_send_error_is_sqe_and_receives_go_on(ctx, qp_type):
    p = make_pair(ctx, qp_type)
    a, b = p.a, p.b

    def to_b(wr):
        if qp_type == IBV_QPT_UD:
            wr.set_wr_ud(p.ah(), b.qp.qp_num, 0x11111111)
        return wr

    def to_a(wr):
        if qp_type == IBV_QPT_UD:
            wr.set_wr_ud(p.ah(), a.qp.qp_num, 0x11111111)
        return wr

    a.qp.post_recv(chain(recv_wr(40, a, 128), recv_wr(41, a, 128)))
    bad = to_b(send_wr(1, a, 8))
    bad.sg[0].lkey = a.mr.lkey ^ 0x7F00
    a.qp.post_send(chain(bad, to_b(send_wr(2, a, 8))))
    wcs = poll_exact(a.scq, 2)
    check_wc(wcs[0], 1, IBV_WC_LOC_PROT_ERR, qp=a.qp)
    check_wc(wcs[1], 2, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    assert a.qp.qp_state == IBV_QPS_SQE
    # receives go on in SQE
    b.qp.post_send(to_a(send_wr(3, b, 24)))
    glen = 40 if qp_type == IBV_QPT_UD else 0
    check_wc(poll_exact(a.rcq, 1)[0], 40, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=24 + glen)
    # SQE -> RTS recovers the send queue
    modify_state(a.qp, IBV_QPS_RTS)
    b.qp.post_recv(recv_wr(50, b, 128))
    a.qp.post_send(to_b(send_wr(4, a, 16)))
    check_wc(poll_exact(a.scq, 1)[0], 4, IBV_WC_SUCCESS, IBV_WC_SEND)
    check_wc(poll_exact(b.rcq, 1)[0], 50, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=16 + glen)
    assert_cq_empty(a.rcq)  # 41 is still posted, not flushed


# --- SRQ -----------------------------------------------------------------------------------
def _srq_setup(ctx, max_wr=16):
    """Two senders s1, s2 to two receivers r1, r2 that share one SRQ."""
    pd = PD(ctx)
    scq, rcq = CQ(ctx, 64), CQ(ctx, 64)
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=max_wr, max_sge=1)))
    r1 = make_qp(pd, IBV_QPT_RC, scq, rcq, srq=srq)
    r2 = make_qp(pd, IBV_QPT_RC, scq, rcq, srq=srq)
    s1 = make_qp(pd, IBV_QPT_RC, scq, scq)
    s2 = make_qp(pd, IBV_QPT_RC, scq, scq)
    for s, r in ((s1, r1), (s2, r2)):
        connect(s, r.qp_num, timeout=20)
        connect(r, s.qp_num, timeout=20)
    mr = MR(pd, 1 << 16, 1)
    return SimpleNamespace(pd=pd, scq=scq, rcq=rcq, srq=srq, r1=r1, r2=r2, s1=s1, s2=s2, mr=mr)


def _srq_recv(srq, mr, wr_id, slot, size=4096):
    srq.post_recv(RecvWR(wr_id, 1, [SGE(mr.buf + 8192 + slot * size, size, mr.lkey)]))


def _send(qp, mr, wr_id, length):
    qp.post_send(SendWR(wr_id, num_sge=1, sg=[SGE(mr.buf, length, mr.lkey)]))


def test_srq_qp_in_err_flushes_only_the_wqe_it_took(ctx):
    t = _srq_setup(ctx)
    scq, rcq, srq, mr = t.scq, t.rcq, t.srq, t.mr
    r1, r2, s1, s2 = t.r1, t.r2, t.s1, t.s2
    for i in range(4):
        _srq_recv(srq, mr, 100 + i, i)
    # r1 takes a WQE for a 3-packet SEND whose last packet is lost
    last_ops = {Op.SEND_LAST, Op.SEND_LAST_WITH_IMMEDIATE}
    drop = DropFilter(lambda pkt: pkt.dqpn == r1.qp_num and (pkt.opcode & 0x1F) in last_ops)
    inproc_only(ctx)
    ctx.runtime.faults = drop
    _send(s1, mr, 1, 3000)
    assert drop.dropped == 1
    assert_cq_empty(rcq, "the message is incomplete")
    modify_state(r1, IBV_QPS_ERR)
    ctx.runtime.faults = None
    wc = poll_exact(rcq, 1)[0]
    check_wc(wc, 100, IBV_WC_WR_FLUSH_ERR, qp=r1)
    expect_event(ctx, IBV_EVENT_QP_LAST_WQE_REACHED, r1)
    assert_no_event(ctx)
    # the SRQ kept its other WQEs, in order, for r2
    for i in range(3):
        _send(s2, mr, 10 + i, 100)
    wcs = poll_exact(rcq, 3)
    assert [(w.wr_id, w.qp_num, w.status) for w in wcs] == [
        (101 + i, r2.qp_num, IBV_WC_SUCCESS) for i in range(3)
    ]
    assert [w.wr_id for w in poll_exact(scq, 3)] == [10, 11, 12]
    assert s1.qp_state == IBV_QPS_RTS  # s1's SEND is still waiting for its ACK


def test_srq_qp_in_err_without_taken_wqe_flushes_nothing(ctx):
    t = _srq_setup(ctx)
    _scq, rcq, srq, mr = t.scq, t.rcq, t.srq, t.mr
    r1, r2, s1, s2 = t.r1, t.r2, t.s1, t.s2
    for i in range(2):
        _srq_recv(srq, mr, 100 + i, i)
    _send(s1, mr, 1, 64)
    check_wc(poll_exact(rcq, 1)[0], 100, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=64, qp=r1)
    modify_state(r1, IBV_QPS_ERR)
    expect_event(ctx, IBV_EVENT_QP_LAST_WQE_REACHED, r1)
    assert_cq_empty(rcq, "an SRQ is never flushed")
    _send(s2, mr, 2, 64)
    check_wc(poll_exact(rcq, 1)[0], 101, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=64, qp=r2)


def test_srq_limit_event_is_one_shot(ctx):
    t = _srq_setup(ctx)
    _scq, rcq, srq, mr = t.scq, t.rcq, t.srq, t.mr
    _r1, r2, s1, s2 = t.r1, t.r2, t.s1, t.s2
    for i in range(6):
        _srq_recv(srq, mr, 100 + i, i)
    srq.modify(SrqAttr(srq_limit=3), IBV_SRQ_LIMIT)
    assert srq.query().srq_limit == 3
    for i in range(3):  # 6 -> 3 WQEs left: not fewer than 3 yet
        _send(s1, mr, i, 16)
    assert len(poll_exact(rcq, 3)) == 3
    assert_no_event(ctx)
    _send(s1, mr, 3, 16)  # 2 left < 3
    check_wc(poll_n(rcq, 1)[0], 103, IBV_WC_SUCCESS, IBV_WC_RECV)
    expect_event(ctx, IBV_EVENT_SRQ_LIMIT_REACHED, srq)
    assert srq.query().srq_limit == 0  # disarmed
    _send(s1, mr, 4, 16)  # 1 left: no second event
    check_wc(poll_n(rcq, 1)[0], 104, IBV_WC_SUCCESS, IBV_WC_RECV)
    assert_no_event(ctx)
    # re-arming fires again
    srq.modify(SrqAttr(srq_limit=2), IBV_SRQ_LIMIT)
    _send(s2, mr, 5, 16)  # 0 left < 2
    check_wc(poll_n(rcq, 1)[0], 105, IBV_WC_SUCCESS, IBV_WC_RECV, qp=r2)
    expect_event(ctx, IBV_EVENT_SRQ_LIMIT_REACHED, srq)


def test_srq_destroy_in_use_is_ebusy_close_cascades(ctx):
    t = _srq_setup(ctx)
    _scq, _rcq, srq, _mr = t.scq, t.rcq, t.srq, t.mr
    r1, r2, s1, _s2 = t.r1, t.r2, t.s1, t.s2
    with raises_errno(errno.EBUSY, "QP"):
        srq.destroy()
    assert not srq.closed and not r1.closed
    r1.close()
    with raises_errno(errno.EBUSY):
        srq.destroy()
    srq.close()  # pyverbs: closes the QPs that use it first
    assert srq.closed and r2.closed
    assert not s1.closed


def test_full_srq_is_enomem(ctx):
    t = _srq_setup(ctx, max_wr=2)
    srq, mr = t.srq, t.mr
    _srq_recv(srq, mr, 1, 0)
    _srq_recv(srq, mr, 2, 1)
    with raises_errno(errno.ENOMEM, "SRQ is full", "2 of 2"):
        _srq_recv(srq, mr, 3, 2)


# --- full receive queue ---------------------------------------------------------------
@pytest.mark.parametrize("qp_type", [IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD])
def test_full_rq_is_enomem_until_polled(ctx, qp_type):
    p = make_pair(ctx, qp_type, max_recv_wr=3)
    a, b = p.a, p.b
    for i in range(3):
        b.qp.post_recv(recv_wr(i, b, 128))
    with raises_errno(errno.ENOMEM, "receive queue is full", "3 of 3"):
        b.qp.post_recv(recv_wr(3, b, 128))
    wr = send_wr(10, a, 8)
    if qp_type == IBV_QPT_UD:
        wr.set_wr_ud(p.ah(), b.qp.qp_num, 0x11111111)
    a.qp.post_send(wr)
    # completed but not polled: the slot is still taken
    with raises_errno(errno.ENOMEM, "3 of 3"):
        b.qp.post_recv(recv_wr(3, b, 128))
    check_wc(poll_exact(b.rcq, 1)[0], 0, IBV_WC_SUCCESS, IBV_WC_RECV)
    b.qp.post_recv(recv_wr(3, b, 128))
    with raises_errno(errno.ENOMEM):
        b.qp.post_recv(recv_wr(4, b, 128))


def test_srq_qp_reset_returns_taken_wqe(ctx):
    """RESET of a QP that had taken a SRQ WQE: no CQE, the SRQ slot is not lost."""
    t = _srq_setup(ctx, max_wr=2)
    _scq, rcq, srq, mr = t.scq, t.rcq, t.srq, t.mr
    r1, _r2, s1, _s2 = t.r1, t.r2, t.s1, t.s2
    _srq_recv(srq, mr, 100, 0)
    drop = DropFilter(lambda pkt: pkt.dqpn == r1.qp_num and (pkt.opcode & 0x1F) == Op.SEND_LAST)
    inproc_only(ctx)
    ctx.runtime.faults = drop
    _send(s1, mr, 1, 3000)
    ctx.runtime.faults = None
    modify_state(r1, IBV_QPS_RESET)
    assert_cq_empty(rcq)
    _srq_recv(srq, mr, 101, 1)
    _srq_recv(srq, mr, 102, 2)  # the taken WQE's slot was given back
    with raises_errno(errno.ENOMEM):
        _srq_recv(srq, mr, 103, 3)


def test_receives_posted_without_a_doorbell_message(ctx, monkeypatch):
    """A served program stores a receive queue's doorbell record without sending the
    message (docs/rings.md), as mlx5's RQ has no MMIO doorbell: a SEND finds such
    a receive, and a move to ERR flushes the others.  The in-process provider
    always rings; here its receive doorbells are dropped to post the same way."""
    from softverbs.device.records import DB_RQ

    provider = ctx.provider
    if provider.rings_rq:
        ring = provider.doorbell

        def doorbell(qp: int, queue: int) -> None:
            if queue != DB_RQ:
                ring(qp, queue)

        monkeypatch.setattr(provider, "doorbell", doorbell)
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    b.qp.post_recv(recv_wr(1, b, 64))
    a.qp.post_send(send_wr(10, a, 64))
    check_wc(poll_exact(a.scq, 1)[0], 10, IBV_WC_SUCCESS, IBV_WC_SEND)
    check_wc(poll_exact(b.rcq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV)
    b.qp.post_recv(recv_wr(2, b, 64))  # after the SEND: only the flush reads it
    modify_state(b.qp, IBV_QPS_ERR)
    check_wc(poll_exact(b.rcq, 1)[0], 2, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV)
