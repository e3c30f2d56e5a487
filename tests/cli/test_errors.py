"""The CLI never shows a traceback for a user's mistake (issue 13, item 2).

For each mistake a newcomer made: the exit status is non-zero, stderr is one
line, there is no traceback, and the line names the variable, option or file
that was wrong.  And the other side of the rule: a genuine bug still shows
its traceback.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from clikit import ROOT_PYPROJECT, assert_user_error, cli_env, softverbs_cli

import softverbs
from softverbs.cli import main as cli_main
from softverbs.errors import ConfigError, PyverbsRDMAError
from softverbs.fabric.udp import BIND_HINTS


@pytest.mark.parametrize(
    "faults, named",
    [
        ("drop=abc", "'abc' is not a number"),
        ("nonsense", "expected name=value"),
        ("kinds=bogus", "unknown packet kinds"),
        ("drop=2", "not in [0, 1]"),
    ],
)
def test_malformed_faults_variable(tmp_path: Path, faults: str, named: str) -> None:
    r = softverbs_cli(tmp_path, "demo", "-n", "2", SOFTVERBS_FAULTS=faults)
    line = assert_user_error(r, "SOFTVERBS_FAULTS", named)
    assert line.startswith("softverbs: demo: ")


def test_unwritable_pcap_variable(tmp_path: Path) -> None:
    path = str(tmp_path / "no" / "such" / "dir" / "x.pcap")
    r = softverbs_cli(tmp_path, "demo", "-n", "2", SOFTVERBS_PCAP=path)
    assert_user_error(r, "SOFTVERBS_PCAP", path, "No such file or directory")


def test_non_integer_option_is_named_with_a_proper_message(tmp_path: Path) -> None:
    r = softverbs_cli(tmp_path, "demo", "-n", "abc")
    line = assert_user_error(r, "-n/--iters", "'abc'", "positive integer", rc=2)
    assert "_positive" not in line
    assert_user_error(softverbs_cli(tmp_path, "demo", "-s", "0"), "-s/--size", rc=2)


def test_unknown_option_is_one_line(tmp_path: Path) -> None:
    assert_user_error(softverbs_cli(tmp_path, "link", "show", "--bogus"), "--bogus", rc=2)
    assert_user_error(softverbs_cli(tmp_path, "nosuchcommand"), "nosuchcommand", rc=2)


def test_unknown_device(tmp_path: Path) -> None:
    assert_user_error(softverbs_cli(tmp_path, "demo", "-d", "nodev"), "nodev", "sv0")


def test_version() -> None:
    pyproject = tomllib.loads(ROOT_PYPROJECT.read_text())
    assert softverbs.__version__ == pyproject["project"]["version"]
    for flag in ("--version", "-V"):
        r = subprocess.run(
            [sys.executable, "-m", "softverbs", flag],
            capture_output=True,
            text=True,
            check=False,
            env=cli_env(Path("/nonexistent")),
        )
        assert r.returncode == 0 and r.stdout.startswith(f"softverbs {softverbs.__version__}, "), r


def test_broken_pipe_is_quiet(tmp_path: Path) -> None:
    """``softverbs ... | head`` with head gone: no BrokenPipeError, exit 141 as if by SIGPIPE."""
    for args in (["link", "show"], ["--help"], ["devinfo", "-v"], ["stat"]):
        rd, wr = os.pipe()
        os.close(rd)  # the reader is gone before the first write
        try:
            r = subprocess.run(
                [sys.executable, "-m", "softverbs", *args],
                stdout=wr,
                stderr=subprocess.PIPE,
                text=True,
                env=cli_env(tmp_path),
                timeout=60,
                check=False,
            )
        finally:
            os.close(wr)
        assert r.stderr == "", (args, r.stderr)
        # argparse itself swallows the error of printing --help: it exits 0
        expected = 0 if args == ["--help"] else cli_main.EXIT_BROKEN_PIPE
        assert r.returncode == expected, (args, r.returncode)


def test_broken_pipe_under_head(tmp_path: Path) -> None:
    """The shell pipeline from the issue, with a command that prints enough to fill a pipe."""
    env = cli_env(tmp_path)
    r = subprocess.run(
        f"{sys.executable} -m softverbs devinfo -v | head -2",
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert len(r.stdout.splitlines()) == 2


def test_service_socket_in_a_missing_directory(tmp_path: Path) -> None:
    """SOFTVERBS_SERVICE=/nonexistent/x.sock: no directory made, no daemon left behind."""
    missing = tmp_path / "nonexistent"
    sock = str(missing / "x.sock")
    r = softverbs_cli(tmp_path, "demo", "-n", "2", SOFTVERBS_SERVICE=sock)
    assert_user_error(r, "SOFTVERBS_SERVICE", str(missing), "does not exist")
    r = softverbs_cli(tmp_path, "service", "start", SOFTVERBS_SERVICE=sock)
    assert_user_error(r, "SOFTVERBS_SERVICE", "does not exist")
    r = softverbs_cli(tmp_path, "service", "start", "--socket", sock)
    assert_user_error(r, "--socket", "does not exist")
    assert not missing.exists()
    ps = subprocess.run(["pgrep", "-f", sock], capture_output=True, text=True, check=False)
    assert ps.stdout == "", f"a service was started for {sock}: {ps.stdout}"


def test_user_errors_are_one_line_and_bugs_keep_their_traceback() -> None:
    assert cli_main.user_message(ConfigError("SOFTVERBS_X: bad\nvalue")) == "SOFTVERBS_X: bad value"
    assert cli_main.user_message(PyverbsRDMAError("no device", errno.ENODEV)) is not None
    named = FileNotFoundError(errno.ENOENT, "No such file or directory", "/tmp/out.json")
    assert cli_main.user_message(named, ["--json", "/tmp/out.json"]) == (
        "/tmp/out.json: No such file or directory"
    )
    # a file the user never named, a plain ValueError, a KeyError: bugs, shown in full
    assert cli_main.user_message(named, ["--json", "/tmp/other.json"]) is None
    assert cli_main.user_message(ValueError("internal")) is None
    assert cli_main.user_message(KeyError("x")) is None


def test_a_bug_still_shows_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from softverbs.cli import link

    def broken(args: object) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(link, "run", broken)
    monkeypatch.setenv("SOFTVERBS_CONFIG", str(tmp_path / "links.json"))
    with pytest.raises(KeyError):
        cli_main.main(["link", "show"])


def test_bind_hints_are_specific_to_the_errno() -> None:
    assert "another process" in BIND_HINTS[errno.EADDRINUSE]
    assert "another process" not in BIND_HINTS[errno.EADDRNOTAVAIL]
    assert "rxe" not in BIND_HINTS[errno.EADDRNOTAVAIL]
    assert "no such address" in BIND_HINTS[errno.EADDRNOTAVAIL]


def test_a_device_whose_address_is_gone_says_so(tmp_path: Path) -> None:
    """errno 99 at open: the hint is about the address, not about another process."""
    (tmp_path / "links.json").write_text('{"links": [{"name": "gone", "addrs": ["192.0.2.7"]}]}')
    r = softverbs_cli(tmp_path, "demo", "-n", "2", "-d", "gone")
    line = assert_user_error(r, "gone", "192.0.2.7", "no such address")
    assert "another process" not in line


def test_malformed_link_table_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "links.json").write_text('{"links": [{"netdev": "lo"}]}')
    assert_user_error(softverbs_cli(tmp_path, "link", "show"), str(tmp_path / "links.json"))
    (tmp_path / "links.json").write_text("{not json")
    assert_user_error(softverbs_cli(tmp_path, "demo"), str(tmp_path / "links.json"))


def test_unwritable_link_table_names_the_file(tmp_path: Path) -> None:
    table = tmp_path / "file" / "links.json"
    (tmp_path / "file").write_text("a file, not a directory")
    r = softverbs_cli(
        tmp_path, "link", "add", "x", "--addr", "127.0.0.1", SOFTVERBS_CONFIG=str(table)
    )
    assert_user_error(r, str(table))
