"""Fixtures for the device-service tests: a private softverbsd per test.

Each test gets its own service on a socket in a fresh directory (short,
under /tmp: a Unix socket path is at most 108 bytes), and every worker
process it starts is killed at teardown, whatever happened.  After the
test, the service must still be alive -- no bad input may take it down --
must not have hit an unexpected exception (it logs and counts those), and
it is stopped with SIGTERM.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from svkit import ServiceProc, Worker


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="svt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def service(workdir: Path) -> Iterator[ServiceProc]:
    svc = ServiceProc(str(workdir / "sv.sock"))
    try:
        yield svc
        assert svc.alive(), "softverbsd died during the test"
        counts = svc.stats()["stats"]
        for bug in ("internal_errors", "engine_errors"):
            assert not counts.get(bug), f"softverbsd logged {bug}: {counts}"
    finally:
        code = svc.stop()
    assert code == 0, f"softverbsd exited with {code}"
    assert not (workdir / "sv.sock").exists(), "softverbsd left its socket behind"
    assert not (workdir / "sv.sock.pid").exists(), "softverbsd left its pidfile behind"


@pytest.fixture
def spawn(service: ServiceProc) -> Iterator[Callable[..., Worker]]:
    """``spawn(Role, *args)``: a worker process; all are killed at teardown."""
    started: list[Worker] = []

    def make(role: type, *args: Any, wait: bool = True) -> Worker:
        w = Worker(service, role, *args, wait=False)
        started.append(w)
        if wait:
            w.ready()
        return w

    yield make
    for w in started:
        w.cleanup()


@pytest.fixture
def xrcd_file(workdir: Path) -> str:
    return str(workdir / "xrc_domain")
