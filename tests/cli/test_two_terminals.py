"""Two terminals, default arguments: the ping-pong tools meet on the host device.

What a newcomer types, as with rxe once the device exists::

    terminal 1$ softverbs rc-pingpong
    terminal 2$ softverbs rc-pingpong 127.0.0.1

No ``link add``, no ``-g``, no ``SOFTVERBS_SERVICE``: the first process starts
softverbsd on the default socket (here in a private ``XDG_RUNTIME_DIR``), the
second finds it, both open ``sv0`` and pick its RoCEv2 GID.  Every tool runs
with its defaults (only the TCP port is moved off 18515 if something else
holds it), for rc, uc, ud, srq and xsrq; both sides must end with status 0
and their closing lines, and the service must hold nothing afterwards.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from clikit import cli_env, softverbs_cli
from pingpong_kit import free_tcp_port, wait_listening

DEFAULT_PORT = 18515
#: tool -> the line both sides print last
TOOLS = {
    "rc-pingpong": "usec/iter",
    "uc-pingpong": "usec/iter",
    "ud-pingpong": "usec/iter",
    "srq-pingpong": "usec/iter",
    "xsrq-pingpong": "success",
}


def _port_args() -> list[str]:
    """[] if the default port is free; else ``-p`` with a free one."""
    with socket.socket() as s:
        try:
            s.bind(("", DEFAULT_PORT))
            return []
        except OSError:
            pass
    return ["-p", str(free_tcp_port())]


@pytest.mark.parametrize("tool", list(TOOLS))
def test_two_terminals_with_default_arguments(tool: str, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    env = cli_env(tmp_path, SOFTVERBS_IDLE_EXIT="30")
    extra = _port_args()
    port = int(extra[1]) if extra else DEFAULT_PORT
    if tool == "xsrq-pingpong":
        extra += ["--xrcd-file", str(tmp_path / "xrc_domain")]
    cmd = [sys.executable, "-m", "softverbs", tool, *extra]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_listening(port, server, 60)
        client = subprocess.run([*cmd, "127.0.0.1"], env=env, capture_output=True, text=True,
                                timeout=120, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
        out, err = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert client.returncode == 0, (client.stdout, client.stderr)
    assert server.returncode == 0, (out, err)
    last = TOOLS[tool]
    for text in (client.stdout, out):
        assert text.rstrip().splitlines()[-1].endswith(last), text
        assert "GID ::ffff:127.0.0.1" in text, text  # the RoCEv2 GID, picked without -g
    status = softverbs_cli(tmp_path, "service", "status", "-j")
    assert status.returncode == 0, status.stderr
    assert not json.loads(status.stdout)["processes"], status.stdout  # nothing left behind
    stop = softverbs_cli(tmp_path, "service", "stop")
    assert stop.returncode == 0, stop.stderr
