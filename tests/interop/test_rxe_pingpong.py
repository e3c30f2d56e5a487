"""softverbs' ping-pongs against rdma-core's ``ibv_*_pingpong`` on Linux rxe (on demand).

Setup (once per session, about 15-30 s under TCG): build the peer if its
kernel and initramfs are missing (``../shared/peer/build.sh``), boot guest
``g1`` (10.77.0.2, rxe0) with ``boot.sh``, and write a ``softverbs link``
table with one UDP device, ``svpeer``, bound to ``br-peer`` (10.77.0.1)
inside the ``rocepeer`` network namespace.  Its GID table is built like
rxe's: index 0 the IPv6 link-local address, index 1 the IPv4-mapped one.
softverbs runs as ``ip netns exec rocepeer python -m softverbs ...``.  At
the end, ``boot.sh down`` stops the guest and deletes the namespace.

Each transport runs in both directions: softverbs client -> ``ibv_*_pingpong``
server in the guest, and the guest's client -> softverbs server.  RC also
runs over the IPv6 link-local GIDs (``-g 0``) and with ``-e`` on both sides.
One run of each transport is captured on ``br-peer`` (``boot.sh cap-start``):
every RoCEv2 frame must carry a valid ICRC, both ends must use rxe's UDP
source ports and zero UDP checksums, and the guest's ``hw_counters`` must show
that rxe accepted every packet we sent (``rcvd_pkts`` counts packets that
passed its header and ICRC checks) with no sequence errors.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pingpong_kit import ROOT, Run, check_pair, finish, wait_listening
from rxe_kit import (
    DEV,
    GUEST_IP,
    HOST_IP,
    NS,
    OUT,
    RUN_TIMEOUT,
    SIZES,
    Peer,
)

from softverbs.fabric.udp import GSO_ENV

pytestmark = pytest.mark.interop

def softverbs_client(peer: Peer, kind: str, args: list[str]) -> tuple[Run, Run]:
    """Guest server, softverbs client: (guest's run, ours)."""
    peer.guest_server(kind, " ".join(args))
    ours = finish(peer.ours(kind, *args, GUEST_IP), RUN_TIMEOUT)
    return peer.guest_server_result(), ours


def softverbs_server(peer: Peer, kind: str, args: list[str]) -> tuple[Run, Run]:
    """softverbs server, guest client: (ours, guest's run)."""
    server = peer.ours(kind, *args)
    try:
        wait_listening(18515, server, read=peer.ns_read)
        guest = peer.guest_client(kind, " ".join(args))
    finally:
        ours = finish(server, 30 if server.poll() is None else 5)
    return ours, guest


def _args(kind: str, gid: int = 1, iters: int = 100, *extra: str) -> list[str]:
    return ["-g", str(gid), "-n", str(iters), "-s", str(SIZES[kind]), *extra]


@pytest.mark.parametrize("kind", ["rc", "uc", "ud"])
def test_softverbs_client_rxe_server(clean: Peer, kind: str) -> None:
    guest, ours = softverbs_client(clean, kind, _args(kind))
    check_pair(guest, ours, SIZES[kind], 100)
    assert ours.address("local")[3] == f"::ffff:{HOST_IP}"
    assert ours.address("remote")[3] == f"::ffff:{GUEST_IP}"


@pytest.mark.parametrize("kind", ["rc", "uc", "ud"])
def test_rxe_client_softverbs_server(clean: Peer, kind: str) -> None:
    ours, guest = softverbs_server(clean, kind, _args(kind))
    check_pair(ours, guest, SIZES[kind], 100)


@pytest.mark.parametrize("direction", ["softverbs-client", "rxe-client"])
def test_rc_ipv6_link_local(clean: Peer, direction: str) -> None:
    """-g 0: RoCEv2 over IPv6 between the link-local GIDs (zero UDP checksums both ways)."""
    args = _args("rc", gid=0, iters=50)
    if direction == "softverbs-client":
        guest, ours = softverbs_client(clean, "rc", args)
    else:
        ours, guest = softverbs_server(clean, "rc", args)
    check_pair(ours, guest, SIZES["rc"], 50)
    assert ours.address("local")[3].startswith("fe80::")
    assert ours.address("remote")[3] == "fe80::5054:ff:fe4d:2"


@pytest.mark.parametrize("kind", ["rc", "ud"])
def test_events_both_sides(clean: Peer, kind: str) -> None:
    guest, ours = softverbs_client(clean, kind, _args(kind, 1, 50, "-e"))
    check_pair(guest, ours, SIZES[kind], 50)


@pytest.mark.parametrize("gso", ["gso", "no-gso"])
@pytest.mark.parametrize("kind", ["rc", "uc", "ud"])
def test_capture_icrc_ports_and_rxe_counters(clean: Peer, kind: str, gso: str) -> None:
    """One captured run: every frame valid, ours shaped like rxe's, rxe took them all.

    With segmentation offload (the default) a multi-packet message leaves as a
    GSO run, which carries a UDP checksum: rxe must accept every such frame.
    With ``SOFTVERBS_UDP_GSO=0`` every frame has rxe's own zero checksum."""
    from scapy.all import IP, UDP, rdpcap  # type: ignore[import-untyped]

    from softverbs.wire.codec import decode_frame
    from softverbs.wire.opcodes import ROCEV2_PORT
    from softverbs.wire.packet import qp_sport, udp_sport

    iters = 50
    pcap = OUT / f"softverbs_{kind}_interop.pcap"
    before = clean.counters()
    r = clean.sh("cap-start", f"sv{kind}", str(pcap), "udp", "port", "4791", "or", "tcp",
                 "port", "18515")  # fmt: skip
    assert r.returncode == 0, r.stderr
    clean.env[GSO_ENV] = "1" if gso == "gso" else "0"
    try:
        guest, ours = softverbs_client(clean, kind, _args(kind, 1, iters))
    finally:
        clean.env.pop(GSO_ENV, None)
        clean.sh("cap-stop", f"sv{kind}")
    after = clean.counters()
    check_pair(guest, ours, SIZES[kind], iters)

    our_qpn = int(ours.address("local")[1], 16)
    rxe_qpn = int(ours.address("remote")[1], 16)
    frames = [p for p in rdpcap(str(pcap)) if UDP in p and p[UDP].dport == ROCEV2_PORT]
    mine = [p for p in frames if p[IP].src == HOST_IP]
    theirs = [p for p in frames if p[IP].src == GUEST_IP]
    assert mine and theirs, f"nothing captured in {pcap}"
    for p in frames:
        decode_frame(bytes(p))  # raises WireError on a bad ICRC
    # rxe: a UD QP keeps its creation port; RC and UC take the port of the QP pair
    if kind == "ud":
        ports = {HOST_IP: qp_sport(our_qpn), GUEST_IP: qp_sport(rxe_qpn)}
    else:
        ports = {HOST_IP: udp_sport(our_qpn, rxe_qpn), GUEST_IP: udp_sport(rxe_qpn, our_qpn)}
    for p in frames:
        assert p[UDP].sport == ports[p[IP].src], p.summary()
        assert p[IP].flags.DF, p.summary()
        if p[IP].src == GUEST_IP or gso == "no-gso":
            assert p[UDP].chksum == 0, p.summary()
        # A GSO run's checksum is not checked here: the capture on the bridge can see
        # it before the offload fills it in.  rxe's counters below say it was taken.
    if gso == "gso" and kind != "ud":  # multi-packet messages left as GSO runs
        assert any(p[UDP].chksum for p in mine), "no GSO run was captured"
    # rxe counts a packet in rcvd_pkts only after its header and ICRC checks
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["rcvd_pkts"] == len(mine), (delta, len(mine))
    assert delta["rcvd_seq_err"] == 0, delta
    assert delta["rdma_recvs"] == iters and delta["rdma_sends"] == iters, delta
    print(f"\n{pcap}: {len(mine)} RoCEv2 frames from softverbs, {len(theirs)} from rxe; "
          f"rxe counter deltas: { {k: v for k, v in delta.items() if v} }")


# --- unmodified C programs on softverbs (libibverbs.so.1) against rxe ----------------------
#: (tool, the arguments both ends take); perftest and the ping-pongs use TCP port 18515
C_TOOLS = [
    ("ibv_rc_pingpong", "-g 1 -n 50"),
    ("ibv_rc_pingpong", "-g 1 -n 50 -e"),
    ("ibv_uc_pingpong", "-g 1 -n 50"),
    ("ibv_ud_pingpong", "-g 1 -n 50"),
    ("ibv_srq_pingpong", "-g 1 -n 50"),
    ("ib_write_bw", "-x 1 -n 200"),
    ("ib_write_lat", "-x 1 -n 200"),
    ("ib_send_bw", "-x 1 -n 200"),
    ("ib_send_lat", "-x 1 -n 200"),
    ("ib_read_bw", "-x 1 -n 200"),
    ("ib_read_lat", "-x 1 -n 200"),
    ("ib_atomic_bw", "-x 1 -n 200"),
    ("ib_atomic_lat", "-x 1 -n 200"),
    ("ib_send_bw", "-x 1 -n 200 -c UD"),
    ("ib_send_lat", "-x 1 -n 200 -c UD"),
    ("ib_send_lat", "-x 1 -n 200 -c UD -e"),
    ("ib_send_bw", "-x 1 -n 200 -e"),
    ("ib_send_lat", "-x 1 -n 200 -e"),
    ("ib_read_bw", "-x 1 -n 200 -e"),
    ("ib_atomic_lat", "-x 1 -n 200 -e"),
]
C_IDS = [f"{t} {a}" for t, a in C_TOOLS]


def _c_env(peer: Peer, tmp: Path) -> dict[str, str]:
    """A private host device for the C programs, started inside the namespace (by the
    first program) with the link table that puts ``svpeer`` on br-peer."""
    return {**peer.env, "SOFTVERBS_SERVICE": str(tmp / "sv.sock")}


def _ours_c(env: dict[str, str], tool: str, args: str, *extra: str) -> subprocess.Popen[str]:
    device = [] if tool == "rping" else ["-d", DEV]  # rping finds its device by address
    cmd = ["ip", "netns", "exec", NS, sys.executable, "-m", "softverbs", "exec", "--", tool,
           *device, *args.split(), *extra]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip


#: perftest could not calibrate its clock: get_cpu_mhz() fits rdtsc against gettimeofday
#: and gives 0 MHz when the fit is worse than r^2 0.9, which a TCG guest on a busy host
#: can do; every latency column is then "inf", while the row still counts the iterations
CLOCK_UNCALIBRATED = "Correlation coefficient r^2"


def _c_ok(tool: str, out: str) -> bool:
    if tool.startswith("ibv_"):
        return re.search(r"^\d+ iters in [\d.]+ seconds = [\d.]+ usec/iter$", out, re.M) is not None
    figure = r"(?:[\d.]+|inf)" if CLOCK_UNCALIBRATED in out else r"[\d.]+"
    return re.search(rf"^ \d+\s+\d+\s+{figure}", out, re.M) is not None  # perftest's result row


@pytest.mark.parametrize(("tool", "args"), C_TOOLS, ids=C_IDS)
def test_c_tool_softverbs_client_rxe_server(clean: Peer, tool: str, args: str,
                                            tmp_path: Path) -> None:  # fmt: skip
    """Debian's binary on softverbs (through libibverbs.so.1) against the same binary
    on rxe: softverbs connects to the guest's server."""
    env = _c_env(clean, tmp_path)
    clean.guest(f"({tool} -d rxe0 {args} > /tmp/pp.out 2>&1; echo PP_EXIT $? >> /tmp/pp.out) &")
    listening = "netstat -ltn | grep -q ':18515 '"
    rc, out = clean.guest(f"for i in $(seq 200); do {listening} && break; sleep 0.1; done; "
                          f"{listening}")  # fmt: skip
    assert rc == 0, f"{tool} did not listen in the guest: {out}"
    try:
        ours = _ours_c(env, tool, args, GUEST_IP)
        out, _ = ours.communicate(timeout=RUN_TIMEOUT)
        guest = clean.guest_server_result()
    finally:
        subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-m", "softverbs", "service",
                        "stop"], env=env, capture_output=True, timeout=60, check=False)
    assert ours.returncode == 0 and _c_ok(tool, out), out
    assert guest.returncode == 0, guest
    if tool.startswith("ibv_"):
        assert _c_ok(tool, guest.stdout), guest


@pytest.mark.parametrize(("tool", "args"), C_TOOLS, ids=C_IDS)
def test_c_tool_rxe_client_softverbs_server(clean: Peer, tool: str, args: str,
                                            tmp_path: Path) -> None:  # fmt: skip
    """The guest's client connects to Debian's binary serving on softverbs."""
    env = _c_env(clean, tmp_path)
    server = _ours_c(env, tool, args)
    try:
        wait_listening(18515, server, read=clean.ns_read)
        rc, gout = clean.guest(f"{tool} -d rxe0 {args} {HOST_IP}", timeout=RUN_TIMEOUT)
        out, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-m", "softverbs", "service",
                        "stop"], env=env, capture_output=True, timeout=60, check=False)
    assert rc == 0, gout
    assert server.returncode == 0, out
    # (a string, which pytest prints whole: a tuple's repr is cut to a few lines)
    assert _c_ok(tool, gout if not tool.startswith("ibv_") else out), f"{out}\n---\n{gout}"


@pytest.mark.parametrize("direction", ["softverbs-client", "rxe-client"])
def test_rping_against_rxe(clean: Peer, direction: str, tmp_path: Path) -> None:
    """librdmacm: rping through softverbs' librdmacm.so.1 against rping on rxe, the
    connection made by IBTA CM MADs on QP1 between the two."""
    env = _c_env(clean, tmp_path)
    args = "-v -C 3 -p 7999"
    try:
        if direction == "softverbs-client":
            clean.guest(f"(rping -s -a {GUEST_IP} {args} > /tmp/pp.out 2>&1; "
                        "echo PP_EXIT $? >> /tmp/pp.out) &")  # fmt: skip
            time.sleep(3)  # a CM listen has no TCP port to watch
            ours = _ours_c(env, "rping", f"-c -a {GUEST_IP} {args}")
            out, _ = ours.communicate(timeout=RUN_TIMEOUT)
            guest = clean.guest_server_result()
            rc, gout = guest.returncode, guest.stdout
        else:
            ours = _ours_c(env, "rping", f"-s -a {HOST_IP} {args}")
            time.sleep(5)  # the service starts, then the listen
            rc, gout = clean.guest(f"rping -c -a {HOST_IP} {args}", timeout=RUN_TIMEOUT)
            out, _ = ours.communicate(timeout=60)
    finally:
        subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-m", "softverbs", "service",
                        "stop"], env=env, capture_output=True, timeout=60, check=False)
    assert ours.returncode == 0 and rc == 0, (out, gout)
    for text in (out, gout):
        assert len(re.findall(r"ping data: rdma-ping-\d+", text)) == 3, text


# --- librdmacm programs (the IBTA CM on QP1 between the two) ------------------------------
PERFTEST_R = ("ib_send_bw", "ib_read_bw", "ib_write_bw", "ib_send_lat", "ib_write_lat",
              "ib_read_lat")  # fmt: skip
#: (name, server arguments, client arguments (after them: the server's address), what each
#: side prints on success); {dev} is the device, {ip} the server's address, {port} the port
CM_TOOLS = [
    ("ucmatose", "ucmatose -b {ip} -p {port} -c 2", "ucmatose -s {ip} -p {port} -c 2",
     ("return status 0", "return status 0")),
    ("udaddy", "udaddy -b {ip}", "udaddy -s {ip}",  # its port is fixed: 7174
     ("return status 0", "return status 0")),
    ("rdma_server", "rdma_server -s {ip} -p {port}", "rdma_client -s {ip} -p {port}",
     ("rdma_server: end 0", "rdma_client: end 0")),
    *((f"{t} -R", f"{t} -d {{dev}} -x 1 -R -n 100 -p {{port}}",
       f"{t} -d {{dev}} -x 1 -R -n 100 -p {{port}} {{ip}}", ("", "")) for t in PERFTEST_R),
]  # fmt: skip
CM_IDS = [name for name, *_ in CM_TOOLS]
#: perftest 4.5-0.17's -R race (tests/native/test_c_tools.py): a REQ before its
#: server's second listen is rejected, as the kernel rejects it
PERFTEST_RACE = "RDMA_CM_EVENT_REJECTED; error: 8"


def _port(server: str) -> int:
    return 7174 if server.startswith("udaddy") else 7471


def _guest_cm_listening(peer: Peer, port: int) -> bool:
    _, out = peer.guest("rdma res show cm_id")
    return re.search(rf"state LISTEN .* src-addr [\d.]+:{port}\b", out) is not None


def _ours_cm_listening(env: dict[str, str], port: int) -> bool:
    r = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-m", "softverbs", "service",
                        "status", "-j"], env=env, capture_output=True, text=True, timeout=60,
                       check=False)  # fmt: skip
    return r.returncode == 0 and port in json.loads(r.stdout).get("cm_listening", [])


def _wait(what: str, ready: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{what} did not listen within {timeout:.0f} s"
        time.sleep(0.2)


def _ours_argv(command: str) -> list[str]:
    return ["ip", "netns", "exec", NS, sys.executable, "-m", "softverbs", "exec", "--",
            *command.split()]  # fmt: skip


def _cm_run(peer: Peer, env: dict[str, str], server: str, client: str, direction: str,
            port: int) -> tuple[Run, Run]:  # fmt: skip
    """(server's run, client's run) of one pair; softverbs is the client or the server."""
    if direction == "softverbs-client":
        peer.guest(f"killall -q ucmatose udaddy rdma_server {' '.join(PERFTEST_R)}; true")
        peer.guest(f"({server} > /tmp/pp.out 2>&1; echo PP_EXIT $? >> /tmp/pp.out) &")
        _wait("the guest's server", lambda: _guest_cm_listening(peer, port))
        ours = subprocess.run(_ours_argv(client), cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT, check=False)  # fmt: skip
        theirs = peer.guest_server_result(timeout=60 if ours.returncode == 0 else 5)
        if theirs.returncode == 124:
            peer.guest("killall -q " + server.split()[0] + "; true")
        return theirs, Run(ours.returncode, ours.stdout, ours.stderr)
    proc = subprocess.Popen(_ours_argv(server), cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    rc, gout = -1, ""
    try:
        _wait("softverbs' server", lambda: _ours_cm_listening(env, port))
        rc, gout = peer.guest(client, timeout=RUN_TIMEOUT)
    finally:
        ours = finish(proc, 60 if proc.poll() is None and rc == 0 else 5)
    return ours, Run(rc, gout, "")


@pytest.mark.parametrize("direction", ["softverbs-client", "rxe-client"])
@pytest.mark.parametrize(("name", "server", "client", "expect"), CM_TOOLS, ids=CM_IDS)
def test_rdma_cm_tools_against_rxe(clean: Peer, name: str, server: str, client: str,
                                   expect: tuple[str, str], direction: str,
                                   tmp_path: Path) -> None:  # fmt: skip
    """rdmacm-utils and perftest -R through softverbs' librdmacm.so.1 against the same
    binaries on rxe: the connection is made by CM MADs on QP1, the data moves on the
    wire.  (ibv_xsrq_pingpong cannot run against rxe: rxe has no XRC, and its
    ibv_open_xrcd fails with EOPNOTSUPP.)"""
    env = _c_env(clean, tmp_path)
    port = _port(server)
    ours_ip, theirs_ip = HOST_IP, GUEST_IP
    server_ip = ours_ip if direction == "rxe-client" else theirs_ip
    dev = {"softverbs-client": ("rxe0", DEV), "rxe-client": (DEV, "rxe0")}[direction]
    srv = server.format(dev=dev[0], ip=server_ip, port=port)
    cli = client.format(dev=dev[1], ip=server_ip, port=port)
    try:
        for _attempt in range(8):
            s, c = _cm_run(clean, env, srv, cli, direction, port)
            if not (name.endswith("-R") and c.returncode != 0
                    and PERFTEST_RACE in c.stdout + c.stderr):  # fmt: skip
                break
    finally:
        subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-m", "softverbs", "service",
                        "stop"], env=env, capture_output=True, timeout=60, check=False)
    assert c.returncode == 0, f"client:\n{c}\nserver:\n{s}"
    assert s.returncode == 0, f"server:\n{s}\nclient:\n{c}"
    for run, text in ((s, expect[0]), (c, expect[1])):
        assert text in run.stdout, run
    if name.endswith("-R"):
        assert re.search(r"^ \d+\s+100\s+[\d.]+", c.stdout, re.M), c  # perftest's result row


#: Sends a RoCEv2 CNP (opcode 0x81, BECN, 16 reserved bytes, ICRC) from the host
#: address to the guest's QP argv[4], every 2 ms, for argv[1] seconds.
CNP_FLOOD = """
import socket, sys, time
from softverbs.wire.codec import encode_udp_payload
from softverbs.wire.opcodes import CNP_OPCODE, ROCEV2_PORT
from softverbs.wire.packet import Packet
src, dst = socket.inet_aton(sys.argv[2]), socket.inet_aton(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[2], 0))
sport = s.getsockname()[1]
end, n = time.monotonic() + float(sys.argv[1]), 0
while time.monotonic() < end:
    cnp = Packet(CNP_OPCODE, int(sys.argv[4]), 0, bytes(16))
    cnp.becn, cnp.pkey = True, 0xFFFF
    s.sendto(encode_udp_payload(cnp, src, dst, sport), (sys.argv[3], ROCEV2_PORT))
    n += 1
    time.sleep(0.002)
print("CNPS", n)
"""


def test_rxe_ignores_cnps_while_softverbs_runs_dcqcn(clean: Peer, tmp_path: Path) -> None:
    """rxe has no congestion control: CNPs sent to its QPs while a ping-pong runs
    against a softverbs device with DCQCN on (ECT(0) on every packet it sends)
    change nothing -- the ping-pong completes intact both ways."""
    cfg = tmp_path / "links.json"
    cfg.write_text(json.dumps({"links": [{"name": DEV, "netdev": "br-peer", "cc": "dcqcn",
                                          "cc_params": {"min_time_between_cnps": 0}}]}))
    env = {**clean.env, "SOFTVERBS_CONFIG": str(cfg)}
    args = _args("rc", iters=200)
    clean.guest_server("rc", " ".join(args))
    # the CNPs go to the guest server's own QP (it exists once the server listens)
    _, res = clean.guest("rdma res show qp")
    m = re.search(r"lqpn (\d+) .*type RC .*comm ibv_rc_pingpong", res)
    assert m, f"no RC QP of ibv_rc_pingpong in the guest: {res}"
    flood = subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, "-c", CNP_FLOOD, "20",
                              HOST_IP, GUEST_IP, m.group(1)], cwd=ROOT, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        ours = finish(clean.ours("rc", *args, GUEST_IP, env=env), RUN_TIMEOUT)
        guest = clean.guest_server_result()
        check_pair(guest, ours, SIZES["rc"], 200)
    finally:
        out, err = flood.communicate(timeout=60)
    assert flood.returncode == 0, err
    assert int(out.split()[-1]) > 0, out  # CNPs were sent to rxe throughout
