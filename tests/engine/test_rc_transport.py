"""RC transport on the bare engine: two HCAs, a manual clock, a scripted wire.

Each test builds a :class:`engine_kit.Bench` (two connected RC QPs, path MTU
256), posts WQEs directly into the rings, and moves packets with a policy
that delivers, drops, duplicates or swaps them.  Time is virtual and moves
only to the next timer deadline, so timer values are checked exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from engine_kit import (
    BASE_B,
    DROP,
    SWAP,
    WINDOW,
    Bench,
    act_if,
    drop_if,
    is_ack,
    is_request,
    is_rnr_nak,
    is_seq_nak,
    kind_of,
)

from softverbs.engine import psn as P
from softverbs.engine.core import ack_every
from softverbs.enums import (
    IBV_QPS_ERR,
    IBV_QPS_RTS,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_WC_COMP_SWAP,
    IBV_WC_FETCH_ADD,
    IBV_WC_RDMA_READ,
    IBV_WC_RDMA_WRITE,
    IBV_WC_RECV,
    IBV_WC_RECV_RDMA_WITH_IMM,
    IBV_WC_RETRY_EXC_ERR,
    IBV_WC_RNR_RETRY_EXC_ERR,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
    IBV_WC_WR_FLUSH_ERR,
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_RDMA_WRITE_WITH_IMM,
    IBV_WR_SEND,
)
from softverbs.wire.opcodes import Kind
from softverbs.wire.packet import Packet

PMTU = 256
MEM = 1 << 17
RECV_OFF = MEM // 2  #: receive buffers live in the upper half of each node's memory


def npkts(length: int) -> int:
    return max(1, -(-length // PMTU))


def acks_for(length: int) -> int:
    """AckReq'd packets in one SEND/WRITE of ``length`` bytes: the most ACKs it can draw."""
    return (npkts(length) - 1) // ack_every(WINDOW) + 1


def ackreq_psns(length: int) -> set[int]:
    """The PSNs of a message's packets that ask for an ACK (every ack_every-th, and the last)."""
    n = npkts(length)
    return {i for i in range(n) if (i + 1) % ack_every(WINDOW) == 0} | {n - 1}


def check_coalesced_acks(acks: list[Any], length: int) -> None:
    """The responder coalesces ACKs: at most one per AckReq'd packet, each acknowledging
    an AckReq'd PSN, in rising order, the last one covering the whole message."""
    psns = [s.pkt.psn for s in acks]
    assert 1 <= len(psns) <= acks_for(length), psns
    assert set(psns) <= ackreq_psns(length), psns
    assert psns == sorted(set(psns)), psns
    assert psns[-1] == npkts(length) - 1, psns


def pattern(n: int, salt: int = 0) -> bytes:
    return bytes((i * 7 + salt) & 0xFF for i in range(n))


PacketTest = Callable[[Packet], bool]
WireTest = Callable[[str, Packet], bool]


def from_a(pred: PacketTest) -> WireTest:
    return lambda src, pkt: src == "a" and pred(pkt)


def from_b(pred: PacketTest) -> WireTest:
    return lambda src, pkt: src == "b" and pred(pkt)


def request_psn(psn: int) -> WireTest:
    return from_a(lambda p: is_request(p) and p.psn == psn)


def bench(**kw: Any) -> Bench:
    kw.setdefault("mem_size", MEM)
    return Bench(pmtu=PMTU, **kw)


# --- (a) in-order delivery, exact ACK counts ---------------------------------------------------

SIZES = [0, 1, 255, 256, 257, 1000, 64 * 256 - 1, 64 * 256, 64 * 256 + 1, 130 * 256 - 3]


@pytest.mark.parametrize("size", SIZES)
def test_send_in_order_with_coalesced_acks(size: int) -> None:
    b = bench()
    b.a.mem[:size] = pattern(size)
    b.b.post_recv(RECV_OFF, MEM - RECV_OFF)
    b.a.post_send(IBV_WR_SEND, 0, size)
    b.run()
    (scqe,) = b.a.poll_send()
    assert (scqe.status, scqe.opcode, scqe.byte_len) == (IBV_WC_SUCCESS, IBV_WC_SEND, size)
    (rcqe,) = b.b.poll_recv()
    assert (rcqe.status, rcqe.opcode, rcqe.byte_len) == (IBV_WC_SUCCESS, IBV_WC_RECV, size)
    assert b.b.mem[RECV_OFF : RECV_OFF + size] == pattern(size)
    assert b.psns(b.sent("a")) == list(range(npkts(size)))
    acks = b.sent("b", is_ack)
    check_coalesced_acks(acks, size)
    assert len(b.sent("b")) == len(acks), "the responder sent something besides ACKs"
    assert b.b.counters.get("duplicate_request", 0) == 0
    assert b.a.counters.get("completer_retry_err", 0) == 0


@pytest.mark.parametrize("size", SIZES)
def test_write_in_order_with_coalesced_acks(size: int) -> None:
    b = bench()
    b.a.mem[:size] = pattern(size, 3)
    b.a.post_send(IBV_WR_RDMA_WRITE, 0, size, remote=BASE_B + 100, rkey=b.b.mr.key)
    b.run()
    (scqe,) = b.a.poll_send()
    assert (scqe.status, scqe.opcode) == (IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
    assert b.b.mem[100 : 100 + size] == pattern(size, 3)
    assert b.b.mem[100 + size : 100 + size + 16] == bytes(16), "wrote past the end"
    assert b.b.poll_recv() == []
    check_coalesced_acks(b.sent("b", is_ack), size)
    assert len(b.sent("a")) == npkts(size)


@pytest.mark.parametrize("qp_type", [IBV_QPT_RC, IBV_QPT_UC], ids=["rc", "uc"])
def test_a_send_finds_a_receive_whose_doorbell_message_is_not_read_yet(qp_type: int) -> None:
    """The receive's doorbell word is written before the SEND's doorbell: a SEND
    that finds no fetched WQE reads the word, as a NIC reads its doorbell record.
    (The served device can read the SEND's doorbell first; UC then dropped the
    message and RC sent an RNR NAK.)"""
    b = bench(qp_type=qp_type)
    b.a.mem[:600] = pattern(600)
    b.b.post_recv(RECV_OFF, 600, message=False)
    b.a.post_send(IBV_WR_SEND, 0, 600)
    b.run()
    (rcqe,) = b.b.poll_recv()
    assert (rcqe.status, rcqe.byte_len) == (IBV_WC_SUCCESS, 600)
    assert b.b.mem[RECV_OFF : RECV_OFF + 600] == pattern(600)
    assert not b.sent("b", is_rnr_nak)
    assert b.b.counters.get("drop_no_rqe", 0) == 0


def test_write_with_imm_consumes_a_receive() -> None:
    b = bench()
    b.a.mem[:600] = pattern(600)
    b.b.post_recv(RECV_OFF, 16)
    b.a.post_send(IBV_WR_RDMA_WRITE_WITH_IMM, 0, 600, remote=BASE_B, rkey=b.b.mr.key,
                  imm=0x12345678)  # fmt: skip
    b.run()
    (rcqe,) = b.b.poll_recv()
    assert (rcqe.status, rcqe.opcode, rcqe.imm) == (
        IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, 0x12345678,
    )  # fmt: skip
    assert b.b.mem[:600] == pattern(600)


@pytest.mark.parametrize("size", [0, 1, 256, 257, 64 * 256 + 1, 100 * 256])
def test_read_in_order(size: int) -> None:
    b = bench()
    b.b.mem[200 : 200 + size] = pattern(size, 5)
    b.a.post_send(IBV_WR_RDMA_READ, RECV_OFF, size, remote=BASE_B + 200, rkey=b.b.mr.key)
    b.run()
    (scqe,) = b.a.poll_send()
    assert (scqe.status, scqe.opcode, scqe.byte_len) == (IBV_WC_SUCCESS, IBV_WC_RDMA_READ, size)
    assert b.a.mem[RECV_OFF : RECV_OFF + size] == pattern(size, 5)
    assert len(b.sent("a")) == 1, "one READ request"
    responses = b.sent("b")
    assert [kind_of(s.pkt) for s in responses] == [Kind.READ_RESP] * npkts(size)
    assert b.psns(responses) == list(range(npkts(size)))
    assert b.sent("b", is_ack) == [], "READ responses are their own acknowledgement"


def test_atomics_in_order() -> None:
    b = bench()
    b.b.mem[8:16] = (100).to_bytes(8, "little")
    b.b.mem[16:24] = (7).to_bytes(8, "little")
    key = b.b.mr.key
    b.a.post_send(IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 8, remote=BASE_B + 8, rkey=key, compare_add=5)
    b.a.post_send(IBV_WR_ATOMIC_CMP_AND_SWP, 8, 8, remote=BASE_B + 16, rkey=key, compare_add=7,
                  swap=99)  # fmt: skip
    b.a.post_send(IBV_WR_ATOMIC_CMP_AND_SWP, 16, 8, remote=BASE_B + 16, rkey=key, compare_add=7,
                  swap=55)  # fmt: skip
    b.run()
    cqes = b.a.poll_send()
    assert [(c.status, c.opcode, c.byte_len) for c in cqes] == [
        (IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, 8),
        (IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, 8),
        (IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, 8),
    ]
    assert int.from_bytes(b.a.mem[0:8], "little") == 100  # original values come back
    assert int.from_bytes(b.a.mem[8:16], "little") == 7
    assert int.from_bytes(b.a.mem[16:24], "little") == 99  # compare failed: current value
    assert int.from_bytes(b.b.mem[8:16], "little") == 105
    assert int.from_bytes(b.b.mem[16:24], "little") == 99
    assert [kind_of(s.pkt) for s in b.sent("b")] == [Kind.ATOMIC_ACK] * 3


def test_mixed_messages_complete_in_posting_order() -> None:
    b = bench()
    key = b.b.mr.key
    sizes = [700, 0, 3000, 256]
    for i in range(len(sizes)):
        b.b.post_recv(RECV_OFF + i * 4096, 4096)
    b.a.mem[:4096] = pattern(4096)
    b.b.mem[4096 : 4096 + 1500] = pattern(1500, 9)
    posted = []
    posted.append(b.a.post_send(IBV_WR_SEND, 0, sizes[0]))
    posted.append(b.a.post_send(IBV_WR_RDMA_WRITE, 0, 2000, remote=BASE_B, rkey=key))
    posted.append(b.a.post_send(IBV_WR_RDMA_READ, 8192, 1500, remote=BASE_B + 4096, rkey=key))
    posted.append(b.a.post_send(IBV_WR_SEND, 0, sizes[1]))
    posted.append(b.a.post_send(IBV_WR_ATOMIC_FETCH_AND_ADD, 16384, 8, remote=BASE_B + 6000,
                                rkey=key, compare_add=1))  # fmt: skip
    posted.append(b.a.post_send(IBV_WR_SEND, 0, sizes[2]))
    posted.append(b.a.post_send(IBV_WR_SEND, 0, sizes[3], signaled=False))
    posted.append(b.a.post_send(IBV_WR_SEND, 0, 10))
    b.b.post_recv(RECV_OFF + 4 * 4096, 4096)
    b.run()
    cqes = b.a.poll_send()
    signaled = [w.wr_id for w in posted if w.signaled]
    assert [c.wr_id for c in cqes] == signaled
    assert all(c.status == IBV_WC_SUCCESS for c in cqes)
    recvs = b.b.poll_recv()
    assert [c.byte_len for c in recvs] == [*sizes, 10]
    for i, n in enumerate(sizes):
        assert b.b.mem[RECV_OFF + i * 4096 : RECV_OFF + i * 4096 + n] == pattern(4096)[:n]
    assert b.a.mem[8192 : 8192 + 1500] == pattern(1500, 9)
    assert b.b.mem[:2000] == pattern(4096)[:2000]
    assert b.b.counters.get("duplicate_request", 0) == 0


# --- (b) loss of a middle packet: one NAK, go-back-N -----------------------------------------


@pytest.mark.parametrize("opcode", [IBV_WR_SEND, IBV_WR_RDMA_WRITE])
def test_lost_middle_packet_one_nak_go_back_n(opcode: int) -> None:
    b = bench(policy=drop_if(request_psn(4)))
    b.a.mem[:4096] = pattern(4096)
    lengths = [3 * PMTU, 3 * PMTU, 3 * PMTU, 2 * PMTU + 17]  # PSNs 0-2, 3-5, 6-8, 9-11
    for i, n in enumerate(lengths):
        if opcode == IBV_WR_SEND:
            b.b.post_recv(RECV_OFF + i * 1024, 1024)
            b.a.post_send(opcode, i * 1024, n)
        else:
            b.a.post_send(opcode, i * 1024, n, remote=BASE_B + i * 1024, rkey=b.b.mr.key)
    b.run()
    assert len(b.sent("b", is_seq_nak)) == 1, b.trace()
    (nak,) = b.sent("b", is_seq_nak)
    assert nak.pkt.psn == 4
    # packets 5..11 arrived after the gap
    assert b.b.counters["out_of_seq_request"] == 7
    assert b.a.counters["rcvd_seq_err"] == 1
    assert b.psns(b.sent("a")) == list(range(12)) + list(range(4, 12)), "go back to PSN 4"
    assert b.b.counters.get("duplicate_request", 0) == 0
    cqes = b.a.poll_send()
    assert [c.status for c in cqes] == [IBV_WC_SUCCESS] * 4
    for i, n in enumerate(lengths):
        off = RECV_OFF + i * 1024 if opcode == IBV_WR_SEND else i * 1024
        assert b.b.mem[off : off + n] == b.a.mem[i * 1024 : i * 1024 + n]
    if opcode == IBV_WR_SEND:
        recvs = b.b.poll_recv()
        assert [(c.wr_id, c.byte_len) for c in recvs] == [
            (w, n) for w, n in zip((1, 2, 3, 4), lengths, strict=True)
        ], "each message exactly once, in order"


def test_lost_middle_packet_then_the_nak_is_lost_too() -> None:
    lost = {"req": False}

    def policy(seq: int, src: str, pkt: Packet) -> str:
        if src == "a" and pkt.psn == 1 and not lost["req"]:
            lost["req"] = True
            return DROP
        if src == "b" and is_seq_nak(pkt):
            return DROP
        return "deliver"

    b = bench(policy=policy)
    b.b.post_recv(RECV_OFF, 4096)
    b.a.mem[:1024] = pattern(1024)
    b.a.post_send(IBV_WR_SEND, 0, 1024)
    b.run()
    (c,) = b.a.poll_send()
    assert c.status == IBV_WC_SUCCESS
    assert b.a.counters["local_ack_timeout_err"] == 1  # recovered by the timer instead
    (r,) = b.b.poll_recv()
    assert r.byte_len == 1024 and b.b.mem[RECV_OFF : RECV_OFF + 1024] == pattern(1024)


def test_swapped_packets_recover() -> None:
    b = bench(policy=act_if(request_psn(1), SWAP))
    b.b.post_recv(RECV_OFF, 4096)
    b.a.mem[:1024] = pattern(1024)
    b.a.post_send(IBV_WR_SEND, 0, 1024)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    (r,) = b.b.poll_recv()
    assert b.b.mem[RECV_OFF : RECV_OFF + 1024] == pattern(1024)
    assert r.byte_len == 1024
    # PSN 2 before 1: a NAK for 1; then 1 fills the gap, and 3 is early against 2: a NAK for 2
    assert b.psns(b.sent("b", is_seq_nak)) == [1, 2]
    assert b.b.counters["out_of_seq_request"] == 2
    assert b.b.poll_recv() == []


# --- (c) loss of the last packet / of the ACK: the local ACK timer --------------------------


@pytest.mark.parametrize("timeout", [1, 10, 14, 31])
def test_lost_last_packet_ack_timeout_is_exact(timeout: int) -> None:
    t_ack = P.ack_timeout_s(timeout)
    assert t_ack is not None and t_ack == 4.096e-6 * 2**timeout
    b = bench(timeout=timeout, policy=drop_if(request_psn(2)))
    b.b.post_recv(RECV_OFF, 4096)
    b.a.mem[:700] = pattern(700)
    b.a.post_send(IBV_WR_SEND, 0, 700)  # PSNs 0, 1, 2
    b.pump()
    assert b.sent("b") == [], "no ACK (no AckReq arrived) and no NAK (no gap seen)"
    assert b.next_deadline() == t_ack
    b.advance(t_ack * (1 - 1e-9))  # just before: nothing
    b.pump()
    assert len(b.sent("a")) == 3
    b.advance(t_ack)
    b.pump()
    retx = b.sent("a")[3:]
    assert b.psns(retx) == [0, 1, 2], "go back to the oldest unacknowledged PSN"
    assert all(s.t == t_ack for s in retx), "retransmitted exactly at the timeout"
    assert b.a.counters["local_ack_timeout_err"] == 1
    assert b.b.counters["duplicate_request"] == 2
    assert len(b.sent("b", is_ack)) == 3  # each duplicate re-ACKed, then the new last packet
    (c,) = b.a.poll_send()
    assert c.status == IBV_WC_SUCCESS
    (r,) = b.b.poll_recv()
    assert r.byte_len == 700 and b.b.mem[RECV_OFF : RECV_OFF + 700] == pattern(700)
    b.run()
    assert b.b.poll_recv() == [] and b.a.poll_send() == []


def test_lost_ack_duplicate_is_reacked_not_redelivered() -> None:
    t_ack = P.ack_timeout_s(12)
    b = bench(timeout=12, policy=drop_if(from_b(is_ack)))
    b.b.post_recv(RECV_OFF, 4096)
    b.b.post_recv(RECV_OFF + 4096, 4096)
    b.a.mem[:100] = pattern(100)
    b.a.post_send(IBV_WR_SEND, 0, 100)
    b.pump()
    assert b.a.poll_send() == []
    assert len(b.b.poll_recv()) == 1
    assert b.next_deadline() == t_ack
    b.advance()
    b.pump()
    assert b.now == t_ack
    assert [s.t for s in b.sent("a")] == [0.0, t_ack]
    assert b.b.counters["duplicate_request"] == 1
    assert [s.action for s in b.sent("b", is_ack)] == [DROP, "deliver"]
    (c,) = b.a.poll_send()
    assert c.status == IBV_WC_SUCCESS
    b.run()
    assert b.b.poll_recv() == [], "the duplicate must not consume a second receive"


def test_lost_last_ack_and_the_peer_qp_gone_spends_every_retry() -> None:
    """The ACK of the last message is lost and its receiver, having all it waited
    for, destroys its QP (ibv_rc_pingpong's exit): each retransmission meets no QP
    and is counted ``drop_unknown_qp`` there, and the sender's WR ends with
    RETRY_EXC_ERR after its first transmission and retry_cnt retries, a timeout
    apart, as on hardware.  (With the QP alive the same loss is mended by one
    retransmission: test_lost_ack_duplicate_is_reacked_not_redelivered.)"""
    timeout, retry_cnt = 12, 7
    t_ack = P.ack_timeout_s(timeout)
    assert t_ack is not None
    b = bench(timeout=timeout, retry_cnt=retry_cnt, policy=drop_if(from_b(is_ack)))
    b.b.post_recv(RECV_OFF, 4096)
    b.a.post_send(IBV_WR_SEND, 0, 600)
    b.pump()
    assert [c.status for c in b.b.poll_recv()] == [IBV_WC_SUCCESS]
    b.b.qp.reset()
    b.b.hca.qps.pop(b.b.qp.qpn)
    b.run()
    (c,) = b.a.poll_send()
    assert c.status == IBV_WC_RETRY_EXC_ERR
    rounds = [0.0]
    for _ in range(retry_cnt):
        rounds.append(rounds[-1] + t_ack)
    assert sorted({s.t for s in b.sent("a")}) == rounds
    assert b.b.counters["drop_unknown_qp"] == retry_cnt * npkts(600)
    assert b.a.counters["local_ack_timeout_err"] == retry_cnt + 1


def test_lost_ack_covered_by_the_next_cumulative_ack() -> None:
    b = bench(policy=drop_if(from_b(is_ack)))
    for i in range(2):
        b.b.post_recv(RECV_OFF + i * 1024, 1024)
    # Two separate bursts: each draws its own ACK (within one burst the
    # responder would coalesce them into one).
    b.a.post_send(IBV_WR_SEND, 0, 300)
    b.pump()
    b.a.post_send(IBV_WR_SEND, 0, 300)
    b.pump()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS] * 2
    b.run()
    assert b.a.counters.get("local_ack_timeout_err", 0) == 0
    assert len(b.sent("a")) == 4


def test_timeout_zero_waits_forever() -> None:
    b = bench(timeout=0, policy=drop_if(request_psn(0)))
    b.b.post_recv(RECV_OFF, 4096)
    b.a.post_send(IBV_WR_SEND, 0, 10)
    b.pump()
    assert b.next_deadline() is None
    assert b.a.poll_send() == []


# --- (d) lost READ response, lost ATOMIC ACK ----------------------------------------------------


def test_lost_read_response_reexecutes_from_the_missing_psn() -> None:
    size = 4 * PMTU
    b = bench(policy=drop_if(from_b(lambda p: kind_of(p) is Kind.READ_RESP and p.psn == 1)))
    b.b.mem[:size] = pattern(size, 11)
    b.a.post_send(IBV_WR_RDMA_READ, RECV_OFF, size, remote=BASE_B, rkey=b.b.mr.key)
    b.run()
    reqs = b.sent("a")
    assert len(reqs) == 2, b.trace()
    again = reqs[1].pkt
    assert again.psn == 1, "the READ is asked again from the missing PSN"
    assert again.va == BASE_B + PMTU and again.dma_len == size - PMTU
    assert b.b.counters["duplicate_request"] == 1
    (c,) = b.a.poll_send()
    assert c.status == IBV_WC_SUCCESS, b.trace()
    assert b.a.mem[RECV_OFF : RECV_OFF + size] == pattern(size, 11)


def test_lost_last_read_response_recovered_by_timeout() -> None:
    size = 3 * PMTU
    b = bench(policy=drop_if(from_b(lambda p: kind_of(p) is Kind.READ_RESP and p.psn == 2)))
    b.b.mem[:size] = pattern(size, 13)
    b.a.post_send(IBV_WR_RDMA_READ, RECV_OFF, size, remote=BASE_B, rkey=b.b.mr.key)
    b.run()
    assert b.a.counters["local_ack_timeout_err"] == 1
    assert b.psns(b.sent("a")) == [0, 2]
    (c,) = b.a.poll_send()
    assert c.status == IBV_WC_SUCCESS, b.trace()
    assert b.a.mem[RECV_OFF : RECV_OFF + size] == pattern(size, 13)


def test_lost_atomic_ack_answered_from_the_replay_cache() -> None:
    b = bench(policy=drop_if(from_b(lambda p: kind_of(p) is Kind.ATOMIC_ACK)))
    b.b.mem[64:72] = (1000).to_bytes(8, "little")
    b.a.post_send(IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 8, remote=BASE_B + 64, rkey=b.b.mr.key,
                  compare_add=1)  # fmt: skip
    b.run()
    assert len(b.sent("a")) == 2, "the atomic was sent again after the timeout"
    assert b.b.counters["duplicate_request"] == 1
    acks = b.sent("b")
    assert [s.pkt.orig for s in acks] == [1000, 1000]
    assert int.from_bytes(b.b.mem[64:72], "little") == 1001, "executed exactly once"
    (c,) = b.a.poll_send()
    assert (c.status, c.opcode) == (IBV_WC_SUCCESS, IBV_WC_FETCH_ADD)
    assert int.from_bytes(b.a.mem[0:8], "little") == 1000


def test_lost_atomic_ack_with_later_traffic_uses_the_implied_nak() -> None:
    """An ACK past an unanswered atomic means its response was lost (IBA 9.7.5.1.5)."""
    b = bench(policy=drop_if(from_b(lambda p: kind_of(p) is Kind.ATOMIC_ACK)))
    b.b.mem[64:72] = (5).to_bytes(8, "little")
    b.b.post_recv(RECV_OFF, 64)
    b.a.post_send(IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 8, remote=BASE_B + 64, rkey=b.b.mr.key,
                  compare_add=10)  # fmt: skip
    b.a.post_send(IBV_WR_SEND, 8, 16)
    b.run()
    assert int.from_bytes(b.b.mem[64:72], "little") == 15
    cqes = b.a.poll_send()
    assert [c.status for c in cqes] == [IBV_WC_SUCCESS] * 2
    assert int.from_bytes(b.a.mem[0:8], "little") == 5
    assert len(b.b.poll_recv()) == 1


# --- (e) RNR NAK timing and the rnr_retry countdown --------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 14, 31])
def test_rnr_nak_waits_exactly_the_rnr_timer(code: int) -> None:
    d = P.RNR_TIMER_S[code]
    b = bench(min_rnr_timer=code, timeout=0)
    b.a.mem[:64] = pattern(64)
    b.a.post_send(IBV_WR_SEND, 0, 64)
    b.pump()
    (nak,) = b.sent("b", is_rnr_nak)
    assert nak.pkt.syndrome & 0x1F == code
    assert b.b.counters["send_rnr_err"] == 1 and b.a.counters["rcvd_rnr_err"] == 1
    assert b.next_deadline() == d
    b.advance(d * 0.999999)
    b.pump()
    assert len(b.sent("a")) == 1
    b.b.post_recv(RECV_OFF, 64, now=b.now)
    b.advance(d)
    b.pump()
    assert [s.t for s in b.sent("a")] == [0.0, d]
    (c,) = b.a.poll_send()
    assert c.status == IBV_WC_SUCCESS
    assert b.b.mem[RECV_OFF : RECV_OFF + 64] == pattern(64)


def test_rnr_timer_table() -> None:
    assert P.RNR_TIMER_S[0] == pytest.approx(655.36e-3)
    assert P.RNR_TIMER_S[1] == pytest.approx(0.01e-3)
    assert P.RNR_TIMER_S[31] == pytest.approx(491.52e-3)
    assert len(P.RNR_TIMER_S) == 32
    assert list(P.RNR_TIMER_S[1:]) == sorted(P.RNR_TIMER_S[1:])


@pytest.mark.parametrize("rnr_retry", [0, 1, 3, 6])
def test_rnr_retry_countdown(rnr_retry: int) -> None:
    code = 5
    d = P.RNR_TIMER_S[code]
    b = bench(min_rnr_timer=code, rnr_retry=rnr_retry, timeout=0)
    b.a.post_send(IBV_WR_SEND, 0, 10)
    b.a.post_send(IBV_WR_SEND, 0, 10, signaled=False)
    b.run()
    times = [s.t for s in b.sent("a") if s.pkt.psn == 0]
    want = [0.0]
    for _ in range(rnr_retry):
        want.append(want[-1] + d)
    assert times == want, "first try + rnr_retry retries, each one RNR timer apart"
    assert len(b.sent("b", is_rnr_nak)) == rnr_retry + 1
    cqes = b.a.poll_send()
    assert [c.status for c in cqes] == [IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_WR_FLUSH_ERR]
    assert b.a.qp.state == IBV_QPS_ERR
    assert b.a.counters["retry_rnr_exceeded_err"] == 1
    assert b.b.qp.state == IBV_QPS_RTS, "RNR leaves the responder alone"


def test_rnr_retry_7_is_forever() -> None:
    b = bench(min_rnr_timer=1, rnr_retry=7, timeout=0)
    b.a.post_send(IBV_WR_SEND, 0, 10)
    for _ in range(50):
        b.pump()
        b.advance()
    assert len(b.sent("b", is_rnr_nak)) >= 50
    assert b.a.poll_send() == []
    b.b.post_recv(RECV_OFF, 64, now=b.now)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]


# --- (f) retry exhaustion, then the flush ------------------------------------------------------


@pytest.mark.parametrize("retry_cnt", [0, 1, 3, 7])
def test_retry_exhaustion_then_flush_in_order(retry_cnt: int) -> None:
    timeout = 8
    t_ack = P.ack_timeout_s(timeout)
    assert t_ack is not None
    b = bench(timeout=timeout, retry_cnt=retry_cnt, policy=drop_if(from_a(is_request), -1))
    b.a.post_recv(RECV_OFF, 64)
    wqes = [b.a.post_send(IBV_WR_SEND, 0, 300, signaled=i % 2 == 0) for i in range(4)]
    b.run()
    rounds = sorted({s.t for s in b.sent("a")})
    want = [0.0]
    for _ in range(retry_cnt):
        want.append(want[-1] + t_ack)
    assert rounds == want, "one transmission + retry_cnt retransmissions, a timeout apart"
    cqes = b.a.poll_send()
    assert [c.wr_id for c in cqes] == [w.wr_id for w in wqes], "every WR completes, in order"
    assert [c.status for c in cqes] == [IBV_WC_RETRY_EXC_ERR] + [IBV_WC_WR_FLUSH_ERR] * 3
    assert b.a.qp.state == IBV_QPS_ERR
    assert b.a.counters["retry_exceeded_err"] == 1
    assert b.a.counters["local_ack_timeout_err"] == retry_cnt + 1
    assert [c.status for c in b.a.poll_recv()] == [IBV_WC_WR_FLUSH_ERR]
    # later posts are flushed at once
    late = b.a.post_send(IBV_WR_SEND, 0, 1)
    (c,) = b.a.poll_send()
    assert (c.wr_id, c.status) == (late.wr_id, IBV_WC_WR_FLUSH_ERR)


def test_retry_count_refills_on_progress() -> None:
    """Each message may lose up to retry_cnt transmissions: progress refills the count."""
    retry_cnt = 2
    drops = {0: 2, 1: 2, 2: 2}  # PSN -> times to drop (each message twice)

    def policy(seq: int, src: str, pkt: Packet) -> str:
        if src == "a" and drops.get(pkt.psn, 0) > 0:
            drops[pkt.psn] -= 1
            return DROP
        return "deliver"

    b = bench(retry_cnt=retry_cnt, policy=policy)
    for i in range(3):
        b.b.post_recv(RECV_OFF + i * 64, 64)
        b.a.post_send(IBV_WR_SEND, 0, 10)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS] * 3, b.trace()
    assert len(b.b.poll_recv()) == 3


# --- (g) PSN wrap-around -----------------------------------------------------------------------

START = 0xFFFFF0


def wrapped(n: int) -> list[int]:
    return [(START + i) & P.PSN_MASK for i in range(n)]


def test_psn_wraps_across_messages() -> None:
    b = bench(sq_psn=START)
    b.a.mem[:2048] = pattern(2048)
    for i in range(8):
        b.b.post_recv(RECV_OFF + i * 2048, 2048)
        b.a.post_send(IBV_WR_SEND, 0, 8 * PMTU)
    b.run()
    assert b.psns(b.sent("a")) == wrapped(64)
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS] * 8
    recvs = b.b.poll_recv()
    assert len(recvs) == 8
    for i in range(8):
        assert b.b.mem[RECV_OFF + i * 2048 : RECV_OFF + (i + 1) * 2048] == pattern(2048)
    # eight messages in one burst: the responder coalesces their ACKs, and the
    # last one acknowledges the last PSN (wrapped)
    acks = b.sent("b", is_ack)
    assert 1 <= len(acks) <= 8
    assert acks[-1].pkt.psn == (START + 63) & P.PSN_MASK
    assert b.a.qp.req.npsn == b.a.qp.comp.una == (START + 64) & P.PSN_MASK
    assert b.b.qp.resp.epsn == (START + 64) & P.PSN_MASK


def test_psn_wraps_inside_one_message() -> None:
    b = bench(sq_psn=START)
    b.a.mem[: 64 * PMTU] = pattern(64 * PMTU)
    b.b.post_recv(RECV_OFF, 64 * PMTU)
    b.a.post_send(IBV_WR_SEND, 0, 64 * PMTU)
    b.run()
    assert b.psns(b.sent("a")) == wrapped(64)
    (ack,) = b.sent("b", is_ack)
    assert ack.pkt.psn == wrapped(64)[-1]
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    assert b.b.mem[RECV_OFF : RECV_OFF + 64 * PMTU] == pattern(64 * PMTU)


@pytest.mark.parametrize("lost", [0xFFFFFF, 0x000000, 0x000001])
def test_psn_wrap_with_a_lost_packet(lost: int) -> None:
    b = bench(sq_psn=START, policy=drop_if(request_psn(lost)))
    b.a.mem[:2048] = pattern(2048)
    for i in range(8):
        b.b.post_recv(RECV_OFF + i * 2048, 2048)
        b.a.post_send(IBV_WR_SEND, 0, 8 * PMTU)
    b.run()
    sent = b.psns(b.sent("a"))
    i = wrapped(64).index(lost)
    assert sent == wrapped(64) + wrapped(64)[i:], "go back N across the wrap"
    (nak,) = b.sent("b", is_seq_nak)
    assert nak.pkt.psn == lost
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS] * 8
    assert len(b.b.poll_recv()) == 8


def test_psn_wrap_read_and_timeout() -> None:
    size = 32 * PMTU
    b = bench(sq_psn=START, policy=drop_if(from_b(lambda p: p.psn == 0x00000F)))
    b.b.mem[:size] = pattern(size, 1)
    b.a.post_send(IBV_WR_RDMA_READ, RECV_OFF, size, remote=BASE_B, rkey=b.b.mr.key)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS], b.trace()
    assert b.a.mem[RECV_OFF : RECV_OFF + size] == pattern(size, 1)
    assert b.a.qp.state == IBV_QPS_RTS


# --- more: RNR with pipelined requests, window pacing, flush of unstarted WQEs -------------


def test_rnr_with_pipelined_requests_behind_it() -> None:
    code = 3
    b = bench(min_rnr_timer=code)
    b.b.post_recv(RECV_OFF, 1024)
    for i in range(3):
        b.a.mem[i * 1024 : i * 1024 + 600] = pattern(600, i)
        b.a.post_send(IBV_WR_SEND, i * 1024, 600)  # PSNs 0-2, 3-5, 6-8
    b.pump()
    (rnr,) = b.sent("b", is_rnr_nak)
    assert rnr.pkt.psn == 3
    assert b.sent("b", is_seq_nak) == [], "the requests behind an RNR NAK cost no retry"
    assert len(b.a.poll_send()) == 1
    b.b.post_recv(RECV_OFF + 1024, 1024)
    b.b.post_recv(RECV_OFF + 2048, 1024)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS] * 2
    assert b.a.counters.get("rcvd_seq_err", 0) == 0
    assert b.a.counters.get("completer_retry_err", 0) == 0
    resent = [s for s in b.sent("a") if s.t > 0]
    assert resent and resent[0].t == P.RNR_TIMER_S[code] and resent[0].pkt.psn == 3
    recvs = b.b.poll_recv()
    assert [c.byte_len for c in recvs] == [600] * 3
    for i in range(3):
        off = RECV_OFF + i * 1024
        assert b.b.mem[off : off + 600] == pattern(600, i)


def test_long_message_is_paced_by_the_window() -> None:
    n = 1000  # packets; more than the 512-packet window
    b = bench(mem_size=2 * n * PMTU)
    size = n * PMTU
    b.a.mem[:size] = pattern(size)
    b.b.post_recv(size, size)
    b.a.post_send(IBV_WR_SEND, 0, size)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    assert b.psns(b.sent("a")) == list(range(n)), "every packet once, in order"
    check_coalesced_acks(b.sent("b", is_ack), size)
    assert b.b.mem[size : 2 * size] == pattern(size)
    # the first burst stops at the window, until ACKs come back
    window = b.a.qp.window
    assert [s.src for s in b.log[: window + 1]] == ["a"] * window + ["b"]


def test_retry_exhaustion_flushes_started_and_unstarted_wqes_in_order() -> None:
    b = bench(timeout=4, retry_cnt=1, max_rd_atomic=1, policy=drop_if(from_a(is_request), -1))
    key = b.b.mr.key
    wqes = [
        b.a.post_send(IBV_WR_RDMA_READ, 0, 100, remote=BASE_B, rkey=key, signaled=False),
        b.a.post_send(IBV_WR_RDMA_READ, 0, 100, remote=BASE_B, rkey=key),  # waits: max_rd_atomic
        b.a.post_send(IBV_WR_SEND, 0, 10, signaled=False),
        b.a.post_send(IBV_WR_RDMA_WRITE, 0, 10, remote=BASE_B, rkey=key),
    ]
    b.pump()
    assert len(b.sent("a")) == 1, "only the first READ may start"
    b.run()
    cqes = b.a.poll_send()
    assert [c.wr_id for c in cqes] == [w.wr_id for w in wqes]
    assert [c.status for c in cqes] == [IBV_WC_RETRY_EXC_ERR] + [IBV_WC_WR_FLUSH_ERR] * 3
    assert b.a.qp.state == IBV_QPS_ERR


def test_rnr_nak_behind_a_read_with_a_lost_last_response() -> None:
    """The RNR NAK implies the READ's missing response: both must recover."""
    code = 2
    lose_last = drop_if(from_b(lambda p: kind_of(p) is Kind.READ_RESP and p.psn == 2))
    b = bench(min_rnr_timer=code, policy=lose_last)
    b.b.mem[:768] = pattern(768, 4)
    b.a.post_send(IBV_WR_RDMA_READ, RECV_OFF, 768, remote=BASE_B, rkey=b.b.mr.key)  # PSN 0-2
    b.a.post_send(IBV_WR_SEND, 0, 10)  # PSN 3: no receive yet -> RNR NAK
    b.pump()
    assert len(b.sent("b", is_rnr_nak)) == 1
    b.b.post_recv(RECV_OFF, 64)
    b.run()
    cqes = b.a.poll_send()
    assert [c.status for c in cqes] == [IBV_WC_SUCCESS] * 2, b.trace()
    assert b.a.mem[RECV_OFF : RECV_OFF + 768] == pattern(768, 4)
    assert len(b.b.poll_recv()) == 1


def test_ack_timer_survives_an_rnr_back_off() -> None:
    """READ responses that arrive during an RNR back-off set the ACK deadline; when
    the back-off ends and the retransmission is lost, an ACK timer must still fire."""
    code = 2
    count = {"resp1": 0, "resp2": 0, "send3": 0}

    def policy(seq: int, src: str, pkt: Packet) -> str:
        if src == "b" and kind_of(pkt) is Kind.READ_RESP and pkt.psn == 1:
            count["resp1"] += 1
            if count["resp1"] == 1:
                return DROP
        if src == "b" and kind_of(pkt) is Kind.READ_RESP and pkt.psn == 2:
            count["resp2"] += 1
            if count["resp2"] == 2:  # the READ's answer comes after the 2nd RNR NAK
                return SWAP
        if src == "a" and is_request(pkt) and pkt.psn == 3:
            count["send3"] += 1
            if count["send3"] == 3:  # the retransmission when the back-off ends
                return DROP
        return "deliver"

    b = bench(min_rnr_timer=code, timeout=10, policy=policy)
    b.b.mem[:768] = pattern(768, 6)
    b.a.post_send(IBV_WR_RDMA_READ, RECV_OFF, 768, remote=BASE_B, rkey=b.b.mr.key)  # PSN 0-2
    b.a.post_send(IBV_WR_SEND, 0, 10)  # PSN 3: RNR
    b.pump()
    assert b.sent("b", is_rnr_nak), b.trace()
    comp = b.a.qp.comp
    assert comp.rnr_until is not None and comp.una == 3, "READ done during the back-off"
    b.b.post_recv(RECV_OFF + 4096, 64)
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS] * 2, b.trace()
    assert b.a.mem[RECV_OFF : RECV_OFF + 768] == pattern(768, 6)
    t_rnr = P.RNR_TIMER_S[code]
    t_ack = P.ack_timeout_s(10)
    assert t_ack is not None
    sends = [s.t for s in b.sent("a") if s.pkt.psn == 3]
    assert sends == [0.0, 0.0, t_rnr, t_rnr + t_ack], b.trace()
    assert b.a.counters["local_ack_timeout_err"] == 1


def test_per_qp_counters_count_what_each_qp_sent_received_and_met() -> None:
    """The QP's own counters (rdma statistic qp): its packets, and the events of
    the loss of a middle packet, on the QP that met them and on no other."""
    b = bench(policy=drop_if(request_psn(4)))
    b.b.post_recv(RECV_OFF, 4096)
    b.a.post_send(IBV_WR_SEND, 0, 6 * PMTU)  # PSNs 0-5; 4 lost, 5 out of sequence
    b.run()
    assert [c.status for c in b.a.poll_send()] == [IBV_WC_SUCCESS]
    a, r = b.a.qp.qp_counters(), b.b.qp.qp_counters()
    sent_a, sent_b = len(b.sent("a")), len(b.sent("b"))
    assert (a["sent_pkts"], r["rcvd_pkts"]) == (sent_a, sent_a - 1)  # one request dropped
    assert (r["sent_pkts"], a["rcvd_pkts"]) == (sent_b, sent_b)
    assert (r["out_of_seq_request"], a["rcvd_seq_err"], a["completer_retry_err"]) == (1, 1, 1)
    assert a["out_of_seq_request"] == r["rcvd_seq_err"] == r["completer_retry_err"] == 0
    assert b.b.counters["out_of_seq_request"] == 1  # the device counts them too
