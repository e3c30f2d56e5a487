"""DCQCN end to end on the virtual clock: the switch model, the notification
point's CNPs, the reaction point, bad CNPs, and a small incast.

Nothing here is timed: every run is on the Simulation's virtual clock, and
the incast assertions are qualitative properties of the deterministic
simulation (no drops and a queue below Kmax with DCQCN, the buffer full and
thousands of retransmissions without; with PFC, few pauses against many).
"""

from __future__ import annotations

import pytest
from sim_kit import rc_pair, stream

from softverbs.engine.congestion import Dcqcn
from softverbs.engine.hca import HCA
from softverbs.fabric.switch import RED_PROFILES, WIRE_OVERHEAD, Port, Topology, wire_bytes
from softverbs.incast import run_incast
from softverbs.sim import Simulation
from softverbs.wire.codec import decode_udp_payload, encode_udp_payload
from softverbs.wire.opcodes import CNP_OPCODE
from softverbs.wire.packet import Packet

PAPER = {
    "min_time_between_cnps": 50, "cnp_per_port": 0, "rate_reduce_monitor_period": 50,
    "clamp_tgt_rate": 1,
    "dce_tcp_rtt": 55,
    "dce_tcp_g": 1020, "rpg_time_reset": 55, "rpg_byte_reset": 10_000_000,
    "rpg_threshold": 5, "rpg_ai_rate": 40, "rpg_hai_rate": 100,
}  # fmt: skip


# --- the switch model ---------------------------------------------------------------------
def _pkt(size: int, ect: bool = True) -> Packet:
    pkt = Packet(0x04, 1, 0, bytes(size))  # RC SEND_ONLY
    pkt.tclass = 2 if ect else 0
    return pkt


def _port(buffer: int = 10_000, kmin: int = 2_000, kmax: int = 6_000, pmax: float = 1.0) -> Port:
    import random

    return Port("p", 8e9, 1e-6, buffer, kmin, kmax, pmax, random.Random(1), True)


def test_fifo_timing_and_tail_drop() -> None:
    port = _port()
    size = wire_bytes(_pkt(930))
    assert size == 12 + 932 + WIRE_OVERHEAD  # BTH, payload padded to 4, framing
    arrivals = [port.enqueue(_pkt(930, ect=False), 0.0) for _ in range(20)]
    fits = 10_000 // size
    assert all(a is not None for a in arrivals[:fits]) and arrivals[fits:] == [None] * (20 - fits)
    assert port.drops == 20 - fits and port.marks == 0  # not ECN-capable: never marked
    tx = size * 8 / 8e9
    assert arrivals[0] == pytest.approx(tx + 1e-6) and arrivals[1] == pytest.approx(2 * tx + 1e-6)
    assert port.occupancy(3 * tx) == (fits - 3) * size  # three have left
    assert port.occupancy(1.0) == 0


def test_red_marks_ect_packets_between_kmin_and_kmax() -> None:
    port = _port(pmax=0.5)
    assert port.red(2_000) == 0.0 and port.red(6_001) == 1.0
    assert port.red(4_000) == pytest.approx(0.25)
    marked = []
    for _ in range(9):
        pkt = _pkt(930)
        port.enqueue(pkt, 0.0)
        marked.append(pkt.tclass & 3 == 3)
    # the first two found less than kmin; from 6 packets (> kmax) on every one is marked
    assert marked[:2] == [False, False] and all(marked[6:])
    assert port.marks == sum(marked)


def test_topology_is_checked() -> None:
    with pytest.raises(ValueError, match="kmin <= kmax"):
        Simulation(devices=("a", "b"), topology=Topology(kmin=10, kmax=5))
    with pytest.raises(ValueError, match="pmax is a probability"):
        Simulation(devices=("a", "b"), topology=Topology(pmax=2))


def test_red_profiles_are_data_applied_by_name() -> None:
    base = Topology(bandwidth=40e9, buffer=123_456, pfc=True)
    topo = base.with_red("cumulus")
    # Cumulus Linux's RoCE mode: 150,000 to 1,501,500 bytes, probability 100 %
    assert (topo.kmin, topo.kmax, topo.pmax) == (150_000, 1_501_500, 1.0)
    assert (topo.bandwidth, topo.buffer, topo.pfc) == (40e9, 123_456, True)  # the rest kept
    assert topo.check() is None and base.kmin == Topology().kmin  # base unchanged
    for name, profile in RED_PROFILES.items():
        t = base.with_red(name)
        assert (t.kmin, t.kmax, t.pmax) == (profile.kmin, profile.kmax, profile.pmax)
        assert t.check() is None and profile.source
    port = _port(buffer=3_000_000, kmin=topo.kmin, kmax=topo.kmax, pmax=topo.pmax)
    assert port.red(150_000) == 0.0 and port.red(825_750) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="RED profile 'arista': choose one of paper, cumulus"):
        base.with_red("arista")


# --- the notification point --------------------------------------------------------------
def test_every_marked_packet_makes_a_cnp_without_a_minimum_interval() -> None:
    mark_all = Topology(kmin=0, kmax=0, pmax=1.0)
    r = run_incast(2, "dcqcn", duration=0.001, topology=mark_all,
                   cc_params={"min_time_between_cnps": 0})  # fmt: skip
    assert r.marks > 10 and r.cnps == r.ecn_marked >= r.marks - 2  # (a last few in flight)
    assert r.cnps_handled > 0


def test_at_most_one_cnp_per_qp_per_interval() -> None:
    mark_all = Topology(kmin=0, kmax=0, pmax=1.0)
    r = run_incast(4, "dcqcn", duration=0.002, topology=mark_all,
                   cc_params={"min_time_between_cnps": 100, "cnp_per_port": 0,
                              "rpg_min_dec_fac": 100})  # fmt: skip
    # four QPs, 2 ms, at most one CNP per QP per 100 us; every packet was marked
    assert 4 * 15 <= r.cnps <= 4 * 21 < r.marks
    # rpg_min_dec_fac 100: CNPs are handled, but no cut is deeper than 0 %
    assert r.cnps_handled == r.cnps and r.utilisation > 0.9


def test_at_most_one_cnp_per_port_per_interval() -> None:
    """``cnp_per_port``: the receiving port's CNPs, all QPs together, are spaced by
    ``min_time_between_cnps`` (the same run as above sends a quarter as many)."""
    mark_all = Topology(kmin=0, kmax=0, pmax=1.0)
    r = run_incast(4, "dcqcn", duration=0.002, topology=mark_all,
                   cc_params={"min_time_between_cnps": 100, "cnp_per_port": 1,
                              "rpg_min_dec_fac": 100})  # fmt: skip
    assert 15 <= r.cnps <= 21 < r.marks
    assert r.cnps_handled == r.cnps


def test_no_cnps_without_dcqcn() -> None:
    mark_all = Topology(kmin=0, kmax=0, pmax=1.0)
    r = run_incast(2, "none", duration=0.001, topology=mark_all)
    assert r.marks == 0 and r.cnps == 0  # not ECN-capable: nothing to mark


# --- the reaction point and bad CNPs ------------------------------------------------------
def _cnp(to: HCA, frm: HCA, dqpn: int, body: bytes = bytes(16)) -> Packet:
    cnp = Packet(CNP_OPCODE, dqpn, 0, body)
    cnp.becn = True
    cnp.pkey = 0xFFFF
    cnp.sgid, cnp.dgid = frm.gids[1], to.gids[1]
    cnp.sport = 0xC000
    return cnp


def test_bad_cnps_are_counted_and_change_nothing() -> None:
    with Simulation(devices=("a", "b"), cc="dcqcn") as sim:
        pair = rc_pair(sim)
        a, b = sim.registry.open("a").hca, sim.registry.open("b").hca
        assert a is not None and b is not None
        qpn = pair.a.qp.qp_num
        engine = a.qps[qpn]
        cc = engine.req.cc
        assert isinstance(cc, Dcqcn)
        before_counts = dict(a.counters)
        before_rate = cc.rc
        forged = _cnp(a, a, qpn)  # from a GID that is not the QP's peer
        bad = [
            _cnp(a, b, 0xABCDE),  # no such QP
            _cnp(a, b, qpn, bytes(15)),  # malformed: 15 reserved bytes
            _cnp(a, b, qpn, bytes(17)),  # malformed: 17
            forged,
        ]
        wrong_pkey = _cnp(a, b, qpn)
        wrong_pkey.pkey = 0x7F12
        bad.append(wrong_pkey)
        for pkt in bad:
            a.receive(pkt, sim.now)
        changed = {k: v - before_counts.get(k, 0) for k, v in a.counters.items()
                   if v != before_counts.get(k, 0)}  # fmt: skip
        assert changed == {"rcvd_pkts": len(bad), "rp_cnp_ignored": len(bad)}
        assert cc.rc == before_rate and cc.cuts == 0 and not a.outbox
        # and the good one is handled: the rate is cut
        a.receive(_cnp(a, b, qpn), sim.now)
        assert a.counters["rp_cnp_handled"] == 1 and cc.rc < before_rate
        assert engine.qp_counters()["rp_cnp_handled"] == 1


def test_cnp_on_the_wire_is_the_annex_format() -> None:
    cnp = Packet(CNP_OPCODE, 0x000123, 0, bytes(16))
    cnp.becn = True
    cnp.pkey = 0xFFFF
    src, dst = bytes([10, 0, 0, 2]), bytes([10, 0, 0, 1])
    data = bytes(encode_udp_payload(cnp, src, dst, 0xC001))
    # BTH: opcode 0x81, SE/M/pad/TVer 0, P_Key, BECN set + DestQP, AckReq 0 + PSN 0
    assert data[:12] == bytes.fromhex("8100ffff" "40000123" "00000000")
    assert data[12:28] == bytes(16) and len(data) == 32  # 16 reserved bytes, then the ICRC
    back = decode_udp_payload(data, src, dst, 0xC001)
    assert back.opcode == CNP_OPCODE and back.becn and bytes(back.payload) == bytes(16)


def test_cnp_from_a_marked_packet_in_a_simulation_cuts_the_senders_rate() -> None:
    mark_all = Topology(kmin=0, kmax=0, pmax=1.0)
    with Simulation(devices=("a", "b"), topology=mark_all, cc="dcqcn") as sim:
        pair = rc_pair(sim, mr_size=1 << 18)
        a, b = sim.registry.open("a").hca, sim.registry.open("b").hca
        assert a is not None and b is not None
        stream(pair, 40, size=4096)
        assert b.counters["np_ecn_marked_roce_packets"] > 0 and b.counters["np_cnp_sent"] > 0
        assert a.counters["rp_cnp_handled"] > 0
        cc = a.qps[pair.a.qp.qp_num].req.cc
        assert isinstance(cc, Dcqcn) and cc.rc < mark_all.bandwidth


# --- a small incast -----------------------------------------------------------------------
def _topo(pfc: bool) -> Topology:
    # the DCQCN paper's link speed and marking profile, a 4 x Kmax buffer
    return Topology(bandwidth=40e9, buffer=800_000, kmin=5_000, kmax=200_000, pmax=0.01, pfc=pfc)


def test_small_incast_lossy_dcqcn_against_none() -> None:
    """Tail drop: DCQCN holds the queue below Kmax and drops nothing; without it
    the queue sits at the buffer and go-back-N resends thousands of packets."""
    on = run_incast(4, "dcqcn", duration=0.003, topology=_topo(False), cc_params=PAPER, mtu=1024)
    off = run_incast(4, "none", duration=0.003, topology=_topo(False), mtu=1024)
    assert on.cnps > 0 and off.cnps == 0
    assert on.drops == 0 and on.retransmits == 0
    assert off.drops > 0 and off.retransmits >= 100
    assert off.queue_p50 > 4 * on.kmax * 0.9  # without CC the queue sits at the buffer
    assert on.queue_p99 < on.kmax  # with DCQCN it stays below Kmax
    assert on.jain > 0.95  # (utilisation needs a longer run: the bench measures it)


def test_small_incast_lossless_dcqcn_keeps_pfc_quiet() -> None:
    """PFC: nothing is dropped either way; DCQCN keeps the queue below Kmax
    and pauses only at the start, PFC alone keeps the queue at its threshold
    and pauses all along (the DCQCN paper's argument)."""
    on = run_incast(4, "dcqcn", duration=0.003, topology=_topo(True), cc_params=PAPER, mtu=1024)
    off = run_incast(4, "none", duration=0.003, topology=_topo(True), mtu=1024)
    assert on.drops == off.drops == 0 and on.retransmits == off.retransmits == 0
    assert on.pfc and on.row()["pfc"] is True
    assert off.pauses > 0 and on.pauses < off.pauses / 4
    assert on.queue_p99 < on.kmax < off.queue_p50
    assert on.jain > 0.95


def test_cumulus_profile_and_its_4x_kmax_buffer_hold_an_8_to_1_start() -> None:
    """Lossy 8:1 with the paper's parameters: the paper's RED profile and its 4 x Kmax
    (800 KB) drop at the line-rate start; Cumulus Linux's profile and its 4 x Kmax (6 MB)
    hold it -- nothing dropped or resent, where ``none`` drops and resends thousands."""

    def lossy(red: str) -> Topology:
        topo = Topology(bandwidth=40e9, pfc=False).with_red(red)
        topo.buffer = 4 * topo.kmax
        return topo

    paper = run_incast(8, "dcqcn", duration=0.003, topology=lossy("paper"), cc_params=PAPER,
                       mtu=1024)  # fmt: skip
    cumulus = run_incast(8, "dcqcn", duration=0.003, topology=lossy("cumulus"),
                         cc_params=PAPER, mtu=1024)  # fmt: skip
    off = run_incast(8, "none", duration=0.003, topology=lossy("cumulus"), mtu=1024)
    assert paper.drops > 0 and paper.retransmits > 0
    assert cumulus.kmax == 1_501_500 and cumulus.cnps > 0
    assert cumulus.drops == 0 and cumulus.retransmits == 0 and cumulus.queue_p99 < cumulus.kmax
    assert off.drops > 1000 and off.retransmits > 1000


def test_staggered_senders_start_one_after_another() -> None:
    """``stagger``: sender i sends nothing before i x stagger; all at once without."""
    bin = 20e-6
    late = run_incast(3, "none", duration=0.0004, topology=_topo(True), mtu=1024, bin=bin,
                      stagger=100e-6)  # fmt: skip
    together = run_incast(3, "none", duration=0.0004, topology=_topo(True), mtu=1024, bin=bin)

    def first(series: list[tuple[float, float]]) -> float:
        """When a sender's first bytes left the bottleneck (the bin's start)."""
        return next(t for t, rate in series if rate > 0)

    s1, s2, s3 = (first(late.throughput[n]) for n in ("s1", "s2", "s3"))
    # a late sender's first packet leaves the bottleneck after its start (behind
    # the queue the others built), and before the run's end
    assert s1 == 0.0 and s2 >= 100e-6 - 1e-9 and s3 >= 200e-6 - 1e-9 and s3 > s2
    assert [first(together.throughput[n]) for n in ("s1", "s2", "s3")] == [0.0, 0.0, 0.0]


def test_a_pause_holds_the_sender_and_a_resume_lets_it_go() -> None:
    """PFC's mechanics: over the threshold the switch pauses the host (counted on
    its port), the host's QPs stop, and the resume lets them finish."""
    topo = Topology(bandwidth=10e9, buffer=60_000, kmin=50_000, kmax=60_000, pfc=True)
    r = run_incast(4, "none", duration=0.002, topology=topo, mtu=4096)
    assert r.drops == 0 and r.pauses > 0 and r.utilisation > 0.9  # paused, never idle
    with pytest.raises(ValueError, match="pfc_beta"):
        Simulation(devices=("a", "b"), topology=Topology(pfc=True, pfc_beta=0))


def test_a_resume_never_overtakes_its_pause() -> None:
    """A host's packet that leaves an idle queue at once (the receiver's CNPs and
    ACKs) may get its PAUSE and its resume in the same instant; rounding once put
    the resume first, so the receiver stayed paused for good and every later CNP and
    ACK of a 16:1 incast sat in its NIC (3 of 118 CNPs arrived, no WRITE finished)."""
    r = run_incast(16, "dcqcn", duration=0.0005, topology=_topo(True), mtu=1024,
                   cc_params={"cnp_per_port": 1})  # fmt: skip
    assert r.pauses > 0 and r.cnps > 50
    assert r.cnps_handled >= r.cnps - 16  # (the last few in flight)
    assert r.utilisation > 0.9
