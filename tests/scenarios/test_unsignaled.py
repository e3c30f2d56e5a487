"""Seed 000 / SEMANTICS §2: unsignaled completions and send-queue slots.

A send-queue slot is released only when the application polls a CQE of
that WR or of a later WR of the same SQ.  Unsignaled WRs that succeed make
no CQE, so a queue full of them never drains (the full-SQ trap).
"""

from __future__ import annotations

import errno

import pytest
from scenario_kit import (
    RECV_OFF,
    assert_cq_empty,
    check_wc,
    make_pair,
    poll_exact,
    poll_n,
    raises_errno,
    recv_wr,
    reset_and_reconnect,
    send_wr,
    wait_until,
    write_wr,
)

from softverbs import SGE, counters
from softverbs.enums import (
    IBV_QPS_ERR,
    IBV_QPS_RTS,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_SEND_SIGNALED,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_RDMA_WRITE,
    IBV_WC_RECV,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
    IBV_WC_WR_FLUSH_ERR,
)


@pytest.mark.parametrize("qp_type", [IBV_QPT_RC, IBV_QPT_UC])
def test_sq_sig_all_1_completes_every_wr(ctx, qp_type):
    p = make_pair(ctx, qp_type, sq_sig_all=1)
    a, b = p.a, p.b
    wrs = [write_wr(i, a, b, 8, 0, 8 * i, flags=0) for i in range(1, 6)]
    for w in wrs:
        a.qp.post_send(w)
    wcs = poll_exact(a.scq, 5)
    for wc, i in zip(wcs, range(1, 6), strict=True):
        check_wc(wc, i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, byte_len=8, qp=a.qp)


@pytest.mark.parametrize("qp_type", [IBV_QPT_RC, IBV_QPT_UC])
def test_sq_sig_all_0_completes_only_signaled(ctx, qp_type):
    p = make_pair(ctx, qp_type, sq_sig_all=0)
    a, b = p.a, p.b
    a.write(bytes(range(1, 41)))
    for i in range(1, 6):
        flags = IBV_SEND_SIGNALED if i in (2, 5) else 0
        a.qp.post_send(write_wr(i, a, b, 8, 8 * (i - 1), 8 * (i - 1), flags=flags))
    wcs = poll_exact(a.scq, 2)
    assert [w.wr_id for w in wcs] == [2, 5]
    assert all(w.status == IBV_WC_SUCCESS for w in wcs)
    # the unsignaled ones ran too
    if qp_type == IBV_QPT_RC:  # WR 5's ACK acknowledged every WRITE before it
        assert b.read(40, 0) == bytes(range(1, 41))
    else:  # a UC WRITE completes once sent: on the host device the service may still be
        # executing it when the CQE is polled (seen under two busy loops)
        wait_until(lambda: b.read(40, 0) == bytes(range(1, 41)), ctx, what="the UC WRITEs")


@pytest.mark.parametrize(
    ("case", "status"), [("bad_lkey", IBV_WC_LOC_PROT_ERR), ("bad_rkey", IBV_WC_REM_ACCESS_ERR)]
)
def test_unsignaled_wr_that_fails_still_completes(ctx, case, status):
    p = make_pair(ctx, IBV_QPT_RC, sq_sig_all=0)
    a, b = p.a, p.b
    a.qp.post_send(write_wr(1, a, b, 8, flags=0))  # succeeds silently
    wr = write_wr(2, a, b, 8, flags=0)
    if case == "bad_lkey":
        wr.sg = [SGE(a.mr.buf, 8, a.mr.lkey + 0x100)]
    else:
        wr.set_wr_rdma(b.mr.rkey + 0x100, b.mr.buf)
    a.qp.post_send(wr)
    wcs = poll_exact(a.scq, 1)
    check_wc(wcs[0], 2, status, qp=a.qp)
    assert a.qp.qp_state == IBV_QPS_ERR


# --- the full-SQ trap ------------------------------------------------------------------
N = 4


def _fill_unsignaled(p):
    a, b = p.a, p.b
    for i in range(N):
        a.write(bytes([0x41 + i]) * 8, 8 * i)
        a.qp.post_send(write_wr(i, a, b, 8, 8 * i, 8 * i, flags=0))
    # every WR was executed on the wire and acknowledged ...
    want = b"".join(bytes([0x41 + i]) * 8 for i in range(N))

    def done() -> bool:
        if b.read(8 * N, 0) != want:
            return False
        if getattr(p.ctx, "kind", "inproc") != "udp":
            return True  # in-process fabrics deliver the ACK in the step that lands the WRITE
        # Over UDP the ACKs cross a socket after the WRITEs land.  Both QPs are on
        # this test's own device: nothing is in flight once it has received every
        # packet it sent.  (The host device is shared, so are its counters.)
        c = counters(p.ctx)
        return c["rcvd_pkts"] == c["sent_pkts"]

    wait_until(done, p.ctx, what="every WRITE landing and acknowledged")


def test_full_sq_of_unsignaled_wrs_never_recovers_in_rts(ctx):
    p = make_pair(ctx, IBV_QPT_RC, sq_sig_all=0, max_send_wr=N)
    a, b = p.a, p.b
    _fill_unsignaled(p)
    # ... but nothing was polled, so all N slots stay taken
    frags = (
        f"{N} of {N} slots",
        f"{N} unsignaled WRs were posted since the last signaled one",
        f"Signal at least one WR every k < max_send_wr ({N})",
        "RESET",
    )
    with raises_errno(errno.ENOMEM, *frags):
        a.qp.post_send(write_wr(100, a, b, 8, flags=0))
    for _ in range(3):
        assert_cq_empty(a.scq, "send CQ of the stuck QP")
        # even a signaled WR cannot get in
        with raises_errno(errno.ENOMEM, f"{N} of {N} slots"):
            a.qp.post_send(write_wr(101, a, b, 8, flags=IBV_SEND_SIGNALED))
    assert a.qp.qp_state == IBV_QPS_RTS
    assert_cq_empty(a.scq)


def test_full_sq_recovers_only_through_reset(ctx):
    p = make_pair(ctx, IBV_QPT_RC, sq_sig_all=0, max_send_wr=N)
    a, b = p.a, p.b
    _fill_unsignaled(p)
    with raises_errno(errno.ENOMEM):
        a.qp.post_send(write_wr(100, a, b, 8, flags=0))
    # a move to ERR does not free slots of WRs that already succeeded
    from scenario_kit import modify_state

    modify_state(a.qp, IBV_QPS_ERR)
    assert_cq_empty(a.scq, "no flush CQE for WRs that already completed")
    with raises_errno(errno.ENOMEM, f"{N} of {N} slots"):
        a.qp.post_send(write_wr(101, a, b, 8))
    reset_and_reconnect(a.qp, b.qp)
    assert a.qp.qp_state == IBV_QPS_RTS
    a.write(b"after-reset!")
    for i in range(N):
        a.qp.post_send(write_wr(200 + i, a, b, 12, 0, 100 + 12 * i))
    wcs = poll_exact(a.scq, N)
    assert [w.wr_id for w in wcs] == [200 + i for i in range(N)]
    assert all(w.status == IBV_WC_SUCCESS for w in wcs)
    assert b.read(12, 100 + 12 * (N - 1)) == b"after-reset!"


@pytest.mark.parametrize("k", [1, 2, N - 1])
def test_signaling_every_k_keeps_flowing(ctx, k):
    p = make_pair(ctx, IBV_QPT_RC, sq_sig_all=0, max_send_wr=N)
    a, b = p.a, p.b
    iterations = 300
    signaled = []
    for i in range(iterations):
        sig = (i + 1) % k == 0
        a.qp.post_send(write_wr(i, a, b, 8, 0, 8 * (i % 64),
                                flags=IBV_SEND_SIGNALED if sig else 0))  # fmt: skip
        if sig:
            signaled.append(i)
            wc = poll_n(a.scq, 1)[0]
            check_wc(wc, i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
    assert len(signaled) == iterations // k
    assert_cq_empty(a.scq)


def test_polling_a_later_cqe_frees_earlier_unsignaled_slots(ctx):
    p = make_pair(ctx, IBV_QPT_RC, sq_sig_all=0, max_send_wr=N)
    a, b = p.a, p.b
    for i in range(N - 1):
        a.qp.post_send(write_wr(i, a, b, 8, flags=0))
    a.qp.post_send(write_wr(N - 1, a, b, 8, flags=IBV_SEND_SIGNALED))
    # SQ is full until the signaled CQE is polled
    with raises_errno(errno.ENOMEM, f"{N} of {N} slots", "0 unsignaled"):
        a.qp.post_send(write_wr(50, a, b, 8))
    check_wc(poll_exact(a.scq, 1)[0], N - 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
    for i in range(N):  # all N slots are free again
        a.qp.post_send(write_wr(60 + i, a, b, 8, flags=IBV_SEND_SIGNALED))
    assert [w.wr_id for w in poll_exact(a.scq, N)] == [60 + i for i in range(N)]


def test_flushed_unsignaled_wrs_complete(ctx):
    """Flushed WRs are errors, so unsignaled ones make a CQE too."""
    p = make_pair(ctx, IBV_QPT_RC, sq_sig_all=0, max_send_wr=N)
    a, b = p.a, p.b
    from scenario_kit import modify_state

    modify_state(a.qp, IBV_QPS_ERR)
    for i in range(N):
        a.qp.post_send(write_wr(i, a, b, 8, flags=0))
    wcs = poll_exact(a.scq, N)
    for wc, i in zip(wcs, range(N), strict=True):
        check_wc(wc, i, IBV_WC_WR_FLUSH_ERR, qp=a.qp)


# --- the reader's loop (Erfan, seed 000) ----------------------------------------------
def test_erfan_loop_runs_out_of_sq_slots_after_n_iterations(ctx):
    """Shared send/recv CQ: RECV, unsignaled SEND, poll one CQE (the RECV's).

    The peer answers every message, so each iteration's CQE is a receive
    completion; no send CQE is ever polled and the SQ fills after N loops.
    """
    n_iter = 100
    p = make_pair(ctx, IBV_QPT_RC, shared_cq=True, sq_sig_all=0, max_send_wr=N,
                  max_recv_wr=n_iter + 2)  # fmt: skip
    a, b = p.a, p.b
    for i in range(n_iter + 2):
        b.qp.post_recv(recv_wr(1000 + i, b, 64, RECV_OFF))
    done = 0
    with raises_errno(errno.ENOMEM, f"{N} of {N} slots", f"{N} unsignaled WRs"):
        for i in range(n_iter):
            a.qp.post_recv(recv_wr(2000 + i, a, 64, RECV_OFF))  # RECEIVE(...)
            a.qp.post_send(send_wr(i, a, 16, flags=0))  # unsignaled_SEND(...)
            # the server: receives the request and answers it
            req = poll_n(b.rcq, 1, what="server receive")[0]
            check_wc(req, 1000 + i, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=16)
            b.qp.post_send(send_wr(3000 + i, b, 16, flags=IBV_SEND_SIGNALED))
            check_wc(poll_n(b.scq, 1)[0], 3000 + i, IBV_WC_SUCCESS, IBV_WC_SEND)
            wc = poll_n(a.scq, 1, what="client CQ")[0]  # poll_completion(...)
            check_wc(wc, 2000 + i, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=16)
            done += 1
    assert done == N
    assert a.qp.qp_state == IBV_QPS_RTS
