"""rdma-core's own test suite on softverbs, held to the committed floors.

Runs the suite as ``softverbs conformance`` does (the pyverbs sdist, fetched
with pip into the cache, ``rdma-core/tests`` unpacked there and run through
``softverbs exec``) on two device configurations, and fails if fewer generic
tests pass than ``floor.json`` says for that configuration:

* ``embedded`` -- the in-process device;
* ``service`` -- a UDP device on ``lo`` served by softverbsd, the device every
  process of the host shares.

The suite runs with the verbs sanitizer on (``SOFTVERBS_SANITIZE=1``,
docs/sanitizer.md): rdma-core's tests are correct programs, so a single
report in the suite's output is a false positive and fails the test.

The count is the runner's trustworthy one (see ``softverbs.cli.conformance``):
a module that fails to import is an error, unittest's own count must match
the results read, vendor opt-ins are cleared, an expected failure is no pass.

The floors only rise: ``floor.json`` is compared with every earlier version of
itself in git history.  Raise a floor when the count climbs; never lower it.

Each configuration takes two to three minutes.  The suite is GPL: it lives only
in the cache (``$SOFTVERBS_CACHE``, else ``~/.cache/softverbs/conformance``),
never in this repository.  The first run needs PyPI; without it the tests skip,
except under CI (``$CI`` set), where a failed download fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from softverbs.cli import conformance

FLOOR = Path(__file__).with_name("floor.json")
ROOT = Path(__file__).resolve().parents[2]


def floors(data: dict[str, Any]) -> dict[str, int]:
    """config -> floor, from this or an earlier layout of floor.json."""
    if "floors" in data:
        return {str(k): int(v) for k, v in data["floors"].items()}
    return {str(data["config"]): int(data["passed"])}  # the first layout: one floor


def _suite() -> Path:
    version = json.loads(FLOOR.read_text())["pyverbs_version"]
    cache = conformance.cache_dir()
    try:
        sdist = conformance.fetch_sdist(cache, version)
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise  # CI has PyPI: a failed download is a failure there
        pytest.skip(f"cannot fetch the suite (no PyPI access?): {str(exc)[:300]}")
    root = conformance.unpack_suite(sdist, cache, version)
    # the suite is unpacked in the cache, never into this source tree
    assert not root.resolve().is_relative_to(ROOT)
    return root


@pytest.mark.parametrize("config", ["embedded", "service"])
def test_rdma_core_suite_stays_above_the_floor(config: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("SOFTVERBS_SANITIZE", "1")
    floor = floors(json.loads(FLOOR.read_text()))[config]
    root = _suite()
    if config != "embedded":
        try:
            conformance.check_port_free()
        except RuntimeError as exc:
            if os.environ.get("CI"):
                raise
            pytest.skip(f"cannot run the {config} configuration here: {exc}")
    version = json.loads(FLOOR.read_text())["pyverbs_version"]
    log = tmp_path / "suite.log"
    summary = conformance.run_suite(root, config, version, timeout=1800, log=log)
    table = conformance.format_table(summary, include_vendor=False)
    failing = [
        f"  {r.status}: {r.id}: {r.reason}"
        for r in summary.results
        if r.status in ("failed", "errors") and not conformance.is_vendor(r.file)
    ]
    assert summary.ran > 0, f"the suite did not run:\n{log.read_text()[-3000:]}"
    raw = log.read_text()
    assert "softverbs-sanitizer: " not in raw, (
        "the sanitizer reported misuse in rdma-core's suite (a false positive):\n"
        + raw[raw.index("softverbs-sanitizer: ") - 300 :][:3000]
    )
    passed = summary.generic["passed"]
    assert passed >= floor, (
        f"{passed} generic rdma-core tests passed on the {config} configuration, below the "
        f"committed floor of {floor} (tests/conformance/floor.json): a regression. "
        f"({summary.seconds:.0f} s)\n{table}\n" + "\n".join(failing)
    )


def test_floor_file_names_every_configuration_it_holds() -> None:
    data = json.loads(FLOOR.read_text())
    assert set(floors(data)) == {"embedded", "service"}
    assert set(floors(data)) <= set(conformance.CONFIGS)
    assert all(n > 0 for n in floors(data).values())


def test_floors_only_rise() -> None:
    """No floor in the working floor.json is below one committed before it."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("no git history to compare the floors with")
    rel = str(FLOOR.relative_to(ROOT))
    log = subprocess.run(
        [git, "log", "--format=%H", "--", rel],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if log.returncode != 0:
        pytest.skip(f"git log failed: {log.stderr.strip()}")
    now = floors(json.loads(FLOOR.read_text()))
    for commit in log.stdout.split():
        old = subprocess.run(
            [git, "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True, text=True, check=False
        )
        if old.returncode != 0:
            continue
        for config, value in floors(json.loads(old.stdout)).items():
            assert now.get(config, 0) >= value, (
                f"the {config} floor was {value} in {commit[:12]} and is {now.get(config)} now: "
                "a floor only rises"
            )


def test_conformance_command_is_registered() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "softverbs", "conformance", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "--config" in r.stdout and "embedded" in r.stdout and "--quiet" in r.stdout
