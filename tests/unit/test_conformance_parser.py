"""The conformance runner's reading of unittest's verbose output.

The samples are written here in unittest's format (Python 3.11): a test's
header line, optionally its docstring's first line, then `` ... `` and the
status -- on the same line, or on a line of its own when the test printed
something in between.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from softverbs.cli import conformance

SAMPLE = """\
test_a (tests.test_x.XTest.test_a) ... ok
test_b (tests.test_x.XTest.test_b)
Docstring of b ... FAIL
test_c (tests.test_x.XTest.test_c) ... skipped 'Not supported here'
test_d (tests.test_y.YTest.test_d)
Docstring of d ... printed by the test
ERROR
test_e (tests.test_mlx5_z.ZTest.test_e) ... skipped "Can't run: not mlx5"
test_f (tests.test_y.YTest.test_f) ... is_fork_initialized() = 2
ok
test_g (tests.test_y.YTest.test_g) ... expected failure
test_h (tests.test_y.YTest.test_h) ...
======================================================================
FAIL: test_b (tests.test_x.XTest.test_b)
Docstring of b
----------------------------------------------------------------------
Traceback (most recent call last):
  File "x.py", line 1, in test_b
AssertionError: 1 != 2

======================================================================
ERROR: test_d (tests.test_y.YTest.test_d)
----------------------------------------------------------------------
Traceback (most recent call last):
PyverbsRDMAError: Failed to frob. Errno: 95, Operation not supported

----------------------------------------------------------------------
Ran 8 tests in 0.1s
"""


def _by_id() -> dict[str, conformance.TestResult]:
    return {r.id: r for r in conformance.parse_output(SAMPLE)}


def test_statuses_and_reasons() -> None:
    r = _by_id()
    assert r["tests.test_x.XTest.test_a"].status == "passed"
    assert r["tests.test_x.XTest.test_b"].status == "failed"
    assert r["tests.test_x.XTest.test_b"].reason == "AssertionError: 1 != 2"
    assert r["tests.test_x.XTest.test_c"].status == "skipped"
    assert r["tests.test_x.XTest.test_c"].reason == "Not supported here"
    assert r["tests.test_y.YTest.test_d"].status == "errors"
    assert "Errno: 95" in r["tests.test_y.YTest.test_d"].reason
    assert r["tests.test_mlx5_z.ZTest.test_e"].reason == "Can't run: not mlx5"
    assert r["tests.test_y.YTest.test_f"].status == "passed"  # status after printed output
    assert r["tests.test_y.YTest.test_g"].status == "passed"


def test_a_test_without_a_status_is_an_error_never_a_pass() -> None:
    h = _by_id()["tests.test_y.YTest.test_h"]
    assert h.status == "errors"
    assert "no result" in h.reason


def test_summary_separates_vendor_files_and_never_counts_skips_as_passes() -> None:
    s = conformance.summarize(conformance.parse_output(SAMPLE), "embedded", "59.0", 1.0, 8)
    assert s.total == {"passed": 3, "failed": 1, "errors": 2, "skipped": 2}
    assert s.generic == {"passed": 3, "failed": 1, "errors": 2, "skipped": 1}
    assert s.files["test_y"] == {"passed": 2, "failed": 0, "errors": 2, "skipped": 0}
    table = conformance.format_table(s, include_vendor=False)
    assert "test_mlx5_z" not in table and "test_x" in table


def test_unpack_takes_only_rdma_core_tests(tmp_path: Path) -> None:
    src = tmp_path / "src" / "pyverbs-59.0"
    (src / "rdma-core" / "tests").mkdir(parents=True)
    (src / "rdma-core" / "tests" / "run_tests.py").write_text("print('hi')\n")
    (src / "rdma-core" / "pyverbs").mkdir()
    (src / "rdma-core" / "pyverbs" / "cq.pyx").write_text("# not wanted\n")
    sdist = tmp_path / "pyverbs-59.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname="pyverbs-59.0")
    cache = tmp_path / "cache"
    cache.mkdir()
    root = conformance.unpack_suite(sdist, cache, "59.0")
    assert (root / "tests" / "run_tests.py").read_text() == "print('hi')\n"
    assert not list(root.rglob("*.pyx"))
    assert conformance.unpack_suite(sdist, cache, "59.0") == root  # reused, not re-unpacked


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SOFTVERBS_CACHE", str(tmp_path))
    assert conformance.cache_dir() == tmp_path
    assert conformance.cache_dir(str(tmp_path / "x")) == tmp_path / "x"
    monkeypatch.delenv("SOFTVERBS_CACHE")
    assert conformance.cache_dir().parts[-3:] == (".cache", "softverbs", "conformance")
