"""``bench/bench_udp_cpu.py --quick`` runs to the end and prints its table.

A smoke test of the benchmark, not a benchmark: no speed is asserted, only that
both shapes of the ping-pong run (the script checks every payload and completion)
and that the table has its rows, with a CPU time and a ratio in each.
"""

from __future__ import annotations

import re
import subprocess

from bench_kit import ROOT, run_bench

CELL = r"\d+\.\d \(\d+\.\d-\d+\.\d\)"


def assert_rows(r: subprocess.CompletedProcess[str], ratio: str) -> None:
    """The run ended well and printed both cases' rows, each ending in a ratio like ``ratio``."""
    assert r.returncode == 0, r.stdout + r.stderr
    for case in ("one process, both ends, per one-way message",
                 "two processes blocking, per round trip and side"):  # fmt: skip
        row = rf"^ \(\d\) {re.escape(case)}\s+{CELL}\s+{CELL}\s+{ratio}$"
        assert re.search(row, r.stdout, re.M), r.stdout


def test_quick_run_prints_both_rows() -> None:
    assert_rows(run_bench("bench_udp_cpu.py", "--quick"), r"\d+\.\d")


def test_a_baseline_run_sets_two_trees_side_by_side() -> None:
    """``--baseline`` runs the benchmark of another tree in turn with this one's
    (here this tree against itself) and prints both, with their ratio."""
    r = run_bench("bench_udp_cpu.py", "--quick", "--baseline", str(ROOT), timeout=240)
    assert_rows(r, r"\d+\.\d\d")


def test_a_baseline_without_the_benchmark_is_refused() -> None:
    r = run_bench("bench_udp_cpu.py", "--quick", "--baseline", str(ROOT / "docs"), timeout=60)
    assert r.returncode == 2 and "has no bench/bench_udp_cpu.py" in r.stderr, r.stderr
