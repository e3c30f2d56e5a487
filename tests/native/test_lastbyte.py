"""Data lands in increasing address order, the last cache line last.

``lastbyte.c`` is the idiom of perftest's ``*_lat`` and uDAPL's ``dtest -W``
on the served device: it spins on the last byte of a WRITE's (READ's,
SEND's) destination and, the moment that byte changes, checks every byte
before it -- before it looks at the completion.  softverbsd places the data
from another process through ``/proc/PID/mem``; with one ``pwrite`` per
message the kernel's copy can make the last byte visible before the ones
before it (measured on a 2-core VM: 5 in 200,000 4 KiB writes; docs/c-programs.md).
The race is rare, so a run without the fix passes most of the time: the
deterministic half of the proof is ``test_scatter_stores_the_last_line_last``
(tests/engine/test_last_line.py), which checks the order of the stores
themselves on every kind of memory.

The CI run is 20,000 WRITEs of 4 KiB to 16 KiB and 2,000 READs and SENDs; the
slow-marked run is 20,000 of each from 4 KiB to 1 MiB.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_c_tools import TIMEOUT, exec_cmd

from softverbs import native

HERE = Path(__file__).parent

SMALL = ["4096", "8192", "12345", "16384"]
LARGE = ["4096", "16384", "65536", "262144", "1048576", "1000000"]


@pytest.fixture
def env(host_service: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    e["SOFTVERBS_SERVICE"] = host_service
    return e


@pytest.fixture(scope="module")
def lastbyte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        libdir = native.library_dir()
    except native.BuildError as exc:
        pytest.skip(str(exc))
    cc = native.compiler() or "gcc"
    prog = tmp_path_factory.mktemp("lastbyte") / "lastbyte"
    build = subprocess.run([cc, "-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-Werror",
                            str(HERE / "lastbyte.c"), "-o", str(prog), f"-L{libdir}",
                            "-l:libibverbs.so.1"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert build.returncode == 0, build.stderr
    return prog


def _run(env: dict[str, str], prog: Path, op: str, iters: int, sizes: list[str]) -> None:
    r = subprocess.run(exec_cmd(str(prog), op, str(iters), *sizes), env=env, text=True,
                       capture_output=True, timeout=10 * TIMEOUT, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"ok {op} iterations {iters} errors 0", r.stdout + r.stderr


@pytest.mark.parametrize(("op", "iters"), [("write", 20000), ("read", 2000), ("send", 2000)])
def test_last_byte_polling(env: dict[str, str], lastbyte: Path, op: str, iters: int) -> None:
    _run(env, lastbyte, op, iters, SMALL)


@pytest.mark.slow
@pytest.mark.parametrize("op", ["write", "read", "send"])
def test_last_byte_polling_up_to_1mib(env: dict[str, str], lastbyte: Path, op: str) -> None:
    _run(env, lastbyte, op, 20000, LARGE)


@pytest.fixture
def spinning_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private softverbsd that polls its rings for 200 us after serving a
    client (``SOFTVERBS_SPIN_US``): doorbell suppression is on (docs/rings.md)."""
    import tempfile

    from softverbs.config import service_command

    path = os.path.join(tempfile.mkdtemp(prefix="svsp", dir="/tmp"), "sv.sock")
    env = {k: v for k, v in os.environ.items() if k != "SOFTVERBS_SERVICE"}
    env["SOFTVERBS_SPIN_US"] = "200"
    proc = subprocess.Popen(service_command("--socket", path), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    end = time.monotonic() + 20
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < end, "softverbsd did not start"
        time.sleep(0.02)
    yield path
    proc.terminate()
    assert proc.wait(20) == 0


@pytest.mark.parametrize("op", ["write", "send"])
def test_last_byte_polling_with_doorbell_suppression(spinning_service: str, lastbyte: Path,
                                                     op: str) -> None:  # fmt: skip
    """The program skips the DOORBELL message whenever the service has set the
    send queue's ``polled`` word; every post must still run (a lost wakeup
    shows as a last byte that never comes), and some must have been found by
    polling alone."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    e["SOFTVERBS_SERVICE"] = spinning_service
    _run(e, lastbyte, op, 3000, SMALL)
    status = subprocess.run([sys.executable, "-m", "softverbs", "service", "status"], env=e,
                            capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    polled = re.search(r"doorbells_polled (\d+)", status.stdout)
    assert polled is not None and int(polled.group(1)) > 0, status.stdout


@pytest.mark.parametrize("doorbell", ["eventfd", "message"])
def test_last_byte_polling_with_each_doorbell(env: dict[str, str], lastbyte: Path,
                                              doorbell: str) -> None:  # fmt: skip
    """The program rings its send queue by writing the eventfd it passed with
    HELLO (``SOFTVERBS_DOORBELL=eventfd``, the default; docs/rings.md), or by
    DOORBELL messages: every post must run (a lost wake-up shows as a last
    byte that never comes), and the service counts the eventfd's rings only
    where the program used it."""
    def rung() -> int:
        status = subprocess.run([sys.executable, "-m", "softverbs", "service", "status"],
                                env=env, capture_output=True, text=True, timeout=60,
                                check=True)  # fmt: skip
        found = re.search(r"doorbells_eventfd (\d+)", status.stdout)
        return int(found.group(1)) if found else 0

    before = rung()
    _run(dict(env, SOFTVERBS_DOORBELL=doorbell), lastbyte, "send", 2000, SMALL)
    if doorbell == "eventfd":
        assert rung() - before >= 2000
    else:
        assert rung() == before
