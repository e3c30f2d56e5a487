"""Traces of real sessions: SOFTVERBS_PCAP, Runtime.add_tap and softverbs.capture().

Each test records the session of :mod:`pcap_session` (RC over IPv4 and IPv6,
UC, UD; SEND, WRITE, READ, atomics, an RNR NAK) and checks the file three
ways: it parses with ``read_pcap``; every frame decodes with ``decode_frame``
and its ICRC verifies against the frame's own IP and UDP headers; and tshark
dissects every frame as eth/ip(v6)/udp/infiniband with nothing malformed.
The tshark part skips when the binary is missing (Debian package
``tshark``, listed in ``scripts/apt-packages.txt`` so CI installs it).
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pcap_session import session
from tshark_kit import TSHARK, payload_dissector_args

from softverbs import Context, PyverbsRDMAError, capture
from softverbs.errors import WireError
from softverbs.fabric.pcap import PcapWriter, read_pcap
from softverbs.sim import Simulation
from softverbs.wire.codec import decode_frame
from softverbs.wire.opcodes import AETH_RNR_NAK, OPINFO, Op, Transport, aeth_kind
from softverbs.wire.packet import IPV4_MAPPED_PREFIX, Packet

#: Expert notes that are not errors: the zero UDP checksum of IPv6 frames (rxe sends
#: it too; RoCEv2 relies on the ICRC) and TTL 1, which is pyverbs' default hop_limit
#: in a GlobalRoute (and ibv_rc_pingpong's): the IP TTL is the route's hop limit.
ALLOWED_EXPERT = {"Illegal checksum value (0)", '"Time To Live" only 1'}
HERE = Path(__file__).resolve().parent
KITS = HERE.parent / "kits"

#: Opcodes the session must put on the wire.
EXPECTED = {
    Transport.RC | Op.SEND_FIRST, Transport.RC | Op.SEND_MIDDLE, Transport.RC | Op.SEND_LAST,
    Transport.RC | Op.RDMA_WRITE_FIRST, Transport.RC | Op.RDMA_WRITE_LAST_WITH_IMMEDIATE,
    Transport.RC | Op.RDMA_READ_REQUEST, Transport.RC | Op.RDMA_READ_RESPONSE_FIRST,
    Transport.RC | Op.RDMA_READ_RESPONSE_MIDDLE, Transport.RC | Op.RDMA_READ_RESPONSE_LAST,
    Transport.RC | Op.FETCH_ADD, Transport.RC | Op.COMPARE_SWAP,
    Transport.RC | Op.ATOMIC_ACKNOWLEDGE, Transport.RC | Op.ACKNOWLEDGE,
    Transport.UC | Op.SEND_FIRST, Transport.UC | Op.SEND_LAST, Transport.UC | Op.RDMA_WRITE_ONLY,
    Transport.UD | Op.SEND_ONLY_WITH_IMMEDIATE,
}  # fmt: skip


def decoded(path: Path) -> list[Packet]:
    """Every frame of the file, decoded with its ICRC checked."""
    frames = list(read_pcap(path))
    assert frames, f"{path} holds no frames"
    out = []
    for i, (_, frame) in enumerate(frames):
        try:
            out.append(decode_frame(frame))
        except WireError as exc:
            raise AssertionError(f"frame {i + 1} of {path}: {exc}") from None
    return out


def check_session(pkts: list[Packet]) -> None:
    seen = {p.opcode for p in pkts}
    assert seen >= EXPECTED, [OPINFO[o].name for o in EXPECTED - seen]  # type: ignore[union-attr]
    assert any(p.sgid[:12] == IPV4_MAPPED_PREFIX for p in pkts)
    assert any(p.sgid[:2] == b"\xfe\x80" for p in pkts)  # the RC pair on the IPv6 GID
    assert any(OPINFO[p.opcode].kind.name == "ACK" and aeth_kind(p.syndrome) == AETH_RNR_NAK
               for p in pkts)  # type: ignore[union-attr]  # fmt: skip


def check_wire_imm(path: Path) -> None:
    """pyverbs' imm_data is ibv_send_wr's __be32 field: its bytes in memory are the
    ImmDt bytes on the wire, as a NIC sends them (0x1234 and 0xBEEF in the session).
    Read from the frames themselves (the ImmDt ends where the payload and its pad
    begin), not through the codec that wrote them."""
    seen = set()
    for _, frame in read_pcap(path):
        pkt = decode_frame(frame)
        if OPINFO[pkt.opcode].imm:  # type: ignore[union-attr]
            end = len(frame) - 4 - pkt.pad - len(pkt.payload)
            seen.add(bytes(frame[end - 4 : end]))
    assert seen == {v.to_bytes(4, sys.byteorder) for v in (0x1234, 0xBEEF)}, seen


def tshark_check(path: Path, count: int) -> None:
    """tshark reads every frame as InfiniBand over UDP, with nothing malformed."""
    if TSHARK is None:
        pytest.skip("tshark is not installed (Debian: apt install tshark; "
                    "CI installs it from scripts/apt-packages.txt)")  # fmt: skip
    fields = ["frame.number", "frame.protocols", "infiniband.bth.opcode", "_ws.malformed",
              "_ws.expert.message"]  # fmt: skip
    cmd = [TSHARK, "-n", "-r", str(path), *payload_dissector_args(), "-T", "fields",
           "-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=|"]  # fmt: skip
    for name in fields:
        cmd += ["-e", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [dict(zip(fields, line.split("\t"), strict=True)) for line in proc.stdout.splitlines()]
    assert len(rows) == count
    for row in rows:
        where = f"frame {row['frame.number']}"
        assert ":udp:infiniband" in row["frame.protocols"], (where, row["frame.protocols"])
        assert row["infiniband.bth.opcode"], where
        assert not row["_ws.malformed"], where
        experts = {m for m in row["_ws.expert.message"].split("|") if m}
        assert experts <= ALLOWED_EXPERT, (where, experts)


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    env["SOFTVERBS_SERVICE"] = "0"  # a device of its own, not the host's
    env["SOFTVERBS_CONFIG"] = str(tmp / "no-links.json")
    env["SOFTVERBS_INPROC_DEVICES"] = "sv0,sv1"
    env.update(extra)
    return env


def test_softverbs_pcap_captures_a_session(tmp_path: Path) -> None:
    spec = str(tmp_path / "session-{pid}.pcap")
    proc = subprocess.run(
        [sys.executable, str(KITS / "pcap_session.py"), "sv0", "sv1"],
        env=_env(tmp_path, SOFTVERBS_PCAP=spec, SOFTVERBS_FAULTS="seed=3;drop=0.03"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (path,) = tmp_path.glob("session-*.pcap")  # {pid} became the child's pid
    assert path.name != "session-{pid}.pcap"
    pkts = decoded(path)
    check_session(pkts)
    check_wire_imm(path)
    tshark_check(path, len(pkts))


_TWO_RUNTIMES = """
import sys
sys.path.insert(0, sys.argv[1])
from pcap_session import session
from softverbs.sim import Simulation
session("sv0", "sv1")              # the process's in-process runtime
with Simulation(devices=("a", "b")):
    session("a", "b")              # a second runtime, same SOFTVERBS_PCAP
session("sv0", "sv1")
"""


def test_softverbs_pcap_is_shared_by_the_runtimes_of_a_process(tmp_path: Path) -> None:
    """Each runtime used to open SOFTVERBS_PCAP afresh, truncating the file under the
    runtimes that had opened it before: the capture came out garbled."""
    path = tmp_path / "two.pcap"
    proc = subprocess.run([sys.executable, "-c", _TWO_RUNTIMES, str(KITS)],
                          env=_env(tmp_path, SOFTVERBS_PCAP=str(path)),
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pkts = decoded(path)
    sim_gid = IPV4_MAPPED_PREFIX + bytes([10, 0, 0, 1])
    assert any(p.sgid == sim_gid for p in pkts)  # the simulation's traffic
    assert sum(p.sgid[:13] == IPV4_MAPPED_PREFIX + b"\x7f" for p in pkts) > 2 * len(EXPECTED)
    with open(path, "rb") as f:
        assert f.read().count(bytes.fromhex("d4c3b2a1")) == 1  # one pcap header


def test_runtime_add_tap_captures_a_session(tmp_path: Path) -> None:
    path = tmp_path / "tap.pcap"
    with Simulation(devices=("a", "b"), faults="seed=5;drop=0.03") as sim:
        writer = PcapWriter(path)
        sim.runtime.add_tap(writer)
        session("a", "b")
        sim.runtime.remove_tap(writer)
        writer.close()
    pkts = decoded(path)
    check_session(pkts)
    stamps = [ts for ts, _ in read_pcap(path)]
    assert stamps == sorted(stamps) and stamps[-1] < 60  # virtual seconds
    tshark_check(path, len(pkts))


def test_capture_takes_one_devices_traffic(tmp_path: Path) -> None:
    path = tmp_path / "b.pcap"
    with Simulation(devices=("a", "b", "c")):
        ctx_b = Context(name="b")
        gids_b = {bytes(g) for g in ctx_b.hca.gids}
        with capture(ctx_b, path) as cap:
            session("a", "b")
            session("a", "c")  # not b's: not in the file
        assert cap.closed
        size = path.stat().st_size
        session("a", "b")  # after close: not in the file either
        assert path.stat().st_size == size
    pkts = decoded(path)
    assert all(p.sgid in gids_b or p.dgid in gids_b for p in pkts)
    assert len({p.sgid for p in pkts} | {p.dgid for p in pkts}) == 4  # a and b, v4 and v6
    check_session(pkts)
    tshark_check(path, len(pkts))


def test_capture_close_is_idempotent_and_removes_the_tap(tmp_path: Path) -> None:
    with Simulation(devices=("a", "b")) as sim:
        ctx = Context(name="a")
        cap = capture(ctx, tmp_path / "a.pcap")
        assert len(sim.runtime.taps) == 1
        cap.close()
        cap.close()
        assert sim.runtime.taps == []
    assert list(read_pcap(tmp_path / "a.pcap")) == []  # a valid file with no frames


# --- the served device: softverbsd writes the file ----------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """A private softverbsd; its socket path."""
    from svkit import ServiceProc

    d = tempfile.mkdtemp(prefix="svp", dir="/tmp")  # a Unix socket path is short
    svc = ServiceProc(os.path.join(d, "sv.sock"))
    try:
        yield svc.path
    finally:
        assert svc.stop() == 0
        shutil.rmtree(d, ignore_errors=True)


def test_softverbs_pcap_on_the_served_device(tmp_path: Path, served: str) -> None:
    """SOFTVERBS_PCAP and SOFTVERBS_FAULTS in a client of softverbsd: the
    service appends the device's packets to the client's file (one header),
    and the faults act on the client's packets; the session still completes."""
    path = tmp_path / "served.pcap"
    env = _env(tmp_path, SOFTVERBS_PCAP=str(path), SOFTVERBS_FAULTS="seed=3;drop=0.03")
    env["SOFTVERBS_SERVICE"] = served
    proc = subprocess.run([sys.executable, str(KITS / "pcap_session.py"), "sv0", "sv0"],
                          env=env, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pkts = decoded(path)
    check_session(pkts)
    with open(path, "rb") as f:
        assert f.read().count(bytes.fromhex("d4c3b2a1")) == 1  # one pcap header
    tshark_check(path, len(pkts))


def test_capture_on_the_served_device_sees_every_process(
    tmp_path: Path, served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """softverbs.capture() on a served device: the service taps the device,
    so another process's session on it is in the file; after close, nothing."""
    from softverbs.verbs import world
    from softverbs.verbs.served import ServiceRegistry

    monkeypatch.setenv("SOFTVERBS_SERVICE", served)
    env = _env(tmp_path)
    env["SOFTVERBS_SERVICE"] = served
    other = [sys.executable, str(KITS / "pcap_session.py"), "sv0", "sv0"]
    path = tmp_path / "tap.pcap"
    reg = ServiceRegistry(served)
    world.push(reg)
    try:
        ctx = Context(name="sv0")
        with capture(ctx, path) as cap:
            proc = subprocess.run(other, env=env, capture_output=True, text=True, timeout=120,
                                  check=False)  # fmt: skip
            assert proc.returncode == 0, proc.stderr
        assert cap.closed
        size = path.stat().st_size
        proc = subprocess.run(other, env=env, capture_output=True, text=True, timeout=120,
                              check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert path.stat().st_size == size  # the tap went with close()
        cap2 = capture(ctx, tmp_path / "gone.pcap")
        ctx.close()  # the context's capture goes with it...
        cap2.close()  # ...and closing it afterwards is no error
    finally:
        world.pop(reg)
        reg.shutdown()
    pkts = decoded(path)
    check_session(pkts)
    tshark_check(path, len(pkts))


def test_capture_on_the_served_device_needs_a_real_file(
    tmp_path: Path, served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served device writes the file itself: a BytesIO cannot be handed over."""
    from softverbs.verbs import world
    from softverbs.verbs.served import ServiceRegistry

    monkeypatch.setenv("SOFTVERBS_SERVICE", served)
    reg = ServiceRegistry(served)
    world.push(reg)
    try:
        ctx = Context(name="sv0")
        with pytest.raises(PyverbsRDMAError, match="file that has a descriptor") as info:
            capture(ctx, io.BytesIO())
        assert info.value.error_code == errno.EOPNOTSUPP
        ctx.close()
    finally:
        world.pop(reg)
        reg.shutdown()
