"""``softverbs xsrq-pingpong``, client <-> server, as separate processes.

* through the device service: a server and two client processes on one
  host, sharing its sv0 and one XRC domain (a message can reach a client's
  SRQ through the other client's receive QP);
* over UDP devices: two hosts, each a device service on its own UDP
  (RoCEv2) device on loopback, a server on one and two clients on the other;
* in one process on the embedded sv0 (``--loopback``);
* and failing the way the C tool fails: no GID on RoCE, ODP.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from pingpong_kit import free_tcp_port, wait_listening
from svkit import WAIT, ServiceProc

CMD = [sys.executable, "-m", "softverbs", "xsrq-pingpong"]
LINE = re.compile(
    r"^ *(local|remote): LID [0-9a-f]{4}, QPN RECV (8[0-9a-f]{5}) "
    r"SEND ([0-9a-f]{6}), PSN [0-9a-f]{6}, SRQN ([0-9a-f]{6}), GID (\S+)$"
)


def _run(server_args: list[str], clients: list[list[str]], env: dict[str, str]
         ) -> tuple[str, list[str]]:  # fmt: skip
    """Start the server, then the clients; every one must print success."""
    return _run_split(server_args, env, clients, env)


def _run_split(server_args: list[str], server_env: dict[str, str], clients: list[list[str]],
               client_env: dict[str, str]) -> tuple[str, list[str]]:  # fmt: skip
    """The clients start once the server listens: like the C tool, a client does
    not retry a refused connect, and its server waits for all ``-c`` of them."""
    srv = subprocess.Popen([*CMD, *server_args], env=server_env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)  # fmt: skip
    procs: list[subprocess.Popen[str]] = []
    try:
        wait_listening(int(server_args[server_args.index("-p") + 1]), srv, WAIT)
        for args in clients:
            procs.append(subprocess.Popen([*CMD, *args], env=client_env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))  # fmt: skip
        outs = [p.communicate(timeout=WAIT)[0] for p in procs]
        srv_out = srv.communicate(timeout=WAIT)[0]
    finally:
        for p in [srv, *procs]:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert srv.returncode == 0, srv_out
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
    return srv_out, outs


def _check(out: str, pairs: int) -> list[re.Match[str]]:
    lines = out.strip().splitlines()
    assert lines[-1] == "success", out
    found = [m for m in (LINE.match(x) for x in lines) if m]
    assert len(found) == 2 * pairs, out
    return found


def test_through_the_service(service: ServiceProc, workdir: Path) -> None:
    env = {**os.environ, "SOFTVERBS_SERVICE": service.path}
    port = str(free_tcp_port())
    xrcd = str(workdir / "xrc_domain")
    common = ["-g", "1", "-p", port, "--xrcd-file", xrcd, "-n", "20", "-s", "2000"]
    srv, clients = _run([*common, "-c", "2"],
                        [[*common, "127.0.0.1"], [*common, "-e", "127.0.0.1"]], env)  # fmt: skip
    server_lines = _check(srv, 2)
    for out in clients:
        _check(out, 1)
    # One SRQ on the server: both of its local lines name it.
    local_srqns = {m.group(4) for m in server_lines if m.group(1) == "local"}
    assert len(local_srqns) == 1
    service.wait_stats(lambda s: s["clients"] == 0, "the ping-pong processes gone")
    st = service.stats()
    assert st["objects"] == {} and st["engine_qps"] == 0 and st["xrc_srqs"] == 0, st


def test_over_udp_devices(workdir: Path) -> None:
    """Two 'hosts': a device service each, on UDP devices on loopback."""
    base = f"127.{100 + os.getpid() % 100}.{(os.getpid() // 100) % 250 + 1}"
    env = {**os.environ, "SOFTVERBS_CONFIG": str(workdir / "links.json")}
    env["SOFTVERBS_SERVICE"] = "0"
    link = [sys.executable, "-m", "softverbs", "link", "add"]
    for name, addr in (("xa", f"{base}.1"), ("xb", f"{base}.2")):
        subprocess.run([*link, name, "--addr", addr], env=env, check=True, timeout=WAIT)
    socks = {h: str(workdir / f"{h}.sock") for h in ("a", "b")}
    for s in socks.values():
        r = subprocess.run([sys.executable, "-m", "softverbs", "service", "start", "--socket", s],
                           env=env, capture_output=True, text=True, timeout=WAIT)  # fmt: skip
        assert r.returncode == 0, r.stderr
    try:
        port = str(free_tcp_port())
        common = ["-g", "0", "-p", port, "-n", "10"]
        env_a = {**env, "SOFTVERBS_SERVICE": socks["a"]}
        env_b = {**env, "SOFTVERBS_SERVICE": socks["b"]}
        client = [*common, "-d", "xb", "--xrcd-file", str(workdir / "xrcd_b"), "127.0.0.1"]
        srv_out, outs = _run_split(
            [*common, "-d", "xa", "-c", "2", "--xrcd-file", str(workdir / "xrcd_a")], env_a,
            [client, client], env_b)
        found = _check(srv_out, 2)
        assert any(m.group(5) == f"::ffff:{base}.2" for m in found), srv_out
        for out in outs:
            _check(out, 1)
    finally:
        for s in socks.values():
            subprocess.run([sys.executable, "-m", "softverbs", "service", "stop", "--socket", s],
                           env=env, capture_output=True, timeout=WAIT, check=False)  # fmt: skip


def test_loopback_in_one_process(workdir: Path) -> None:
    env = {**os.environ, "SOFTVERBS_SERVICE": "0"}
    r = subprocess.run([*CMD, "--loopback", "-c", "3", "-g", "1", "-p", "0", "-n", "8",
                        "--xrcd-file", str(workdir / "xrc_domain")],
                       env=env, capture_output=True, text=True, timeout=WAIT)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("success") == 4  # the server and three clients
    assert len([x for x in r.stdout.splitlines() if LINE.match(x)]) == 12


def test_fails_like_the_c_tool(workdir: Path) -> None:
    env = {**os.environ, "SOFTVERBS_SERVICE": "0"}
    xrcd = ["--xrcd-file", str(workdir / "xrc_domain")]
    r = subprocess.run([*CMD, "-o", *xrcd], env=env, capture_output=True, text=True,
                       timeout=WAIT)  # fmt: skip
    assert r.returncode == 1 and "isn't ODP capable" in r.stderr
    # -g -1 (what the C tool does without -g): the GID is zeros, the address a
    # LID -- not on RoCE.  (Without -g softverbs' tool picks a RoCE GID itself.)
    r = subprocess.run([*CMD, "--loopback", "-p", "0", "-g", "-1", *xrcd], env=env,
                       capture_output=True, text=True, timeout=WAIT)  # fmt: skip
    assert r.returncode == 1 and "Failed to modify recv QP[0] to RTR" in r.stderr
    r = subprocess.run([*CMD, "--loopback", "-p", "0", *xrcd], env=env, capture_output=True,
                       text=True, timeout=WAIT)  # fmt: skip
    assert r.returncode == 0 and r.stdout.count("success") == 2, r.stdout + r.stderr
    r = subprocess.run([*CMD, "-d", "nosuchdev", *xrcd], env=env, capture_output=True,
                       text=True, timeout=WAIT)  # fmt: skip
    assert r.returncode == 1 and "IB device nosuchdev not found" in r.stderr
