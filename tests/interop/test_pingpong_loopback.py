"""``softverbs {rc,uc,ud}-pingpong`` against itself: two processes, two UDP devices, loopback.

Each test writes a ``softverbs link`` table (``SOFTVERBS_CONFIG``) with two
UDP devices on private loopback addresses (127.x.y.1 and .2, both routed
through ``lo``) and runs a server process on one and a client process on the
other, exactly as two hosts would run ``ibv_rc_pingpong``: real RoCEv2
datagrams with ICRC between two UDP sockets, and the TCP rendezvous on a
free port.  With explicit addresses a device's GID table has one entry, the
IPv4-mapped address, hence ``-g 0``.  Loopback's MTU is 65536, so the
devices' active MTU is 4096; RC and UC sizes above the path MTU (``-m``)
are split into FIRST/MIDDLE/LAST packets.

The rendezvous tests check the bytes on the TCP connection against
rdma-core's format (``"%04x:%06x:%06x:%s"``, 52 bytes with the NUL, then
``"done\\0"``), using a scripted peer instead of a second ping-pong, and
against the rendezvous messages in the rxe golden captures.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from pingpong_kit import (
    ROOT,
    Run,
    check_pair,
    finish,
    free_tcp_port,
    kill,
    pingpong_cmd,
    read_until,
    wait_listening,
)

from softverbs.samples.pingpong import Dest

GOLDEN = ROOT / "tests" / "data" / "golden"
WIRE = re.compile(rb"[0-9a-f]{4}:[0-9a-f]{6}:[0-9a-f]{6}:[0-9a-f]{32}\0")
TIMEOUT = 60.0


@dataclass
class Loopback:
    """Two UDP devices on loopback and the environment that names them."""

    env: dict[str, str]
    devs: tuple[str, str]
    addrs: tuple[str, str]

    def gid_hex(self, i: int) -> str:
        return (b"\0" * 10 + b"\xff\xff" + socket.inet_aton(self.addrs[i])).hex()

    def popen(self, kind: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(pingpong_cmd(kind, *args), cwd=ROOT, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip

    def run(self, kind: str, *args: str, timeout: float = TIMEOUT) -> Run:
        return finish(self.popen(kind, *args), timeout)

    def pair(self, kind: str, args: list[str], swap: bool = False,
             server_extra: tuple[str, ...] = (), client_extra: tuple[str, ...] = ()
             ) -> tuple[Run, Run]:  # fmt: skip
        """Server on one device, client on the other; both finished."""
        port = str(free_tcp_port())
        srv_dev, cli_dev = self.devs[::-1] if swap else self.devs
        srv_addr = self.addrs[1] if swap else self.addrs[0]
        server = self.popen(kind, "-d", srv_dev, "-g", "0", "-p", port, *args, *server_extra)
        client = Run(-1, "", "[test: the client did not run]")
        try:
            wait_listening(int(port), server)
            client = self.run(kind, "-d", cli_dev, "-g", "0", "-p", port, *args,
                              *client_extra, srv_addr)  # fmt: skip
        finally:
            # a failed client leaves the server waiting for it: do not wait long
            srv = finish(server, TIMEOUT if client.returncode == 0 else 5)
        return srv, client


@pytest.fixture(scope="module")
def lo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopback]:
    # an uncommon 127.x.y.0/24 pair, so no other user of UDP port 4791 is in the way
    x, y = 100 + os.getpid() % 100, 50 + (os.getpid() // 100) % 100
    addrs = (f"127.{x}.{y}.1", f"127.{x}.{y}.2")
    cfg = tmp_path_factory.mktemp("links") / "links.json"
    links = [{"name": "pp1", "addrs": [addrs[0]]}, {"name": "pp2", "addrs": [addrs[1]]}]
    cfg.write_text(json.dumps({"links": links}))
    env = {**os.environ, "SOFTVERBS_CONFIG": str(cfg), "PYTHONUNBUFFERED": "1"}
    env.pop("SOFTVERBS_FAULTS", None)
    yield Loopback(env, ("pp1", "pp2"), addrs)


# --------------------------------------------------------------------------
# ping-pong between two softverbs processes

# Most cases sleep on CQ events (-e): two busy-polling processes crawl on a
# loaded CI machine, where each round trip waits for both to be scheduled.
CASES = [
    # kind, size, iters, extra options (both sides), devices swapped
    ("rc", 4096, 20, (), False),  # polling
    ("rc", 1, 20, ("-e",), True),
    ("rc", 10000, 10, ("-m", "1024", "-e"), False),  # 10 packets per message
    ("rc", 9000, 10, ("-m", "4096", "-e"), True),  # 3 packets
    ("rc", 5000, 10, ("-N", "-r", "4"), False),  # ibv_wr_* send API, few receives, polling
    ("uc", 4096, 20, ("-e",), True),
    ("uc", 10000, 10, ("-m", "2048"), False),  # polling
    ("ud", 1024, 20, (), False),  # polling
    ("ud", 4096, 10, ("-e",), True),  # the largest UD message: the active MTU
    ("ud", 8, 20, ("-r", "2", "-e"), False),
]


@pytest.mark.parametrize(("kind", "size", "iters", "extra", "swap"), CASES,
                         ids=[f"{c[0]}-s{c[1]}{''.join(c[3])}{'-swap' if c[4] else ''}"
                              for c in CASES])  # fmt: skip
def test_pingpong(lo: Loopback, kind: str, size: int, iters: int, extra: tuple[str, ...],
                  swap: bool) -> None:  # fmt: skip
    args = ["-s", str(size), "-n", str(iters), *extra]
    server, client = lo.pair(kind, args, swap=swap)
    check_pair(server, client, size, iters)
    gids = {server.address("local")[3], client.address("local")[3]}
    assert gids == {f"::ffff:{a}" for a in lo.addrs}
    if kind == "ud":  # ibv_ud_pingpong's local line has "PSN 0x...: GID"
        assert ": GID " in server.stdout.splitlines()[0]


@pytest.mark.parametrize("kind", ["rc", "uc", "ud"])
def test_events_on_one_side_and_validation(lo: Loopback, kind: str) -> None:
    """-e on the client only; -c: the server checks the pages the client marked."""
    size = 2 * 4096 + 100 if kind != "ud" else 4096
    args = ["-s", str(size), "-n", "10", "-c"]
    server, client = lo.pair(kind, args, client_extra=("-e",))
    check_pair(server, client, size, 10)
    assert "invalid data" not in server.stdout + client.stdout


# --------------------------------------------------------------------------
# failures: exit status 1 and the C tools' messages


def test_ud_size_above_mtu(lo: Loopback) -> None:
    r = lo.run("ud", "-d", "pp1", "-g", "0", "-s", "5000", "-p", str(free_tcp_port()))
    assert r.returncode == 1, str(r)
    assert "Requested size larger than port MTU (4096)" in r.stderr


@pytest.mark.parametrize("argv", [["-m", "1000"], ["-x"], ["-i", "0"], ["a", "b"]])
def test_bad_command_line_exits_1(lo: Loopback, argv: list[str]) -> None:
    r = lo.run("rc", "-d", "pp1", *argv)
    assert r.returncode == 1, str(r)
    assert r.stdout == ""


def test_unknown_device(lo: Loopback) -> None:
    r = lo.run("uc", "-d", "nosuchdev", "-g", "0")
    assert (r.returncode, r.stderr.strip()) == (1, "IB device nosuchdev not found")


def test_no_server(lo: Loopback) -> None:
    port = free_tcp_port()
    r = lo.run("rc", "-d", "pp1", "-g", "0", "-p", str(port), lo.addrs[1])
    assert r.returncode == 1, str(r)
    assert f"Couldn't connect to {lo.addrs[1]}:{port}" in r.stderr
    assert r.stdout.startswith("  local address:  ")


def test_odp_is_refused_like_a_device_without_it(lo: Loopback) -> None:
    r = lo.run("rc", "-d", "pp1", "-g", "0", "-o")
    assert r.returncode == 1, str(r)
    assert "The device isn't ODP capable" in r.stderr


def test_without_gid_index_roce_cannot_connect(lo: Loopback) -> None:
    """-g -1 (the C tools without -g): a zero GID, so they address by LID, which
    RoCE refuses (as rxe).  softverbs' tools without -g pick a RoCE GID."""
    port = str(free_tcp_port())
    server = lo.popen("rc", "-d", "pp1", "-p", port, "-g", "-1")
    try:
        wait_listening(int(port), server)
        client = lo.run("rc", "-d", "pp2", "-p", port, "-g", "-1", lo.addrs[0])
    finally:
        srv = finish(server, TIMEOUT)
    assert srv.returncode == 1 and client.returncode == 1, f"{srv}\n{client}"
    assert "Failed to modify QP to RTR" in srv.stderr
    assert "Couldn't connect to remote QP" in srv.stderr
    assert "GID ::" in srv.stdout  # the all-zero GID, printed as inet_ntop does


# --------------------------------------------------------------------------
# the rendezvous bytes


def _listener() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    s.settimeout(TIMEOUT)
    return s, s.getsockname()[1]


def _recv_all(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        if not part:
            break
        data += part
    return data


@pytest.mark.parametrize("kind", ["rc", "uc", "ud"])
def test_client_rendezvous_bytes(lo: Loopback, kind: str) -> None:
    """Our client: 52 bytes "%04x:%06x:%06x:<gid>\\0", reads 52, then sends "done\\0" and closes."""
    listener, port = _listener()
    client = lo.popen(kind, "-d", "pp2", "-g", "0", "-p", str(port), "127.0.0.1")
    seen = ""
    try:
        with listener:
            conn, _ = listener.accept()
        with conn:
            conn.settimeout(TIMEOUT)
            msg = _recv_all(conn, 52)
            assert len(msg) == 52 and WIRE.fullmatch(msg), msg
            lid, qpn, psn, gid = msg[:-1].decode().split(":")
            assert lid == "0000" and gid == lo.gid_hex(1)
            fake = Dest(0, 0xABCDE, 0x123456, bytes.fromhex(lo.gid_hex(0)))
            conn.sendall(fake.to_wire())
            assert _recv_all(conn, 64) == b"done\0"  # 5 bytes, then the client closes
        seen = read_until(client, "  remote address: ")
    finally:
        run = kill(client, seen)
    local = run.address("local")
    assert (local[1], local[2]) == (qpn, psn)
    assert run.address("remote") == ("0000", "0abcde", "123456", f"::ffff:{lo.addrs[0]}")


@pytest.mark.parametrize("kind", ["rc", "uc", "ud"])
def test_server_rendezvous_bytes(lo: Loopback, kind: str) -> None:
    """Our server: reads 52 bytes, answers with its own 52, then waits for "done\\0"."""
    port = free_tcp_port()
    server = lo.popen(kind, "-d", "pp1", "-g", "0", "-p", str(port))
    seen = ""
    try:
        wait_listening(port, server)
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as conn:
            fake = Dest(0, 0x42, 0xFEDCBA, bytes.fromhex(lo.gid_hex(1)))
            conn.sendall(fake.to_wire())
            msg = _recv_all(conn, 52)
            assert len(msg) == 52 and WIRE.fullmatch(msg), msg
            assert msg[19:51].decode() == lo.gid_hex(0)
            conn.sendall(b"done\0")
            seen = read_until(server, "  remote address: ")
    finally:
        run = kill(server, seen)
    assert run.address("remote") == ("0000", "000042", "fedcba", f"::ffff:{lo.addrs[1]}")
    _, qpn, psn, _ = run.address("local")
    assert msg[:19].decode() == f"0000:{qpn}:{psn}:"


def _golden_rendezvous() -> list[tuple[str, bytes]]:
    from scapy.all import TCP, Raw, rdpcap  # type: ignore[import-untyped]

    out = []
    for name in ("rc_pingpong", "rc_pingpong_ipv6", "uc_pingpong", "ud_pingpong"):
        path = GOLDEN / f"{name}.pcap"
        if not path.exists():
            continue
        for p in rdpcap(str(path)):
            if TCP in p and Raw in p:
                out.append((name, bytes(p[Raw].load)))
    return out


def test_golden_rendezvous_round_trips() -> None:
    """rxe-to-rxe rendezvous messages parse, and re-encode to the same bytes."""
    pytest.importorskip("scapy")
    msgs = _golden_rendezvous()
    if not msgs:
        pytest.skip(f"no golden captures in {GOLDEN}")
    addresses = [m for _, m in msgs if m != b"done\0"]
    assert len(addresses) >= 2 and {m for _, m in msgs} >= {b"done\0"}
    for msg in addresses:
        assert len(msg) == 52 and WIRE.fullmatch(msg), msg
        assert Dest.from_wire(msg).to_wire() == msg


def test_dest_line_matches_c_format() -> None:
    d = Dest(0, 0x11, 0xABCDEF, bytes.fromhex("fe80000000000000505400fffe4d0002"))
    assert d.line("local") == (
        "  local address:  LID 0x0000, QPN 0x000011, PSN 0xabcdef, GID fe80::5054:ff:fe4d:2"
    )
    assert d.line("remote", ":").startswith("  remote address: LID 0x0000, QPN 0x000011, PSN ")
