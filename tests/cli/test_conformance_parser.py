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
    assert r["tests.test_y.YTest.test_g"].status == "xfailed"  # an expected failure is no pass


def test_a_test_without_a_status_is_an_error_never_a_pass() -> None:
    h = _by_id()["tests.test_y.YTest.test_h"]
    assert h.status == "errors"
    assert "no result" in h.reason


def test_summary_separates_vendor_files_and_never_counts_skips_as_passes() -> None:
    s = conformance.summarize(conformance.parse_output(SAMPLE), "embedded", "59.0", 1.0, 8)
    assert s.total == {"passed": 2, "failed": 1, "errors": 2, "skipped": 2, "xfailed": 1}
    assert s.generic == {"passed": 2, "failed": 1, "errors": 2, "skipped": 1, "xfailed": 1}
    assert s.files["test_y"] == {"passed": 1, "failed": 0, "errors": 2, "skipped": 0, "xfailed": 1}
    assert s.problems == []
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


def test_a_failed_unpack_leaves_nothing_behind(tmp_path: Path) -> None:
    src = tmp_path / "src" / "pyverbs-59.0" / "rdma-core" / "pyverbs"
    src.mkdir(parents=True)
    (src / "cq.pyx").write_text("# no tests here\n")
    sdist = tmp_path / "pyverbs-59.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tmp_path / "src" / "pyverbs-59.0", arcname="pyverbs-59.0")
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="has no rdma-core/tests"):
        conformance.unpack_suite(sdist, cache, "59.0")
    assert list(cache.iterdir()) == []  # neither a suite nor its staging directory


def test_debian_suite_copy_unzips_into_a_fresh_root(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:  # fmt: skip
    import gzip

    source = tmp_path / "debian-tests"
    source.mkdir()
    (source / "run_tests.py").write_text("print('run')\n")
    (source / "test_cq.py.gz").write_bytes(gzip.compress(b"# cq\n"))
    monkeypatch.setattr(conformance, "debian_version", lambda package="": "59.0-1")
    root, version = conformance.unpack_debian_suite(tmp_path / "cache", source)
    assert version == "59.0-1"
    assert (root / "tests" / "test_cq.py").read_text() == "# cq\n"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [root.name]


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SOFTVERBS_CACHE", str(tmp_path))
    assert conformance.cache_dir() == tmp_path
    assert conformance.cache_dir(str(tmp_path / "x")) == tmp_path / "x"
    monkeypatch.delenv("SOFTVERBS_CACHE")
    assert conformance.cache_dir().parts[-3:] == (".cache", "softverbs", "conformance")


def test_unexpected_success_is_a_failure() -> None:
    out = "test_u (tests.test_x.XTest.test_u) ... unexpected success\n\nRan 1 test in 0.1s\n"
    (r,) = conformance.parse_output(out)
    assert r.status == "failed"


def test_a_module_that_fails_to_import_is_an_error() -> None:
    """unittest reports a module it cannot load as a _FailedTest."""
    out = """\
test_a (tests.test_x.XTest.test_a) ... ok
test_broken (unittest.loader._FailedTest.test_broken) ... ERROR

======================================================================
ERROR: test_broken (unittest.loader._FailedTest.test_broken)
----------------------------------------------------------------------
ImportError: Failed to import test module: test_broken
ModuleNotFoundError: No module named 'pyverbs.nosuch'

----------------------------------------------------------------------
Ran 2 tests in 0.1s
"""
    s = conformance.summarize(conformance.parse_output(out), "embedded", "59.0", 1.0, 2)
    assert s.files["test_broken"]["errors"] == 1 and s.total["passed"] == 1
    broken = next(r for r in s.results if r.file == "test_broken")
    assert "No module named" in broken.reason
    assert s.problems == []


def test_a_crash_while_loading_is_an_error_not_zero_tests() -> None:
    """rdma-core's tests/__init__.py imports every module first: one ImportError
    stops the whole suite before any test runs."""
    out = """\
Traceback (most recent call last):
  File "tests/run_tests.py", line 12, in <module>
ModuleNotFoundError: No module named 'pyverbs.nosuch'
"""
    s = conformance.summarize(conformance.parse_output(out), "embedded", "59.0", 1.0, -1)
    assert s.total["passed"] == 0 and s.total["errors"] == 2  # the crash, and no "Ran" line
    assert any("No module named 'pyverbs.nosuch'" in r.reason for r in s.results)
    assert s.problems and "did not finish" in s.problems[0]


def test_the_runner_checks_its_own_count() -> None:
    """unittest's "Ran N" must equal the results read; the difference is errors."""
    results = conformance.parse_output(SAMPLE)
    s = conformance.summarize(results, "embedded", "59.0", 1.0, 11)
    assert s.total["errors"] == 2 + 3
    assert "unittest ran 11 tests but the output shows 8 results" in s.problems[0]
    assert "runner: unittest ran 11" in conformance.format_table(s)


def test_vendor_opt_ins_are_cleared(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SOFTVERBS_MLX5", "sig")
    monkeypatch.setenv("SOFTVERBS_FAULTS", "drop=0.5")
    with conformance.configured("embedded", tmp_path) as (env, dev):
        assert "SOFTVERBS_MLX5" not in env and "SOFTVERBS_FAULTS" not in env
        assert dev == "sv0"
    with conformance.configured("embedded", tmp_path, vendor_opt_ins=True) as (env, dev):
        assert env["SOFTVERBS_MLX5"] == "sig" and "SOFTVERBS_FAULTS" not in env


def test_embedded_and_udp_run_on_the_processes_own_devices(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:  # fmt: skip
    """Not the host device: the suite's processes each open their own devices
    (in-process sv0, or a UDP device on lo), never the user's softverbsd; only
    ``service`` names a socket, one started for the run."""
    monkeypatch.setenv("SOFTVERBS_SERVICE", str(tmp_path / "users.sock"))
    monkeypatch.setattr(conformance, "check_port_free", lambda: None)
    for config, device in (("embedded", "sv0"), ("udp", "svlo")):
        with conformance.configured(config, tmp_path) as (env, dev):
            assert (env["SOFTVERBS_SERVICE"], dev) == ("0", device), config


def test_progress_reports_each_file_and_the_running_counts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = conformance.OutputParser()
    progress = conformance.Progress(files=3)
    for line in SAMPLE.splitlines():
        for r in parser.feed(line):
            progress.add(r)
    parser.finish()
    progress.flush()
    lines = capsys.readouterr().err.splitlines()
    files = [line.split("] ")[1].split()[0] for line in lines]
    assert files == ["test_x", "test_y", "test_mlx5_z", "test_y"]
    assert lines[0].startswith("[ 1/3] test_x") and "1P 1F 0E 1S 0X" in lines[0]
    assert "total: 1 passed, 1 failed, 0 errors, 1 skipped, 0 xfailed" in lines[0]
    quiet = conformance.Progress(files=3, quiet=True)
    quiet.add(conformance.TestResult("t", "test_x", "passed"))
    quiet.flush()
    assert capsys.readouterr().err == ""
