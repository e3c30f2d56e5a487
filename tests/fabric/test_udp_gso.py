"""UDP segmentation offload: GSO runs out, GRO-coalesced buffers in.

A burst leaves as runs of equal-sized datagrams, each one ``sendmsg`` with
``UDP_SEGMENT``; a receive socket with ``UDP_GRO`` may get a run back whole,
and the fabric cuts it into its datagrams with the size the kernel reports.
Each datagram keeps its own headers and ICRC: a truncated or corrupted one
in the middle of a coalesced buffer is dropped and counted, its neighbours
are delivered.  ``SOFTVERBS_UDP_GSO=0`` is the datagram-at-a-time path.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import select
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softverbs import (
    CQ,
    MR,
    PD,
    QP,
    SGE,
    AHAttr,
    Context,
    GlobalRoute,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    counters,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_MTU_1024,
    IBV_QPT_RC,
    IBV_WC_SUCCESS,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
)
from softverbs.fabric import udp
from softverbs.wire.codec import BurstMerger, encode_udp_payload
from softverbs.wire.opcodes import Op, Transport
from softverbs.wire.packet import FIELDS, Packet

SRC, DST = bytes([127, 0, 0, 1]), bytes([127, 0, 0, 2])
SPORT = 0xC000


# --- the pure parts -------------------------------------------------------------------------
def test_gso_runs_cut_where_sizes_change() -> None:
    # a WRITE's FIRST (RETH: 16 bytes more), MIDDLEs, a shorter LAST
    assert udp.gso_runs([1060, 1044, 1044, 1044, 500]) == [(0, 1), (1, 4)]
    assert udp.gso_runs([100, 100, 120, 120]) == [(0, 2), (2, 2)]  # a longer one starts anew
    assert udp.gso_runs([100, 90, 100]) == [(0, 2), (2, 1)]  # a shorter one ends a run
    assert udp.gso_runs([]) == []


def test_gso_runs_respect_the_kernel_limits() -> None:
    runs = udp.gso_runs([100] * 200)
    assert [c for _, c in runs] == [64, 64, 64, 8]
    big = udp.gso_runs([4136] * 40)
    assert all(c * 4136 <= udp.GSO_MAX_BYTES for _, c in big) and sum(c for _, c in big) == 40


@given(st.lists(st.integers(1, 9000), max_size=300))
def test_gso_runs_cover_every_datagram_once(sizes: list[int]) -> None:
    runs = udp.gso_runs(sizes)
    assert [i for first, n in runs for i in range(first, first + n)] == list(range(len(sizes)))
    for first, n in runs:
        run = sizes[first : first + n]
        assert n <= udp.UDP_MAX_SEGMENTS and sum(run) <= max(udp.GSO_MAX_BYTES, run[0])
        assert all(x == run[0] for x in run[:-1]) and run[-1] <= run[0]


def test_a_gso_segment_is_sealed_for_its_ipv4_id() -> None:
    """The kernel numbers a GSO send's segments' IPv4 IDs 0, 1, 2 ...; the ICRC
    covers the ID, so segment k must carry the ICRC of ID k (rxe checks it)."""
    from softverbs.errors import WireError
    from softverbs.wire.codec import decode_udp_payload, seal_udp_payload

    frame = _frames(3)[1]
    seal_udp_payload(frame, SRC, DST, SPORT, ip_id=1)
    decode_udp_payload(bytes(frame), SRC, DST, SPORT, ip_id=1)
    with pytest.raises(WireError):
        decode_udp_payload(bytes(frame), SRC, DST, SPORT, ip_id=0)
    seal_udp_payload(frame, SRC, DST, SPORT, ip_id=0)
    decode_udp_payload(bytes(frame), SRC, DST, SPORT, ip_id=0)


def _frames(n: int, payload: int = 256) -> list[bytearray]:
    out = []
    for i in range(n):
        part = Op.SEND_FIRST if i == 0 else Op.SEND_LAST if i == n - 1 else Op.SEND_MIDDLE
        op = Transport.RC | part
        pkt = Packet(op, 0x11, i, bytes([i & 0xFF]) * payload)
        pkt.sqpn = 0x12
        out.append(encode_udp_payload(pkt, SRC, DST, SPORT))
    return out


class _Sink:
    """What _deliver hands the engine (bursts, if it merged packets), and the
    device's counters."""

    def __init__(self) -> None:
        self.got: list[Packet] = []
        self.counters: dict[str, int] = {}

    def receive(self, pkt: Packet, now: float) -> None:
        self.got.append(pkt)


def _deliver_coalesced(buffer: bytes, size: int) -> _Sink:
    from collections import Counter

    runtime = udp.UdpRuntime.__new__(udp.UdpRuntime)
    runtime.taps = []
    sink = _Sink()
    sink.counters = Counter()
    local = udp.LocalAddr("127.0.0.2", DST)
    merger = BurstMerger()
    runtime._take(sink, merger, buffer, size, ("127.0.0.1", SPORT), local, 0.0)  # type: ignore[arg-type]
    runtime._deliver(sink, merger.flush(), 0.0)  # type: ignore[arg-type]
    return sink


@settings(max_examples=300, deadline=None)
@given(n=st.integers(2, 12), bad=st.sets(st.integers(0, 11)), how=st.sampled_from(
    ["flip", "truncate-last"]), bit=st.integers(0, 8 * 200))  # fmt: skip
def test_a_bad_datagram_in_a_coalesced_buffer_drops_only_itself(n: int, bad: set[int], how: str,
                                                                bit: int) -> None:  # fmt: skip
    frames = _frames(n)
    size = len(frames[0])
    bad = {b for b in bad if b < n}
    if how == "truncate-last":
        frames[-1] = frames[-1][: len(frames[-1]) // 3]  # a short tail: a truncated segment
        bad = {n - 1}
    else:
        for b in bad:
            at = bit % len(frames[b])
            at += at == 4  # BTH byte 4 (resv8a) is masked out of the ICRC, as in RoCEv2
            frames[b][at] ^= 0x01
    sink = _deliver_coalesced(b"".join(frames), size)
    assert [s.psn for p in sink.got for s in p.segments()] == [i for i in range(n) if i not in bad]
    assert sum(v for k, v in sink.counters.items() if k.startswith("drop_")) == len(bad)
    assert sink.counters.get("rcvd_pkts", 0) == len(bad)  # only drops are counted here


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 2000))
def test_any_coalesced_buffer_is_cut_without_raising(data: bytes, size: int) -> None:
    sink = _deliver_coalesced(data, size)
    dropped = sum(v for k, v in sink.counters.items() if k.startswith("drop_"))
    datagrams = -(-len(data) // size) if 0 < size < len(data) else 1
    assert dropped + sum(p.count for p in sink.got) == datagrams


# --- GRO merges a message's packets back into a burst -----------------------------------------
V6_SRC = bytes.fromhex("fe80" + "00" * 12 + "0001")
V6_DST = bytes.fromhex("fe80" + "00" * 12 + "0002")
_KINDS = {
    "send": (Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_LAST_WITH_IMMEDIATE),
    "write": (Op.RDMA_WRITE_FIRST, Op.RDMA_WRITE_MIDDLE, Op.RDMA_WRITE_LAST,
              Op.RDMA_WRITE_LAST_WITH_IMMEDIATE),
}  # fmt: skip


def _fields(pkt: Packet) -> tuple[object, ...]:
    return tuple(bytes(pkt.payload) if k == "payload" else getattr(pkt, k)
                 for k in FIELDS)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(sorted(_KINDS)),
    transport=st.sampled_from([Transport.RC, Transport.UC, Transport.XRC]),
    start=st.sampled_from(["first", "middle"]),
    n=st.integers(1, 20),
    end=st.sampled_from(["last", "last_imm", "middle"]),
    tail=st.integers(1, 256),
    asks=st.sets(st.integers(0, 19)),
    ids=st.sampled_from(["gso", "zero", "random"]),
    v6=st.booleans(),
    se=st.booleans(),
    bad=st.sets(st.integers(0, 19), max_size=3),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_coalesced_buffer_decodes_exactly_as_its_datagrams_one_by_one(
    kind: str, transport: Transport, start: str, n: int, end: str, tail: int, asks: set[int],
    ids: str, v6: bool, se: bool, bad: set[int], seed: int,
) -> None:  # fmt: skip
    """decode_udp_segments merges a message's packets into bursts, and the
    bursts' segments are the packets decode_udp_payload gives one by one --
    every field, every payload byte --, with the bad datagrams dropped in
    their places and nothing else."""
    import random

    from softverbs.errors import WireError
    from softverbs.wire.codec import decode_udp_payload, decode_udp_segments, seal_udp_payload

    rnd = random.Random(seed)
    first, middle, last, last_imm = _KINDS[kind]
    src, dst = (V6_SRC, V6_DST) if v6 else (SRC, DST)
    seg = 64
    frames: list[bytearray] = []
    for i in range(n):
        part = first if i == 0 and start == "first" else middle
        closing = i == n - 1 and end != "middle"
        if closing:
            part = last if end == "last" else last_imm
        pkt = Packet(transport | part, 0x11, (0xFFFFF0 + i) & 0xFFFFFF,
                     rnd.randbytes(tail if closing else seg))  # fmt: skip
        pkt.ackreq = i in asks
        pkt.se = closing and se
        pkt.imm = 0x01020304 if part == last_imm else 0
        pkt.srqn = 7 if transport == Transport.XRC else 0
        if part == first and kind == "write":
            pkt.va, pkt.rkey, pkt.dma_len = 0x1000, 0x99, seg * n
        data = encode_udp_payload(pkt, src, dst, SPORT, seal=False)
        ip_id = {"gso": i, "zero": 0, "random": rnd.randrange(1 << 16)}[ids]
        seal_udp_payload(data, src, dst, SPORT, ip_id=ip_id)
        frames.append(data)
    size = max(len(f) for f in frames)
    for b in bad:
        if b < n:  # a flipped bit, never in BTH byte 4 (masked out of the ICRC)
            at = rnd.choice([a for a in range(len(frames[b])) if a != 4])
            frames[b][at] ^= 1 << rnd.randrange(8)
    frames = [f + bytes(size - len(f)) if i < n - 1 else f for i, f in enumerate(frames)]

    def one(data: bytes) -> Packet | str:
        try:
            return decode_udp_payload(data, src, dst, SPORT)
        except WireError as exc:
            return exc.reason

    expected = [one(bytes(f)) for f in frames]
    got: list[Packet | str] = []
    for p in decode_udp_segments(b"".join(frames), size, src, dst, SPORT):
        got.extend([p.reason] if isinstance(p, WireError) else p.segments())
    assert [x if isinstance(x, str) else _fields(x) for x in got] == \
        [x if isinstance(x, str) else _fields(x) for x in expected]  # fmt: skip


def test_a_message_s_packets_arrive_as_one_burst() -> None:
    """The merge happens: a WRITE's MIDDLEs and LAST from one GSO send are one
    burst (the packet asking for an ACK ends it), and the engine counts each."""
    from softverbs.wire.codec import decode_udp_segments, seal_udp_payload

    frames = []
    for i in range(10):
        part = Op.RDMA_WRITE_LAST if i == 9 else Op.RDMA_WRITE_MIDDLE
        pkt = Packet(Transport.RC | part, 0x11, i, bytes([i]) * 1024)
        pkt.ackreq = i in (3, 9)
        data = encode_udp_payload(pkt, SRC, DST, SPORT, seal=False)
        seal_udp_payload(data, SRC, DST, SPORT, ip_id=i)
        frames.append(data)
    got = decode_udp_segments(b"".join(frames), len(frames[0]), SRC, DST, SPORT)
    assert [(p.psn, p.count, p.ackreq) for p in got] == [(0, 4, True), (4, 6, True)]
    assert bytes(got[1].payload) == b"".join(bytes([i]) * 1024 for i in range(4, 10))


def test_a_message_merges_across_receives_until_another_flow_comes() -> None:
    """A burst still open at the end of one receive is continued by the next;
    datagrams of another flow end it first; flush() hands out what is open."""
    from softverbs.wire.codec import BurstMerger, seal_udp_payload

    def frames(sport: int, psns: range, last: int) -> list[bytearray]:
        out = []
        for i in psns:
            part = Op.RDMA_WRITE_LAST if i == last else Op.RDMA_WRITE_MIDDLE
            pkt = Packet(Transport.RC | part, 0x11, i, bytes([i]) * 256)
            pkt.ackreq = i == last
            data = encode_udp_payload(pkt, SRC, DST, sport, seal=False)
            seal_udp_payload(data, SRC, DST, sport, ip_id=i % 4)  # GSO sends of 4
            out.append(data)
        return out

    m = BurstMerger()
    a = frames(SPORT, range(12), 11)
    assert m.feed(b"".join(a[:4]), len(a[0]), SRC, DST, SPORT) == []  # still open
    assert m.feed(b"".join(a[4:8]), len(a[0]), SRC, DST, SPORT) == []
    other = frames(SPORT + 1, range(100, 102), -1)  # another flow
    got = m.feed(b"".join(other), len(other[0]), SRC, DST, SPORT + 1)
    assert [(p.psn, p.count) for p in got] == [(0, 8)]  # the open burst, ended
    assert bytes(got[0].payload) == b"".join(bytes([i]) * 256 for i in range(8))
    assert [(p.psn, p.count) for p in m.flush()] == [(100, 2)]
    got = m.feed(b"".join(a[8:]), len(a[0]), SRC, DST, SPORT)  # a LAST that asks: ends it
    assert [(p.psn, p.count, p.ackreq) for p in got] == [(8, 4, True)]
    assert m.flush() == []


def test_a_burst_holds_at_most_merge_max_packets() -> None:
    """UC asks for no ACK: a long message's packets merge into bursts of at
    most MERGE_MAX, however many receives they span."""
    from softverbs.wire.codec import MERGE_MAX, BurstMerger

    frames = []
    for i in range(200):
        pkt = Packet(Transport.UC | Op.RDMA_WRITE_MIDDLE, 0x11, i, bytes([i]) * 64)
        frames.append(encode_udp_payload(pkt, SRC, DST, SPORT))
    m = BurstMerger()
    got = []
    for k in range(0, 200, 10):  # receives of 10 datagrams
        got += m.feed(b"".join(frames[k : k + 10]), len(frames[0]), SRC, DST, SPORT)
    got += m.flush()
    assert [p.count for p in got] == [MERGE_MAX] * 3 + [200 - 3 * MERGE_MAX]
    assert [s.psn for p in got for s in p.segments()] == list(range(200))


# --- end to end: two UDP devices on loopback, in this process ------------------------------
@pytest.fixture(params=["gso", "no-gso"])
def pair_env(request: pytest.FixtureRequest, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> str:  # fmt: skip
    x = 100 + os.getpid() % 100
    links = [{"name": "gso1", "addrs": [f"127.{x}.9.1"]},
             {"name": "gso2", "addrs": [f"127.{x}.9.2"]}]  # fmt: skip
    cfg = tmp_path / "links.json"
    cfg.write_text(json.dumps({"links": links}))
    monkeypatch.setenv("SOFTVERBS_CONFIG", str(cfg))
    monkeypatch.setenv("SOFTVERBS_SERVICE", "0")
    monkeypatch.setenv(udp.GSO_ENV, "1" if request.param == "gso" else "0")
    return str(request.param)


def _rc(ctx: Context, pd: PD, cq: CQ) -> QP:
    init = QPInitAttr(qp_type=IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(16, 16, 1, 1))
    attr = QPAttr()
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE  # set in INIT
    return QP(pd, init, attr)


@dataclass
class _Pair:
    """Devices gso1 (a) and gso2 (b), an RC QP on each connected to the other (IB MTU
    1024), their CQs, and an MR of ``size`` bytes on each."""

    a: Context
    b: Context
    qa: QP
    qb: QP
    cqa: CQ
    cqb: CQ
    ma: MR
    mb: MR


@contextlib.contextmanager
def _connected_pair(size: int, **rts: int) -> Iterator[_Pair]:
    """A :class:`_Pair` in a registry of its own; ``rts``: further QPAttr members for
    INIT->RTR->RTS (timeout, retry_cnt)."""
    from softverbs.verbs import registry, world

    reg = registry.Registry()
    world.push(reg)
    try:
        a, b = Context(name="gso1"), Context(name="gso2")
        pda, pdb = PD(a), PD(b)
        cqa, cqb = CQ(a, 32), CQ(b, 32)
        qa, qb = _rc(a, pda, cqa), _rc(b, pdb, cqb)
        access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
        ma, mb = MR(pda, size, access), MR(pdb, size, access)
        for qp, peer, ctx in ((qa, qb, b), (qb, qa, a)):
            attr = QPAttr()
            attr.qp_access_flags = access
            attr.dest_qp_num = peer.qp_num
            attr.path_mtu = IBV_MTU_1024
            attr.max_rd_atomic = attr.max_dest_rd_atomic = 1
            for name, value in rts.items():
                setattr(attr, name, value)
            attr.ah_attr = AHAttr(is_global=1, gr=GlobalRoute(dgid=ctx.query_gid(1, 0),
                                                              sgid_index=0))  # fmt: skip
            qp.to_rts(attr)
        yield _Pair(a, b, qa, qb, cqa, cqb, ma, mb)
        for ctx in (a, b):
            ctx.close()
    finally:
        world.pop(reg)
        reg.shutdown()


def test_rc_write_and_send_bursts_arrive_intact(pair_env: str) -> None:
    size = 256 * 1024
    with _connected_pair(size) as p:
        pattern = bytes(range(256)) * (size // 256)
        p.ma.write(pattern, size)
        p.qb.post_recv(RecvWR(1, 1, [SGE(p.mb.buf, 3000, p.mb.lkey)]))
        w = SendWR(2, IBV_WR_RDMA_WRITE, 1, sg=[SGE(p.ma.buf, size, p.ma.lkey)])
        w.set_wr_rdma(p.mb.rkey, p.mb.buf)
        p.qa.post_send(w)
        p.qa.post_send(SendWR(3, IBV_WR_SEND, 1, sg=[SGE(p.ma.buf, 3000, p.ma.lkey)]))
        got: list[object] = []
        end = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < end:
            got += p.cqa.poll(4)[1] + p.cqb.poll(4)[1]
        assert len(got) == 3 and all(wc.status == IBV_WC_SUCCESS for wc in got), got
        # the WRITE overwrote the receive buffer's first 3000 bytes, then the SEND landed
        assert bytes(p.mb.read(3000, 0)) == pattern[:3000]
        assert bytes(p.mb.read(size - 3000, 3000)) == pattern[3000:]
        ca = counters(p.a)
        assert ca.get("gso_fallback", 0) == 0
        # the WRITE's 256 packets went as GSO runs, or (SOFTVERBS_UDP_GSO=0) one by one
        assert (ca.get("gso_sends", 0) > 0) == (pair_env == "gso"), ca


def test_a_small_receive_buffer_makes_a_window_that_loses_nothing(
        pair_env: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A QP's window fits in the receive buffer the kernel granted (HCA.window_for).

    Here the buffer is 256 KiB (as on a host whose net.core.rmem_max is below
    Linux's default), where a 512-packet window of 1 KiB packets overflowed it:
    every drop was a go-back-N round.  A 4 MiB WRITE now goes through with every
    packet sent once."""
    monkeypatch.setattr(udp, "RECV_BUFFER", 128 << 10)  # the kernel doubles it
    size = 4 << 20
    # 4.3 s: an ACK timer that fires because the process was not run for 67 ms
    # (the default 14) resends a window onto one still in the receiver's buffer
    with _connected_pair(size, timeout=20, retry_cnt=7) as p:
        pattern = os.urandom(size)
        p.ma.write(pattern, size)
        w = SendWR(2, IBV_WR_RDMA_WRITE, 1, sg=[SGE(p.ma.buf, size, p.ma.lkey)])
        w.set_wr_rdma(p.mb.rkey, p.mb.buf)
        p.qa.post_send(w)
        got: list[object] = []
        end = time.monotonic() + 60
        while not got and time.monotonic() < end:
            got += p.cqa.poll(1)[1]
            p.cqb.poll(1)  # drives the receiving device too
        assert len(got) == 1 and all(wc.status == IBV_WC_SUCCESS for wc in got), got
        assert bytes(p.mb.read(size, 0)) == pattern
        ca, cb = counters(p.a), counters(p.b)
        assert cb.get("out_of_seq_request", 0) == 0, cb  # nothing was lost on the way
        assert ca.get("rcvd_seq_err", 0) == 0 and ca.get("local_ack_timeout_err", 0) == 0, ca
        assert ca["sent_pkts"] == size // 1024, ca  # each packet sent once


@pytest.mark.parametrize("may_force", [True, False])
def test_the_receive_buffer_is_forced_where_the_process_may(may_force: bool) -> None:
    """SO_RCVBUFFORCE (CAP_NET_ADMIN) first, to pass net.core.rmem_max; SO_RCVBUF else."""
    calls: list[int] = []

    class Sock:
        def setsockopt(self, level: int, name: int, value: int) -> None:
            calls.append(name)
            if name == udp.SO_RCVBUFFORCE and not may_force:
                raise PermissionError("EPERM")

    udp._set_rcvbuf(Sock(), 8 << 20)  # type: ignore[arg-type]
    assert calls == ([udp.SO_RCVBUFFORCE] if may_force
                     else [udp.SO_RCVBUFFORCE, socket.SO_RCVBUF])  # fmt: skip


def test_the_window_is_what_the_receive_buffer_holds() -> None:
    """HCA.window_for: a datagram takes its data rounded up to a power of two
    (headers and skb_shared_info included) and an sk_buff: 2304 bytes for a 1024-byte
    MTU, 8448 for 4096."""
    from softverbs.engine.core import DEFAULT_WINDOW, MIN_WINDOW
    from softverbs.engine.hca import HCA

    hca = HCA("t", [bytes(16)], functools.partial(random.Random(0).getrandbits, 8))
    assert hca.window_for(4096) == DEFAULT_WINDOW  # in process: nothing buffered
    hca.rx_buffer = 425984  # what SO_RCVBUF grants under Linux's default rmem_max
    usable = 425984 * 3 // 4  # a quarter may be charged for datagrams already read
    assert [hca.window_for(m) for m in (256, 512, 1024, 2048, 4096)] == [
        usable // 1280,
        usable // 1280,
        usable // 2304,
        usable // 4352,
        usable // 8448,
    ]
    assert hca.window_for(4096) == 37
    hca.rx_buffer = 16 << 20
    assert hca.window_for(4096) == DEFAULT_WINDOW  # a big buffer: the usual window
    hca.rx_buffer = 4096
    assert hca.window_for(4096) == MIN_WINDOW


def test_a_refused_gso_send_falls_back_to_one_datagram_at_a_time() -> None:
    """A kernel (or device) that refuses UDP_SEGMENT: the run goes out datagram by
    datagram, each sealed again for IPv4 ID 0, the device stops using GSO, and
    ``gso_fallback`` counts it.  The burst's later runs, sealed for GSO too, go
    the same way."""
    import errno
    from collections import Counter
    from types import SimpleNamespace

    from softverbs.wire.codec import Parts, decode_udp_payload, seal_udp_payload

    class RefusingSocket:
        family = socket.AF_INET

        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def setsockopt(self, *args: object) -> None:
            pass

        def sendmsg(self, *args: object) -> int:
            raise OSError(errno.EINVAL, "Invalid argument")

        def sendto(self, data: bytes, dest: object) -> int:
            self.sent.append(bytes(data))
            return len(data)

    runtime = udp.UdpRuntime.__new__(udp.UdpRuntime)
    runtime.gso = runtime.bursts = True
    runtime._checksummed = set()
    src = SimpleNamespace(counters=Counter())
    dest, addr = ("127.0.0.2", 4791), (SRC, DST, SPORT)
    runs = [_frames(4), _frames(3)]  # two runs of one burst: the kernel refuses the first
    for run in runs:
        for k, data in enumerate(run):
            seal_udp_payload(data, SRC, DST, SPORT, ip_id=k)  # as a GSO run is sealed
    sock = RefusingSocket()
    for run in runs:  # each datagram as its header, payload and ICRC, as the encoder gives it
        parts: list[Parts] = [[d[:12], memoryview(d)[12:-4], d[-4:]] for d in run]
        runtime._send_run(src, sock, parts, len(run[0]), dest, addr)
    assert src.counters["gso_fallback"] == 1 and not runtime.gso and not runtime.bursts
    assert len(sock.sent) == 7  # the later run too, each datagram sealed again for ID 0
    assert [decode_udp_payload(d, SRC, DST, SPORT, ip_id=0).psn
            for d in sock.sent] == [0, 1, 2, 3, 0, 1, 2]  # fmt: skip


def test_a_long_drain_sends_the_acks_it_owes_every_64_packets() -> None:
    """A receiver draining a backlog sends what it owes (its coalesced ACKs) after
    every ACK_FLUSH_PACKETS datagrams, not only when the socket is empty."""
    from collections import Counter

    from softverbs.fabric.runtime import MonotonicClock

    datagrams = [encode_udp_payload(Packet(Transport.RC | Op.RDMA_WRITE_ONLY, 0x11, i,
                                           b"x" * 64), SRC, DST, SPORT)
                 for i in range(200)]  # fmt: skip

    class Backlog:
        def recvmsg(self, *args: object) -> tuple[bytes, list[object], int, tuple[str, int]]:
            if not datagrams:
                raise BlockingIOError
            return bytes(datagrams.pop(0)), [], 0, ("127.0.0.1", SPORT)

    runtime = udp.UdpRuntime.__new__(udp.UdpRuntime)
    runtime.taps = []
    runtime.clock = MonotonicClock()
    sink = _Sink()
    sink.counters = Counter()
    runtime.hcas = [sink]  # type: ignore[list-item]

    class Ready:  # the epoll set of the receiving sockets: fd 3 while the backlog lasts
        def poll(self, timeout: float) -> list[tuple[int, int]]:
            assert timeout == 0  # a drain never waits
            return [(3, select.EPOLLIN)] if datagrams else []

    runtime._rx_fd = {3: (Backlog(), udp.LocalAddr("127.0.0.2", DST))}  # type: ignore[dict-item]
    runtime._ready = Ready()  # type: ignore[assignment]
    runtime._woken, runtime._mergers = None, {}
    flushed_at: list[int] = []
    runtime.send_outboxes = lambda now: flushed_at.append(len(sink.got)) or False  # type: ignore[method-assign]
    assert runtime._drain()
    assert len(sink.got) == 200
    assert flushed_at == [64, 128, 192] and udp.ACK_FLUSH_PACKETS == 64


def test_a_drain_receives_only_where_a_datagram_waits() -> None:
    """The drain asks the epoll set of its sockets which hold datagrams: no
    receive fails with EAGAIN, and a drain of empty sockets (a busy poller's
    empty poll) makes no receive at all."""
    x = 100 + os.getpid() % 100
    runtime = udp.UdpRuntime(udp.explicit_addresses([f"127.{x}.9.1"]))
    try:
        ((fd, (sock, local)),) = runtime._rx_fd.items()
        calls: list[str] = []

        class Counted:  # the socket, each receive recorded: a datagram, or EAGAIN
            def recvmsg(self, *args: int) -> tuple[bytes, list[tuple[int, int, bytes]], int,
                                                  tuple[str, int]]:  # fmt: skip
                try:
                    got = sock.recvmsg(*args)
                except BlockingIOError:
                    calls.append("EAGAIN")
                    raise
                calls.append("datagram")
                return got

        runtime._rx_fd[fd] = (Counted(), local)  # type: ignore[assignment]
        assert not runtime._drain() and calls == []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            for _ in range(3):
                peer.sendto(b"x" * 24, (local.text, 4791))
            deadline = time.monotonic() + 5
            while not select.select([sock], [], [], 0)[0] and time.monotonic() < deadline:
                time.sleep(0.001)
            assert runtime._drain()  # no device attached: taken and dropped
        assert calls and set(calls) == {"datagram"}, calls
        taken = len(calls)
        assert not runtime._drain() and len(calls) == taken
    finally:
        runtime.stop()
