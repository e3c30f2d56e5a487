"""The Linux rxe peer of the interop tests: a qemu guest (``../shared/peer``) and how to
run things on both ends of its link. The ``peer`` and ``clean`` fixtures that boot it
once per session are in ``conftest.py``."""

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

PEER = (ROOT / ".." / "shared" / "peer").resolve()
OUT = Path(os.environ.get("PEER_OUT", "/tmp/peer"))
NS = "rocepeer"
GUEST, GUEST_IP, HOST_IP = "g1", "10.77.0.2", "10.77.0.1"
DEV = "svpeer"
COUNTERS = "/sys/class/infiniband/rxe0/ports/1/hw_counters"
TOOLS = "ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong"
RUN_TIMEOUT = 180.0  #: one ping-pong under TCG (a few ms per iteration)
SIZES = {"rc": 4096, "uc": 4096, "ud": 1024}  #: the C tools' defaults; 4096 > MTU 1024


@dataclass
class Peer:
    """The booted guest, and how to run things on both ends."""

    boot: Path
    env: dict[str, str]

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
        pytest.skip(f"the rxe peer scripts are not at {PEER} (../shared/peer from the repo)")
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is missing (apt-get install qemu-system-x86, or run "
                    "../shared/peer/build.sh, which installs it)")  # fmt: skip
    if os.geteuid() != 0:
        pytest.skip("the rxe peer needs root (network namespace, bridge, taps)")
