"""The interop harness's check that the rxe guest still answers on its network.

One guest serves a whole ``pytest -m interop`` session; a guest that stopped answering
would fail every test after it ("No route to host", docs/status.md).  The ``clean``
fixture probes the guest after each test (``Peer.silent``: a TCP SYN from the namespace
to a closed port, which a live guest answers with RST), and a silent guest makes that
test error with what both ends of the link looked like, then is booted again.

The probe itself is checked here in throwaway network namespaces (always, as root);
the whole path against the real guest runs with the interop tests, first, on purpose:
the tests after it run on the guest it booted again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rxe_kit import GUEST, PROBE, RUN, Peer


def _probe_in_new_netns(setup: str, address: str) -> str:
    script = f'{setup}exec "$0" -c "$1" "$2" 1'
    r = subprocess.run(["unshare", "-n", "sh", "-c", script, sys.executable, PROBE, address],
                       capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a network namespace")  # fmt: skip
def test_probe_tells_an_answering_host_from_a_silent_one() -> None:
    # lo up, nothing on port 9: the kernel answers the SYN with RST
    assert _probe_in_new_netns("ip link set lo up; ", "127.0.0.1") == "answers"
    # no interface up: nothing can answer (ENETUNREACH here; EHOSTUNREACH or a
    # timeout on a bridge whose guest went quiet)
    assert _probe_in_new_netns("", "10.77.0.2").startswith("silent: ")


@pytest.mark.interop
def test_a_guest_that_stops_answering_is_found_and_booted_again(peer: Peer) -> None:
    """The symptom of the cascade: the guest's console works, its network is silent
    (here: eth0 taken down from the console).  The probe must see it, the evidence must
    show it, and the guest booted again must answer."""
    assert peer.silent() == ""
    peer.guest("/usr/sbin/ip link set eth0 down")
    got = peer.silent()
    assert got.startswith("silent: "), got
    report = peer.recover("in the health test")
    assert "state DOWN" in report, report  # the guest's eth0, from its console
    kept = report.rsplit("kept in ", 1)[1].split(";", 1)[0]
    assert kept.startswith(str(RUN / f"{GUEST}-"))
    assert "PEER: READY" in Path(kept).read_text(errors="replace")  # the old boot's console
    assert peer.silent() == ""
    rc, out = peer.guest("rdma link show")
    assert rc == 0 and "state ACTIVE" in out, out
