"""softverbs UDP devices in separate network namespaces, as separate hosts.

Each test builds its own namespaces (``conftest.make_topology``), starts a
server agent and one or two client agents (``agent.py``) in them, and judges
the ``RESULT`` lines they print.  See ``agent.py`` for what each scenario
does on the wire.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest
from netns_kit import AgentProc, Topology

from softverbs.enums import (
    IBV_EVENT_QP_ACCESS_ERR,
    IBV_QPS_ERR,
    IBV_WC_BIND_MW,
    IBV_WC_COMP_SWAP,
    IBV_WC_FETCH_ADD,
    IBV_WC_LOCAL_INV,
    IBV_WC_RDMA_READ,
    IBV_WC_RDMA_WRITE,
    IBV_WC_RECV,
    IBV_WC_RECV_RDMA_WITH_IMM,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_RETRY_EXC_ERR,
    IBV_WC_SEND,
    IBV_WC_SUCCESS,
    IBV_WC_WITH_IMM,
    IBV_WC_WITH_INV,
    IBV_WC_WR_FLUSH_ERR,
)

pytestmark = pytest.mark.netns

V0, V1 = 0x1122334455667788, 0x0102030405060708


def finish(agents: list[AgentProc], timeout: float) -> list[dict[str, Any]]:
    """Wait for every agent; all must exit 0 with a RESULT line saying ok."""
    end = time.monotonic() + timeout
    codes = [a.wait(max(1.0, end - time.monotonic())) for a in agents]
    results = [a.result() for a in agents]
    failed = [
        f"{a.name}: exit {rc}, errors {res.get('errors')}\n{res.get('traceback', '')}\n"
        f"{a.diagnostics()}"
        for a, rc, res in zip(agents, codes, results, strict=True)
        if rc != 0 or not res.get("ok")
    ]
    assert not failed, "\n".join(failed)
    for res in results:
        assert not any(t.startswith("softverbs") for t in res["threads_left"]), res
    return results


def run_pair(topo: Topology, scenario: str, *extra: str, timeout: float = 40,
             env: dict[str, str] | None = None, client_env: dict[str, str] | None = None
             ) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """Server on host 0, client on host 1: their RESULTs."""
    h0, h1 = topo.hosts[0], topo.hosts[1]
    server = topo.agent(h0, "server", scenario, *extra, env=env, deadline=timeout - 5)
    server.wait_line("LISTENING", 15)
    client = topo.agent(h1, "client", scenario, *extra, env=client_env or env,
                        deadline=timeout - 5)  # fmt: skip
    s, c = finish([server, client], timeout)
    return s, c


def statuses(wcs: list[dict[str, Any]]) -> list[int]:
    return [w["status"] for w in wcs]


# --- (a) every opcode -------------------------------------------------------------------------
@pytest.mark.parametrize("gid", ["ipv4", "ipv6-ll"])
def test_rc_every_opcode(make_topology: Any, gid: str) -> None:
    topo = make_topology(hosts=2, mtu=1500)  # IB MTU 1024: multi-packet messages
    s, c = run_pair(topo, "rc_opcodes", "--gid", gid)
    assert s["gid_index"] == c["gid_index"] == (0 if gid == "ipv6-ll" else 1)
    sent = c["send_wcs"]
    assert statuses(sent) == [IBV_WC_SUCCESS] * 10, sent
    assert [w["opcode"] for w in sent] == [
        IBV_WC_SEND, IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ,
        IBV_WC_COMP_SWAP, IBV_WC_COMP_SWAP, IBV_WC_FETCH_ADD, IBV_WC_RDMA_WRITE, IBV_WC_SEND,
    ]  # fmt: skip
    assert sent[4]["byte_len"] == 10000 and sent[5]["byte_len"] == 8
    # receives: SEND, SEND_WITH_IMM, WRITE_WITH_IMM, SEND_WITH_INV
    rw = s["recv_wcs"]
    assert statuses(rw) == [IBV_WC_SUCCESS] * 4, rw
    assert [w["opcode"] for w in rw] == [IBV_WC_RECV, IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM,
                                         IBV_WC_RECV]  # fmt: skip
    assert [w["byte_len"] for w in rw] == [5000, 100, 2000, 64]
    assert rw[0]["wc_flags"] == 0
    assert rw[1]["wc_flags"] & IBV_WC_WITH_IMM and rw[1]["imm_data"] == 0xC0FFEE01
    assert rw[2]["wc_flags"] & IBV_WC_WITH_IMM and rw[2]["imm_data"] == 0xC0FFEE02
    assert rw[3]["wc_flags"] & IBV_WC_WITH_INV and rw[3]["invalidated_rkey"] == s["mw_rkey"]
    # data
    sha = c["sent_sha"]
    assert s["recv_sha"][0] == sha["send"] and s["recv_sha"][1] == sha["simm"]
    assert s["recv_sha"][3] == sha["inv"]
    assert s["write_sha"] == sha["write"] and s["wimm_sha"] == sha["wimm"]
    assert s["mw_write_sha"] == sha["mww"]  # the WRITE through the server's type 2 window
    # READ
    import hashlib
    import random as _r

    assert c["read_sha"] == hashlib.sha256(_r.Random("read").randbytes(10000)).hexdigest()
    # atomics: original values, and the final word
    assert c["atomic_orig"] == [V0, V1, V1]
    assert s["atomic_final"] == V1 + 5
    # memory windows: BIND_MW on both sides, LOCAL_INV, SEND_WITH_INV invalidated
    assert c["bind_wc"]["status"] == IBV_WC_SUCCESS and c["bind_wc"]["opcode"] == IBV_WC_BIND_MW
    assert statuses(s["mw_c_wcs"]) == [IBV_WC_SUCCESS] * 2 and c["mw_c_match"]
    assert c["local_inv_wc"]["status"] == IBV_WC_SUCCESS
    assert c["local_inv_wc"]["opcode"] == IBV_WC_LOCAL_INV
    assert c["rebind_after_local_inv"]["status"] == IBV_WC_SUCCESS
    assert s["rebind_after_send_inv"]["status"] == IBV_WC_SUCCESS
    # the invalidated rkey: a remote access error on both ends
    assert c["neg_wc"]["status"] == IBV_WC_REM_ACCESS_ERR, c["neg_wc"]
    assert c["qp_state"] == IBV_QPS_ERR and s["qp_state"] == IBV_QPS_ERR
    assert s["async_event"]["type"] == IBV_EVENT_QP_ACCESS_ERR
    assert s["flush_wc"]["status"] == IBV_WC_WR_FLUSH_ERR and s["flush_wc"]["wr_id"] == 99


@pytest.mark.parametrize("gid", ["ipv4", "ipv6-ll"])
def test_uc_and_ud(make_topology: Any, gid: str) -> None:
    topo = make_topology(hosts=2, mtu=1500)
    s, c = run_pair(topo, "uc_ud", "--gid", gid)
    assert statuses(c["uc_wcs"]) == [IBV_WC_SUCCESS] * 4
    assert statuses(c["ud_wcs"]) == [IBV_WC_SUCCESS] * 2
    rw = s["recv_wcs"]
    assert statuses(rw) == [IBV_WC_SUCCESS] * 5, rw
    by_id = {w["wr_id"]: w for w in rw}
    sha = c["sent_sha"]
    # UC: SEND, SEND_WITH_IMM, WRITE (no receive), WRITE_WITH_IMM
    assert by_id[0]["byte_len"] == 3000 and s["recv_sha"]["0"] == sha["uc_send"]
    assert by_id[1]["imm_data"] == 0xAB and s["recv_sha"]["1"] == sha["uc_simm"]
    assert by_id[2]["opcode"] == IBV_WC_RECV_RDMA_WITH_IMM and by_id[2]["imm_data"] == 0xCD
    assert s["write_sha"] == sha["uc_write"]
    # UD: GRH first, the sender's QPN and address
    mtu = 1024
    assert by_id[10]["byte_len"] == 40 + 512 and s["recv_sha"]["10"] == sha["ud_send"]
    assert by_id[11]["byte_len"] == 40 + mtu and s["recv_sha"]["11"] == sha["ud_simm"]
    assert by_id[11]["imm_data"] == 0xEF
    assert by_id[10]["src_qp"] == by_id[11]["src_qp"] == c["ud_qpn"]
    if gid == "ipv4":
        assert s["grh_src"]["10"] == topo.hosts[1].ip
    else:
        assert s["grh_src"]["10"].startswith("fe80:")


def test_ud_multicast_over_the_link(make_topology: Any) -> None:
    """A UD SEND to 239.7.7.7 (GID ::ffff:239.7.7.7, QP 0xFFFFFF) leaves as an IP
    multicast datagram: the member on the other host gets it across the veth
    (its device joined the IP group), and the sender's own device gets it
    through the kernel's multicast loopback."""
    topo = make_topology(hosts=2, mtu=1500)
    s, c = run_pair(topo, "mcast")
    assert statuses(c["send_wcs"]) == [IBV_WC_SUCCESS] * 3
    assert s["recv_sha"] == c["sent_sha"], (s, c)
    assert c["loop_sha"] == c["sent_sha"], c
    assert c["counters"]["mcast_sent_pkts"] == 3, c["counters"]


def test_device_opens_while_ipv6_addresses_are_tentative(make_topology: Any) -> None:
    """Devices opened right after the links come up, during IPv6 duplicate address
    detection: they open, with the link-local GID first, and IPv4 traffic flows."""
    topo = make_topology(hosts=2, mtu=1500, dad=True)
    h0 = topo.hosts[0]
    r = topo.exec_ns(h0.ns, "ip", "-6", "addr", "show", "dev", h0.ifname, "tentative")
    if "inet6" not in r.stdout:
        pytest.skip("duplicate address detection finished before the test could start")
    s, c = run_pair(topo, "uc_ud")
    assert s["gid_index"] == c["gid_index"] == 1  # 0 is the (tentative) link-local GID
    assert statuses(s["recv_wcs"]) == [IBV_WC_SUCCESS] * 5


# --- (b) 64 MiB messages ----------------------------------------------------------------------
def test_large_messages(make_topology: Any, record_property: Any) -> None:
    topo = make_topology(hosts=2, mtu=9000)  # IB MTU 4096
    t = time.monotonic()
    s, c = run_pair(topo, "large", timeout=150)
    total = time.monotonic() - t
    assert s["write_sha"] == c["src_sha"], "64 MiB RDMA WRITE arrived damaged"
    assert s["send_sha"] == c["src_sha"], "64 MiB SEND arrived damaged"
    assert s["recv_wc"]["byte_len"] == 64 << 20
    assert c["read_sha"]  # compared with the server's hash inside the agent
    for name, wc in c["wcs"].items():
        assert wc["status"] == IBV_WC_SUCCESS, (name, wc)
    record_property("times_s", c["times"])
    print(
        f"64 MiB WRITE/SEND/READ seconds {c['times']}, MB/s {c['mb_per_s']}, "
        f"total {total:.1f}s; counters client {c['counters']} server {s['counters']}"
    )


@pytest.mark.parametrize("mib", [2, pytest.param(8, marks=pytest.mark.slow)])
def test_large_messages_under_loss(make_topology: Any, mib: int) -> None:
    """Messages longer than the requester's window (DEFAULT_WINDOW, 1024 packets at IB MTU
    1024), with 2% loss: go-back-N retransmissions that fill the window, and READs asked
    for in pieces."""
    seed = _seed()
    rules = "drop=0.02;reorder=0.05;reorder_delay=0.002"
    why = f"SOFTVERBS_FAULTS seed={seed} (rerun with SOFTVERBS_NETNS_SEED={seed})"
    print(why)
    topo = make_topology(hosts=2, mtu=1500)
    s, c = run_pair(topo, "large", "--size", str(mib << 20), timeout=60 if mib <= 2 else 300,
                    env={"SOFTVERBS_FAULTS": f"seed={seed};{rules}"},
                    client_env={"SOFTVERBS_FAULTS": f"seed={seed + 1};{rules}"})  # fmt: skip
    assert s["write_sha"] == c["src_sha"] and s["send_sha"] == c["src_sha"], why
    assert c["counters"].get("completer_retry_err", 0) > 0, (why, c["counters"])
    print(f"{why}: {mib} MiB WRITE/SEND/READ seconds {c['times']}")


# --- (c) loss and reordering ------------------------------------------------------------------
def check_streams(s: dict[str, Any], c: dict[str, Any], count: int, why: str) -> None:
    st = s["streams"]
    rc, uc, ud = st["rc"], st["uc"], st["ud"]
    assert c["send_status"]["rc"] == {"success": count}, (why, c["send_status"])
    # RC READs return the right bytes, and every atomic ran exactly once, in order
    assert not c["rc_bad"], (why, c["rc_bad"])
    ops = c["rc_ops"]
    assert ops["read"] and ops["faa"] and ops["cas"], ops
    assert s["atomic_final"] == [ops["faa"], ops["cas"]], (why, s["atomic_final"], ops)
    messages = [i for i in range(count) if i % 10 not in (4, 7, 9)]  # agent.rc_messages
    assert rc["received"] == len(messages) and rc["out_of_order"] == 0, (why, rc)
    assert rc["first"] == messages[:3] and rc["last"] == messages[-3:], (why, rc)
    assert rc["dups"] == 0 and rc["corrupt"] == 0 and not rc["bad_status"], (why, rc)
    for name, x in (("uc", uc), ("ud", ud)):
        assert x["corrupt"] == 0 and x["dups"] == 0 and not x["bad_status"], (why, name, x)
        assert 0 < x["received"] <= count, (why, name, x)
    # UC has no duplicate detection: a FIRST/ONLY packet that a reordering network
    # delivers late starts a message (IBA, and rxe's check_psn), so UC order is not checked.


def _seed() -> int:
    env = os.environ.get("SOFTVERBS_NETNS_SEED")
    return int(env) if env else random.randrange(1 << 30)


@pytest.mark.parametrize("count", [300, pytest.param(3000, marks=pytest.mark.slow)])
def test_loss_and_reordering_softverbs_faults(make_topology: Any, count: int) -> None:
    seed = _seed()
    rules = "drop=0.1;reorder=0.1;reorder_delay=0.002"
    why = f"SOFTVERBS_FAULTS seed={seed} (rerun with SOFTVERBS_NETNS_SEED={seed})"
    print(why)
    topo = make_topology(hosts=2, mtu=1500)
    s, c = run_pair(topo, "stream", "--count", str(count), "--qp-timeout", "14",
                    timeout=60 if count < 1000 else 300,
                    env={"SOFTVERBS_FAULTS": f"seed={seed};{rules}"},
                    client_env={"SOFTVERBS_FAULTS": f"seed={seed + 1};{rules}"})  # fmt: skip
    check_streams(s, c, count, why)
    for r in (s, c):
        assert r["fault_stats"].get("dropped", 0) > 0, (why, r["fault_stats"])
        assert r["fault_stats"].get("reordered", 0) > 0, (why, r["fault_stats"])
    assert c["counters"].get("completer_retry_err", 0) > 0, (why, c["counters"])
    print(f"{why}: server {s['streams']}, client retries {c['counters']}")


def test_loss_and_reordering_netem(make_topology: Any) -> None:
    topo = make_topology(hosts=2, mtu=1500)
    why = topo.netem("loss 10% reorder 25% delay 1ms")
    if why is not None:
        pytest.skip(f"kernel netem unavailable: {why}")
    count = 300
    s, c = run_pair(topo, "stream", "--count", str(count), "--qp-timeout", "14", timeout=90)
    check_streams(s, c, count, "netem loss 10% reorder 25% delay 1ms")
    assert c["counters"].get("completer_retry_err", 0) > 0, c["counters"]


# --- (d) a peer killed mid-transfer -----------------------------------------------------------
@pytest.mark.parametrize("ops", ["write_send", "read", "long_write"])
def test_peer_killed_mid_transfer(make_topology: Any, ops: str) -> None:
    """SIGKILL the responder in the middle of a stream of WRITEs and SENDs, of READs,
    or of 4 MiB WRITEs (each longer than the requester's window)."""
    topo = make_topology(hosts=2, mtu=9000)
    h0, h1 = topo.hosts
    before = 20 if ops == "long_write" else 300
    extra = ("--qp-timeout", "14", "--retry-cnt", "2", "--progress-after", str(before),
             "--kill-ops", ops)  # fmt: skip
    server = topo.agent(h0, "server", "kill", *extra, deadline=40)
    server.wait_line("LISTENING", 15)
    client = topo.agent(h1, "client", "kill", *extra, deadline=30)
    early = client.wait_line("PROGRESS", 20)["early_error"]
    server.kill()  # SIGKILL, in the middle of the stream of WRITEs and SENDs
    killed_at = time.monotonic()
    assert server.wait(5) == -9
    (c,) = finish([client], 15)
    exit_s = time.monotonic() - killed_at
    print(
        f"client exited {exit_s:.2f}s after the kill; stall->error {c['stall_to_error_s']}s; "
        f"{c['completed_ok']} of {c['posted']} WRs succeeded"
    )
    assert not early and c["completed_ok"] >= before, f"failed before the kill: {c}"
    assert c["wr_ids_in_order"] and c["ok_prefix"], c
    first = c["first_error"]
    assert first is not None and first["status"] == IBV_WC_RETRY_EXC_ERR, first
    assert first["wr_id"] == c["completed_ok"]  # the first unacknowledged WR
    rest = c["posted"] - c["completed_ok"] - 1
    flushed = {"Work Request Flushed Error": rest} if rest else {}
    assert c["rest_status"] == flushed, c["rest_status"]
    assert c["qp_state"] == IBV_QPS_ERR
    assert c["post_after_err"]["status"] == IBV_WC_WR_FLUSH_ERR
    # timeout 14 (67 ms) x (retry_cnt 2 + 1) is 0.2 s; the rest is process teardown
    assert c["stall_to_error_s"] < 3, c
    assert exit_s < 10


# --- (e) many QPs at once ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("qps", "lossy"),
    [(64, False), (64, True), pytest.param(256, False, marks=pytest.mark.slow),
     pytest.param(256, True, marks=pytest.mark.slow)],
)  # fmt: skip
def test_many_qps(make_topology: Any, qps: int, lossy: bool) -> None:
    topo = make_topology(hosts=2, mtu=9000)
    rounds = 4
    seed = _seed()
    env = {"SOFTVERBS_FAULTS": f"seed={seed};drop=0.1;reorder=0.1;reorder_delay=0.002"}
    if lossy:
        print(f"SOFTVERBS_FAULTS seed={seed} (rerun with SOFTVERBS_NETNS_SEED={seed})")
    s, c = run_pair(topo, "many", "--qps", str(qps), "--rounds", str(rounds),
                    timeout=60 if qps <= 64 else 200, env=env if lossy else None)  # fmt: skip
    assert c["wcs"] == qps * rounds * 3 and not c["bad_status"], c
    assert c["read_mismatches"] == 0
    assert s["received"] == qps * rounds and s["bad"] == 0 and s["in_order"], s
    assert s["region_sha"] == c["region_sha"]
    print(f"{qps} QP pairs: client {c['elapsed_s']}s, server {s['elapsed_s']}s")


# --- (f) three namespaces: one server, two clients at once ------------------------------------
def test_three_hosts_two_clients(make_topology: Any) -> None:
    topo = make_topology(hosts=3, mtu=9000)
    h0, h1, h2 = topo.hosts
    args = ("--qps", "16", "--rounds", "6")
    server = topo.agent(h0, "server", "many", *args, "--clients", "2", deadline=50)
    server.wait_line("LISTENING", 15)
    c1 = topo.agent(h1, "client", "many", *args, "--tag", "c1", deadline=50)
    c2 = topo.agent(h2, "client", "many", *args, "--tag", "c2", deadline=50)
    s, r1, r2 = finish([server, c1, c2], 60)
    sessions = {x["peer"]: x for x in s["sessions"]}
    assert set(sessions) == {h1.ip, h2.ip}
    for host, r in ((h1, r1), (h2, r2)):
        x = sessions[host.ip]
        assert r["wcs"] == 16 * 6 * 3 and not r["bad_status"] and r["read_mismatches"] == 0, r
        assert x["received"] == 16 * 6 and x["bad"] == 0 and x["in_order"], x
        assert x["region_sha"] == r["region_sha"]
