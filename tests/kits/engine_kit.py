"""A test bench for the sans-IO engine: two HCAs, a manual clock, a scripted wire.

Nothing from ``softverbs.verbs`` or ``softverbs.fabric`` is used.  A
:class:`Node` is one device (:class:`~softverbs.engine.hca.HCA`) with one QP
engine built the way ``verbs/qp.py`` builds it: work-queue rings, CQs, and a
memory region of real ``bytearray`` memory registered in the device's key
table.  :class:`Bench` connects two nodes (RESET -> INIT -> RTR -> RTS by
``set_attrs``/``set_state``) and moves packets between their outboxes
through a :class:`Policy`, which decides per packet: deliver, drop,
duplicate, or swap with the next packet of the same batch.

Packets move in *batches*: everything in both outboxes at one moment is one
batch, delivered in order; whatever the receivers answer forms the next
batch.  Time moves only in :meth:`Bench.advance`, which jumps the clock to
the earliest timer deadline of either device and fires it.  Every packet
that leaves an outbox is recorded in :attr:`Bench.log` with its sequence
number, the time and what the policy did, so tests can count ACKs and NAKs
and read the exact time of each retransmission.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from softverbs.engine.hca import HCA
from softverbs.engine.memory import MemKey, MemKind
from softverbs.engine.qp import QPEngine
from softverbs.engine.rings import (
    CQE,
    WQ_RQ,
    WQ_SQ,
    CompletionRing,
    RecvWQE,
    Route,
    SendWQE,
    WorkRing,
    local_cq,
    local_work_ring,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QPS_INIT,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPT_RC,
)
from softverbs.errors import WireError
from softverbs.wire.codec import BurstMerger, encode_udp_payload
from softverbs.wire.opcodes import (
    AETH_ACK,
    AETH_NAK,
    AETH_RNR_NAK,
    OPINFO,
    Kind,
    aeth_kind,
    aeth_value,
)
from softverbs.wire.packet import Packet

ALL_ACCESS = (
    IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
)

GID_A = b"\x00" * 10 + b"\xff\xff" + bytes([10, 0, 0, 1])
GID_B = b"\x00" * 10 + b"\xff\xff" + bytes([10, 0, 0, 2])

#: Where each node's memory region pretends to live (its iova).
BASE_A = 0x10_0000
BASE_B = 0x20_0000


def kind_of(pkt: Packet) -> Kind:
    info = OPINFO[pkt.opcode]
    assert info is not None
    return info.kind


def is_ack(pkt: Packet) -> bool:
    """A plain positive ACK (not a NAK, not a READ response, not an atomic ACK)."""
    return kind_of(pkt) is Kind.ACK and aeth_kind(pkt.syndrome) == AETH_ACK


def is_seq_nak(pkt: Packet) -> bool:
    return kind_of(pkt) is Kind.ACK and aeth_kind(pkt.syndrome) == AETH_NAK and (
        aeth_value(pkt.syndrome) == 0
    )


def is_rnr_nak(pkt: Packet) -> bool:
    return kind_of(pkt) is Kind.ACK and aeth_kind(pkt.syndrome) == AETH_RNR_NAK


def is_request(pkt: Packet) -> bool:
    info = OPINFO[pkt.opcode]
    assert info is not None
    return info.request


# --- the wire ------------------------------------------------------------------------------------

DELIVER, DROP, DUP, SWAP = "deliver", "drop", "dup", "swap"


@dataclass
class Sent:
    """One packet that left an outbox."""

    seq: int  #: 0-based, over both directions
    t: float
    src: str  #: "a" or "b"
    pkt: Packet
    action: str


#: policy(seq, src name, packet) -> DELIVER | DROP | DUP | SWAP
Policy = Callable[[int, str, Packet], str]


def deliver_all(seq: int, src: str, pkt: Packet) -> str:
    return DELIVER


def drop_seqs(*seqs: int) -> Policy:
    """Drop the packets with these sequence numbers (0-based, both directions)."""
    wanted = set(seqs)
    return lambda seq, src, pkt: DROP if seq in wanted else DELIVER


def drop_if(pred: Callable[[str, Packet], bool], times: int = 1) -> Policy:
    """Drop the first ``times`` packets that match ``pred`` (times=-1: all of them)."""
    left = [times]

    def policy(seq: int, src: str, pkt: Packet) -> str:
        if left[0] != 0 and pred(src, pkt):
            left[0] -= 1
            return DROP
        return DELIVER

    return policy


def act_if(pred: Callable[[str, Packet], bool], action: str, times: int = 1) -> Policy:
    """Apply ``action`` to the first ``times`` packets matching ``pred``."""
    left = [times]

    def policy(seq: int, src: str, pkt: Packet) -> str:
        if left[0] != 0 and pred(src, pkt):
            left[0] -= 1
            return action
        return DELIVER

    return policy


@dataclass
class SeededFaults:
    """Random, seeded, reproducible faults.

    Each distinct packet identity (direction, opcode, PSN) is dropped at most
    ``max_drops_per_packet`` times, so a bounded retry count always suffices;
    the schedule of decisions is kept in :attr:`schedule` for failure reports.
    """

    seed: int
    loss: float = 0.0
    dup: float = 0.0
    swap: float = 0.0
    max_drops_per_packet: int = 2
    schedule: list[tuple[int, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.drops: dict[tuple[str, int, int], int] = {}

    def __call__(self, seq: int, src: str, pkt: Packet) -> str:
        r = self.rng.random()
        ident = (src, pkt.opcode, pkt.psn)
        action = DELIVER
        if r < self.loss:
            if self.drops.get(ident, 0) < self.max_drops_per_packet:
                self.drops[ident] = self.drops.get(ident, 0) + 1
                action = DROP
        elif r < self.loss + self.dup:
            action = DUP
        elif r < self.loss + self.dup + self.swap:
            action = SWAP
        if action != DELIVER:
            self.schedule.append((seq, action, repr(pkt)))
        return action

    def replay(self) -> str:
        """The constructor call that reproduces this schedule."""
        return (f"SeededFaults({self.seed}, loss={self.loss!r}, dup={self.dup!r}, "
                f"swap={self.swap!r}, max_drops_per_packet={self.max_drops_per_packet})")

    def describe(self) -> str:
        lines = [self.replay()]
        lines += [f"  #{seq}: {action} {pkt}" for seq, action, pkt in self.schedule]
        return "\n".join(lines)


# --- a device with one QP ----------------------------------------------------------------------

#: the requester's window in these tests (packets); their message lengths are chosen
#: against it (the device's own default, DEFAULT_WINDOW, is larger)
WINDOW = 512


class Node:
    """One HCA with one QP engine, two CQs and one memory region."""

    def __init__(
        self,
        name: str,
        gid: bytes,
        base: int,
        qp_type: int = IBV_QPT_RC,
        mem_size: int = 1 << 16,
        sq_size: int = 256,
        rq_size: int = 256,
        cq_size: int = 4096,
        sq_sig_all: bool = False,
    ) -> None:
        self.name = name
        self.gid = gid
        self.hca = HCA(name, [gid], functools.partial(random.Random(name).getrandbits, 8))
        self.hca.max_window = WINDOW
        self.pd = object()
        self.scq = local_cq(cq_size)
        self.rcq = local_cq(cq_size)
        self.sq: WorkRing = local_work_ring(sq_size)
        self.rq: WorkRing = local_work_ring(rq_size)
        self.sq.tag = (WQ_SQ, 1)
        self.rq.tag = (WQ_RQ, 1)
        qpn = self.hca.alloc_qpn()
        self.qp = QPEngine(self.hca, qpn, qp_type, self.pd, self.scq, self.rcq, self.sq,
                           self.rq, None, sq_sig_all)  # fmt: skip
        self.hca.qps[qpn] = self.qp
        self.base = base
        self.mem = bytearray(mem_size)
        self.mr: MemKey = self.hca.keys.register(
            MemKind.MR, self.pd, memoryview(self.mem), base, ALL_ACCESS
        )
        self.next_wr_id = 1

    @property
    def counters(self) -> dict[str, int]:
        return dict(self.hca.counters)

    def addr(self, offset: int) -> int:
        return self.base + offset

    # --- posting --------------------------------------------------------------------------
    def post_send(
        self,
        opcode: int,
        offset: int,
        length: int,
        *,
        remote: int = 0,
        rkey: int | None = None,
        signaled: bool = True,
        imm: int = 0,
        compare_add: int = 0,
        swap: int = 0,
        wr_id: int | None = None,
        ring: bool = True,
        now: float = 0.0,
    ) -> SendWQE:
        """Write one send WQE (local buffer at ``offset``) and ring the doorbell."""
        if wr_id is None:
            wr_id = self.next_wr_id
            self.next_wr_id += 1
        wqe = SendWQE(wr_id, opcode, signaled, [(self.addr(offset), length, self.mr.key)],
                      length)  # fmt: skip
        wqe.imm = imm
        wqe.remote_addr = remote
        wqe.rkey = rkey if rkey is not None else 0
        wqe.compare_add = compare_add
        wqe.swap = swap
        self.sq.push(wqe)
        if ring:
            self.ring(now)
        return wqe

    def ring(self, now: float = 0.0) -> None:
        self.sq.ring(self.sq.pi)
        self.qp.doorbell(now)

    def post_recv(self, offset: int, length: int, wr_id: int | None = None,
                  now: float = 0.0, message: bool = True) -> RecvWQE:  # fmt: skip
        """Write one receive WQE and its doorbell word; ``message=False`` leaves out
        the doorbell message (a served device has not read it yet)."""
        if wr_id is None:
            wr_id = self.next_wr_id
            self.next_wr_id += 1
        rqe = RecvWQE(wr_id, [(self.addr(offset), length, self.mr.key)], length)
        self.rq.push(rqe)
        self.rq.ring(self.rq.pi)
        if message:
            self.qp.rq_doorbell(now)
        return rqe

    # --- completions ----------------------------------------------------------------------
    def _poll(self, cq: CompletionRing) -> list[CQE]:
        out = cq.take(cq.capacity)
        for cqe in out:
            ring = {WQ_SQ: self.sq, WQ_RQ: self.rq}.get(cqe.wq_kind)
            if ring is not None:
                ring.release(cqe.index)
        return out

    def poll_send(self) -> list[CQE]:
        return self._poll(self.scq)

    def poll_recv(self) -> list[CQE]:
        return self._poll(self.rcq)


# --- two connected nodes ---------------------------------------------------------------------


class Bench:
    """Two connected QPs, a scripted wire and a manual clock (see module docstring)."""

    def __init__(
        self,
        qp_type: int = IBV_QPT_RC,
        *,
        pmtu: int = 256,
        timeout: int = 10,
        retry_cnt: int = 7,
        rnr_retry: int = 7,
        min_rnr_timer: int = 1,
        sq_psn: int = 0,
        rq_psn: int | None = None,
        max_rd_atomic: int = 4,
        max_dest_rd_atomic: int = 4,
        policy: Policy = deliver_all,
        mem_size: int = 1 << 16,
        sq_size: int = 256,
        rq_size: int = 256,
        bursts: bool = False,
        gro: bool = False,
    ) -> None:
        self.now = 0.0
        self.policy = policy
        #: deliver bursts whole (segmentation offload, as the in-process fabric
        #: does); by default the wire splits them, so the policy sees single packets
        self.bursts = bursts
        #: carry the packets as the UDP fabric's receiver gets them: encoded to
        #: datagrams, coalesced as GRO coalesces them (runs of one size to one
        #: destination), decoded with decode_udp_segments (which merges bursts again)
        self.gro = gro
        self.a = Node("a", GID_A, BASE_A, qp_type, mem_size, sq_size, rq_size)
        self.b = Node("b", GID_B, BASE_B, qp_type, mem_size, sq_size, rq_size)
        self.by_gid = {GID_A: self.a.hca, GID_B: self.b.hca}
        self.log: list[Sent] = []
        self.timer_fires: list[float] = []
        rq = sq_psn if rq_psn is None else rq_psn
        for me, peer in ((self.a, self.b), (self.b, self.a)):
            qp = me.qp
            qp.set_state(IBV_QPS_INIT, self.now)
            qp.set_attrs({"pkey_index": 0, "access": ALL_ACCESS})
            qp.set_attrs({
                "route": Route(dgid=peer.gid, sgid=me.gid),
                "pmtu": pmtu,
                "dest_qpn": peer.qp.qpn,
                "rq_psn": rq,
                "max_dest_rd_atomic": max_dest_rd_atomic,
                "min_rnr_timer": min_rnr_timer,
            })  # fmt: skip
            qp.set_state(IBV_QPS_RTR, self.now)
            qp.set_attrs({
                "sq_psn": sq_psn,
                "timeout": timeout,
                "retry_cnt": retry_cnt,
                "rnr_retry": rnr_retry,
                "max_rd_atomic": max_rd_atomic,
            })  # fmt: skip
            qp.set_state(IBV_QPS_RTS, self.now)

    # --- moving packets ---------------------------------------------------------------------
    def _collect(self) -> list[tuple[HCA, Packet]]:
        """Take one batch from both outboxes and apply the policy to it."""
        marked: list[tuple[HCA, Packet, str]] = []
        for node in (self.a, self.b):
            outbox = node.hca.outbox
            while outbox:
                item = outbox.popleft()
                for pkt in (item,) if self.bursts else item.segments():
                    action = self.policy(len(self.log), node.name, pkt)
                    self.log.append(Sent(len(self.log), self.now, node.name, pkt, action))
                    dst = self.by_gid.get(pkt.dgid)
                    assert dst is not None, f"no route to {pkt.dgid.hex()} for {pkt!r}"
                    if action != DROP:
                        marked.append((dst, pkt, action))
        batch: list[tuple[HCA, Packet]] = []
        i = 0
        while i < len(marked):
            dst, pkt, action = marked[i]
            if action == SWAP and i + 1 < len(marked):
                nxt = marked[i + 1]
                batch.append((nxt[0], nxt[1]))
                if nxt[2] == DUP:
                    batch.append((nxt[0], nxt[1].copy()))
                batch.append((dst, pkt))
                i += 2
                continue
            batch.append((dst, pkt))
            if action == DUP:
                batch.append((dst, pkt.copy()))
            i += 1
        return batch

    def pump(self) -> bool:
        """Deliver packets until both outboxes are empty; True if any moved."""
        moved = False
        while True:
            batch = self._collect()
            if not batch:
                return moved
            moved = True
            if self.gro:
                batch = _through_gro(batch)
            for dst, pkt in batch:
                dst.receive(pkt, self.now)

    def next_deadline(self) -> float | None:
        ds = [d for d in (self.a.hca.next_deadline(), self.b.hca.next_deadline()) if d is not None]
        return min(ds) if ds else None

    def advance(self, to: float | None = None) -> bool:
        """Move the clock to ``to`` (default: the next deadline) and fire due timers."""
        if to is None:
            to = self.next_deadline()
            if to is None:
                return False
        assert to >= self.now, "the clock never goes back"
        self.now = to
        fired = False
        for node in (self.a, self.b):
            if node.hca.run_timers(self.now):
                fired = True
        if fired:
            self.timer_fires.append(self.now)
        return fired

    def run(self, max_time: float = 1e9, max_steps: int = 100_000) -> None:
        """Pump and fire timers until nothing is left to do (or ``max_time``)."""
        for _ in range(max_steps):
            self.pump()
            nxt = self.next_deadline()
            if nxt is None or nxt > max_time:
                return
            self.advance(nxt)
        raise AssertionError("the bench did not settle")

    # --- reading the log --------------------------------------------------------------------
    def sent(self, src: str | None = None, pred: Callable[[Packet], bool] | None = None,
             dropped: bool | None = None) -> list[Sent]:  # fmt: skip
        out = []
        for s in self.log:
            if src is not None and s.src != src:
                continue
            if pred is not None and not pred(s.pkt):
                continue
            if dropped is not None and (s.action == DROP) != dropped:
                continue
            out.append(s)
        return out

    def psns(self, entries: Iterable[Sent]) -> list[int]:
        return [s.pkt.psn for s in entries]

    def trace(self) -> str:
        return "\n".join(f"#{s.seq} t={s.t:.9f} {s.src}->{'b' if s.src == 'a' else 'a'} "
                         f"{s.action:7} {s.pkt!r}" for s in self.log)  # fmt: skip


GRO_MAX = 65000  #: bytes of one coalesced receive (the kernel stops below 64 KiB)


def _through_gro(batch: list[tuple[HCA, Packet]]) -> list[tuple[HCA, Packet]]:
    """``batch`` as a UDP_GRO receiver would hand it to its engine (see
    Bench.gro): every packet encoded; consecutive datagrams to one device, all
    of one size but the last (not longer), coalesced; the buffers to one device
    decoded by one BurstMerger, so bursts merge across buffers too."""
    out: list[tuple[HCA, Packet]] = []
    run: list[bytearray] = []
    run_dst: HCA | None = None
    ips = (b"", b"", 0)
    merger = BurstMerger()

    def take(items: list[Packet | WireError]) -> None:
        for item in items:
            assert not isinstance(item, WireError), item  # nothing on this wire corrupts
            out.append((run_dst, item))  # type: ignore[arg-type]

    def flush() -> None:
        if run:
            take(merger.feed(b"".join(run), len(run[0]), *ips))
        run.clear()

    for dst, pkt in batch:
        src_ip, dst_ip = pkt.sgid[12:], pkt.dgid[12:]
        data = encode_udp_payload(pkt, src_ip, dst_ip, pkt.sport)
        fits = (dst is run_dst and (src_ip, dst_ip, pkt.sport) == ips and run
                and len(data) <= len(run[0]) == len(run[-1])
                and sum(map(len, run)) + len(data) <= GRO_MAX)  # fmt: skip
        if not fits:
            flush()
            if dst is not run_dst:
                take(list(merger.flush()))
            run_dst, ips = dst, (src_ip, dst_ip, pkt.sport)
        run.append(data)
    flush()
    take(list(merger.flush()))
    return out
