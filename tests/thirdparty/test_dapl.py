"""uDAPL's dtest (Debian dapl2-utils) as a pair on this host, on sv0.

uDAPL finds its providers in ``/etc/dat.conf``; the test writes a private one
and points ``DAT_OVERRIDE`` at it, with two entries for softverbs' sv0:

* ``ofa-v2-sv0-cma``: ``libdaplofa`` (the rdma_cm provider) on the loopback
  interface -- connections through softverbs' librdmacm;
* ``ofa-v2-sv0-scm``: ``libdaploscm`` (QP information exchanged over a TCP
  socket) on device ``sv0`` port 1 -- the verbs alone.

Each runs dtest's default sequence (SEND ping-pong, RDMA WRITE and READ with
the data checked, bidirectional RDMA WRITE) and ``-W -D``: an RDMA WRITE
ping-pong in which each side polls the last byte of the 4 KiB buffer and
then checks every byte ("len 4096, 1st error at 64" when a write lands out
of address order; tests/native/test_lastbyte.py).  The verdict is dtest's
own, "DAPL Test Complete. PASSED", on both sides.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "native"))  # test_c_tools: exec_cmd
from test_c_tools import TIMEOUT, exec_cmd

DAT_CONF = """\
ofa-v2-sv0-cma u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 "lo 0" ""
ofa-v2-sv0-scm u2.0 nonthreadsafe default libdaploscm.so.2 dapl.2.0 "sv0 1" ""
"""
PASSED = "DAPL Test Complete. PASSED"
#: dtest arguments, and what the client's output must also show
RUNS = {
    "default": (["-B", "20"], r"RDMA write \(bi-direction\): .* 40 x 4194304"),
    "W": (["-W", "-D", "-b", "4096", "-B", "2000"],
          r"RDMA write PingPong: \(2000 x 4096\)"),
}  # fmt: skip


@pytest.fixture
def dapl_env(host_service: str, tmp_path: Path) -> dict[str, str]:
    if shutil.which("dtest") is None:
        msg = "dtest is not installed (Debian dapl2-utils; scripts/apt-packages.txt)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    conf = tmp_path / "dat.conf"
    conf.write_text(DAT_CONF)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SOFTVERBS_", "DAT_"))}
    return dict(e, SOFTVERBS_SERVICE=host_service, DAT_OVERRIDE=str(conf))


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("provider", ["cma", "scm"])
def test_dtest_pair(dapl_env: dict[str, str], provider: str, run: str) -> None:
    args, expect = RUNS[run]
    argv = ["dtest", "-P", f"ofa-v2-sv0-{provider}", *args]
    server = subprocess.Popen(exec_cmd(*argv, "-s"), env=dapl_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        # dtest has no readiness signal a pipe shows at once (stdout is
        # buffered): the client tries again while nothing connected yet
        deadline = time.monotonic() + 60
        while True:
            time.sleep(1.0)
            client = subprocess.run(exec_cmd(*argv, "-h", "127.0.0.1"), env=dapl_env,
                                    capture_output=True, text=True, timeout=TIMEOUT,
                                    check=False)  # fmt: skip
            out = client.stdout + client.stderr
            if "CONNECTED" in out or time.monotonic() > deadline or server.poll() is not None:
                break
        srv = server.communicate(timeout=TIMEOUT)[0]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert client.returncode == 0 and PASSED in out, out
    assert re.search(expect, out), out
    assert server.returncode == 0 and PASSED in srv, srv
    assert "1st error" not in out + srv, out + srv
