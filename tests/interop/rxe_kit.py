"""The Linux rxe peer of the interop tests: a qemu guest (``../shared/peer``) and how to
run things on both ends of its link. The ``peer`` and ``clean`` fixtures that boot it
once per session are in ``conftest.py``.

One guest serves the whole session, so one that stops answering on its network would
fail every test after it.  After each test the ``clean`` fixture asks whether the guest
still answers (:meth:`Peer.silent`); if it does not, that test errors with what both
ends of the link looked like (:meth:`Peer.evidence`, also kept in a file) and the guest
is booted again for the tests after it.  Each boot's console log is kept under its own
name in ``$PEER_OUT/run`` (``boot.sh start`` empties ``g1.log``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from pingpong_kit import ROOT, Run

#: the peer scripts; ``SOFTVERBS_PEER_DIR`` for a tree not beside ``shared`` (a worktree)
PEER = Path(os.environ.get("SOFTVERBS_PEER_DIR", ROOT / ".." / "shared" / "peer")).resolve()
OUT = Path(os.environ.get("PEER_OUT", "/tmp/peer"))
NS = "rocepeer"
GUEST, GUEST_IP, HOST_IP = "g1", "10.77.0.2", "10.77.0.1"
DEV = "svpeer"
COUNTERS = "/sys/class/infiniband/rxe0/ports/1/hw_counters"
TOOLS = "ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong"
RUN_TIMEOUT = 180.0  #: one ping-pong under TCG (a few ms per iteration)
RUN = OUT / "run"  #: boot.sh's console logs, sockets and pid files
#: Does the guest answer on its network?  A TCP SYN from the namespace to a closed port
#: of the guest (argv[1], timeout argv[2]): its kernel answers ARP and then RST
#: (ECONNREFUSED).  A guest that stopped answering gives EHOSTUNREACH ("No route to
#: host", ARP unanswered) or a timeout.  Prints "answers" or "silent: <error>".
PROBE = """
import socket, sys
s = socket.socket()
s.settimeout(float(sys.argv[2]))
try:
    s.connect((sys.argv[1], 9))
except ConnectionRefusedError:
    print("answers")
except OSError as e:
    print(f"silent: {e!r}")
else:
    print("answers")
"""
PROBES = 3  #: a guest is silent only if this many probes in a row get no answer
#: what the guest's side of the link looked like (busybox ash; iproute2 is /usr/sbin/ip)
GUEST_STATE = ("cat /proc/uptime /proc/loadavg; free; /usr/sbin/ip -s link show eth0; "
               "/usr/sbin/ip neigh; rdma res; "
               "dmesg | grep -v 'speed is unknown' | tail -n 40")  # fmt: skip
SIZES = {"rc": 4096, "uc": 4096, "ud": 1024}  #: the C tools' defaults; 4096 > MTU 1024


@dataclass
class Peer:
    """The booted guest, and how to run things on both ends."""

    boot: Path
    env: dict[str, str]

    def start(self) -> None:
        """Boot the guest and wait until rxe0 is up (about 15-35 s under TCG)."""
        self.sh("stop", GUEST)
        r = self.sh("start", GUEST, GUEST_IP)
        assert r.returncode == 0, f"boot.sh start failed:\n{r.stdout}\n{r.stderr}"
        r = self.sh("wait", GUEST, "PEER: READY", "300", timeout=330)
        assert r.returncode == 0, f"the guest did not become ready:\n{r.stdout}\n{r.stderr}"

    def keep_console(self, why: str) -> Path:
        """A copy of this boot's console log (and the guest's kernel log, which "quiet"
        keeps off the console) under its own name: the next boot empties g1.log."""
        kept = RUN / f"{GUEST}-{time.strftime('%Y%m%d-%H%M%S')}-{why}.log"
        text = (RUN / f"{GUEST}.log").read_bytes() if (RUN / f"{GUEST}.log").exists() else b""
        _, dmesg = self.guest("dmesg | grep -v 'speed is unknown'", timeout=30)
        kept.write_bytes(text + b"\n===== dmesg =====\n" + dmesg.encode())
        return kept

    def silent(self) -> str:
        """'' if the guest answers on its network, else what the last probe got."""
        got = ""
        for _ in range(PROBES):
            r = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-c", PROBE, GUEST_IP,
                                "5"], capture_output=True, text=True, timeout=60,
                               check=False)  # fmt: skip
            if r.stdout.strip() == "answers":
                return ""
            got = (r.stdout + r.stderr).strip()
        return got

    def evidence(self) -> str:
        """Both ends of the link: qemu, the tap and the neighbour on our side, the
        guest's counters, neighbours, rxe resources and kernel log over its console."""
        pidfile = RUN / f"{GUEST}.pid"
        pid = pidfile.read_text().strip() if pidfile.exists() else ""
        alive = bool(pid) and Path(f"/proc/{pid}").exists()
        parts = [f"qemu pid {pid or '?'}: {'running' if alive else 'gone'}"]
        for cmd in (["ip", "-s", "link", "show", f"tap-{GUEST}"], ["ip", "neigh"]):
            r = subprocess.run(["ip", "netns", "exec", NS, *cmd], capture_output=True, text=True,
                               timeout=30, check=False)  # fmt: skip
            parts.append(f"--- ours: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        rc, out = self.guest(GUEST_STATE, timeout=60)
        parts.append(f"--- the guest (console exit {rc}):\n{out}")
        return "\n".join(parts)

    def recover(self, when: str) -> str:
        """The guest stopped answering: keep what it looked like, then boot it again.
        Returns a report that says where the evidence is."""
        state = self.evidence()
        kept = self.keep_console("silent")
        with kept.open("a") as f:
            f.write(f"\n===== the guest stopped answering {when} =====\n{state}\n")
        self.start()
        return f"{state}\n(console log and this evidence kept in {kept}; the guest booted again)"

    def sh(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(self.boot), *args], capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip

    def guest(self, command: str, timeout: float = 60.0) -> tuple[int, str]:
        """Run a shell command on the guest's console: (exit status, output)."""
        r = self.sh("exec", GUEST, command, str(int(timeout)), timeout=timeout + 30)
        return r.returncode, r.stdout

    def counters(self) -> dict[str, int]:
        _, out = self.guest(f"cd {COUNTERS} && grep . *")
        return {k: int(v) for k, v in (line.split(":", 1) for line in out.split() if ":" in line)}

    def clean_guest(self) -> None:
        """No ping-pong left over: a stale rxe QP would keep retrying into our QPN 0x11."""
        self.guest(f"killall -q {TOOLS}; rm -f /tmp/pp.*; true")

    # --- the guest side ---------------------------------------------------------------
    def guest_server(self, kind: str, args: str) -> None:
        self.guest(f"(ibv_{kind}_pingpong -d rxe0 {args} > /tmp/pp.out 2>&1; "
                   "echo PP_EXIT $? >> /tmp/pp.out) &")  # fmt: skip
        # (no "exit" here: this is the console's own shell)
        listening = "netstat -ltn | grep -q ':18515 '"
        rc, out = self.guest(f"for i in $(seq 200); do {listening} && break; sleep 0.1; done; "
                             f"{listening}")  # fmt: skip
        assert rc == 0, f"ibv_{kind}_pingpong did not start listening in the guest: {out}"

    def guest_server_result(self, timeout: float = RUN_TIMEOUT) -> Run:
        deadline = time.monotonic() + timeout
        while True:
            _, out = self.guest("cat /tmp/pp.out")
            m = re.search(r"^PP_EXIT (\d+)$", out, re.M)
            if m:
                return Run(int(m.group(1)), out[: m.start()], "")
            if time.monotonic() > deadline:
                return Run(124, out, "[test: the guest server did not finish]")
            time.sleep(1)

    def guest_client(self, kind: str, args: str) -> Run:
        rc, out = self.guest(f"ibv_{kind}_pingpong -d rxe0 {args} {HOST_IP}",
                             timeout=RUN_TIMEOUT)  # fmt: skip
        return Run(rc, out, "")

    # --- our side (in the namespace) ------------------------------------------------------
    def ours(self, kind: str, *args: str, env: dict[str, str] | None = None
             ) -> subprocess.Popen[str]:  # fmt: skip
        cmd = ["ip", "netns", "exec", NS, sys.executable, "-m", "softverbs",
               f"{kind}-pingpong", "-d", DEV, *args]  # fmt: skip
        return subprocess.Popen(cmd, cwd=ROOT, env=env or self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip

    def ns_read(self, path: str) -> str:
        return subprocess.run(["ip", "netns", "exec", NS, "cat", path], capture_output=True,
                              text=True, check=True, timeout=10).stdout  # fmt: skip


def _skip_unless_possible() -> None:
    if not (PEER / "boot.sh").exists():
        pytest.skip(f"the rxe peer scripts are not at {PEER} (../shared/peer from the repo, "
                    "or SOFTVERBS_PEER_DIR)")  # fmt: skip
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is missing (apt-get install qemu-system-x86, or run "
                    "../shared/peer/build.sh, which installs it)")  # fmt: skip
    if os.geteuid() != 0:
        pytest.skip("the rxe peer needs root (network namespace, bridge, taps)")
