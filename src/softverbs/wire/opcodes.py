"""The InfiniBand transport opcode table (IBA vol. 1, 9.2 and table 38).

An 8-bit BTH opcode is a transport prefix (bits 7..5) plus an operation
(bits 4..0).  Everything the engine and the codecs need to know about an
opcode -- which extended headers follow the BTH, whether it carries payload,
where it sits in a multi-packet message -- is data in :data:`OPINFO`, indexed
by the raw opcode.  Nothing else in the package branches on opcode numbers.

Header order after the BTH is fixed by the spec:
XRCETH, DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, payload.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class Transport(IntEnum):
    """Transport prefix of the BTH opcode (bits 7..5)."""

    RC = 0x00
    UC = 0x20
    RD = 0x40
    UD = 0x60
    CNP = 0x80  #: RoCEv2 congestion notification packets
    XRC = 0xA0


class Op(IntEnum):
    """Operation part of the BTH opcode (bits 4..0)."""

    SEND_FIRST = 0
    SEND_MIDDLE = 1
    SEND_LAST = 2
    SEND_LAST_WITH_IMMEDIATE = 3
    SEND_ONLY = 4
    SEND_ONLY_WITH_IMMEDIATE = 5
    RDMA_WRITE_FIRST = 6
    RDMA_WRITE_MIDDLE = 7
    RDMA_WRITE_LAST = 8
    RDMA_WRITE_LAST_WITH_IMMEDIATE = 9
    RDMA_WRITE_ONLY = 10
    RDMA_WRITE_ONLY_WITH_IMMEDIATE = 11
    RDMA_READ_REQUEST = 12
    RDMA_READ_RESPONSE_FIRST = 13
    RDMA_READ_RESPONSE_MIDDLE = 14
    RDMA_READ_RESPONSE_LAST = 15
    RDMA_READ_RESPONSE_ONLY = 16
    ACKNOWLEDGE = 17
    ATOMIC_ACKNOWLEDGE = 18
    COMPARE_SWAP = 19
    FETCH_ADD = 20
    SEND_LAST_WITH_INVALIDATE = 22
    SEND_ONLY_WITH_INVALIDATE = 23


class Hdr(IntFlag):
    """Which extended transport headers follow the BTH."""

    XRCETH = 1 << 0  #: 4 bytes: XRC SRQ number
    DETH = 1 << 1  #: 8 bytes: Q_Key, source QP (UD)
    RETH = 1 << 2  #: 16 bytes: VA, R_Key, DMA length
    ATOMICETH = 1 << 3  #: 28 bytes: VA, R_Key, swap/add, compare
    AETH = 1 << 4  #: 4 bytes: syndrome, MSN
    ATOMICACKETH = 1 << 5  #: 8 bytes: original remote value
    IMMDT = 1 << 6  #: 4 bytes: immediate data
    IETH = 1 << 7  #: 4 bytes: R_Key to invalidate


class Kind(IntEnum):
    """What a packet does, independent of transport and position."""

    SEND = 0
    WRITE = 1
    READ_REQ = 2
    READ_RESP = 3
    ACK = 4
    ATOMIC = 5
    ATOMIC_ACK = 6
    CNP = 7  #: a RoCEv2 congestion notification packet (annex A17.9.3)


#: Position bits of a packet inside its message.
FIRST = 1
LAST = 2
MIDDLE = 0
ONLY = FIRST | LAST


class OpInfo:
    """Static facts about one opcode: one record per opcode in :data:`OPINFO`,
    built once and never changed.

    A plain record rather than a tuple: the engine reads several of its fields
    for every packet, and compiled (opcodes.pxd) it is an extension type with
    typed read-only fields, so an engine method that declares its ``info``
    argument an ``OpInfo`` reads a field as a C struct member.
    """

    __slots__ = ("first", "hdrs", "imm", "inv", "kind", "last", "name", "op", "opcode", "payload",
                 "position", "request", "transport")  # fmt: skip

    opcode: int
    name: str
    transport: Transport
    op: Op
    kind: Kind
    position: int  #: FIRST, MIDDLE, LAST or ONLY
    hdrs: Hdr
    payload: bool  #: may carry payload bytes
    request: bool  #: sent by a requester (False: a response from a responder)
    # Derived facts, stored rather than computed: the engine reads them for
    # every packet, and IntFlag arithmetic is slow.
    first: bool  #: FIRST or ONLY
    last: bool  #: LAST or ONLY
    imm: bool  #: carries ImmDt
    inv: bool  #: carries IETH

    def __init__(self, opcode: int, name: str, transport: Transport, op: Op, kind: Kind,
                 position: int, hdrs: Hdr, payload: bool, request: bool) -> None:  # fmt: skip
        self.opcode = opcode
        self.name = name
        self.transport = transport
        self.op = op
        self.kind = kind
        self.position = position
        self.hdrs = hdrs
        self.payload = payload
        self.request = request
        self.first = bool(position & FIRST)
        self.last = bool(position & LAST)
        self.imm = bool(hdrs & Hdr.IMMDT)
        self.inv = bool(hdrs & Hdr.IETH)

    def __repr__(self) -> str:
        return f"<OpInfo {self.name} {self.opcode:#04x}>"


# (op, kind, position, headers before the transport-specific ones, payload)
_OPS: tuple[tuple[Op, Kind, int, Hdr, bool], ...] = (
    (Op.SEND_FIRST, Kind.SEND, FIRST, Hdr(0), True),
    (Op.SEND_MIDDLE, Kind.SEND, MIDDLE, Hdr(0), True),
    (Op.SEND_LAST, Kind.SEND, LAST, Hdr(0), True),
    (Op.SEND_LAST_WITH_IMMEDIATE, Kind.SEND, LAST, Hdr.IMMDT, True),
    (Op.SEND_ONLY, Kind.SEND, ONLY, Hdr(0), True),
    (Op.SEND_ONLY_WITH_IMMEDIATE, Kind.SEND, ONLY, Hdr.IMMDT, True),
    (Op.RDMA_WRITE_FIRST, Kind.WRITE, FIRST, Hdr.RETH, True),
    (Op.RDMA_WRITE_MIDDLE, Kind.WRITE, MIDDLE, Hdr(0), True),
    (Op.RDMA_WRITE_LAST, Kind.WRITE, LAST, Hdr(0), True),
    (Op.RDMA_WRITE_LAST_WITH_IMMEDIATE, Kind.WRITE, LAST, Hdr.IMMDT, True),
    (Op.RDMA_WRITE_ONLY, Kind.WRITE, ONLY, Hdr.RETH, True),
    (Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE, Kind.WRITE, ONLY, Hdr.RETH | Hdr.IMMDT, True),
    (Op.RDMA_READ_REQUEST, Kind.READ_REQ, ONLY, Hdr.RETH, False),
    (Op.RDMA_READ_RESPONSE_FIRST, Kind.READ_RESP, FIRST, Hdr.AETH, True),
    (Op.RDMA_READ_RESPONSE_MIDDLE, Kind.READ_RESP, MIDDLE, Hdr(0), True),
    (Op.RDMA_READ_RESPONSE_LAST, Kind.READ_RESP, LAST, Hdr.AETH, True),
    (Op.RDMA_READ_RESPONSE_ONLY, Kind.READ_RESP, ONLY, Hdr.AETH, True),
    (Op.ACKNOWLEDGE, Kind.ACK, ONLY, Hdr.AETH, False),
    (Op.ATOMIC_ACKNOWLEDGE, Kind.ATOMIC_ACK, ONLY, Hdr.AETH | Hdr.ATOMICACKETH, False),
    (Op.COMPARE_SWAP, Kind.ATOMIC, ONLY, Hdr.ATOMICETH, False),
    (Op.FETCH_ADD, Kind.ATOMIC, ONLY, Hdr.ATOMICETH, False),
    (Op.SEND_LAST_WITH_INVALIDATE, Kind.SEND, LAST, Hdr.IETH, True),
    (Op.SEND_ONLY_WITH_INVALIDATE, Kind.SEND, ONLY, Hdr.IETH, True),
)

_RESPONSES = frozenset({Kind.READ_RESP, Kind.ACK, Kind.ATOMIC_ACK})

# Which operations each transport defines (IBA table 38).
_TRANSPORT_OPS: dict[Transport, frozenset[Op]] = {
    Transport.RC: frozenset(op for op, *_ in _OPS),
    Transport.XRC: frozenset(op for op, *_ in _OPS),
    Transport.UC: frozenset(op for op, kind, *_ in _OPS if kind in (Kind.SEND, Kind.WRITE))
    - {Op.SEND_LAST_WITH_INVALIDATE, Op.SEND_ONLY_WITH_INVALIDATE},
    Transport.UD: frozenset({Op.SEND_ONLY, Op.SEND_ONLY_WITH_IMMEDIATE}),
}


#: The CNP's opcode (RoCEv2 annex A17.9.3), and the size of its reserved field.
CNP_OPCODE = 0x81
CNP_RESERVED = 16


def _build() -> tuple[OpInfo | None, ...]:
    table: list[OpInfo | None] = [None] * 256
    for transport, ops in _TRANSPORT_OPS.items():
        for op, kind, position, hdrs, payload in _OPS:
            if op not in ops:
                continue
            request = kind not in _RESPONSES
            if transport is Transport.UD:
                hdrs |= Hdr.DETH
            if transport is Transport.XRC and request:
                hdrs |= Hdr.XRCETH
            code = transport | op
            name = f"{transport.name}_{op.name}"
            table[code] = OpInfo(code, name, transport, op, kind, position, hdrs, payload, request)
    # The RoCEv2 annex's CNP: opcode 0x81, a BTH (DestQP the QP to slow down,
    # BECN set, PSN 0) and 16 reserved bytes, then the ICRC.  It belongs to no
    # transport's operation table; its 16 bytes travel as its payload, so a CNP of
    # the wrong size reaches the device, which judges it (rp_cnp_ignored).
    table[CNP_OPCODE] = OpInfo(
        CNP_OPCODE, "CNP", Transport.CNP, Op(CNP_OPCODE & 0x1F), Kind.CNP, ONLY, Hdr(0), True,
        False,
    )  # fmt: skip
    return tuple(table)


#: OPINFO[opcode] -> OpInfo, or None for opcodes softverbs does not speak.
OPINFO: tuple[OpInfo | None, ...] = _build()

#: Size in bytes of each extended header.
HDR_SIZE: dict[Hdr, int] = {
    Hdr.XRCETH: 4,
    Hdr.DETH: 8,
    Hdr.RETH: 16,
    Hdr.ATOMICETH: 28,
    Hdr.AETH: 4,
    Hdr.ATOMICACKETH: 8,
    Hdr.IMMDT: 4,
    Hdr.IETH: 4,
}

BTH_SIZE = 12
ICRC_SIZE = 4
ROCEV2_PORT = 4791


def opcode(transport: Transport, op: Op) -> int:
    """The raw opcode for ``op`` on ``transport``; ValueError if undefined."""
    code = transport | op
    if OPINFO[code] is None:
        raise ValueError(f"{op.name} is not defined for transport {transport.name}")
    return code


def header_length(hdrs: Hdr) -> int:
    """Bytes of BTH plus the given extended headers."""
    return BTH_SIZE + sum(size for flag, size in HDR_SIZE.items() if hdrs & flag)


# --- AETH syndromes (IBA 9.7.5.2.2) ---------------------------------------
#: Bits 6..5 of the AETH syndrome.
AETH_ACK = 0b00
AETH_RNR_NAK = 0b01
AETH_NAK = 0b11

#: NAK codes (low 5 bits of a NAK syndrome).
NAK_PSN_SEQUENCE_ERROR = 0
NAK_INVALID_REQUEST = 1
NAK_REMOTE_ACCESS_ERROR = 2
NAK_REMOTE_OPERATIONAL_ERROR = 3
NAK_INVALID_RD_REQUEST = 4

#: Credit field value meaning "no end-to-end credits advertised".
AETH_CREDIT_INVALID = 0b11111


def aeth_syndrome(kind: int, value: int) -> int:
    """Pack an AETH syndrome byte from its 2-bit kind and 5-bit value."""
    return ((kind & 0b11) << 5) | (value & 0x1F)


def aeth_kind(syndrome: int) -> int:
    return (syndrome >> 5) & 0b11


def aeth_value(syndrome: int) -> int:
    return syndrome & 0x1F
