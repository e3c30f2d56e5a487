"""Running ``softverbs`` as a user does, and checking how it fails.

Each command runs in a real process with a private link table and no
inherited softverbs settings, so the tests neither see nor change the
machine's configuration.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import softverbs

SRC = str(Path(softverbs.__file__).resolve().parents[1])
ROOT_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
#: settings a test must not inherit from the shell that runs pytest
CLEARED = (
    "SOFTVERBS_SERVICE",
    "SOFTVERBS_FAULTS",
    "SOFTVERBS_PCAP",
    "SOFTVERBS_TRACE",
    "SOFTVERBS_MLX5",
    "SOFTVERBS_INPROC_DEVICES",
    "SOFTVERBS_EXEC",
)
TIMEOUT = 120


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env["PYTHONPATH"] = SRC
    env["SOFTVERBS_CONFIG"] = str(tmp_path / "links.json")
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "run")  # never the user's default socket
    env.update(extra)
    return env


def softverbs_cli(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "softverbs", *args],
        env=cli_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def assert_user_error(r: subprocess.CompletedProcess[str], *named: str, rc: int = 1) -> str:
    """``r`` failed as a user's mistake must: exit ``rc``, one line on stderr, no
    traceback, naming every string in ``named``.  Returns the line."""
    assert r.returncode == rc, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    for word in named:
        assert word in lines[0], (word, lines[0])
    return lines[0]
