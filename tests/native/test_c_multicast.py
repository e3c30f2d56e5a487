"""Multicast for unmodified C programs: ``ibv_attach_mcast``/``ibv_detach_mcast``
(``mcast.c``, under ASan and UBSan) and Debian's ``mckey`` as a sender and a
receiver on the host device, each checked by its own output."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import pytest
from test_c_tools import TIMEOUT, _need, env, exec_cmd, sanitized_libs  # noqa: F401 - fixtures

from softverbs import native

HERE = Path(__file__).parent


def test_attach_detach_and_delivery(env: dict[str, str], sanitized_libs: tuple[Path, str],  # noqa: F811
                                    tmp_path: Path) -> None:  # fmt: skip
    libdir, _ = sanitized_libs
    prog = tmp_path / "mcast"
    build = subprocess.run([native.compiler() or "gcc", "-std=gnu11", "-g", "-Wall", "-Wextra",
                            "-Werror", "-fsanitize=address,undefined", str(HERE / "mcast.c"),
                            "-o", str(prog), f"-L{libdir}", "-l:libibverbs.so.1"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert build.returncode == 0, build.stderr
    r = subprocess.run([str(prog)], env=dict(env, LD_LIBRARY_PATH=str(libdir)),
                       capture_output=True, text=True, timeout=TIMEOUT, check=False)  # fmt: skip
    assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("ok ") == 17, r.stdout


def _group() -> str:
    return f"230.{random.randint(0, 255)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


@pytest.mark.parametrize("sender_args", [[], ["-o"]], ids=["full-member", "send-only"])
def test_mckey_sender_and_receiver(env: dict[str, str], sender_args: list[str]) -> None:  # noqa: F811
    """mckey's receiver joins and posts its receives; once it says so, a sender
    joins (as a full member, or send-only with -o) and sends 10 messages, which
    the receiver must all get ("data transfers complete", "return status 0")."""
    _need("mckey")
    _need("stdbuf")
    group = _group()
    base = ["mckey", "-m", group, "-b", "127.0.0.1", "-C", "10", "-S", "256"]
    # line-buffered, so "receiving data transfers" shows when it happens
    receiver = subprocess.Popen(exec_cmd("stdbuf", "-oL", *base), env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        assert receiver.stdout is not None
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = receiver.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "receiving data transfers" in line:
                break
        assert any("receiving data transfers" in s for s in seen), "".join(seen)
        assert any(f"joined dgid: ::ffff:{group}" in s for s in seen), "".join(seen)
        sender = subprocess.run(exec_cmd(*base, "-s", *sender_args), env=env, text=True,
                                capture_output=True, timeout=TIMEOUT, check=False,
                                stdin=subprocess.DEVNULL)  # fmt: skip
        rest = receiver.communicate(timeout=TIMEOUT)[0]
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    out = sender.stdout + sender.stderr
    assert sender.returncode == 0, out
    assert "initiating data transfers" in out and "return status 0" in out, out
    recv_out = "".join(seen) + rest
    assert receiver.returncode == 0, recv_out
    assert "data transfers complete" in recv_out and "return status 0" in recv_out, recv_out
