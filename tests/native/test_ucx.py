"""UCX (Debian's ucx-utils, 1.13) on softverbs: ``ucx_info`` and ``ucx_perftest``.

UCX lists an IB device only if ``/dev/infiniband/<ibv_device.dev_name>`` is a
character device it may read and write (``uct_ib_device_is_accessible`` in
its ``ib_md.c``); nothing in UCX's configuration skips that check.  softverbs'
dev_name is ``softverbs0``, and ``softverbs exec`` preloads
``libsoftverbs_preload.so``, which shows that path to the C library's stat,
access and open calls as ``/dev/null`` -- so these tests make no node and need
no root (tests/native/test_preload.py tests the library itself;
tests/thirdparty/test_mpi.py runs UCX as a non-root user).

ud_verbs (and rc_verbs, which makes its connections over ud_verbs) run with
``UCX_UD_ETH_DGID_CHECK=n`` on the IPv4 GID, or with the check on the IPv6
GID (``UCX_IB_GID_INDEX=0``): UCX 1.13 tells an IPv4 packet from an IPv6 one
by the work completion's ``sl``, which only Mellanox hardware fills with the
packet type (rxe and softverbs give 0), so it compares the 16 bytes of an IPv4
packet's header as if they were a GID, and drops every packet.  UCX 1.19 reads
the type from the header instead (its commit 7de57ad9f9).  See
docs/c-programs.md, UCX.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from test_c_tools import TIMEOUT, _need, exec_cmd, pair


@pytest.fixture
def ucx_env(host_service: str) -> dict[str, str]:
    _need("ucx_perftest")
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SOFTVERBS_", "UCX_"))}
    e["SOFTVERBS_SERVICE"] = host_service
    e["UCX_NET_DEVICES"] = "sv0:1"
    return e


def test_ucx_info_lists_the_device(ucx_env: dict[str, str]) -> None:
    r = subprocess.run(exec_cmd("ucx_info", "-d"), env=ucx_env, capture_output=True, text=True,
                       timeout=TIMEOUT, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# Memory domain: sv0" in r.stdout, r.stdout
    for tl in ("rc_verbs", "ud_verbs"):
        assert re.search(rf"#\s+Transport: {tl}\n#\s+Device: sv0:1\n", r.stdout), r.stdout


#: (UCX_TLS, test, iterations, extra ucx_perftest arguments, extra environment)
NO_DGID_CHECK = {"UCX_UD_ETH_DGID_CHECK": "n"}
RUNS = [
    ("rc_v", "tag_lat", 200, [], NO_DGID_CHECK),
    ("rc_v", "ucp_put_bw", 200, ["-s", "65536"], NO_DGID_CHECK),
    ("rc_v", "tag_bw", 50, ["-s", "1000000"], NO_DGID_CHECK),  # rendezvous: RDMA READ
    ("rc_v", "ucp_get", 200, [], NO_DGID_CHECK),
    ("rc_v", "ucp_add", 200, [], NO_DGID_CHECK),
    ("ud_v", "tag_lat", 200, [], NO_DGID_CHECK),
    ("ud_v", "tag_bw", 50, ["-s", "100000"], NO_DGID_CHECK),
    ("ud_v", "tag_lat", 200, [], {"UCX_IB_GID_INDEX": "0"}),  # the IPv6 GID: UCX's check passes
]  # fmt: skip


@pytest.mark.parametrize(("tls", "test", "iters", "args", "extra"), RUNS,
                         ids=[" ".join([t, x, *a, *(f"{k}={v}" for k, v in e.items())])
                              for t, x, _, a, e in RUNS])  # fmt: skip
def test_ucx_perftest(ucx_env: dict[str, str], tls: str, test: str, iters: int, args: list[str],
                      extra: dict[str, str]) -> None:  # fmt: skip
    e = dict(ucx_env, UCX_TLS=tls, **extra)
    server, client = pair(e, "ucx_perftest", ["-t", test, "-n", str(iters), *args], "-p")
    # the client prints the result: 'Final:', the iterations, then seven figures
    final = re.search(rf"^Final:\s+{iters}((?:\s+[\d.]+){{7}})\s*$", client, re.M)
    assert final, client
    _, lat_avg, _, _, bw_all, _, rate_all = map(float, final[1].split())
    assert lat_avg > 0 and rate_all > 0, client
    # MB/s to two decimals (MB: 2**20 bytes): 8-byte messages at under 655 a second
    # (a host busy with other work) print 0.00
    size = int(args[args.index("-s") + 1]) if "-s" in args else 8
    assert bw_all > 0 or size * rate_all / 2**20 < 0.005, client
    assert "Accepted connection from 127.0.0.1" in server, server
    for out in (server, client):
        assert not re.search(r"UCX\s+(ERROR|WARN)|Fatal|Caught signal", out), out
