"""``bench/bench_incast.py --json`` runs to the end: one object per configuration.

A smoke test of the benchmark script on a short run, not a benchmark: nothing
about speed is asserted, only the output's shape (the keys the issue names).
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench_kit import ROOT, run_bench

KEYS = {"senders", "cc", "utilisation", "jain", "queue_p50", "queue_p99", "kmax", "drops",
        "retransmits", "cnps"}  # fmt: skip


def incast(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``bench/bench_incast.py ARGS`` from the project's root, its output captured."""
    return run_bench("bench_incast.py", *args, timeout=timeout)


def test_json_rows() -> None:
    r = incast("--senders", "2", "--duration", "0.0005", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(row["senders"], row["pfc"], row["cc"]) for row in rows] == [
        (2, True, "dcqcn"),
        (2, True, "none"),
        (2, False, "dcqcn"),
        (2, False, "none"),
    ]
    for row in rows:
        assert set(row) >= KEYS, row
        assert 0 <= row["utilisation"] <= 1.0001 and row["kmax"] == 200_000
    assert rows[0]["cnps"] > 0 and rows[1]["cnps"] == 0
    assert rows[1]["drops"] == 0 and rows[3]["drops"] > 0  # PFC pauses, tail drop drops


def test_bad_arguments_are_refused() -> None:
    r = incast("--senders", "two", timeout=60)
    assert r.returncode == 2 and "--senders" in r.stderr
    r = incast("--fabric", "lossles", timeout=60)
    assert r.returncode == 2 and "--fabric" in r.stderr
    for args, words in ((["--buffer", "100"], "--buffer"), (["--timeout", "40"], "--timeout"),
                        (["--cc", "dcqcn,reno"], "--cc"), (["--red", "arista"], "--red"),
                        (["--stagger", "-1e-6"], "--stagger")):  # fmt: skip
        r = incast(*args, timeout=60)
        assert r.returncode == 2 and words in r.stderr, r.stderr


def test_red_profile_and_one_cc() -> None:
    """``--red cumulus --cc dcqcn``: Cumulus Linux's Kmax in the rows, the buffer 4 x it,
    and only the DCQCN rows."""
    r = incast("--senders", "2", "--duration", "0.0003", "--red", "cumulus", "--cc", "dcqcn",
               "--fabric", "lossy")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "buffer 6006 KB, RED cumulus (Kmin 150 KB, Kmax 1501.5 KB, Pmax 100%)" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] == ["2"]]
    assert [row[:3] for row in rows] == [["2", "lossy", "dcqcn"]]


def test_named_parameter_sets_are_valid_mlx5_knobs() -> None:
    """``--params``: every named set passes the device's own parameter check (the HPCC
    simulator's turns the byte counter off with ``rpg_byte_reset=0``), and one runs."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_incast
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from softverbs.engine.congestion import check_params

    assert set(bench_incast.PARAM_SETS) == {"mlx5", "paper", "hpcc"}
    for name, params in bench_incast.PARAM_SETS.items():
        assert check_params("dcqcn", params) is None, name
    assert bench_incast.PARAM_SETS["hpcc"]["rpg_byte_reset"] == 0
    r = incast("--senders", "2", "--duration", "0.0003", "--params", "hpcc", "--cc", "dcqcn",
               "--fabric", "lossy")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "DCQCN parameters: hpcc" in r.stdout
