"""A C program that polls a CQ when the service dies (csrc/verbs.c, service_gone).

Its CQ can never fill again, so a program that busy-polls it would spin for
ever.  Every 4096th empty poll peeks at the context's event socket, which reads
end of file once the service is gone: ``ibv_poll_cq`` then fails (-1, errno
EIO) and ``ibv_start_poll`` returns EIO, as a provider whose device died does,
and the program can stop.  ``deadservice.c`` polls an empty CQ while the test
kills its private softverbsd with SIGKILL.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from test_c_tools import TIMEOUT

from softverbs import native
from softverbs.config import service_command

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The library and deadservice.c, built with every warning an error."""
    try:
        libdir = native.library_dir()
    except native.BuildError as exc:
        pytest.skip(str(exc))
    prog = tmp_path_factory.mktemp("deadservice") / "deadservice"
    argv = [native.compiler() or "gcc", "-std=gnu11", "-g", "-Wall", "-Wextra", "-Werror",
            str(HERE / "deadservice.c"), "-o", str(prog),
            f"-L{libdir}", "-l:libibverbs.so.1"]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    return libdir, prog


@pytest.mark.parametrize("how", ["poll_cq", "ex"])
def test_a_poll_fails_once_the_service_is_gone(built: tuple[Path, Path], how: str) -> None:
    libdir, prog = built
    path = os.path.join(tempfile.mkdtemp(prefix="svgone", dir="/tmp"), "sv.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    service = subprocess.Popen(service_command("--socket", path), env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    client = None
    try:
        end = time.monotonic() + TIMEOUT
        while not os.path.exists(path):
            assert service.poll() is None and time.monotonic() < end, "softverbsd did not start"
            time.sleep(0.02)
        client = subprocess.Popen([str(prog), how], stdout=subprocess.PIPE, text=True,
                                  env={**env, "SOFTVERBS_SERVICE": path,
                                       "LD_LIBRARY_PATH": str(libdir)})  # fmt: skip
        assert client.stdout is not None
        ready = select.poll()
        ready.register(client.stdout, select.POLLIN)
        assert ready.poll(TIMEOUT * 1000), "the program printed nothing"
        assert client.stdout.readline() == "polling\n"
        time.sleep(0.3)
        assert client.poll() is None, "the program stopped polling before the service died"
        service.send_signal(signal.SIGKILL)
        service.wait(TIMEOUT)
        out, _ = client.communicate(timeout=TIMEOUT)
        assert client.returncode == 0, out
        want = f"failed {errno.EIO}" if how == "ex" else f"failed -1 {errno.EIO}"
        assert out.startswith(want), out
    finally:
        for p in (client, service):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
