"""RDMA CM between real processes: one device, served by softverbsd, over UDP.

The device is a UDP (RoCEv2) link bound to a loopback address; softverbsd
owns it, and with it QP1 and the CM agent.  The processes are forked from
one parent that has used the service already (:mod:`cm_procs`), as in
rdma-core's RDMACMBaseTest.  Every CM message is a MAD on the wire of the
loopback interface.

The last test runs rdma-core's own ``test_rdmacm`` through
``softverbs exec`` when the pyverbs sdist is at hand (``SOFTVERBS_RDMA_CORE_TESTS``,
the conformance runner's cache, or /tmp/pvcache), on a link bound to ``lo``
-- the tests find the device's IP with ``rdma link`` and ``ip addr``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
CM_IP = "127.0.0.61"  #: an address nothing else in the test suite uses


def _port_free(ip: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((ip, 4791))
        except OSError:
            return False
    return True


class Served:
    """A private softverbsd serving one UDP link, for one test."""

    def __init__(self, link: dict[str, Any]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="svcm", dir="/tmp"))
        self.sock = str(self.dir / "sv.sock")
        (self.dir / "links.json").write_text(json.dumps({"links": [link]}))
        env = dict(os.environ)
        for key in ("SOFTVERBS_FAULTS", "SOFTVERBS_PCAP", "SOFTVERBS_EXEC"):
            env.pop(key, None)
        env.update(SOFTVERBS_CONFIG=str(self.dir / "links.json"), SOFTVERBS_INPROC_DEVICES="",
                   SOFTVERBS_SERVICE=self.sock)  # fmt: skip
        self.env = env
        subprocess.run([sys.executable, "-m", "softverbs", "service", "start", "--socket",
                        self.sock], env=env, check=True, capture_output=True, timeout=60)

    def stop(self) -> None:
        subprocess.run([sys.executable, "-m", "softverbs", "service", "stop", "--socket",
                        self.sock], env=self.env, check=False, capture_output=True,
                       timeout=60)  # fmt: skip
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    if not _port_free(CM_IP):
        pytest.skip(f"UDP port 4791 on {CM_IP} is taken")
    svc = Served({"name": "svcm", "addrs": [CM_IP]})
    try:
        yield svc
    finally:
        svc.stop()


def _run(served: Served, scenario: str, port: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(HERE / "cm_procs.py"), scenario, "svcm", CM_IP,
                           str(port)], env=served.env, capture_output=True, text=True,
                          timeout=90)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    for side in ("passive", "active"):
        assert "error" not in out.get(side, {}), out[side]["error"]
    return out


def test_rc_between_two_processes(served: Served) -> None:
    out = _run(served, "rc", 18001)
    assert out["exitcodes"] == [0, 0], out
    p, a = out["passive"], out["active"]
    assert a["dev"] == "svcm" and p["private_data"] == "hello"
    assert p["received"] == "ping" and a["received"] == "pong"
    assert a["send_status"] == p["send_status"] == a["write_status"] == a["read_status"] == 0
    assert a["read"] == p["written"] == "writ"  # the READ returns what the WRITE put there
    assert a["disconnected"] == 0


def test_ud_between_two_processes(served: Served) -> None:
    out = _run(served, "ud", 18002)
    assert out["exitcodes"] == [0, 0], out
    assert out["passive"]["received"] == "ping" and out["active"]["received"] == "pong"


def test_reject_between_two_processes(served: Served) -> None:
    out = _run(served, "reject", 18003)
    assert out["exitcodes"] == [0, 0], out
    assert out["active"]["reject"] == [28, "go away"]  # IB_CM_REJ_CONSUMER_DEFINED


def test_a_process_that_dies_connected_disconnects_its_peer(served: Served) -> None:
    out = _run(served, "crash", 18004)
    assert out["exitcodes"] == [0, 0], out
    assert out["active"]["disconnected"] == 0


# --- rdma-core's test_rdmacm ---------------------------------------------------------------


def _suite() -> Path | None:
    """The directory holding rdma-core's ``tests`` package, if there is one."""
    candidates = []
    env = os.environ.get("SOFTVERBS_RDMA_CORE_TESTS")
    if env:
        candidates.append(Path(env))
    cache = Path(os.environ.get("SOFTVERBS_CACHE") or "~/.cache/softverbs/conformance")
    # softverbs conformance's suites (suite-VERSION), newest first
    candidates += sorted(cache.expanduser().glob("suite-[0-9]*"), reverse=True)
    candidates += sorted(Path("/tmp/pvcache").glob("pyverbs-*/rdma-core"), reverse=True)
    for root in candidates:
        if (root / "tests" / "test_rdmacm.py").exists():
            return root
    return None


def test_rdma_core_test_rdmacm() -> None:
    root = _suite()
    if root is None:
        pytest.skip("rdma-core's tests are not here: set SOFTVERBS_RDMA_CORE_TESTS, or run "
                    "'softverbs conformance' once to fetch the pyverbs sdist")  # fmt: skip
    if not _port_free("127.0.0.1"):
        pytest.skip("UDP port 4791 on 127.0.0.1 is taken (a link on lo is in use)")
    svc = Served({"name": "svlo", "netdev": "lo"})
    try:
        cmd = [sys.executable, "-m", "softverbs", "exec", "--", sys.executable,
               str(root / "tests" / "run_tests.py"), "-v", "--dev", "svlo", "test_rdmacm"]
        proc = subprocess.run(cmd, cwd=root, env=svc.env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
    finally:
        svc.stop()
    text = proc.stderr + proc.stdout
    results = dict(re.findall(r"^(test_\w+) \(.*?\) \.\.\. (ok|FAIL|ERROR|skipped)", text, re.M))
    assert len(results) == 10, text[-3000:]
    multicast = {t for t in results if "multicast" in t}
    assert len(multicast) == 3, sorted(results)  # join, join_ex, join_ex + leave
    for test, status in results.items():
        assert status == "ok", f"{test}: {status}\n{text[-3000:]}"
