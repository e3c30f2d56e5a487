"""QEMU's RDMA live migration (Debian qemu-system-x86 7.2) of a small TCG
guest, source and destination on one host.

The destination waits with ``-incoming rdma:127.0.0.1:PORT`` (it sets
RDMA_OPTION_ID_REUSEADDR on its listener, which softverbs once refused with
ENOSYS); the source is told ``migrate rdma:127.0.0.1:PORT`` over QMP and
sends the guest's RAM with RDMA WRITEs into the destination's registered
memory.  The guest has no disk: SeaBIOS finds nothing to boot, which is all
a migration needs.  A 1 MiB random block is loaded into the source guest's
RAM (``-device loader``) and a different one into the destination's, so the
migration has real data to move.

Verdict: QEMU's own -- the source's ``query-migrate`` says ``completed``
(and the destination stays paused, ``-S``, with status ``paused``) -- and the
data: the destination's RAM (``pmemsave``) equals the source's, block
included.  The pair takes a few seconds; it runs in every pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pair_kit import Server, free_port, need, on_softverbs, sv_env

RAM_MIB = 32
BLOCK_AT = 8 << 20  #: where the random block lands in guest RAM (below SeaBIOS's top area)
BLOCK = 1 << 20
PAGE = 4096

QMP = Callable[..., dict[str, Any]]


def qmp_connect(path: Path, owner: Server, timeout: float = 30.0) -> QMP:
    """A QMP session on ``path``: a function running one command."""
    sock = socket.socket(socket.AF_UNIX)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock.connect(str(path))
            break
        except OSError:
            if owner.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no QMP socket {path}:\n{owner.stop()}") from None
            time.sleep(0.05)
    sock.settimeout(timeout)
    f = sock.makefile("rw")
    json.loads(f.readline())  # the greeting

    def command(name: str, **arguments: Any) -> dict[str, Any]:
        f.write(json.dumps({"execute": name, "arguments": arguments}) + "\n")
        f.flush()
        while True:
            reply: dict[str, Any] = json.loads(f.readline())
            if "return" in reply or "error" in reply:
                return reply

    assert "return" in command("qmp_capabilities")
    return command


@pytest.fixture
def guests(host_service: str, tmp_path: Path) -> Iterator[tuple[QMP, QMP, Path, int]]:
    qemu = need("qemu-system-x86_64", "qemu-system-x86")
    env = sv_env(host_service)
    port = free_port()
    blocks = {}
    for side in ("src", "dst"):
        blocks[side] = tmp_path / f"{side}.bin"
        blocks[side].write_bytes(os.urandom(BLOCK))
    base = [qemu, "-machine", "pc", "-accel", "tcg", "-m", str(RAM_MIB), "-nodefaults",
            "-display", "none", "-serial", "none"]  # fmt: skip
    servers = {
        side: Server(on_softverbs(*base, "-qmp", f"unix:{tmp_path / side}.sock,server=on,wait=off",
                                  "-device", f"loader,file={blocks[side]},addr={BLOCK_AT:#x}",
                                  *extra), env)
        for side, extra in (("dst", ["-S", "-incoming", f"rdma:127.0.0.1:{port}"]), ("src", []))
    }  # fmt: skip
    try:
        dst = qmp_connect(tmp_path / "dst.sock", servers["dst"])
        src = qmp_connect(tmp_path / "src.sock", servers["src"])
        yield src, dst, tmp_path, port
    finally:
        for s in servers.values():
            s.stop()


def test_qemu_rdma_live_migration(guests: tuple[QMP, QMP, Path, int]) -> None:
    src, dst, tmp, port = guests
    start = time.monotonic()
    assert "return" in src("migrate", uri=f"rdma:127.0.0.1:{port}")
    status: dict[str, Any] = {}
    while time.monotonic() - start < 120:
        status = src("query-migrate")["return"]
        if status.get("status") in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.2)
    assert status.get("status") == "completed", status
    print(f"migrated {status['ram']['transferred']} bytes in {status['total-time']} ms "
          f"(downtime {status['downtime']} ms)")  # fmt: skip
    assert dst("query-status")["return"]["status"] in ("paused", "prelaunch"), dst("query-status")
    ram = {}
    for side, qmp in (("src", src), ("dst", dst)):
        out = tmp / f"{side}.ram"
        assert "return" in qmp("pmemsave", val=0, size=RAM_MIB << 20, filename=str(out))
        ram[side] = out.read_bytes()
        assert len(ram[side]) == RAM_MIB << 20
    assert ram["dst"][BLOCK_AT:BLOCK_AT + BLOCK] == (tmp / "src.bin").read_bytes(), \
        "the source's block did not arrive"  # fmt: skip
    if hashlib.sha256(ram["src"]).digest() != hashlib.sha256(ram["dst"]).digest():
        differ = [a for a in range(0, RAM_MIB << 20, PAGE)
                  if ram["src"][a:a + PAGE] != ram["dst"][a:a + PAGE]]  # fmt: skip
        zeros = [a for a in differ if not any(ram["dst"][a:a + PAGE])]
        raise AssertionError(
            f"the destination's RAM differs from the source's in {len(differ)} pages of "
            f"{PAGE} bytes ({len(zeros)} of them all zeros at the destination), first at "
            f"{[hex(a) for a in differ[:8]]}")
