"""Fuzz the decoders: whatever the bytes, only WireError may escape.

Inputs are random bytes, valid packets with random mutations (bit flips,
byte overwrites, truncation, insertion, splicing), and frames whose
Ethernet/IP/UDP headers are valid but whose lengths and fields are not.

The number of examples per test is ``SOFTVERBS_FUZZ_EXAMPLES`` (default 300,
which keeps the whole file at a few seconds); CI's long fuzz run sets it to
100000.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import addressed_packets, ip_of

from softverbs.errors import WireError
from softverbs.wire.codec import (
    decode_frame,
    decode_transport,
    decode_udp_payload,
    encode_frame,
    encode_udp_payload,
    ipv4_id_from_icrc,
)
from softverbs.wire.packet import Packet

EXAMPLES = int(os.environ.get("SOFTVERBS_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

V4 = (b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02")
V6 = (b"\xfd" + bytes(14) + b"\x01", b"\xfd" + bytes(14) + b"\x02")

REASONS = {"truncated", "bad_opcode", "bad_tver", "bad_pad", "icrc_error", "not_rocev2"}


def only_wire_errors(fn: Callable[..., object], *args: object, **kwargs: object) -> None:
    """Call fn(*args, **kwargs): it may return or raise WireError, nothing else."""
    try:
        result = fn(*args, **kwargs)
    except WireError as e:
        assert e.reason in REASONS, e.reason
    else:
        if isinstance(result, Packet):
            # A decoded packet is usable: its payload can be read.
            bytes(result.payload)


def decode_everything(data: bytes) -> None:
    for has_icrc in (False, True):
        only_wire_errors(decode_transport, data, has_icrc=has_icrc)
        only_wire_errors(decode_transport, memoryview(data), has_icrc=has_icrc)
    for src, dst in (V4, V6):
        only_wire_errors(decode_udp_payload, data, src, dst, 0xC001)
    only_wire_errors(decode_frame, data)
    ipv4_id_from_icrc(data, *V4, 0xC001)


@FUZZ
@given(data=st.binary(max_size=2048))
def test_random_bytes(data: bytes) -> None:
    decode_everything(data)


@st.composite
def mutated(draw: st.DrawFn, base: bytes) -> bytes:
    buf = bytearray(base)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "byte", "cut", "insert", "splice"]))
        pos = draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == "flip" and buf:
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and buf:
            buf[pos] = draw(st.integers(0, 255))
        elif kind == "cut":
            del buf[pos:]
        elif kind == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "splice":
            end = draw(st.integers(pos, len(buf)))
            buf[pos:end] = draw(st.binary(max_size=8))
    return bytes(buf)


@st.composite
def mutated_udp_payloads(draw: st.DrawFn) -> tuple[bytes, bytes, bytes, int]:
    v6 = draw(st.booleans())
    pkt = draw(addressed_packets(v6=v6, max_payload=200))
    src, dst = ip_of(pkt.sgid), ip_of(pkt.dgid)
    base = bytes(encode_udp_payload(pkt, src, dst, pkt.sport))
    return draw(mutated(base)), src, dst, pkt.sport


@FUZZ
@given(case=mutated_udp_payloads())
def test_mutated_udp_payloads(case: tuple[bytes, bytes, bytes, int]) -> None:
    data, src, dst, sport = case
    only_wire_errors(decode_udp_payload, data, src, dst, sport)
    only_wire_errors(decode_udp_payload, data, src, dst, sport, check_icrc=False)
    only_wire_errors(decode_udp_payload, data, src, dst, sport, ip_id=0)
    decode_everything(data)


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    pkt = draw(addressed_packets(v6=draw(st.booleans()), max_payload=200))
    return draw(mutated(encode_frame(pkt, ip_id=draw(st.integers(0, 0xFFFF)))))


@FUZZ
@given(frame=mutated_frames())
def test_mutated_frames(frame: bytes) -> None:
    only_wire_errors(decode_frame, frame)
    only_wire_errors(decode_frame, frame, check_icrc=False)


@st.composite
def frames_with_bad_headers(draw: st.DrawFn) -> bytes:
    """Valid frames with the IP/UDP length, IHL and version fields overwritten."""
    v6 = draw(st.booleans())
    pkt = draw(addressed_packets(v6=v6, max_payload=64))
    buf = bytearray(encode_frame(pkt))
    udp = 14 + (40 if v6 else 20)
    if v6:
        buf[18:20] = draw(st.binary(min_size=2, max_size=2))  # payload length
        buf[14] = draw(st.integers(0, 255))  # version / traffic class
    else:
        buf[14] = draw(st.integers(0, 255))  # version / IHL
        buf[16:18] = draw(st.binary(min_size=2, max_size=2))  # total length
        buf[20:22] = draw(st.binary(min_size=2, max_size=2))  # flags / fragment offset
    buf[udp + 4 : udp + 6] = draw(st.binary(min_size=2, max_size=2))  # UDP length
    cut = draw(st.integers(0, len(buf)))
    return bytes(buf[:cut] if draw(st.booleans()) else buf)


@FUZZ
@given(frame=frames_with_bad_headers())
def test_frames_with_bad_headers(frame: bytes) -> None:
    only_wire_errors(decode_frame, frame)
