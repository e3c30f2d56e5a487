"""IBTA communication-management MADs: the bytes of REQ, REP, RTU, REJ, ...

A CM message is a 256-byte MAD (IBA vol. 1, chapter 12.6): the 24-byte
common MAD header (base version 1, management class 7 = CM, class version 2,
method SEND) followed by the attribute, whose layout depends on the
attribute ID.  On RoCE it travels as the payload of a UD SEND_ONLY to QP1
with Q_Key 0x80010000 -- which is exactly what rxe puts on the wire
(``tests/data/golden/send_bw_cm.pcap``).

Every attribute is described by a table of :class:`Field` entries (byte
offset, width of the big-endian word holding the field, bit shift, bit
count), so decoding and encoding are the same walk in two directions, and
a message that decodes re-encodes to the same bytes whenever its reserved
bits are zero.  :func:`decode` never raises anything but :class:`MadError`,
whose ``reason`` names the drop counter (``cm_drop_<reason>``).

The rdma_cm layer puts its own header in front of the user's private data
of REQ and SIDR_REQ (:class:`CmaHeader`, ``struct cma_hdr`` in the kernel's
``cma.c``): version 0, IP version in the high nibble, the active side's
port, and the source and destination IP addresses -- an IPv4 address sits
in the last 4 bytes of its 16-byte slot.  The service ID of an IP port space
is ``port space << 16 | port`` (``0x0000000001060000 | port`` for
RDMA_PS_TCP).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

#: The GSI QP and its well-known Q_Key.
GSI_QPN = 1
GSI_QKEY = 0x80010000

MAD_SIZE = 256
MAD_HEADER_SIZE = 24
BASE_VERSION = 1
MGMT_CLASS_CM = 0x07
CM_CLASS_VERSION = 2
METHOD_GET = 0x01
METHOD_SET = 0x02
METHOD_SEND = 0x03
METHOD_GET_RESP = 0x81

# Attribute IDs (IBA table 12-7.x).
ATTR_CLASS_PORT_INFO = 0x0001
ATTR_REQ = 0x0010
ATTR_MRA = 0x0011
ATTR_REJ = 0x0012
ATTR_REP = 0x0013
ATTR_RTU = 0x0014
ATTR_DREQ = 0x0015
ATTR_DREP = 0x0016
ATTR_SIDR_REQ = 0x0017
ATTR_SIDR_REP = 0x0018
ATTR_LAP = 0x0019
ATTR_APR = 0x001A

# Private data sizes (IB_CM_*_PRIVATE_DATA_SIZE).
REQ_PRIVATE_DATA_SIZE = 92
MRA_PRIVATE_DATA_SIZE = 222
REJ_PRIVATE_DATA_SIZE = 148
REP_PRIVATE_DATA_SIZE = 196
RTU_PRIVATE_DATA_SIZE = 224
DREQ_PRIVATE_DATA_SIZE = 220
DREP_PRIVATE_DATA_SIZE = 224
SIDR_REQ_PRIVATE_DATA_SIZE = 216
SIDR_REP_PRIVATE_DATA_SIZE = 136
REJ_ARI_LENGTH = 72
SIDR_REP_INFO_LENGTH = 72

# REJ reasons (enum ib_cm_rej_reason) that softverbs sends or reads.
REJ_NO_QP = 1
REJ_INVALID_COMM_ID = 5
REJ_INVALID_SERVICE_ID = 8
REJ_STALE_CONN = 10
REJ_TIMEOUT = 26
REJ_CONSUMER_DEFINED = 28

# "Message rejected/MRAed" codes of REJ and MRA.
MSG_REQ = 0
MSG_REP = 1
MSG_OTHER = 2

# SIDR_REP status (enum ib_cm_sidr_status).
SIDR_SUCCESS = 0
SIDR_UNSUPPORTED = 1
SIDR_REJECT = 2
SIDR_NO_QP = 3
SIDR_REDIRECT = 4
SIDR_UNSUPPORTED_VERSION = 5

#: rdma_cm's port spaces as they appear in a service ID (``ps << 16 | port``).
SERVICE_ID_PS_MASK = 0xFFFFFFFFFFFF0000


class MadError(Exception):
    """A received MAD is not a well-formed CM message; ``reason`` names the counter."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Field:
    """One field: ``bits`` bits at ``shift`` in the big-endian word of
    ``size`` bytes at byte ``offset`` of the MAD."""

    name: str
    offset: int
    size: int
    shift: int = 0
    bits: int = 0

    @property
    def mask(self) -> int:
        return (1 << (self.bits or self.size * 8)) - 1


@dataclass(frozen=True, slots=True)
class Blob:
    """Raw bytes: a GID, the REJ ARI, private data."""

    name: str
    offset: int
    size: int


_WORD = {1: struct.Struct(">B"), 2: struct.Struct(">H"), 4: struct.Struct(">I"),
         8: struct.Struct(">Q")}  # fmt: skip
_HEADER = struct.Struct(">BBBBHHQHHI")


def _path(prefix: str, at: int) -> tuple[Field | Blob, ...]:
    """The 44-byte path description of a REQ (primary at 76, alternate at 120)."""
    return (
        Field(f"{prefix}_local_lid", at, 2),
        Field(f"{prefix}_remote_lid", at + 2, 2),
        Blob(f"{prefix}_local_gid", at + 4, 16),
        Blob(f"{prefix}_remote_gid", at + 20, 16),
        Field(f"{prefix}_flow_label", at + 36, 4, 12, 20),
        Field(f"{prefix}_packet_rate", at + 36, 4, 0, 6),
        Field(f"{prefix}_traffic_class", at + 40, 1),
        Field(f"{prefix}_hop_limit", at + 41, 1),
        Field(f"{prefix}_sl", at + 42, 1, 4, 4),
        Field(f"{prefix}_subnet_local", at + 42, 1, 3, 1),
        Field(f"{prefix}_local_ack_timeout", at + 43, 1, 3, 5),
    )


@dataclass(slots=True)
class CmMessage:
    """Common MAD header fields; subclasses add their attribute's fields."""

    ATTR_ID: ClassVar[int] = 0
    LAYOUT: ClassVar[tuple[Field | Blob, ...]] = ()
    NAME: ClassVar[str] = "?"

    tid: int = 0
    method: int = METHOD_SEND
    status: int = 0
    class_specific: int = 0
    attr_mod: int = 0

    def encode(self) -> bytes:
        buf = bytearray(MAD_SIZE)
        _HEADER.pack_into(buf, 0, BASE_VERSION, MGMT_CLASS_CM, CM_CLASS_VERSION, self.method,
                          self.status, self.class_specific, self.tid, self.ATTR_ID, 0,
                          self.attr_mod)  # fmt: skip
        for f in self.LAYOUT:
            value = getattr(self, f.name)
            if isinstance(f, Blob):
                data = bytes(value)[: f.size]
                buf[f.offset : f.offset + len(data)] = data
                continue
            word = _WORD[f.size]
            current = word.unpack_from(buf, f.offset)[0]
            current |= (int(value) & f.mask) << f.shift
            word.pack_into(buf, f.offset, current)
        return bytes(buf)

    @classmethod
    def _from(cls, data: bytes, hdr: tuple[int, ...]) -> CmMessage:
        values: dict[str, Any] = {}
        for f in cls.LAYOUT:
            if isinstance(f, Blob):
                values[f.name] = bytes(data[f.offset : f.offset + f.size])
            else:
                values[f.name] = (_WORD[f.size].unpack_from(data, f.offset)[0] >> f.shift) & f.mask
        msg = cls(**values)
        msg.method, msg.status, msg.class_specific, msg.tid = hdr[3], hdr[4], hdr[5], hdr[6]
        msg.attr_mod = hdr[9]
        return msg

    def describe(self) -> str:
        """One line for logs and traces."""
        skip = {"private_data", "ari", "info", "alt_local_gid", "alt_remote_gid"}
        parts = []
        for f in fields(self):
            if f.name in skip:
                continue
            v = getattr(self, f.name)
            parts.append(f"{f.name}={v.hex() if isinstance(v, bytes) else v}")
        return f"{self.NAME} " + " ".join(parts)


@dataclass(slots=True)
class Req(CmMessage):
    """REQ: the active side asks for a connection (IBA 12.6.5)."""

    ATTR_ID: ClassVar[int] = ATTR_REQ
    NAME: ClassVar[str] = "REQ"
    LAYOUT: ClassVar[tuple[Field | Blob, ...]] = (
        Field("local_comm_id", 24, 4),
        Field("service_id", 32, 8),
        Field("local_ca_guid", 40, 8),
        Field("local_qkey", 52, 4),
        Field("local_qpn", 56, 4, 8, 24),
        Field("responder_resources", 56, 4, 0, 8),
        Field("local_eecn", 60, 4, 8, 24),
        Field("initiator_depth", 60, 4, 0, 8),
        Field("remote_eecn", 64, 4, 8, 24),
        Field("remote_cm_response_timeout", 64, 4, 3, 5),
        Field("transport_service_type", 64, 4, 1, 2),
        Field("end_to_end_flow_control", 64, 4, 0, 1),
        Field("starting_psn", 68, 4, 8, 24),
        Field("local_cm_response_timeout", 68, 4, 3, 5),
        Field("retry_count", 68, 4, 0, 3),
        Field("pkey", 72, 2),
        Field("path_mtu", 74, 1, 4, 4),
        Field("rdc_exists", 74, 1, 3, 1),
        Field("rnr_retry_count", 74, 1, 0, 3),
        Field("max_cm_retries", 75, 1, 4, 4),
        Field("srq", 75, 1, 3, 1),
        Field("extended_transport_type", 75, 1, 0, 3),
        *_path("primary", 76),
        *_path("alt", 120),
        Blob("private_data", 164, REQ_PRIVATE_DATA_SIZE),
    )

    local_comm_id: int = 0
    service_id: int = 0
    local_ca_guid: int = 0
    local_qkey: int = 0
    local_qpn: int = 0
    responder_resources: int = 0
    local_eecn: int = 0
    initiator_depth: int = 0
    remote_eecn: int = 0
    remote_cm_response_timeout: int = 0
    transport_service_type: int = 0  #: 0 RC, 1 UC, 3 XRC
    end_to_end_flow_control: int = 0
    starting_psn: int = 0
    local_cm_response_timeout: int = 0
    retry_count: int = 0
    pkey: int = 0xFFFF
    path_mtu: int = 0
    rdc_exists: int = 0
    rnr_retry_count: int = 0
    max_cm_retries: int = 0
    srq: int = 0
    extended_transport_type: int = 0
    primary_local_lid: int = 0xFFFF
    primary_remote_lid: int = 0xFFFF
    primary_local_gid: bytes = bytes(16)
    primary_remote_gid: bytes = bytes(16)
    primary_flow_label: int = 0
    primary_packet_rate: int = 0
    primary_traffic_class: int = 0
    primary_hop_limit: int = 0
    primary_sl: int = 0
    primary_subnet_local: int = 0
    primary_local_ack_timeout: int = 0
    alt_local_lid: int = 0
    alt_remote_lid: int = 0
    alt_local_gid: bytes = bytes(16)
    alt_remote_gid: bytes = bytes(16)
    alt_flow_label: int = 0
    alt_packet_rate: int = 0
    alt_traffic_class: int = 0
    alt_hop_limit: int = 0
    alt_sl: int = 0
    alt_subnet_local: int = 0
    alt_local_ack_timeout: int = 0
    private_data: bytes = field(default=bytes(REQ_PRIVATE_DATA_SIZE))


@dataclass(slots=True)
class Mra(CmMessage):
    """MRA: message receipt acknowledgement -- "I need more time"."""

    ATTR_ID: ClassVar[int] = ATTR_MRA
    NAME: ClassVar[str] = "MRA"
    LAYOUT: ClassVar[tuple[Field | Blob, ...]] = (
        Field("local_comm_id", 24, 4),
        Field("remote_comm_id", 28, 4),
        Field("message_mraed", 32, 1, 6, 2),
        Field("service_timeout", 33, 1, 3, 5),
        Blob("private_data", 34, MRA_PRIVATE_DATA_SIZE),
    )

    local_comm_id: int = 0
    remote_comm_id: int = 0
    message_mraed: int = MSG_REQ
    service_timeout: int = 0
    private_data: bytes = field(default=bytes(MRA_PRIVATE_DATA_SIZE))


@dataclass(slots=True)
class Rej(CmMessage):
    """REJ: the connection (or the REQ/REP) is refused."""

    ATTR_ID: ClassVar[int] = ATTR_REJ
    NAME: ClassVar[str] = "REJ"
    LAYOUT: ClassVar[tuple[Field | Blob, ...]] = (
        Field("local_comm_id", 24, 4),
        Field("remote_comm_id", 28, 4),
        Field("message_rejected", 32, 1, 6, 2),
        Field("reject_info_length", 33, 1, 1, 7),
        Field("reason", 34, 2),
        Blob("ari", 36, REJ_ARI_LENGTH),
        Blob("private_data", 108, REJ_PRIVATE_DATA_SIZE),
    )

    local_comm_id: int = 0
    remote_comm_id: int = 0
    message_rejected: int = MSG_REQ
    reject_info_length: int = 0
    reason: int = 0
    ari: bytes = field(default=bytes(REJ_ARI_LENGTH))
    private_data: bytes = field(default=bytes(REJ_PRIVATE_DATA_SIZE))


@dataclass(slots=True)
class Rep(CmMessage):
    """REP: the passive side accepts."""

    ATTR_ID: ClassVar[int] = ATTR_REP
    NAME: ClassVar[str] = "REP"
    LAYOUT: ClassVar[tuple[Field | Blob, ...]] = (
        Field("local_comm_id", 24, 4),
        Field("remote_comm_id", 28, 4),
        Field("local_qkey", 32, 4),
        Field("local_qpn", 36, 4, 8, 24),
        Field("local_eecn", 40, 4, 8, 24),
        Field("starting_psn", 44, 4, 8, 24),
        Field("responder_resources", 48, 1),
        Field("initiator_depth", 49, 1),
        Field("target_ack_delay", 50, 1, 3, 5),
        Field("failover_accepted", 50, 1, 1, 2),
        Field("end_to_end_flow_control", 50, 1, 0, 1),
        Field("rnr_retry_count", 51, 1, 5, 3),
        Field("srq", 51, 1, 4, 1),
        Field("local_ca_guid", 52, 8),
        Blob("private_data", 60, REP_PRIVATE_DATA_SIZE),
    )

    local_comm_id: int = 0
    remote_comm_id: int = 0
    local_qkey: int = 0
    local_qpn: int = 0
    local_eecn: int = 0
    starting_psn: int = 0
    responder_resources: int = 0
    initiator_depth: int = 0
    target_ack_delay: int = 0
    failover_accepted: int = 0
    end_to_end_flow_control: int = 0
    rnr_retry_count: int = 0
    srq: int = 0
    local_ca_guid: int = 0
    private_data: bytes = field(default=bytes(REP_PRIVATE_DATA_SIZE))


@dataclass(slots=True)
class Rtu(CmMessage):
    """RTU: ready to use -- the active side's final handshake message."""

    ATTR_ID: ClassVar[int] = ATTR_RTU
    NAME: ClassVar[str] = "RTU"
    LAYOUT: ClassVar[tuple[Field | Blob, ...]] = (
        Field("local_comm_id", 24, 4),
        Field("remote_comm_id", 28, 4),
        Blob("private_data", 32, RTU_PRIVATE_DATA_SIZE),
    )

    local_comm_id: int = 0
    remote_comm_id: int = 0
    private_data: bytes = field(default=bytes(RTU_PRIVATE_DATA_SIZE))


@dataclass(slots=True)
class Dreq(CmMessage):
    """DREQ: disconnect request."""

    ATTR_ID: ClassVar[int] = ATTR_DREQ
    NAME: ClassVar[str] = "DREQ"
    LAYOUT: ClassVar[tuple[Field | Blob, ...]] = (
        Field("local_comm_id", 24, 4),
        Field("remote_comm_id", 28, 4),
        Field("remote_qpn", 32, 4, 8, 24),
        Blob("private_data", 36, DREQ_PRIVATE_DATA_SIZE),
    )

    local_comm_id: int = 0
    remote_comm_id: int = 0
    remote_qpn: int = 0
    private_data: bytes = field(default=bytes(DREQ_PRIVATE_DATA_SIZE))


@dataclass(slots=True)
class Drep(CmMessage):
    """DREP: disconnect reply."""

    ATTR_ID: ClassVar[int] = ATTR_DREP
    NAME: ClassVar[str] = "DREP"
    LAYOUT: ClassVar[tuple[Field | Blob, ...]] = (
        Field("local_comm_id", 24, 4),
        Field("remote_comm_id", 28, 4),
        Blob("private_data", 32, DREP_PRIVATE_DATA_SIZE),
    )

    local_comm_id: int = 0
    remote_comm_id: int = 0
    private_data: bytes = field(default=bytes(DREP_PRIVATE_DATA_SIZE))


@dataclass(slots=True)
class SidrReq(CmMessage):
    """SIDR_REQ: service ID resolution -- how a UD client finds a UD server's QP."""

    ATTR_ID: ClassVar[int] = ATTR_SIDR_REQ
    NAME: ClassVar[str] = "SIDR_REQ"
    LAYOUT: ClassVar[tuple[Field | Blob, ...]] = (
        Field("request_id", 24, 4),
        Field("pkey", 28, 2),
        Field("service_id", 32, 8),
        Blob("private_data", 40, SIDR_REQ_PRIVATE_DATA_SIZE),
    )

    request_id: int = 0
    pkey: int = 0xFFFF
    service_id: int = 0
    private_data: bytes = field(default=bytes(SIDR_REQ_PRIVATE_DATA_SIZE))


@dataclass(slots=True)
class SidrRep(CmMessage):
    """SIDR_REP: the UD server's QP number and Q_Key, or why not."""

    ATTR_ID: ClassVar[int] = ATTR_SIDR_REP
    NAME: ClassVar[str] = "SIDR_REP"
    LAYOUT: ClassVar[tuple[Field | Blob, ...]] = (
        Field("request_id", 24, 4),
        Field("sidr_status", 28, 1),
        Field("info_length", 29, 1),
        Field("qpn", 32, 4, 8, 24),
        Field("service_id", 36, 8),
        Field("qkey", 44, 4),
        Blob("info", 48, SIDR_REP_INFO_LENGTH),
        Blob("private_data", 120, SIDR_REP_PRIVATE_DATA_SIZE),
    )

    request_id: int = 0
    sidr_status: int = SIDR_SUCCESS
    info_length: int = 0
    qpn: int = 0
    service_id: int = 0
    qkey: int = 0
    info: bytes = field(default=bytes(SIDR_REP_INFO_LENGTH))
    private_data: bytes = field(default=bytes(SIDR_REP_PRIVATE_DATA_SIZE))


MESSAGES: dict[int, type[CmMessage]] = {
    cls.ATTR_ID: cls for cls in (Req, Mra, Rej, Rep, Rtu, Dreq, Drep, SidrReq, SidrRep)
}

#: Attributes that exist in the CM class but that softverbs does not act on.
UNSUPPORTED_ATTRS = frozenset({ATTR_CLASS_PORT_INFO, ATTR_LAP, ATTR_APR})


def peek_header(data: bytes | bytearray | memoryview) -> tuple[int, ...]:
    """The raw header tuple (base, class, class version, method, status,
    class-specific, TID, attribute ID, reserved, attribute modifier)."""
    if len(data) < MAD_HEADER_SIZE:
        raise MadError("short", f"{len(data)} bytes, a MAD header is {MAD_HEADER_SIZE}")
    return _HEADER.unpack_from(data, 0)


def decode(data: bytes | bytearray | memoryview) -> CmMessage:
    """Parse one CM MAD; :class:`MadError` says why it is not one."""
    hdr = peek_header(data)
    base, mgmt_class, class_version, method = hdr[0], hdr[1], hdr[2], hdr[3]
    if base != BASE_VERSION:
        raise MadError("bad_version", f"base version {base}")
    if mgmt_class != MGMT_CLASS_CM:
        raise MadError("not_cm", f"management class {mgmt_class:#04x}")
    if class_version != CM_CLASS_VERSION:
        raise MadError("bad_version", f"CM class version {class_version}")
    if len(data) < MAD_SIZE:
        raise MadError("short", f"{len(data)} bytes, a CM MAD is {MAD_SIZE}")
    attr = hdr[7]
    cls = MESSAGES.get(attr)
    if cls is None:
        reason = "unsupported_attr" if attr in UNSUPPORTED_ATTRS else "bad_attr"
        raise MadError(reason, f"attribute {attr:#06x}")
    if method != METHOD_SEND:
        raise MadError("bad_method", f"method {method:#04x} for {cls.NAME}")
    return cls._from(bytes(data[:MAD_SIZE]), hdr)


# --------------------------------------------------------------------------
# rdma_cm's header in REQ / SIDR_REQ private data, and service IDs

CMA_HEADER_SIZE = 36
CMA_VERSION = 0x00


@dataclass(slots=True)
class CmaHeader:
    """``struct cma_hdr``: who is connecting to what (IP addresses, port)."""

    src_ip: bytes  #: 4 bytes (IPv4) or 16 (IPv6)
    dst_ip: bytes
    src_port: int
    version: int = CMA_VERSION

    def encode(self) -> bytes:
        v4 = len(self.src_ip) == 4
        ipver = 4 if v4 else 6
        src = bytes(12) + self.src_ip if v4 else self.src_ip
        dst = bytes(12) + self.dst_ip if v4 else self.dst_ip
        return struct.pack(">BBH", self.version, ipver << 4, self.src_port) + src + dst

    @classmethod
    def decode(cls, data: bytes) -> CmaHeader:
        if len(data) < CMA_HEADER_SIZE:
            raise MadError("bad_cma_header", "private data too short for the rdma_cm header")
        version, ipver, port = struct.unpack_from(">BBH", data, 0)
        if version != CMA_VERSION:
            raise MadError("bad_cma_header", f"rdma_cm header version {version}")
        ipver >>= 4
        if ipver == 4:
            return cls(bytes(data[16:20]), bytes(data[32:36]), port, version)
        if ipver == 6:
            return cls(bytes(data[4:20]), bytes(data[20:36]), port, version)
        raise MadError("bad_cma_header", f"IP version {ipver}")


def service_id(port_space: int, port: int) -> int:
    """rdma_cm's service ID for an IP port space and port."""
    return ((port_space & 0xFFFF) << 16) | (port & 0xFFFF)


def split_service_id(sid: int) -> tuple[int, int]:
    """(port space, port) of an rdma_cm service ID."""
    return (sid >> 16) & 0xFFFF, sid & 0xFFFF


def ms_of(iba_time: int) -> int:
    """``cm_convert_to_ms``: 4.096 us * 2**t, as the kernel rounds it (ms)."""
    return 1 << max(iba_time - 8, 0)


def ack_timeout(ca_ack_delay: int, packet_life_time: int) -> int:
    """``cm_ack_timeout``: the QP's local ACK timeout exponent for a path."""
    t = packet_life_time + 1
    if t >= ca_ack_delay:
        t += ca_ack_delay >= (t - 1)
    else:
        t = ca_ack_delay + (t >= (ca_ack_delay - 1))
    return min(31, t)


def tid_for(hi_tid: int, comm_id: int) -> int:
    """``cm_form_tid``: the agent's high word and the local comm ID as the
    kernel stores it (a big-endian value read as a little-endian word)."""
    low = int.from_bytes(comm_id.to_bytes(4, "big"), "little")
    return ((hi_tid & 0xFFFFFFFF) << 32) | low
