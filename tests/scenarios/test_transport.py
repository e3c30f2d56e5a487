"""SEMANTICS §5: transport behaviour and errors between two QPs in one process."""

from __future__ import annotations

import errno
import sys

import pytest
from scenario_kit import (
    ALL_ACCESS,
    QKEY,
    RECV_OFF,
    assert_cq_empty,
    assert_no_event,
    chain,
    check_wc,
    connect,
    drain_events,
    expect_event,
    gid_index,
    inproc_only,
    make_pair,
    make_qp,
    modify_state,
    poll_exact,
    poll_n,
    recv_wr,
    send_wr,
    stats,
    wait_until,
    write_wr,
)

import softverbs
from softverbs import (
    AH,
    CQ,
    MR,
    MW,
    SGE,
    CompChannel,
    MWBind,
    MWBindInfo,
    PyverbsRDMAError,
    RecvWR,
    SendWR,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_EVENT_QP_ACCESS_ERR,
    IBV_EVENT_QP_REQ_ERR,
    IBV_MTU_4096,
    IBV_MW_TYPE_1,
    IBV_MW_TYPE_2,
    IBV_QP_ACCESS_FLAGS,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTS,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_SEND_FENCE,
    IBV_SEND_INLINE,
    IBV_SEND_SIGNALED,
    IBV_SEND_SOLICITED,
    IBV_WC_BIND_MW,
    IBV_WC_COMP_SWAP,
    IBV_WC_FETCH_ADD,
    IBV_WC_GRH,
    IBV_WC_LOC_LEN_ERR,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_LOCAL_INV,
    IBV_WC_RDMA_READ,
    IBV_WC_RDMA_WRITE,
    IBV_WC_RECV,
    IBV_WC_RECV_RDMA_WITH_IMM,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_REM_INV_REQ_ERR,
    IBV_WC_RETRY_EXC_ERR,
    IBV_WC_RNR_RETRY_EXC_ERR,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
    IBV_WC_WITH_IMM,
    IBV_WC_WITH_INV,
    IBV_WC_WR_FLUSH_ERR,
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_BIND_MW,
    IBV_WR_LOCAL_INV,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE_WITH_IMM,
    IBV_WR_SEND_WITH_IMM,
    IBV_WR_SEND_WITH_INV,
)

SIG = IBV_SEND_SIGNALED
NATIVE = sys.byteorder


def _u64(v: int) -> bytes:
    return v.to_bytes(8, NATIVE)


# --- local protection --------------------------------------------------------------------
@pytest.mark.parametrize("case", ["bad_lkey", "sge_outside_mr", "read_into_readonly"])
def test_local_protection_error(ctx, case):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    if case == "bad_lkey":
        wr = write_wr(1, a, b, 8)
        wr.sg = [SGE(a.mr.buf, 8, a.mr.lkey + 0x100)]
    elif case == "sge_outside_mr":
        wr = write_wr(1, a, b, 8)
        wr.sg = [SGE(a.mr.buf + a.mr.length - 4, 8, a.mr.lkey)]
    else:
        ro = MR(p.pd, 64, 0)  # no LOCAL_WRITE: a READ may not land in it
        wr = SendWR(1, IBV_WR_RDMA_READ, 1, sg=[SGE(ro.buf, 8, ro.lkey)])
        wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
    a.qp.post_send(chain(wr, write_wr(2, a, b, 8, flags=0)))
    wcs = poll_exact(a.scq, 2)
    check_wc(wcs[0], 1, IBV_WC_LOC_PROT_ERR, qp=a.qp)
    check_wc(wcs[1], 2, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    assert wcs[0].reason
    assert a.qp.qp_state == IBV_QPS_ERR
    assert b.qp.qp_state == IBV_QPS_RTS  # nothing reached the responder
    assert_no_event(ctx)


# --- remote access errors ---------------------------------------------------------------
def _mw2_bound(p, access=IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ):
    """A type 2 window on b's MR, bound by a BIND_MW WR on b's QP."""
    b = p.b
    mw = MW(p.pd, IBV_MW_TYPE_2)
    wr = SendWR(50, IBV_WR_BIND_MW, send_flags=SIG)
    wr.set_bind_wr(mw, MWBindInfo(b.mr, b.mr.buf + 4096, 1024, access))
    new_rkey = wr.rkey
    b.qp.post_send(wr)
    check_wc(poll_exact(b.scq, 1)[0], 50, IBV_WC_SUCCESS, IBV_WC_BIND_MW, qp=b.qp)
    assert mw.rkey == new_rkey
    return mw


@pytest.mark.parametrize(
    "case",
    ["bad_rkey", "mr_lacks_remote_write", "qp_lacks_remote_write", "mr_lacks_remote_read",
     "out_of_bounds"],
)  # fmt: skip
def test_remote_access_error(ctx, case):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    read = case == "mr_lacks_remote_read"
    wr = write_wr(1, a, b, 16)
    if read:
        wr = SendWR(1, IBV_WR_RDMA_READ, 1, sg=[a.sge(0, 16)])
    target_rkey, target_addr = b.mr.rkey, b.mr.buf
    if case == "bad_rkey":
        target_rkey ^= 0x1200
    elif case in ("mr_lacks_remote_write", "mr_lacks_remote_read"):
        right = IBV_ACCESS_REMOTE_READ if not read else IBV_ACCESS_REMOTE_WRITE
        mr = MR(p.pd, 4096, IBV_ACCESS_LOCAL_WRITE | right)
        target_rkey, target_addr = mr.rkey, mr.buf
    elif case == "qp_lacks_remote_write":
        from softverbs import QPAttr

        attr = QPAttr()
        attr.qp_access_flags = IBV_ACCESS_REMOTE_READ
        b.qp.modify(attr, IBV_QP_ACCESS_FLAGS)
    else:  # out of bounds
        target_addr = b.mr.buf + b.mr.length - 8
    wr.set_wr_rdma(target_rkey, target_addr)
    b.qp.post_recv(recv_wr(9, b, 64))
    a.qp.post_send(chain(wr, send_wr(2, a, 8, flags=0)))
    wcs = poll_exact(a.scq, 2)
    check_wc(wcs[0], 1, IBV_WC_REM_ACCESS_ERR, qp=a.qp)
    check_wc(wcs[1], 2, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    assert a.qp.qp_state == IBV_QPS_ERR
    assert b.qp.qp_state == IBV_QPS_ERR
    expect_event(ctx, IBV_EVENT_QP_ACCESS_ERR, b.qp)
    check_wc(poll_exact(b.rcq, 1)[0], 9, IBV_WC_WR_FLUSH_ERR, qp=b.qp)
    if not read:
        assert b.read(16, 0) == bytes(16)


# --- length and request errors -------------------------------------------------------------
def test_send_longer_than_receive(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    b.qp.post_recv(chain(recv_wr(1, b, 100), recv_wr(2, b, 100)))
    a.qp.post_send(send_wr(10, a, 101))
    check_wc(poll_exact(a.scq, 1)[0], 10, IBV_WC_REM_INV_REQ_ERR, qp=a.qp)
    rwcs = poll_exact(b.rcq, 2)
    check_wc(rwcs[0], 1, IBV_WC_LOC_LEN_ERR, qp=b.qp)
    check_wc(rwcs[1], 2, IBV_WC_WR_FLUSH_ERR, qp=b.qp)
    assert a.qp.qp_state == IBV_QPS_ERR
    assert b.qp.qp_state == IBV_QPS_ERR
    drain_events(ctx)


def test_multi_packet_send_longer_than_receive(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    b.qp.post_recv(recv_wr(1, b, 2500))
    a.qp.post_send(send_wr(10, a, 3000))
    check_wc(poll_exact(a.scq, 1)[0], 10, IBV_WC_REM_INV_REQ_ERR, qp=a.qp)
    check_wc(poll_exact(b.rcq, 1)[0], 1, IBV_WC_LOC_LEN_ERR, qp=b.qp)
    assert (a.qp.qp_state, b.qp.qp_state) == (IBV_QPS_ERR, IBV_QPS_ERR)
    drain_events(ctx)


def test_unaligned_atomic_is_invalid_request(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    wr = SendWR(1, IBV_WR_ATOMIC_FETCH_AND_ADD, 1, sg=[a.sge(0, 8)])
    wr.set_wr_atomic(b.mr.rkey, b.mr.buf + 4, 1)
    a.qp.post_send(wr)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_REM_INV_REQ_ERR, qp=a.qp)
    assert (a.qp.qp_state, b.qp.qp_state) == (IBV_QPS_ERR, IBV_QPS_ERR)
    ev = expect_event(ctx, IBV_EVENT_QP_REQ_ERR, b.qp)
    assert "aligned" in ev.reason
    assert b.read(16, 0) == bytes(16)


# --- atomics ------------------------------------------------------------------------------
def test_atomics_return_original_value(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    b.write(_u64(100), 64)
    # CMP_SWAP hit: 100 == 100 -> 7
    cs = SendWR(1, IBV_WR_ATOMIC_CMP_AND_SWP, 1, sg=[a.sge(0, 8)])
    cs.set_wr_atomic(b.mr.rkey, b.mr.buf + 64, 100, 7)
    a.qp.post_send(cs)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, byte_len=8)
    assert a.read(8, 0) == _u64(100)
    assert b.read(8, 64) == _u64(7)
    # CMP_SWAP miss: 7 != 100, memory unchanged, original returned
    miss = SendWR(2, IBV_WR_ATOMIC_CMP_AND_SWP, 1, sg=[a.sge(8, 8)])
    miss.set_wr_atomic(b.mr.rkey, b.mr.buf + 64, 100, 55)
    a.qp.post_send(miss)
    check_wc(poll_exact(a.scq, 1)[0], 2, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, byte_len=8)
    assert a.read(8, 8) == _u64(7)
    assert b.read(8, 64) == _u64(7)
    # FETCH_ADD wraps at 64 bits
    b.write(_u64(2**64 - 2), 72)
    fa = SendWR(3, IBV_WR_ATOMIC_FETCH_AND_ADD, 1, sg=[a.sge(16, 8)])
    fa.set_wr_atomic(b.mr.rkey, b.mr.buf + 72, 5)
    a.qp.post_send(fa)
    check_wc(poll_exact(a.scq, 1)[0], 3, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, byte_len=8)
    assert a.read(8, 16) == _u64(2**64 - 2)
    assert b.read(8, 72) == _u64(3)


# --- RNR ---------------------------------------------------------------------------------
def test_rnr_retried_until_receive_posted(ctx):
    p = make_pair(ctx, IBV_QPT_RC, conn={"rnr_retry": 7, "min_rnr_timer": 1})
    a, b = p.a, p.b
    s0 = stats(ctx)
    a.write(b"late receive")
    a.qp.post_send(send_wr(1, a, 12))
    wait_until(lambda: stats(ctx)["rcvd_rnr_err"] - s0["rcvd_rnr_err"] >= 3, ctx,
               what="three RNR NAKs")  # fmt: skip
    assert_cq_empty(a.scq, "the SEND waits for a receive")
    assert a.qp.qp_state == IBV_QPS_RTS
    b.qp.post_recv(recv_wr(7, b, 64))
    check_wc(poll_n(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)
    check_wc(poll_exact(b.rcq, 1)[0], 7, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=12)
    assert b.read(12, RECV_OFF) == b"late receive"
    s1 = stats(ctx)
    assert s1["send_rnr_err"] - s0["send_rnr_err"] == s1["rcvd_rnr_err"] - s0["rcvd_rnr_err"]
    assert s1["retry_rnr_exceeded_err"] == s0["retry_rnr_exceeded_err"]


def test_rnr_on_a_pipelined_send_costs_no_retry_cnt(ctx):
    """WRITEs sent behind an RNR-NAKed SEND are not a loss: retry_cnt=0 survives."""
    p = make_pair(ctx, IBV_QPT_RC, conn={"retry_cnt": 0, "rnr_retry": 7})
    a, b = p.a, p.b
    s0 = stats(ctx)
    a.write(b"W" * 16, 100)
    a.qp.post_send(chain(send_wr(1, a, 8), write_wr(2, a, b, 8, 100, 0),
                         write_wr(3, a, b, 8, 108, 8)))  # fmt: skip
    wait_until(lambda: stats(ctx)["rcvd_rnr_err"] - s0["rcvd_rnr_err"] >= 2, ctx,
               what="two RNR NAKs")  # fmt: skip
    b.qp.post_recv(recv_wr(5, b, 64))
    wcs = poll_n(a.scq, 3)
    assert [(w.wr_id, w.status) for w in wcs] == [(i, IBV_WC_SUCCESS) for i in (1, 2, 3)]
    check_wc(poll_exact(b.rcq, 1)[0], 5, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=8)
    assert b.read(16, 0) == b"W" * 16
    s1 = stats(ctx)
    assert s1["rcvd_seq_err"] == s0["rcvd_seq_err"]
    assert s1["retry_exceeded_err"] == s0["retry_exceeded_err"]


@pytest.mark.parametrize("rnr_retry", [0, 1, 3, 6])
def test_rnr_retry_exhausted(ctx, rnr_retry):
    p = make_pair(ctx, IBV_QPT_RC, conn={"rnr_retry": rnr_retry, "min_rnr_timer": 1})
    a, b = p.a, p.b
    s0 = stats(ctx)
    a.qp.post_send(chain(send_wr(1, a, 8), send_wr(2, a, 8)))
    wcs = poll_exact(a.scq, 2)
    check_wc(wcs[0], 1, IBV_WC_RNR_RETRY_EXC_ERR, qp=a.qp)
    check_wc(wcs[1], 2, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    assert "rnr_retry" in wcs[0].reason
    s1 = stats(ctx)
    assert s1["rcvd_rnr_err"] - s0["rcvd_rnr_err"] == rnr_retry + 1
    assert s1["send_rnr_err"] - s0["send_rnr_err"] == rnr_retry + 1
    assert s1["retry_rnr_exceeded_err"] - s0["retry_rnr_exceeded_err"] == 1
    assert a.qp.qp_state == IBV_QPS_ERR
    assert b.qp.qp_state == IBV_QPS_RTS  # RNR is not an error at the responder


# --- ACK timeout ---------------------------------------------------------------------------
@pytest.mark.parametrize("peer", ["reset", "init", "destroyed"])
def test_ack_timeout_retry_exhausted(ctx, peer):
    retry_cnt = 3
    p = make_pair(ctx, IBV_QPT_RC, conn={"timeout": 8, "retry_cnt": retry_cnt})
    a, b = p.a, p.b
    if peer == "reset":
        modify_state(b.qp, IBV_QPS_RESET)
    elif peer == "init":
        modify_state(b.qp, IBV_QPS_RESET)
        from softverbs import QPAttr

        attr = QPAttr()
        attr.qp_access_flags = ALL_ACCESS
        b.qp.to_init(attr)
        assert b.qp.qp_state == IBV_QPS_INIT
    else:
        b.qp.close()
    s0 = stats(ctx)
    a.qp.post_send(chain(write_wr(1, a, b, 8), write_wr(2, a, b, 8, flags=0)))
    wcs = poll_exact(a.scq, 2, timeout=5)
    check_wc(wcs[0], 1, IBV_WC_RETRY_EXC_ERR, qp=a.qp)
    check_wc(wcs[1], 2, IBV_WC_WR_FLUSH_ERR, qp=a.qp)
    assert "retry_cnt=3" in wcs[0].reason
    assert a.qp.qp_state == IBV_QPS_ERR
    s1 = stats(ctx)
    assert s1["retry_exceeded_err"] - s0["retry_exceeded_err"] == 1
    assert s1["completer_retry_err"] - s0["completer_retry_err"] == retry_cnt
    # the first transmission and retry_cnt retransmissions of both WRITEs
    assert s1["sent_pkts"] - s0["sent_pkts"] == 2 * (retry_cnt + 1)
    assert b.read(16, 0) == bytes(16)


# --- UD ------------------------------------------------------------------------------------
def test_ud_no_receive_is_dropped_and_counted(ctx):
    p = make_pair(ctx, IBV_QPT_UD)
    a, b = p.a, p.b
    s0 = stats(ctx)
    wr = send_wr(1, a, 16)
    wr.set_wr_ud(p.ah(), b.qp.qp_num, QKEY)
    a.qp.post_send(wr)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)  # UD: sent is done
    # the sender completes when its packet leaves; the receiver counts it when it
    # arrives, which on a served device may be a moment later
    wait_until(lambda: stats(ctx)["drop_no_rqe"] > s0["drop_no_rqe"], ctx, what="drop_no_rqe")
    assert stats(ctx)["drop_no_rqe"] - s0["drop_no_rqe"] == 1
    b.qp.post_recv(recv_wr(2, b, 128))
    assert_cq_empty(b.rcq, "a dropped datagram is not delivered later")
    assert b.qp.qp_state == IBV_QPS_RTS


def test_ud_wrong_qkey_is_dropped_and_counted(ctx):
    p = make_pair(ctx, IBV_QPT_UD)
    a, b = p.a, p.b
    b.qp.post_recv(recv_wr(2, b, 128))
    s0 = stats(ctx)
    port0 = ctx.query_port(1).qkey_viol_cntr
    wr = send_wr(1, a, 16)
    wr.set_wr_ud(p.ah(), b.qp.qp_num, QKEY + 1)
    a.qp.post_send(wr)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)
    assert_cq_empty(b.rcq)
    # the sender completes when its packet leaves; the receiver counts it when it
    # arrives, which on a served device may be a moment later
    wait_until(lambda: stats(ctx)["qkey_violation"] > s0["qkey_violation"], ctx,
               what="qkey_violation")
    assert stats(ctx)["qkey_violation"] - s0["qkey_violation"] == 1
    assert ctx.query_port(1).qkey_viol_cntr == port0 + 1
    # the receive is still there for a datagram with the right QKEY
    wr2 = send_wr(3, a, 16)
    wr2.set_wr_ud(p.ah(), b.qp.qp_num, QKEY)
    a.qp.post_send(wr2)
    check_wc(poll_exact(b.rcq, 1)[0], 2, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=56)


def test_ud_grh_precedes_payload(ctx):
    p = make_pair(ctx, IBV_QPT_UD)
    a, b = p.a, p.b
    b.qp.post_recv(recv_wr(2, b, 40 + 100))
    a.write(b"datagram payload")
    wr = SendWR(1, IBV_WR_SEND_WITH_IMM, 1, sg=[a.sge(0, 16)], imm_data=0x12345678)
    wr.set_wr_ud(p.ah(), b.qp.qp_num, QKEY)
    a.qp.post_send(wr)
    wc = poll_exact(b.rcq, 1)[0]
    check_wc(wc, 2, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=40 + 16, qp=b.qp)
    assert wc.wc_flags & IBV_WC_GRH
    assert wc.wc_flags & IBV_WC_WITH_IMM
    assert wc.imm_data == 0x12345678
    assert wc.src_qp == a.qp.qp_num
    grh = b.read(40, RECV_OFF)
    assert b.read(16, RECV_OFF + 40) == b"datagram payload"
    assert grh[:20] == bytes(20)  # RoCEv2 over IPv4: 20 zero bytes, then the IPv4 header
    assert grh[20] >> 4 == 4
    src = bytes(ctx.query_gid(1, gid_index(ctx)).raw[12:])
    assert grh[32:36] == src and grh[36:40] == src
    # answer the sender with an AH made from the completion
    ah = AH(p.pd, wc=wc, grh=grh, port_num=1)
    a.qp.post_recv(recv_wr(5, a, 128))
    back = send_wr(6, b, 4, RECV_OFF + 40)
    back.set_wr_ud(ah, wc.src_qp, QKEY)
    b.qp.post_send(back)
    check_wc(poll_exact(a.rcq, 1)[0], 5, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=44)
    assert a.read(4, RECV_OFF + 40) == b"data"


# --- immediate data --------------------------------------------------------------------------
@pytest.mark.parametrize("qp_type", [IBV_QPT_RC, IBV_QPT_UC])
def test_send_with_imm(ctx, qp_type):
    p = make_pair(ctx, qp_type)
    a, b = p.a, p.b
    b.qp.post_recv(recv_wr(3, b, 64))
    a.write(b"imm!")
    a.qp.post_send(SendWR(1, IBV_WR_SEND_WITH_IMM, 1, sg=[a.sge(0, 4)], imm_data=0xCAFEF00D))
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)
    wc = poll_exact(b.rcq, 1)[0]
    check_wc(wc, 3, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=4)
    assert wc.wc_flags & IBV_WC_WITH_IMM
    assert wc.imm_data == 0xCAFEF00D
    assert b.read(4, RECV_OFF) == b"imm!"


@pytest.mark.parametrize("qp_type", [IBV_QPT_RC, IBV_QPT_UC])
def test_rdma_write_with_imm(ctx, qp_type):
    p = make_pair(ctx, qp_type)
    a, b = p.a, p.b
    b.qp.post_recv(recv_wr(3, b, 64))
    a.write(b"written with imm" * 200)  # 3200 bytes: several packets
    wr = write_wr(1, a, b, 3200, 0, 256, opcode=IBV_WR_RDMA_WRITE_WITH_IMM)
    wr.imm_data = 0x01020304
    a.qp.post_send(wr)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, byte_len=3200)
    wc = poll_exact(b.rcq, 1)[0]
    check_wc(wc, 3, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, byte_len=3200, qp=b.qp)
    assert wc.wc_flags & IBV_WC_WITH_IMM
    assert wc.imm_data == 0x01020304
    assert b.read(3200, 256) == b"written with imm" * 200
    assert b.read(64, RECV_OFF) == bytes(64)  # the receive buffer is not written


def test_rdma_write_with_imm_without_receive_is_rnr(ctx):
    p = make_pair(ctx, IBV_QPT_RC, conn={"rnr_retry": 0})
    a, b = p.a, p.b
    wr = write_wr(1, a, b, 8, opcode=IBV_WR_RDMA_WRITE_WITH_IMM)
    a.qp.post_send(wr)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_RNR_RETRY_EXC_ERR)


# --- memory windows and invalidation ----------------------------------------------------------
def test_type2_mw_send_with_inv(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    mw = _mw2_bound(p)
    a.write(b"via window")
    a.qp.post_send(write_wr(1, a, b, 10))
    w = write_wr(2, a, b, 10)
    w.set_wr_rdma(mw.rkey, b.mr.buf + 4096 + 100)
    a.qp.post_send(w)
    assert [x.status for x in poll_exact(a.scq, 2)] == [IBV_WC_SUCCESS] * 2
    assert b.read(10, 4096 + 100) == b"via window"
    b.qp.post_recv(recv_wr(7, b, 64))
    inv = SendWR(3, IBV_WR_SEND_WITH_INV, 1, sg=[a.sge(0, 3)])
    inv.invalidate_rkey = mw.rkey
    a.qp.post_send(inv)
    check_wc(poll_exact(a.scq, 1)[0], 3, IBV_WC_SUCCESS, IBV_WC_SEND)
    wc = poll_exact(b.rcq, 1)[0]
    check_wc(wc, 7, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=3)
    assert wc.wc_flags & IBV_WC_WITH_INV
    assert wc.invalidated_rkey == mw.rkey
    # the window is now invalid
    w2 = write_wr(4, a, b, 10)
    w2.set_wr_rdma(mw.rkey, b.mr.buf + 4096)
    a.qp.post_send(w2)
    check_wc(poll_exact(a.scq, 1)[0], 4, IBV_WC_REM_ACCESS_ERR)
    expect_event(ctx, IBV_EVENT_QP_ACCESS_ERR, b.qp)


def test_type2_mw_local_inv_then_remote_access_fails(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    mw = _mw2_bound(p)
    rkey = mw.rkey
    inv = SendWR(60, IBV_WR_LOCAL_INV, send_flags=SIG)
    inv.invalidate_rkey = rkey
    b.qp.post_send(inv)
    check_wc(poll_exact(b.scq, 1)[0], 60, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV, qp=b.qp)
    w = write_wr(1, a, b, 8)
    w.set_wr_rdma(rkey, b.mr.buf + 4096)
    a.qp.post_send(w)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_REM_ACCESS_ERR, qp=a.qp)
    assert (a.qp.qp_state, b.qp.qp_state) == (IBV_QPS_ERR, IBV_QPS_ERR)
    ev = expect_event(ctx, IBV_EVENT_QP_ACCESS_ERR, b.qp)
    assert "invalid" in ev.reason
    assert b.read(8, 4096) == bytes(8)


def test_type1_mw_bind_mw(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    mw = MW(p.pd, IBV_MW_TYPE_1)
    info = MWBindInfo(b.mr, b.mr.buf + 8192, 256, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
    b.qp.bind_mw(mw, MWBind(info, SIG, wr_id=77))
    check_wc(poll_exact(b.scq, 1)[0], 77, IBV_WC_SUCCESS, IBV_WC_BIND_MW, qp=b.qp)
    a.write(b"type1 window")
    w = write_wr(1, a, b, 12)
    w.set_wr_rdma(mw.rkey, b.mr.buf + 8192 + 10)
    a.qp.post_send(w)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
    assert b.read(12, 8192 + 10) == b"type1 window"
    r = SendWR(2, IBV_WR_RDMA_READ, 1, sg=[a.sge(100, 12)])
    r.set_wr_rdma(mw.rkey, b.mr.buf + 8192 + 10)
    a.qp.post_send(r)
    check_wc(poll_exact(a.scq, 1)[0], 2, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, byte_len=12)
    assert a.read(12, 100) == b"type1 window"
    # past the window's end
    w2 = write_wr(3, a, b, 12)
    w2.set_wr_rdma(mw.rkey, b.mr.buf + 8192 + 250)
    a.qp.post_send(w2)
    check_wc(poll_exact(a.scq, 1)[0], 3, IBV_WC_REM_ACCESS_ERR)
    expect_event(ctx, IBV_EVENT_QP_ACCESS_ERR, b.qp)


# --- fence -----------------------------------------------------------------------------------
def test_fence_waits_for_earlier_read(ctx):
    """READ remote X into local L, then a fenced WRITE of L to remote Y:
    Y must get X's bytes, so the WRITE did not start before the READ completed."""
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    b.write(b"X" * 64, 0)  # remote X
    a.write(b"L" * 64, 0)  # local L, stale
    rd = SendWR(1, IBV_WR_RDMA_READ, 1, sg=[a.sge(0, 64)], send_flags=SIG)
    rd.set_wr_rdma(b.mr.rkey, b.mr.buf)
    wr = write_wr(2, a, b, 64, 0, 1024, flags=SIG | IBV_SEND_FENCE)
    a.qp.post_send(chain(rd, wr))
    wcs = poll_exact(a.scq, 2)
    check_wc(wcs[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, byte_len=64)
    check_wc(wcs[1], 2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, byte_len=64)
    assert b.read(64, 1024) == b"X" * 64


def test_fence_waits_for_earlier_atomic(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    b.write(_u64(41), 0)
    a.write(_u64(0), 0)
    fa = SendWR(1, IBV_WR_ATOMIC_FETCH_AND_ADD, 1, sg=[a.sge(0, 8)])
    fa.set_wr_atomic(b.mr.rkey, b.mr.buf, 1)
    wr = write_wr(2, a, b, 8, 0, 512, flags=SIG | IBV_SEND_FENCE)
    a.qp.post_send(chain(fa, wr))
    assert [w.wr_id for w in poll_exact(a.scq, 2)] == [1, 2]
    assert b.read(8, 512) == _u64(41)
    assert b.read(8, 0) == _u64(42)


# --- scatter/gather and inline -----------------------------------------------------------------
def test_multi_sge_send_write_read(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    a.write(b"aaaa", 0)
    a.write(b"bbbbbbbb", 100)
    a.write(b"cc", 200)
    gather = [a.sge(0, 4), a.sge(100, 8), a.sge(200, 2)]
    rwr = RecvWR(1, 3, [b.sge(RECV_OFF, 3), b.sge(RECV_OFF + 50, 5), b.sge(RECV_OFF + 90, 10)])
    b.qp.post_recv(rwr)
    a.qp.post_send(SendWR(10, num_sge=3, sg=gather))
    check_wc(poll_exact(b.rcq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=14)
    assert b.read(3, RECV_OFF) == b"aaa"
    assert b.read(5, RECV_OFF + 50) == b"abbbb"
    assert b.read(10, RECV_OFF + 90) == b"bbbbcc" + bytes(4)
    w = SendWR(11, num_sge=3, sg=gather, opcode=softverbs.enums.IBV_WR_RDMA_WRITE)
    w.set_wr_rdma(b.mr.rkey, b.mr.buf + 300)
    a.qp.post_send(w)
    wait_until(lambda: b.read(14, 300) == b"aaaabbbbbbbbcc", ctx, what="the WRITE landing")
    r = SendWR(12, IBV_WR_RDMA_READ, 2, sg=[a.sge(1000, 6), a.sge(2000, 8)])
    r.set_wr_rdma(b.mr.rkey, b.mr.buf + 300)
    a.qp.post_send(r)
    wcs = poll_exact(a.scq, 3)
    assert [w.wr_id for w in wcs] == [10, 11, 12]
    check_wc(wcs[2], 12, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, byte_len=14)
    assert a.read(6, 1000) == b"aaaabb" and a.read(8, 2000) == b"bbbbbbcc"


def test_inline_data_is_copied_at_post_time(ctx):
    p = make_pair(ctx, IBV_QPT_RC, max_inline_data=64)
    a, b = p.a, p.b
    buf = bytearray(b"inline payload!!")
    import ctypes

    cbuf = (ctypes.c_char * len(buf)).from_buffer(buf)
    addr = ctypes.addressof(cbuf)
    b.qp.post_recv(recv_wr(1, b, 64))
    # deferred, so it executes only after the buffer changed; lkey is ignored for inline
    wr = SendWR(2, num_sge=1, sg=[SGE(addr, 16, 0)],
                send_flags=SIG | IBV_SEND_INLINE | softverbs.IBV_SEND_DEFER)  # fmt: skip
    a.qp.post_send(wr)
    buf[:] = b"CHANGED CHANGED!"
    a.qp.post_send(write_wr(3, a, b, 8))  # rings
    check_wc(poll_exact(b.rcq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=16)
    assert b.read(16, RECV_OFF) == b"inline payload!!"
    assert [w.wr_id for w in poll_exact(a.scq, 2)] == [2, 3]
    del cbuf


# --- solicited events ---------------------------------------------------------------------
def _channel_pair(ctx, **kw):
    ch = CompChannel(ctx)
    p = make_pair(ctx, IBV_QPT_RC, connected=False, **kw)
    rcq = CQ(ctx, 64, None, ch, 0)
    b_qp = make_qp(p.pd, IBV_QPT_RC, p.b.scq, rcq)
    p.b.qp.close()
    p.b.qp, p.b.rcq = b_qp, rcq
    connect(p.a.qp, b_qp.qp_num)
    connect(b_qp, p.a.qp.qp_num)
    return p, ch


def _no_cq_event(ch, cq):
    with pytest.raises(PyverbsRDMAError) as ei:
        ch.get_cq_event(cq, timeout=0.02)
    assert ei.value.error_code == errno.EAGAIN


def test_solicited_only_wakes_for_solicited_send(ctx):
    p, ch = _channel_pair(ctx)
    a, b = p.a, p.b
    cq = b.rcq
    for i in range(3):
        b.qp.post_recv(recv_wr(i, b, 64))
    cq.req_notify(solicited_only=True)
    a.qp.post_send(send_wr(10, a, 8))  # not solicited
    _no_cq_event(ch, cq)
    a.qp.post_send(send_wr(11, a, 8, flags=SIG | IBV_SEND_SOLICITED))
    ch.get_cq_event(cq, timeout=1)
    cq.ack_events(1)
    wcs = poll_exact(cq, 2)
    assert [w.wr_id for w in wcs] == [0, 1]
    # armed once: without a new req_notify nothing fires
    a.qp.post_send(send_wr(12, a, 8, flags=SIG | IBV_SEND_SOLICITED))
    _no_cq_event(ch, cq)
    poll_exact(cq, 1)
    assert [w.wr_id for w in poll_exact(a.scq, 3)] == [10, 11, 12]


def test_solicited_only_wakes_for_an_error(ctx):
    p, ch = _channel_pair(ctx)
    b = p.b
    cq = b.rcq
    b.qp.post_recv(recv_wr(1, b, 64))
    cq.req_notify(solicited_only=True)
    modify_state(b.qp, IBV_QPS_ERR)  # the flushed receive is an error CQE
    ch.get_cq_event(cq, timeout=1)
    cq.ack_events(1)
    check_wc(poll_exact(cq, 1)[0], 1, IBV_WC_WR_FLUSH_ERR)


def test_notify_any_wakes_for_every_completion(ctx):
    p, ch = _channel_pair(ctx)
    a, b = p.a, p.b
    cq = b.rcq
    b.qp.post_recv(recv_wr(1, b, 64))
    _no_cq_event(ch, cq)  # not armed
    cq.req_notify(solicited_only=False)
    a.qp.post_send(send_wr(10, a, 8))
    ch.get_cq_event(cq, timeout=1)
    cq.ack_events(1)
    assert cq.num_events == 0
    check_wc(poll_exact(cq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV)


# --- big messages -------------------------------------------------------------------------------
MIB = 1 << 20


@pytest.mark.parametrize("mtu", [None, IBV_MTU_4096])
def test_one_mib_messages_arrive_intact(ctx, mtu):
    conn = {} if mtu is None else {"path_mtu": mtu}
    p = make_pair(ctx, IBV_QPT_RC, conn=conn, mr_size=4 * MIB)
    a, b = p.a, p.b
    pattern = bytes((i * 7 + i // 251) & 0xFF for i in range(4096)) * (MIB // 4096)
    a.write(pattern, 0)
    # WRITE a -> b
    a.qp.post_send(write_wr(1, a, b, MIB, 0, 0))
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, byte_len=MIB)
    assert b.read(MIB, 0) == pattern
    # READ it back into another place of a
    r = SendWR(2, IBV_WR_RDMA_READ, 1, sg=[a.sge(MIB, MIB)])
    r.set_wr_rdma(b.mr.rkey, b.mr.buf)
    a.qp.post_send(r)
    check_wc(poll_exact(a.scq, 1)[0], 2, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, byte_len=MIB)
    assert a.read(MIB, MIB) == pattern
    # SEND it
    b.qp.post_recv(RecvWR(3, 1, [b.sge(2 * MIB, MIB)]))
    a.qp.post_send(send_wr(4, a, MIB, 0))
    check_wc(poll_exact(a.scq, 1)[0], 4, IBV_WC_SUCCESS, IBV_WC_SEND, byte_len=MIB)
    check_wc(poll_exact(b.rcq, 1)[0], 3, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=MIB)
    assert b.read(MIB, 2 * MIB) == pattern


@pytest.mark.parametrize("qp_type", [IBV_QPT_UC])
def test_uc_large_write_and_send(ctx, qp_type):
    p = make_pair(ctx, qp_type, mr_size=2 * MIB)
    a, b = p.a, p.b
    data = bytes(range(256)) * (256 * 1024 // 256)
    a.write(data, 0)
    a.qp.post_send(write_wr(1, a, b, len(data), 0, 0))
    b.qp.post_recv(RecvWR(2, 1, [b.sge(MIB, len(data))]))
    a.qp.post_send(send_wr(3, a, len(data)))
    assert [w.wr_id for w in poll_exact(a.scq, 2)] == [1, 3]
    check_wc(poll_exact(b.rcq, 1)[0], 2, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=len(data))
    assert b.read(len(data), 0) == data
    assert b.read(len(data), MIB) == data


# --- timers: never early, 0 = forever ------------------------------------------------------------
def test_rnr_retry_waits_for_the_rnr_timer(ctx):
    """min_rnr_timer code 20 is 10.24 ms: no retry may come sooner."""
    p = make_pair(ctx, IBV_QPT_RC, conn={"rnr_retry": 1}, conn_b={"min_rnr_timer": 20})
    a = p.a
    import time

    s0 = stats(ctx)
    t0 = time.monotonic()  # before the post: the first RNR NAK arrives inside it
    a.qp.post_send(send_wr(1, a, 8))
    wait_until(lambda: stats(ctx)["rcvd_rnr_err"] - s0["rcvd_rnr_err"] >= 1, ctx,
               what="the first RNR NAK")  # fmt: skip
    check_wc(poll_n(a.scq, 1)[0], 1, IBV_WC_RNR_RETRY_EXC_ERR)
    assert stats(ctx)["rcvd_rnr_err"] - s0["rcvd_rnr_err"] == 2  # the first, and the retry
    assert time.monotonic() - t0 >= 0.01024 - 1e-6
    assert stats(ctx)["rcvd_rnr_err"] - s0["rcvd_rnr_err"] == 2


def test_ack_timeout_waits_for_the_timer(ctx):
    """timeout code 12 is 4.096 us * 2**12 = 16.8 ms per try; retry_cnt=1: two tries."""
    p = make_pair(ctx, IBV_QPT_RC, conn={"timeout": 12, "retry_cnt": 1})
    a, b = p.a, p.b
    import time

    modify_state(b.qp, IBV_QPS_RESET)
    t0 = time.monotonic()
    a.qp.post_send(write_wr(1, a, b, 8))
    check_wc(poll_n(a.scq, 1)[0], 1, IBV_WC_RETRY_EXC_ERR)
    assert time.monotonic() - t0 >= 2 * 4.096e-6 * (1 << 12) - 1e-6


def test_ack_timeout_zero_waits_forever(ctx):
    p = make_pair(ctx, IBV_QPT_RC, conn={"timeout": 0, "retry_cnt": 1})
    a, b = p.a, p.b
    modify_state(b.qp, IBV_QPS_RESET)
    s0 = stats(ctx)
    a.qp.post_send(write_wr(1, a, b, 8))
    assert_cq_empty(a.scq, settle=0.05)
    assert_cq_empty(a.scq)
    s1 = stats(ctx)
    assert s1["sent_pkts"] - s0["sent_pkts"] == 1  # never retransmitted
    assert s1["retry_exceeded_err"] == s0["retry_exceeded_err"]
    modify_state(a.qp, IBV_QPS_ERR)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_WR_FLUSH_ERR)


# --- UC specifics ----------------------------------------------------------------------------
def test_uc_lost_packet_drops_the_message(ctx):
    from scenario_kit import DropFilter

    from softverbs.wire.opcodes import Op

    p = make_pair(ctx, IBV_QPT_UC)
    a, b = p.a, p.b
    b.qp.post_recv(chain(recv_wr(1, b, 4096, RECV_OFF), recv_wr(2, b, 4096, RECV_OFF + 4096)))
    a.write(b"1" * 3000, 0)
    a.write(b"2" * 3000, 4096)
    drop = DropFilter(lambda pkt: (pkt.opcode & 0x1F) == Op.SEND_MIDDLE)
    inproc_only(ctx)
    ctx.runtime.faults = drop
    a.qp.post_send(send_wr(10, a, 3000, 0))  # FIRST, (MIDDLE lost), LAST
    ctx.runtime.faults = None
    assert drop.dropped == 1
    a.qp.post_send(send_wr(11, a, 3000, 4096))
    # the requester never knows; the lost message never completes at the responder
    assert [w.status for w in poll_exact(a.scq, 2)] == [IBV_WC_SUCCESS] * 2
    wc = poll_exact(b.rcq, 1)[0]
    check_wc(wc, 1, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=3000)
    assert b.read(3000, RECV_OFF) == b"2" * 3000  # the WQE of the dropped message is reused
    assert b.qp.qp_state == IBV_QPS_RTS


def test_uc_write_with_bad_rkey_is_silently_dropped(ctx):
    p = make_pair(ctx, IBV_QPT_UC)
    a, b = p.a, p.b
    s0 = stats(ctx)
    w = write_wr(1, a, b, 8)
    w.set_wr_rdma(b.mr.rkey ^ 0x300, b.mr.buf)
    a.qp.post_send(w)
    check_wc(poll_exact(a.scq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
    assert (a.qp.qp_state, b.qp.qp_state) == (IBV_QPS_RTS, IBV_QPS_RTS)
    # the sender completes when its packet leaves; the receiver counts it when it
    # arrives, which on a served device may be a moment later
    wait_until(lambda: stats(ctx)["drop_uc_access"] > s0["drop_uc_access"], ctx,
               what="drop_uc_access")
    assert stats(ctx)["drop_uc_access"] - s0["drop_uc_access"] == 1
    assert_no_event(ctx)
    a.write(b"fine now")
    a.qp.post_send(write_wr(2, a, b, 8))
    poll_exact(a.scq, 1)
    # as above: on a served device the bytes land a moment after the sender completes
    wait_until(lambda: b.read(8, 0) == b"fine now", ctx, what="the second WRITE's bytes")
    assert b.read(8, 0) == b"fine now"


def test_uc_send_longer_than_receive_errs_the_responder(ctx):
    p = make_pair(ctx, IBV_QPT_UC)
    a, b = p.a, p.b
    b.qp.post_recv(chain(recv_wr(1, b, 16), recv_wr(2, b, 16)))
    a.qp.post_send(send_wr(10, a, 17))
    check_wc(poll_exact(a.scq, 1)[0], 10, IBV_WC_SUCCESS, IBV_WC_SEND)  # UC: no ACK, no NAK
    rwcs = poll_exact(b.rcq, 2)
    check_wc(rwcs[0], 1, IBV_WC_LOC_LEN_ERR, qp=b.qp)
    check_wc(rwcs[1], 2, IBV_WC_WR_FLUSH_ERR, qp=b.qp)
    assert b.qp.qp_state == IBV_QPS_ERR
    assert a.qp.qp_state == IBV_QPS_RTS
    drain_events(ctx)


def test_srq_responder_error_posts_last_wqe_reached(ctx):
    from softverbs import PD, SRQ, SrqAttr, SrqInitAttr
    from softverbs.enums import IBV_EVENT_QP_LAST_WQE_REACHED

    pd = PD(ctx)
    cq = CQ(ctx, 32)
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=1)))
    r = make_qp(pd, IBV_QPT_RC, cq, srq=srq)
    s = make_qp(pd, IBV_QPT_RC, cq)
    connect(r, s.qp_num)
    connect(s, r.qp_num)
    mr = MR(pd, 4096, ALL_ACCESS)
    srq.post_recv(RecvWR(1, 1, [SGE(mr.buf, 64, mr.lkey)]))
    w = SendWR(5, softverbs.enums.IBV_WR_RDMA_WRITE, 1, sg=[SGE(mr.buf, 8, mr.lkey)])
    w.set_wr_rdma(mr.rkey + 0x100, mr.buf)
    s.post_send(w)
    check_wc(poll_exact(cq, 1)[0], 5, IBV_WC_REM_ACCESS_ERR, qp=s)
    expect_event(ctx, IBV_EVENT_QP_ACCESS_ERR, r)
    expect_event(ctx, IBV_EVENT_QP_LAST_WQE_REACHED, r)
    assert_no_event(ctx)
    assert r.qp_state == IBV_QPS_ERR


def test_ud_message_up_to_the_port_mtu(ctx):
    from softverbs.enums import IBV_QPS_SQE, mtu_to_bytes

    mtu = mtu_to_bytes(ctx.query_port(1).active_mtu)
    p = make_pair(ctx, IBV_QPT_UD)
    a, b = p.a, p.b
    data = bytes(range(256)) * (mtu // 256)
    a.write(data)
    b.qp.post_recv(recv_wr(1, b, 40 + mtu))
    ok = send_wr(2, a, mtu)
    ok.set_wr_ud(p.ah(), b.qp.qp_num, QKEY)
    a.qp.post_send(ok)
    check_wc(poll_exact(a.scq, 1)[0], 2, IBV_WC_SUCCESS, IBV_WC_SEND, byte_len=mtu)
    check_wc(poll_exact(b.rcq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=40 + mtu)
    assert b.read(mtu, RECV_OFF + 40) == data
    big = send_wr(3, a, mtu + 1)
    big.set_wr_ud(p.ah(), b.qp.qp_num, QKEY)
    a.qp.post_send(big)
    wc = poll_exact(a.scq, 1)[0]
    check_wc(wc, 3, IBV_WC_LOC_LEN_ERR, qp=a.qp)
    assert "MTU" in wc.reason
    assert a.qp.qp_state == IBV_QPS_SQE


def test_ud_receive_too_small(ctx):
    p = make_pair(ctx, IBV_QPT_UD)
    a, b = p.a, p.b
    b.qp.post_recv(chain(recv_wr(5, b, 40 + 15), recv_wr(6, b, 128)))
    w = send_wr(3, a, 16)
    w.set_wr_ud(p.ah(), b.qp.qp_num, QKEY)
    a.qp.post_send(w)
    check_wc(poll_exact(a.scq, 1)[0], 3, IBV_WC_SUCCESS, IBV_WC_SEND)
    rwcs = poll_exact(b.rcq, 2)
    check_wc(rwcs[0], 5, IBV_WC_LOC_LEN_ERR, qp=b.qp)
    assert "40-byte GRH" in rwcs[0].reason
    check_wc(rwcs[1], 6, IBV_WC_WR_FLUSH_ERR, qp=b.qp)
    assert b.qp.qp_state == IBV_QPS_ERR  # a local receive-queue error (SEMANTICS §4)


def test_multi_packet_send_scatters_over_sges(ctx):
    p = make_pair(ctx, IBV_QPT_RC)
    a, b = p.a, p.b
    data = bytes(range(256)) * 12
    a.write(data[:3000])
    sges = [b.sge(RECV_OFF, 1000), b.sge(RECV_OFF + 2000, 1500), b.sge(RECV_OFF + 5000, 600)]
    b.qp.post_recv(RecvWR(1, 3, sges))
    a.qp.post_send(send_wr(2, a, 3000))
    check_wc(poll_exact(b.rcq, 1)[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len=3000)
    got = b.read(1000, RECV_OFF) + b.read(1500, RECV_OFF + 2000) + b.read(500, RECV_OFF + 5000)
    assert got == data[:3000]
    assert b.read(100, RECV_OFF + 5500) == bytes(100)
    b.write(data[:3000], 10000)
    r = SendWR(3, IBV_WR_RDMA_READ, 2, sg=[a.sge(20000, 1000), a.sge(30000, 2000)])
    r.set_wr_rdma(b.mr.rkey, b.mr.buf + 10000)
    a.qp.post_send(r)
    assert [w.wr_id for w in poll_exact(a.scq, 2)] == [2, 3]
    assert a.read(1000, 20000) + a.read(2000, 30000) == data[:3000]


@pytest.mark.parametrize(
    "right", [IBV_ACCESS_REMOTE_WRITE, softverbs.enums.IBV_ACCESS_REMOTE_ATOMIC]
)
def test_remote_write_or_atomic_needs_local_write(ctx, right):
    from scenario_kit import raises_errno

    from softverbs import PD

    pd = PD(ctx)
    with raises_errno(errno.EINVAL, "IBV_ACCESS_LOCAL_WRITE"):
        MR(pd, 4096, right)
    MR(pd, 4096, right | IBV_ACCESS_LOCAL_WRITE).close()
    MR(pd, 4096, IBV_ACCESS_REMOTE_READ).close()  # remote read alone is fine
