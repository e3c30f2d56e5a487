"""Running ``softverbs {rc,uc,ud}-pingpong`` as a user does, and checking its output.

Shared by the loopback tests (two softverbs processes) and the rxe interop
tests (softverbs against ``ibv_*_pingpong`` in a qemu guest).  The output
format is rdma-core's ``ibv_*_pingpong``::

      local address:  LID 0x0000, QPN 0x000011, PSN 0x1e91c8, GID ::ffff:127.0.0.1
      remote address: LID 0x0000, QPN 0x000011, PSN 0x56b359, GID ::ffff:127.0.0.2
    1638400 bytes in 0.12 seconds = 113.59 Mbit/sec
    200 iters in 0.12 seconds = 576.94 usec/iter

(``ibv_ud_pingpong`` writes ``PSN 0x...: GID`` in its local line.)
"""

from __future__ import annotations

import os
import re
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADDRESS = re.compile(
    r"^  (local|remote) address: +LID 0x([0-9a-f]{4}), QPN 0x([0-9a-f]{6}), "
    r"PSN 0x([0-9a-f]{6})[,:] GID (\S+)$",
    re.M,
)
NUM = r"\d+\.\d\d"


@dataclass
class Run:
    """One finished ping-pong process."""

    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}--- stderr\n{self.stderr}"

    def address(self, which: str) -> tuple[str, str, str, str]:
        """(LID, QPN, PSN, GID) of the local or remote address line."""
        for m in ADDRESS.finditer(self.stdout):
            if m.group(1) == which:
                return m.group(2), m.group(3), m.group(4), m.group(5)
        raise AssertionError(f"no {which} address line in:\n{self}")


def pingpong_cmd(kind: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "softverbs", f"{kind}-pingpong", *args]


def check_success(run: Run, size: int, iters: int) -> None:
    """Exit 0 and the C tools' four lines, in order, with the right numbers."""
    assert run.returncode == 0, str(run)
    lines = run.stdout.splitlines()
    assert len(lines) == 4, str(run)
    assert ADDRESS.match(lines[0]) and lines[0].startswith("  local address:  "), str(run)
    assert ADDRESS.match(lines[1]) and lines[1].startswith("  remote address: "), str(run)
    assert re.fullmatch(rf"{size * iters * 2} bytes in {NUM} seconds = ({NUM}|inf) Mbit/sec",
                        lines[2]), str(run)  # fmt: skip
    assert re.fullmatch(rf"{iters} iters in {NUM} seconds = {NUM} usec/iter", lines[3]), str(run)


def check_pair(server: Run, client: Run, size: int, iters: int) -> None:
    """Both succeeded, and each side's remote address is the other's local one."""
    try:
        check_success(server, size, iters)
        check_success(client, size, iters)
    except AssertionError:
        raise AssertionError(f"server: {server}\nclient: {client}") from None
    assert server.address("remote") == client.address("local"), f"{server}\n{client}"
    assert client.address("remote") == server.address("local"), f"{server}\n{client}"


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def listening(port: int, read: Callable[[str], str] | None = None) -> bool:
    """Is something listening on TCP ``port``?  (From /proc/net/tcp{,6}.)"""
    reader = read or (lambda path: Path(path).read_text())
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            text = reader(path)
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()  # sl, local address:port, remote, state (0A: LISTEN)
            listen = len(fields) > 3 and fields[3] == "0A"
            if listen and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def wait_listening(
    port: int, proc: subprocess.Popen[str], timeout: float = 20.0,
    read: Callable[[str], str] | None = None,
) -> None:  # fmt: skip
    """Wait until the server listens (the C tools' client does not retry a refused connect)."""
    deadline = time.monotonic() + timeout
    while not listening(port, read):
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the server exited early:\n{Run(proc.returncode, out, err)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing listens on TCP port {port} after {timeout:.0f} s")
        time.sleep(0.02)


def finish(proc: subprocess.Popen[str], timeout: float) -> Run:
    """Wait for ``proc``; kill it (and say so) if it outlives ``timeout``."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err = (err or "") + f"\n[test: killed after {timeout:.0f} s]"
    return Run(proc.returncode, out, err)


def read_until(proc: subprocess.Popen[str], prefix: str, timeout: float = 20.0) -> str:
    """Read ``proc``'s stdout up to a line starting with ``prefix`` (raw reads, no buffering)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    got = b""
    want = b"\n" + prefix.encode()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while want not in b"\n" + got or not got.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise AssertionError(f"no line {prefix!r} within {timeout:.0f} s; got:\n{got!r}")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"stdout closed before a line {prefix!r}; got:\n{got!r}")
            got += chunk
    return got.decode()


def kill(proc: subprocess.Popen[str], seen: str = "") -> Run:
    """Kill ``proc``; its output, ``seen`` (already read) first."""
    proc.kill()
    out, err = proc.communicate()
    return Run(proc.returncode, seen + out, err)
