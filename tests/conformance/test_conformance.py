"""rdma-core's own test suite on softverbs, held to a floor.

Runs ``softverbs conformance`` (download the pyverbs sdist with pip, unpack
``rdma-core/tests`` into the cache, run it through ``softverbs exec`` on the
embedded device) and fails if fewer tests pass than ``floor.json`` says.
The failure message carries the per-file table.  The suite is GPL: it lives
only in the cache (``$SOFTVERBS_CACHE``, else ``~/.cache/softverbs/
conformance``), never in this repository.

Marked ``slow``: the download and the run take about two minutes.  It needs
PyPI (``pip download``) on the first run; without network access it skips,
except under CI (``$CI`` set), where a failed download fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from softverbs.cli import conformance

FLOOR = Path(__file__).with_name("floor.json")


@pytest.mark.slow
def test_rdma_core_suite_stays_above_the_floor(tmp_path: Path) -> None:
    floor = json.loads(FLOOR.read_text())
    cache = conformance.cache_dir()
    try:
        sdist = conformance.fetch_sdist(cache, floor["pyverbs_version"])
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise  # CI has PyPI: a failed download is a failure there
        pytest.skip(f"cannot fetch the suite (no PyPI access?): {str(exc)[:300]}")
    root = conformance.unpack_suite(sdist, cache, floor["pyverbs_version"])
    # the suite is unpacked in the cache, never into this source tree
    assert not root.resolve().is_relative_to(Path(__file__).resolve().parents[2])
    summary = conformance.run_suite(root, floor["config"], floor["pyverbs_version"],
                                   timeout=1800, log=tmp_path / "suite.log")  # fmt: skip
    table = conformance.format_table(summary, include_vendor=False)
    passed = summary.total["passed"]
    failing = [f"  {r.status}: {r.id}: {r.reason}" for r in summary.results
               if r.status in ("failed", "errors")]  # fmt: skip
    log = (tmp_path / "suite.log").read_text()
    assert summary.ran > 0, f"the suite did not run:\n{log[-3000:]}"
    assert passed >= floor["passed"], (
        f"{passed} rdma-core tests passed, below the floor of {floor['passed']} "
        f"({floor['config']} configuration, {summary.seconds:.0f} s):\n{table}\n"
        + "\n".join(failing)
    )


def test_floor_file_is_sane() -> None:
    floor = json.loads(FLOOR.read_text())
    assert floor["config"] in conformance.CONFIGS
    assert floor["passed"] >= 135  # the target; the floor only ever rises


def test_conformance_command_is_registered() -> None:
    r = subprocess.run([sys.executable, "-m", "softverbs", "conformance", "--help"],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "--config" in r.stdout and "embedded" in r.stdout
