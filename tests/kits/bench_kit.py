"""Running a script of ``bench/`` from a test, as a user runs it.

The bench smoke tests (``tests/bench``, ``tests/sig/test_sig_bench.py``) judge a
benchmark script by its own exit status and output, never by a speed: each runs
``python bench/SCRIPT ARGS`` from the project's root with this one helper.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python bench/SCRIPT ARGS`` from the root, its output captured as text.

    The exit status is the caller's to judge (a bad option must exit 2)."""
    return subprocess.run([sys.executable, f"bench/{script}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
