"""The codecs against real traffic: rxe-to-rxe captures from ../shared/peer/golden.

The captures are copied into tests/data/golden so that CI has them.  Each
file holds the RoCEv2 packets of one test program plus its TCP rendezvous
(and, for some, ICMPv6 neighbour discovery); the README of the peer counts
only the RoCEv2 (UDP/4791) packets, and so does this test.

For every RoCEv2 frame we check that:

* decode_frame parses it and the ICRC verifies against the frame's headers;
* encode_frame, given the frame's IPv4 ID, rebuilds the frame byte for byte
  from the ethertype on (the IP header included: rxe sends TOS 0, TTL 64,
  DF, UDP checksum 0, flow label 0; only the MACs differ);
* encode_udp_payload gives exactly the UDP payload (transport + ICRC);
* decode_udp_payload verifies it from addresses and ports alone, recovering
  rxe's non-zero IPv4 ID from the ICRC.
"""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import pytest
from wire_strategies import golden_dir

from softverbs.errors import WireError
from softverbs.fabric.pcap import read_pcap
from softverbs.wire.codec import (
    decode_frame,
    decode_transport,
    decode_udp_payload,
    encode_frame,
    encode_udp_payload,
    grh_bytes,
    icrc,
    ipv4_id_from_icrc,
)
from softverbs.wire.packet import udp_sport

#: RoCEv2 packets per capture (the table in ../shared/peer/README.md), and
#: the opcodes seen in each.
EXPECTED: dict[str, tuple[int, set[int]]] = {
    "rc_pingpong.pcap": (100, {0x00, 0x01, 0x02, 0x11}),
    "rc_pingpong_ipv6.pcap": (100, {0x00, 0x01, 0x02, 0x11}),
    "ud_pingpong.pcap": (20, {0x64}),
    "srq_pingpong.pcap": (240, {0x00, 0x01, 0x02, 0x11}),
    "uc_pingpong.pcap": (80, {0x20, 0x21, 0x22}),
    "write_bw.pcap": (100, {0x06, 0x07, 0x08, 0x11}),
    "read_lat.pcap": (40, {0x0C, 0x10}),
    "atomic_lat.pcap": (40, {0x12, 0x14}),
    "send_bw_cm.pcap": (1354, {0x00, 0x01, 0x02, 0x04, 0x11, 0x64}),
    "rping.pcap": (65, {0x04, 0x0A, 0x0C, 0x10, 0x11, 0x64}),
}

GOLDEN = golden_dir()


class Frame:
    """A RoCEv2 frame split with a parser independent of the codec."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.v4 = raw[12:14] == b"\x08\x00"
        if self.v4:
            ihl = (raw[14] & 0xF) * 4
            self.ip_hdr = raw[14 : 14 + ihl]
            self.ip_id = struct.unpack_from(">H", raw, 18)[0]
            self.src, self.dst = raw[26:30], raw[30:34]
            udp = 14 + ihl
        else:
            self.ip_hdr = raw[14:54]
            self.ip_id = 0
            self.src, self.dst = raw[22:38], raw[38:54]
            udp = 54
        self.udp_hdr = raw[udp : udp + 8]
        self.sport, self.dport, ulen = struct.unpack_from(">HHH", raw, udp)
        self.udp_payload = raw[udp + 8 : udp + ulen]
        self.bth_offset = udp + 8


def is_rocev2(raw: bytes) -> bool:
    etype = raw[12:14]
    if etype == b"\x08\x00" and raw[23] == 17:
        ihl = (raw[14] & 0xF) * 4
        return struct.unpack_from(">H", raw, 14 + ihl + 2)[0] == 4791
    if etype == b"\x86\xdd" and raw[20] == 17:
        return struct.unpack_from(">H", raw, 56)[0] == 4791
    return False


def rocev2_frames(path: Path) -> list[Frame]:
    return [Frame(raw) for _ts, raw in read_pcap(path) if is_rocev2(raw)]


@pytest.fixture(scope="module")
def golden() -> Path:
    if GOLDEN is None:
        pytest.fail(
            "golden captures missing: expected tests/data/golden/*.pcap in the repo "
            "(check that .gitignore does not exclude them)"
        )
    return GOLDEN


def test_all_captures_present(golden: Path) -> None:
    assert {p.name for p in golden.glob("*.pcap")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_capture(golden: Path, name: str) -> None:
    frames = rocev2_frames(golden / name)
    count, opcodes = EXPECTED[name]
    assert len(frames) == count
    seen: Counter[int] = Counter()
    for f in frames:
        pkt = decode_frame(f.raw)
        seen[pkt.opcode] += 1
        assert pkt.sport == f.sport
        assert pkt.sgid[-len(f.src) :] == f.src and pkt.dgid[-len(f.dst) :] == f.dst
        stored = struct.unpack("<I", f.udp_payload[-4:])[0]
        assert icrc(f.ip_hdr, f.udp_hdr, f.udp_payload[:-4]) == stored

        # Re-encoding reproduces the frame from the ethertype on.
        again = encode_frame(pkt, ip_id=f.ip_id)
        assert again[f.bth_offset :] == f.raw[f.bth_offset :]
        assert again[12:] == f.raw[12:]

        # What a UDP socket would send, and what it would receive.
        assert encode_udp_payload(pkt, f.src, f.dst, f.sport, ip_id=f.ip_id) == f.udp_payload
        via_udp = decode_udp_payload(f.udp_payload, f.src, f.dst, f.sport)
        assert bytes(via_udp.payload) == bytes(pkt.payload)
        assert via_udp.sgid == pkt.sgid and via_udp.dgid == pkt.dgid
        if f.v4:
            assert f.ip_id != 0  # rxe never sends ID 0: the reason for the solver
            assert ipv4_id_from_icrc(f.udp_payload, f.src, f.dst, f.sport) == f.ip_id
            decode_udp_payload(f.udp_payload, f.src, f.dst, f.sport, ip_id=f.ip_id)
            with pytest.raises(WireError) as err:
                decode_udp_payload(f.udp_payload, f.src, f.dst, f.sport, ip_id=f.ip_id ^ 1)
            assert err.value.reason == "icrc_error"
    assert set(seen) == opcodes


def test_payload_is_a_view_of_the_frame(golden: Path) -> None:
    f = rocev2_frames(golden / "write_bw.pcap")[0]
    data = memoryview(f.udp_payload)
    pkt = decode_transport(data, has_icrc=True)
    assert isinstance(pkt.payload, memoryview)
    assert pkt.payload.obj is f.udp_payload


def test_rc_pingpong_source_port(golden: Path) -> None:
    """rxe's source port for QPN 0x11 <-> 0x11 (README: 49441)."""
    assert udp_sport(0x11, 0x11) == 49441
    assert {f.sport for f in rocev2_frames(golden / "rc_pingpong.pcap")} == {49441}


def test_ud_grh_matches_the_received_ipv4_header(golden: Path) -> None:
    """grh_bytes = 20 zero bytes + the IPv4 header as it arrived (rxe_resp.c)."""
    frames = rocev2_frames(golden / "ud_pingpong.pcap")
    for f in frames:
        pkt = decode_frame(f.raw)
        assert grh_bytes(pkt, ip_id=f.ip_id) == bytes(20) + f.ip_hdr


def test_ipv6_grh_is_the_ipv6_header(golden: Path) -> None:
    for f in rocev2_frames(golden / "rc_pingpong_ipv6.pcap")[:10]:
        assert grh_bytes(decode_frame(f.raw)) == f.ip_hdr


def test_ipv4_id_is_covered_by_the_icrc(golden: Path) -> None:
    """Why decode_udp_payload must solve for the ID: ID 0 gives another ICRC."""
    f = rocev2_frames(golden / "rc_pingpong.pcap")[0]
    pkt = decode_frame(f.raw)
    assert encode_udp_payload(pkt, f.src, f.dst, f.sport)[-4:] != f.udp_payload[-4:]


def test_non_rocev2_frames_are_rejected(golden: Path) -> None:
    other = [raw for _ts, raw in read_pcap(golden / "rc_pingpong.pcap") if not is_rocev2(raw)]
    assert other  # the TCP rendezvous
    for raw in other:
        with pytest.raises(WireError) as err:
            decode_frame(raw)
        assert err.value.reason == "not_rocev2"
