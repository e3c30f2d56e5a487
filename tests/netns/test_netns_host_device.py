"""The host device belongs to a network namespace, as an rxe device does.

A process reaches its own namespace's softverbsd (``softverbsd-net<INODE>.sock``)
and link table (``links-net<INODE>.json``), so ``ip netns exec A ...`` and ``ip
netns exec B ...`` each get devices bound to their own addresses, and the two
talk RoCEv2 over their veth pair with no setup beyond ``softverbs link add``.
``link add`` opens the new device where it will be served and refuses what
cannot be bound there; a link whose address goes away is listed DOWN, opening it
says why, and the other devices keep working.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SOFTVERBS = [sys.executable, "-m", "softverbs"]


@pytest.fixture
def user_env() -> Iterator[dict[str, str]]:
    """A user's environment: the host device (no SOFTVERBS_SERVICE), a private runtime
    directory (the services' sockets) and a private configuration (the link tables)."""
    run = tempfile.mkdtemp(prefix="svns", dir="/tmp")  # a Unix socket path is short
    conf = tempfile.mkdtemp(prefix="svnsconf")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    env.update(XDG_RUNTIME_DIR=run, XDG_CONFIG_HOME=conf, SOFTVERBS_IDLE_EXIT="20")
    yield env
    for sock in Path(run).glob("softverbsd*.sock"):  # stop every namespace's service
        subprocess.run([*SOFTVERBS, "service", "stop", "--socket", str(sock)], env=env,
                       capture_output=True, timeout=30, check=False)  # fmt: skip
    shutil.rmtree(run, ignore_errors=True)
    shutil.rmtree(conf, ignore_errors=True)


def sv(ns: str | None, env: dict[str, str], *args: str, timeout: float = 60
       ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    prefix = ["ip", "netns", "exec", ns] if ns else []
    return subprocess.run([*prefix, *SOFTVERBS, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, f"{r.args} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def links(ns: str | None, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {row["ifname"]: row for row in json.loads(ok(sv(ns, env, "link", "show", "-j")))}


def test_each_namespace_has_its_own_host_device(make_topology: Any,
                                                user_env: dict[str, str]) -> None:  # fmt: skip
    topo = make_topology(hosts=2)
    a, b = topo.hosts
    ok(sv(a.ns, user_env, "link", "add", "sva", "--addr", a.ip))
    ok(sv(b.ns, user_env, "link", "add", "svb", "--addr", b.ip))

    # each namespace sees its own link, the initial namespace neither
    assert set(links(a.ns, user_env)) == {"sv0", "sva"}
    assert set(links(b.ns, user_env)) == {"sv0", "svb"}
    assert set(links(None, user_env)) == {"sv0"}
    assert links(a.ns, user_env)["sva"]["state"] == "ACTIVE"
    if shutil.which("ibv_devices"):  # C programs reach their namespace's service too
        text = ok(sv(a.ns, user_env, "exec", "--", "ibv_devices"))
        assert "sva" in text and "svb" not in text, text
    socks = sorted(p.name for p in Path(user_env["XDG_RUNTIME_DIR"]).glob("softverbsd*.sock"))
    assert len(socks) == 2 and all(s.startswith("softverbsd-net") for s in socks), socks

    # RC ping-pong between the two namespaces' host devices, over the veth pair
    server = subprocess.Popen(["ip", "netns", "exec", a.ns, *SOFTVERBS, "rc-pingpong",
                               "-d", "sva", "-g", "0", "-n", "200"], env=user_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    client = None
    for _ in range(60):  # the client does not retry a connect the server is not ready for
        client = sv(b.ns, user_env, "rc-pingpong", "-d", "svb", "-g", "0", "-n", "200", a.ip)
        if "Couldn't connect" not in client.stderr or server.poll() is not None:
            break
        time.sleep(0.25)
    assert client is not None
    out, err = server.communicate(timeout=60)
    assert server.returncode == 0, f"server failed:\n{out}\n{err}"
    assert client.returncode == 0, f"client failed:\n{client.stdout}\n{client.stderr}"
    for text in (out, client.stdout):
        assert "200 iters in" in text, text


def test_link_add_refuses_an_address_it_cannot_serve(user_env: dict[str, str],
                                                    tmp_path: Path) -> None:  # fmt: skip
    """The address exists, but its UDP port 4791 is taken: refused at ``add``,
    on the host device and in-process alike, and the table is unchanged."""
    import socket

    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    holder.bind(("127.0.0.9", 4791))
    try:
        for mode in (None, "0"):
            env = dict(user_env)
            if mode:
                env["SOFTVERBS_SERVICE"] = mode
            r = sv(None, env, "link", "add", "held", "--addr", "127.0.0.9")
            assert r.returncode == 1, (r.stdout, r.stderr)
            assert "cannot add device 'held'" in r.stderr, r.stderr
            assert "another process holds UDP port 4791" in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
            assert set(links(None, env)) == {"sv0"}
    finally:
        holder.close()


def test_a_link_whose_address_went_away_is_down(make_topology: Any,
                                               user_env: dict[str, str]) -> None:  # fmt: skip
    topo = make_topology(hosts=2)
    a = topo.hosts[0]
    ok(sv(a.ns, user_env, "link", "add", "gone", "--addr", a.ip))
    for cmd in (("link", "add", "dum0", "type", "veth", "peer", "name", "dum1"),
                ("addr", "add", "10.199.8.1/24", "dev", "dum0"), ("link", "set", "dum1", "up"),
                ("link", "set", "dum0", "up")):
        topo.exec_ns(a.ns, "ip", *cmd)
    ok(sv(a.ns, user_env, "link", "add", "nd", "--netdev", "dum0"))
    ok(sv(a.ns, user_env, "service", "stop"))  # the next service binds afresh
    topo.exec_ns(a.ns, "ip", "addr", "del", f"{a.ip}/24", "dev", a.ifname)
    rows = links(a.ns, user_env)
    assert (rows["gone"]["state"], rows["gone"]["physical_state"]) == ("DOWN", "DISABLED")
    assert rows["sv0"]["state"] == "ACTIVE" and rows["nd"]["state"] == "ACTIVE"
    text = ok(sv(a.ns, user_env, "link", "show", "gone"))
    assert "state DOWN physical_state DISABLED" in text, text

    # opening it says why; every other device keeps working
    r = sv(a.ns, user_env, "devinfo", "-d", "gone")
    assert r.returncode != 0 and "cannot open device gone" in r.stderr, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "PORT_ACTIVE" in ok(sv(a.ns, user_env, "devinfo", "-d", "sv0"))
    code = ("import softverbs as s\n"
            "names = [d.name.decode() for d in s.get_device_list()]\n"
            "assert names == ['sv0', 'gone', 'nd'], names\n"
            "ctx = s.Context(name='sv0'); pd = s.PD(ctx); ctx.close(); print('ok')\n")  # fmt: skip
    r = subprocess.run(["ip", "netns", "exec", a.ns, sys.executable, "-c", code], env=user_env,
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert r.stdout.strip() == "ok", r.stderr

    # a netdev taken down takes its device's port down too
    topo.exec_ns(a.ns, "ip", "link", "set", "dum0", "down")
    assert links(a.ns, user_env)["nd"]["state"] == "DOWN"
