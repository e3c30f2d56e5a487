"""``bench/bench_inproc.py --quick`` runs to the end and prints its tables.

A smoke test of the benchmark script, not a benchmark: no speed is asserted.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench_kit import run_bench


def test_quick_run_prints_tables(tmp_path: Path) -> None:
    r = run_bench("bench_inproc.py", "--quick", "--plot", str(tmp_path / "p.png"))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert re.search(r"^machine: .*\d+ CPUs.*Python \d+\.\d+", out, re.M), out

    # (a) one row per batch size: batch, messages/s, usec/message
    for batch in (1, 16, 64):
        assert re.search(rf"^\s+{batch}\s+[\d,]+\s+\d+\.\d\d$", out, re.M), out
    # (b) one row per size: softverbs MB/s, memcpy MB/s, ratio
    for size in ("4 KiB", "64 KiB", "1 MiB"):
        assert re.search(rf"^\s+{size}\s+[\d,]+\.\d\s+[\d,]+\.\d\s+\d+\.\d+$", out, re.M), out

    # (c) one row per in-process target: allowed, outside the device, left, device now
    for row in (r"64 B SEND \(400,000/s\)", r"1 MiB WRITE \(0\.8 x memcpy\)"):
        assert re.search(rf"^\s+{row}(\s+-?\d+\.\d\d){{4}}$", out, re.M), out

    # the plot is written when matplotlib is importable, skipped (and said so) if not
    assert (tmp_path / "p.png").exists() or "skipping the plot" in out

    # progress on stderr: one line per figure, before it is measured
    steps = re.findall(r"^\[(\d)/7\] (.*) \(\d+ s\)$", r.stderr, re.M)
    assert [n for n, _ in steps] == ["1", "2", "3", "4", "5", "6", "7"], r.stderr
    assert steps[-2][1] == "RDMA WRITE 1 MiB"
    assert steps[-1][1] == "what the targets leave"


def test_quiet_run_prints_no_progress() -> None:
    r = run_bench("bench_inproc.py", "--quick", "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and "RDMA WRITE" in r.stdout


def test_served_quick_run_prints_both_devices() -> None:
    """bench_served.py starts its own softverbsd and prints a row per figure with
    both devices and their ratio (no speed asserted)."""
    r = run_bench("bench_served.py", "--quick", "--quiet", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    for batch in (1, 16, 64):
        assert re.search(rf"^ SEND 64 B, batch {batch}\s+[\d,]+\s+[\d,]+\s+\d+\.\d\d$",
                         r.stdout, re.M), r.stdout  # fmt: skip
    for size in ("4 KiB", "64 KiB", "1 MiB"):
        assert re.search(rf"^ WRITE {size} MB/s\s+[\d,]+\.\d\s+[\d,]+\.\d\s+\d+\.\d\d$",
                         r.stdout, re.M), r.stdout  # fmt: skip


def test_scale_smoke_run_prints_a_row_per_step(tmp_path: Path) -> None:
    r = run_bench("bench_scale.py", "--quiet", "--steps", "10,40",
                  "--plot", str(tmp_path / "s.png"), timeout=180)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    for n in (10, 40):
        assert re.search(rf"^\s+{n}\s+-?[\d.]+\s+[\d.]+\s+\d+\s+[\d.]+$", r.stdout, re.M), r.stdout
    assert (tmp_path / "s.png").exists() or "skipping the plot" in r.stdout
