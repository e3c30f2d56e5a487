"""Open MPI and MPICH over UCX on softverbs, as a user who is not root.

Debian's Open MPI 4.1 (openmpi-bin, ``pml ucx``) and MPICH 4.0 (mpich,
``ch4:ucx``) run ``mpi_pingpong.c`` -- compiled here with each one's
``mpicc`` -- as two ranks on this host under ``softverbs exec``, as
``nobody`` (tests/thirdparty/unprivileged.py), with no device node made by
anyone: UCX finds ``/dev/infiniband/softverbs0`` through softverbs exec's
preload library (docs/c-programs.md, UCX).  Each run ping-pongs 8 bytes and
1 MiB and checks every byte both ways (the program's own verdict).

``UCX_TLS`` is one verbs transport plus ``self`` (a rank's messages to
itself), so there is no TCP or shared memory to fall back on, and
``UCX_LOG_LEVEL=info`` prints each endpoint's lanes (``ep_cfg``): the test
requires the transport on ``sv0:1`` and nothing else but ``self``.
``UCX_UD_ETH_DGID_CHECK=n``: see tests/native/test_ucx.py.  ucx_perftest
runs as the same user too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from unprivileged import User, unprivileged

sys.path.insert(0, str(Path(__file__).parents[1] / "native"))  # test_c_tools: pair()
from test_c_tools import pair

HERE = Path(__file__).parent
ITERS = 200  #: round trips of 8 B; 1 MiB makes a tenth of them (20)

#: name: (mpicc, launcher, launcher arguments that pick UCX and only UCX)
MPIS = {
    "openmpi": ("mpicc.openmpi", "mpirun.openmpi",
                ["--mca", "pml", "ucx", "--mca", "btl", "self", "--mca", "osc", "ucx"]),
    "mpich": ("mpicc.mpich", "mpiexec.mpich", []),  # ch4:ucx is MPICH's only device here
}  # fmt: skip
TLS = {"rc_verbs": "rc_v", "ud_verbs": "ud_v"}


def _need(tool: str, package: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (Debian {package}; scripts/apt-packages.txt)")


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    with unprivileged() as u:
        yield u


def _ucx_env(user: User, tl: str) -> dict[str, str]:
    return dict(user.env, UCX_TLS=f"{TLS[tl]},self", UCX_NET_DEVICES="sv0:1",
                UCX_UD_ETH_DGID_CHECK="n", UCX_LOG_LEVEL="info")  # fmt: skip


def lanes(out: str) -> set[str]:
    """The transports/devices of every endpoint's lanes in a UCX info log."""
    found: set[str] = set()
    for line in re.findall(r"ep_cfg\[\d+\]: (.*)$", out, re.M):
        found.update(re.findall(r"([a-z_]+/[\w:.]+)", line))
    return found


@pytest.mark.parametrize("tl", list(TLS))
@pytest.mark.parametrize("mpi", list(MPIS))
def test_mpi_pingpong_over_ucx_as_nobody(user: User, mpi: str, tl: str) -> None:
    mpicc, launcher, args = MPIS[mpi]
    _need(mpicc, f"lib{mpi}-dev" if mpi == "mpich" else "libopenmpi-dev")
    _need(launcher, "openmpi-bin" if mpi == "openmpi" else "mpich")
    prog = user.home / f"pingpong_{mpi}"
    if not prog.exists():
        build = subprocess.run([mpicc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror",
                                str(HERE / "mpi_pingpong.c"), "-o", str(prog)],
                               capture_output=True, text=True, check=False)  # fmt: skip
        assert build.returncode == 0, build.stderr
    r = user.run(user.exec_cmd(launcher, "-np", "2", *args, str(prog), str(ITERS), "8",
                               str(1 << 20)), env=_ucx_env(user, tl))  # fmt: skip
    assert r.returncode == 0, r.stdout
    print(*re.findall(r"^pingpong .*$", r.stdout, re.M), sep="\n")  # the figures, with -s
    assert re.search(rf"^pingpong 8 bytes {ITERS} iterations errors 0 ", r.stdout, re.M), r.stdout
    assert re.search(rf"^pingpong {1 << 20} bytes {ITERS // 10} iterations errors 0 ",
                     r.stdout, re.M), r.stdout  # fmt: skip
    # each rank: an endpoint to itself (self) and one to its peer over sv0
    assert lanes(r.stdout) == {"self/memory0", f"{tl}/sv0:1"}, r.stdout
    assert not re.search(r"UCX\s+(ERROR|WARN)", r.stdout), r.stdout


def test_ucx_perftest_as_nobody(user: User) -> None:
    _need("ucx_perftest", "ucx-utils")
    env = dict(user.env, UCX_TLS="rc_v", UCX_NET_DEVICES="sv0:1", UCX_UD_ETH_DGID_CHECK="n")
    server, client = pair(env, "ucx_perftest", ["-t", "tag_lat", "-n", "200"], "-p",
                          launch=user.exec_cmd)  # fmt: skip
    assert re.search(r"^Final:\s+200\s", client, re.M), client
    assert "Accepted connection from 127.0.0.1" in server, server
