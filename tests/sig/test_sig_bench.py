"""``bench/bench_sig.py --quick`` runs to the end, in both output formats.

A smoke test of the benchmark script, not a benchmark: no speed is asserted.
"""

from __future__ import annotations

import json
import re

from bench_kit import run_bench


def _run(*args: str) -> str:
    r = run_bench("bench_sig.py", "--quick", "--iters", "3", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_quick_table() -> None:
    out = _run()
    assert re.search(r"^machine: .*CPython|^machine: .*Python", out, re.M), out
    for link in ("in-process ", "in-process + 50 us/hop", "UDP loopback"):
        for sig in ("CRC32", "T10-DIF"):
            row = rf"^ {re.escape(link)}.*{sig}\s+4 KiB\s+[\d.]+\s+[\d.]+\s+-?[\d.]+\s+-?\d+%$"
            assert re.search(row, out, re.M), (link, sig, out)


def test_quick_json() -> None:
    data = json.loads(_run("--json", "--delay", "20e-6"))
    rows = data["rows"]
    assert len(rows) == 6
    assert {r["link"] for r in rows} == {"in-process", "in-process + 20 us/hop", "UDP loopback"}
    for r in rows:
        assert r["pipelined_us"] > 0 and r["wait_check_send_us"] > 0
        assert abs(r["saving_us"] - (r["wait_check_send_us"] - r["pipelined_us"])) < 1e-6
