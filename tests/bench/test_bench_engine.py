"""``bench/bench_engine.py --quick`` runs to the end and prints one row per message kind.

A smoke test of the benchmark script, not a benchmark: no speed is asserted.  Every
completion it takes is checked by the script itself (a failed one exits non-zero).
"""

from __future__ import annotations

import re

import pytest
from bench_kit import run_bench


def test_quick_run_prints_a_row_per_kind() -> None:
    r = run_bench("bench_engine.py", "--quick")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^softverbs: (compiled|interpreted)", r.stdout, re.M), r.stdout
    for kind in ("write4k", "send8"):
        row = rf"^{kind}\s+CPU us/message: best \d+\.\d\d  median \d+\.\d\d$"
        assert re.search(row, r.stdout, re.M), r.stdout


def test_an_unknown_kind_is_named() -> None:
    r = run_bench("bench_engine.py", "--quick", "--kinds", "read")
    assert r.returncode != 0
    assert "'read' is not write4k or send8" in r.stderr


def test_packed_queues_run_to_the_end() -> None:
    """``--packed``: the queues in their shared byte layout, each WQE decoded from its slot."""
    r = run_bench("bench_engine.py", "--quick", "--packed", "--iters", "500")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^softverbs: .*, packed queues$", r.stdout, re.M), r.stdout
    for kind in ("write4k", "send8"):
        assert re.search(rf"^{kind}\s+CPU us/message: best", r.stdout, re.M), r.stdout


def test_process_memory_and_packed_queues_run_to_the_end() -> None:
    """``--proc --packed``: the service's copies through ``/proc/self/mem`` and its queues in
    their byte layout, together (each exits non-zero on a failed completion)."""
    r = run_bench("bench_engine.py", "--quick", "--proc", "--packed", "--iters", "500")
    if "no PROCMAP_QUERY" in r.stderr:
        pytest.skip("--proc needs PROCMAP_QUERY (Linux 6.11+)")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^softverbs: .*, packed queues$", r.stdout, re.M), r.stdout
    for kind in ("write4k", "send8"):
        assert re.search(rf"^{kind}\s+CPU us/message: best", r.stdout, re.M), r.stdout
