"""Network namespaces for the multi-host tests, and the agents that run in them.

Each test builds its own small network with :func:`make_topology`:

* two hosts: namespaces ``h0`` and ``h1`` joined by one veth pair
  (``sv0`` -- ``sv1``);
* three hosts: ``h0`` holds a bridge ``svbr`` and one veth port per other
  host (``p1``, ``p2``); ``h1`` and ``h2`` each hold the other end (``sv1``,
  ``sv2``).

Host *i* has address ``10.199.7.(i+1)/24`` on its interface, plus the IPv6
link-local address the kernel gives it (duplicate address detection is
switched off first, so the address is usable at once; the fixture still
waits until no address is tentative).  Every name starts with
``svnt<pid>x<n>``, so parallel runs do not clash; all interfaces are created
inside the namespaces, so nothing appears in the caller's namespace and no
packet can leave the test's own network.

Namespaces are removed when the test ends, pass or fail (a finalizer
registered before the first one is made), and at session start any
``svnt*`` namespace left by a run whose process is gone is removed too.
Without root or a working ``ip netns``, the tests skip and say why.

Agents (``agent.py``) run as ``ip netns exec NS python3 agent.py``; every
wait on them is bounded, and a test that times out kills them and shows
their output.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

NS_PREFIX = "svnt"
SUBNET = "10.199.7"
AGENT = Path(__file__).with_name("agent.py")
_STALE = re.compile(rf"^{NS_PREFIX}(\d+)x\d+h\d+$")
_counter = 0


def ip(*args: str, check: bool = True, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; raise with its stderr if it fails and ``check``."""
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def _netns_names() -> list[str]:
    r = ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_netns(name: str) -> None:
    # Processes still inside (agents of a crashed run) would keep it alive: end them.
    r = ip("netns", "pids", name, check=False)
    for pid in r.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", name, check=False)


def remove_stale_namespaces() -> list[str]:
    """Delete ``svnt<pid>...`` namespaces whose creating process no longer exists."""
    removed = []
    for name in _netns_names():
        m = _STALE.match(name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            _delete_netns(name)
            removed.append(name)
    return removed


# --- agents -----------------------------------------------------------------------------------
class AgentProc:
    """One running agent: its stdout lines (read by a thread) and its stderr file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], stderr: Path) -> None:
        self.name = name
        self.cmd = cmd
        self.stderr_path = stderr
        self._stderr = stderr.open("w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
                                     text=True, bufsize=1)  # fmt: skip
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._q.put(line)
        self._q.put(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_line(self, prefix: str, timeout: float) -> dict[str, Any]:
        """The JSON of the first stdout line starting with ``prefix``; fail on timeout."""
        end = time.monotonic() + timeout
        for line in list(self.lines):
            if line.startswith(prefix + " "):
                return _json_of(line)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                pytest.fail(f"{self.name}: no {prefix} line in {timeout}s\n{self.diagnostics()}")
            try:
                got = self._q.get(timeout=left)
            except queue.Empty:
                continue
            if got is None:
                pytest.fail(f"{self.name} exited before printing {prefix}\n{self.diagnostics()}")
            if got.startswith(prefix + " "):
                return _json_of(got)

    def wait(self, timeout: float) -> int:
        """The exit status; on timeout kill the agent and fail the test."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.name} did not exit within {timeout}s\n{self.diagnostics()}")
        self._reader.join(timeout=5)
        return rc

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)

    def result(self) -> dict[str, Any]:
        """The RESULT line; fail (with the agent's output) if there is none."""
        for line in reversed(self.lines):
            if line.startswith("RESULT "):
                return _json_of(line)
        pytest.fail(f"{self.name} printed no RESULT line\n{self.diagnostics()}")

    def diagnostics(self) -> str:
        self._stderr.flush()
        try:
            err = self.stderr_path.read_text()[-6000:]
        except OSError:
            err = ""
        out = "\n".join(self.lines[-20:])[-6000:]
        return (f"--- {self.name}: {' '.join(self.cmd)}\n--- exit: {self.proc.poll()}\n"
                f"--- stdout (tail):\n{out}\n--- stderr (tail):\n{err}")  # fmt: skip

    def close(self) -> None:
        self.kill()
        self._stderr.close()


def _json_of(line: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(line.split(" ", 1)[1])
    return obj


# --- topology ---------------------------------------------------------------------------------
@dataclass
class Host:
    ns: str
    ifname: str  #: the interface the agent's device binds to
    ip: str
    peer_ifs: list[tuple[str, str]] = field(default_factory=list)  #: (ns, ifname) toward it


@dataclass
class Topology:
    """Namespaces, links and agents of one test."""

    name: str
    workdir: Path
    hosts: list[Host] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    agents: list[AgentProc] = field(default_factory=list)

    def exec_ns(self, ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True,
                           timeout=10)  # fmt: skip
        if check and r.returncode != 0:
            raise RuntimeError(f"{ns}: {' '.join(cmd)} failed: {r.stderr.strip()}")
        return r

    def agent(self, host: Host, role: str, scenario: str, *extra: str, server: Host | None = None,
              env: dict[str, str] | None = None, deadline: float = 60) -> AgentProc:  # fmt: skip
        """Start ``agent.py`` in ``host``'s namespace."""
        server = server or self.hosts[0]
        cmd = ["ip", "netns", "exec", host.ns, sys.executable, "-u", str(AGENT),
               "--role", role, "--scenario", scenario, "--netdev", host.ifname, "--ip", host.ip,
               "--peer", server.ip, "--workdir", str(self.workdir), "--deadline", str(deadline),
               *extra]  # fmt: skip
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
        full_env["SOFTVERBS_SERVICE"] = "0"  # each agent is its own host: its own device
        full_env.update(env or {})
        name = f"{role}@{host.ns}"
        stderr = self.workdir / f"{role}-{host.ns}-{len(self.agents)}.stderr"
        proc = AgentProc(name, cmd, full_env, stderr)
        self.agents.append(proc)
        return proc

    def netem(self, spec: str) -> str | None:
        """Put ``tc qdisc ... netem SPEC`` on both ends of host 1's link.

        Returns None, or why it cannot (no sch_netem in this kernel, no tc).
        """
        if shutil.which("tc") is None:
            return "iproute2's tc is not installed"
        host = self.hosts[1]
        for ns, ifname in [(host.ns, host.ifname), *host.peer_ifs]:
            r = self.exec_ns(ns, "tc", "qdisc", "add", "dev", ifname, "root", "netem",
                             *spec.split(), check=False)  # fmt: skip
            if r.returncode != 0:
                return f"tc qdisc add ... netem {spec} failed: {r.stderr.strip()}"
        return None

    def close(self) -> None:
        for a in self.agents:
            a.close()
        for ns in self.namespaces:
            _delete_netns(ns)
        left = set(self.namespaces) & set(_netns_names())
        assert not left, f"namespaces not removed: {left}"


def _setup_ns(topo: Topology, ns: str, dad: bool) -> None:
    ip("netns", "add", ns)
    topo.namespaces.append(ns)
    # No duplicate address detection: link-local addresses are usable at once
    for key in ("all", "default"):
        topo.exec_ns(ns, "sysctl", "-qw", f"net.ipv6.conf.{key}.accept_dad={int(dad)}")
    ip("-n", ns, "link", "set", "lo", "up")


def _addr_up(ns: str, ifname: str, addr: str | None, mtu: int) -> None:
    ip("-n", ns, "link", "set", ifname, "mtu", str(mtu))
    if addr:
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
    ip("-n", ns, "link", "set", ifname, "up")


def _wait_ready(topo: Topology, timeout: float = 10, dad: bool = False) -> None:
    """Wait until every interface is up with its IPv6 link-local address, and (unless
    ``dad``: the test wants them still in duplicate address detection) none tentative."""
    end = time.monotonic() + timeout
    pending: list[str] = []
    while time.monotonic() < end:
        pending = []
        for h in topo.hosts:
            info = json.loads(ip("-n", h.ns, "-j", "addr", "show", "dev", h.ifname).stdout)[0]
            addrs = info.get("addr_info", [])
            fams = {a["family"] for a in addrs}
            if (info.get("operstate") not in ("UP", "UNKNOWN") or "inet6" not in fams
                    or (not dad and any(a.get("tentative") for a in addrs))):  # fmt: skip
                pending.append(f"{h.ns}/{h.ifname}: {info.get('operstate')} {addrs}")
        if not pending:
            return
        time.sleep(0.05)
    raise RuntimeError(f"interfaces not ready after {timeout}s: {pending}")


def build_topology(topo: Topology, nhosts: int, mtu: int, dad: bool = False) -> None:
    """Namespaces, links and addresses (module docstring); ``dad``: IPv6 duplicate
    address detection stays on, and the addresses are still tentative on return."""
    global _counter
    _counter += 1
    base = f"{NS_PREFIX}{os.getpid()}x{_counter}"
    names = [f"{base}h{i}" for i in range(nhosts)]
    for ns in names:
        _setup_ns(topo, ns, dad)
    if nhosts == 2:
        ip("-n", names[0], "link", "add", "sv0", "type", "veth", "peer", "name", "sv1",
           "netns", names[1])  # fmt: skip
        topo.hosts = [Host(names[0], "sv0", f"{SUBNET}.1"),
                      Host(names[1], "sv1", f"{SUBNET}.2", [(names[0], "sv0")])]  # fmt: skip
        for h in topo.hosts:
            _addr_up(h.ns, h.ifname, h.ip, mtu)
    else:
        hub = names[0]
        ip("-n", hub, "link", "add", "svbr", "type", "bridge", "stp_state", "0")
        topo.hosts = [Host(hub, "svbr", f"{SUBNET}.1")]
        for i in range(1, nhosts):
            port, far = f"p{i}", f"sv{i}"
            ip("-n", hub, "link", "add", port, "type", "veth", "peer", "name", far,
               "netns", names[i])  # fmt: skip
            ip("-n", hub, "link", "set", port, "master", "svbr")
            _addr_up(hub, port, None, mtu)
            host = Host(names[i], far, f"{SUBNET}.{i + 1}", [(hub, port)])
            _addr_up(host.ns, far, host.ip, mtu)
            topo.hosts.append(host)
        _addr_up(hub, "svbr", topo.hosts[0].ip, mtu)
    _wait_ready(topo, dad=dad)
