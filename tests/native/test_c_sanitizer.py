"""The verbs sanitizer for C programs (docs/sanitizer.md), through softverbs'
``libibverbs.so.1``: ``misuse.c`` commits misuse the device reports on the
program's stderr, with the caller's address for what was posted; Debian's
ping-pong tools, used correctly, draw no report."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from test_c_tools import PINGPONG, _need, pair

from softverbs import native, sanitizer

HEADER = "softverbs-sanitizer: "


@pytest.fixture
def env(host_service: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    return dict(e, SOFTVERBS_SERVICE=host_service, SOFTVERBS_SANITIZE="1")


@pytest.fixture(scope="module")
def misuse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``misuse.c`` built against the libraries: (the program, the library dir)."""
    try:
        libdir = native.library_dir()
    except native.BuildError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))
    prog = tmp_path_factory.mktemp("misuse") / "misuse"
    build = subprocess.run([native.compiler() or "gcc", "-std=gnu11", "-g", "-Wall", "-Wextra",
                            "-Werror", str(Path(__file__).parent / "misuse.c"), "-o", str(prog),
                            f"-L{libdir}", "-l:libibverbs.so.1"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert build.returncode == 0, build.stderr
    return prog, libdir


def run(misuse: tuple[Path, Path], env: dict[str, str], mode: str) -> tuple[list[str], str]:
    prog, libdir = misuse
    r = subprocess.run([str(prog), mode], env=dict(env, LD_LIBRARY_PATH=str(libdir)),
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert r.returncode == 0 and "done" in r.stdout, r.stdout + r.stderr
    names = [line[len(HEADER):] for line in r.stderr.splitlines() if line.startswith(HEADER)]
    return names, r.stderr


def test_a_full_queue_of_unsignaled_sends(misuse: tuple[Path, Path],
                                          env: dict[str, str]) -> None:  # fmt: skip
    names, err = run(misuse, env, "sqfull")
    # two writers: the library (ENOMEM) at once, the device after the doorbell it was sent
    assert sorted(names) == ["send-queue-full", "unsignaled-send-queue"], err
    assert f"    rule: {sanitizer.CHECKS['send-queue-full']}" in err
    # the device names the post in the program: its address, in the executable
    assert re.search(r"^      0x[0-9a-f]+ in misuse\+0x[0-9a-f]+$", err, re.M), err
    assert "4 of 4 slots held" in err


def test_destroyed_while_flushing(misuse: tuple[Path, Path], env: dict[str, str]) -> None:
    names, err = run(misuse, env, "flush")
    assert names == ["qp-destroyed-while-flushing"], err
    assert "2 flushed completion(s) of this QP were not yet polled" in err


def test_mr_deregistered_under_a_send(misuse: tuple[Path, Path],
                                         env: dict[str, str]) -> None:  # fmt: skip
    names, err = run(misuse, env, "mr")
    assert names == ["mr-in-use"], err
    assert "first: QP" in err and "wr_id 0x7" in err
    assert re.search(r"^      0x[0-9a-f]+ in misuse\+0x[0-9a-f]+$", err, re.M), err  # the post


def test_correct_c_program_has_no_report(misuse: tuple[Path, Path],
                                         env: dict[str, str]) -> None:  # fmt: skip
    names, err = run(misuse, env, "correct")
    assert names == [], err


@pytest.mark.parametrize(("tool", "args"), PINGPONG[:1] + PINGPONG[3:6],
                         ids=lambda v: v if isinstance(v, str) else " ".join(v))  # fmt: skip
def test_pingpong_tools_have_no_report(env: dict[str, str], tool: str, args: list[str]) -> None:
    _need(tool)
    server, client = pair(env, tool, args, "-p")
    assert HEADER not in server + client, server + client
