"""The code-quality gates run as tests, so one command checks everything."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)


def test_mypy_strict() -> None:
    pytest.importorskip("mypy")
    r = _run(sys.executable, "-m", "mypy")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff() -> None:
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it is in the [test] extra)")
    r = _run(ruff, "check", "src", "tests", "bench")
    assert r.returncode == 0, r.stdout + r.stderr
