"""Wireshark's InfiniBand dissector reads our pcap tap's frames.

One frame per opcode in OPINFO, over IPv4 and IPv6, written with PcapWriter
and decoded by tshark.  Each frame must be dissected as eth/ip/udp/infiniband
with the right BTH fields, the right extended-header fields, the ICRC we
wrote, and nothing malformed.

Known limits of the dissector, not of our frames (checked on tshark 4.0):

* It names the XRC opcodes (0xA0..0xB7) but has no XRCETH support: it stops
  after the BTH and shows the rest as "Unknown/Vendor Specific Data", with
  no ICRC field.  For XRC we check the BTH and that the rest is the vendor
  blob.  It does not name the RoCEv2 CNP (opcode 0x81) either ("Unknown
  (129)"): for it we check the BTH and that the rest is exactly the annex's
  16 reserved zero bytes followed by our ICRC.
* It hands SEND payloads to heuristic sub-dissectors (RPC-over-RDMA, SMB
  Direct, iSER, ...), which call random bytes malformed.  We disable the
  protocols of every heuristic registered on ``infiniband.payload``.
* The UDP dissector flags the zero UDP checksum of IPv6 frames ("Illegal
  checksum value (0)").  rxe sends zero checksums too (see the golden
  captures), and RoCEv2 relies on the ICRC, so that one message is allowed.

Needs the ``tshark`` binary (Debian package ``tshark``); skipped without it.
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
from tshark_kit import TSHARK, payload_dissector_args
from wire_strategies import OPCODES, sample_packet

from softverbs.fabric.pcap import PcapWriter
from softverbs.wire.codec import encode_frame
from softverbs.wire.opcodes import OPINFO, Hdr, Transport
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet

pytestmark = pytest.mark.skipif(TSHARK is None, reason="tshark not installed (apt: tshark)")

ALLOWED_EXPERT_V6 = {"Illegal checksum value (0)"}

# tshark field -> how to get the expected value from (packet, frame bytes).
BTH_FIELDS = {
    "infiniband.bth.opcode": lambda p, f: p.opcode,
    "infiniband.bth.destqp": lambda p, f: p.dqpn,
    "infiniband.bth.psn": lambda p, f: p.psn,
    "infiniband.bth.padcnt": lambda p, f: -len(p.payload) & 3,
    "infiniband.bth.p_key": lambda p, f: p.pkey,
}
HDR_FIELDS: dict[Hdr, dict[str, object]] = {
    Hdr.RETH: {
        "infiniband.reth.va": lambda p, f: p.va,
        "infiniband.reth.r_key": lambda p, f: p.rkey,
        "infiniband.reth.dmalen": lambda p, f: p.dma_len,
    },
    Hdr.ATOMICETH: {  # Wireshark reuses the RETH fields for VA and R_Key
        "infiniband.reth.va": lambda p, f: p.va,
        "infiniband.reth.r_key": lambda p, f: p.rkey,
        "infiniband.atomiceth.swapdt": lambda p, f: p.swap_add,
        "infiniband.atomiceth.cmpdt": lambda p, f: p.compare,
    },
    Hdr.DETH: {
        "infiniband.deth.q_key": lambda p, f: p.qkey,
        "infiniband.deth.srcqp": lambda p, f: p.src_qp,
    },
    Hdr.AETH: {
        "infiniband.aeth.syndrome": lambda p, f: p.syndrome,
        "infiniband.aeth.msn": lambda p, f: p.msn,
    },
    Hdr.ATOMICACKETH: {"infiniband.atomicacketh.origremdt": lambda p, f: p.orig},
    Hdr.IMMDT: {"infiniband.immdt": lambda p, f: struct.pack(">I", p.imm).hex()},
    Hdr.IETH: {"infiniband.ieth": lambda p, f: struct.pack(">I", p.inv_rkey).hex()},
}
ICRC_FIELD = {"infiniband.invariant.crc": lambda p, f: int.from_bytes(f[-4:], "big")}
META = [
    "frame.number",
    "frame.time_epoch",
    "frame.protocols",
    "_ws.malformed",
    "_ws.expert.message",
]


def all_fields() -> list[str]:
    names = dict.fromkeys(BTH_FIELDS)
    for fields in HDR_FIELDS.values():
        names.update(dict.fromkeys(fields))
    names.update(dict.fromkeys(ICRC_FIELD))
    names["infiniband.vendor"] = None
    return META + list(names)


def build_packets() -> list[tuple[Packet, bool]]:
    out = []
    for v6 in (False, True):
        for op in OPCODES:
            pkt = sample_packet(op, seed=7 + v6, max_payload=64)
            pkt.dqpn = 0x1000 + op  # away from QP0/QP1, which Wireshark parses as MADs
            if v6:
                pkt.sgid = bytes.fromhex("fd000000000000000000000000000001")
                pkt.dgid = bytes.fromhex("fd000000000000000000000000000002")
                pkt.flow_label = 0x2BEEF
            else:
                pkt.sgid = IPV4_MAPPED_PREFIX + bytes([192, 0, 2, 1])
                pkt.dgid = IPV4_MAPPED_PREFIX + bytes([192, 0, 2, 2])
            pkt.sport = 0xC000 | op
            out.append((pkt, v6))
    return out


def run_tshark(path: Path, fields: list[str]) -> list[dict[str, list[str]]]:
    """One dict per frame: field name -> all its occurrences in the frame."""
    assert TSHARK is not None
    cmd = [TSHARK, "-n", "-r", str(path), *payload_dissector_args(), "-T", "fields"]
    cmd += ["-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=\x1f"]
    for name in fields:
        cmd += ["-e", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    return [
        {name: [v for v in col.split("\x1f") if v] for name, col in zip(fields, row, strict=True)}
        for row in rows
    ]


def test_every_opcode_decodes(tmp_path: Path) -> None:
    pkts = build_packets()
    path = tmp_path / "all_opcodes.pcap"
    frames = [encode_frame(pkt) for pkt, _v6 in pkts]
    with PcapWriter(path) as w:
        for i, frame in enumerate(frames):
            w.write(frame, ts=1_700_000_000 + i + 0.25)
    rows = run_tshark(path, all_fields())
    assert len(rows) == len(pkts)
    checked = 0
    for i, ((pkt, v6), frame, row) in enumerate(zip(pkts, frames, rows, strict=True)):
        info = OPINFO[pkt.opcode]
        assert info is not None
        where = f"frame {i + 1} ({info.name}, {'IPv6' if v6 else 'IPv4'})"
        assert row["frame.protocols"][0].startswith(
            "eth:ethertype:ipv6:udp:infiniband" if v6 else "eth:ethertype:ip:udp:infiniband"
        ), where
        assert float(row["frame.time_epoch"][0]) == pytest.approx(1_700_000_000 + i + 0.25)
        assert row["_ws.malformed"] == [], where
        allowed = ALLOWED_EXPERT_V6 if v6 else set()
        assert set(row["_ws.expert.message"]) <= allowed, (where, row["_ws.expert.message"])
        expect: dict[str, object] = dict(BTH_FIELDS)
        if info.transport is Transport.XRC:
            # No XRCETH in Wireshark 4.0: the rest is an opaque blob.
            assert row["infiniband.vendor"], where
        elif info.transport is Transport.CNP:
            # Wireshark 4.0 shows opcode 0x81 as "Unknown (129)" with its BTH
            # fields; the 16 reserved bytes and the ICRC are the vendor blob.
            blob = bytes(16) + frame[-4:]
            assert blob.hex() in row["infiniband.vendor"], (where, row["infiniband.vendor"])
        else:
            for flag, fmap in HDR_FIELDS.items():
                if info.hdrs & flag:
                    expect.update(fmap)
            expect.update(ICRC_FIELD)
        for name, get in expect.items():
            assert callable(get)
            want = get(pkt, frame)
            assert row[name], (where, name, "missing")
            got = row[name][0]  # byte fields may be listed twice
            value: object = got if isinstance(want, str) else int(got, 0)
            assert value == want, (where, name, got, want)
            checked += 1
    assert checked > 6 * len(pkts)
