"""Debian's python3-pyverbs -- rdma-core 44's real Cython pyverbs, unmodified --
runs rdma-core 44's own tests through softverbs' C libraries.

The real pyverbs is a C extension over ``libibverbs.so.1``/``librdmacm.so.1``
(and ``libmlx5``/``libefa`` for its vendor modules), so everything it does
goes through softverbs' C ABI.  The test runs the suite the package ships
(``/usr/share/doc/rdma-core/tests``) as ``softverbs conformance --suite debian
--pyverbs system --config service`` does -- one runner, the same trustworthy
count -- and fails below the committed floor (``pyverbs_floor.json``).  The
floor only rises (compared with every earlier version in git history).

softverbs' own pyverbs passes two more of the same suite (``softverbs_pyverbs``
in the floor file; docs/conformance.md says which and why): the C libraries
have no ``ibv_import_device``, and a forked child gets EPERM on its parent's
context.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from softverbs.cli import conformance

FLOOR = Path(__file__).with_name("pyverbs_floor.json")
ROOT = Path(__file__).resolve().parents[2]


def _installed() -> None:
    try:
        conformance.debian_version()
    except RuntimeError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc} (scripts/apt-packages.txt)")
        pytest.skip(str(exc))
    if not Path(conformance.SYSTEM_PYTHON).exists():
        pytest.skip(f"no {conformance.SYSTEM_PYTHON}, the interpreter python3-pyverbs is for")


def test_debian_pyverbs_runs_rdma_core_tests_above_the_floor(tmp_path: Path) -> None:
    _installed()
    try:
        conformance.check_port_free()
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot run the service configuration here: {exc}")
    data = json.loads(FLOOR.read_text())
    floor = int(data["floors"]["system"])
    root, version = conformance.unpack_debian_suite(conformance.cache_dir())
    assert not root.resolve().is_relative_to(ROOT)  # the GPL suite stays in the cache
    log = tmp_path / "suite.log"
    s = conformance.run_suite(root, "service", version, timeout=1200, log=log,
                              pyverbs="system")  # fmt: skip
    assert s.ran > 0, f"the suite did not run:\n{log.read_text()[-3000:]}"
    assert not s.problems, s.problems
    failing = [f"  {r.status}: {r.id}: {r.reason}" for r in s.results
               if r.status in ("failed", "errors")
               and not conformance.is_vendor(r.file)]  # fmt: skip
    passed = s.generic["passed"]
    assert passed >= floor, (
        f"{passed} generic rdma-core {version} tests passed with Debian's pyverbs, below the "
        f"floor of {floor} (tests/thirdparty/pyverbs_floor.json)\n"
        + conformance.format_table(s, include_vendor=False)
        + "\n"
        + "\n".join(failing)
    )


def test_exec_system_pyverbs_imports_debians_pyverbs(service_env: dict[str, str]) -> None:
    """What the suite imports under ``exec --system-pyverbs`` is the package's
    compiled pyverbs, and it sees softverbs' device through the C library."""
    _installed()
    code = ("import pyverbs, pyverbs.device as d; print(pyverbs.__file__); "
            "print(*[x.name.decode() for x in d.get_device_list()])")  # fmt: skip
    argv = [sys.executable, "-m", "softverbs", "exec", "--system-pyverbs", "--",
            conformance.SYSTEM_PYTHON, "-c", code]  # fmt: skip
    r = subprocess.run(argv, env=service_env, capture_output=True, text=True, timeout=120,
                       check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    where, devices = r.stdout.splitlines()
    assert where.startswith("/usr/lib/python3/dist-packages/pyverbs/"), r.stdout
    assert "sv0" in devices.split(), r.stdout


def test_pyverbs_floor_only_rises() -> None:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("no git history to compare the floor with")
    rel = str(FLOOR.relative_to(ROOT))
    now = int(json.loads(FLOOR.read_text())["floors"]["system"])
    log = subprocess.run([git, "log", "--format=%H", "--", rel], cwd=ROOT, capture_output=True,
                         text=True, check=False)  # fmt: skip
    for commit in log.stdout.split():
        old = subprocess.run([git, "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True,
                             text=True, check=False)  # fmt: skip
        if old.returncode == 0:
            before = int(json.loads(old.stdout)["floors"]["system"])
            assert now >= before, f"the floor fell from {before} (commit {commit[:12]}) to {now}"
