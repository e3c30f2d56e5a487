"""The decoded form of one RoCEv2 packet.

The engine builds and consumes :class:`Packet` objects; it never sees bytes.
The in-process fabric moves them as they are, and the UDP fabric and the pcap
tap turn them into real frames with :mod:`softverbs.wire.codec`.

A packet is a flat record: every field of every extended header has a slot,
and :data:`~softverbs.wire.opcodes.OPINFO` says which of them are meaningful
for the packet's opcode.  Flat slots keep packet construction cheap on the
hot path (one object, no nested header objects).

Segmentation offload
--------------------
A :class:`Burst` is several consecutive packets of one message as one
object, as a NIC's host interface sees a TSO send or an LRO receive: the
header of the first packet, the PSN range, and the payload of all of them.
Requesters and responders emit bursts; a fabric that moves packet objects
(the in-process fabric) hands them on whole, and a receiver executes a
burst in one step -- one key and bounds check, one copy.  Whatever must see
single packets -- the UDP fabric, the fault layer, a pcap tap, a receiver
whose burst does not continue what it expects -- splits it with
:meth:`Burst.segments`, which yields exactly the packets the sender would
have sent one by one.  PSN semantics therefore never change: a burst is an
encoding of the packet sequence, not a new kind of packet.

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


def is_multicast_gid(gid: bytes) -> bool:
    """A multicast GID: ff00::/8, or an IPv4-mapped 224.0.0.0/4 address (the
    kernel's ``rdma_is_multicast_addr``)."""
    if len(gid) != 16:
        return False
    if gid[0] == 0xFF:
        return True
    return gid[:12] == IPV4_MAPPED_PREFIX and 224 <= gid[12] <= 239


def gid_text(gid: bytes) -> str:
    """A GID as an IPv6 address (an IPv4-mapped one as ``::ffff:a.b.c.d``)."""
    import ipaddress

    return str(ipaddress.IPv6Address(bytes(gid))) if len(gid) == 16 else gid.hex()

DEFAULT_PKEY = 0xFFFF


#: a :class:`Packet`'s fields, grouped by header (compiled, Packet is an extension
#: type whose fields packet.pxd declares, and it has no ``__slots__`` to list them)
FIELDS = (
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


class Packet:
    """One RoCEv2 packet, decoded."""

    # count is no header field: the packets this object stands for (a Burst has
    # more than one), read for every packet -- a slot, which compiled is a C
    # integer (packet.pxd), not a class attribute found by a lookup by name
    __slots__ = (*FIELDS, "count")

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
    count: int  #: packets this object stands for: 1, or a Burst's count

    def __init__(self, opcode: int, dqpn: int, psn: int, payload: Any = b"") -> None:
        self._init(opcode, dqpn, psn, payload)

    def _init(self, opcode: int, dqpn: int, psn: int, payload: Any) -> None:
        """A new packet's fields: the constructor's and :func:`new_packet`'s one list
        (compiled a C method, so new_packet fills a packet by a C call)."""
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
        self.count = 1

    def copy(self) -> Packet:
        """A shallow copy (the payload is shared; it is never mutated)."""
        new = Packet.__new__(Packet)
        _copy_fields(self, new)
        return new

    def segments(self) -> tuple[Packet, ...]:
        """The single packets this object stands for: itself."""
        return (self,)

    def __repr__(self) -> str:
        from softverbs.wire.opcodes import OPINFO

        info = OPINFO[self.opcode]
        name = info.name if info else f"opcode {self.opcode:#04x}"
        return f"<Packet {name} dqpn={self.dqpn:#x} psn={self.psn} len={len(self.payload)}>"


def new_packet(opcode: int, dqpn: int, psn: int, payload: Any = b"") -> Packet:
    """``Packet(opcode, dqpn, psn, payload)``, as the engine makes its requests and
    responses: compiled, the object is made by the type's tp_new and filled
    by a C call (:meth:`Packet._init`), without the constructor's call through the
    type and its argument parsing (one of each per packet)."""
    pkt = Packet.__new__(Packet)
    pkt._init(opcode, dqpn, psn, payload)
    return pkt


class Burst(Packet):
    """Packets ``first_index`` .. ``first_index + count - 1`` of a message of
    ``msg_packets`` packets (see "Segmentation offload" above).

    The :class:`Packet` fields describe the burst as a whole: ``opcode`` and
    ``psn`` are the first packet's, ``payload`` is every packet's payload in
    turn (``seg`` bytes each, the message's last packet possibly shorter),
    the RETH fields are the message's (carried by its first packet), and
    ``imm``, ``inv_rkey`` and ``se`` are its last packet's.  ``ops`` are the
    message's (FIRST, MIDDLE, LAST, ONLY) opcodes.  ``ack_every`` is 0 for
    packets that never ask for an ACK; otherwise the message's last packet
    asks, and so does every ``ack_every``-th packet of the message.
    """

    __slots__ = ("ack_every", "first_index", "last_opcode", "msg_packets", "ops", "seg")

    ack_every: int
    first_index: int
    last_opcode: int
    msg_packets: int
    ops: tuple[int, int, int, int]
    seg: int

    def segments(self) -> tuple[Packet, ...]:
        return tuple(self.segment(j) for j in range(self.count))

    def segment(self, j: int) -> Packet:
        """Packet ``j`` of the burst, as it goes on the wire."""
        pkt = Packet.__new__(Packet)
        _copy_fields(self, pkt)
        seg = self.seg
        pkt.psn = (self.psn + j) & 0xFFFFFF
        pkt.payload = self.payload[j * seg : (j + 1) * seg]
        _shape(pkt, self.ops, self.first_index + j, self.msg_packets, self.ack_every)
        return pkt

    def __repr__(self) -> str:
        from softverbs.wire.opcodes import OPINFO

        info = OPINFO[self.opcode]
        name = info.name if info else f"opcode {self.opcode:#04x}"
        return (f"<Burst {self.count} x {name}.. dqpn={self.dqpn:#x} psn={self.psn} "
                f"len={len(self.payload)}>")  # fmt: skip


def burst(template: Packet, ops: tuple[int, int, int, int], first_index: int, count: int,
          msg_packets: int, seg: int, ack_every: int) -> Packet:  # fmt: skip
    """Packets ``first_index`` .. ``+count`` of a message, from ``template`` (the
    message's addressing, RETH, and last-packet fields; its payload is the
    burst's): the template itself, shaped, if ``count`` is 1, else a
    :class:`Burst`."""
    if count == 1:
        _shape(template, ops, first_index, msg_packets, ack_every)
        return template
    b = Burst.__new__(Burst)
    _copy_fields(template, b)
    b.ops = ops
    b.first_index = first_index
    b.count = count
    b.msg_packets = msg_packets
    b.seg = seg
    b.ack_every = ack_every
    last = first_index + count - 1
    b.opcode = _opcode_at(ops, first_index, msg_packets)
    b.last_opcode = _opcode_at(ops, last, msg_packets)
    if first_index != 0:
        b.va = b.rkey = b.dma_len = 0
    if last != msg_packets - 1:
        b.imm = b.inv_rkey = 0
        b.se = False
    b.ackreq = ack_every > 0 and (last == msg_packets - 1 or
                                  (first_index + count) // ack_every > first_index // ack_every)
    return b


def _opcode_at(ops: tuple[int, int, int, int], i: int, n: int) -> int:
    """The opcode of packet ``i`` of an ``n``-packet message."""
    first, middle, last, only = ops
    return only if n == 1 else first if i == 0 else last if i == n - 1 else middle


def _shape(pkt: Packet, ops: tuple[int, int, int, int], i: int, n: int, ack_every: int) -> None:
    """Make ``pkt`` packet ``i`` of an ``n``-packet message: its opcode, the
    RETH only on the first, the last packet's fields only on the last, AckReq."""
    pkt.opcode = _opcode_at(ops, i, n)
    pkt.pad = (-len(pkt.payload)) & 3
    if i != 0:
        pkt.va = pkt.rkey = pkt.dma_len = 0
    if i != n - 1:
        pkt.imm = pkt.inv_rkey = 0
        pkt.se = False
    pkt.ackreq = ackreq_at(i, n, ack_every)


def ackreq_at(i: int, n: int, ack_every: int) -> bool:
    """Whether packet ``i`` of an ``n``-packet message asks for an ACK: the
    last one and every ``ack_every``-th, if ``ack_every`` (0: none)."""
    return ack_every > 0 and (i == n - 1 or (i + 1) % ack_every == 0)


def ackreq_indexes(first: int, n: int, ack_every: int, count: int) -> list[int]:
    """Which of ``count`` packets from packet ``first`` of an ``n``-packet
    message ask for an ACK (:func:`ackreq_at`), by their place in the run."""
    if ack_every <= 0:
        return []
    start = (ack_every - 1 - first) % ack_every  # the first j with (first + j + 1) % every == 0
    out = list(range(start, count, ack_every))
    if first + count == n and (not out or out[-1] != count - 1):
        out.append(count - 1)  # the message's last
    return out


def _copy_fields(src: Packet, dst: Packet) -> None:
    """Every :class:`Packet` field of ``src`` onto ``dst`` (all of :data:`FIELDS`,
    which tests/engine/test_bursts.py checks), ``dst`` one packet (``count`` 1;
    :func:`burst` sets a burst's): one store each, which compiled are C struct
    copies (packet.pxd); a copy, a burst and each packet split from one are
    made this way."""
    dst.count = 1
    dst.opcode = src.opcode
    dst.se = src.se
    dst.mig = src.mig
    dst.pad = src.pad
    dst.tver = src.tver
    dst.pkey = src.pkey
    dst.fecn = src.fecn
    dst.becn = src.becn
    dst.dqpn = src.dqpn
    dst.ackreq = src.ackreq
    dst.psn = src.psn
    dst.va = src.va
    dst.rkey = src.rkey
    dst.dma_len = src.dma_len
    dst.swap_add = src.swap_add
    dst.compare = src.compare
    dst.syndrome = src.syndrome
    dst.msn = src.msn
    dst.orig = src.orig
    dst.qkey = src.qkey
    dst.src_qp = src.src_qp
    dst.imm = src.imm
    dst.inv_rkey = src.inv_rkey
    dst.srqn = src.srqn
    dst.payload = src.payload
    dst.sgid = src.sgid
    dst.dgid = src.dgid
    dst.sport = src.sport
    dst.tclass = src.tclass
    dst.flow_label = src.flow_label
    dst.hop_limit = src.hop_limit
    dst.sqpn = src.sqpn
    dst.corrupt_bit = src.corrupt_bit


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
