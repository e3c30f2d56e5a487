"""Segmentation offload: a burst is exactly the packets it stands for.

Two properties:

* :meth:`Burst.segments` yields the packets a sender emitting one packet at a
  time would: opcodes FIRST/MIDDLE/LAST/ONLY by position in the message,
  consecutive PSNs, ``seg``-byte payload slices, the RETH on the message's
  first packet only, the immediate/invalidate/solicited bits on its last,
  AckReq on the last and on every ``ack_every``-th -- and each segment
  encodes to a frame that decodes back to itself.
* Two engines that hand each other bursts whole (as the in-process fabric
  does) end in the same state as two that split every burst on the wire
  (as the UDP fabric does): the same CQEs, the same memory, the same
  receive-side counters -- for SEND, WRITE (with immediate), READ, on RC
  and UC, and where the fast path must give up: a receive buffer too
  small, a bad rkey, no receive posted (RNR), a window smaller than the
  message, and an MTU the responder does not share.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from engine_kit import BASE_B, Bench, SeededFaults, deliver_all
from hypothesis import given, settings
from hypothesis import strategies as st

from softverbs.enums import (
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_RDMA_WRITE_WITH_IMM,
    IBV_WR_SEND,
)
from softverbs.fabric.udp import gso_runs
from softverbs.wire.codec import (
    Parts,
    decode_udp_payload,
    encode_udp_burst,
    encode_udp_payload,
    seal_udp_datagrams,
    seal_udp_payload,
)
from softverbs.wire.opcodes import OPINFO, Op, Transport
from softverbs.wire.packet import (
    FIELDS,
    Burst,
    Packet,
    _copy_fields,
    ackreq_at,
    ackreq_indexes,
    burst,
)

PMTU = 256
MEM = 1 << 16
RECV_OFF = MEM // 2
OPS_WRITE = (
    Transport.RC | Op.RDMA_WRITE_FIRST,
    Transport.RC | Op.RDMA_WRITE_MIDDLE,
    Transport.RC | Op.RDMA_WRITE_LAST_WITH_IMMEDIATE,
    Transport.RC | Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
)
IP_A, IP_B = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
IP6_A, IP6_B = bytes.fromhex("fd00" + "00" * 13 + "01"), bytes.fromhex("fd00" + "00" * 13 + "02")


@given(npkts=st.integers(1, 200), first=st.integers(0, 199), count=st.integers(1, 200),
       tail=st.integers(1, 64), every=st.sampled_from([0, 1, 7, 64]))  # fmt: skip
def test_segments_are_the_packets_of_the_message(npkts: int, first: int, count: int,
                                                 tail: int, every: int) -> None:  # fmt: skip
    first = min(first, npkts - 1)
    count = min(count, npkts - first)
    seg = 64
    length = (npkts - 1) * seg + tail
    message = bytes(i % 251 for i in range(length))
    t = Packet(0, 0x12, 0xFFFFF0, message[first * seg : (first + count) * seg])
    t.va, t.rkey, t.dma_len = 0x1000, 0x77, length
    t.imm, t.se = 0xABCD, True
    t.sgid = b"\x00" * 10 + b"\xff\xff" + IP_A
    t.dgid = b"\x00" * 10 + b"\xff\xff" + IP_B
    out = burst(t, OPS_WRITE, first, count, npkts, seg, every)
    assert isinstance(out, Burst) == (count > 1)
    segs = out.segments()
    assert len(segs) == count
    for j, p in enumerate(segs):
        i = first + j
        info = OPINFO[p.opcode]
        assert info is not None
        assert info.first == (i == 0) and info.last == (i == npkts - 1)
        assert p.psn == (0xFFFFF0 + i - first) & 0xFFFFFF
        assert bytes(p.payload) == message[i * seg : (i + 1) * seg]
        assert (p.va, p.rkey, p.dma_len) == ((0x1000, 0x77, length) if i == 0 else (0, 0, 0))
        last = i == npkts - 1
        assert (p.imm, p.se) == ((0xABCD, True) if last else (0, False))
        assert p.ackreq == (every > 0 and (last or (i + 1) % every == 0))
        wire = encode_udp_payload(p, IP_A, IP_B, 0xC000)
        back = decode_udp_payload(wire, IP_A, IP_B, 0xC000)
        assert (back.opcode, back.psn, bytes(back.payload), back.ackreq) == (
            p.opcode, p.psn, bytes(p.payload), p.ackreq)  # fmt: skip
    if count > 1:
        assert out.ackreq == any(p.ackreq for p in segs)
    # the UDP fabric's encoder writes the same datagrams without packet objects
    one_by_one = [encode_udp_payload(p, IP_A, IP_B, 0xC000) for p in segs]  # IPv4 ID 0 each
    datagrams, sizes, runs = encode_udp_burst(out, IP_A, IP_B, 0xC000)
    assert sizes == [len(d) for d in one_by_one] and _joined(datagrams) == one_by_one
    assert runs == [(i, 1) for i in range(count)]
    # GSO sends: datagram k of each is sealed for IPv4 ID k, as the kernel numbers it
    datagrams, sizes, runs = encode_udp_burst(out, IP_A, IP_B, 0xC000, runs=gso_runs)
    assert runs == gso_runs(sizes)
    for first, n in runs:
        for k in range(n):
            seal_udp_payload(one_by_one[first + k], IP_A, IP_B, 0xC000, ip_id=k)
    assert _joined(datagrams) == one_by_one
    # the MIDDLEs' payloads are views of the message, not copies: the kernel copies once
    assert all(len(d) == 3 and isinstance(d[1], memoryview) for d in datagrams[1:-1])
    buf = bytearray(b"".join(_joined(datagrams)))
    seal_udp_datagrams(buf, 0, sizes, IP_A, IP_B, 0xC000)  # sealed again to go one by one
    assert [decode_udp_payload(bytes(d), IP_A, IP_B, 0xC000, ip_id=0).psn
            for d in _cut(buf, sizes)] == [p.psn for p in segs]  # fmt: skip
    v6 = [encode_udp_payload(p, IP6_A, IP6_B, 0xC000) for p in segs]  # IPv6: no IDs
    assert _joined(encode_udp_burst(out, IP6_A, IP6_B, 0xC000, runs=gso_runs)[0]) == v6


def _joined(datagrams: list[Parts]) -> list[bytes]:
    return [b"".join(parts) for parts in datagrams]


def _cut(buf: bytearray, sizes: list[int]) -> list[bytearray]:
    offs = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    return [buf[a:b] for a, b in itertools.pairwise(offs)]


@given(n=st.integers(1, 300), first=st.integers(0, 299), count=st.integers(1, 300),
       every=st.sampled_from([0, 1, 2, 7, 64, 500]))  # fmt: skip
def test_ackreq_indexes_are_the_packets_that_ask(n: int, first: int, count: int,
                                                every: int) -> None:  # fmt: skip
    first = min(first, n - 1)
    count = min(count, n - first)
    assert ackreq_indexes(first, n, every, count) == [
        j for j in range(count) if ackreq_at(first + j, n, every)]  # fmt: skip


# --- whole bursts or split bursts: the same outcome ----------------------------------------


def _run(bursts: bool, qp_type: int, op: int, size: int, recv_len: int, rkey_ok: bool,
         recv_posted: bool, window: int, b_pmtu: int, *, gro: bool = False,
         faults: int | None = None) -> dict[str, Any]:  # fmt: skip
    policy = deliver_all if faults is None else SeededFaults(faults, loss=0.05, dup=0.03,
                                                              swap=0.05)  # fmt: skip
    b = Bench(pmtu=PMTU, qp_type=qp_type, mem_size=MEM, bursts=bursts, retry_cnt=7 if faults
              is not None else 1, rnr_retry=1, gro=gro, policy=policy)  # fmt: skip
    b.a.qp.window = window
    b.b.qp.pmtu = b_pmtu
    b.a.mem[:size] = bytes((i * 13 + 5) & 0xFF for i in range(size))
    b.b.mem[:size] = bytes((i * 7 + 1) & 0xFF for i in range(size))
    rkey = b.b.mr.key if rkey_ok else b.b.mr.key ^ 0x100
    if recv_posted:
        b.b.post_recv(RECV_OFF, recv_len)
    if op == IBV_WR_RDMA_READ:
        b.a.post_send(op, 1024 * 16, size, remote=BASE_B, rkey=rkey)
    elif op == IBV_WR_SEND:
        b.a.post_send(op, 0, size)
    else:
        b.a.post_send(op, 0, size, remote=BASE_B + 4096 * 4, rkey=rkey, imm=0x1234)
    b.run(max_time=5.0)
    cqes = [(c.wr_id, c.status, c.opcode, c.byte_len, c.imm) for n in (b.a, b.b)
            for c in (n.poll_send() + n.poll_recv())]  # fmt: skip
    keep = ("rcvd_pkts", "sent_pkts", "out_of_seq_request", "send_rnr_err", "drop_uc_access",
            "resp_remote_access_err", "resp_invalid_request", "drop_uc_missing_packet",
            "rdma_recvs", "rdma_sends")  # fmt: skip
    return {
        "cqes": cqes,
        "mem_a": bytes(b.a.mem),
        "mem_b": bytes(b.b.mem),
        "states": (b.a.qp.state, b.b.qp.state),
        "counters": {n.name: {k: n.counters.get(k, 0) for k in keep} for n in (b.a, b.b)},
    }


#: the cases both equivalence tests below draw: the QP type, the operation,
#: the message size, how much shorter the receive buffer is, the window
CASE = {
    "qp_type": st.sampled_from([IBV_QPT_RC, IBV_QPT_UC]),
    "op": st.sampled_from(
        [IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ]
    ),
    "size": st.integers(0, 40 * PMTU),
    "recv_short": st.integers(0, 3),
    "rkey_ok": st.booleans(),
    "window": st.sampled_from([4, 16, 512]),
}


def _case(qp_type: int, op: int, size: int, recv_short: int) -> tuple[int, int]:
    """The operation (UC has no READ: a WRITE instead) and the receive buffer's
    length: the message's, shorter by one or two half MTUs, or one byte longer."""
    if qp_type == IBV_QPT_UC and op == IBV_WR_RDMA_READ:
        op = IBV_WR_RDMA_WRITE
    return op, max(0, size - recv_short * PMTU // 2) if recv_short < 3 else size + 1


@settings(max_examples=150, deadline=None)
@given(**CASE, recv_posted=st.booleans(), b_pmtu=st.sampled_from([PMTU, PMTU // 2]))
def test_whole_bursts_and_split_bursts_end_alike(qp_type: int, op: int, size: int,
                                                 recv_short: int, rkey_ok: bool,
                                                 recv_posted: bool, window: int,
                                                 b_pmtu: int) -> None:  # fmt: skip
    op, recv_len = _case(qp_type, op, size, recv_short)
    args = (qp_type, op, size, recv_len, rkey_ok, recv_posted, window, b_pmtu)
    whole = _run(True, *args)
    split = _run(False, *args)
    assert whole == split


@settings(max_examples=100, deadline=None)
@given(**CASE, faults=st.one_of(st.none(), st.integers(0, 2**16)))
def test_gro_merged_and_one_by_one_end_alike(qp_type: int, op: int, size: int,
                                            recv_short: int, rkey_ok: bool, window: int,
                                            faults: int | None) -> None:  # fmt: skip
    """The packets on the wire, encoded, coalesced as UDP_GRO coalesces them and
    merged into bursts by a BurstMerger, end exactly as the same packets
    delivered one by one -- under seeded loss, duplication and reordering too."""
    op, recv_len = _case(qp_type, op, size, recv_short)
    args = (qp_type, op, size, recv_len, rkey_ok, True, window, PMTU)
    merged = _run(False, *args, gro=True, faults=faults)
    single = _run(False, *args, faults=faults)
    assert merged == single


def test_gro_merges_a_message_into_bursts() -> None:
    """The GRO wire of the bench does merge: a 40-packet WRITE reaches the
    responder as a few objects, not 40."""
    b = Bench(pmtu=PMTU, mem_size=MEM, gro=True)
    seen: list[int] = []
    receive = b.b.hca.receive
    b.b.hca.receive = lambda pkt, now: (seen.append(pkt.count), receive(pkt, now))[1]  # type: ignore[method-assign]
    b.a.post_send(IBV_WR_RDMA_WRITE, 0, 40 * PMTU, remote=BASE_B, rkey=b.b.mr.key)
    b.run()
    assert sum(seen) == 40 and len(seen) < 10, seen
    assert bytes(b.b.mem[:40 * PMTU]) == bytes(b.a.mem[:40 * PMTU])


@pytest.mark.parametrize("op", [IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ])
def test_whole_bursts_take_the_fast_path(op: int) -> None:
    """With bursts delivered whole, a 40-packet message is a handful of objects
    on the wire (the window cuts it), not 40 packets."""
    b = Bench(pmtu=PMTU, mem_size=MEM, bursts=True)
    b.b.post_recv(RECV_OFF, 40 * PMTU)
    b.a.post_send(op, 0, 40 * PMTU, remote=BASE_B, rkey=b.b.mr.key)
    b.run()
    assert len(b.sent()) <= 4, b.trace()
    assert b.b.counters["rcvd_pkts"] + b.a.counters["rcvd_pkts"] >= 40


def test_copy_fields_copies_every_field() -> None:
    """A burst and each packet split from it are copies made field by field:
    every one of FIELDS arrives, as the object stored (not an equal one)."""
    src, dst = Packet(0, 0, 0), Packet(0, 0, 0)
    values = {name: object() for name in FIELDS}
    for name, value in values.items():
        setattr(src, name, value)
    _copy_fields(src, dst)
    assert [name for name in FIELDS if getattr(dst, name) is not values[name]] == []
