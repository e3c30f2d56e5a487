"""A create verb that runs out of memory after the device made its object.

``enomem.c`` includes verbs.c with a calloc that fails once when armed, and
arms it before ibv_alloc_pd, ibv_reg_mr, ibv_alloc_mw, ibv_create_ah and
ibv_open_xrcd: each must return NULL with errno ENOMEM (call_and_alloc's
failure branch) and leave nothing on the device -- the service's count of
the process's objects is the same before and after.  Built as the library is
tested elsewhere: -Wall -Wextra -Werror, and again under AddressSanitizer
and UBSan.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from svkit import ServiceProc

from softverbs import native
from softverbs.native import CSRC, INCLUDE

HERE = Path(__file__).parent
VERBS = ["ibv_alloc_pd", "ibv_reg_mr", "ibv_alloc_mw", "ibv_create_ah", "ibv_open_xrcd"]
#: the library's sources the program links with (verbs.c it includes itself)
OTHERS = ["conn.c", "device.c", "ring.c", "unsupported_ibverbs.c"]
TIMEOUT = 60


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "asan"])
def program(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = native.compiler()
    if cc is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler: CI must build the C library")
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("enomem") / "enomem"
    flags = native.SANITIZE if request.param else []
    cmd = [cc, "-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *flags,
           f"-I{CSRC}", f"-I{INCLUDE}", str(HERE / "enomem.c"),
           *(str(CSRC / s) for s in OTHERS), "-o", str(out), "-lpthread"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture
def service() -> Iterator[ServiceProc]:
    """A private softverbsd: no other client's objects in its counts."""
    d = tempfile.mkdtemp(prefix="sve", dir="/tmp")  # a Unix socket path is short
    svc = ServiceProc(os.path.join(d, "sv.sock"))
    try:
        yield svc
    finally:
        assert svc.stop() == 0
        shutil.rmtree(d, ignore_errors=True)


def _objects(service: ServiceProc, pid: int) -> dict[str, int]:
    """The device's objects the process ``pid`` holds, by kind."""
    procs: list[dict[str, Any]] = service.stats()["processes"]
    mine = [p for p in procs if p["pid"] == pid]
    assert len(mine) == 1, procs
    return dict(mine[0]["objects"])


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def test_a_failed_create_leaves_nothing_on_the_device(program: Path,
                                                        service: ServiceProc) -> None:  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    env.update(SOFTVERBS_SERVICE=service.path, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1")  # fmt: skip
    proc = subprocess.Popen([str(program)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert proc.stdin is not None
        assert _line(proc) == "ready"
        before = _objects(service, proc.pid)
        assert before == {"ctx": 1, "pd": 1}, before
        proc.stdin.write("go\n")
        proc.stdin.flush()
        results = [_line(proc) for _ in VERBS]
        assert results == [f"ok {verb}" for verb in VERBS]
        assert _line(proc) == "failed"
        assert _objects(service, proc.pid) == before
        proc.stdin.write("go\n")
        proc.stdin.flush()
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0 and not err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
