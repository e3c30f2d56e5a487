"""``softverbs service start|status|stop``, as a user runs them.

Real commands in real processes: ``start`` daemonizes and returns once the
service answers; a second ``start`` refuses and names the running service;
``status`` shows clients and live objects; ``stop`` stops it and leaves no
socket or pidfile behind; a service that died by SIGKILL leaves files that
the next ``start`` and ``stop`` clean up.  And an application with
``SOFTVERBS_SERVICE`` set starts the service on demand.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from svkit import WAIT

CLI = [sys.executable, "-m", "softverbs"]


def sv(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "service", *args], capture_output=True, text=True,
                          timeout=WAIT, env=env, check=False)  # fmt: skip


@pytest.fixture
def sock(workdir: Path) -> Iterator[str]:
    path = str(workdir / "cli.sock")
    yield path
    # Whatever happened, no daemon outlives the test.
    pid_file = Path(path + ".pid")
    if pid_file.exists():
        text = pid_file.read_text().strip()
        if text.isdigit():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(text), signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_start_status_stop(sock: str) -> None:
    r = sv("start", "--socket", sock)
    assert r.returncode == 0, r.stderr
    assert "started" in r.stdout and sock in r.stdout
    pid = int(Path(sock + ".pid").read_text())
    assert os.path.exists(sock)

    again = sv("start", "--socket", sock)
    assert again.returncode == 1
    assert f"already running on {sock} (pid {pid})" in again.stderr

    # An application attaches: status shows it and what it holds.
    app = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from softverbs import *; c = Context(name='sv0'); pd = PD(c); "
         "cq = CQ(c, 8); mr = MR(pd, 4096, 1); print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "SOFTVERBS_SERVICE": sock},
    )  # fmt: skip
    try:
        assert app.stdout is not None
        assert app.stdout.readline().strip() == "ready"
        st = sv("status", "--socket", sock)
        assert st.returncode == 0, st.stderr
        assert f"running on {sock} (pid {pid})" in st.stdout
        assert "clients: 1" in st.stdout
        assert f"pid {app.pid}: 5 (cq 1, ctx 2, mr 1, pd 1)" in st.stdout
        js = json.loads(sv("status", "--socket", sock, "--json").stdout)
        assert js["clients"] == 1 and js["objects"] == {"ctx": 2, "cq": 1, "mr": 1, "pd": 1}
        assert js["keys"] == 1
    finally:
        app.kill()
        app.wait(WAIT)

    r = sv("stop", "--socket", sock)
    assert r.returncode == 0, r.stderr
    assert f"pid {pid}" in r.stdout
    assert _gone(pid)
    assert not os.path.exists(sock) and not os.path.exists(sock + ".pid")

    r = sv("stop", "--socket", sock)
    assert r.returncode == 1 and "not running" in r.stderr
    r = sv("status", "--socket", sock)
    assert r.returncode == 1 and "not running" in r.stderr


def test_stale_files_after_sigkill(sock: str) -> None:
    assert sv("start", "--socket", sock).returncode == 0
    pid = int(Path(sock + ".pid").read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + WAIT
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert os.path.exists(sock), "a killed service cannot clean up"
    # start takes over: the dead service's lock went with it.
    r = sv("start", "--socket", sock)
    assert r.returncode == 0, r.stderr
    pid2 = int(Path(sock + ".pid").read_text())
    assert pid2 != pid
    os.kill(pid2, signal.SIGKILL)
    while not _gone(pid2) and time.monotonic() < deadline:
        time.sleep(0.02)
    # stop on a dead service removes what it left.
    r = sv("stop", "--socket", sock)
    assert r.returncode == 1 and "stale" in r.stderr
    assert not os.path.exists(sock) and not os.path.exists(sock + ".pid")


def test_foreground_and_on_demand(sock: str) -> None:
    fg = subprocess.Popen([*CLI, "service", "start", "--foreground", "--socket", sock],
                          stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert fg.stdout is not None
        assert "serving on" in fg.stdout.readline()
        r = sv("start", "--socket", sock)
        assert r.returncode == 1 and "already running" in r.stderr
    finally:
        fg.send_signal(signal.SIGTERM)
        assert fg.wait(WAIT) == 0
    assert not os.path.exists(sock)
    # On demand: the first application to attach starts the service.
    env = {**os.environ, "SOFTVERBS_SERVICE": sock}
    app = "from softverbs import *; PD(Context(name='sv0'))"
    r = subprocess.run([sys.executable, "-c", app], env=env, timeout=WAIT, capture_output=True,
                       text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    st = sv("status", "--socket", sock)
    assert st.returncode == 0 and "clients: 0" in st.stdout, st.stdout + st.stderr
    assert sv("stop", "--socket", sock).returncode == 0


def test_a_stop_signal_stops_a_loop_that_runs_no_bytecode(tmp_path: Path) -> None:
    """A stop signal reaches the loop through the wake socket, not only through
    Python's handler: compiled, the loop may run no bytecode between two turns,
    so the handler alone could wait for ever (a busy softverbsd ignored SIGTERM).
    Here the Python handler does nothing, and one turn must still stop."""
    from softverbs.service.server import STOP_SIGNALS, Service

    service = Service(str(tmp_path / "sv.sock"))
    old = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        service.stop_on_signals()
        signal.signal(signal.SIGTERM, lambda *_: None)
        os.kill(os.getpid(), signal.SIGTERM)
        service._turn()
        assert service._stopping
    finally:
        signal.set_wakeup_fd(-1)
        for sig, handler in old.items():
            signal.signal(sig, handler)
        service._shutdown()
