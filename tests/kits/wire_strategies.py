"""Shared helpers for the wire tests: hypothesis strategies and field comparison.

Imported by the test modules of this directory (pytest's default "prepend"
import mode puts this directory on sys.path; the tests have no __init__.py).
"""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import strategies as st

from softverbs.wire.opcodes import CNP_RESERVED, OPINFO, Hdr, Kind
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet

#: Every opcode softverbs speaks.
OPCODES: list[int] = [info.opcode for info in OPINFO if info is not None]

U8 = st.integers(0, 0xFF)
U16 = st.integers(0, 0xFFFF)
U24 = st.integers(0, 0xFFFFFF)
U32 = st.integers(0, 0xFFFFFFFF)
U64 = st.integers(0, 2**64 - 1)

#: Fields that each extended header carries.
HDR_FIELDS: dict[Hdr, tuple[str, ...]] = {
    Hdr.XRCETH: ("srqn",),
    Hdr.DETH: ("qkey", "src_qp"),
    Hdr.RETH: ("va", "rkey", "dma_len"),
    Hdr.ATOMICETH: ("va", "rkey", "swap_add", "compare"),
    Hdr.AETH: ("syndrome", "msn"),
    Hdr.ATOMICACKETH: ("orig",),
    Hdr.IMMDT: ("imm",),
    Hdr.IETH: ("inv_rkey",),
}
BTH_FIELDS = ("opcode", "se", "mig", "tver", "pkey", "fecn", "becn", "dqpn", "ackreq", "psn")


def wire_fields(opcode: int) -> tuple[str, ...]:
    """The Packet fields that are on the wire for ``opcode`` (payload aside)."""
    info = OPINFO[opcode]
    assert info is not None
    fields = list(BTH_FIELDS)
    for flag, names in HDR_FIELDS.items():
        if info.hdrs & flag:
            fields.extend(n for n in names if n not in fields)
    return tuple(fields)


def assert_same_packet(a: Packet, b: Packet, extra: tuple[str, ...] = ()) -> None:
    for name in wire_fields(a.opcode) + extra:
        assert getattr(a, name) == getattr(b, name), name
    assert bytes(a.payload) == bytes(b.payload)


@st.composite
def packets(draw: st.DrawFn, opcode: int | None = None, max_payload: int = 300) -> Packet:
    """A Packet with random values in every field its opcode puts on the wire."""
    if opcode is None:
        opcode = draw(st.sampled_from(OPCODES))
    info = OPINFO[opcode]
    assert info is not None
    payload = draw(st.binary(max_size=max_payload)) if info.payload else b""
    if info.kind is Kind.CNP:
        payload = bytes(CNP_RESERVED)  # the annex's CNP: 16 reserved bytes, zero
    pkt = Packet(opcode, draw(U24), draw(U24), payload)
    pkt.se = draw(st.booleans())
    pkt.mig = draw(st.booleans())
    pkt.pkey = draw(U16)
    pkt.fecn = draw(st.booleans())
    pkt.becn = draw(st.booleans())
    pkt.ackreq = draw(st.booleans())
    if info.hdrs & Hdr.XRCETH:
        pkt.srqn = draw(U24)
    if info.hdrs & Hdr.DETH:
        pkt.qkey = draw(U32)
        pkt.src_qp = draw(U24)
    if info.hdrs & (Hdr.RETH | Hdr.ATOMICETH):
        pkt.va = draw(U64)
        pkt.rkey = draw(U32)
    if info.hdrs & Hdr.RETH:
        pkt.dma_len = draw(U32)
    if info.hdrs & Hdr.ATOMICETH:
        pkt.swap_add = draw(U64)
        pkt.compare = draw(U64)
    if info.hdrs & Hdr.AETH:
        pkt.syndrome = draw(U8)
        pkt.msn = draw(U24)
    if info.hdrs & Hdr.ATOMICACKETH:
        pkt.orig = draw(U64)
    if info.hdrs & Hdr.IMMDT:
        pkt.imm = draw(U32)
    if info.hdrs & Hdr.IETH:
        pkt.inv_rkey = draw(U32)
    return pkt


def sample_packet(opcode: int, seed: int = 0, max_payload: int = 40) -> Packet:
    """A deterministic packet with pseudo-random values in every wire field."""
    rng = random.Random(seed * 256 + opcode)
    info = OPINFO[opcode]
    assert info is not None
    payload = rng.randbytes(rng.randrange(max_payload + 1)) if info.payload else b""
    if info.kind is Kind.CNP:
        payload = bytes(CNP_RESERVED)  # the annex's CNP: 16 reserved bytes, zero
    pkt = Packet(opcode, rng.getrandbits(24), rng.getrandbits(24), payload)
    for name in ("se", "mig", "fecn", "becn", "ackreq"):
        setattr(pkt, name, bool(rng.getrandbits(1)))
    pkt.pkey = rng.getrandbits(16)
    widths = {"srqn": 24, "src_qp": 24, "msn": 24, "syndrome": 8, "va": 64, "swap_add": 64}
    widths |= {"compare": 64, "orig": 64}
    for flag, names in HDR_FIELDS.items():
        if info.hdrs & flag:
            for name in names:
                setattr(pkt, name, rng.getrandbits(widths.get(name, 32)))
    return pkt


ipv4_addrs = st.binary(min_size=4, max_size=4)
ipv6_addrs = st.binary(min_size=16, max_size=16).filter(lambda a: a[:12] != IPV4_MAPPED_PREFIX)
ports = U16


@st.composite
def addressed_packets(draw: st.DrawFn, v6: bool, max_payload: int = 300) -> Packet:
    """A packet with GIDs, UDP port and the IP-level fields set."""
    pkt = draw(packets(max_payload=max_payload))
    if v6:
        pkt.sgid = draw(ipv6_addrs)
        pkt.dgid = draw(ipv6_addrs)
        pkt.flow_label = draw(st.integers(0, 0xFFFFF))
    else:
        pkt.sgid = IPV4_MAPPED_PREFIX + draw(ipv4_addrs)
        pkt.dgid = IPV4_MAPPED_PREFIX + draw(ipv4_addrs)
    pkt.sport = draw(ports)
    pkt.tclass = draw(U8)
    pkt.hop_limit = draw(U8)
    return pkt


def ip_of(gid: bytes) -> bytes:
    """The 4- or 16-byte IP address of a GID."""
    return gid[12:] if gid[:12] == IPV4_MAPPED_PREFIX else gid


def golden_dir() -> Path | None:
    """The golden rxe captures: the repo's copy, else ../shared beside the repo."""
    here = Path(__file__).resolve()
    for cand in (
        here.parents[1] / "data" / "golden",
        here.parents[2].parent / "shared" / "peer" / "golden",
    ):
        if cand.is_dir() and any(cand.glob("*.pcap")):
            return cand
    return None
