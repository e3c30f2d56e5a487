#!/usr/bin/env python3
"""Micro benchmark of softverbs.wire.codec.

Prints packets per second for encoding and decoding RC SEND and RDMA WRITE
packets with 64-byte and 4096-byte payloads, and the ICRC's throughput
next to a bare ``zlib.crc32`` over the same bytes (the floor any ICRC in
Python can reach).  Not a test: nothing here asserts a speed.

    python bench/bench_codec.py [--seconds 0.3]
"""

from __future__ import annotations

import argparse
import functools
import os
import timeit
import zlib
from collections.abc import Callable

from progress import Progress, add_quiet

from softverbs.wire.codec import (
    decode_frame,
    decode_transport,
    decode_udp_payload,
    encode_frame,
    encode_transport,
    encode_udp_payload,
    icrc,
)
from softverbs.wire.opcodes import Op, Transport, opcode
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet

SRC4, DST4 = bytes([10, 77, 0, 1]), bytes([10, 77, 0, 2])
SRC6 = bytes.fromhex("fe80000000000000505400fffe4d0002")
DST6 = bytes.fromhex("fe80000000000000505400fffe4d0003")
SPORT = 49441


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of fn, best of three runs of about ``seconds`` each."""
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    number = max(1, int(number * seconds / 0.2))
    best = min(timer.repeat(repeat=3, number=number))
    return number / best


def make(op: Op, size: int, v6: bool = False) -> Packet:
    pkt = Packet(opcode(Transport.RC, op), 0x11, 1234, os.urandom(size))
    pkt.va, pkt.rkey, pkt.dma_len = 0x7F0000000000, 0x1234, size
    pkt.sgid = SRC6 if v6 else IPV4_MAPPED_PREFIX + SRC4
    pkt.dgid = DST6 if v6 else IPV4_MAPPED_PREFIX + DST4
    pkt.sport = SPORT
    return pkt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.3, help="time per measurement")
    add_quiet(ap)
    args = ap.parse_args()
    s = args.seconds

    print(f"{'operation':44} {'64 B':>12} {'4096 B':>12}   (packets/s)")
    rows: list[tuple[str, Callable[[int], Callable[[], object]]]] = []

    def row(name: str, build: Callable[[int], Callable[[], object]]) -> None:
        rows.append((name, build))

    def enc(
        fn: Callable[..., object], op: Op, v6: bool = False, *args: object
    ) -> Callable[[int], Callable[[], object]]:
        """A row builder: fn(packet, *args) on a fresh packet of each size."""

        def build(n: int) -> Callable[[], object]:
            pkt = make(op, n, v6)
            return lambda: fn(pkt, *args)

        return build

    row("encode_transport  RC SEND_ONLY", enc(encode_transport, Op.SEND_ONLY))
    row("encode_transport  RC WRITE_ONLY (RETH)", enc(encode_transport, Op.RDMA_WRITE_ONLY))
    row(
        "encode_udp_payload  IPv4 (+ICRC)",
        enc(encode_udp_payload, Op.SEND_ONLY, False, SRC4, DST4, SPORT),
    )
    row(
        "encode_udp_payload  IPv6 (+ICRC)",
        enc(encode_udp_payload, Op.SEND_ONLY, True, SRC6, DST6, SPORT),
    )
    row("encode_frame  IPv4", enc(encode_frame, Op.SEND_ONLY))

    def dec_t(n: int) -> Callable[[], object]:
        data = bytes(encode_transport(make(Op.RDMA_WRITE_ONLY, n)))
        return lambda: decode_transport(data)

    def dec_u(n: int, v6: bool = False, ip_id: int = 0) -> Callable[[], object]:
        src, dst = (SRC6, DST6) if v6 else (SRC4, DST4)
        data = bytes(encode_udp_payload(make(Op.SEND_ONLY, n, v6), src, dst, SPORT, ip_id=ip_id))
        return lambda: decode_udp_payload(data, src, dst, SPORT)

    def dec_f(n: int) -> Callable[[], object]:
        frame = encode_frame(make(Op.SEND_ONLY, n), ip_id=4321)
        return lambda: decode_frame(frame)

    row("decode_transport  RC WRITE_ONLY (no ICRC)", dec_t)
    row("decode_udp_payload  IPv4, ID 0 (softverbs)", lambda n: dec_u(n))
    row("decode_udp_payload  IPv4, ID solved (rxe)", lambda n: dec_u(n, ip_id=0x3E56))
    row("decode_udp_payload  IPv6", lambda n: dec_u(n, v6=True))
    row("decode_frame  IPv4 (ICRC from real headers)", dec_f)

    progress = Progress(len(rows) + 1, args.quiet)
    for name, build in rows:
        progress.step(name.split()[0])
        r64, r4k = rate(build(64), s), rate(build(4096), s)
        print(f"{name:44} {r64:12,.0f} {r4k:12,.0f}")

    print()
    print(f"{'ICRC over one packet':44} {'64 B':>12} {'4096 B':>12}   (MB/s of packet)")
    progress.step("ICRC")
    mbps: dict[str, list[float]] = {"icrc": [], "zlib": []}
    for size in (64, 4096):
        frame = encode_frame(make(Op.SEND_ONLY, size))
        ip, udp, transport = frame[14:34], frame[34:42], frame[42:-4]
        whole = frame[14:-4]
        mbps["icrc"].append(len(whole) * rate(functools.partial(icrc, ip, udp, transport), s) / 1e6)
        mbps["zlib"].append(len(whole) * rate(functools.partial(zlib.crc32, whole), s) / 1e6)
    print(f"{'icrc(ip, udp, transport)':44} {mbps['icrc'][0]:12,.1f} {mbps['icrc'][1]:12,.1f}")
    print(
        f"{'zlib.crc32 over the same bytes':44} {mbps['zlib'][0]:12,.1f} {mbps['zlib'][1]:12,.1f}"
    )


if __name__ == "__main__":
    main()
