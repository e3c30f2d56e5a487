"""The worked example of docs/signature.md runs, and says what it should."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sig_pipelining.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_example_one_bad_command() -> None:
    r = _run()
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "IBV_EVENT_SQ_DRAINED" in out
    assert "cmd 5: bad guard in LBA 21" in out
    assert "cmd 5: MEDIUM ERROR lba 21" in out
    assert out.count(": GOOD") == 7
    assert out.strip().endswith("every command got the response its data deserved")


def test_example_all_good_and_two_bad() -> None:
    r = _run("--commands", "4", "--corrupt", "1", "--corrupt", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("IBV_EVENT_SQ_DRAINED") == 2
    r = _run("--commands", "3", "--corrupt", "-1")  # nothing corrupted: no stop at all
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SQ_DRAINED" not in r.stdout and r.stdout.count(": GOOD") == 3
