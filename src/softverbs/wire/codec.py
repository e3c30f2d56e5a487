"""Byte-level RoCEv2 codecs: transport headers, ICRC, UDP payloads and frames.

Layout of a RoCEv2 packet
-------------------------
::

    Ethernet | IPv4 or IPv6 | UDP (dport 4791) | BTH | ext. headers | payload | pad | ICRC

The *transport* part (BTH through pad) is what :func:`encode_transport`
produces.  The extended headers follow the BTH in the fixed order of
:data:`~softverbs.wire.opcodes.OPINFO` (XRCETH, DETH, RETH, AtomicETH, AETH,
AtomicAckETH, ImmDt, IETH); the payload is padded with zero bytes to a multiple
of four and the pad count goes into the BTH.  Every field is big-endian except
ImmDt, which the verbs API hands over as an opaque ``__be32`` and which is
therefore stored in host byte order (see :mod:`softverbs.wire.packet`).

The ICRC
--------
The invariant CRC is a CRC-32 (the zlib/Ethernet polynomial) over

    8 bytes of 0xFF (a masked LRH) + IP header + UDP header + BTH + rest

with the fields that routers may change replaced by all ones: IPv4 TOS, TTL
and header checksum; IPv6 traffic class, flow label and hop limit (the
version nibble is *not* masked); the UDP checksum; and BTH byte 4 (FECN,
BECN and reserved bits).  It is stored little-endian in the last four bytes.
This was checked against every packet of the rxe captures in
``tests/data/golden`` (IPv4 and IPv6).

Everything else in the IP header is covered -- including the IPv4
*identification* field.  That matters for a stack built on UDP sockets:

* **Sending.**  Linux gives an IPv4 datagram ID 0 when DF is set and the
  socket is *not connected*.  With ``IP_MTU_DISCOVER = IP_PMTUDISC_DO`` (or
  ``_PROBE``) every datagram has DF and ID 0, so the ICRC can be computed
  in advance over the header the kernel will write (version/IHL 0x45,
  total length, ID 0, flags DF, protocol 17, the addresses).  Verified on
  Linux 6.18 by capturing on ``lo``: unconnected + PMTUDISC_DO/PROBE gives
  ID 0 and flags 0x4000; the default (PMTUDISC_WANT), PMTUDISC_DONT and any
  *connected* UDP socket give non-zero, incrementing IDs, which would break
  the ICRC.  TTL is 64 and TOS 0 by default, but both are masked anyway.
* **Receiving.**  rxe builds its own IP header and gives every packet a
  non-zero ID from the kernel's per-destination counter (all 2,039 IPv4
  packets in the golden captures have ID != 0).  ``recvfrom`` does not
  report the ID, so the ICRC cannot simply be recomputed.  CRC-32 is affine,
  though: flipping bit *j* of the ID changes the final CRC by a constant
  that depends only on how many bytes follow the ID.  So the receiver
  computes the ICRC for ID 0 and, when that does not match, solves a 16-bit
  linear system (over GF(2)) for the ID that explains the stored value
  (:func:`ipv4_id_from_icrc`).  If no ID does, the packet is corrupt.  The
  cost of not seeing the ID is 16 bits of the CRC: a random corruption of
  a packet whose ID is unknown escapes with probability 2**-16 instead of
  2**-32.  Single-bit errors are still always caught in any UDP payload
  shorter than 26,744 bytes (jumbo frames included): a flipped bit can pass
  for an ID change only if, d bits after the ID, x**-d modulo the CRC
  polynomial has degree < 16, and the smallest such d is 214,135 (checked
  by flipping every bit of a 30 kB datagram).  A fabric that can read the
  real header (a raw or packet socket, which needs CAP_NET_RAW) can pass
  ``ip_id`` and get the full check.  IPv6 has no such field and the
  masked ones are the only variable ones, so IPv6 is checked in full from
  the addresses and ports alone.

GRH for UD receives
-------------------
For a UD (and GSI) receive, rxe writes 40 bytes in front of the payload: the
IPv6 header as received, or for IPv4 twenty zero bytes and the 20-byte IPv4
header as received (``union rdma_network_hdr``).  Consumers such as
``ibv_init_ah_from_wc`` tell the two apart by checking the IPv4 header
checksum, so :func:`grh_bytes` always writes a valid one.

Performance notes
-----------------
Headers are packed with precompiled :class:`struct.Struct` objects into one
preallocated bytearray; the payload is copied exactly once.  Decoding never
copies the payload: :attr:`Packet.payload` is a memoryview slice of the
input.  The ICRC is computed as one short pseudo-header (IP + UDP + first
four BTH bytes + 0xFF) and one ``crc32`` call (ISA-L's, else zlib's) over the rest of the
packet, chained through crc32's running value; nothing is concatenated.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from typing import Final, cast

try:  # ISA-L's CRC-32: 0.20 us per 4 KiB frame against zlib's 0.86 (bench/bench_crc.py)
    from isal.isal_zlib import crc32 as crc32
except ImportError:  # pragma: no cover - the same function, slower
    from zlib import crc32 as crc32

from softverbs.errors import WireError
from softverbs.wire.opcodes import (
    BTH_SIZE,
    FIRST,
    ICRC_SIZE,
    MIDDLE,
    OPINFO,
    ROCEV2_PORT,
    Hdr,
    Kind,
    Op,
    header_length,
)
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Burst, Packet, ackreq_indexes, burst

__all__ = [
    "BurstMerger",
    "BytesLike",
    "Parts",
    "decode_frame",
    "decode_transport",
    "decode_udp_payload",
    "decode_udp_segments",
    "encode_frame",
    "encode_transport",
    "encode_udp_burst",
    "encode_udp_payload",
    "grh_bytes",
    "icrc",
    "ipv4_id_from_icrc",
    "seal_udp_datagrams",
    "seal_udp_payload",
]

BytesLike = bytes | bytearray | memoryview

# Header flags as plain ints: IntFlag arithmetic is far slower on the hot path.
_XRCETH: Final = int(Hdr.XRCETH)
_DETH: Final = int(Hdr.DETH)
_RETH: Final = int(Hdr.RETH)
_ATOMICETH: Final = int(Hdr.ATOMICETH)
_AETH: Final = int(Hdr.AETH)
_ATOMICACKETH: Final = int(Hdr.ATOMICACKETH)
_IMMDT: Final = int(Hdr.IMMDT)
_IETH: Final = int(Hdr.IETH)

_M24: Final = 0xFFFFFF

# opcode -> (header flags, BTH + extended header length), or None.
_LAYOUT: tuple[tuple[int, int] | None, ...] = tuple(
    None if info is None else (int(info.hdrs), header_length(info.hdrs)) for info in OPINFO
)

# BTH: opcode | SE M PadCnt(2) TVer(4) | P_Key | FECN BECN resv6 DestQP(24) | AckReq resv7 PSN(24)
_BTH = struct.Struct(">BBHII")
_BTH_Q = struct.Struct(">QI")  # the BTH as bytes 0..7 (opcode .. DestQP) and the PSN word
_NOT_OP_SE_PAD: Final = ~((0xFF << 56) | (0xB0 << 48)) & ((1 << 64) - 1)  # of _BTH_Q's Q
_U32 = struct.Struct(">I")
_DETH_S = struct.Struct(">II")  # Q_Key | resv8 SrcQP(24)
_RETH_S = struct.Struct(">QII")  # VA | R_Key | DMA length
_ATOMICETH_S = struct.Struct(">QIQQ")  # VA | R_Key | swap/add | compare
_U64 = struct.Struct(">Q")
_IMM = _U32  # the ImmDt value, big-endian on the wire like every IBA field
_ICRC = struct.Struct("<I")

# ICRC pseudo headers, without the 8 0xFF bytes (they are folded into _SEED).
# Each ends with the first four BTH bytes (one >I) and 0xFF for the masked byte 4.
# IPv4: ver/IHL, TOS*, total length, ID, flags/frag, TTL*, proto, csum*, src, dst,
#       then UDP sport, dport, length, csum*.   (* = masked to all ones)
_PSEUDO4 = struct.Struct(">BBHHHBBH4s4sHHHHIB")
# IPv6: version + masked traffic class and flow label, payload length,
#       next header, hop limit*, src, dst, then the UDP header.
_PSEUDO6 = struct.Struct(">IHBB16s16sHHHHIB")
_SEED: Final = crc32(b"\xff" * 8)

_IP_DF: Final = 0x4000
_UDP_PROTO: Final = 17
_IPV4_HDR = struct.Struct(">BBHHHBBH4s4s")
_IPV6_HDR = struct.Struct(">IHBB16s16s")
_UDP_HDR = struct.Struct(">HHHH")
_ETH_HDR = struct.Struct(">6s6sH")
_ETH_IPV4: Final = 0x0800
_ETH_IPV6: Final = 0x86DD
_ETH_VLANS: Final = frozenset({0x8100, 0x88A8, 0x9100})


# --------------------------------------------------------------------------
# transport (BTH .. pad)


def _encode(pkt: Packet, head: int, tail: int) -> tuple[bytearray, int, int]:
    """Write pkt's transport bytes into a new buffer at offset ``head``.

    ``tail`` spare bytes are left after the pad (room for the ICRC), so each
    caller gets the whole datagram or frame in one allocation.  Returns the
    buffer, the BTH's first 32-bit word (for the ICRC pseudo header) and the
    offset where the transport ends.
    """
    layout = _LAYOUT[pkt.opcode]
    if layout is None:
        raise ValueError(f"cannot encode opcode {pkt.opcode:#04x}: not in OPINFO")
    h, hlen = layout
    payload = pkt.payload
    # nbytes, not len(): a memoryview over e.g. array('I') counts items.
    n = payload.nbytes if type(payload) is memoryview else len(payload)
    pad = -n & 3
    end = head + hlen + n + pad
    buf = bytearray(end + tail)
    b1 = (pkt.se << 7) | (pkt.mig << 6) | (pad << 4) | (pkt.tver & 0xF)
    _BTH.pack_into(
        buf,
        head,
        pkt.opcode,
        b1,
        pkt.pkey,
        (pkt.fecn << 31) | (pkt.becn << 30) | (pkt.dqpn & _M24),
        (pkt.ackreq << 31) | (pkt.psn & _M24),
    )
    if h:
        off = head + BTH_SIZE
        if h & _XRCETH:
            _U32.pack_into(buf, off, pkt.srqn & _M24)
            off += 4
        if h & _DETH:
            _DETH_S.pack_into(buf, off, pkt.qkey, pkt.src_qp & _M24)
            off += 8
        if h & _RETH:
            _RETH_S.pack_into(buf, off, pkt.va, pkt.rkey, pkt.dma_len)
            off += 16
        if h & _ATOMICETH:
            _ATOMICETH_S.pack_into(buf, off, pkt.va, pkt.rkey, pkt.swap_add, pkt.compare)
            off += 28
        if h & _AETH:
            _U32.pack_into(buf, off, ((pkt.syndrome & 0xFF) << 24) | (pkt.msn & _M24))
            off += 4
        if h & _ATOMICACKETH:
            _U64.pack_into(buf, off, pkt.orig)
            off += 8
        if h & _IMMDT:
            _IMM.pack_into(buf, off, pkt.imm)
            off += 4
        if h & _IETH:
            _U32.pack_into(buf, off, pkt.inv_rkey)
    if n:
        start = head + hlen
        buf[start : start + n] = payload
    w0 = (pkt.opcode << 24) | (b1 << 16) | pkt.pkey
    return buf, w0, end


def encode_transport(pkt: Packet) -> bytearray:
    """BTH, extended headers, payload and pad of ``pkt`` (no ICRC)."""
    return _encode(pkt, 0, 0)[0]


def decode_transport(data: BytesLike, *, has_icrc: bool = False) -> Packet:
    """Parse transport bytes (BTH .. pad, plus the ICRC if ``has_icrc``).

    The ICRC is only stripped here, not checked: checking needs the IP and
    UDP headers (see :func:`decode_udp_payload` and :func:`decode_frame`).
    The payload of the returned packet is a memoryview slice of ``data``.
    Raises :class:`WireError` with reason ``truncated``, ``bad_opcode``,
    ``bad_tver`` or ``bad_pad``; never anything else.  Reserved bits are
    ignored, as the spec asks of receivers, and bytes after the headers of
    an opcode without payload (an ACK, a READ request) are returned as its
    payload for the engine to judge.
    """
    return _decode_transport(data, has_icrc)


def _decode_transport(data: BytesLike, has_icrc: bool) -> Packet:
    """:func:`decode_transport` (its positional form, typed in codec.pxd)."""
    n = len(data)
    if n < BTH_SIZE:
        raise WireError("truncated", f"{n} bytes, a BTH needs {BTH_SIZE}")
    op, b1, pkey, w1, w2 = _BTH.unpack_from(data, 0)
    layout = _LAYOUT[op]
    if layout is None:
        raise WireError("bad_opcode", f"opcode {op:#04x}")
    if b1 & 0xF:
        raise WireError("bad_tver", f"TVer {b1 & 0xF}")
    h, hlen = layout
    end = n - ICRC_SIZE if has_icrc else n
    if end < hlen:
        raise WireError("truncated", f"{n} bytes, opcode {op:#04x} needs {hlen + n - end}")
    pad = (b1 >> 4) & 3
    if end - hlen < pad:
        raise WireError("bad_pad", f"pad {pad} > {end - hlen} payload bytes")
    mv = data if type(data) is memoryview else memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    pkt = Packet(op, w1 & _M24, w2 & _M24, mv[hlen : end - pad])
    pkt.se = bool(b1 & 0x80)
    pkt.mig = bool(b1 & 0x40)
    pkt.pad = pad
    pkt.pkey = pkey
    pkt.fecn = bool(w1 & 0x80000000)
    pkt.becn = bool(w1 & 0x40000000)
    pkt.ackreq = bool(w2 & 0x80000000)
    if h:
        off = BTH_SIZE
        if h & _XRCETH:
            pkt.srqn = _U32.unpack_from(data, off)[0] & _M24
            off += 4
        if h & _DETH:
            pkt.qkey, sqp = _DETH_S.unpack_from(data, off)
            pkt.src_qp = sqp & _M24
            off += 8
        if h & _RETH:
            pkt.va, pkt.rkey, pkt.dma_len = _RETH_S.unpack_from(data, off)
            off += 16
        if h & _ATOMICETH:
            pkt.va, pkt.rkey, pkt.swap_add, pkt.compare = _ATOMICETH_S.unpack_from(data, off)
            off += 28
        if h & _AETH:
            aeth = _U32.unpack_from(data, off)[0]
            pkt.syndrome = aeth >> 24
            pkt.msn = aeth & _M24
            off += 4
        if h & _ATOMICACKETH:
            pkt.orig = _U64.unpack_from(data, off)[0]
            off += 8
        if h & _IMMDT:
            pkt.imm = _IMM.unpack_from(data, off)[0]
            off += 4
        if h & _IETH:
            pkt.inv_rkey = _U32.unpack_from(data, off)[0]
    return pkt


# --------------------------------------------------------------------------
# ICRC


#: how many results each of the codec's remembered tables (:data:`_PSEUDO_CRCS`,
#: :data:`_GIDS`) holds before it is cleared and starts again, rather than grow
_REMEMBERED_MAX: Final = 4096
#: _pseudo_crc's results by its arguments
_PSEUDO_CRCS: dict[tuple[int, int, bytes, bytes, int, int, int], int] = {}


def _pseudo_crc(tlen: int, w0: int, src: bytes, dst: bytes, sport: int, dport: int,
                ip_id: int = 0) -> int:  # fmt: skip
    """The running CRC after the ICRC's pseudo header (the masked LRH, IP and UDP
    headers, BTH bytes 0..4) of a ``tlen``-byte transport sent from ``src`` to
    ``dst``: over IPv4 (4-byte addresses) with DF and ``ip_id``, else IPv6 with
    no extension headers.  ``w0`` is the BTH's first 32-bit word.

    Remembered (:data:`_PSEUDO_CRCS`): a flow's packets of one opcode and
    length -- every ACK, every 8-byte SEND of a ping-pong -- share it, and
    packing the 16 fields cost about as much as the rest of a small packet's
    ICRC."""
    key = None
    if type(src) is bytes and type(dst) is bytes:  # (a view could pin a receive buffer)
        key = (tlen, w0, src, dst, sport, dport, ip_id)
        crc = _PSEUDO_CRCS.get(key)
        if crc is not None:
            return crc
    udp_len = tlen + ICRC_SIZE + 8
    if len(src) == 4:
        pseudo = _PSEUDO4.pack(0x45, 0xFF, udp_len + 20, ip_id, _IP_DF, 0xFF, _UDP_PROTO, 0xFFFF,
                               src, dst, sport, dport, udp_len, 0xFFFF, w0, 0xFF)  # fmt: skip
    else:
        pseudo = _PSEUDO6.pack(0x6FFFFFFF, udp_len, _UDP_PROTO, 0xFF, src, dst, sport, dport,
                               udp_len, 0xFFFF, w0, 0xFF)  # fmt: skip
    crc = crc32(pseudo, _SEED)
    if key is not None:
        if len(_PSEUDO_CRCS) >= _REMEMBERED_MAX:
            _PSEUDO_CRCS.clear()  # many flows and lengths: start again rather than grow
        _PSEUDO_CRCS[key] = crc
    return crc


def _icrc(mv: memoryview, start: int, end: int, w0: int, src: bytes, dst: bytes, sport: int,
          dport: int, ip_id: int = 0) -> int:  # fmt: skip
    """ICRC of the transport mv[start:end] (see :func:`_pseudo_crc`)."""
    seed = _pseudo_crc(end - start, w0, src, dst, sport, dport, ip_id)
    return crc32(mv[start + 5 : end], seed)  # bytes 0..4 are in the pseudo header


def icrc(ip_header: BytesLike, udp_header: BytesLike, transport: BytesLike) -> int:
    """The ICRC of a packet, from its actual IP and UDP headers.

    ``ip_header`` is the IPv4 (any IHL) or IPv6 header as on the wire,
    ``udp_header`` the 8-byte UDP header, and ``transport`` the bytes from the
    BTH up to (not including) the ICRC.  Lengths inside the headers are taken
    as given, so they must count the ICRC.
    """
    hdr = bytearray(ip_header)
    if hdr[0] >> 4 == 4:
        hdr[1] = hdr[8] = hdr[10] = hdr[11] = 0xFF
    else:
        hdr[0] |= 0x0F
        hdr[1] = hdr[2] = hdr[3] = hdr[7] = 0xFF
    hdr += udp_header[:6]
    hdr += b"\xff\xff"
    hdr += transport[:4]
    hdr += b"\xff"
    mv = transport if type(transport) is memoryview else memoryview(transport)
    return crc32(mv[5:], crc32(hdr, _SEED))


# --- recovering an unknown IPv4 ID (see the module docstring) -------------

# Zero bytes to run the CRC over when building ID solvers; larger than any
# IPv4 datagram, so a slice always fits.
_ZEROS = bytes(65536)


@functools.lru_cache(maxsize=64)
def _id_solver(k: int) -> tuple[tuple[int, int, int], ...]:
    """Rows (pivot bit, CRC change, ID bits) in fully reduced echelon form.

    Changing the 16-bit ID from 0 to x changes the final CRC by the XOR of
    the images of x's set bits; an image depends only on the number ``k`` of
    bytes that follow the ID in the CRC input.  Each row's pivot bit occurs
    in no other row, so a difference can be reduced row by row in any order.
    """
    zeros = memoryview(_ZEROS)[:k]
    base = crc32(zeros, crc32(b"\x00\x00"))
    rows: list[tuple[int, int, int]] = []
    for j in range(16):
        vec = crc32(zeros, crc32((1 << j).to_bytes(2, "big"))) ^ base
        bits = 1 << j
        for pivot, rvec, rbits in rows:
            if vec & pivot:
                vec ^= rvec
                bits ^= rbits
        if not vec:  # cannot happen for CRC-32 (it detects all 16-bit bursts)
            continue
        pivot = vec & -vec
        rows = [(p, v ^ vec, b ^ bits) if v & pivot else (p, v, b) for p, v, b in rows]
        rows.append((pivot, vec, bits))
    return tuple(rows)


def _solve_id(diff: int, k: int) -> int | None:
    if k > len(_ZEROS):  # longer than any IPv4 datagram: no header explains it
        return None
    ip_id = 0
    for pivot, vec, bits in _id_solver(k):
        if diff & pivot:
            diff ^= vec
            ip_id ^= bits
    return None if diff else ip_id


def ipv4_id_from_icrc(
    data: BytesLike, src_ip: bytes, dst_ip: bytes, sport: int, dport: int = ROCEV2_PORT
) -> int | None:
    """The IPv4 ID for which the ICRC of UDP payload ``data`` is right, or None.

    Assumes the header rxe, mlx5 and Linux UDP sockets send (IHL 5, DF set).
    """
    n = len(data)
    if n < BTH_SIZE + ICRC_SIZE:
        return None
    mv = data if type(data) is memoryview else memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    end = n - ICRC_SIZE
    w0 = _U32.unpack_from(mv, 0)[0]
    stored = _ICRC.unpack_from(mv, end)[0]
    diff = stored ^ _icrc(mv, 0, end, w0, src_ip, dst_ip, sport, dport)
    if not diff:
        return 0
    # Bytes after the ID: the rest of the IPv4 header (14), UDP (8), transport.
    return _solve_id(diff, end + 22)


# --------------------------------------------------------------------------
# UDP payloads (what a UDP socket sends and receives)


#: _gid's results: a received packet's two GIDs, made once per address
_GIDS: dict[bytes, bytes] = {}


def _gid(ip: bytes) -> bytes:
    gid = _GIDS.get(ip) if type(ip) is bytes else None
    if gid is None:
        gid = IPV4_MAPPED_PREFIX + ip if len(ip) == 4 else bytes(ip)
        if type(ip) is bytes:
            if len(_GIDS) >= _REMEMBERED_MAX:
                _GIDS.clear()
            _GIDS[ip] = gid
    return gid


def encode_udp_payload(
    pkt: Packet,
    src_ip: bytes,
    dst_ip: bytes,
    sport: int,
    dport: int = ROCEV2_PORT,
    *,
    ip_id: int = 0,
    seal: bool = True,
) -> bytearray:
    """Transport bytes + ICRC: the datagram a UDP socket sends for ``pkt``.

    4-byte addresses mean IPv4, 16-byte ones IPv6.  For IPv4 the ICRC covers
    the header Linux writes for an unconnected socket with IP_PMTUDISC_DO
    (ID 0, DF); pass ``ip_id`` if the datagram will carry another ID.  With
    ``seal=False`` the ICRC is left for :func:`seal_udp_payload` (a caller
    that learns the IPv4 ID later: a UDP GSO run's segments).
    """
    buf, w0, end = _encode(pkt, 0, ICRC_SIZE)
    if seal:
        _seal(buf, end, w0, src_ip, dst_ip, sport, dport, ip_id)
    return buf


def seal_udp_payload(buf: bytearray, src_ip: bytes, dst_ip: bytes, sport: int,
                     dport: int = ROCEV2_PORT, *, ip_id: int = 0) -> None:  # fmt: skip
    """Write the ICRC of a datagram from :func:`encode_udp_payload`, for IPv4 ID
    ``ip_id`` (IPv6 has none).  The kernel numbers the segments of a UDP GSO
    send 0, 1, 2 ... (DF or not), and the ICRC covers the ID: segment k of a run
    is sealed with ``ip_id=k`` (see :func:`seal_udp_datagrams`)."""
    end = len(buf) - ICRC_SIZE
    _seal(buf, end, _U32.unpack_from(buf, 0)[0], src_ip, dst_ip, sport, dport, ip_id)


def _seal(buf: bytearray, end: int, w0: int, src_ip: bytes, dst_ip: bytes, sport: int,
          dport: int, ip_id: int) -> None:  # fmt: skip
    """Write the ICRC of the one datagram in ``buf`` (transport ``buf[:end]``,
    BTH word 0 ``w0``) for IPv4 ID ``ip_id``: :func:`seal_udp_datagrams` for a
    single datagram, without its loop (every packet sent alone comes here)."""
    crc = crc32(memoryview(buf)[5:end], _pseudo_crc(end, w0, src_ip, dst_ip, sport, dport))
    ip_id &= 0xFFFF
    if ip_id and len(src_ip) == 4:
        crc ^= _id_delta(end + 22, ip_id)  # CRC-32 is affine in the ID's bits
    _ICRC.pack_into(buf, end, crc)


def seal_udp_datagrams(buf: bytearray, start: int, sizes: list[int], src_ip: bytes,
                       dst_ip: bytes, sport: int, dport: int = ROCEV2_PORT, *,
                       ip_id: int = 0) -> None:  # fmt: skip
    """Write the ICRCs of datagrams of ``sizes`` bytes lying back to back in
    ``buf`` from ``start``, each for IPv4 ID ``ip_id`` (a GSO run is sealed by
    :func:`encode_udp_burst`, which numbers its segments)."""
    mv = memoryview(buf)
    v4 = len(src_ip) == 4
    ip_id &= 0xFFFF
    seeds: dict[int, int] = {}  # BTH word 0 and length -> the pseudo header's CRC (ID 0)
    off = start
    for size in sizes:
        end = off + size - ICRC_SIZE
        w0 = _U32.unpack_from(buf, off)[0]
        key = w0 | (size << 32)
        seed = seeds.get(key)
        if seed is None:
            seed = seeds[key] = _pseudo_crc(end - off, w0, src_ip, dst_ip, sport, dport)
        crc = crc32(mv[off + 5 : end], seed)
        if v4 and ip_id:
            crc ^= _id_delta(end - off + 22, ip_id)  # CRC-32 is affine in the ID's bits
        _ICRC.pack_into(buf, end, crc)
        off += size


Runs = list[tuple[int, int]]  #: datagrams cut into GSO sends: (first, count) each
#: one datagram as the buffers a gathering send (``sendmsg``) takes, in order
Parts = list[BytesLike]


def encode_udp_burst(pkt: Packet, src_ip: bytes, dst_ip: bytes, sport: int,
                     dport: int = ROCEV2_PORT, *,
                     runs: Callable[[list[int]], Runs] | None = None,
                     ) -> tuple[list[Parts], list[int], Runs]:  # fmt: skip
    """The datagrams of ``pkt.segments()`` (a burst, or one packet), each as
    :func:`encode_udp_payload` makes it, given as the parts a gathering send
    takes; their sizes; and how they go out: ``runs(sizes)``, GSO sends of
    several datagrams each, or without ``runs`` one datagram at a time.  The
    kernel numbers a GSO send's segments' IPv4 IDs 0, 1, 2 ..., so datagram k
    of a run is sealed for ID k (see :func:`seal_udp_datagrams`).

    The packets between a burst's first and last differ only in PSN and
    AckReq: each is its header, made from one encoded header with no packet
    object, a view of its payload, and its ICRC.  The payload is not copied
    here: the kernel copies it once, from the registered memory, when it is sent."""
    if pkt.count == 1:
        one = _encode(pkt, 0, ICRC_SIZE)[0]
        seal_udp_datagrams(one, 0, [len(one)], src_ip, dst_ip, sport, dport)
        return [[one]], [len(one)], [(0, 1)]
    b = cast(Burst, pkt)
    count = b.count
    head = _encode(b.segment(0), 0, ICRC_SIZE)[0]
    tail = _encode(b.segment(count - 1), 0, ICRC_SIZE)[0]
    mids = count - 2
    tmpl = _encode(b.segment(1), 0, ICRC_SIZE)[0] if mids else bytearray(ICRC_SIZE)
    mid = len(tmpl)  # a MIDDLE: the PMTU's payload, no pad
    sizes = [len(head), *([mid] * mids), len(tail)]
    cuts = runs(sizes) if runs is not None else [(i, 1) for i in range(count)]
    ids = [0] * count  # each datagram's IPv4 ID: its place in its run
    for first, n in cuts:
        ids[first : first + n] = range(n)
    seal_udp_datagrams(head, 0, sizes[:1], src_ip, dst_ip, sport, dport)
    out: list[Parts] = [[head]]
    if mids:
        seg = b.seg
        hlen = mid - seg - ICRC_SIZE
        q = _BTH_Q.unpack_from(tmpl)[0]  # BTH bytes 0..7; then the PSN word, then XRCETH
        ext = bytes(tmpl[BTH_SIZE:hlen])
        payload = b.payload if type(b.payload) is memoryview else memoryview(b.payload)
        if payload.format != "B" or payload.ndim != 1:
            payload = payload.cast("B")
        seed = _pseudo_crc(mid - ICRC_SIZE, q >> 32, src_ip, dst_ip, sport, dport)
        # each packet's PSN word (AckReq, PSN) and the change its IPv4 ID makes to its ICRC
        words = [(b.psn + j) & _M24 for j in range(count)]
        for j in ackreq_indexes(b.first_index, b.msg_packets, b.ack_every, count):
            words[j] |= 0x80000000
        k = mid - ICRC_SIZE + 22  # bytes after the ID
        xors = [_id_delta(k, i) for i in ids] if len(src_ip) == 4 else [0] * count
        header, icrc = _BTH_Q.pack, _ICRC.pack
        for j in range(1, count - 1):
            hdr = header(q, words[j]) + ext
            body = payload[j * seg : (j + 1) * seg]
            # the seed covers the pseudo header, with the BTH's bytes 0..4
            out.append([hdr, body, icrc(crc32(body, crc32(hdr[5:], seed)) ^ xors[j])])
    seal_udp_datagrams(tail, 0, sizes[-1:], src_ip, dst_ip, sport, dport, ip_id=ids[-1])
    out.append([tail])
    return out, sizes, cuts


def decode_udp_payload(
    data: BytesLike,
    src_ip: bytes,
    dst_ip: bytes,
    sport: int,
    dport: int = ROCEV2_PORT,
    check_icrc: bool = True,
    *,
    ip_id: int | None = None,
) -> Packet:
    """Parse a received UDP/4791 datagram and verify its ICRC.

    ``src_ip``/``dst_ip`` (4 or 16 bytes) and ``sport`` come from recvfrom
    and the socket's own address.  For IPv4 the sender's IP ID is unknown
    unless given as ``ip_id``: then ID 0 is tried first and otherwise the ID
    is recovered from the ICRC (see the module docstring).  Sets sgid, dgid
    and sport on the packet; raises :class:`WireError` (``icrc_error`` and
    the reasons of :func:`decode_transport`).
    """
    return _decode_udp(data, src_ip, dst_ip, sport, dport, check_icrc, ip_id)


def _decode_udp(data: BytesLike, src_ip: bytes, dst_ip: bytes, sport: int, dport: int,
                check_icrc: bool, ip_id: int | None) -> Packet:  # fmt: skip
    """:func:`decode_udp_payload` (its positional form, typed in codec.pxd)."""
    view = data if type(data) is memoryview else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    pkt = _decode_transport(view, True)
    if check_icrc:
        end = len(view) - ICRC_SIZE
        w0 = _U32.unpack_from(view, 0)[0]
        stored = _ICRC.unpack_from(view, end)[0]
        crc = _icrc(view, 0, end, w0, src_ip, dst_ip, sport, dport, ip_id or 0)
        if crc != stored and (len(src_ip) != 4 or ip_id is not None
                              or _solve_id(crc ^ stored, end + 22) is None):  # fmt: skip
            raise WireError("icrc_error", f"stored {stored:#010x}, computed {crc:#010x}")
    pkt.sgid = _gid(src_ip)
    pkt.dgid = _gid(dst_ip)
    pkt.sport = sport
    return pkt


# --------------------------------------------------------------------------
# GRO-coalesced receives: the packets of a message merged back into a burst

# (FIRST, MIDDLE, LAST, ONLY) of the plain SEND and WRITE messages.
_PLAIN_OPS = {
    Kind.SEND: (Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_ONLY),
    Kind.WRITE: (Op.RDMA_WRITE_FIRST, Op.RDMA_WRITE_MIDDLE, Op.RDMA_WRITE_LAST, Op.RDMA_WRITE_ONLY),
}


def _continuations() -> dict[int, tuple[int, int, int, tuple[int, int, int, int]]]:
    """A request opcode that a burst may start with (a SEND or WRITE FIRST or
    MIDDLE) -> (the MIDDLE and the plain LAST that continue it, their header
    length, the message's opcodes)."""
    table = {}
    for info in OPINFO:
        if info is None or not info.request or info.kind not in _PLAIN_OPS:
            continue
        if info.position not in (FIRST, MIDDLE):
            continue
        ops = tuple(info.transport | op for op in _PLAIN_OPS[info.kind])
        layout = _LAYOUT[ops[1]]
        assert layout is not None
        table[info.opcode] = (ops[1], ops[2], layout[1], ops)
    return table  # type: ignore[return-value]


_CONTINUE = _continuations()


@functools.lru_cache(maxsize=256)
def _id_deltas(k: int) -> tuple[int, ...]:
    """How the IPv4 IDs 0..63 (a GSO send's segments) change a CRC, against ID
    0, when ``k`` bytes follow the ID (CRC-32 is affine in the ID's bits)."""
    zeros = memoryview(_ZEROS)[:k]
    base = crc32(zeros, crc32(b"\x00\x00"))
    return tuple(crc32(zeros, crc32(i.to_bytes(2, "big"))) ^ base for i in range(64))


def _id_delta(k: int, ip_id: int) -> int:
    """How IPv4 ID ``ip_id`` (against 0) changes a CRC when ``k`` bytes follow it."""
    if not ip_id:
        return 0
    if ip_id < 64:
        return _id_deltas(k)[ip_id]
    zeros = memoryview(_ZEROS)[:k]
    return crc32(zeros, crc32(ip_id.to_bytes(2, "big"))) ^ crc32(zeros, crc32(b"\x00\x00"))


def decode_udp_segments(
    data: BytesLike,
    size: int,
    src_ip: bytes,
    dst_ip: bytes,
    sport: int,
    dport: int = ROCEV2_PORT,
) -> list[Packet | WireError]:
    """The datagrams of one ``UDP_GRO`` buffer (``size`` bytes each, the last
    maybe shorter), decoded and merged by a :class:`BurstMerger` of their own."""
    merger = BurstMerger()
    return [*merger.feed(data, size, src_ip, dst_ip, sport, dport), *merger.flush()]


#: the most packets BurstMerger merges into one burst (RC asks for an ACK every 64
#: packets, which ends a burst anyway; UC asks for none)
MERGE_MAX = 64
#: what BurstMerger keeps of its open burst (see its __init__)
_Run = tuple[int, int, int, tuple[int, ...], int, int, int, int, tuple[int, int, int, int]]


class BurstMerger:
    """The receive half of segmentation offload over UDP (a NIC's LRO).

    :meth:`feed` takes what one receive returns -- a datagram, or ``UDP_GRO``
    datagrams of ``size`` bytes each, the last maybe shorter -- and decodes
    each as :func:`decode_udp_payload` does.  Consecutive packets of one SEND
    or WRITE message -- one flow (addresses and ports), the same QP and P_Key,
    PSNs in order, MIDDLEs of the first one's size, and at the end perhaps a
    plain LAST -- come back as one :class:`~softverbs.wire.packet.Burst`,
    whose :meth:`~softverbs.wire.packet.Burst.segments` are exactly the
    packets received, also across receives: the burst still open at the end
    of one is continued by the next, or handed out by :meth:`flush`.  A burst
    ends at a packet that asks for an ACK, at :data:`MERGE_MAX` packets, or
    when another flow's datagrams come.

    Every datagram keeps its own check: one that is truncated, malformed or
    fails its ICRC is a :class:`WireError` in the output, in its place, and
    ends the burst before it; its neighbours are not touched.
    """

    def __init__(self) -> None:
        self.flow: tuple[bytes, bytes, int, int] | None = None  #: of the open burst
        self.head: Packet | None = None  #: the open burst's first packet
        self.tail: list[memoryview] = []  #: the payloads of the packets after it
        # of the open burst: its MIDDLE's BTH bytes 0..7 as one integer, its length,
        # the CRC of its pseudo header, the ICRC changes of IPv4 IDs 0..63 for it
        # (and of 64, which never matches); its LAST opcode and BTH bytes but SE and
        # pad, the MIDDLE's header length, the next PSN, the message's opcodes
        self.run: _Run = (0, 0, 0, (-1,) * 65, 0, 0, 0, 0, (0, 0, 0, 0))
        self.next_id = 1  #: the IPv4 ID the next segment of a GSO send has

    def flush(self) -> list[Packet]:
        """The open burst, if any, ended."""
        head, self.head = self.head, None
        return [] if head is None else [_merged(head, self.tail, self.run[8], False, False,
                                                False)]  # fmt: skip

    def feed(self, data: BytesLike, size: int, src_ip: bytes, dst_ip: bytes, sport: int,
             dport: int = ROCEV2_PORT) -> list[Packet | WireError]:  # fmt: skip
        """The packets and errors one receive completes (see the class)."""
        mv = data if type(data) is memoryview else memoryview(data)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        n = len(mv)
        if size <= 0:
            size = max(n, 1)
        if self.head is None and size >= n:
            # One datagram and no burst open (every ACK, every message of one
            # packet): decoded alone, unless it may start a burst.
            try:
                pkt = _decode_udp(mv, src_ip, dst_ip, sport, dport, True, None)
            except WireError as exc:
                return [exc]
            if (pkt.opcode not in _CONTINUE or pkt.ackreq or pkt.pad
                    or not len(pkt.payload)):  # fmt: skip
                return [pkt]
        v4 = len(src_ip) == 4
        flow = (src_ip, dst_ip, sport, dport)
        out: list[Packet | WireError] = []
        if self.head is not None and flow != self.flow:
            out.extend(self.flush())
        head, tail, next_id = self.head, self.tail, self.next_id
        mid_q, mid_len, mid_seed, mid_deltas, last, last_q, hlen, psn, ops = self.run
        for off in range(0, n or 1, size):  # an empty datagram is one, and truncated
            end = off + size
            if end > n:
                end = n
            if head is not None:
                # A continuation?  Checked on the raw bytes: BTH, length, ICRC.
                length = end - off
                q, w2 = _BTH_Q.unpack_from(mv, off) if length >= BTH_SIZE else (-1, -1)
                t_end = end - ICRC_SIZE
                if q == mid_q and w2 == psn and length == mid_len:  # a MIDDLE asking no ACK
                    # its ICRC, for IPv4 ID 0 (diff 0) or the next ID of a GSO send
                    diff = crc32(mv[off + 5 : t_end], mid_seed) ^ _ICRC.unpack_from(mv, t_end)[0]
                    if not diff or diff == mid_deltas[next_id]:
                        next_id = next_id + 1 if diff else 1
                        tail.append(mv[off + hlen : t_end])
                        psn = (psn + 1) & _M24
                        if len(tail) >= MERGE_MAX - 1:  # UC asks for no ACK: bound it
                            out.append(_merged(head, tail, ops, False, False, False))
                            head = None
                        continue
                seed = None  # the rest, and every case the lines above do not expect
                if w2 & _M24 == psn:
                    if q == mid_q and length == mid_len:
                        seed = mid_seed
                    elif q >> 56 == last and q & _NOT_OP_SE_PAD == last_q:
                        room = length - ICRC_SIZE - ((q >> 52) & 3)  # less the pad
                        if hlen < room <= mid_len - ICRC_SIZE:
                            seed = _pseudo_crc(t_end - off, q >> 32, *flow)
                ip_id = None if seed is None else _icrc_id(mv, off, end, seed, v4)
                if ip_id is not None:
                    next_id = min(ip_id + 1, 64)
                    tail.append(mv[off + hlen : t_end - ((q >> 52) & 3)])
                    psn = (psn + 1) & _M24
                    # it asks for an ACK, ends the message, or makes the burst full
                    if w2 >> 31 or q >> 56 == last or len(tail) >= MERGE_MAX - 1:
                        out.append(_merged(head, tail, ops, q >> 56 == last, w2 >> 31 == 1,
                                           (q >> 55) & 1 == 1))  # fmt: skip
                        head = None
                    continue
                out.append(_merged(head, tail, ops, False, False, False))
                head = None
            try:
                pkt = _decode_udp(mv[off:end], src_ip, dst_ip, sport, dport, True, None)
            except WireError as exc:
                out.append(exc)
                continue
            cont = _CONTINUE.get(pkt.opcode)
            if cont is None or pkt.ackreq or pkt.pad or not len(pkt.payload):
                out.append(pkt)
                continue
            middle, last, hlen, ops = cont
            head, tail = pkt, []
            q = _BTH_Q.unpack_from(mv, off)[0]
            mid_q = (q & ~(0xFF << 56)) | (middle << 56)
            last_q = mid_q & _NOT_OP_SE_PAD
            mid_len = hlen + len(pkt.payload) + ICRC_SIZE
            mid_seed = _pseudo_crc(mid_len - ICRC_SIZE, mid_q >> 32, *flow)
            mid_deltas = (*(_id_deltas(mid_len - ICRC_SIZE + 22) if v4 else (0,) * 64), -1)
            psn = (pkt.psn + 1) & _M24
            next_id = min(next_id + 1, 64)  # the first packet had the ID expected for it, likely
        self.head, self.tail, self.next_id, self.flow = head, tail, next_id, flow
        self.run = (mid_q, mid_len, mid_seed, mid_deltas, last, last_q, hlen, psn, ops)
        return out


def _icrc_id(mv: memoryview, off: int, end: int, seed: int, v4: bool) -> int | None:
    """The IPv4 ID for which the ICRC of the datagram mv[off:end] is right (0
    for IPv6), or None: see :func:`decode_udp_payload`.  ``seed``: the CRC of
    its pseudo header for ID 0."""
    t_end = end - ICRC_SIZE
    diff = crc32(mv[off + 5 : t_end], seed) ^ _ICRC.unpack_from(mv, t_end)[0]
    if not diff:
        return 0
    # bytes after the ID: the IPv4 header's rest, UDP, the transport
    return _solve_id(diff, t_end - off + 22) if v4 else None


def _merged(head: Packet, tail: list[memoryview], ops: tuple[int, int, int, int], ended: bool,
            asked: bool, se: bool) -> Packet:  # fmt: skip
    """``head`` and the packets whose payloads are ``tail`` as one burst (see
    :class:`BurstMerger`): ``ended`` if the last is the message's LAST,
    ``asked`` if it asks for an ACK, ``se`` its solicited-event bit."""
    if not tail:
        return head
    count = 1 + len(tail)
    seg = len(head.payload)
    first = 0 if OPINFO[head.opcode].first else 1  # type: ignore[union-attr]
    head.payload = b"".join((head.payload, *tail))
    head.se = se
    return burst(head, ops, first, count, first + count + (not ended), seg,
                 first + count if asked else 0)


# --------------------------------------------------------------------------
# full Ethernet frames (pcap)


def _mac(ip: bytes) -> bytes:
    """A locally administered MAC derived from an address: 02:00:<last 4 bytes>."""
    return b"\x02\x00" + ip[-4:]


def _ipv4_checksum(hdr: BytesLike) -> int:
    s: int = sum(struct.unpack(f">{len(hdr) // 2}H", hdr))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def _ip_header(pkt: Packet, transport_len: int, ip_id: int) -> bytes:
    """The IPv4 or IPv6 header for ``pkt`` carrying ``transport_len`` + ICRC bytes."""
    udp_len = 8 + transport_len + ICRC_SIZE
    if pkt.sgid[:12] == IPV4_MAPPED_PREFIX:
        if pkt.dgid[:12] != IPV4_MAPPED_PREFIX:
            raise ValueError("sgid is IPv4-mapped but dgid is not")
        hdr = bytearray(
            _IPV4_HDR.pack(
                0x45,
                pkt.tclass & 0xFF,
                20 + udp_len,
                ip_id & 0xFFFF,
                _IP_DF,
                pkt.hop_limit & 0xFF,
                _UDP_PROTO,
                0,
                pkt.sgid[12:],
                pkt.dgid[12:],
            )
        )
        struct.pack_into(">H", hdr, 10, _ipv4_checksum(hdr))
        return bytes(hdr)
    if pkt.dgid[:12] == IPV4_MAPPED_PREFIX:
        raise ValueError("dgid is IPv4-mapped but sgid is not")
    word = 0x60000000 | ((pkt.tclass & 0xFF) << 20) | (pkt.flow_label & 0xFFFFF)
    return _IPV6_HDR.pack(
        word, udp_len, _UDP_PROTO, pkt.hop_limit & 0xFF, bytes(pkt.sgid), bytes(pkt.dgid)
    )


def encode_frame(pkt: Packet, *, ip_id: int = 0) -> bytes:
    """A complete Ethernet II frame for ``pkt`` (for pcap and tshark).

    Addresses come from sgid/dgid, the UDP source port from ``pkt.sport``,
    TOS/traffic class, flow label and TTL/hop limit from the packet; UDP
    checksum 0 and DF set, as rxe sends them.  MACs are 02:00 followed by
    the last four bytes of the IP address.
    """
    v4 = pkt.sgid[:12] == IPV4_MAPPED_PREFIX
    head = 14 + (20 if v4 else 40) + 8
    buf, w0, end = _encode(pkt, head, ICRC_SIZE)
    tlen = end - head
    ip = _ip_header(pkt, tlen, ip_id)
    src, dst = (pkt.sgid[12:], pkt.dgid[12:]) if v4 else (bytes(pkt.sgid), bytes(pkt.dgid))
    _ETH_HDR.pack_into(buf, 0, _mac(dst), _mac(src), _ETH_IPV4 if v4 else _ETH_IPV6)
    buf[14 : head - 8] = ip
    _UDP_HDR.pack_into(buf, head - 8, pkt.sport, ROCEV2_PORT, 8 + tlen + ICRC_SIZE, 0)
    mv = memoryview(buf)
    _ICRC.pack_into(buf, end, _icrc(mv, head, end, w0, src, dst, pkt.sport, ROCEV2_PORT,
                                    ip_id & 0xFFFF))
    return bytes(buf)


def decode_frame(frame: BytesLike, check_icrc: bool = True) -> Packet:
    """Parse an Ethernet II frame (optionally VLAN-tagged) carrying RoCEv2.

    The ICRC is checked against the IP and UDP headers actually in the frame,
    so captures from any sender verify whatever their IP ID.  Lengths come
    from the IP and UDP headers, so Ethernet padding and a trailing FCS are
    ignored.  Reasons beyond :func:`decode_transport`'s: ``not_rocev2`` (not
    IP/UDP to port 4791, or a fragment) and ``truncated``.
    """
    mv = frame if type(frame) is memoryview else memoryview(frame)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    n = len(mv)
    off = 12
    while True:
        if n < off + 2:
            raise WireError("truncated", "Ethernet header")
        etype = (mv[off] << 8) | mv[off + 1]
        off += 2
        if etype not in _ETH_VLANS:
            break
        off += 2  # skip the tag's PCP/DEI/VID
    if etype == _ETH_IPV4:
        if n < off + 20:
            raise WireError("truncated", "IPv4 header")
        vihl, tos, total, _id, frag, ttl, proto, _c, src, dst = _IPV4_HDR.unpack_from(mv, off)
        ihl = (vihl & 0xF) * 4
        if vihl >> 4 != 4 or ihl < 20:
            raise WireError("not_rocev2", f"IPv4 version/IHL byte {vihl:#04x}")
        if proto != _UDP_PROTO:
            raise WireError("not_rocev2", f"IP protocol {proto}")
        if frag & 0x3FFF:
            raise WireError("not_rocev2", "IPv4 fragment")
        ip_end = off + total
        if total < ihl + 8 or ip_end > n:
            raise WireError("truncated", f"IPv4 total length {total}")
        ip_hdr = mv[off : off + ihl]
        udp = off + ihl
        sgid, dgid = IPV4_MAPPED_PREFIX + src, IPV4_MAPPED_PREFIX + dst
        tclass, flow, hop = tos, 0, ttl
    elif etype == _ETH_IPV6:
        if n < off + 40:
            raise WireError("truncated", "IPv6 header")
        word, plen, nxt, hop, sgid, dgid = _IPV6_HDR.unpack_from(mv, off)
        if word >> 28 != 6:
            raise WireError("not_rocev2", f"IPv6 version {word >> 28}")
        if nxt != _UDP_PROTO:
            raise WireError("not_rocev2", f"IPv6 next header {nxt}")
        ip_end = off + 40 + plen
        if plen < 8 or ip_end > n:
            raise WireError("truncated", f"IPv6 payload length {plen}")
        ip_hdr = mv[off : off + 40]
        udp = off + 40
        tclass, flow = (word >> 20) & 0xFF, word & 0xFFFFF
    else:
        raise WireError("not_rocev2", f"ethertype {etype:#06x}")
    sport, dport, ulen, _csum = _UDP_HDR.unpack_from(mv, udp)
    if dport != ROCEV2_PORT:
        raise WireError("not_rocev2", f"UDP port {dport}")
    if ulen < 8 or udp + ulen > ip_end:
        raise WireError("truncated", f"UDP length {ulen}")
    data = mv[udp + 8 : udp + ulen]
    pkt = _decode_transport(data, True)
    if check_icrc:
        end = len(data) - ICRC_SIZE
        stored = _ICRC.unpack_from(data, end)[0]
        crc = icrc(ip_hdr, mv[udp : udp + 8], data[:end])
        if crc != stored:
            raise WireError("icrc_error", f"stored {stored:#010x}, computed {crc:#010x}")
    pkt.sgid = bytes(sgid)
    pkt.dgid = bytes(dgid)
    pkt.sport = sport
    pkt.tclass = tclass
    pkt.flow_label = flow
    pkt.hop_limit = hop
    return pkt


# --------------------------------------------------------------------------
# GRH for UD receive buffers


def grh_bytes(pkt: Packet, *, ip_id: int = 0) -> bytes:
    """The 40 bytes a UD receive buffer gets in front of the payload.

    IPv6: the IPv6 header.  IPv4: 20 zero bytes and the IPv4 header (with a
    valid checksum, which is how readers tell the two apart).  Built from
    the packet's GIDs, traffic class, flow label and hop limit.
    """
    layout = _LAYOUT[pkt.opcode]
    hlen = layout[1] if layout is not None else BTH_SIZE
    payload = pkt.payload
    n = payload.nbytes if type(payload) is memoryview else len(payload)
    tlen = hlen + n + (-n & 3)
    ip = _ip_header(pkt, tlen, ip_id)
    return ip if len(ip) == 40 else bytes(20) + ip
