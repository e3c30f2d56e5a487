"""The CM MAD codec against rxe's own CM traffic (tests/data/golden).

``send_bw_cm.pcap`` (``ib_send_bw -R``: two connections) and ``rping.pcap``
hold every CM MAD rxe sent: REQ, REP, RTU, DREQ, DREP as UD SEND_ONLY to
QP1.  Each must parse, make sense against the packet that carried it (GIDs,
IP addresses, QPNs of the data that followed), and encode back to the very
same 256 bytes.  The messages rxe did not send (REJ, MRA, SIDR) are checked
by round trips with every field at random values within its width.
"""

from __future__ import annotations

import random
from dataclasses import fields
from pathlib import Path

import pytest

from softverbs.cm import mad
from softverbs.cm.gsi import rxe_ud_sport
from softverbs.errors import WireError
from softverbs.fabric.pcap import read_pcap
from softverbs.wire.codec import decode_frame
from softverbs.wire.packet import Packet

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
CAPTURES = ("send_bw_cm", "rping")
PORTS = {"send_bw_cm": 18515, "rping": 7174}


def _cm_packets(name: str) -> list[Packet]:
    out = []
    for _ts, frame in read_pcap(GOLDEN / f"{name}.pcap"):
        try:
            pkt = decode_frame(frame)
        except WireError:
            continue  # the TCP rendezvous
        if pkt.dqpn == mad.GSI_QPN:
            out.append(pkt)
    return out


def _data_qpns(name: str) -> set[int]:
    qpns = set()
    for _ts, frame in read_pcap(GOLDEN / f"{name}.pcap"):
        try:
            pkt = decode_frame(frame)
        except WireError:
            continue
        if pkt.dqpn != mad.GSI_QPN:
            qpns.add(pkt.dqpn)
    return qpns


@pytest.mark.parametrize("name", CAPTURES)
def test_every_cm_mad_parses_and_reencodes_byte_identical(name: str) -> None:
    packets = _cm_packets(name)
    assert packets, f"{name}: no CM MADs"
    for pkt in packets:
        data = bytes(pkt.payload)
        assert len(data) == mad.MAD_SIZE
        msg = mad.decode(data)
        assert msg.encode() == data, f"{name}: {msg.NAME} does not re-encode identically"


@pytest.mark.parametrize("name", CAPTURES)
def test_cm_mads_travel_as_rxe_sends_them(name: str) -> None:
    for pkt in _cm_packets(name):
        assert pkt.opcode == 0x64  # UD SEND_ONLY
        assert pkt.src_qp == mad.GSI_QPN
        assert pkt.qkey == mad.GSI_QKEY
        assert pkt.pkey == 0xFFFF
        assert pkt.sport == rxe_ud_sport(mad.GSI_QPN) == 55410


@pytest.mark.parametrize("name", CAPTURES)
def test_cm_handshake_fields_are_consistent(name: str) -> None:
    msgs = [(pkt, mad.decode(bytes(pkt.payload))) for pkt in _cm_packets(name)]
    reqs = {m.local_comm_id: (p, m) for p, m in msgs if isinstance(m, mad.Req)}
    assert reqs
    data_qpns = _data_qpns(name)
    for pkt, req in reqs.values():
        assert isinstance(req, mad.Req)
        ps, port = mad.split_service_id(req.service_id)
        assert ps == 0x0106 and port == PORTS[name]  # RDMA_PS_TCP
        assert req.transport_service_type == 0  # RC
        assert req.primary_local_gid == pkt.sgid and req.primary_remote_gid == pkt.dgid
        assert req.path_mtu == 3  # 1024: rxe on a 1500-byte netdev
        assert req.max_cm_retries == 15
        assert req.remote_cm_response_timeout == req.local_cm_response_timeout == 20
        # rdma_cm's local ACK timeout for RoCE: packet life time 18 -> cm_ack_timeout
        assert req.primary_local_ack_timeout == mad.ack_timeout(15, 18) == 19
        assert req.tid == mad.tid_for(req.tid >> 32, req.local_comm_id)
        assert req.local_qpn in data_qpns
        cma = mad.CmaHeader.decode(req.private_data)
        assert cma.src_ip == pkt.sgid[12:] and cma.dst_ip == pkt.dgid[12:]
        # the flow label rdma_cm derives from the ports (cma_get_roce_udp_flow_label)
        assert req.primary_flow_label == (cma.src_port * 31 + port) & 0xFFFFF
        assert cma.encode() == req.private_data[: mad.CMA_HEADER_SIZE]
    by_local = {m.local_comm_id: m for _p, m in msgs if hasattr(m, "local_comm_id")}
    for _pkt, msg in msgs:
        if isinstance(msg, mad.Rep):
            req_msg = reqs[msg.remote_comm_id][1]
            assert isinstance(req_msg, mad.Req)
            assert msg.tid == req_msg.tid  # the REP answers the REQ's transaction
            assert msg.local_qpn in data_qpns
            assert msg.target_ack_delay == 15
        elif isinstance(msg, (mad.Rtu, mad.Dreq, mad.Drep)):
            assert msg.remote_comm_id in by_local, f"{msg.NAME} for an unknown connection"
    kinds = [m.NAME for _p, m in msgs]
    assert kinds.count("REQ") == kinds.count("REP") == kinds.count("RTU")
    assert kinds.count("DREQ") == kinds.count("DREP")


def _random(msg_cls: type[mad.CmMessage], rng: random.Random) -> mad.CmMessage:
    values: dict[str, object] = {}
    for f in msg_cls.LAYOUT:
        if isinstance(f, mad.Blob):
            values[f.name] = rng.randbytes(f.size)
        else:
            values[f.name] = rng.randrange(f.mask + 1)
    msg = msg_cls(**values)  # type: ignore[arg-type]
    msg.tid = rng.randrange(1 << 64)
    return msg


@pytest.mark.parametrize("msg_cls", list(mad.MESSAGES.values()), ids=lambda c: c.NAME)
def test_every_message_round_trips(msg_cls: type[mad.CmMessage]) -> None:
    rng = random.Random(msg_cls.ATTR_ID)
    for _ in range(200):
        msg = _random(msg_cls, rng)
        data = msg.encode()
        assert len(data) == mad.MAD_SIZE
        back = mad.decode(data)
        assert back == msg
        assert back.encode() == data


@pytest.mark.parametrize("msg_cls", list(mad.MESSAGES.values()), ids=lambda c: c.NAME)
def test_layouts_do_not_overlap(msg_cls: type[mad.CmMessage]) -> None:
    """Every bit of a MAD belongs to at most one field."""
    owner: dict[int, str] = {}
    for f in msg_cls.LAYOUT:
        if isinstance(f, mad.Blob):
            bits = range(f.offset * 8, (f.offset + f.size) * 8)
        else:
            width = f.bits or f.size * 8
            top = f.offset * 8 + f.size * 8 - f.shift  # exclusive, counting from the MSB
            bits = range(top - width, top)
        for bit in bits:
            assert bit not in owner, f"{f.name} overlaps {owner[bit]}"
            assert mad.MAD_HEADER_SIZE * 8 <= bit < mad.MAD_SIZE * 8
            owner[bit] = f.name
    names = {f.name for f in msg_cls.LAYOUT}
    own = {f.name for f in fields(msg_cls)} - {"tid", "method", "status", "class_specific",
                                                 "attr_mod"}  # fmt: skip
    assert names == own


def test_private_data_sizes_fill_the_mad() -> None:
    for msg_cls in mad.MESSAGES.values():
        blob = [f for f in msg_cls.LAYOUT if isinstance(f, mad.Blob) and f.name == "private_data"]
        assert blob and blob[0].offset + blob[0].size == mad.MAD_SIZE, msg_cls.NAME


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b[:100], "short"),
        (lambda b: b[:10], "short"),
        (lambda b: bytes([2]) + b[1:], "bad_version"),
        (lambda b: b[:1] + bytes([0x04]) + b[2:], "not_cm"),
        (lambda b: b[:2] + bytes([1]) + b[3:], "bad_version"),
        (lambda b: b[:3] + bytes([0x81]) + b[4:], "bad_method"),
        (lambda b: b[:16] + b"\x00\x99" + b[18:], "bad_attr"),
        (lambda b: b[:16] + b"\x00\x19" + b[18:], "unsupported_attr"),
    ],
)
def test_malformed_mads_are_refused_with_a_reason(mutate: object, reason: str) -> None:
    good = mad.Req(local_comm_id=1).encode()
    with pytest.raises(mad.MadError) as info:
        mad.decode(mutate(good))  # type: ignore[operator]
    assert info.value.reason == reason


def test_cma_header_ipv6_and_bad_versions() -> None:
    src, dst = bytes(range(16)), bytes(range(16, 32))
    hdr = mad.CmaHeader(src, dst, 4791)
    assert mad.CmaHeader.decode(hdr.encode()) == hdr
    with pytest.raises(mad.MadError):
        mad.CmaHeader.decode(b"\x01" + hdr.encode()[1:])
    with pytest.raises(mad.MadError):
        mad.CmaHeader.decode(b"\x00\x50" + hdr.encode()[2:])
    with pytest.raises(mad.MadError):
        mad.CmaHeader.decode(b"\x00")


def test_timing_helpers_match_the_kernel() -> None:
    assert mad.ms_of(20) == 4096 and mad.ms_of(18) == 1024 and mad.ms_of(3) == 1
    assert mad.ack_timeout(15, 18) == 19
    assert mad.ack_timeout(15, 0) == 15
    assert mad.ack_timeout(15, 13) == 16
    assert mad.ack_timeout(15, 31) == 31
    assert mad.service_id(0x0106, 7471) == 0x0000000001061D2F
    assert mad.split_service_id(0x0000000001111D2F) == (0x0111, 7471)
