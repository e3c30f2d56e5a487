"""Seed 003 / SEMANTICS §7: deferred posting and doorbell batching.

``softverbs.IBV_SEND_DEFER`` (the analogue of ``NDK_OP_FLAG_DEFER``) writes a
WQE without ringing the doorbell.  A later non-deferred post rings for all
of them; an inline failure rings for the deferred ones before raising.
"""

from __future__ import annotations

import errno

import pytest
from scenario_kit import (
    RECV_OFF,
    assert_cq_empty,
    chain,
    check_wc,
    make_pair,
    poll_exact,
    raises_errno,
    recv_wr,
    send_wr,
    stats,
    write_wr,
)

import softverbs
from softverbs import QPEx, QPInitAttrEx, counters
from softverbs.enums import (
    IBV_QP_EX_WITH_RDMA_WRITE,
    IBV_QP_EX_WITH_SEND,
    IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    IBV_QPS_RTS,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_SEND_SIGNALED,
    IBV_WC_RDMA_WRITE,
    IBV_WC_RECV,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
)

DEFER = softverbs.IBV_SEND_DEFER
SIG = IBV_SEND_SIGNALED


def test_counters_is_a_dict_with_doorbells(ctx):
    c = counters(ctx)
    assert isinstance(c, dict)
    assert isinstance(c["doorbells"], int)
    p = make_pair(ctx, IBV_QPT_RC)
    before = counters(ctx)["doorbells"]
    p.a.qp.post_send(write_wr(1, p.a, p.b, 8))
    assert counters(ctx)["doorbells"] == before + 1
    poll_exact(p.a.scq, 1)


@pytest.mark.parametrize("qp_type", [IBV_QPT_RC, IBV_QPT_UC])
def test_deferred_wrs_wait_for_a_ringing_post(ctx, qp_type):
    p = make_pair(ctx, qp_type)
    a, b = p.a, p.b
    a.write(b"one-" + b"two-" + b"tri-")
    s0 = stats(ctx)
    a.qp.post_send(write_wr(1, a, b, 4, 0, 0, flags=SIG | DEFER))
    a.qp.post_send(write_wr(2, a, b, 4, 4, 4, flags=SIG | DEFER))
    s1 = stats(ctx)
    assert s1["doorbells"] == s0["doorbells"], "a deferred post must not ring"
    assert s1["sent_pkts"] == s0["sent_pkts"], "a deferred WR must produce no packet"
    assert_cq_empty(a.scq, "deferred WRs")
    assert b.read(8, 0) == bytes(8), "a deferred WR must not execute"
    b.qp.post_recv(recv_wr(9, b, 64))
    a.qp.post_send(send_wr(3, a, 4, 8))  # rings for all three
    assert stats(ctx)["doorbells"] == s0["doorbells"] + 1
    wcs = poll_exact(a.scq, 3)
    check_wc(wcs[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, byte_len=4)
    check_wc(wcs[1], 2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, byte_len=4)
    check_wc(wcs[2], 3, IBV_WC_SUCCESS, IBV_WC_SEND, byte_len=4)
    assert b.read(8, 0) == b"one-two-"
    check_wc(poll_exact(b.rcq, 1)[0], 9, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=4)
    assert b.read(4, RECV_OFF) == b"tri-"


def test_deferred_list_rings_once_for_the_list(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    d0 = stats(ctx)["doorbells"]
    wrs = [write_wr(i, a, b, 8, 0, 8 * i, flags=SIG | DEFER) for i in range(4)]
    wrs.append(write_wr(4, a, b, 8, 0, 32, flags=SIG))
    a.qp.post_send(chain(*wrs))
    assert stats(ctx)["doorbells"] == d0 + 1
    assert [w.wr_id for w in poll_exact(a.scq, 5)] == [0, 1, 2, 3, 4]


def test_list_ending_deferred_rings_for_the_undeferred_part_only(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    d0 = stats(ctx)["doorbells"]
    a.qp.post_send(chain(write_wr(1, a, b, 8), write_wr(2, a, b, 8, flags=SIG | DEFER)))
    assert stats(ctx)["doorbells"] == d0 + 1
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
    a.qp.post_send(write_wr(3, a, b, 8))
    assert [w.wr_id for w in poll_exact(a.scq, 2)] == [2, 3]


# --- the NDK example: an inline failure rings for the deferred WRs -------------------------
def test_inline_failure_rings_for_earlier_deferred_wr(ctx):
    p = make_pair(ctx, IBV_QPT_RC, max_send_sge=1)
    a, b = p.a, p.b
    a.write(b"FIRST---")
    d0 = stats(ctx)["doorbells"]
    a.qp.post_send(write_wr(1, a, b, 8, flags=SIG | DEFER))
    assert_cq_empty(a.scq)
    second = write_wr(2, a, b, 8, 0, 64, flags=SIG | DEFER)
    second.sg = [a.sge(0, 4), a.sge(4, 4)]  # fails inline: too many SGEs
    with raises_errno(errno.EINVAL, "max_send_sge=1"):
        a.qp.post_send(second)
    assert stats(ctx)["doorbells"] == d0 + 1  # the failure rang for WR 1
    wc = poll_exact(a.scq, 1)[0]  # WR 1 completes; WR 2 has no CQE
    check_wc(wc, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, byte_len=8)
    assert b.read(8, 0) == b"FIRST---"
    assert b.read(8, 64) == bytes(8)


def test_full_sq_failure_rings_for_earlier_deferred_wr(ctx):
    p = make_pair(ctx, IBV_QPT_RC, max_send_wr=1)
    a, b = p.a, p.b
    a.qp.post_send(write_wr(1, a, b, 8, flags=SIG | DEFER))
    with raises_errno(errno.ENOMEM, "send queue is full"):
        a.qp.post_send(write_wr(2, a, b, 8, flags=SIG | DEFER))
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)


def test_inline_failure_inside_a_list_rings_for_deferred_ones(ctx):
    p = make_pair(ctx, IBV_QPT_RC, max_inline_data=8, max_send_sge=1)  # holds 16 inline bytes
    a, b = p.a, p.b
    bad = write_wr(3, a, b, 17, flags=SIG | softverbs.enums.IBV_SEND_INLINE)
    bad_wr = send_wr(0, a, 1)
    with raises_errno(errno.EINVAL, "max_inline_data=16"):
        a.qp.post_send(chain(write_wr(1, a, b, 8, flags=SIG | DEFER),
                             write_wr(2, a, b, 8, flags=SIG | DEFER), bad), bad_wr)  # fmt: skip
    assert bad_wr.wr_id == 3
    assert [w.wr_id for w in poll_exact(a.scq, 2)] == [1, 2]


# --- QPEx: wr_start ... wr_complete rings once; wr_abort discards ----------------------------
def _qpex_pair(ctx, **kw):
    p = make_pair(ctx, IBV_QPT_RC, connected=False, **kw)
    from scenario_kit import ALL_ACCESS, connect

    from softverbs import QPAttr, QPCap

    init = QPInitAttrEx(
        qp_type=IBV_QPT_RC, scq=p.a.scq, rcq=p.a.rcq, pd=p.pd,
        cap=QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=2, max_recv_sge=2),
        comp_mask=IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        send_ops_flags=IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND, sq_sig_all=0,
    )  # fmt: skip
    attr = QPAttr()
    attr.qp_access_flags = ALL_ACCESS
    qpex = QPEx(ctx, init, attr)
    connect(qpex, p.b.qp.qp_num)
    connect(p.b.qp, qpex.qp_num)
    p.a.qp = qpex
    return p


def test_qpex_batch_rings_once(ctx):
    p = _qpex_pair(ctx)
    a, b = p.a, p.b
    qp = a.qp
    a.write(bytes(range(40)))
    d0 = stats(ctx)["doorbells"]
    qp.wr_start()
    for i in range(5):
        qp.wr_id = 100 + i
        qp.wr_flags = SIG
        qp.wr_rdma_write(b.mr.rkey, b.mr.buf + 8 * i)
        qp.wr_set_sge(a.sge(8 * i, 8))
    assert_cq_empty(a.scq, "nothing runs before wr_complete")
    assert stats(ctx)["doorbells"] == d0
    qp.wr_complete()
    assert stats(ctx)["doorbells"] == d0 + 1
    wcs = poll_exact(a.scq, 5)
    for i, wc in enumerate(wcs):
        check_wc(wc, 100 + i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, byte_len=8, qp=qp)
    assert b.read(40, 0) == bytes(range(40))


def test_qpex_abort_discards_the_batch(ctx):
    p = _qpex_pair(ctx)
    a, b = p.a, p.b
    qp = a.qp
    a.write(b"X" * 64)
    s0 = stats(ctx)
    qp.wr_start()
    for i in range(8):  # the whole SQ
        qp.wr_id = i
        qp.wr_flags = SIG
        qp.wr_rdma_write(b.mr.rkey, b.mr.buf + 8 * i)
        qp.wr_set_sge(a.sge(0, 8))
    qp.wr_abort()
    s1 = stats(ctx)
    assert s1["doorbells"] == s0["doorbells"]
    assert s1["sent_pkts"] == s0["sent_pkts"]
    assert_cq_empty(a.scq, "an aborted batch completes nothing")
    assert b.read(64, 0) == bytes(64)
    # the aborted WRs took no slots: a full batch of 8 fits
    qp.wr_start()
    for i in range(8):
        qp.wr_id = 50 + i
        qp.wr_flags = SIG
        qp.wr_rdma_write(b.mr.rkey, b.mr.buf + 8 * i)
        qp.wr_set_sge(a.sge(0, 8))
    qp.wr_complete()
    assert [w.wr_id for w in poll_exact(a.scq, 8)] == [50 + i for i in range(8)]
    assert b.read(64, 0) == b"X" * 64
    assert qp.qp_state == IBV_QPS_RTS


def test_qpex_send_and_deferred_post_send_share_one_doorbell(ctx):
    p = _qpex_pair(ctx)
    a, b = p.a, p.b
    qp = a.qp
    a.write(b"hello")
    b.qp.post_recv(recv_wr(7, b, 64))
    qp.post_send(write_wr(1, a, b, 5, 0, 0, flags=SIG | DEFER))
    d0 = stats(ctx)["doorbells"]
    qp.wr_start()
    qp.wr_id = 2
    qp.wr_flags = SIG
    qp.wr_send()
    qp.wr_set_sge(a.sge(0, 5))
    qp.wr_complete()
    assert stats(ctx)["doorbells"] == d0 + 1
    assert [w.wr_id for w in poll_exact(a.scq, 2)] == [1, 2]
    check_wc(poll_exact(b.rcq, 1)[0], 7, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=5)


@pytest.mark.parametrize("failure", ["sq_full", "too_many_sges"])
def test_qpex_failed_batch_rings_for_earlier_deferred_wr(ctx, failure):
    p = _qpex_pair(ctx)
    a, b = p.a, p.b
    qp = a.qp
    a.write(b"deferred")
    qp.post_send(write_wr(1, a, b, 8, 0, 0, flags=SIG | DEFER))
    qp.wr_start()
    n = 8 if failure == "sq_full" else 1  # 7 slots are free
    for i in range(n):
        qp.wr_id = 10 + i
        qp.wr_flags = SIG
        qp.wr_rdma_write(b.mr.rkey, b.mr.buf + 64)
        if failure == "sq_full":
            qp.wr_set_sge(a.sge(0, 8))
        else:
            qp.wr_set_sge_list(3, [a.sge(0, 2), a.sge(2, 2), a.sge(4, 4)])
    code = errno.ENOMEM if failure == "sq_full" else errno.EINVAL
    with raises_errno(code):
        qp.wr_complete()
    wc = poll_exact(a.scq, 1)[0]  # the deferred WR ran; the batch made no CQE
    check_wc(wc, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, byte_len=8)
    assert b.read(8, 0) == b"deferred"
    assert b.read(8, 64) == bytes(8)


def test_modify_to_err_flushes_deferred_wrs(ctx):
    """A deferred WR was posted successfully, so it must complete: ERR flushes it."""
    from scenario_kit import modify_state

    from softverbs.enums import IBV_QPS_ERR, IBV_WC_WR_FLUSH_ERR

    p = make_pair(ctx, IBV_QPT_RC, max_send_wr=2, sq_sig_all=0)
    a, b = p.a, p.b
    d0 = stats(ctx)["doorbells"]
    a.qp.post_send(chain(write_wr(1, a, b, 8, flags=DEFER), write_wr(2, a, b, 8, flags=DEFER)))
    modify_state(a.qp, IBV_QPS_ERR)
    wcs = poll_exact(a.scq, 2)
    check_wc(wcs[0], 1, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    check_wc(wcs[1], 2, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    assert stats(ctx)["doorbells"] == d0
    assert b.read(16, 0) == bytes(16)
    a.qp.post_send(chain(write_wr(3, a, b, 8), write_wr(4, a, b, 8)))  # slots are free again
    assert [w.wr_id for w in poll_exact(a.scq, 2)] == [3, 4]
