"""Signature pipelining and cancel (seed 004), written as a storage target would.

The *target* moves each transaction's data with an RDMA WRITE through a
signature mkey (CRC32 per 512-byte block in memory, checked and stripped),
and posts the good response -- a SEND with IBV_SEND_FENCE -- right behind
it.  The *initiator* receives the responses.  When a transaction's data
fails its check, the target's SQ stops in SQD before the response goes out,
and the seed's steps recover: poll until empty, check the mkeys, find the
failed transaction by wr_id, cancel its response, go back to RTS.
"""

from __future__ import annotations

from sig_kit import (
    BS_4096,
    MASK_CRC32,
    MASK_T10,
    PLAIN_MKEY,
    RW,
    SIG_MKEY,
    End,
    Pair,
    configure,
    crc_domain,
    describe,
    expect_event,
    make_pair,
    no_event,
    poll_n,
    poll_until_empty,
    read_wr,
    recv_wr,
    response_wr,
    set_faults,
    t10_domain,
    write_wr,
)

from softverbs import QPAttr, counters
from softverbs.compat.vendor_dv.mlx5_enums import mlx5dv_mkey_err_type as err_type
from softverbs.enums import (
    IBV_EVENT_SQ_DRAINED,
    IBV_QP_CUR_STATE,
    IBV_QP_STATE,
    IBV_QPS_ERR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_WC_RDMA_WRITE,
    IBV_WC_RECV,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
    IBV_WC_WR_FLUSH_ERR,
)
from softverbs.ext.mlx5dv import Mlx5Context, Mlx5Mkey, Mlx5SigBlockAttr, sig_image

DATA = 1024  #: bytes of data per transaction: two 512-byte blocks
MEM = 2 * (512 + 4)  #: their memory image, each block followed by its CRC32
RESP_OFF = 0xC000  #: where responses are built (target) and received (initiator)
STRIDE = 0x800


class Target:
    """The transactions of one test: mkeys over the target's memory, and wr_ids."""

    def __init__(self, pair: Pair, n: int, bad: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.pair = pair
        t, i = pair.target, pair.initiator
        self.mkeys: list[Mlx5Mkey] = []
        self.data: list[bytes] = []
        dom = crc_domain()
        for txn in range(n):
            data = (bytes([txn + 1]) * 700 + bytes(range(256)) * 2)[:DATA]
            img = bytearray(sig_image(data, dom))
            if txn in bad:
                img[100] ^= 0x5A  # the data no longer matches its CRC
            t.mr.write(bytes(img), MEM, txn * STRIDE)
            mkey = Mlx5Mkey(pair.pd, SIG_MKEY, 1)
            configure(
                t,
                mkey,
                [t.sge(txn * STRIDE, MEM)],
                RW,
                Mlx5SigBlockAttr(mem=dom, check_mask=MASK_CRC32),
            )
            self.mkeys.append(mkey)
            self.data.append(data)
            resp = f"GOOD {txn}".encode().ljust(16, b".")
            t.mr.write(resp, 16, RESP_OFF + txn * 16)
            i.qp.post_recv(recv_wr(100 + txn, i.sge(RESP_OFF + txn * 16, 16)))

    def post(self, txn: int) -> None:
        """The transaction's data and its good response, pipelined."""
        t, i = self.pair.target, self.pair.initiator
        mkey = self.mkeys[txn]
        wr = write_wr(txn, _mkey_sge(mkey, DATA), i.mr.rkey, i.mr.buf + txn * STRIDE)
        wr.next_wr = response_wr(txn, t.sge(RESP_OFF + txn * 16, 16))
        t.qp.post_send(wr)


def _mkey_sge(mkey: Mlx5Mkey, length: int, offset: int = 0) -> object:
    from softverbs import SGE

    return SGE(offset, length, mkey.lkey)


def _to_rts(end: End) -> None:
    end.qp.modify(
        QPAttr(qp_state=IBV_QPS_RTS, cur_qp_state=IBV_QPS_SQD), IBV_QP_STATE | IBV_QP_CUR_STATE
    )


def test_seed_004_handling_steps(ctx: Mlx5Context) -> None:
    pair = make_pair(ctx)
    t, i = pair.target, pair.initiator
    n, bad = 6, 3
    target = Target(pair, n, {bad})
    stops = counters(ctx).get("sig_pipelining_stops", 0)
    for txn in range(n):
        target.post(txn)
    expect_event(ctx, IBV_EVENT_SQ_DRAINED)
    assert t.qp.qp_state == IBV_QPS_SQD

    # 1. poll everything, until the CQ is empty once
    done = {wc.wr_id for wc in poll_until_empty(t.cq) if wc.status == IBV_WC_SUCCESS}
    assert done == set(range(bad)), "the SQ must stop before the failed transaction's response"
    # 2. look through the open transactions: check their mkeys
    failed = []
    for txn in sorted(set(range(n)) - done):
        err = target.mkeys[txn].mkey_check()
        if err.err_type != err_type.MLX5DV_MKEY_NO_ERR:
            failed.append(txn)
            assert err.err_type == err_type.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD
            assert err.sig_err.offset == 0  # the first block holds the bad byte
            assert err.sig_err.expected_value != err.sig_err.actual_value
    assert failed == [bad]  # found by its wr_id
    assert target.mkeys[bad].mkey_check().err_type == err_type.MLX5DV_MKEY_NO_ERR  # cleared
    # 3. cancel its good response, and send a bad one instead
    assert t.qp.cancel_posted_send_wrs(bad) == 1
    t.mr.write(b"BAD".ljust(16, b"."), 16, RESP_OFF + 0x100)
    t.qp.post_send(response_wr(1000 + bad, t.sge(RESP_OFF + 0x100, 16)))
    # 4. back to RTS: the send queue resumes with the next WQE
    _to_rts(t)

    wcs = poll_n(t.cq, (n - bad) + 1, what="target")
    assert [(w.wr_id, w.status, w.opcode) for w in wcs] == [
        (bad, IBV_WC_SUCCESS, IBV_WC_SEND),  # the cancelled response: a NOP
        *[(txn, IBV_WC_SUCCESS, IBV_WC_SEND) for txn in range(bad + 1, n)],
        (1000 + bad, IBV_WC_SUCCESS, IBV_WC_SEND),
    ], describe(wcs)
    assert wcs[0].byte_len == 0
    got = poll_n(i.cq, n, what="initiator")
    assert all(w.status == IBV_WC_SUCCESS and w.opcode == IBV_WC_RECV for w in got)
    assert [w.wr_id for w in got] == [100 + x for x in range(n)]  # receive WRs in order
    order = [f"GOOD {x}".encode() for x in range(n) if x != bad] + [b"BAD"]
    assert [i.mr.read(16, RESP_OFF + k * 16).rstrip(b".") for k in range(n)] == order
    for txn in range(n):  # every transaction's data arrived, stripped of its CRCs
        want = bytearray(target.data[txn])
        if txn == bad:
            want[100] ^= 0x5A
        assert i.mr.read(DATA, txn * STRIDE) == bytes(want)
    assert counters(ctx).get("sig_pipelining_stops", 0) == stops + 1
    assert t.qp.qp_state == IBV_QPS_RTS


def test_good_flow_sends_the_response_without_a_pause(ctx: Mlx5Context) -> None:
    pair = make_pair(ctx, timeout=20)  # 4.3 s: a held ACK is no loss
    t, i = pair.target, pair.initiator
    target = Target(pair, 4)
    # hold every ACK back: a response that waited for its WRITE to complete could
    # not arrive before the ACKs do
    set_faults(ctx, "delay=0.5;kinds=ack")
    stops = counters(ctx).get("sig_pipelining_stops", 0)
    for txn in range(4):
        target.post(txn)
    got = poll_n(i.cq, 4, what="initiator")
    assert [w.wr_id for w in got] == [100, 101, 102, 103]
    assert t.cq.poll(1)[0] == 0, "the ACKs are still held: nothing has completed yet"
    wcs = poll_n(t.cq, 4, what="target")
    assert [(w.wr_id, w.status) for w in wcs] == [(x, IBV_WC_SUCCESS) for x in range(4)]
    assert t.qp.qp_state == IBV_QPS_RTS
    no_event(ctx)
    assert counters(ctx).get("sig_pipelining_stops", 0) == stops
    for txn, mkey in enumerate(target.mkeys):
        assert mkey.mkey_check().err_type == err_type.MLX5DV_MKEY_NO_ERR
        assert i.mr.read(DATA, txn * STRIDE) == target.data[txn]


def test_several_signature_errors_before_the_stop(ctx: Mlx5Context) -> None:
    """Two bad transfers, then the fenced response: both fail before the SQ stops."""
    pair = make_pair(ctx)
    t, i = pair.target, pair.initiator
    target = Target(pair, 3, {0, 1})
    a = write_wr(0, _mkey_sge(target.mkeys[0], DATA), i.mr.rkey, i.mr.buf)
    a.next_wr = write_wr(1, _mkey_sge(target.mkeys[1], DATA), i.mr.rkey, i.mr.buf + STRIDE)
    a.next_wr.next_wr = response_wr(7, t.sge(RESP_OFF, 16))
    t.qp.post_send(a)
    expect_event(ctx, IBV_EVENT_SQ_DRAINED)
    assert poll_until_empty(t.cq) == [] and poll_until_empty(i.cq) == []
    errs = [m.mkey_check() for m in target.mkeys]
    assert [e.err_type for e in errs] == [err_type.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD] * 2 + [
        err_type.MLX5DV_MKEY_NO_ERR
    ]
    # in SQD the target still receives
    t.qp.post_recv(recv_wr(300, t.sge(0x9000, 16)))
    i.mr.write(b"ping".ljust(16), 16, 0x9000)
    i.qp.post_send(response_wr(301, i.sge(0x9000, 16), fence=False))
    wc = poll_n(t.cq, 1, what="a receive while in SQD")[0]
    assert (wc.wr_id, wc.status, wc.opcode) == (300, IBV_WC_SUCCESS, IBV_WC_RECV)
    assert poll_n(i.cq, 1)[0].wr_id == 301 and t.qp.qp_state == IBV_QPS_SQD
    assert t.qp.cancel_posted_send_wrs(7) == 1
    assert t.qp.cancel_posted_send_wrs(7) == 1  # still posted and matching: counted again
    assert t.qp.cancel_posted_send_wrs(99) == 0
    _to_rts(t)
    wc = poll_n(t.cq, 1)[0]
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (7, IBV_WC_SUCCESS, IBV_WC_SEND, 0)
    assert poll_until_empty(i.cq) == []  # the cancelled response never left


def test_a_read_is_checked_when_its_data_lands(ctx: Mlx5Context) -> None:
    """READ into a T10-DIF mkey (wire domain checked, stripped): the stop comes when
    the READ completes; a WQE between the READ and the fenced one still starts."""
    pair = make_pair(ctx)
    t, i = pair.target, pair.initiator
    dom = t10_domain()
    data = bytes(range(256)) * 4
    wire = bytearray(sig_image(data, dom))
    wire[520 + 515] ^= 1  # block 1's application tag
    i.mr.write(bytes(wire), len(wire), 0)
    mkey = Mlx5Mkey(pair.pd, SIG_MKEY, 2)
    configure(t, mkey, [t.sge(0, DATA)], RW, Mlx5SigBlockAttr(wire=dom, check_mask=MASK_T10))
    t.mr.write(b"r" * 16, 16, RESP_OFF)
    i.qp.post_recv(recv_wr(50, i.sge(RESP_OFF, 16)))
    i.qp.post_recv(recv_wr(51, i.sge(RESP_OFF + 16, 16)))
    wr = read_wr(1, _mkey_sge(mkey, len(wire)), i.mr.rkey, i.mr.buf)
    wr.next_wr = response_wr(2, t.sge(RESP_OFF, 16), fence=False)  # not fenced: may go
    wr.next_wr.next_wr = response_wr(3, t.sge(RESP_OFF, 16))
    t.qp.post_send(wr)
    expect_event(ctx, IBV_EVENT_SQ_DRAINED)
    assert [w.wr_id for w in poll_until_empty(t.cq)] == [2]
    assert t.mr.read(DATA, 0) == data
    err = mkey.mkey_check()
    assert err.err_type == err_type.MLX5DV_MKEY_SIG_BLOCK_BAD_APPTAG
    assert (err.sig_err.expected_value, err.sig_err.actual_value) == (0xABCC, 0xABCD)
    assert err.sig_err.offset == 512
    assert [w.wr_id for w in poll_until_empty(i.cq)] == [50]


def test_err_flushes_a_cancelled_wr(ctx: Mlx5Context) -> None:
    pair = make_pair(ctx)
    t = pair.target
    target = Target(pair, 3, {0})
    for txn in range(3):
        target.post(txn)
    expect_event(ctx, IBV_EVENT_SQ_DRAINED)
    assert t.qp.cancel_posted_send_wrs(0) == 1
    t.qp.modify(QPAttr(qp_state=IBV_QPS_ERR), IBV_QP_STATE)
    wcs = poll_n(t.cq, 5)
    assert [(w.wr_id, w.status) for w in wcs] == [
        (0, IBV_WC_WR_FLUSH_ERR),  # the cancelled response
        (1, IBV_WC_WR_FLUSH_ERR),
        (1, IBV_WC_WR_FLUSH_ERR),
        (2, IBV_WC_WR_FLUSH_ERR),
        (2, IBV_WC_WR_FLUSH_ERR),
    ], describe(wcs)
    assert wcs[1].opcode == IBV_WC_RDMA_WRITE


def test_without_pipelining_an_error_only_marks_the_mkey(ctx: Mlx5Context) -> None:
    pair = make_pair(ctx, pipelining=False)
    t, i = pair.target, pair.initiator
    target = Target(pair, 2, {0})
    target.post(0)
    target.post(1)
    assert [w.wr_id for w in poll_n(t.cq, 2)] == [0, 1]
    assert len(poll_n(i.cq, 2)) == 2
    assert target.mkeys[0].mkey_check().err_type == err_type.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD
    assert target.mkeys[1].mkey_check().err_type == err_type.MLX5DV_MKEY_NO_ERR
    no_event(ctx)


def test_remote_keys_check_and_generate(ctx: Mlx5Context) -> None:
    """The responder moves data through the initiator's mkeys: a WRITE is checked
    there (a bad one marks that mkey and stops nothing), a READ gets its DIFs
    generated, and a SEND lands in a receive mkey with memory CRCs generated."""
    pair = make_pair(ctx)
    t, i = pair.target, pair.initiator
    dom = t10_domain(BS_4096, app_tag=0x0A0A)
    data = bytes(range(251)) * 33  # 8283 bytes: two 4096-byte blocks and a tail
    wire = sig_image(data, dom)
    # the initiator's mkey: memory plain, wire T10-DIF per 4096 bytes; a multi-packet WRITE
    rkey = Mlx5Mkey(pair.pd, SIG_MKEY, 2)
    configure(i, rkey, [i.sge(0, len(data))], RW, Mlx5SigBlockAttr(wire=dom, check_mask=MASK_T10))
    t.mr.write(wire, len(wire), 0)
    plain = Mlx5Mkey(pair.pd, PLAIN_MKEY, 1)
    configure(t, plain, [t.sge(0, len(wire))])
    t.qp.post_send(write_wr(1, _mkey_sge(plain, len(wire)), rkey.rkey, 0, flags=1 << 1))
    assert poll_n(t.cq, 1)[0].status == IBV_WC_SUCCESS
    assert i.mr.read(len(data), 0) == data
    assert rkey.mkey_check().err_type == err_type.MLX5DV_MKEY_NO_ERR
    bad = bytearray(wire)
    bad[4096 + 2] ^= 0xFF  # the first DIF's application tag
    t.mr.write(bytes(bad), len(bad), 0)
    t.qp.post_send(write_wr(2, _mkey_sge(plain, len(wire)), rkey.rkey, 0, flags=1 << 1))
    assert poll_n(t.cq, 1)[0].status == IBV_WC_SUCCESS
    assert rkey.mkey_check().err_type == err_type.MLX5DV_MKEY_SIG_BLOCK_BAD_APPTAG
    assert t.qp.qp_state == IBV_QPS_RTS  # the check failed at the responder
    # a READ of the initiator's mkey: the responder generates the DIFs
    t.qp.post_send(read_wr(3, t.sge(0x8000, len(wire)), rkey.rkey, 0, flags=1 << 1))
    assert poll_n(t.cq, 1)[0].status == IBV_WC_SUCCESS
    assert t.mr.read(len(wire), 0x8000) == wire
    # a SEND received through an mkey with a memory-domain CRC32C
    crcdom = crc_domain(crc_type=1)
    rmkey = Mlx5Mkey(pair.pd, SIG_MKEY, 1)
    mem = sig_image(data[:1024], crcdom)
    configure(i, rmkey, [i.sge(0x6000, len(mem))], RW, Mlx5SigBlockAttr(mem=crcdom))
    i.qp.post_recv(recv_wr(9, _mkey_sge(rmkey, 1024)))  # type: ignore[arg-type]
    t.mr.write(data[:1024], 1024, 0x4000)
    t.qp.post_send(response_wr(4, t.sge(0x4000, 1024), fence=False))
    assert poll_n(t.cq, 1)[0].status == IBV_WC_SUCCESS
    wc = poll_n(i.cq, 1)[0]
    assert (wc.wr_id, wc.status, wc.byte_len) == (9, IBV_WC_SUCCESS, 1024)
    assert i.mr.read(len(mem), 0x6000) == mem


def test_interleaved_layout_through_a_signature(ctx: Mlx5Context) -> None:
    """Data in one buffer, T10-DIF tuples in another (the NVMe/SCSI 'separate
    metadata' layout), described by an interleaved layout."""
    pair = make_pair(ctx)
    t, i = pair.target, pair.initiator
    dom = t10_domain()
    data = bytes(range(256)) * 8  # 4 blocks
    img = sig_image(data, dom)
    for j in range(4):
        t.mr.write(img[j * 520 : j * 520 + 512], 512, j * 512)
        t.mr.write(img[j * 520 + 512 : j * 520 + 520], 8, 0x3000 + j * 8)
    from softverbs.ext.mlx5dv import Mlx5MrInterleaved

    layout = (
        4,
        [
            Mlx5MrInterleaved(t.mr.buf, 512, 0, t.mr.lkey),
            Mlx5MrInterleaved(t.mr.buf + 0x3000, 8, 0, t.mr.lkey),
        ],
    )
    mkey = Mlx5Mkey(pair.pd, SIG_MKEY, 3)
    configure(t, mkey, layout, RW, Mlx5SigBlockAttr(mem=dom, check_mask=MASK_T10))
    t.qp.post_send(write_wr(1, _mkey_sge(mkey, 2048), i.mr.rkey, i.mr.buf, flags=1 << 1))
    assert poll_n(t.cq, 1)[0].status == IBV_WC_SUCCESS
    assert i.mr.read(2048, 0) == data
    assert mkey.mkey_check().err_type == err_type.MLX5DV_MKEY_NO_ERR
