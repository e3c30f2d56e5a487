"""Server/client pairs of unmodified third-party programs on softverbs.

Each program is Debian's (scripts/apt-packages.txt), started through
``softverbs exec`` on the session's private softverbsd (``host_service``,
tests/conftest.py), as a pair on one host: the server first, the client once
the server is ready.  Tests judge the programs' own verdicts (and data where
the program offers a check), not only exit codes.

A missing program skips its test with the package to install; under CI
(``$CI`` set) it fails instead, since CI installs the packages.  Tests too slow
for every run are marked ``slow`` (tests/conftest.py skips them unless selected).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

#: Bound for any one program; they finish in seconds when they work.
TIMEOUT = 120.0


def need(program: str, package: str) -> str:
    """The path of ``program``, or skip (fail under CI) naming its package."""
    path = shutil.which(program) or next(
        (p for p in (f"/usr/sbin/{program}", f"/sbin/{program}") if os.access(p, os.X_OK)), None
    )
    if path is None:
        msg = f"{program} is not installed (Debian package {package}; scripts/apt-packages.txt)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def sv_env(host_service: str, **extra: str) -> dict[str, str]:
    """The environment of a program on the private softverbsd."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    env["SOFTVERBS_SERVICE"] = host_service
    env.update(extra)
    return env


def on_softverbs(*argv: str) -> list[str]:
    return [sys.executable, "-m", "softverbs", "exec", "--", *argv]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Run:
    code: int | None
    out: str

    def __str__(self) -> str:
        return f"exit {self.code}\n{self.out}"


def tcp_listening(port: int) -> bool:
    """Does anything listen on TCP ``port`` (/proc/net/tcp{,6}, state 0A)?"""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(path).read().splitlines()[1:]  # noqa: SIM115
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 3 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


class Server:
    """A background program; ``stop`` ends it and returns what it printed."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by stop)
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def wait_for(self, ready: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited before {what}:\n{self.stop()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {timeout:.0f} s:\n{self.stop()}")
            time.sleep(0.05)

    def finish(self, timeout: float = TIMEOUT) -> Run:
        """Wait for the server to end by itself (killed, and said so, after ``timeout``)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.stop(f"[test: killed after {timeout:.0f} s]")
        return self.stop()

    def stop(self, note: str = "", kill: bool = False) -> Run:
        """End the server (if it still runs; ``kill``: with SIGKILL at once, for
        a server that ignores SIGTERM) and its log; what it printed."""
        if self.log.closed:
            return Run(self.proc.returncode, note)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9 if kill else 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        out = self.output() + (f"\n{note}" if note else "")
        self.log.close()
        return Run(self.proc.returncode, out)


def run(argv: list[str], env: dict[str, str], timeout: float = TIMEOUT) -> Run:
    """Run a client to its end (killed, and said so, after ``timeout``)."""
    try:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return Run(None, out + f"\n[test: killed after {timeout:.0f} s: a hang]")
    return Run(r.returncode, r.stdout + r.stderr)


def run_when_listening(argv: list[str], env: dict[str, str], server: Server,
                       refused: Callable[[Run], bool], tries: int = 60) -> Run:  # fmt: skip
    """Run a client of an RDMA CM server, again while the server is not yet
    listening (``refused`` says so from the client's output: the CM rejects a
    request no listener takes).  An RDMA CM port is no TCP port, and the
    servers print their readiness only into a buffered pipe, so nothing else
    tells when they listen."""
    for _ in range(tries):
        r = run(argv, env)
        if not refused(r) or server.proc.poll() is not None:
            return r
        time.sleep(0.25)
    return r
