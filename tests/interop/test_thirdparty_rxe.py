"""Third-party RDMA programs between softverbs and Linux rxe, in both directions (on demand).

Debian's qperf, libfabric's ``fi_pingpong`` and rdmacm-utils' ``mckey`` run as a pair:
one side on softverbs (``softverbs exec`` in the ``rocepeer`` namespace, device
``svpeer`` on ``br-peer``), the other on rxe0 in the qemu guest. The guest image has
rdma-core but neither qperf nor libfabric, so this host's binaries (Debian bookworm,
like the guest) are put on the guest's 9p share with the libraries the guest lacks,
and run from there. Each entry checks the program's own verdict: qperf's figure for
every test, fi_pingpong's per-size rows with ``-c`` (it checks every byte), mckey's
"data transfers complete" on the receiving side.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pingpong_kit import ROOT, finish, wait_listening
from rxe_kit import GUEST_IP, HOST_IP, NS, OUT, RUN_TIMEOUT, Peer

pytestmark = pytest.mark.interop

SHARE = "tp"  #: where, under the guest's /share, the host's binaries go
#: libraries the guest image has (its rdma-core and glibc), never shipped over
GUEST_HAS = re.compile(r"^(libc|libm|libdl|libpthread|librt|libgcc_s|ld-linux|libibverbs|"
                       r"librdmacm|libnl-3|libnl-route-3|libefa|libmlx\d|libibumad)\b")  # fmt: skip
QPERF_TESTS = ("rc_bw", "rc_lat", "rc_bi_bw", "rc_rdma_write_bw", "rc_rdma_write_lat",
               "rc_rdma_read_bw", "rc_rdma_read_lat", "rc_compare_swap_mr", "rc_fetch_add_mr",
               "ver_rc_compare_swap", "ver_rc_fetch_add")  # fmt: skip
FIGURE = re.compile(r"^\s+(bw|latency|msg_rate)\s+=\s+([\d.]+) (\S+)$", re.M)


def _ship(program: str) -> str:
    """Put ``program`` and the libraries the guest lacks on its share: its guest path."""
    path = shutil.which(program)
    if path is None:
        pytest.skip(f"{program} is not installed here (scripts/apt-packages.txt)")
    dest = OUT / "share" / SHARE
    (dest / "lib").mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, dest / program)
    ldd = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    for name, lib in re.findall(r"^\s*(\S+) => (/\S+)", ldd, re.M):
        if not GUEST_HAS.match(name):
            shutil.copy2(lib, dest / "lib" / name)
    return f"LD_LIBRARY_PATH=/share/{SHARE}/lib /share/{SHARE}/{program}"


def _ours(env: dict[str, str], *argv: str) -> subprocess.Popen[str]:
    cmd = ["ip", "netns", "exec", NS, sys.executable, "-m", "softverbs", "exec", "--", *argv]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip


def _c_env(peer: Peer, tmp: Path) -> dict[str, str]:
    """A private host device, started in the namespace by the first program.

    The namespace looks like the guest: one RDMA device, on the veth bridge,
    and no in-process ``sv0`` (whose identity addresses are 127.0.0.N).  So
    libfabric's verbs provider finds the one device for a dgram endpoint, and
    its msg server's bind to 'localhost' binds no device, as in the kernel
    (docs/cm.md), and listens on the device's address."""
    return {**peer.env, "SOFTVERBS_SERVICE": str(tmp / "sv.sock"),
            "SOFTVERBS_INPROC_DEVICES": ""}  # fmt: skip


def _stop_service(env: dict[str, str]) -> None:
    subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-m", "softverbs", "service",
                    "stop"], env=env, capture_output=True, timeout=60, check=False)  # fmt: skip


def _guest_background(peer: Peer, command: str, out: str) -> None:
    peer.guest(f"({command} > {out} 2>&1; echo PP_EXIT $? >> {out}) &")


def _guest_result(peer: Peer, out: str, timeout: float = RUN_TIMEOUT) -> tuple[int, str]:
    end = time.monotonic() + timeout
    while True:
        _, text = peer.guest(f"cat {out}")
        m = re.search(r"^PP_EXIT (\d+)$", text, re.M)
        if m:
            return int(m.group(1)), text[: m.start()]
        if time.monotonic() > end:
            return 124, text + "\n[test: the guest side did not finish]"
        time.sleep(1)


def _guest_listening(peer: Peer, port: int) -> None:
    probe = f"netstat -ltn | grep -q ':{port} '"
    rc, out = peer.guest(f"for i in $(seq 300); do {probe} && break; sleep 0.1; done; {probe}")
    assert rc == 0, f"nothing listens on TCP port {port} in the guest: {out}"


def _qperf_figures(out: str) -> list[str]:
    """The tests qperf printed a figure for, in order; fails on any error line."""
    tests, current = [], None
    for line in out.splitlines():
        if line.rstrip(":") in QPERF_TESTS and line.endswith(":"):
            current = line[:-1]
        elif FIGURE.match(line) and current is not None:
            tests.append(current)
            current = None
    return tests


#: qperf's own race (docs/interop.md): its server sends the client the RDMA CM port
#: before it calls rdma_listen, so a quick client's REQ finds no listener and the
#: server's CM rejects it (REJ reason 8, invalid service ID), on rxe as on softverbs.
QPERF_RACE = "unexpected event from RDMA CM: Event rejected"
QPERF_TRIES = 3  #: runs of the client; each retry runs only the tests not yet measured


@pytest.mark.parametrize("direction", ["softverbs-client", "rxe-client"])
def test_qperf_rc_tests_against_rxe(clean: Peer, direction: str, tmp_path: Path) -> None:
    qperf = _ship("qperf")
    env = _c_env(clean, tmp_path)
    clean.guest("killall -q qperf; true")
    done: list[str] = []
    log = ""
    try:
        if direction == "softverbs-client":
            _guest_background(clean, qperf, "/tmp/qperf.out")
            _guest_listening(clean, 19765)
        else:
            server = _ours(env, "qperf")
            wait_listening(19765, server, read=clean.ns_read)
        for _ in range(QPERF_TRIES):
            todo = [t for t in QPERF_TESTS if t not in done]
            if direction == "softverbs-client":
                ours = finish(_ours(env, "qperf", "-cm1", "-t", "1", GUEST_IP, *todo),
                              RUN_TIMEOUT)  # fmt: skip
                rc, out = ours.returncode, ours.stdout
            else:
                rc, out = clean.guest(f"{qperf} -cm1 -t 1 {HOST_IP} {' '.join(todo)}",
                                      timeout=RUN_TIMEOUT)  # fmt: skip
            log += out
            done += _qperf_figures(out)
            if rc == 0 or QPERF_RACE not in out:
                break
        if direction == "rxe-client":
            server.kill()
    finally:
        clean.guest("killall -q qperf; true")
        _stop_service(env)
    assert rc == 0, log
    assert done == list(QPERF_TESTS), log


@pytest.mark.parametrize("ep", ["msg", "dgram"])
@pytest.mark.parametrize("direction", ["softverbs-client", "rxe-client"])
def test_fi_pingpong_against_rxe(clean: Peer, direction: str, ep: str, tmp_path: Path) -> None:
    fi = _ship("fi_pingpong")
    env = _c_env(clean, tmp_path)
    args = f"-p verbs -e {ep} -I 20 -c -S 1024"
    port = 47592
    try:
        if direction == "softverbs-client":
            _guest_background(clean, f"{fi} {args} -B {port}", "/tmp/fi.out")
            _guest_listening(clean, port)
            ours = finish(_ours(env, "fi_pingpong", *args.split(), "-P", str(port), GUEST_IP),
                          RUN_TIMEOUT)  # fmt: skip
            rc, theirs = _guest_result(clean, "/tmp/fi.out")
            client, client_rc = ours.stdout, ours.returncode
        else:
            server = _ours(env, "fi_pingpong", *args.split(), "-B", str(port))
            wait_listening(port, server, read=clean.ns_read)
            client_rc, client = clean.guest(f"{fi} {args} -P {port} {HOST_IP}",
                                            timeout=RUN_TIMEOUT)  # fmt: skip
            # a client that failed leaves our server waiting for it: not 180 s more
            done = finish(server, RUN_TIMEOUT if client_rc == 0 else 10)
            rc, theirs = done.returncode, done.stdout
    finally:
        clean.guest("killall -q fi_pingpong; true")
        _stop_service(env)
    assert client_rc == 0 and rc == 0, f"client:\n{client}\nserver:\n{theirs}"
    row = re.search(r"^1k\s+20\s+=20\s", client, re.M)
    assert row, f"no 1k row with 20 sent and 20 acked:\n{client}"


@pytest.mark.parametrize("direction", ["softverbs-sender", "rxe-sender"])
def test_mckey_against_rxe(clean: Peer, direction: str, tmp_path: Path) -> None:
    """UD multicast: the receiver joins 239.77.0.9 first, then the sender joins and
    sends 10 messages; the receiver must report them all."""
    env = _c_env(clean, tmp_path)
    group, count = "239.77.0.9", "10"
    try:
        if direction == "softverbs-sender":
            _guest_background(clean, f"mckey -m {group} -b {GUEST_IP} -C {count}",
                              "/tmp/mckey.out")  # fmt: skip
            time.sleep(3)  # its join is local: nothing to poll for but its output
            ours = finish(_ours(env, "mckey", "-m", group, "-b", HOST_IP, "-s", "-C", count),
                          RUN_TIMEOUT)  # fmt: skip
            assert ours.returncode == 0, ours.stdout
            rc, receiver = _guest_result(clean, "/tmp/mckey.out")
        else:
            server = _ours(env, "mckey", "-m", group, "-b", HOST_IP, "-C", count)
            time.sleep(3)
            rc_s, sender = clean.guest(f"mckey -m {group} -b {GUEST_IP} -s -C {count}",
                                       timeout=RUN_TIMEOUT)  # fmt: skip
            assert rc_s == 0, sender
            done = finish(server, RUN_TIMEOUT)
            rc, receiver = done.returncode, done.stdout
    finally:
        clean.guest("killall -q mckey; true")
        _stop_service(env)
    assert rc == 0 and "data transfers complete" in receiver, receiver
