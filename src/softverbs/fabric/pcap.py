"""A pcap tap: write RoCEv2 frames that Wireshark and tshark decode, read captures back.

Classic libpcap format: a 24-byte global header (magic, version 2.4,
snaplen, link type) followed by records of a 16-byte header (seconds,
sub-second part, captured length, original length) and the frame.  The
magic number tells both the byte order of the file and whether the
sub-second field counts microseconds (0xA1B2C3D4) or nanoseconds
(0xA1B23C4D).  The writer always produces little-endian microsecond files
with link type 1 (Ethernet); the reader accepts all four variants.  pcapng
is not supported.

The writer takes a lock around each record so that several fabric threads
can share one tap without interleaving bytes.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import BinaryIO

from softverbs.wire.codec import encode_frame
from softverbs.wire.packet import Packet

__all__ = ["LINKTYPE_ETHERNET", "PcapWriter", "read_pcap"]

LINKTYPE_ETHERNET = 1
_MAGIC_US = 0xA1B2C3D4
_MAGIC_NS = 0xA1B23C4D
_SNAPLEN = 262144
_GLOBAL = struct.Struct("<IHHiIII")
_RECORD = struct.Struct("<IIII")


class PcapWriter:
    """Append frames to a pcap file (a path, or a binary file object we do not own).

    ``header=False`` continues a file another writer began: each record is
    one ``write`` so writers sharing a file description do not interleave."""

    def __init__(self, path_or_file: str | os.PathLike[str] | BinaryIO,
                 header: bool = True) -> None:  # fmt: skip
        if isinstance(path_or_file, (str, os.PathLike)):
            self._file: BinaryIO = open(path_or_file, "wb")  # noqa: SIM115 - closed in close()
            self._owned = True
        else:
            self._file = path_or_file
            self._owned = False
        self._lock = threading.Lock()
        self._closed = False
        if header:
            self._file.write(_GLOBAL.pack(_MAGIC_US, 2, 4, 0, 0, _SNAPLEN, LINKTYPE_ETHERNET))

    def write(self, frame: bytes | bytearray | memoryview, ts: float | None = None) -> None:
        """Record one Ethernet frame, stamped ``ts`` (seconds since the epoch) or now."""
        if ts is None:
            ts = time.time()
        sec = int(ts)
        usec = round((ts - sec) * 1e6)
        if usec >= 1_000_000:  # rounding carried into the next second
            sec, usec = sec + 1, usec - 1_000_000
        n = len(frame)
        with self._lock:
            if self._closed:
                raise ValueError("write to a closed PcapWriter")
            self._file.write(_RECORD.pack(sec, usec, n, n) + frame)

    def write_packet(self, pkt: Packet, ts: float | None = None) -> None:
        """Record ``pkt`` as a full Ethernet/IP/UDP/RoCEv2 frame."""
        self.write(encode_frame(pkt), ts)

    def fileno(self) -> int:
        """The file's descriptor (a served device appends to the same file)."""
        return self._file.fileno()

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._file.flush()
            if self._owned:
                self._file.close()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_pcap(path: str | os.PathLike[str]) -> Iterator[tuple[float, bytes]]:
    """Yield (timestamp, frame) for each record of a classic pcap file.

    A record cut short at the end of the file (a capture that was killed)
    ends the iteration quietly; a bad magic number raises ValueError.
    """
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        raise ValueError(f"{os.fspath(path)}: too short for a pcap header")
    for order in ("<", ">"):
        magic = struct.unpack_from(order + "I", data, 0)[0]
        if magic in (_MAGIC_US, _MAGIC_NS):
            break
    else:
        raise ValueError(f"{os.fspath(path)}: not a classic pcap file (magic {data[:4].hex()})")
    scale = 1e-6 if magic == _MAGIC_US else 1e-9
    record = struct.Struct(order + "IIII")
    off = 24
    while off + 16 <= len(data):
        sec, frac, caplen, _origlen = record.unpack_from(data, off)
        off += 16
        if off + caplen > len(data):
            return
        yield sec + frac * scale, data[off : off + caplen]
        off += caplen
