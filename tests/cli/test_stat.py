"""``softverbs stat``: counters in ``rdma statistic show``'s form."""

from __future__ import annotations

import json
import re
from pathlib import Path

from clikit import assert_user_error, softverbs_cli

from softverbs.verbs.device import STANDARD_COUNTERS


def test_text_and_json_rows(tmp_path: Path) -> None:
    r = softverbs_cli(tmp_path, "stat", SOFTVERBS_INPROC_DEVICES="sv0,sv1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[1] for line in lines] == ["sv0/1", "sv1/1"]
    assert re.fullmatch(r"link sv0/1( [a-z_0-9]+ \d+)+", lines[0])
    j = softverbs_cli(
        tmp_path, "stat", "show", "link", "sv1/1", "-j", SOFTVERBS_INPROC_DEVICES="sv0,sv1"
    )
    rows = json.loads(j.stdout)
    assert [(r["ifindex"], r["ifname"], r["port"]) for r in rows] == [(1, "sv1", 1)]
    assert set(STANDARD_COUNTERS) <= set(rows[0])
    dcqcn = {"np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored"}
    assert dcqcn <= set(rows[0])  # mlx5's names, shown at zero too


def test_a_served_device_shows_the_traffic_of_other_processes(tmp_path: Path) -> None:
    env = {"SOFTVERBS_SERVICE": str(tmp_path / "sv.sock")}
    try:
        demo = softverbs_cli(tmp_path, "demo", "-n", "20", "-s", "64", **env)
        assert demo.returncode == 0, demo.stderr
        r = softverbs_cli(tmp_path, "stat", "-j", **env)
        assert r.returncode == 0, r.stderr
        row = json.loads(r.stdout)[0]
        # 20 pings and 20 pongs, each one packet, at least; their ACKs come on top
        assert row["sent_pkts"] >= 40 and row["rcvd_pkts"] >= 40, row
    finally:
        softverbs_cli(tmp_path, "service", "stop", **env)


def test_mistakes(tmp_path: Path) -> None:
    assert_user_error(softverbs_cli(tmp_path, "stat", "qp", "mode"), "every QP has its own")
    assert_user_error(softverbs_cli(tmp_path, "stat", "link", "nodev"), "nodev")
    assert_user_error(softverbs_cli(tmp_path, "stat", "link", "sv0/2"), "sv0/2")
    assert_user_error(softverbs_cli(tmp_path, "stat", "show", "x", "y"), "x y")
