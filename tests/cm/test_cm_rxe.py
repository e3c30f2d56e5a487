"""softverbs' RDMA CM against the Linux kernel's, on rxe in a qemu guest (on demand).

Run with ``pytest -m interop tests/cm`` or ``SOFTVERBS_INTEROP=1`` (root, qemu,
about a minute to boot the guest under TCG).  Guest ``g2`` (10.77.0.3) runs
rxe and librdmacm's examples; softverbs runs in the ``rocepeer`` namespace
on a UDP device bound to ``br-peer`` (10.77.0.1):

* softverbs client -> the guest's ``rdma_server`` (RC: REQ/REP/RTU, a SEND
  each way, DREQ/DREP);
* the guest's ``rdma_client`` -> a softverbs server (the same, reversed);
* a softverbs ``udaddy`` client -> the guest's ``udaddy`` server (UD:
  SIDR_REQ/SIDR_REP, ten datagrams each way).

The RC run is captured on the bridge: every frame carries a valid ICRC,
every CM MAD of either side decodes and re-encodes to the same bytes, and
ours leave from rxe's QP1 source port.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.interop

HERE = Path(__file__).resolve().parent
PEER = (HERE.parents[1] / ".." / "shared" / "peer").resolve()
OUT = Path(os.environ.get("PEER_OUT", "/tmp/peer"))
NS, GUEST, GUEST_IP, HOST_IP = "rocepeer", "g2", "10.77.0.3", "10.77.0.1"


class Guest:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def sh(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(PEER / "boot.sh"), *args], capture_output=True,
                              text=True, timeout=timeout, check=False)  # fmt: skip

    def run(self, command: str, timeout: float = 60.0) -> tuple[int, str]:
        r = self.sh("exec", GUEST, command, str(int(timeout)), timeout=timeout + 30)
        return r.returncode, r.stdout

    def background(self, command: str, out: str) -> None:
        self.run(f"(rm -f {out}; {command} > {out} 2>&1; echo EXIT $? >> {out}) &")

    def result(self, out: str, timeout: float = 60.0) -> str:
        end = time.monotonic() + timeout
        while True:
            _, text = self.run(f"cat {out}")
            if "EXIT " in text or time.monotonic() > end:
                return text
            time.sleep(1)

    def ours(self, *args: str, timeout: float = 120.0) -> subprocess.Popen[str]:
        cmd = ["ip", "netns", "exec", NS, sys.executable, str(HERE / "cm_rxe_side.py"), *args]
        return subprocess.Popen(cmd, env=self.env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)  # fmt: skip


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    if not (PEER / "boot.sh").exists() or shutil.which("qemu-system-x86_64") is None:
        pytest.skip("the rxe peer (../shared/peer) or qemu is missing")
    if os.geteuid() != 0:
        pytest.skip("the rxe peer needs root")
    if not (OUT / "vmlinuz").exists():
        r = subprocess.run(["bash", str(PEER / "build.sh")], capture_output=True, text=True,
                           timeout=1200, check=False)  # fmt: skip
        assert r.returncode == 0, r.stderr[-2000:]
    links = tmp_path_factory.mktemp("cmrxe") / "links.json"
    links.write_text(json.dumps({"links": [{"name": "svpeer", "netdev": "br-peer"}]}))
    env = {**os.environ, "SOFTVERBS_CONFIG": str(links), "SOFTVERBS_INPROC_DEVICES": ""}
    for var in ("SOFTVERBS_FAULTS", "SOFTVERBS_PCAP"):
        env.pop(var, None)
    env["SOFTVERBS_SERVICE"] = "0"  # this process's own device, on the bridge
    g = Guest(env)
    g.sh("stop", GUEST)
    try:
        r = g.sh("start", GUEST, GUEST_IP)
        assert r.returncode == 0, r.stdout + r.stderr
        r = g.sh("wait", GUEST, "PEER: READY", "300", timeout=330)
        assert r.returncode == 0, r.stdout + r.stderr
        yield g
    finally:
        g.sh("stop", GUEST)
        busy = subprocess.run(["pgrep", "-f", "qemu-system"], capture_output=True, check=False)
        if busy.returncode != 0:  # no other guest (another test's) is using the namespace
            g.sh("down")


def _ours(proc: subprocess.Popen[str], timeout: float = 120.0) -> dict[str, object]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def test_softverbs_client_kernel_rdma_server(guest: Guest, tmp_path: Path) -> None:
    from softverbs.cm import mad
    from softverbs.cm.gsi import rxe_ud_sport
    from softverbs.fabric.pcap import read_pcap
    from softverbs.wire.codec import decode_frame

    pcap = tmp_path / "cm.pcap"
    guest.sh("cap-start", "cmrxe", str(pcap), "udp", "port", "4791")
    time.sleep(1)
    guest.background("rdma_server", "/tmp/rs.out")
    time.sleep(1)
    ours = _ours(guest.ours("client", GUEST_IP))
    time.sleep(1)
    guest.sh("cap-stop", "cmrxe")
    assert "EXIT 0" in guest.result("/tmp/rs.out")
    assert ours["send"] == ours["recv"] == 0 and ours["bytes"] == 16
    seen = []
    for _ts, frame in read_pcap(pcap):
        pkt = decode_frame(frame)  # checks the ICRC
        if pkt.dqpn == mad.GSI_QPN:
            msg = mad.decode(bytes(pkt.payload))
            assert msg.encode() == bytes(pkt.payload)
            assert pkt.sport == rxe_ud_sport(mad.GSI_QPN)
            seen.append((pkt.sgid[12:] == bytes([10, 77, 0, 1]), msg.NAME))
    assert (True, "REQ") in seen and (False, "REP") in seen and (True, "RTU") in seen
    assert {n for _o, n in seen} >= {"DREQ", "DREP"}


def test_kernel_rdma_client_softverbs_server(guest: Guest) -> None:
    proc = guest.ours("server", HOST_IP)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "LISTENING"
    rc, text = guest.run(f"rdma_client -s {HOST_IP}", timeout=60)
    assert rc == 0 and "end 0" in text, text
    ours = _ours(proc)
    assert ours["send"] == ours["recv"] == 0 and ours["bytes"] == 16


def test_softverbs_udaddy_client_kernel_udaddy_server(guest: Guest) -> None:
    guest.background("udaddy", "/tmp/ud.out")
    time.sleep(1)
    ours = _ours(guest.ours("udclient", GUEST_IP))
    assert ours["sent"] == ours["received"] == 10 and ours["qkey"] == 0x01234567
    text = guest.result("/tmp/ud.out")
    assert "EXIT 0" in text and "data transfers complete" in text, text
