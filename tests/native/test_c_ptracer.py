"""The C library names the service its process's ptracer (csrc/conn.c, name_ptracer).

Under Yama's ``ptrace_scope`` 1 (Ubuntu's default) the service may use
``process_vm_readv``/``process_vm_writev`` on a client only if the client named
it with ``prctl(PR_SET_PTRACER, service_pid)`` (docs/architecture.md, *Copies
that bypass the descriptor*).  ``ptracer.c`` reaches the host device, forks, and
reaches it from the child; ``prctl_shim.c``, preloaded, records each
``PR_SET_PTRACER`` call and passes it to the kernel, or fails it with the errno
the test asks for.  Each process names the service once, by its pid; no error
stops a verb (without Yama, as on the machine these tests were written on, the
kernel answers EINVAL); ``SOFTVERBS_NO_PTRACER=1`` leaves the ptracer alone.
Whether the named service may then ptrace the client needs a kernel with Yama at
scope 1: no test here can show it (docs/status.md).
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest
from test_c_tools import TIMEOUT

from softverbs import native
from softverbs.service.server import read_pid
from softverbs.verbs.served import PR_SET_PTRACER

HERE = Path(__file__).parent
#: ptracer.c's checks: two in each process, one that the child's worked
CHECKS = 5


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The library, ptracer.c and the shim, built with every warning an error."""
    try:
        libdir = native.library_dir()
    except native.BuildError as exc:
        pytest.skip(str(exc))
    cc = native.compiler() or "gcc"
    out = tmp_path_factory.mktemp("ptracer")
    prog, shim = out / "ptracer", out / "prctl_shim.so"
    program = [str(HERE / "ptracer.c"), "-o", str(prog), f"-L{libdir}", "-l:libibverbs.so.1"]
    preload = ["-shared", "-fPIC", str(HERE / "prctl_shim.c"), "-o", str(shim), "-ldl"]
    for argv in (program, preload):
        r = subprocess.run([cc, "-std=gnu11", "-g", "-Wall", "-Wextra", "-Werror", *argv],
                           capture_output=True, text=True, check=False)  # fmt: skip
        assert r.returncode == 0, r.stderr
    return libdir, prog, shim


def _run(built: tuple[Path, Path, Path], host_service: str, tmp_path: Path,
         **env: str) -> list[tuple[int, int, int, int]]:  # fmt: skip
    """Run ptracer.c with the shim; the PR_SET_PTRACER calls, as (pid, pid named,
    result, errno)."""
    libdir, prog, shim = built
    log = tmp_path / "prctl.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    r = subprocess.run([str(prog)], env={**base, "SOFTVERBS_SERVICE": host_service,
                                         "LD_LIBRARY_PATH": str(libdir), "LD_PRELOAD": str(shim),
                                         "SV_PRCTL_LOG": str(log), **env},
                       capture_output=True, text=True, timeout=TIMEOUT, check=False)  # fmt: skip
    assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("ok ") == CHECKS, r.stdout
    assert not r.stderr, r.stderr
    if not log.exists():
        return []
    return [(a, b, c, d) for a, b, c, d in
            (map(int, line.split()) for line in log.read_text().splitlines())]  # fmt: skip


def test_each_process_names_the_service(built: tuple[Path, Path, Path], host_service: str,
                                        tmp_path: Path) -> None:  # fmt: skip
    """The parent and the forked child (each with a connection of its own) name
    the service by the pid in its pidfile; the kernel's answer is whatever this
    machine's is (EINVAL without Yama), and the verbs work either way."""
    service = read_pid(host_service + ".pid")
    assert service
    calls = _run(built, host_service, tmp_path)
    assert len(calls) == 2, calls
    assert len({pid for pid, *_ in calls}) == 2, calls  # the parent, then the child
    assert all(named == service for _, named, _, _ in calls), (calls, service)
    if not os.path.exists("/proc/sys/kernel/yama"):
        assert all((rc, err) == (-1, errno.EINVAL) for *_, rc, err in calls), calls


@pytest.mark.parametrize("err", [errno.EINVAL, errno.EPERM, errno.ENOMEM, errno.ESRCH])
def test_a_refused_prctl_is_ignored(built: tuple[Path, Path, Path], host_service: str,
                                    tmp_path: Path, err: int) -> None:  # fmt: skip
    calls = _run(built, host_service, tmp_path, SV_PRCTL_FAIL=str(err))
    assert [(rc, e) for *_, rc, e in calls] == [(-1, err)] * 2, calls


@pytest.mark.parametrize("value", ["1", "yes"])
def test_softverbs_no_ptracer_leaves_it_alone(built: tuple[Path, Path, Path], host_service: str,
                                              tmp_path: Path, value: str) -> None:  # fmt: skip
    assert _run(built, host_service, tmp_path, SOFTVERBS_NO_PTRACER=value) == []


def test_softverbs_no_ptracer_0_is_unset(built: tuple[Path, Path, Path], host_service: str,
                                         tmp_path: Path) -> None:  # fmt: skip
    assert len(_run(built, host_service, tmp_path, SOFTVERBS_NO_PTRACER="0")) == 2


def test_the_option_is_yamas() -> None:
    """The value both clients pass (``<linux/prctl.h>``: ``PR_SET_PTRACER``, "Ya" "ma")."""
    assert int.from_bytes(b"Yama", "big") == PR_SET_PTRACER
