"""``bench/bench_udp_cpu.py --quick`` runs to the end and prints its table.

A smoke test of the benchmark, not a benchmark: no speed is asserted, only that
both shapes of the ping-pong run (the script checks every payload and completion)
and that the table has its rows, with a CPU time and a ratio in each.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CELL = r"\d+\.\d \(\d+\.\d-\d+\.\d\)"


def test_quick_run_prints_both_rows() -> None:
    r = subprocess.run([sys.executable, "bench/bench_udp_cpu.py", "--quick"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    for case in ("one process, both ends, per one-way message",
                 "two processes blocking, per round trip and side"):  # fmt: skip
        row = rf"^ \(\d\) {re.escape(case)}\s+{CELL}\s+{CELL}\s+\d+\.\d$"
        assert re.search(row, r.stdout, re.M), r.stdout
