"""ECN on a UDP device (fabric/udp.py), on loopback, with DCQCN on.

A plain UDP socket plays a third host.  It sends the device a RoCEv2 packet
with ECN CE in its IP TOS (a UDP socket may set the ECN bits itself, as a
marking router would); the device reads the mark (IP_RECVTOS) and answers
with a CNP, which the socket receives with its TOS: DSCP 48, not
ECN-capable; everything else the devices send carries ECT(0).  A CNP the
socket sends in the peer's name reaches the reaction point: the QP's rate
is cut (rp_cnp_handled).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from softverbs import Context, testing
from softverbs.engine.congestion import Dcqcn
from softverbs.enums import IBV_QPT_RC
from softverbs.fabric.udp import UdpRuntime
from softverbs.verbs import registry, world
from softverbs.wire.codec import decode_udp_payload, encode_udp_payload
from softverbs.wire.opcodes import CNP_OPCODE, ROCEV2_PORT, Op, Transport
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet

X = 100 + os.getpid() % 100
A, B, THIRD = f"127.{X}.8.1", f"127.{X}.8.2", f"127.{X}.8.3"


def _gid(ip: str) -> bytes:
    return IPV4_MAPPED_PREFIX + socket.inet_aton(ip)


def _recv_all(sock: socket.socket, want: int, timeout: float = 5) -> list[tuple[Packet, int]]:
    """(packet, TOS) of what arrives within ``timeout``, until ``want`` CNPs came."""
    out: list[tuple[Packet, int]] = []
    end = time.monotonic() + timeout
    sock.settimeout(0.05)
    while time.monotonic() < end and sum(p.opcode == CNP_OPCODE for p, _ in out) < want:
        try:
            data, anc, _f, peer = sock.recvmsg(4096, socket.CMSG_SPACE(4))
        except TimeoutError:
            continue
        tos = next((v[0] for lvl, k, v in anc if lvl == socket.IPPROTO_IP and k == socket.IP_TOS),
                   -1)  # fmt: skip
        pkt = decode_udp_payload(data, socket.inet_aton(peer[0]), socket.inet_aton(THIRD),
                                 peer[1])  # fmt: skip
        out.append((pkt, tos))
    return out


@pytest.fixture
def devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    links = [{"name": "ecn1", "addrs": [A], "cc": "dcqcn", "cc_params": {}},
             {"name": "ecn2", "addrs": [B], "cc": "dcqcn",
              "cc_params": {"min_time_between_cnps": 0}}]  # fmt: skip
    cfg = tmp_path / "links.json"
    cfg.write_text(json.dumps({"links": links}))
    monkeypatch.setenv("SOFTVERBS_CONFIG", str(cfg))
    monkeypatch.setenv("SOFTVERBS_SERVICE", "0")
    reg = registry.Registry()
    world.push(reg)
    try:
        yield
    finally:
        world.pop(reg)
        reg.shutdown()


def test_ce_makes_a_cnp_and_cnps_cut_the_rate(devices: None) -> None:
    a, b = Context(name="ecn1"), Context(name="ecn2")
    ea, eb = testing.endpoint(a, IBV_QPT_RC, depth=4), testing.endpoint(b, IBV_QPT_RC, depth=4)
    testing.connect(ea, eb)
    testing.connect(eb, ea)
    qa, qb = ea.qp, eb.qp
    third = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    third.bind((THIRD, ROCEV2_PORT))
    third.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    third.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x03)  # ECN CE
    try:
        # A CE-marked SEND to qb, as if from a third host: out of sequence for qb,
        # but marked, so qb's notification point answers with a CNP.
        pkt = Packet(Transport.RC | Op.SEND_ONLY, qb.qp_num, 0x123456, b"x" * 64)
        pkt.pkey = 0xFFFF
        pkt.sgid, pkt.dgid = _gid(THIRD), _gid(B)
        data = encode_udp_payload(pkt, socket.inet_aton(THIRD), socket.inet_aton(B), ROCEV2_PORT)
        third.sendto(data, (B, ROCEV2_PORT))
        got = _recv_all(third, 1)
        cnps = [(p, tos) for p, tos in got if p.opcode == CNP_OPCODE]
        assert len(cnps) == 1, got
        cnp, tos = cnps[0]
        assert cnp.dqpn == qa.qp_num and cnp.becn and cnp.psn == 0
        assert bytes(cnp.payload) == bytes(16)
        assert tos == 48 << 2  # cnp_dscp 48, not ECN-capable
        # everything else the devices send is ECN-capable, ECT(0), set on their sockets
        for ctx in (a, b):
            rt = ctx.device.runtime
            assert isinstance(rt, UdpRuntime) and rt.tos == 2
            for sock in [*rt._rx, *rt._tx.values()]:
                assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == 2
        cb = b.device.hca.counters  # type: ignore[union-attr]
        assert cb["np_ecn_marked_roce_packets"] == 1 and cb["np_cnp_sent"] == 1

        # A CNP to qa in qb's name (from B's address): qa's rate is cut.
        ha = a.device.hca
        assert ha is not None
        cc = ha.qps[qa.qp_num].req.cc
        assert isinstance(cc, Dcqcn)
        line = cc.rc
        spoof = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        spoof.bind((B, 0))
        cnp = Packet(CNP_OPCODE, qa.qp_num, 0, bytes(16))
        cnp.becn = True
        cnp.pkey = 0xFFFF
        sport = spoof.getsockname()[1]
        spoof.sendto(encode_udp_payload(cnp, socket.inet_aton(B), socket.inet_aton(A), sport),
                     (A, ROCEV2_PORT))  # fmt: skip
        spoof.close()
        end = time.monotonic() + 5
        while ha.counters["rp_cnp_handled"] == 0 and time.monotonic() < end:
            time.sleep(0.01)
        assert ha.counters["rp_cnp_handled"] == 1 and ha.counters["rp_cnp_ignored"] == 0
        assert cc.rc < line
    finally:
        third.close()
        for ctx in (a, b):
            ctx.close()
