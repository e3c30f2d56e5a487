"""Cross-check the codecs with scapy's independent RoCEv2 layer (scapy.contrib.roce).

What scapy's layer covers (scapy 2.5 - 2.8): BTH (with the ICRC as a
trailing FCS field and ``BTH.compute_icrc``), AETH (bound only to the RC and
RD ACKNOWLEDGE opcodes), GRH and CNP.  It has no RETH, DETH, AtomicETH,
AtomicAckETH, ImmDt, IETH or XRCETH layers and no XRC opcode names, so for
those opcodes everything after the BTH is an opaque Raw payload; we check
that payload against our own encoding of the extended headers.  scapy's
ICRC masks the IPv6 traffic class, flow label and hop limit and keeps the
version nibble, as rxe does.  scapy chooses the layer above UDP by the
source port before the destination port, so the source ports used here stay
in rxe's range (0xC000-0xFFFF).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import (
    OPCODES,
    addressed_packets,
    assert_same_packet,
    golden_dir,
    sample_packet,
)

from softverbs.wire.codec import decode_frame, decode_udp_payload, encode_frame, encode_transport
from softverbs.wire.opcodes import CNP_OPCODE, OPINFO, Op, Transport, opcode
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet

scapy_all = pytest.importorskip("scapy.all")
roce = pytest.importorskip("scapy.contrib.roce")

Ether, IP, IPv6, UDP, Raw = (
    scapy_all.Ether,
    scapy_all.IP,
    scapy_all.IPv6,
    scapy_all.UDP,
    scapy_all.Raw,
)
BTH, AETH = roce.BTH, roce.AETH
ACKS = {opcode(Transport.RC, Op.ACKNOWLEDGE)}


def check_against_scapy(pkt: Packet, frame: bytes) -> None:
    sp = Ether(frame)
    assert sp.haslayer(BTH), sp.summary()
    bth = sp[BTH]
    n = len(pkt.payload)
    assert bth.opcode == pkt.opcode
    assert bth.dqpn == pkt.dqpn and bth.psn == pkt.psn and bth.pkey == pkt.pkey
    assert (bth.solicited, bth.migreq, bth.padcount, bth.version) == (pkt.se, pkt.mig, -n & 3, 0)
    assert (bth.fecn, bth.becn, bth.ackreq) == (pkt.fecn, pkt.becn, pkt.ackreq)
    # scapy computes the ICRC itself from the dissected headers.
    assert bth.compute_icrc(b"") == frame[-4:]
    after_bth = bytes(encode_transport(pkt))[12:]
    if pkt.opcode in ACKS:
        assert sp[AETH].syndrome == pkt.syndrome and sp[AETH].msn == pkt.msn
    elif pkt.opcode == CNP_OPCODE:  # scapy's own CNP layer: 16 reserved bytes
        assert sp.haslayer(roce.CNPPadding) and bytes(sp[roce.CNPPadding])[:16] == after_bth
    elif after_bth:
        assert sp[Raw].load == after_bth
    else:
        assert not sp.haslayer(Raw)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    pkt=st.one_of(addressed_packets(v6=False), addressed_packets(v6=True)),
    sport=st.integers(0xC000, 0xFFFF),
)
def test_scapy_parses_our_frames(pkt: Packet, sport: int) -> None:
    # scapy picks the layer above UDP by the *source* port first (sport 161
    # would become SNMP), so stay in the range rxe uses (udp_sport()).
    pkt.sport = sport
    check_against_scapy(pkt, encode_frame(pkt, ip_id=0x0101))


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("op", OPCODES, ids=[OPINFO[o].name for o in OPCODES])  # type: ignore[union-attr]
def test_scapy_every_opcode(op: int, v6: bool) -> None:
    pkt = sample_packet(op, seed=int(v6))
    if v6:
        pkt.sgid = bytes.fromhex("fd00000000000000000000000000000a")
        pkt.dgid = bytes.fromhex("fd00000000000000000000000000000b")
        pkt.flow_label = 0x12345
    else:
        pkt.sgid, pkt.dgid = (
            IPV4_MAPPED_PREFIX + b"\x0a\x00\x00\x01",
            IPV4_MAPPED_PREFIX + b"\x0a\x00\x00\x02",
        )
    pkt.sport, pkt.tclass, pkt.hop_limit = 0xC123, 0x68, 9
    check_against_scapy(pkt, encode_frame(pkt))


def _scapy_ip(v6: bool) -> object:
    if v6:
        return IPv6(src="fd00::1", dst="fd00::2", tc=0x20, fl=0xBEEF, hlim=17)
    return IP(src="10.0.0.1", dst="10.0.0.2", flags="DF", ttl=33, tos=0x48, id=0x3039)


def _scapy_frame(v6: bool, bth: object, rest: bytes) -> bytes:
    ip = _scapy_ip(v6)
    frame = (
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        / ip
        / UDP(sport=0xD00D, dport=4791, chksum=0)
        / bth
    )
    if rest:
        frame = frame / Raw(rest)
    return bytes(frame)


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_we_parse_scapy_frames(v6: bool) -> None:
    """Frames built by scapy (its own ICRC) decode with their ICRC verified."""
    send_only = opcode(Transport.RC, Op.SEND_ONLY)
    f = _scapy_frame(v6, BTH(opcode=send_only, dqpn=0x11, psn=5, padcount=3, ackreq=1), b"x\0\0\0")
    pkt = decode_frame(f)
    assert (pkt.opcode, pkt.dqpn, pkt.psn, pkt.ackreq, bytes(pkt.payload)) == (
        send_only, 0x11, 5, True, b"x",
    )  # fmt: skip
    assert pkt.sport == 0xD00D
    assert pkt.hop_limit == 17 if v6 else pkt.hop_limit == 33

    ack = _scapy_frame(v6, BTH(opcode=0x11, dqpn=0x2B, psn=99) / AETH(syndrome=0x1F, msn=7), b"")
    pkt = decode_frame(ack)
    assert (pkt.opcode, pkt.syndrome, pkt.msn, len(pkt.payload)) == (0x11, 0x1F, 7, 0)

    # Extended headers scapy lacks go in as raw bytes: RDMA WRITE Only (RETH), UD SEND (DETH).
    reth = struct.pack(">QII", 0x7F0000001000, 0xCAFE, 4)
    wr = _scapy_frame(v6, BTH(opcode=0x0A, dqpn=3, psn=1), reth + b"abcd")
    pkt = decode_frame(wr)
    assert (pkt.va, pkt.rkey, pkt.dma_len, bytes(pkt.payload)) == (
        0x7F0000001000,
        0xCAFE,
        4,
        b"abcd",
    )
    deth = struct.pack(">II", 0x11111111, 0x000ABC)
    ud = _scapy_frame(v6, BTH(opcode=0x64, dqpn=0xFFFFFF, psn=2), deth + b"datagram")
    pkt = decode_frame(ud)
    assert (pkt.qkey, pkt.src_qp, bytes(pkt.payload)) == (0x11111111, 0xABC, b"datagram")


def test_scapy_frame_via_udp_socket_path() -> None:
    """The UDP-socket receive path recovers scapy's IPv4 ID (0x3039) from the ICRC."""
    f = _scapy_frame(False, BTH(opcode=4, dqpn=0x11, psn=5), b"ping")
    udp_payload = f[14 + 20 + 8 :]
    pkt = decode_udp_payload(udp_payload, b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02", 0xD00D)
    assert bytes(pkt.payload) == b"ping"


def test_round_trip_through_scapy() -> None:
    """Ours -> scapy -> bytes -> ours gives the same packet."""
    pkt = sample_packet(opcode(Transport.RC, Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE), max_payload=300)
    pkt.sgid, pkt.dgid = (
        IPV4_MAPPED_PREFIX + b"\x01\x02\x03\x04",
        IPV4_MAPPED_PREFIX + b"\x05\x06\x07\x08",
    )
    rebuilt = bytes(Ether(encode_frame(pkt)))
    assert_same_packet(pkt, decode_frame(rebuilt))


def test_scapy_agrees_on_golden_icrcs() -> None:
    """scapy's ICRC equals the stored one on the rxe captures (IPv4 and IPv6)."""
    gdir = golden_dir()
    if gdir is None:
        pytest.skip("golden captures not found")
    for name in ("rc_pingpong.pcap", "rc_pingpong_ipv6.pcap", "atomic_lat.pcap"):
        n = 0
        for sp in scapy_all.rdpcap(str(gdir / name)):
            if sp.haslayer(BTH):
                assert sp[BTH].compute_icrc(b"") == bytes(sp)[-4:]
                n += 1
        assert n > 0
