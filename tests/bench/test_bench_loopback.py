"""``bench/bench_loopback.py --quick --no-ucx`` runs to the end and prints its tables.

A smoke test of the two-process loopback benchmark, not a benchmark: no speed
is asserted, only that both processes meet, the data arrive (the script
checks them by hash), and the tables have their rows and columns.
"""

from __future__ import annotations

import re

from bench_kit import run_bench

NUM = r"[\d,]+\.\d"


def test_quick_run_prints_tables() -> None:
    r = run_bench("bench_loopback.py", "--quick", "--no-ucx", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert re.search(r"^machine: .*\d+ CPUs.*Python \d+\.\d+", out, re.M), out
    assert "skipped (--no-ucx)" in out, out

    # (1) size, softverbs MB/s, UCX MB/s (n/a), ratio (n/a), Python UDP MB/s, ratio
    header = r"^\s+size\s+softverbs MB/s\s+UCX MB/s\s+softverbs/UCX\s+Py-UDP MB/s\s+"
    header += r"softverbs/Py-UDP$"
    assert re.search(header, out, re.M), out
    for size in ("4 KiB", "64 KiB", "1 MiB", "4 MiB"):
        row = rf"^\s+{size}\s+{NUM}\s+n/a\s+n/a\s+{NUM}\s+\d+\.\d{{4}}$"
        assert re.search(row, out, re.M), out

    # (2) latency: softverbs (busy-polling and sleeping in get_cq_event) and Python
    # UDP measured, UCX n/a
    for mode in ("busy poll", "events"):
        assert re.search(rf"^\s+softverbs RC SEND 8 B \({mode}\)\s+{NUM}\s+{NUM}$", out, re.M), out
    assert re.search(r"^\s+UCX tag_lat 8 B.*\sn/a\s+n/a$", out, re.M), out
    assert re.search(rf"^\s+Python UDP 24 B datagram\s+{NUM}\s+{NUM}$", out, re.M), out
    assert re.search(r"^Python UDP ceiling: [\d,]+ packets/s", out, re.M), out


def test_loss_run_without_latency_prints_the_write_counters() -> None:
    """``--loss`` with ``--no-latency``: no softverbs ping-pong, and the client's
    counters after the WRITE runs on their own line (the loss table's source)."""
    r = run_bench("bench_loopback.py", "--quick", "--no-ucx", "--sizes", "1M", "--no-latency",
                  "--loss", "0.01", timeout=90)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert re.search(rf"^\s+1 MiB\s+{NUM}\s+n/a", out, re.M), out
    for mode in ("busy poll", "events"):
        assert re.search(rf"^\s+softverbs RC SEND 8 B \({mode}\)\s+n/a\s+n/a$", out, re.M), out
    assert re.search(r"^softverbs client counters after \(1\): sent_pkts \d+", out, re.M), out
