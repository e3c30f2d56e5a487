"""``softverbs demo`` run as a user runs it: a subprocess, checked by its output.

Behaviour only: the exit status and the shape of the summary.  No timing is
asserted; the numbers in the summary are only checked to be numbers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NUM = r"\d+\.\d\d"
ADDRESS = r"LID 0x[0-9a-f]{4}, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID \S+"


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "softverbs", "demo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(("op", "title"), [("send", "Send"), ("write", "RDMA_Write")])
def test_text_summary(op: str, title: str) -> None:
    r = demo("-n", "50", "-s", "1000", "--op", op)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    lines = out.splitlines()

    # perftest-style header
    assert f"{title} Ping-Pong Test" in out
    assert re.search(r"^ Device\s+: sv0\b", out, re.M)
    assert re.search(r"^ Connection type : RC\b", out, re.M)
    assert re.search(r"^ Mtu\s+: 1024\[B\]$", out, re.M)
    assert re.search(r"^ Message size\s+: 1000\[B\]$", out, re.M)
    assert re.search(r"^ Iterations\s+: 50$", out, re.M)

    # ibv_rc_pingpong's address lines; two different QPs
    local = re.search(rf"^  local address:  {ADDRESS}$", out, re.M)
    remote = re.search(rf"^  remote address: {ADDRESS}$", out, re.M)
    assert local and remote, out
    qpns = re.findall(r"QPN (0x[0-9a-f]{6})", out)
    assert len(qpns) == 2 and qpns[0] != qpns[1]

    # perftest's result table: a header and one row of numbers under it
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#bytes"))
    for column in ("#iterations", "BW average[MiB/sec]", "MsgRate[Mpps]", "t_avg[usec]"):
        assert column in lines[header]
    row = lines[header + 1].split()
    assert row[:2] == ["1000", "50"]
    assert all(re.fullmatch(r"\d+\.\d+", cell) for cell in row[2:]), row
    assert len(row) == len(re.findall(r"#\w+|\S+\[[^\]]+\]", lines[header]))

    # ibv_rc_pingpong's closing lines: 1000 bytes x 50 iterations x 2 directions
    assert re.search(rf"^100000 bytes in {NUM} seconds = {NUM} Mbit/sec$", out, re.M), out
    assert re.search(rf"^50 iters in {NUM} seconds = {NUM} usec/iter$", out, re.M), out


@pytest.mark.parametrize("op", ["send", "write"])
def test_json(op: str) -> None:
    r = demo("-n", "50", "-s", "1000", "--op", op, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout)  # nothing but the JSON object on stdout
    expected_keys = {
        "device", "qp_type", "op", "mtu", "link_type", "gid_index", "size", "iterations",
        "local", "remote", "bytes", "seconds", "mbit_per_sec", "usec_per_iter",
        "bw_average_mib_per_sec", "msg_rate_mpps", "t_min_usec", "t_typical_usec",
        "t_avg_usec", "t_max_usec", "verified",
    }  # fmt: skip
    assert set(result) == expected_keys
    assert result["iterations"] == 50
    assert result["size"] == 1000
    assert result["bytes"] == 100000
    assert (result["device"], result["qp_type"], result["op"]) == ("sv0", "RC", op)
    assert result["verified"] is True
    for side in ("local", "remote"):
        assert set(result[side]) == {"lid", "qpn", "psn", "gid"}
        assert 0 <= result[side]["psn"] < 1 << 24
    assert result["local"]["qpn"] != result["remote"]["qpn"]
    assert result["t_min_usec"] <= result["t_typical_usec"] <= result["t_max_usec"]


def test_options_reach_the_summary() -> None:
    r = demo("-n", "5", "-s", "3000", "-m", "256", "-g", "0", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout)
    assert (result["mtu"], result["gid_index"], result["size"]) == (256, 0, 3000)
    assert result["local"]["gid"].startswith("fe80::")  # GID 0 is the link-local one


def test_unknown_device_fails_loudly() -> None:
    r = demo("-n", "5", "-d", "nosuchdev")
    assert r.returncode != 0
    assert "nosuchdev" in r.stderr
    assert "bytes in" not in r.stdout


def test_bad_mtu_is_refused() -> None:
    r = demo("-m", "1000")
    assert r.returncode == 2
    assert "--mtu" in r.stderr
