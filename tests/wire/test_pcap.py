"""softverbs.fabric.pcap: the writer's format and the reader's four variants."""

from __future__ import annotations

import io
import struct
import threading
from pathlib import Path

import pytest
from wire_strategies import golden_dir

from softverbs.fabric.pcap import PcapWriter, read_pcap
from softverbs.wire.codec import decode_frame, encode_frame
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet


def test_writer_header_and_records(tmp_path: Path) -> None:
    path = tmp_path / "w.pcap"
    with PcapWriter(path) as w:
        w.write(b"\x01" * 60, ts=1.5)
        w.write(b"\x02" * 61, ts=2.9999999)  # rounds up into the next second
    data = path.read_bytes()
    assert struct.unpack_from("<IHHiIII", data) == (0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)
    assert struct.unpack_from("<IIII", data, 24) == (1, 500000, 60, 60)
    assert struct.unpack_from("<IIII", data, 24 + 16 + 60) == (3, 0, 61, 61)
    assert list(read_pcap(path)) == [(1.5, b"\x01" * 60), (3.0, b"\x02" * 61)]


def test_write_packet_round_trip(tmp_path: Path) -> None:
    pkt = Packet(0x04, 0x11, 42, b"payload")
    pkt.sgid = IPV4_MAPPED_PREFIX + b"\x0a\x00\x00\x01"
    pkt.dgid = IPV4_MAPPED_PREFIX + b"\x0a\x00\x00\x02"
    path = tmp_path / "p.pcap"
    with PcapWriter(str(path)) as w:
        w.write_packet(pkt, ts=10.0)
    [(ts, frame)] = list(read_pcap(path))
    assert ts == 10.0 and frame == encode_frame(pkt)
    assert bytes(decode_frame(frame).payload) == b"payload"


def test_file_object_is_not_closed() -> None:
    buf = io.BytesIO()
    w = PcapWriter(buf)
    w.write(b"x" * 14, ts=0.0)
    w.close()
    w.close()  # idempotent
    assert not buf.closed and len(buf.getvalue()) == 24 + 16 + 14
    with pytest.raises(ValueError):
        w.write(b"y")


def test_threads_do_not_interleave(tmp_path: Path) -> None:
    path = tmp_path / "t.pcap"
    with PcapWriter(path) as w:

        def worker(tag: int) -> None:
            for i in range(200):
                w.write(bytes([tag]) * (20 + i % 50), ts=float(i))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    frames = [f for _ts, f in read_pcap(path)]
    assert len(frames) == 1600
    assert all(len(set(f)) == 1 for f in frames)


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("nano", [False, True])
def test_reader_variants(tmp_path: Path, order: str, nano: bool) -> None:
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    frac = 123456789 if nano else 123456
    data = struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, 65535, 1)
    data += struct.pack(order + "IIII", 100, frac, 3, 3) + b"abc"
    data += struct.pack(order + "IIII", 101, 0, 10, 10) + b"short"  # cut off
    path = tmp_path / "v.pcap"
    path.write_bytes(data)
    [(ts, frame)] = list(read_pcap(path))
    assert frame == b"abc"
    assert ts == pytest.approx(100.123456789 if nano else 100.123456, abs=1e-9)


def test_reader_rejects_other_files(tmp_path: Path) -> None:
    path = tmp_path / "x.pcapng"
    path.write_bytes(b"\x0a\x0d\x0d\x0a" + bytes(40))
    with pytest.raises(ValueError):
        list(read_pcap(path))


def test_reader_on_golden() -> None:
    gdir = golden_dir()
    if gdir is None:
        pytest.skip("golden captures not found")
    frames = list(read_pcap(gdir / "rping.pcap"))
    assert len(frames) == 65
    assert all(ts > 1.6e9 for ts, _ in frames)
