"""The decoded form of one RoCEv2 packet.

The engine builds and consumes :class:`Packet` objects; it never sees bytes.
The in-process fabric moves them as they are, and the UDP fabric and the pcap
tap turn them into real frames with :mod:`softverbs.wire.codec`.

A packet is a flat record: every field of every extended header has a slot,
and :data:`~softverbs.wire.opcodes.OPINFO` says which of them are meaningful
for the packet's opcode.  Flat slots keep packet construction cheap on the
hot path (one object, no nested header objects).

Byte-order conventions:

* ``imm`` is the verbs-level ``imm_data`` value (C type ``__be32``): the codec
  writes it in *host* byte order, so the bytes on the wire are the bytes the
  application stored, as a NIC's DMA engine would send them.
* every other field is a plain unsigned integer, big-endian on the wire.
* ``sgid``/``dgid`` are 16-byte GIDs; an IPv4-mapped GID (``::ffff:a.b.c.d``)
  means RoCEv2 over IPv4, any other GID means IPv6.
"""

from __future__ import annotations

from typing import Any

#: The GID prefix of an IPv4-mapped address (::ffff:0:0/96).
IPV4_MAPPED_PREFIX = b"\x00" * 10 + b"\xff\xff"

DEFAULT_PKEY = 0xFFFF


class Packet:
    """One RoCEv2 packet, decoded."""

    __slots__ = (  # noqa: RUF023 - grouped by header, not sorted
        # BTH
        "opcode",
        "se",
        "mig",
        "pad",
        "tver",
        "pkey",
        "fecn",
        "becn",
        "dqpn",
        "ackreq",
        "psn",
        # RETH / AtomicETH
        "va",
        "rkey",
        "dma_len",
        "swap_add",
        "compare",
        # AETH / AtomicAckETH
        "syndrome",
        "msn",
        "orig",
        # DETH
        "qkey",
        "src_qp",
        # ImmDt, IETH, XRCETH
        "imm",
        "inv_rkey",
        "srqn",
        # data
        "payload",
        # network and UDP layers (GRH fields in IB terms)
        "sgid",
        "dgid",
        "sport",
        "tclass",
        "flow_label",
        "hop_limit",
        # not on the wire: the sending QP, for the UDP source port and traces
        "sqpn",
        # not on the wire: fault injection flips this bit of the encoded packet
        "corrupt_bit",
    )

    opcode: int
    se: bool
    mig: bool
    pad: int
    tver: int
    pkey: int
    fecn: bool
    becn: bool
    dqpn: int
    ackreq: bool
    psn: int
    va: int
    rkey: int
    dma_len: int
    swap_add: int
    compare: int
    syndrome: int
    msn: int
    orig: int
    qkey: int
    src_qp: int
    imm: int
    inv_rkey: int
    srqn: int
    payload: bytes | bytearray | memoryview
    sgid: bytes
    dgid: bytes
    sport: int
    tclass: int
    flow_label: int
    hop_limit: int
    sqpn: int
    corrupt_bit: int

    def __init__(self, opcode: int, dqpn: int, psn: int, payload: Any = b"") -> None:
        self.opcode = opcode
        self.dqpn = dqpn
        self.psn = psn
        self.payload = payload
        self.se = False
        self.mig = False
        self.pad = (-len(payload)) & 3
        self.tver = 0
        self.pkey = DEFAULT_PKEY
        self.fecn = False
        self.becn = False
        self.ackreq = False
        self.va = 0
        self.rkey = 0
        self.dma_len = 0
        self.swap_add = 0
        self.compare = 0
        self.syndrome = 0
        self.msn = 0
        self.orig = 0
        self.qkey = 0
        self.src_qp = 0
        self.imm = 0
        self.inv_rkey = 0
        self.srqn = 0
        self.sgid = b"\x00" * 16
        self.dgid = b"\x00" * 16
        self.sport = 0
        self.tclass = 0
        self.flow_label = 0
        self.hop_limit = 64
        self.sqpn = 0
        self.corrupt_bit = -1

    def copy(self) -> Packet:
        """A shallow copy (the payload is shared; it is never mutated)."""
        new = Packet.__new__(Packet)
        for name in Packet.__slots__:
            setattr(new, name, getattr(self, name))
        return new

    def __repr__(self) -> str:
        from softverbs.wire.opcodes import OPINFO

        info = OPINFO[self.opcode]
        name = info.name if info else f"opcode {self.opcode:#04x}"
        return f"<Packet {name} dqpn={self.dqpn:#x} psn={self.psn} len={len(self.payload)}>"


def is_ipv4_gid(gid: bytes) -> bool:
    return gid[:12] == IPV4_MAPPED_PREFIX


def qp_sport(qpn: int) -> int:
    """The UDP source port rxe gives a QP when it creates it: 0xC000 + hash_32(qpn, 14).

    A QP keeps it until an address vector names a peer QP (RC, UC: then
    :func:`udp_sport`), so a UD QP sends from it for good.  The golden
    ``ud_pingpong`` capture has QPN 0x13 sending from 53368, and every CM MAD
    (QP1) leaves from 55410.
    """
    return 0xC000 + ((((qpn & 0xFFFFFF) * 0x61C88647) & 0xFFFFFFFF) >> 18)


def udp_sport(lqpn: int, rqpn: int, flow_label: int = 0) -> int:
    """The UDP source port rxe (rdma_get_udp_sport) uses for a QP pair.

    With no flow label the label is derived from the two QP numbers, so
    every connection hashes to a stable port in 0xC000..0xFFFF.
    """
    if not flow_label:
        v = lqpn * rqpn
        v ^= v >> 20
        v ^= v >> 40
        flow_label = v & 0xFFFFF
    return 0xC000 | ((flow_label & 0x3FFF) ^ (flow_label >> 14))
