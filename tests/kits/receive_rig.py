"""A rig for fuzzing the whole receive path: bytes -> decoder -> HCA.receive -> live QPs.

The rig is one simulated device (``dut``) with a QP of every type in every
state that can receive something -- RC in RESET, INIT, RTR, RTS, SQD and
ERR, an RC requester with READs, atomics, SENDs and WRITEs in flight, an RC
QP on an SRQ, an RC QP whose receive queue holds bad WQEs, UC in RTR and
RTS, UD in INIT and RTS -- and memory regions carved out of **one**
bytearray, with canary bytes between them::

    | canary | rw0 | canary | rw1 | canary | zero-based | canary | read-only | canary |
      local-only | canary | other PD | canary | window base (remote only via an MW) | canary

The regions start at an address that is 0 modulo 1 MiB, so a run is
reproducible although addresses go on the wire (a flipped VA bit moves by
the same power of two in every run); the rest of the 1 MiB buffer is a
guard too.  A second device (``peer``) only provides the address the QPs
are connected to; nothing answers from it.  Inputs are fed with :meth:`ReceiveRig.feed_udp`
or :meth:`ReceiveRig.feed_frame`: the decoder runs first (a ``WireError`` is
counted as the fabric counts it: ``rcvd_pkts`` and ``drop_<reason>``), then
``HCA.receive``.  Packets the device sends back are taken from its outbox
at once and checked.  The rig asserts, per input:

* the decoder raises nothing but ``WireError``, with a known reason;
* ``HCA.receive`` raises nothing;
* at most one drop counter (``drop_*``, ``qkey_violation``) moves, and a
  packet that moves none must have done something: changed its QP, sent a
  packet, written a CQE, or moved another named counter -- no silent drop;
* every packet sent back encodes, and a payload that is a view of memory
  lies inside a registered region;

and, whenever a QP falls into ERR (or a requester has nothing left in
flight): it has a reason -- ``last_error`` or a failed CQE that says why --
and every posted send WQE completed exactly once; then the QP is renewed
(RESET -> its state, fresh PSNs, full queues) at once.  Per batch
(:meth:`ReceiveRig.check_batch`):

* every canary and guard byte, the read-only, local-only and other-PD
  regions and the parts of the window base outside the window are unchanged;
* every completion has a known status, a failed one says why, and a QP that
  went to ERR by itself has a reason (``last_error``) or an error CQE;
* every QP that is not inside a multi-packet message still receives a
  well-formed SEND (the probe), and the requester's timers run until every
  posted WQE completed exactly once;
* then every QP that left its state, and every requester, is put back into
  its state with fresh PSNs; the others get their receive queues topped up.

:class:`Mutator` makes the inputs from a ``random.Random(seed)``: valid
packets for the current QP state (so PSNs, keys and addresses line up),
then field mutations (opcode, PSN, QPN, P_Key, Q_Key, RETH, AETH, lengths,
flags ...), then byte mutations (flips, truncation, extension, pad and TVer
bits), framed as an IPv4 or IPv6 UDP payload or an Ethernet frame, with the
ICRC re-signed most of the time so that the mutation reaches the engine.
"""

from __future__ import annotations

import ctypes
import random
import struct
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from softverbs import (
    CQ,
    MR,
    MW,
    PD,
    QP,
    SGE,
    SRQ,
    AHAttr,
    Context,
    GlobalRoute,
    MWBind,
    MWBindInfo,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    SrqAttr,
    SrqInitAttr,
)
from softverbs.engine.qp import QPEngine
from softverbs.engine.responder import Msg
from softverbs.engine.rings import CQE, CompletionRing
from softverbs.engine.wr import WR_INFO, WrClass
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_ACCESS_ZERO_BASED,
    IBV_EVENT_QP_ACCESS_ERR,
    IBV_EVENT_QP_FATAL,
    IBV_EVENT_QP_REQ_ERR,
    IBV_MTU_256,
    IBV_MTU_512,
    IBV_MW_TYPE_1,
    IBV_QP_STATE,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_WC_RECV,
    IBV_WC_SUCCESS,
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
    IBV_WR_SEND_WITH_IMM,
    ibv_wc_status,
)
from softverbs.errors import WireError
from softverbs.sim import Simulation
from softverbs.wire.codec import (
    decode_frame,
    decode_udp_payload,
    encode_transport,
    encode_udp_payload,
    icrc,
)
from softverbs.wire.opcodes import (
    AETH_ACK,
    AETH_CREDIT_INVALID,
    AETH_NAK,
    AETH_RNR_NAK,
    OPINFO,
    Kind,
    Op,
    Transport,
    aeth_syndrome,
)
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet

ALL_ACCESS = (
    IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
)
QKEY = 0x11111111
RQ_DEPTH = 8
CANARY_LEN = 64
#: A canary pattern no SEND or WRITE of the rig writes by accident (it is not random).
CANARY = bytes((0xC3 ^ (i * 37)) & 0xFF for i in range(CANARY_LEN))
REASONS = frozenset({"truncated", "bad_opcode", "bad_tver", "bad_pad", "icrc_error",
                     "not_rocev2"})  # fmt: skip
_WC_STATUSES = frozenset(int(s) for s in ibv_wc_status)
_OPCODES = tuple(i for i, info in enumerate(OPINFO) if info is not None)
_M24 = 0xFFFFFF

# name, length, access, in the second PD, immutable (nothing may ever change it)
_REGIONS: tuple[tuple[str, int, int, bool, bool], ...] = (
    ("rw0", 8192, ALL_ACCESS, False, False),
    ("rw1", 4096, ALL_ACCESS, False, False),
    ("zb", 512, ALL_ACCESS | IBV_ACCESS_ZERO_BASED, False, False),
    ("ro", 1024, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, False, True),
    ("local", 512, IBV_ACCESS_LOCAL_WRITE, False, True),
    ("other_pd", 512, ALL_ACCESS, True, True),
    ("mwbase", 1024, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, False, False),
)
#: The window: bytes [256, 768) of "mwbase"; the rest of mwbase must never change.
_MW_OFF, _MW_LEN = 256, 512
_ALIGN = 1 << 20
#: Inputs between renewals of the QPs that fell into ERR (renewing is costly).
RENEW_EVERY = 20

#: Counters that mean "this packet was dropped".
def is_drop_counter(name: str) -> bool:
    return name.startswith("drop_") or name == "qkey_violation"


@dataclass
class Region:
    name: str
    offset: int  #: in the rig's one bytearray
    length: int
    access: int
    mr: MR
    immutable: bool
    addr: int = 0  #: real address of the first byte
    iova: int = 0  #: what the wire calls its first byte

    @property
    def rkey(self) -> int:
        return self.mr.rkey


@dataclass
class Target:
    """One QP of the rig and the state it is kept in."""

    name: str
    qp: QP
    state: int
    attr: QPAttr
    pmtu_code: int = IBV_MTU_256
    role: str = "responder"  #: "responder" or "requester"
    bad_rqes: bool = False  #: its receive queue holds WQEs that must fail
    srq: SRQ | None = None
    posted_sends: list[int] = field(default_factory=list)  #: requester: wr_ids in flight

    @property
    def eng(self) -> QPEngine:
        return self.qp.engine


@dataclass
class Stats:
    inputs: int = 0
    decode_errors: int = 0
    accepted: int = 0
    dropped: int = 0
    probes: int = 0
    batches: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  #: explore mode: first of each


class RigFailure(AssertionError):
    """An invariant broke; the message says which input and how to replay it."""


class ReceiveRig:
    """See the module docstring.  Use as a context manager."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed ^ 0x5EED)  # the rig's own choices (PSNs, probes)
        self.sim = Simulation(devices=("dut", "peer"), mtu=1024)
        self.stats = Stats()
        self._entered = False
        self._wr = 0
        self.send_seen: Counter[int] = Counter()  #: send wr_id -> CQEs polled
        self.errors_with_reason: set[int] = set()  #: QPNs with a failed CQE that says why
        self.last_input = ""
        self.explore = False  #: count silent drops instead of failing (while exploring)
        self.in_check = False
        self.renew: set[str] = set()  #: names of QPs to renew at the next renew_due()

    # --- setup -------------------------------------------------------------------------
    def __enter__(self) -> ReceiveRig:
        self.sim.__enter__()
        self._entered = True
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._entered:
            self._entered = False
            self.sim.__exit__(exc_type, exc, tb)

    def _build(self) -> None:
        self.ctx = Context(name="dut")
        self.peer = Context(name="peer")
        self.hca = self.ctx.hca
        self.clock = self.sim.clock
        self.pd = PD(self.ctx)
        self.pd2 = PD(self.ctx)
        total = CANARY_LEN + sum(r[1] + CANARY_LEN for r in _REGIONS)
        # Addresses go on the wire (RETH VA), and a flipped bit of a VA moves it by a
        # power of two: start the regions at an address that is 0 modulo 1 MiB, so
        # every run sees the same low 20 bits and makes the same decisions.
        self.mem = bytearray(total + _ALIGN)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))
        start = -base % _ALIGN
        self.canaries: list[int] = [start]
        self.regions: dict[str, Region] = {}
        off = start + CANARY_LEN
        for name, length, access, other_pd, immutable in _REGIONS:
            view = memoryview(self.mem)[off : off + length]
            mr = MR.from_buffer(self.pd2 if other_pd else self.pd, view, access)
            addr = base + off
            iova = 0 if access & IBV_ACCESS_ZERO_BASED else addr
            self.regions[name] = Region(name, off, length, access, mr, immutable, addr, iova)
            off += length
            self.canaries.append(off)
            off += CANARY_LEN
        for c in self.canaries:
            self.mem[c : c + CANARY_LEN] = CANARY
        self.guards = ((0, start), (off, len(self.mem)))
        for lo, hi in self.guards:
            self.mem[lo:hi] = bytes(range(256)) * ((hi - lo) // 256) + bytes((hi - lo) % 256)
        self.guard_bytes = [bytes(self.mem[lo:hi]) for lo, hi in self.guards]
        for r in self.regions.values():
            if r.immutable or r.name == "mwbase":
                self.mem[r.offset : r.offset + r.length] = random.Random(r.name).randbytes(r.length)
        self.snapshot = {n: bytes(self._bytes(r)) for n, r in self.regions.items()}
        self.mr_ranges = sorted((r.addr, r.addr + r.length) for r in self.regions.values())
        self.scq = CQ(self.ctx, 8192)
        self.rcq = CQ(self.ctx, 8192)
        self.srq = SRQ(self.pd, SrqInitAttr(SrqAttr(max_wr=256, max_sge=2)))
        self.peer_gid = self.peer.query_gid(1, 1)
        self.dut_gid = bytes(self.hca.gids[1])
        peer_ip = bytes(self.peer.hca.gids[1])[12:]
        self.src_ip, self.dst_ip = peer_ip, self.dut_gid[12:]
        self.targets: list[Target] = []
        self._state_attr = QPAttr()
        self._ah = AHAttr(is_global=1, port_num=1,
                          gr=GlobalRoute(dgid=self.peer_gid, sgid_index=1))  # fmt: skip
        rw0, rw1, other = self.regions["rw0"], self.regions["rw1"], self.regions["other_pd"]
        # SGEs are copied when posted, so receive WRs share these.
        self._good_sges = [[SGE(rw0.addr + 4096 + off, 2048, rw0.mr.lkey)]
                           for off in range(0, 2048, 64)]  # fmt: skip
        self._bad_sges = [[SGE(rw1.addr + 64, n, rw1.mr.lkey)] for n in (0, 1, 16, 39)] + [
            [SGE(other.addr, other.length, other.mr.lkey)],
            [SGE(rw1.addr, 512, rw1.mr.lkey ^ 0x100)],
            # two SGEs, the second out of its region
            [SGE(rw1.addr, 100, rw1.mr.lkey), SGE(rw1.addr + rw1.length - 50, 100, rw1.mr.lkey)],
        ]
        spec = (
            ("rc_rts", IBV_QPT_RC, IBV_QPS_RTS, {}),
            ("rc_rts_512", IBV_QPT_RC, IBV_QPS_RTS, {"pmtu_code": IBV_MTU_512}),
            ("rc_rtr", IBV_QPT_RC, IBV_QPS_RTR, {}),
            ("rc_init", IBV_QPT_RC, IBV_QPS_INIT, {}),
            ("rc_reset", IBV_QPT_RC, IBV_QPS_RESET, {}),
            ("rc_sqd", IBV_QPT_RC, IBV_QPS_SQD, {}),
            ("rc_err", IBV_QPT_RC, IBV_QPS_ERR, {}),
            ("rc_req", IBV_QPT_RC, IBV_QPS_RTS, {"role": "requester"}),
            ("rc_req2", IBV_QPT_RC, IBV_QPS_RTS, {"role": "requester"}),
            ("rc_srq", IBV_QPT_RC, IBV_QPS_RTS, {"srq": self.srq}),
            ("rc_badrq", IBV_QPT_RC, IBV_QPS_RTS, {"bad_rqes": True}),
            ("uc_rts", IBV_QPT_UC, IBV_QPS_RTS, {}),
            ("uc_rtr", IBV_QPT_UC, IBV_QPS_RTR, {}),
            ("uc_badrq", IBV_QPT_UC, IBV_QPS_RTS, {"bad_rqes": True}),
            ("ud_rts", IBV_QPT_UD, IBV_QPS_RTS, {}),
            ("ud_init", IBV_QPT_UD, IBV_QPS_INIT, {}),
            ("ud_badrq", IBV_QPT_UD, IBV_QPS_RTS, {"bad_rqes": True}),
        )
        for name, qp_type, state, kw in spec:
            srq = kw.get("srq")
            cap = QPCap(max_send_wr=32, max_recv_wr=RQ_DEPTH + 8, max_send_sge=2, max_recv_sge=2)
            init = QPInitAttr(qp_type=qp_type, scq=self.scq, rcq=self.rcq, srq=srq, cap=cap,
                              sq_sig_all=1)  # fmt: skip
            qp = QP(self.pd, init)
            self.targets.append(Target(name, qp, state, self._attr(kw), **kw))
        self.by_qpn = {t.qp.qp_num: t for t in self.targets}
        self.requesters = [t for t in self.targets if t.role == "requester"]
        # A type 1 window over the middle of "mwbase", bound through a requester in RTS.
        t = self.requesters[0]
        self._establish(t, post=False)
        self.mw = MW(self.pd, IBV_MW_TYPE_1)
        mwbase = self.regions["mwbase"]
        info = MWBindInfo(mwbase.mr, mwbase.addr + _MW_OFF, _MW_LEN,
                          IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)  # fmt: skip
        t.qp.bind_mw(self.mw, MWBind(info, 0, wr_id=self._next_wr()))
        self.collect()
        assert self.hca.keys.find(self.mw.rkey) is not None, "the window did not bind"
        for t in self.targets:
            self._establish(t)
        self.hca.outbox.clear()
        self.base_counters = Counter(self.hca.counters)

    def _attr(self, kw: dict[str, Any]) -> QPAttr:
        """The QPAttr a target is (re)connected with; PSNs and the like change each time."""
        attr = QPAttr()
        attr.qp_access_flags = ALL_ACCESS
        attr.qkey = QKEY
        attr.path_mtu = kw.get("pmtu_code", IBV_MTU_256)
        attr.max_dest_rd_atomic = attr.max_rd_atomic = 4
        attr.timeout = 8  #: about 1 ms
        attr.retry_cnt = 2
        attr.rnr_retry = 2
        attr.ah_attr = self._ah
        return attr

    def _bytes(self, r: Region) -> memoryview:
        return memoryview(self.mem)[r.offset : r.offset + r.length]

    def _modify(self, t: Target, state: int) -> None:
        attr = self._state_attr
        attr.qp_state = state
        t.qp.modify(attr, IBV_QP_STATE)

    def _establish(self, t: Target, post: bool = True) -> None:
        """RESET, then walk the QP to its state with fresh PSNs; refill its queues."""
        rng = self.rng
        qp = t.qp
        if qp.qp_state != IBV_QPS_RESET:
            self._modify(t, IBV_QPS_RESET)
        self.collect()
        self.hca.outbox.clear()
        t.posted_sends = []
        state = t.state
        if state == IBV_QPS_RESET:
            return
        attr = t.attr
        ud = qp.qp_type == IBV_QPT_UD
        if state in (IBV_QPS_INIT, IBV_QPS_ERR) or not ud:
            qp.to_init(attr)
        if state not in (IBV_QPS_INIT, IBV_QPS_ERR):
            # PSNs near the wrap point half of the time.
            psn = rng.choice((rng.randrange(1 << 24), _M24 - rng.randrange(8)))
            attr.dest_qp_num = 0x100 + rng.randrange(1 << 16)
            attr.min_rnr_timer = rng.randrange(32)
            attr.sq_psn = psn if t.role == "requester" else rng.randrange(1 << 24)
            attr.rq_psn = psn
            if ud:
                qp.to_rts(attr)
            else:
                qp.to_rtr(attr)
                if state in (IBV_QPS_RTS, IBV_QPS_SQD):
                    qp.to_rts(attr)
            if state == IBV_QPS_SQD:
                self._modify(t, IBV_QPS_SQD)
        if post:
            self._post_recvs(t)
        if state == IBV_QPS_ERR:
            self._modify(t, IBV_QPS_ERR)
        elif post and t.role == "requester":
            self._post_sends(t)
        self.collect()
        self.hca.outbox.clear()

    def _next_wr(self) -> int:
        self._wr += 1
        return self._wr

    def _rqe(self, t: Target) -> RecvWR:
        rng = self.rng
        wr_id = self._next_wr()
        if t.bad_rqes and rng.random() < 0.5:
            sges = rng.choice(self._bad_sges)
        else:
            sges = rng.choice(self._good_sges)
        # The low 16 bits of a receive wr_id say how long its buffers are.
        return RecvWR(wr_id << 16 | sum(s.length for s in sges), len(sges), sges)

    def _post_recvs(self, t: Target) -> None:
        """Top the receive queue (or the SRQ) up, with one chained post."""
        if t.srq is not None:
            n = 4 * RQ_DEPTH - t.srq.ring.available()
        else:
            rq = t.eng.rq
            assert rq is not None
            n = RQ_DEPTH - (rq.db - t.eng.resp.rq_next)
        head: RecvWR | None = None
        for _ in range(n):
            wr = self._rqe(t)
            wr.next_wr = head
            head = wr
        if head is not None:
            (t.srq or t.qp).post_recv(head)

    def _post_sends(self, t: Target) -> None:
        rw0, rw1 = self.regions["rw0"], self.regions["rw1"]
        rng = self.rng
        peer_rkey = rng.randrange(1 << 32)
        ops = [
            (IBV_WR_SEND, rw0, 0, rng.randrange(1, 700)),
            (IBV_WR_RDMA_READ, rw1, 0, rng.randrange(1, 900)),
            (IBV_WR_ATOMIC_FETCH_AND_ADD, rw1, 1024, 8),
            (IBV_WR_RDMA_WRITE, rw0, 1024, rng.randrange(0, 600)),
            (IBV_WR_ATOMIC_CMP_AND_SWP, rw1, 1032, 8),
            (IBV_WR_RDMA_READ, rw1, 2048, rng.randrange(1, 300)),
            (IBV_WR_SEND_WITH_IMM, rw0, 2048, rng.randrange(0, 300)),
        ]
        rng.shuffle(ops)
        t.posted_sends = []
        for opcode, r, off, length in ops[: rng.randrange(2, len(ops) + 1)]:
            wr_id = self._next_wr()
            wr = SendWR(wr_id, opcode, 1, sg=[SGE(r.addr + off, length, r.mr.lkey)])
            wr.remote_addr = 0x7000_0000 + rng.randrange(1 << 20) * 8
            wr.rkey_remote = peer_rkey
            wr.compare_add = rng.randrange(1 << 64)
            wr.swap = rng.randrange(1 << 64)
            wr.imm_data = rng.randrange(1 << 32)
            t.qp.post_send(wr)
            t.posted_sends.append(wr_id)
        self.hca.outbox.clear()

    # --- completions -------------------------------------------------------------------
    def _take_cqes(self, cq: CQ) -> list[CQE]:
        """Poll the ring directly: CQ.poll would move the virtual clock when it is empty."""
        ring: CompletionRing = cq.ring
        rings = self.ctx.device.rings
        with self.ctx.lock:
            out = ring.take(ring.capacity)
            for cqe in out:
                wq = rings.get((cqe.wq_kind, cqe.wq_handle))
                if wq is not None:
                    wq.release(cqe.index)
        return out

    def collect(self) -> list[CQE]:
        """Poll both CQs and check every completion; returns the receive completions."""
        for cqe in self._take_cqes(self.scq):
            self._check_cqe(cqe)
            self.send_seen[cqe.wr_id] += 1
        recvs = self._take_cqes(self.rcq)
        for cqe in recvs:
            self._check_cqe(cqe)
            # (a WRITE with immediate reports the WRITE's length, not a buffer's)
            if (cqe.status == IBV_WC_SUCCESS and cqe.opcode == IBV_WC_RECV
                    and cqe.byte_len > cqe.wr_id & 0xFFFF):
                raise self.fail(f"receive of {cqe.byte_len} bytes into a smaller buffer")
        return recvs

    def _check_cqe(self, cqe: CQE) -> None:
        if cqe.status not in _WC_STATUSES:
            raise self.fail(f"completion with unknown status {cqe.status}")
        if cqe.status != IBV_WC_SUCCESS:
            if not cqe.reason:
                raise self.fail(f"failed completion without a reason: status {cqe.status}")
            self.errors_with_reason.add(cqe.qp_num)

    # --- feeding -------------------------------------------------------------------------
    def fail(self, what: str) -> RigFailure:
        return RigFailure(
            f"{what}\n  seed={self.seed} input #{self.stats.inputs} {self.last_input}\n"
            f"  replay: SOFTVERBS_FUZZ_SEED={self.seed} "
            f"SOFTVERBS_FUZZ_INPUTS={self.stats.inputs + 1} pytest {__file__.rsplit('/', 1)[0]}"
        )

    def feed_udp(self, data: bytes, v6: bool, sport: int, *, ip_id: int | None = None,
                 check_icrc: bool = True) -> None:  # fmt: skip
        """One datagram from the peer, as the UDP fabric delivers it."""
        self.stats.inputs += 1
        src, dst = (self.src_ip, self.dst_ip) if not v6 else (_V6_PEER, _V6_DUT)
        try:
            pkt = decode_udp_payload(data, src, dst, sport, check_icrc=check_icrc, ip_id=ip_id)
        except WireError as exc:
            self._decode_error(exc)
            return
        except Exception as exc:
            raise self.fail(f"decode_udp_payload raised {exc!r}") from exc
        self.receive(pkt)

    def feed_frame(self, frame: bytes, check_icrc: bool = True) -> None:
        """One captured Ethernet frame."""
        self.stats.inputs += 1
        try:
            pkt = decode_frame(frame, check_icrc)
        except WireError as exc:
            self._decode_error(exc)
            return
        except Exception as exc:
            raise self.fail(f"decode_frame raised {exc!r}") from exc
        self.receive(pkt)

    def _decode_error(self, exc: WireError) -> None:
        if exc.reason not in REASONS:
            raise self.fail(f"unknown WireError reason {exc.reason!r}")
        counters = self.hca.counters
        counters["rcvd_pkts"] += 1  # as the UDP fabric counts it
        counters[f"drop_{exc.reason}"] += 1
        self.stats.decode_errors += 1
        self.stats.dropped += 1
        self.stats.outcomes[f"drop_{exc.reason}"] += 1

    def _fingerprint(self, eng: QPEngine | None) -> tuple[Any, ...]:
        if eng is None:
            return ()
        inflight = eng.comp.inflight
        req, comp, resp = eng.req, eng.comp, eng.resp
        return (
            eng.state, resp.epsn, resp.msn, resp.msg, resp.off, resp.rq_next,
            resp.nak_sent, resp.rqe is not None, req.npsn, comp.una,
            req.rd_out, comp.rnr_until, comp.deadline, comp.retry_left, comp.rnr_left,
            comp.resending, req.blocked, eng.comm_established, len(resp.replay),
            len(inflight), sum(w.rxd + 100 * w.state + 10000 * w.tx for w in inflight),
            self.scq.ring.waiting(), self.rcq.ring.waiting(),
            self.srq.ring.available(), len(self.ctx.events),
        )  # fmt: skip

    def receive(self, pkt: Packet) -> None:
        """HCA.receive one decoded packet and judge what it did."""
        hca = self.hca
        counters = hca.counters
        eng = hca.qps.get(pkt.dqpn)
        before = self._fingerprint(eng)  # type: ignore[arg-type]
        c0 = dict(counters)
        now = self.clock.now()
        with self.ctx.lock:
            try:
                hca.receive(pkt, now)
            except Exception as exc:
                raise self.fail(f"HCA.receive raised {exc!r} for {pkt!r}") from exc
        sent = self.drain_outbox()
        after = self._fingerprint(eng)  # type: ignore[arg-type]
        delta = Counter({k: v - c0.get(k, 0) for k, v in counters.items() if v != c0.get(k, 0)})
        if delta["rcvd_pkts"] != 1:
            raise self.fail(f"rcvd_pkts moved by {delta['rcvd_pkts']} for one packet")
        drops = [k for k in delta if is_drop_counter(k)]
        others = [k for k in delta if k != "rcvd_pkts" and not is_drop_counter(k)]
        if len(drops) > 1 or (drops and delta[drops[0]] != 1):
            raise self.fail(f"one packet counted as several drops: {dict(delta)} for {pkt!r}")
        if drops:
            self.stats.dropped += 1
            self.stats.outcomes[drops[0]] += 1
            for k in others:
                self.stats.outcomes[k] += 1
        elif before == after and not sent and not others:
            if self.explore:
                info = OPINFO[pkt.opcode]
                key = f"SILENT {info.name if info else pkt.opcode}"
                self.stats.outcomes[key] += 1
                self.stats.examples.setdefault(key, f"{pkt!r} QP {_describe(eng)}")
                self.stats.accepted += 1
                return
            raise self.fail(
                f"silent drop: {pkt!r} changed nothing and moved no counter "
                f"(QP {_describe(eng)})"
            )
        else:
            self.stats.accepted += 1
            for k in others:
                self.stats.outcomes[k] += 1
            if not others:
                self.stats.outcomes["accepted"] += 1
        # (a dropped response can still end a retry episode in failure: check every time)
        t = self.by_qpn.get(pkt.dqpn)
        if t is not None and not self.in_check and t.name not in self.renew:
            self._maybe_renew(t)

    def _maybe_renew(self, t: Target) -> None:
        """A QP that fell into ERR, or a requester with nothing left to do: check, renew."""
        eng = t.eng
        sq = eng.sq
        fell = eng.state == IBV_QPS_ERR and t.state != IBV_QPS_ERR
        idle = (t.role == "requester" and eng.state == IBV_QPS_RTS and not eng.comp.inflight
                and sq is not None and eng.req.sq_next >= sq.db)  # fmt: skip
        if not (fell or idle):
            return
        self.collect()
        if fell and not eng.last_error and eng.qpn not in self.errors_with_reason:
            raise self.fail(f"{t.name} went to ERR without a reason: {_describe(eng)}")
        self._check_sends(t)
        self.renew.add(t.name)  # soon (renew_due): meanwhile it drops what it gets

    def renew_due(self) -> None:
        """Put the QPs that fell (or went idle) back into their states."""
        for t in self.targets:
            if t.name in self.renew:
                self.stats.outcomes["renewed " + t.name] += 1
                self._establish(t)
        self.renew.clear()

    def drain_outbox(self) -> int:
        """Take what the device sent; every packet must encode and read only MR memory."""
        outbox = self.hca.outbox
        n = 0
        while outbox:
            pkt = outbox.popleft()
            n += 1
            payload = pkt.payload
            if isinstance(payload, memoryview) and payload.nbytes and not payload.readonly:
                addr = ctypes.addressof(ctypes.c_char.from_buffer(payload))
                end = addr + payload.nbytes
                if not any(lo <= addr and end <= hi for lo, hi in self.mr_ranges):
                    raise self.fail(f"sent bytes [{addr:#x}, {end:#x}) outside every region")
            try:
                encode_udp_payload(pkt, _ip(pkt.sgid), _ip(pkt.dgid), pkt.sport or 4791)
            except Exception as exc:
                raise self.fail(f"the device sent a packet that does not encode: {exc!r}") from exc
        return n

    # --- batches -------------------------------------------------------------------------
    def check_memory(self) -> None:
        mem = self.mem
        for c in self.canaries:
            if mem[c : c + CANARY_LEN] != CANARY:
                raise self.fail(f"canary at offset {c} was overwritten")
        for (lo, hi), was_guard in zip(self.guards, self.guard_bytes, strict=True):
            if mem[lo:hi] != was_guard:
                raise self.fail(f"guard bytes [{lo}, {hi}) around the regions changed")
        for name, r in self.regions.items():
            now = self._bytes(r)
            was = self.snapshot[name]
            if r.immutable and now != was:
                raise self.fail(f"region {name} (no way to write it) changed")
            if name == "mwbase" and (now[:_MW_OFF] != was[:_MW_OFF]
                                     or now[_MW_OFF + _MW_LEN :] != was[_MW_OFF + _MW_LEN :]):
                raise self.fail("mwbase changed outside its memory window")  # fmt: skip

    def check_batch(self) -> None:
        """The per-batch invariants (module docstring), then re-establish every QP."""
        self.in_check = True
        try:
            self._check_batch()
        finally:
            self.in_check = False

    def _check_batch(self) -> None:
        self.stats.batches += 1
        self.check_memory()
        self.collect()
        for t in self.requesters:
            self._settle_requester(t)
        for ev in self.ctx.events:
            if ev.event_type in _ERROR_EVENTS and not ev.reason:
                raise self.fail(f"async event {ev.event_type} without a reason")
        self.ctx.events.clear()
        for t in self.targets:
            eng = t.eng
            if eng.state == IBV_QPS_ERR and t.state != IBV_QPS_ERR:
                if not eng.last_error and eng.qpn not in self.errors_with_reason:
                    raise self.fail(f"{t.name} went to ERR without a reason")
            elif t.role == "responder":
                self._probe(t)
        self.check_memory()
        for t in self.targets:
            # A QP still in its state keeps its PSNs and is only given receive WQEs.
            if t.eng.state != t.state or t.role == "requester" or t.name in self.renew:
                self._establish(t)
            elif t.state != IBV_QPS_RESET:
                self._post_recvs(t)
        self.errors_with_reason.clear()
        self.renew.clear()

    def _settle_requester(self, t: Target) -> None:
        """Run the clock until every posted send WQE completed exactly once."""
        eng = t.eng
        sq = eng.sq
        assert sq is not None
        for _ in range(64):
            if not eng.comp.inflight and eng.req.sq_next >= sq.db:
                break
            deadline = self.hca.next_deadline()
            if deadline is None:
                break
            self.clock.advance(deadline)
            with self.ctx.lock:
                self.hca.run_timers(self.clock.now())
            self.drain_outbox()
        self.collect()
        if eng.state != IBV_QPS_ERR and (eng.comp.inflight or eng.req.sq_next < sq.db):
            raise self.fail(f"{t.name}: send WQEs never completed: {_describe(eng)}")
        self._check_sends(t)

    def _check_sends(self, t: Target) -> None:
        seen = self.send_seen
        wrong = {w: seen[w] for w in t.posted_sends if seen[w] != 1}
        for w in t.posted_sends:
            del seen[w]
        t.posted_sends = []
        if wrong:
            raise self.fail(f"{t.name}: send WQEs completed this many times: {wrong}")

    def _probe(self, t: Target) -> None:
        """A well-formed SEND must still be received (unless mid-message or not receiving)."""
        eng = t.eng
        if eng.state not in (IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD):
            return
        if eng.resp.msg in (Msg.SEND, Msg.WRITE) and eng.transport != Transport.UC:
            return  # a multi-packet message is open: a new SEND would be a sequence error
        self.collect()
        self._post_recvs(t)
        self.stats.probes += 1
        payload = self.rng.randbytes(self.rng.randrange(1, 200))
        pkt = Packet(Transport(eng.transport) | Op.SEND_ONLY, eng.qpn, eng.resp.epsn, payload)
        pkt.ackreq = True
        pkt.qkey = QKEY
        pkt.src_qp = 0x77
        msn = eng.resp.msn
        data = bytes(encode_udp_payload(_addressed(pkt, self), self.src_ip, self.dst_ip, 0xC123))
        self.last_input = f"probe of {t.name}: udp4 {data.hex()}"
        self.feed_udp(data, False, 0xC123)
        cqes = [c for c in self.collect() if c.qp_num == eng.qpn]
        if t.bad_rqes and (eng.state == IBV_QPS_ERR or any(c.status for c in cqes)):
            if not eng.last_error and not any(c.reason for c in cqes if c.status):
                raise self.fail(f"probe of {t.name} failed without a reason")
            return
        ok = [c for c in cqes if c.status == IBV_WC_SUCCESS]
        if len(ok) != 1 or len(cqes) != 1:
            raise self.fail(f"probe of {t.name} was not received: {cqes!r}, QP {_describe(eng)}")
        grh = 40 if eng.qp_type == IBV_QPT_UD else 0
        if ok[0].byte_len != len(payload) + grh:
            raise self.fail(f"probe of {t.name}: byte_len {ok[0].byte_len}")
        if eng.reliable and eng.resp.msn != (msn + 1) & _M24:
            raise self.fail(f"probe of {t.name}: MSN {msn} -> {eng.resp.msn}")


_ERROR_EVENTS = frozenset({IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR})
_V6_PEER = b"\xfd" + bytes(14) + b"\x02"
_V6_DUT = b"\xfd" + bytes(14) + b"\x01"


def _ip(gid: bytes) -> bytes:
    return gid[12:] if gid[:12] == IPV4_MAPPED_PREFIX else gid


def _addressed(pkt: Packet, rig: ReceiveRig) -> Packet:
    pkt.sgid = IPV4_MAPPED_PREFIX + rig.src_ip
    pkt.dgid = IPV4_MAPPED_PREFIX + rig.dst_ip
    return pkt


def _describe(eng: QPEngine | None) -> str:
    if eng is None:
        return "none"
    return (f"qpn={eng.qpn:#x} type={eng.qp_type} state={eng.state} epsn={eng.resp.epsn} "
            f"msg={eng.resp.msg.name} una={eng.comp.una} npsn={eng.req.npsn} "
            f"inflight={len(eng.comp.inflight)} "
            f"last_error={eng.last_error!r}")  # fmt: skip


# --- framing -----------------------------------------------------------------------------------

_IPV4 = struct.Struct(">BBHHHBBH4s4s")
_IPV6 = struct.Struct(">IHBB16s16s")
_UDP = struct.Struct(">HHHH")


def ip_header(v6: bool, payload_len: int, src: bytes, dst: bytes, ip_id: int = 0) -> bytes:
    """The IP header a sender writes for ``payload_len`` bytes of UDP (header included)."""
    if v6:
        return _IPV6.pack(0x60000000, payload_len, 17, 64, src, dst)
    hdr = bytearray(_IPV4.pack(0x45, 0, 20 + payload_len, ip_id, 0x4000, 64, 17, 0, src, dst))
    s = sum(struct.unpack(">10H", hdr))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    struct.pack_into(">H", hdr, 10, ~s & 0xFFFF)
    return bytes(hdr)


def sign(transport: bytes, v6: bool, src: bytes, dst: bytes, sport: int,
         ip_id: int = 0) -> bytes:  # fmt: skip
    """``transport`` + the ICRC a sender with these addresses and IP ID computes."""
    ulen = 8 + len(transport) + 4
    ip = ip_header(v6, ulen, src, dst, ip_id)
    udp = _UDP.pack(sport, 4791, ulen, 0)
    return transport + struct.pack("<I", icrc(ip, udp, transport))


def frame(transport: bytes, v6: bool, src: bytes, dst: bytes, sport: int, *,
          good_icrc: bool = True, ip_id: int = 0) -> bytes:  # fmt: skip
    """An Ethernet frame around ``transport`` bytes, ICRC right or wrong."""
    ulen = 8 + len(transport) + 4
    ip = ip_header(v6, ulen, src, dst, ip_id)
    udp = _UDP.pack(sport, 4791, ulen, 0)
    crc = icrc(ip, udp, transport) if good_icrc else zlib.crc32(transport) ^ 0x5A5A
    eth = b"\x02\x00" + dst[-4:] + b"\x02\x00" + src[-4:] + (b"\x86\xdd" if v6 else b"\x08\x00")
    return eth + ip + udp + transport + struct.pack("<I", crc)


# --- the mutator ---------------------------------------------------------------------------------


class Mutator:
    """Inputs from a seeded RNG: a template for the QP's state, then mutations."""

    def __init__(self, rig: ReceiveRig, seed: int) -> None:
        self.rig = rig
        self.rng = random.Random(seed)
        self.weights = [4 if t.role == "requester" else 2 if t.state in (IBV_QPS_RTS,
                        IBV_QPS_RTR) else 1 for t in rig.targets]  # fmt: skip
        self.field_mutators: list[Callable[[Packet, Target], None]] = [
            self._m_opcode, self._m_psn, self._m_dqpn, self._m_pkey, self._m_qkey,
            self._m_va, self._m_rkey, self._m_dma_len, self._m_syndrome, self._m_msn,
            self._m_payload, self._m_flags, self._m_misc,
        ]  # fmt: skip

    # --- one input -----------------------------------------------------------------------
    def step(self) -> None:
        rng = self.rng
        rig = self.rig
        t = rng.choices(rig.targets, self.weights)[0]
        r = rng.random()
        if r < 0.03:
            data = rng.randbytes(rng.randrange(0, 80))
            transport = data
        else:
            pkt = self.template(t)
            for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
                rng.choice(self.field_mutators)(pkt, t)
            transport = bytes(encode_transport(pkt))
            if rng.random() < 0.25:
                transport = self.mutate_bytes(transport)
        v6 = rng.random() < 0.25
        src, dst = (_V6_PEER, _V6_DUT) if v6 else (rig.src_ip, rig.dst_ip)
        how = rng.random()
        if how < 0.2:
            good = rng.random() < 0.9
            f = frame(transport, v6, src, dst, 0xC000 + rng.randrange(0x4000), good_icrc=good,
                      ip_id=rng.randrange(1 << 16))  # fmt: skip
            if rng.random() < 0.05:
                f = self.mutate_bytes(f, headers=True)
            rig.last_input = f"frame {f.hex()}"
            rig.feed_frame(f, check_icrc=rng.random() < 0.95)
            return
        sport = 0xC000 | ((len(transport) + 4) & 0x3FFF)
        ip_id = rng.randrange(1 << 16) if not v6 and rng.random() < 0.1 else 0
        if rng.random() < 0.92:
            data = sign(transport, v6, src, dst, sport, ip_id)
        else:
            data = transport + rng.randbytes(4)
        rig.last_input = f"udp{'6' if v6 else '4'} {data.hex()}"
        rig.feed_udp(data, v6, sport, ip_id=ip_id if ip_id and rng.random() < 0.5 else None)

    # --- templates -------------------------------------------------------------------------
    def template(self, t: Target) -> Packet:
        eng = t.eng
        if t.role == "requester" and self.rng.random() < 0.85:
            pkt = self._response(t)
        elif eng.qp_type == IBV_QPT_UD:
            pkt = self._ud(t)
        else:
            pkt = self._request(t)
        return _addressed(pkt, self.rig)

    def _region(self) -> Region:
        names = ("rw0", "rw0", "rw1", "zb", "ro", "local", "other_pd", "mw")
        name = self.rng.choice(names)
        if name == "mw":
            mwbase = self.rig.regions["mwbase"]
            return Region("mw", mwbase.offset + _MW_OFF, _MW_LEN, ALL_ACCESS, mwbase.mr, False,
                          mwbase.addr + _MW_OFF, mwbase.addr + _MW_OFF)  # fmt: skip
        return self.rig.regions[name]

    def _rkey(self, r: Region) -> int:
        return self.rig.mw.rkey if r.name == "mw" else r.rkey

    def _psn(self, eng: QPEngine, base: int) -> int:
        rng = self.rng
        x = rng.random()
        if x < 0.8:
            return base
        if x < 0.9:
            return (base - rng.randrange(1, 4)) & _M24
        return (base + rng.randrange(1, 6)) & _M24

    def _request(self, t: Target) -> Packet:
        rng = self.rng
        eng = t.eng
        tr = Transport(eng.transport)
        pmtu = eng.pmtu
        kind = {Msg.SEND: Kind.SEND, Msg.WRITE: Kind.WRITE}.get(eng.resp.msg)
        psn = self._psn(eng, eng.resp.epsn)
        if kind == Kind.SEND and rng.random() < 0.85:
            last = rng.random() < 0.4
            op = rng.choice((Op.SEND_LAST, Op.SEND_LAST_WITH_IMMEDIATE)) if last else Op.SEND_MIDDLE
            n = rng.randrange(1, pmtu + 1) if last else pmtu
            return self._fill(Packet(tr | op, eng.qpn, psn, rng.randbytes(n)))
        if kind == Kind.WRITE and rng.random() < 0.85 and eng.resp.wview is not None:
            left = len(eng.resp.wview) - eng.resp.off
            if left > pmtu:
                op, n = Op.RDMA_WRITE_MIDDLE, pmtu
            else:
                op = rng.choice((Op.RDMA_WRITE_LAST, Op.RDMA_WRITE_LAST_WITH_IMMEDIATE))
                n = left
            return self._fill(Packet(tr | op, eng.qpn, psn, rng.randbytes(n)))
        ops = [Op.SEND_ONLY, Op.SEND_ONLY_WITH_IMMEDIATE, Op.SEND_FIRST, Op.RDMA_WRITE_ONLY,
               Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE, Op.RDMA_WRITE_FIRST]  # fmt: skip
        if tr is Transport.RC:
            ops += [Op.SEND_ONLY_WITH_INVALIDATE, Op.RDMA_READ_REQUEST, Op.RDMA_READ_REQUEST,
                    Op.COMPARE_SWAP, Op.FETCH_ADD]  # fmt: skip
        op = rng.choice(ops)
        info = OPINFO[tr | op]
        assert info is not None
        pkt = Packet(tr | op, eng.qpn, psn)
        if info.kind is Kind.SEND:
            n = pmtu if op == Op.SEND_FIRST else rng.randrange(0, pmtu + 1)
            pkt.payload = rng.randbytes(n)
        elif info.kind is Kind.WRITE or info.kind is Kind.READ_REQ:
            r = self._region()
            total = rng.randrange(0, min(r.length, 3 * pmtu) + 1)
            if op == Op.RDMA_WRITE_FIRST:
                total = max(total, pmtu + 1) if r.length > pmtu else pmtu
            elif info.kind is Kind.WRITE:
                total = min(total, pmtu)
            total = min(total, r.length)
            off = rng.randrange(0, r.length - total + 1)
            pkt.va = r.iova + off
            pkt.rkey = self._rkey(r)
            pkt.dma_len = total
            if info.kind is Kind.WRITE:
                pkt.payload = rng.randbytes(pmtu if op == Op.RDMA_WRITE_FIRST else total)
        else:  # atomics
            r = self._region()
            pkt.va = r.iova + rng.randrange(0, r.length // 8) * 8
            pkt.rkey = self._rkey(r)
            pkt.swap_add = rng.randrange(1 << 64)
            pkt.compare = rng.randrange(1 << 64)
        return self._fill(pkt)

    def _fill(self, pkt: Packet) -> Packet:
        rng = self.rng
        pkt.ackreq = rng.random() < 0.7
        pkt.imm = rng.randrange(1 << 32)
        pkt.inv_rkey = rng.choice((self.rig.mw.rkey, self.rig.regions["rw0"].rkey,
                                   rng.randrange(1 << 32)))  # fmt: skip
        pkt.se = rng.random() < 0.3
        return pkt

    def _ud(self, t: Target) -> Packet:
        rng = self.rng
        eng = t.eng
        op = rng.choice((Op.SEND_ONLY, Op.SEND_ONLY_WITH_IMMEDIATE))
        pkt = Packet(Transport.UD | op, eng.qpn, rng.randrange(1 << 24),
                     rng.randbytes(rng.randrange(0, eng.pmtu + 1)))  # fmt: skip
        pkt.qkey = QKEY if rng.random() < 0.9 else rng.randrange(1 << 32)
        pkt.src_qp = rng.randrange(1 << 24)
        return self._fill(pkt)

    def _response(self, t: Target) -> Packet:
        rng = self.rng
        eng = t.eng
        tr = Transport(eng.transport)
        pmtu = eng.pmtu
        wqes = [w for w in eng.comp.inflight if w.npkts]
        w = rng.choice(wqes) if wqes else None
        x = rng.random()
        pkt = Packet(tr | Op.ACKNOWLEDGE, eng.qpn, eng.comp.una)
        pkt.msn = rng.randrange(1 << 24)
        if w is not None and x < 0.45:
            klass = WR_INFO[w.opcode].klass
            if klass is WrClass.READ:
                i = min(w.rxd, w.npkts - 1) if rng.random() < 0.8 else rng.randrange(w.npkts)
                n = w.npkts
                op = (Op.RDMA_READ_RESPONSE_ONLY if n == 1 else
                      Op.RDMA_READ_RESPONSE_FIRST if i == 0 else
                      Op.RDMA_READ_RESPONSE_LAST if i == n - 1 else
                      Op.RDMA_READ_RESPONSE_MIDDLE)  # fmt: skip
                size = pmtu if i < n - 1 else w.length - (n - 1) * pmtu
                pkt = Packet(tr | op, eng.qpn, (w.psn + i) & _M24, rng.randbytes(size))
                pkt.syndrome = aeth_syndrome(AETH_ACK, AETH_CREDIT_INVALID)
                return pkt
            if klass is WrClass.ATOMIC:
                pkt = Packet(tr | Op.ATOMIC_ACKNOWLEDGE, eng.qpn, w.psn)
                pkt.syndrome = aeth_syndrome(AETH_ACK, AETH_CREDIT_INVALID)
                pkt.orig = rng.randrange(1 << 64)
                return pkt
            pkt.psn = (w.psn + w.npkts - 1) & _M24
            pkt.syndrome = aeth_syndrome(AETH_ACK, AETH_CREDIT_INVALID)
            return pkt
        if x < 0.65:
            una, npsn = eng.comp.una, eng.req.npsn
            choices = [una, (una - 1) & _M24, (npsn - 1) & _M24, npsn]
            pkt.psn = rng.choice(choices)
            pkt.syndrome = aeth_syndrome(AETH_ACK, AETH_CREDIT_INVALID)
        elif x < 0.8:
            code = rng.choice((0, 0, 1, 2, 3, 4, rng.randrange(32)))
            pkt.syndrome = aeth_syndrome(AETH_NAK, code)
            pkt.psn = rng.choice((eng.comp.una, w.psn if w else eng.req.npsn))
        elif x < 0.9:
            pkt.syndrome = aeth_syndrome(AETH_RNR_NAK, rng.randrange(32))
            pkt.psn = rng.choice((eng.comp.una, w.psn if w else eng.req.npsn))
        else:
            pkt.syndrome = rng.randrange(256)
            pkt.psn = self._psn(eng, eng.comp.una)
        return pkt

    # --- field mutations -----------------------------------------------------------------
    def _m_opcode(self, pkt: Packet, t: Target) -> None:
        rng = self.rng
        if rng.random() < 0.5:
            same = [o for o in _OPCODES if (o & 0xE0) == (pkt.opcode & 0xE0)]
            pkt.opcode = rng.choice(same)
        else:
            pkt.opcode = rng.choice(_OPCODES)

    def _m_psn(self, pkt: Packet, t: Target) -> None:
        rng = self.rng
        pkt.psn = rng.choice((rng.randrange(1 << 24), (pkt.psn + (1 << 23)) & _M24,
                              (pkt.psn - 1) & _M24, (pkt.psn + 1) & _M24, 0, _M24))  # fmt: skip

    def _m_dqpn(self, pkt: Packet, t: Target) -> None:
        rng = self.rng
        pkt.dqpn = rng.choice((rng.randrange(1 << 24), 0, 1,
                               rng.choice(self.rig.targets).qp.qp_num))  # fmt: skip

    def _m_pkey(self, pkt: Packet, t: Target) -> None:
        pkt.pkey = self.rng.choice((0x7FFF, 0x0000, 0x8000, 0xFFFE, self.rng.randrange(1 << 16)))

    def _m_qkey(self, pkt: Packet, t: Target) -> None:
        pkt.qkey = self.rng.choice((0, QKEY ^ 1, 0x80000000 | QKEY, self.rng.randrange(1 << 32)))

    def _m_va(self, pkt: Packet, t: Target) -> None:
        rng = self.rng
        r = self._region()
        pkt.va = rng.choice((
            r.iova - 1, r.iova + r.length - 1, r.iova + r.length, r.iova + r.length - 8,
            r.iova - 8, 0, (1 << 64) - 1, (1 << 64) - 8, r.iova + rng.randrange(r.length) | 1,
            rng.randrange(1 << 64),
        ))  # fmt: skip
        pkt.va &= (1 << 64) - 1

    def _m_rkey(self, pkt: Packet, t: Target) -> None:
        rng = self.rng
        keys = [r.rkey for r in self.rig.regions.values()] + [self.rig.mw.rkey]
        k = rng.choice(keys)
        pkt.rkey = rng.choice((k, k ^ 1, (k + 0x100) & 0xFFFFFFFF, 0, 0xFFFFFFFF,
                               rng.randrange(1 << 32)))  # fmt: skip

    def _m_dma_len(self, pkt: Packet, t: Target) -> None:
        rng = self.rng
        n = pkt.dma_len
        pkt.dma_len = rng.choice((0, 1, n - 1 if n else 0, n + 1, n + t.eng.pmtu, 1 << 31,
                                  0xFFFFFFFF, rng.randrange(1 << 32))) & 0xFFFFFFFF  # fmt: skip

    def _m_syndrome(self, pkt: Packet, t: Target) -> None:
        rng = self.rng
        pkt.syndrome = rng.choice((rng.randrange(256), aeth_syndrome(rng.randrange(4),
                                   rng.randrange(32)), 0x40 | rng.randrange(32)))  # fmt: skip

    def _m_msn(self, pkt: Packet, t: Target) -> None:
        pkt.msn = self.rng.randrange(1 << 24)

    def _m_payload(self, pkt: Packet, t: Target) -> None:
        rng = self.rng
        pmtu = t.eng.pmtu
        n = rng.choice((0, 1, 3, pmtu - 1, pmtu, pmtu + 1, pmtu + 4, 2 * pmtu, rng.randrange(1500)))
        pkt.payload = rng.randbytes(n)

    def _m_flags(self, pkt: Packet, t: Target) -> None:
        rng = self.rng
        pkt.ackreq = not pkt.ackreq
        pkt.se = rng.random() < 0.5
        pkt.mig = rng.random() < 0.5
        pkt.fecn = rng.random() < 0.5
        pkt.becn = rng.random() < 0.5

    def _m_misc(self, pkt: Packet, t: Target) -> None:
        rng = self.rng
        which = rng.randrange(6)
        if which == 0:
            pkt.srqn = rng.choice((self.rig.srq.ring.srqn, rng.randrange(1 << 24)))
        elif which == 1:
            pkt.inv_rkey = rng.randrange(1 << 32)
        elif which == 2:
            pkt.src_qp = rng.randrange(1 << 24)
        elif which == 3:
            pkt.orig = rng.randrange(1 << 64)
        elif which == 4:
            pkt.swap_add, pkt.compare = rng.randrange(1 << 64), rng.randrange(1 << 64)
        else:
            pkt.imm = rng.randrange(1 << 32)

    # --- byte mutations --------------------------------------------------------------------
    def mutate_bytes(self, data: bytes, headers: bool = False) -> bytes:
        rng = self.rng
        buf = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            k = rng.randrange(8)
            n = len(buf)
            if k == 0 and n:
                buf[rng.randrange(n)] ^= 1 << rng.randrange(8)
            elif k == 1 and n:
                buf[rng.randrange(n)] = rng.randrange(256)
            elif k == 2:
                del buf[rng.randrange(n + 1) :]
            elif k == 3:
                buf += rng.randbytes(rng.randrange(1, 12))
            elif k == 4 and n > 1 and not headers:
                buf[1] = (buf[1] & 0xCF) | (rng.randrange(4) << 4)  # pad count
            elif k == 5 and n > 1 and not headers:
                buf[1] = (buf[1] & 0xF0) | rng.choice((0, 0, 1, 15))  # TVer
            elif k == 6 and n and not headers:
                buf[0] = rng.randrange(256)  # opcode: any byte
            elif k == 7 and n > 8:
                a = rng.randrange(n)
                b = rng.randrange(a, min(n, a + 16) + 1)
                buf[a:b] = rng.randbytes(rng.randrange(0, 16))
        return bytes(buf)


def run(seed: int, inputs: int, batch: int = 200,
        progress: Callable[[ReceiveRig], None] | None = None) -> Stats:  # fmt: skip
    """Feed ``inputs`` fuzz inputs; raise RigFailure on the first broken invariant."""
    with ReceiveRig(seed) as rig:
        mut = Mutator(rig, seed)
        done = 0
        while done < inputs:
            n = min(batch, inputs - done)
            for i in range(n):
                mut.step()
                if i % RENEW_EVERY == RENEW_EVERY - 1:
                    rig.renew_due()
            done += n
            rig.check_batch()
            if progress is not None:
                progress(rig)
        c = rig.hca.counters
        s = rig.stats
        moved = c["rcvd_pkts"] - rig.base_counters["rcvd_pkts"]
        if moved != s.accepted + s.dropped:
            raise rig.fail(f"rcvd_pkts {moved} != accepted {s.accepted} + dropped {s.dropped}")
        s.outcomes["rcvd_pkts"] = moved
        return s
