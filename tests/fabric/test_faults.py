"""The fault layer: FaultInjector, FaultRule, parse_faults and SOFTVERBS_FAULTS.

Unit tests feed packets to an injector and read its decisions; end-to-end
tests run an RC pair in a Simulation and read the device counters, so each
fault type is seen to have the effect the docs promise (a corrupted packet is
dropped by the receiver's ICRC check, a delayed one arrives later in virtual
time, ...).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sim_kit import rc_pair, stream

from softverbs import counters
from softverbs.fabric.faults import KIND_NAMES, FaultInjector, FaultRule, packet_kinds, parse_faults
from softverbs.sim import Simulation
from softverbs.wire.opcodes import (
    AETH_ACK,
    AETH_CREDIT_INVALID,
    AETH_NAK,
    AETH_RNR_NAK,
    OPINFO,
    Op,
    Transport,
    aeth_syndrome,
)
from softverbs.wire.packet import Packet

GID_A = b"\x00" * 10 + b"\xff\xff" + bytes([10, 0, 0, 1])
GID_B = b"\x00" * 10 + b"\xff\xff" + bytes([10, 0, 0, 2])


def pkt(op: int, *, syndrome: int = 0, src: bytes = GID_A, dst: bytes = GID_B, dqpn: int = 0x11,
        psn: int = 0, payload: bytes = b"") -> Packet:  # fmt: skip
    p = Packet(op, dqpn, psn, payload)
    p.syndrome = syndrome
    p.sgid, p.dgid = src, dst
    return p


ACK = aeth_syndrome(AETH_ACK, AETH_CREDIT_INVALID)
NAK = aeth_syndrome(AETH_NAK, 0)
RNR = aeth_syndrome(AETH_RNR_NAK, 12)


def traffic(n: int = 3000) -> list[Packet]:
    ops = [i for i, info in enumerate(OPINFO) if info is not None and i < 0x80]
    return [pkt(ops[i % len(ops)], syndrome=(ACK, NAK, RNR)[i % 3], psn=i,
                dqpn=0x11 + i % 3, payload=bytes(i % 50)) for i in range(n)]  # fmt: skip


def decisions(inj: FaultInjector, packets: list[Packet]) -> list[list[tuple[float, int, int]]]:
    now = 0.0
    out = []
    for p in packets:
        now += 1e-6
        out.append([(when, q.psn, q.corrupt_bit) for when, q in inj.process(p, now)])
    return out


# --- determinism ----------------------------------------------------------------------------------

SPEC = "seed=5;drop=0.1;dup=0.1;reorder=0.1;corrupt=0.1;delay=0.001;jitter=0.002"


def test_same_seed_same_packets_same_decisions() -> None:
    a, b = parse_faults(SPEC), parse_faults(SPEC)
    da, db = decisions(a, traffic()), decisions(b, traffic())
    assert da == db
    assert a.stats == b.stats
    for name in ("dropped", "duplicated", "reordered", "corrupted", "delayed"):
        assert a.stats[name] > 0, name
    other = parse_faults(SPEC.replace("seed=5", "seed=6"))
    assert decisions(other, traffic()) != da


def test_decisions_follow_packet_order_only() -> None:
    """The times do not feed the RNG: another clock gives the same choices."""
    a, b = parse_faults(SPEC), parse_faults(SPEC)
    pa = [[(q.psn, q.corrupt_bit) for _, q in a.process(p, 0.0)] for p in traffic(500)]
    pb = [[(q.psn, q.corrupt_bit) for _, q in b.process(p, 123.0)] for p in traffic(500)]
    assert pa == pb


# --- each fault -----------------------------------------------------------------------------------


def test_drop() -> None:
    inj = FaultInjector([FaultRule(drop=1.0)], seed=1)
    assert inj.process(pkt(Op.SEND_ONLY), 1.0) == []
    assert inj.stats == {"dropped": 1}
    assert inj.rules[0].applied == 1


def test_duplicate_is_detached_from_application_memory() -> None:
    mem = bytearray(b"abcd")
    inj = FaultInjector([FaultRule(duplicate=1.0)], seed=1)
    out = inj.process(pkt(Op.SEND_ONLY, payload=memoryview(mem)), 2.0)  # type: ignore[arg-type]
    assert [when for when, _ in out] == [2.0, 2.0]
    mem[:] = b"XXXX"  # the application reuses its buffer: the copy in flight must not change
    assert bytes(out[1][1].payload) == b"abcd"
    assert out[1][1] is not out[0][1]
    assert inj.stats == {"duplicated": 1}


def test_reorder_holds_the_packet_back() -> None:
    inj = FaultInjector([FaultRule(reorder=1.0, reorder_delay=0.5)], seed=1)
    ((when, _),) = inj.process(pkt(Op.SEND_ONLY), 1.0)
    assert when == 1.5
    assert inj.stats == {"reordered": 1}


def test_corrupt_marks_a_copy() -> None:
    original = pkt(Op.SEND_ONLY, payload=b"abcd")
    inj = FaultInjector([FaultRule(corrupt=1.0)], seed=1)
    ((_, out),) = inj.process(original, 1.0)
    assert out.corrupt_bit >= 0 and original.corrupt_bit == -1
    assert inj.stats == {"corrupted": 1}


def test_delay_and_jitter() -> None:
    inj = FaultInjector([FaultRule(delay=0.25, jitter=0.1)], seed=3)
    whens = [w - 10.0 for p in traffic(200) for w, _ in inj.process(p, 10.0)]
    assert all(0.25 <= w < 0.35 for w in whens)
    assert max(whens) - min(whens) > 0.05  # the jitter is spread
    assert inj.stats["delayed"] == 200


def test_no_rule_no_change() -> None:
    inj = FaultInjector([FaultRule(drop=1.0, kinds=frozenset({"read_resp"}))], seed=1)
    p = pkt(Op.SEND_ONLY)
    assert inj.process(p, 4.0) == [(4.0, p)]
    assert not inj.stats


# --- matching -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "syndrome", "kinds"),
    [
        (Op.SEND_ONLY, 0, {"send", "request"}),
        (Op.SEND_FIRST, 0, {"send", "request"}),
        (Op.RDMA_WRITE_MIDDLE, 0, {"write", "request"}),
        (Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE, 0, {"write", "request"}),
        (Op.RDMA_READ_REQUEST, 0, {"read_req", "request"}),
        (Op.COMPARE_SWAP, 0, {"atomic", "request"}),
        (Op.FETCH_ADD, 0, {"atomic", "request"}),
        (Op.RDMA_READ_RESPONSE_MIDDLE, 0, {"read_resp", "response"}),
        (Op.RDMA_READ_RESPONSE_ONLY, ACK, {"read_resp", "response"}),
        (Op.ACKNOWLEDGE, ACK, {"ack", "response"}),
        (Op.ACKNOWLEDGE, NAK, {"nak", "response"}),
        (Op.ACKNOWLEDGE, RNR, {"nak", "response"}),
        (Op.ATOMIC_ACKNOWLEDGE, ACK, {"atomic_ack", "response"}),
    ],
)
def test_packet_kinds(op: Op, syndrome: int, kinds: set[str]) -> None:
    got = packet_kinds(pkt(Transport.RC | op, syndrome=syndrome))
    assert got == kinds
    assert got <= KIND_NAMES
    for name in KIND_NAMES:
        assert FaultRule(kinds=frozenset({name})).matches(pkt(Transport.RC | op,
                                                              syndrome=syndrome)) == (name in got)


def test_ack_and_nak_rules_are_disjoint() -> None:
    """"ack" used to match NAKs too (the ACK opcode's kind is also named ACK)."""
    naks = FaultRule(drop=1.0, kinds=frozenset({"nak"}))
    acks = FaultRule(drop=1.0, kinds=frozenset({"ack"}))
    for syndrome, is_nak in ((NAK, True), (RNR, True), (ACK, False)):
        assert naks.matches(pkt(Op.ACKNOWLEDGE, syndrome=syndrome)) == is_nak
        assert acks.matches(pkt(Op.ACKNOWLEDGE, syndrome=syndrome)) == (not is_nak)
    assert not naks.matches(pkt(Op.ATOMIC_ACKNOWLEDGE, syndrome=ACK))
    assert not acks.matches(pkt(Op.ATOMIC_ACKNOWLEDGE, syndrome=ACK))


def test_match_by_gid_and_dqpn() -> None:
    assert FaultRule(src_gid=GID_A).matches(pkt(Op.SEND_ONLY))
    assert not FaultRule(src_gid=GID_B).matches(pkt(Op.SEND_ONLY))
    assert FaultRule(dst_gid=GID_B).matches(pkt(Op.SEND_ONLY))
    assert not FaultRule(dst_gid=GID_A).matches(pkt(Op.SEND_ONLY))
    assert FaultRule(dqpn=0x12).matches(pkt(Op.SEND_ONLY, dqpn=0x12))
    assert not FaultRule(dqpn=0x12).matches(pkt(Op.SEND_ONLY, dqpn=0x13))
    rule = parse_faults("src=10.0.0.1;dst=10.0.0.2;dqpn=0x12;drop=1").rules[0]
    assert (rule.src_gid, rule.dst_gid, rule.dqpn) == (GID_A, GID_B, 0x12)
    v6 = parse_faults("dst=fe80::1;drop=1").rules[0]
    assert v6.dst_gid == b"\xfe\x80" + bytes(13) + b"\x01"


def test_limit_counts_packets_then_the_next_rule_applies() -> None:
    inj = parse_faults("seed=1;drop=1;limit=3|dup=1")
    outs = [len(inj.process(pkt(Op.SEND_ONLY, psn=i), 0.0)) for i in range(6)]
    assert outs == [0, 0, 0, 2, 2, 2]
    assert [r.applied for r in inj.rules] == [3, 3]


def test_limit_applies_to_delay_too() -> None:
    """A delay-only rule used to ignore its limit: delays were not counted."""
    inj = parse_faults("delay=0.5;limit=2")
    whens = [inj.process(pkt(Op.SEND_ONLY), 1.0)[0][0] for _ in range(4)]
    assert whens == [1.5, 1.5, 1.0, 1.0]


def test_one_packet_counts_once_against_the_limit() -> None:
    inj = FaultInjector([FaultRule(duplicate=1.0, reorder=1.0, corrupt=1.0, limit=2)], seed=1)
    for _ in range(4):
        inj.process(pkt(Op.SEND_ONLY), 0.0)
    assert inj.rules[0].applied == 2
    assert inj.stats == {"duplicated": 2, "reordered": 2, "corrupted": 2}


# --- bad settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("drop=abc", "'abc' is not a number"),
        ("seed=x", "'x' is not an integer"),
        ("limit=1.5", "'1.5' is not an integer"),
        ("bogus=1", "unknown setting; known: corrupt, delay, dqpn"),
        ("drop", "expected name=value"),
        ("drop=1.5", "drop probability 1.5 is not in [0, 1]"),
        ("dup=-0.1", "duplicate probability -0.1 is not in [0, 1]"),
        ("kinds=acks", "unknown packet kinds ['acks']; known: ack, atomic"),
        ("kinds=", "no packet kinds given"),
        ("delay=-1", "delay -1.0 is not a time in seconds >= 0"),
        ("jitter=inf", "jitter inf is not a time in seconds >= 0"),
        ("limit=-3", "limit -3 is negative"),
        ("dqpn=0x1000000", "dqpn 0x1000000 is not a 24-bit QP number"),
        ("src=10.0.0", "'10.0.0' is not an IPv4/IPv6 address or a GID"),
        ("seed=1;drop=0.1|corrupt=7", "fault rule 'corrupt=7'"),
    ],
)
def test_bad_settings_raise_value_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="fault") as info:
        parse_faults(text)
    assert message in str(info.value)
    assert repr(text) in str(info.value)


def test_bad_rule_objects_raise_value_error() -> None:
    with pytest.raises(ValueError, match="not in"):
        FaultRule(corrupt=2.0)
    with pytest.raises(ValueError, match="16-byte GID"):
        FaultRule(dst_gid=b"\x0a\x00\x00\x02")
    with pytest.raises(ValueError, match="unknown packet kinds"):
        FaultRule(kinds=frozenset({"Send"}))


def test_empty_spec_is_no_rule() -> None:
    inj = parse_faults("seed=9")
    assert inj.rules == [] and inj.seed == 9


# --- in a simulation: what the receiver sees ------------------------------------------------------


def run_pair(spec: str, n: int = 20, **attrs: int) -> tuple[dict[str, int], dict[str, int], float]:
    with Simulation(devices=("a", "b"), faults=spec) as sim:
        pair = rc_pair(sim, **attrs)
        stream(pair, n)
        return counters(pair.a.ctx), counters(pair.b.ctx), sim.now


def test_corrupt_is_dropped_by_the_receivers_icrc_check() -> None:
    _, receiver, _ = run_pair("seed=1;corrupt=1;limit=3;kinds=send")
    assert receiver["drop_icrc_error"] == 3
    assert receiver["rdma_recvs"] == 20  # RC resent them: everything arrived
    # every packet that reached b is accounted for, the corrupted ones included
    accounted = ("rdma_recvs", "drop_icrc_error", "duplicate_request", "out_of_seq_request")
    assert receiver["rcvd_pkts"] == sum(receiver[k] for k in accounted)


def test_duplicate_is_seen_as_a_duplicate_request() -> None:
    _, receiver, _ = run_pair("seed=1;dup=1;limit=2;kinds=send")
    assert receiver["duplicate_request"] == 2
    assert receiver["rdma_recvs"] == 20


def test_reorder_makes_out_of_sequence_requests() -> None:
    sender, receiver, _ = run_pair("seed=1;reorder=1;limit=1;kinds=send;reorder_delay=0.001")
    assert receiver["out_of_seq_request"] >= 1
    assert sender["rcvd_seq_err"] >= 1  # the responder NAKed the gap
    assert receiver["rdma_recvs"] == 20


def test_dropped_ack_costs_one_timeout() -> None:
    sender, receiver, now = run_pair("seed=1;drop=1;limit=1;kinds=ack", n=1, timeout=14)
    assert sender["local_ack_timeout_err"] == 1
    assert receiver["duplicate_request"] == 1  # the resent SEND, ACKed again
    assert now == pytest.approx(4.096e-6 * 2**14)  # exactly one ACK timeout of virtual time


def test_delay_moves_arrival_in_virtual_time() -> None:
    *_, now = run_pair("delay=0.25;kinds=send", n=1)
    assert now == pytest.approx(0.25)
    *_, now = run_pair("delay=0.25;kinds=ack", n=3)
    assert 0.25 <= now < 0.26  # three SENDs in flight together, their ACKs all late


# --- SOFTVERBS_FAULTS -----------------------------------------------------------------------------

_PROBE = """
import json
from softverbs import Context
ctx = Context(name="sv0")
f = ctx.runtime.faults
print(json.dumps({"seed": f.seed, "rules": [[r.drop, r.duplicate, sorted(r.kinds), r.limit]
                                             for r in f.rules]}))
"""


def _child(code: str, faults: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    env["SOFTVERBS_SERVICE"] = "0"  # a device of its own, not the host's
    env["SOFTVERBS_FAULTS"] = faults
    env["SOFTVERBS_CONFIG"] = str(tmp / "no-links.json")  # no `softverbs link` devices
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_softverbs_faults_is_applied_to_a_new_runtime(tmp_path: Path) -> None:
    r = _child(_PROBE, "seed=7;drop=0.25;kinds=ack,nak|dup=0.5;limit=4", tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {
        "seed": 7,
        "rules": [[0.25, 0.0, ["ack", "nak"], None], [0.0, 0.5, [], 4]],
    }
    assert "SOFTVERBS_FAULTS" not in os.environ  # nothing leaked into this process


def test_bad_softverbs_faults_names_the_variable(tmp_path: Path) -> None:
    r = _child(_PROBE, "drop=lots", tmp_path)
    assert r.returncode != 0
    assert "ConfigError: SOFTVERBS_FAULTS: fault setting 'drop=lots'" in r.stderr, r.stderr
