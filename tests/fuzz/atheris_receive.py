#!/usr/bin/env python3
"""Coverage-guided fuzzing of the receive path with atheris (libFuzzer for Python).

A plain script, not collected by pytest.  It drives the same rig as the CI
fuzz test (``tests/kits/receive_rig.py``: one simulated device with RC,
UC and UD QPs in every state, memory regions fenced by canaries, and every
invariant of that rig checked), but the inputs come from libFuzzer, guided by
the coverage of the ``softverbs`` package::

    pip install atheris                          # a wheel for CPython 3.11 on x86-64 Linux
    python tests/fuzz/atheris_receive.py -max_total_time=300            # five minutes
    python tests/fuzz/atheris_receive.py --make-corpus corpus/ 2000     # seed inputs, once
    python tests/fuzz/atheris_receive.py corpus/ -max_total_time=3600 -jobs=2
    python tests/fuzz/atheris_receive.py crash-<sha1>                   # replay a crash

Any broken invariant raises ``RigFailure``; libFuzzer then stops and writes the
input to ``crash-<sha1>``.  Options after the script name are libFuzzer's
(``-help=1`` lists them).

An input is three bytes of header and the transport bytes (BTH onwards)::

    byte 0  flags: bit 0 put the QPN of the chosen QP in the BTH,
                   bit 1 put the PSN it expects (+ byte 2 as a signed delta),
                   bit 2 leave the ICRC wrong, bit 3 IPv6, bit 4 as an Ethernet frame,
                   bit 5 check the ICRC with an unknown IPv4 ID (recovered from the CRC)
    byte 1  which QP of the rig (modulo their number)
    byte 2  PSN delta
    rest    transport bytes; the ICRC is appended

The rig keeps its state from one input to the next, like a device does, and
runs its batch checks (probe SENDs, requester timers, memory) every 200
inputs.  A crash therefore depends on the inputs before it too; its message
names the check and the input, which is usually enough to write a test.
"""

from __future__ import annotations

import importlib
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kits"))

BATCH = 200
SPORT = 0xC0DE


def make_input(transport: bytes, target: int, flags: int = 0, delta: int = 0) -> bytes:
    return bytes([flags & 0xFF, target & 0xFF, delta & 0xFF]) + transport


class Harness:
    """One rig, fed one libFuzzer input at a time."""

    def __init__(self) -> None:
        import receive_rig

        self.mod = receive_rig
        self.rig = receive_rig.ReceiveRig(int(os.environ.get("SOFTVERBS_FUZZ_SEED", "1")))
        self.rig.__enter__()
        self.n = 0

    def one(self, data: bytes) -> None:
        if len(data) < 3:
            return
        rig = self.rig
        mod = self.mod
        flags, which, delta = data[0], data[1], data[2]
        body = bytearray(data[3:])
        t = rig.targets[which % len(rig.targets)]
        eng = t.eng
        if flags & 1 and len(body) >= 8:
            body[5:8] = (eng.qpn & 0xFFFFFF).to_bytes(3, "big")
        if flags & 2 and len(body) >= 12:
            base = eng.comp.una if t.role == "requester" and body[0] & 0x1F >= 13 else eng.resp.epsn
            psn = (base + (delta if delta < 128 else delta - 256)) & 0xFFFFFF
            body[9:12] = psn.to_bytes(3, "big")
        transport = bytes(body)
        v6 = bool(flags & 8)
        src, dst = (mod._V6_PEER, mod._V6_DUT) if v6 else (rig.src_ip, rig.dst_ip)
        rig.last_input = f"atheris {data.hex()}"
        if flags & 16:
            rig.feed_frame(mod.frame(transport, v6, src, dst, SPORT, good_icrc=not flags & 4))
        else:
            datagram = mod.sign(transport, v6, src, dst, SPORT, ip_id=0x1234 if flags & 32 else 0)
            if flags & 4:
                datagram = datagram[:-4] + bytes(4)
            rig.feed_udp(datagram, v6, SPORT, ip_id=None if flags & 32 else 0)
        self.n += 1
        if self.n % BATCH == 0:
            rig.check_batch()
        elif self.n % mod.RENEW_EVERY == 0:
            rig.renew_due()


def make_corpus(directory: str, count: int) -> None:
    """Write ``count`` seed inputs made by the CI fuzzer's mutator (templates, no noise)."""
    import receive_rig

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    with receive_rig.ReceiveRig(1) as rig:
        mut = receive_rig.Mutator(rig, 1)
        rng = random.Random(1)
        for i in range(count):
            which = rng.randrange(len(rig.targets))
            pkt = mut.template(rig.targets[which])
            transport = bytes(receive_rig.encode_transport(pkt))
            flags = 3 | (rng.random() < 0.2) << 3 | (rng.random() < 0.2) << 4
            data = make_input(transport, which, flags, 0)
            (out / f"seed-{i:05d}").write_bytes(data)
    print(f"wrote {count} inputs to {out}")


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--make-corpus":
        make_corpus(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1000)
        return
    import atheris  # type: ignore[import-not-found]

    with atheris.instrument_imports(include=["softverbs"]):
        for name in ("softverbs", "softverbs.engine.hca", "softverbs.wire.codec"):
            importlib.import_module(name)  # the engine, the codecs and all they import
    harness = Harness()
    atheris.Setup(sys.argv, harness.one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
