"""SOFTVERBS_TRACE records what QPs do, and ``softverbs trace`` draws it.

A small RC exchange runs in a child process on two in-process devices with
the variable set; the JSON Lines it leaves must hold the packets (opcode,
PSN, length, destination QP), the ACKs, the WQEs, the CQEs (wr_id, status)
and the state changes, and the page ``softverbs trace`` renders from it
must be self-contained and label its arrows with opcode and PSN.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from clikit import TIMEOUT, assert_user_error, cli_env, softverbs_cli

from softverbs import Context, RecvWR, SendWR
from softverbs.cli import trace as trace_cli
from softverbs.enums import IBV_QPT_RC, IBV_WR_SEND
from softverbs.sim import Simulation

UNIT = Path(__file__).resolve().parents[1] / "kits"

#: SEND 16 bytes (one packet, PSN 0), then WRITE 3000 bytes (three 1024-byte packets,
#: PSNs 1..3) from sv0 to sv1; prints the two QP numbers
EXCHANGE = f"""
import sys
import tempfile
sys.path.insert(0, {str(UNIT)!r})
from pcap_session import pair, rdma
from softverbs import Context, RecvWR, SendWR
from softverbs.enums import IBV_QPT_RC, IBV_WR_RDMA_WRITE, IBV_WR_SEND
ca, cb = Context(name="sv0"), Context(name="sv1")
a, b = pair(ca, cb, IBV_QPT_RC, 1)
b.qp.post_recv(RecvWR(7, 1, [b.sge(0, 4096)]))
a.qp.post_send(SendWR(5, IBV_WR_SEND, 1, sg=[a.sge(0, 16)]))
a.wait()
b.wait()
a.qp.post_send(rdma(a, b, 6, IBV_WR_RDMA_WRITE, 8192, 3000))
a.wait()
print(a.qp.qp_num, b.qp.qp_num)
"""


def _inproc(tmp_path: Path, **extra: str) -> dict[str, str]:
    return cli_env(tmp_path, SOFTVERBS_SERVICE="0", SOFTVERBS_INPROC_DEVICES="sv0,sv1", **extra)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def exchange(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """The trace of :data:`EXCHANGE`, and the QP numbers of its two ends."""
    tmp = tmp_path_factory.mktemp("trace")
    path = tmp / "rc.jsonl"
    env = _inproc(tmp, SOFTVERBS_TRACE=str(path))
    r = subprocess.run([sys.executable, "-c", EXCHANGE], env=env, capture_output=True,
                       text=True, timeout=TIMEOUT, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    qa, qb = map(int, r.stdout.split())
    return path, qa, qb


def test_the_trace_holds_packets_acks_wqes_cqes_and_states(exchange: tuple[Path, int, int]) -> None:
    path, qa, qb = exchange
    recs = _records(path)
    assert {r["dev"] for r in recs if r["kind"] == "device"} == {"sv0", "sv1"}
    a = [r for r in recs if r["dev"] == "sv0" and r["qpn"] == qa]
    b = [r for r in recs if r["dev"] == "sv1" and r["qpn"] == qb]

    sent = [r for r in a if r["kind"] == "packet_out"]
    assert [(r["opcode"], r["psn"], r["length"], r["dqpn"], r.get("count", 1)) for r in sent] == [
        ("RC_SEND_ONLY", 0, 16, qb, 1),
        ("RC_RDMA_WRITE_FIRST", 1, 3000, qb, 3),  # a burst: one record, PSNs 1..3
    ]
    assert sent[1]["last_opcode"] == "RC_RDMA_WRITE_LAST"
    assert sent[1]["dma_len"] == 3000

    acks = [r for r in b if r["kind"] == "packet_out"]
    assert [(r["opcode"], r["aeth"], r["psn"], r["dqpn"]) for r in acks] == [
        ("RC_ACKNOWLEDGE", "ACK", 0, qa), ("RC_ACKNOWLEDGE", "ACK", 3, qa),
    ]  # fmt: skip
    received = [(r["opcode"], r["psn"]) for r in b if r["kind"] == "packet_in"]
    assert received[0] == ("RC_SEND_ONLY", 0)

    wqes = [(r["wr_id"], r["opcode"], r["length"], r["psn"]) for r in a if r["kind"] == "wqe_start"]
    assert wqes == [(5, "IBV_WR_SEND", 16, 0), (6, "IBV_WR_RDMA_WRITE", 3000, 1)]

    cqes_a = [(r["wr_id"], r["status"], r["opcode"]) for r in a if r["kind"] == "cqe"]
    assert cqes_a == [(5, "IBV_WC_SUCCESS", "IBV_WC_SEND"),
                      (6, "IBV_WC_SUCCESS", "IBV_WC_RDMA_WRITE")]  # fmt: skip
    cqes_b = [(r["wr_id"], r["status"], r["opcode"], r["byte_len"])
              for r in b if r["kind"] == "cqe"]  # fmt: skip
    assert cqes_b == [(7, "IBV_WC_SUCCESS", "IBV_WC_RECV", 16)]

    states = [(r["old"], r["new"]) for r in a if r["kind"] == "state"]
    assert states == [("IBV_QPS_RESET", "IBV_QPS_INIT"), ("IBV_QPS_INIT", "IBV_QPS_RTR"),
                      ("IBV_QPS_RTR", "IBV_QPS_RTS")]  # fmt: skip
    assert any(r["kind"] == "doorbell" and r["queue"] == "rq" for r in b)
    times = [r["t"] for r in recs]
    assert times == sorted(times)  # one runtime, one clock: written in time order


def test_softverbs_trace_draws_a_self_contained_ladder(exchange: tuple[Path, int, int],
                                                       tmp_path: Path) -> None:  # fmt: skip
    path, qa, qb = exchange
    out = tmp_path / "rc.html"
    r = softverbs_cli(tmp_path, "trace", str(path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "2 QPs" in r.stdout
    page = out.read_text()
    assert "<svg" in page
    for external in ("http://", "https://", "<link", " src="):
        assert external not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    # lanes, and arrows labelled with opcode, PSN and length
    assert f"sv0 QP {qa:#x}" in page and f"sv1 QP {qb:#x}" in page
    arrows = re.findall(r'<g class="ev k-packet_out" data-i="(\d+)" data-in="(\d+)">'
                        r"<title>([^<]*)</title>", page)  # fmt: skip
    labels = [label for _, _, label in arrows]
    assert labels == ["SEND_ONLY psn 0 len 16", "ACK psn 0",
                      "RDMA_WRITE_FIRST..RDMA_WRITE_LAST psn 1..3 len 3000", "ACK psn 3"]
    # the details: every record, as JSON in the page; each arrow names its arrival
    data = re.search(r'<script id="trace-data" type="application/json">(.*?)</script>', page, re.S)
    assert data is not None
    records = json.loads(data.group(1))
    assert records == _records(path)
    for i, j, _ in arrows:
        sent, got = records[int(i)], records[int(j)]
        assert got["kind"] == "packet_in"
        assert (got["opcode"], got["psn"]) == (sent["opcode"], sent["psn"])
        assert (got["dev"], got["qpn"]) == ("sv1" if sent["dev"] == "sv0" else "sv0", sent["dqpn"])
    assert "CQE RECV wr_id 7 SUCCESS len 16" in page
    assert "INIT -&gt; RTR" in page


def test_labels() -> None:
    label = trace_cli.packet_label
    assert label({"opcode": "RC_SEND_ONLY", "psn": 0, "length": 16}) == "SEND_ONLY psn 0 len 16"
    assert label({"opcode": "UD_SEND_ONLY_WITH_IMMEDIATE", "psn": 7, "length": 0}) == (
        "SEND_ONLY_WITH_IMMEDIATE psn 7")
    assert label({"opcode": "RC_ACKNOWLEDGE", "aeth": "NAK", "nak": "PSN_SEQUENCE_ERROR",
                  "psn": 5}) == "NAK PSN_SEQUENCE_ERROR psn 5"  # fmt: skip
    assert label({"opcode": "RC_ACKNOWLEDGE", "aeth": "RNR_NAK", "psn": 0}) == "RNR_NAK psn 0"
    burst = {"opcode": "RC_SEND_FIRST", "last_opcode": "RC_SEND_MIDDLE", "psn": 0xFFFFFE,
             "count": 3, "length": 3072}  # fmt: skip
    assert label(burst) == "SEND_FIRST..SEND_MIDDLE psn 16777214..0 len 3072"  # PSNs wrap


def test_a_lost_packet_is_drawn_without_an_arrival() -> None:
    recs = [
        {"t": 0, "dev": "a", "qpn": None, "kind": "device", "gids": ["aa"]},
        {"t": 0, "dev": "b", "qpn": None, "kind": "device", "gids": ["bb"]},
        {"t": 1, "dev": "a", "qpn": 17, "kind": "packet_out", "opcode": "RC_SEND_ONLY", "psn": 4,
         "length": 8, "dqpn": 18, "dgid": "bb"},
        {"t": 2, "dev": "b", "qpn": 18, "kind": "state", "old": "IBV_QPS_RTS",
         "new": "IBV_QPS_ERR"},
        {"t": 3, "dev": "a", "qpn": 17, "kind": "packet_out", "opcode": "RC_SEND_ONLY", "psn": 5,
         "length": 8, "dqpn": 99, "dgid": "cc"},
    ]  # fmt: skip
    page = trace_cli.render(recs)
    assert '<g class="ev k-packet_out" data-i="2"><title>SEND_ONLY psn 4 len 8 (no packet_in)' in (
        page)
    assert "a QP 0x11" in page and "b QP 0x12" in page
    assert "remote QP 0x63" in page  # a QP on a device outside the trace gets a lane too


def test_tracing_a_simulation_records_virtual_time(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(UNIT))
    from pcap_session import pair

    path = tmp_path / "sim.jsonl"
    monkeypatch.setenv("SOFTVERBS_TRACE", str(path))
    with Simulation(devices=("ta", "tb"), faults="seed=1;drop=1;kinds=ack;limit=1") as sim:
        a, b = pair(Context(name="ta"), Context(name="tb"), IBV_QPT_RC, 1)
        b.qp.post_recv(RecvWR(1, 1, [b.sge(0, 64)]))
        a.qp.post_send(SendWR(2, IBV_WR_SEND, 1, sg=[a.sge(0, 8)]))
        a.wait()
        end = sim.clock.now()
    recs = _records(path)
    assert all(0 <= r["t"] <= end for r in recs)
    kinds = [r["kind"] for r in recs if r["dev"] == "ta"]
    assert "retransmit" in kinds  # the first ACK was dropped: the requester timed out
    sends = [r for r in recs if r["kind"] == "packet_out" and r["dev"] == "ta"]
    assert [(r["opcode"], r["psn"]) for r in sends] == [("RC_SEND_ONLY", 0)] * 2


def test_tracing_off_attaches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOFTVERBS_TRACE", raising=False)
    with Simulation(devices=("na",)):
        ctx = Context(name="na")
        assert ctx.device.hca.observer is None


def test_unwritable_trace_file_is_one_line(tmp_path: Path) -> None:
    path = str(tmp_path / "no" / "such" / "dir" / "t.jsonl")
    r = softverbs_cli(tmp_path, "demo", "-n", "2", SOFTVERBS_SERVICE="0", SOFTVERBS_TRACE=path)
    assert_user_error(r, "SOFTVERBS_TRACE", path, "No such file or directory")


def test_demo_with_trace_renders(tmp_path: Path) -> None:
    path = tmp_path / "demo.jsonl"
    r = softverbs_cli(tmp_path, "demo", "-n", "3", SOFTVERBS_SERVICE="0",
                      SOFTVERBS_TRACE=str(path))  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = softverbs_cli(tmp_path, "trace", str(path))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "demo.html").read_text()
    assert page.count('class="ev k-packet_out"') >= 6  # 3 pings, 3 pongs, and ACKs


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (None, "No such file or directory"),
        ("", "holds no SOFTVERBS_TRACE records"),
        ('{"t": 0, "dev": "a", "qpn": 1, "kind": "state"}\nnot json\n',
         ":2: not a SOFTVERBS_TRACE"),
        ("[1, 2]\n", ":1: not a SOFTVERBS_TRACE record"),
    ],
)
def test_bad_trace_file_is_one_line(tmp_path: Path, content: str | None, named: str) -> None:
    path = tmp_path / "t.jsonl"
    if content is not None:
        path.write_text(content)
    r = softverbs_cli(tmp_path, "trace", str(path))
    assert_user_error(r, str(path), named)
    assert not (tmp_path / "t.html").exists()


def test_exec_trace_sets_the_variable_for_the_child(tmp_path: Path) -> None:
    r = softverbs_cli(tmp_path, "exec", "--trace", "rel.jsonl", sys.executable, "-c",
                      "import os; print(os.environ['SOFTVERBS_TRACE'])")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.abspath("rel.jsonl")


def test_a_service_started_with_the_variable_traces_its_devices(tmp_path: Path) -> None:
    """The served case: the QPs run in softverbsd, so the service's SOFTVERBS_TRACE
    counts; a client's own variable only earns it a note that it is not written."""
    import time

    sock = Path(tempfile.mkdtemp(prefix="svtr", dir="/tmp")) / "sv.sock"  # short path
    service_trace, client_trace = tmp_path / "service.jsonl", tmp_path / "client.jsonl"
    env = cli_env(tmp_path, SOFTVERBS_INPROC_DEVICES="sv0,sv1",
                  SOFTVERBS_TRACE=str(service_trace))  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "softverbs.service", "--socket",
                             str(sock)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        for _ in range(2000):
            if sock.exists() or proc.poll() is not None:
                break
            time.sleep(0.01)
        assert sock.exists(), proc.stderr.read() if proc.stderr else b""
        r = subprocess.run([sys.executable, "-c", EXCHANGE], capture_output=True, text=True,
                           env=cli_env(tmp_path, SOFTVERBS_SERVICE=str(sock),
                                       SOFTVERBS_TRACE=str(client_trace)),
                           timeout=TIMEOUT, check=False)  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(TIMEOUT)
        shutil.rmtree(sock.parent, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    qa, qb = map(int, r.stdout.split())
    assert not client_trace.exists()
    (note,) = r.stderr.splitlines()
    assert "SOFTVERBS_TRACE" in note and str(client_trace) in note and "service start" in note
    recs = _records(service_trace)
    sent = [(r["opcode"], r["psn"]) for r in recs
            if r["kind"] == "packet_out" and (r["dev"], r["qpn"]) == ("sv0", qa)]  # fmt: skip
    assert sent == [("RC_SEND_ONLY", 0), ("RC_RDMA_WRITE_FIRST", 1)]
    assert [r["wr_id"] for r in recs if r["kind"] == "cqe" and r["dev"] == "sv1"] == [7]
    assert qb in {r["qpn"] for r in recs if r["dev"] == "sv1"}


def test_a_service_with_an_unwritable_trace_file_does_not_start(tmp_path: Path) -> None:
    path = str(tmp_path / "no" / "such" / "t.jsonl")
    sock = str(tmp_path / "sv.sock")
    r = subprocess.run([sys.executable, "-m", "softverbs.service", "--socket", sock],
                       env=cli_env(tmp_path, SOFTVERBS_TRACE=path), capture_output=True,
                       text=True, timeout=TIMEOUT, check=False)  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.strip() == f"softverbsd: SOFTVERBS_TRACE: cannot write {path}: " \
        "No such file or directory"


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """A PNG (8-bit RGB or RGBA, not interlaced) as (width, height, rows of pixels)."""
    import struct
    import zlib

    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw, stride = zlib.decompress(idat), width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        ftype, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 0xFF
            elif ftype == 2:
                line[x] = (line[x] + b) & 0xFF
            elif ftype == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[x] = (line[x] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, [r[i : i + 3] for r in rows for i in range(0, len(r), bpp)]


def test_the_page_renders_in_a_real_browser(exchange: tuple[Path, int, int],
                                            tmp_path: Path) -> None:  # fmt: skip
    """Debian's headless Chromium draws the page: the screenshot has the ladder's
    lanes, arrows and labels, not an empty or broken page."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing (scripts/apt-packages.txt)")
        pytest.skip("chromium is not installed (Debian package chromium)")
    path, _, _ = exchange
    page, shot = tmp_path / "rc.html", tmp_path / "rc.png"
    assert softverbs_cli(tmp_path, "trace", str(path), "-o", str(page)).returncode == 0
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", "--no-first-run", "--hide-scrollbars",
                        f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,700",
                        f"--screenshot={shot}", page.as_uri()],
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert shot.exists(), f"no screenshot: {r.stderr[-2000:]}"
    width, height, pixels = _png_pixels(shot.read_bytes())
    assert (width, height) == (1000, 700)
    from collections import Counter

    colours = Counter(pixels)
    _, n = colours.most_common(1)[0]  # the background
    drawn = len(pixels) - n
    # lanes, arrows and text: thousands of pixels off the background, in many colours
    assert drawn > 0.02 * len(pixels), f"only {drawn} pixels drawn"
    assert len(colours) > 50, f"{len(colours)} colours"


def test_a_trace_shows_cnps_and_rate_changes(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """DCQCN through a switch that marks every packet: the trace holds the CNP
    leaving the receiver and reaching the sender, and the sender's rate cuts
    and increases; the page labels them."""
    from softverbs.fabric.switch import Topology

    sys.path.insert(0, str(UNIT))
    from sim_kit import rc_pair, stream

    path = tmp_path / "cc.jsonl"
    monkeypatch.setenv("SOFTVERBS_TRACE", str(path))
    mark_all = Topology(kmin=0, kmax=0, pmax=1.0)
    with Simulation(devices=("a", "b"), topology=mark_all, cc="dcqcn",
                    cc_params={"rpg_time_reset": 20}) as sim:  # fmt: skip
        stream(rc_pair(sim, mr_size=1 << 18), 30, size=4096)
        sim.run(0.001)
    from softverbs.trace import environment_trace

    out = environment_trace()
    assert out is not None
    out.flush()
    recs = _records(path)
    cnps = [r for r in recs if r["kind"] in ("packet_out", "packet_in") and r["opcode"] == "CNP"]
    # (the ACKs are ECN-capable and marked too, so a sends CNPs to b as well)
    assert {("b", "packet_out"), ("a", "packet_in")} <= {(r["dev"], r["kind"]) for r in cnps}
    rates = [r for r in recs if r["kind"] == "rate" and r["dev"] == "a"]
    whys = {r["why"] for r in rates}
    assert whys == {"CNP", "increase"}, whys
    cut = next(r for r in rates if r["why"] == "CNP")
    assert 0 < cut["bps"] < mark_all.bandwidth
    page = trace_cli.render(recs)
    assert "(CNP)" in page and "(increase)" in page and "CNP" in page
