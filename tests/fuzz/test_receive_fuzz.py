"""Fuzz the whole receive path: malformed bytes -> decoder -> HCA.receive -> live QPs.

The rig and the mutator are in :mod:`receive_rig` (read its docstring for the
QPs, the memory layout and every invariant checked).  The CI run feeds
100,000 seeded inputs (about 10 s of CPU); ``SOFTVERBS_FUZZ_INPUTS`` asks for
more and ``SOFTVERBS_FUZZ_SEED`` picks another seed::

    SOFTVERBS_FUZZ_INPUTS=5000000 SOFTVERBS_FUZZ_SEED=7 pytest -s tests/fuzz

A failure names the seed and the input (as hex) and how to replay it.
Coverage-guided fuzzing of the same rig: ``tests/fuzz/atheris_receive.py``.

The regression tests at the end are the bugs this fuzzer found, written out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from receive_rig import ReceiveRig, RigFailure, run

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
    SendWR,
)
from softverbs.engine.qp import QPEngine
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_MTU_256,
    IBV_QPS_ERR,
    IBV_QPT_RC,
    IBV_WC_SUCCESS,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
)
from softverbs.sim import Simulation
from softverbs.wire.opcodes import (
    AETH_ACK,
    AETH_CREDIT_INVALID,
    AETH_NAK,
    AETH_RNR_NAK,
    NAK_PSN_SEQUENCE_ERROR,
    NAK_REMOTE_OPERATIONAL_ERROR,
    OPINFO,
    Kind,
    Op,
    Transport,
    aeth_syndrome,
)
from softverbs.wire.packet import Packet

SEED = int(os.environ.get("SOFTVERBS_FUZZ_SEED", "20240611"))
INPUTS = int(os.environ.get("SOFTVERBS_FUZZ_INPUTS", "100000"))

#: Outcomes the CI run must reach, or the fuzzer is not getting deep enough.
MUST_SEE = (
    "drop_icrc_error", "drop_truncated", "drop_bad_opcode", "drop_bad_pad", "drop_bad_tver",
    "drop_not_rocev2", "drop_unknown_qp", "drop_qp_state", "drop_bad_pkey",
    "drop_transport_mismatch", "qkey_violation", "drop_no_rqe", "drop_uc_missing_packet",
    "drop_uc_access", "drop_duplicate_too_old", "drop_unexpected_response", "drop_bad_aeth",
    "drop_bad_read_response", "drop_response_after_gap", "duplicate_request",
    "duplicate_response", "out_of_seq_request", "implied_nak_seq_err", "rcvd_rnr_err",
    "rcvd_seq_err", "rdma_recvs", "rdma_sends", "resp_invalid_request",
    "resp_remote_access_err", "resp_local_err", "uc_resync", "ack_deferred", "send_err",
)  # fmt: skip


def test_receive_path_fuzz() -> None:
    print(f"receive-path fuzz: seed={SEED} inputs={INPUTS}")
    t0 = time.perf_counter()
    last = [t0]

    def progress(rig: ReceiveRig) -> None:
        now = time.perf_counter()
        if now - last[0] > 30:
            last[0] = now
            print(f"  {rig.stats.inputs} inputs, {now - t0:.0f} s", flush=True)

    try:
        stats = run(SEED, INPUTS, progress=progress)
    except RigFailure:
        raise
    except Exception as exc:  # a bug in the rig itself: still say how to replay it
        raise AssertionError(f"seed={SEED}: {exc!r}") from exc
    elapsed = time.perf_counter() - t0
    print(f"  {stats.inputs} inputs ({stats.probes} probes, {stats.batches} batches) in "
          f"{elapsed:.1f} s: {stats.accepted} accepted, {stats.dropped} dropped")  # fmt: skip
    for name, n in sorted(stats.outcomes.items()):
        print(f"    {name}: {n}")
    assert stats.accepted + stats.dropped == stats.outcomes["rcvd_pkts"]
    if INPUTS >= 50_000:
        missing = [name for name in MUST_SEE if not stats.outcomes[name]]
        assert not missing, f"seed={SEED}: the fuzzer never reached {missing}"


def test_fuzz_run_is_deterministic() -> None:
    a = run(SEED + 1, 3000)
    b = run(SEED + 1, 3000)
    c = run(SEED + 2, 3000)
    assert a.outcomes == b.outcomes
    assert (a.accepted, a.dropped, a.probes) == (b.accepted, b.dropped, b.probes)
    assert a.outcomes != c.outcomes


def test_every_opcode_reaches_the_engine() -> None:
    """Every opcode in OPINFO, well-formed, reaches a QP of every type and is judged."""
    with ReceiveRig(SEED) as rig:
        for t in rig.targets:
            for opcode, info in enumerate(OPINFO):
                if info is None:
                    continue
                payload = b"x" * 8 if info.payload else b""
                pkt = Packet(opcode, t.qp.qp_num, t.eng.resp.epsn, payload)
                pkt.qkey = 0x11111111
                rig.last_input = f"{info.name} to {t.name}"
                rig.receive(_addressed(rig, pkt))
            rig.check_batch()


def _addressed(rig: ReceiveRig, pkt: Packet) -> Packet:
    pkt.sgid = b"\x00" * 10 + b"\xff\xff" + rig.src_ip
    pkt.dgid = b"\x00" * 10 + b"\xff\xff" + rig.dst_ip
    return pkt


# --- regressions found by the fuzzer -----------------------------------------------------------


@dataclass
class Lone:
    """An RC requester whose peer QP does not exist: the test plays the responder."""

    sim: Simulation
    ctx: Context
    qp: QP
    cq: CQ
    mr: MR

    @property
    def eng(self) -> QPEngine:
        return self.qp.engine

    def respond(self, opcode: Op, psn: int, syndrome: int, payload: bytes = b"") -> None:
        pkt = Packet(Transport.RC | opcode, self.qp.qp_num, psn & 0xFFFFFF, payload)
        pkt.syndrome = syndrome
        pkt.sgid = bytes(self.eng.route.dgid)
        pkt.dgid = bytes(self.eng.route.sgid)
        with self.ctx.lock:
            self.ctx.hca.receive(pkt, self.sim.now)
            self.ctx.runtime.progress()

    def post(self, wr_id: int, opcode: int, length: int, offset: int = 0) -> None:
        wr = SendWR(wr_id, opcode, 1, sg=[SGE(self.mr.buf + offset, length, self.mr.lkey)])
        wr.remote_addr = 0x1000
        wr.rkey_remote = 0x1234
        self.qp.post_send(wr)

    def sent(self) -> list[Packet]:
        out = list(self.tap)
        self.tap.clear()
        return out

    tap: list[Packet]


class _Tap(list[Packet]):
    def write_packet(self, pkt: Packet, ts: float | None = None) -> None:
        if OPINFO[pkt.opcode] is not None and pkt.sqpn:
            self.append(pkt)


SQ_PSN = 100


@contextmanager
def lone_requester() -> Iterator[Lone]:
    with Simulation(devices=("a", "b")) as sim:
        ctx, peer = Context(name="a"), Context(name="b")
        pd = PD(ctx)
        cq = CQ(ctx, 64)
        mr = MR(pd, 4096, IBV_ACCESS_LOCAL_WRITE)
        init = QPInitAttr(qp_type=IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(16, 16, 1, 1),
                          sq_sig_all=1)  # fmt: skip
        qp = QP(pd, init, QPAttr())
        attr = QPAttr()
        attr.dest_qp_num = 0x999  # nothing there: every request is lost
        attr.path_mtu = IBV_MTU_256
        attr.max_rd_atomic = attr.max_dest_rd_atomic = 4
        attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer = 8, 2, 2, 1
        attr.sq_psn = attr.rq_psn = SQ_PSN
        attr.ah_attr = AHAttr(is_global=1, gr=GlobalRoute(dgid=peer.query_gid(1, 1),
                                                          sgid_index=1))  # fmt: skip
        qp.to_rts(attr)
        tap = _Tap()
        ctx.runtime.add_tap(tap)
        yield Lone(sim, ctx, qp, cq, mr, tap)


ACK = aeth_syndrome(AETH_ACK, AETH_CREDIT_INVALID)


def test_stale_and_unsent_acks_are_counted() -> None:
    """An ACK for nothing new, or for a PSN never sent, was dropped without a counter."""
    with lone_requester() as r:
        r.post(1, IBV_WR_SEND, 10)
        counters = r.ctx.hca.counters
        before = counters.copy()
        r.respond(Op.ACKNOWLEDGE, SQ_PSN - 1, ACK)  # acknowledges nothing new
        r.respond(Op.ACKNOWLEDGE, SQ_PSN + 1, ACK)  # a PSN never sent
        delta = counters - before
        assert delta["duplicate_response"] == 1
        assert delta["drop_unexpected_response"] == 1
        assert r.eng.comp.una == SQ_PSN and not r.cq.ring.waiting()
        r.respond(Op.ACKNOWLEDGE, SQ_PSN, ACK)
        n, wcs = r.cq.poll(1)
        assert n == 1 and wcs[0].status == IBV_WC_SUCCESS


def test_nak_for_an_unsent_psn_does_not_stop_the_retry_timer() -> None:
    """A PSN-sequence NAK beyond the last PSN sent rewound nothing but cleared the
    retransmission timer: the QP then waited forever with its WQE in flight."""
    with lone_requester() as r:
        r.post(1, IBV_WR_SEND, 10)
        r.respond(Op.ACKNOWLEDGE, SQ_PSN + 5000, aeth_syndrome(AETH_NAK, NAK_PSN_SEQUENCE_ERROR))
        assert r.ctx.hca.counters["drop_unexpected_response"] == 1
        assert r.ctx.runtime.next_deadline() is not None, "no timer left: the QP hangs"
        r.sim.run(1.0)  # the peer never answers: retries run out
        n, wcs = r.cq.poll(1)
        assert n == 1 and wcs[0].status != IBV_WC_SUCCESS, wcs
        assert r.qp.qp_state == IBV_QPS_ERR


def test_rnr_back_off_resends_an_unanswered_read_before_it() -> None:
    """After an RNR back-off only the RNR-NAKed PSN and later ones were resent.  A READ
    before it whose response was missing (an implied NAK, ignored because a retry was
    already under way) was never asked again, and with nothing resent no timer was
    armed: the QP hung in RTS with both WQEs in flight."""
    with lone_requester() as r:
        r.post(1, IBV_WR_RDMA_READ, 100)  # PSN 100
        r.post(2, IBV_WR_RDMA_WRITE, 100, 512)  # PSN 101
        r.sent()
        # The WRITE is NAKed (READ response missing: implied NAK, retry episode starts)
        r.respond(Op.ACKNOWLEDGE, SQ_PSN + 1,
                  aeth_syndrome(AETH_NAK, NAK_REMOTE_OPERATIONAL_ERROR))  # fmt: skip
        assert [p.psn for p in r.sent()] == [SQ_PSN]  # the READ went again
        # ... then RNR-NAKed: another implied NAK for the READ, inside the episode.
        r.respond(Op.ACKNOWLEDGE, SQ_PSN + 1, aeth_syndrome(AETH_RNR_NAK, 1))
        r.sim.run(0.001)  # past the back-off
        again = [p for p in r.sent() if OPINFO[p.opcode].kind is Kind.READ_REQ]  # type: ignore[union-attr]
        assert again and again[0].psn == SQ_PSN, "the READ was not asked again"
        r.sim.run(1.0)  # the peer never answers: retries run out
        n, wcs = r.cq.poll(4)
        assert n == 2, f"WQEs never completed: {wcs}"
        assert r.qp.qp_state == IBV_QPS_ERR


@pytest.mark.parametrize("path", ["udp", "frame"])
def test_rig_counts_decode_errors_like_the_fabric(path: str) -> None:
    with ReceiveRig(SEED) as rig:
        before = rig.hca.counters.copy()
        if path == "udp":
            rig.feed_udp(b"\x00" * 5, False, 0xC000)
        else:
            rig.feed_frame(b"\x00" * 5)
        delta = rig.hca.counters - before
        assert dict(delta) == {"rcvd_pkts": 1, "drop_truncated": 1}
