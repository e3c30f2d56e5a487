"""``softverbs res`` and ``softverbs stat qp``: what every process holds on the
host device, in ``rdma resource``'s and ``rdma statistic qp``'s lines.

A private softverbsd serves the module; a program (its own process) connects
two RC QPs, sends five messages from one to the other, makes a UD QP it
leaves in RESET, and waits while the tests look at it from the command line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clikit import TIMEOUT, assert_user_error, cli_env, softverbs_cli

#: SEND messages the program sends from QP a to QP b, each acknowledged alone
SENDS = 5

APP = f"""
import json, os, sys
from softverbs import (AHAttr, CQ, Context, GlobalRoute, MR, PD, QP, QPAttr, QPCap,
                       QPInitAttr, RecvWR, SGE, SendWR)
from softverbs.enums import IBV_ACCESS_LOCAL_WRITE, IBV_QPT_RC, IBV_QPT_UD, IBV_WR_SEND

ctx = Context(name="sv0")
pd, cq = PD(ctx), CQ(ctx, 16)
cap = QPCap(max_send_wr=4, max_recv_wr=4)
init = QPInitAttr(qp_type=IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)
a, b = QP(pd, init, QPAttr()), QP(pd, init, QPAttr())
ud = QP(pd, QPInitAttr(qp_type=IBV_QPT_UD, scq=cq, rcq=cq, cap=cap))  # stays in RESET
gid = ctx.query_gid(port_num=1, index=1)
for qp, peer in ((a, b), (b, a)):
    attr = QPAttr()
    attr.dest_qp_num = peer.qp_num
    attr.ah_attr = AHAttr(is_global=1, gr=GlobalRoute(dgid=gid, sgid_index=1))
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 1
    qp.to_rts(attr)
mr = MR(pd, 4096, IBV_ACCESS_LOCAL_WRITE)
for i in range({SENDS}):  # one at a time: each SEND is acknowledged by an ACK of its own
    b.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(mr.buf + 64, 64, mr.lkey)]))
    a.post_send(SendWR(wr_id=2, opcode=IBV_WR_SEND, num_sge=1, sg=[SGE(mr.buf, 16, mr.lkey)]))
    wcs = []
    while len(wcs) < 2:
        wcs += cq.poll(2)[1]
    assert all(wc.status == 0 for wc in wcs), wcs
print(json.dumps({{"pid": os.getpid(), "a": a.qp_num, "b": b.qp_num, "ud": ud.qp_num,
                  "lkey": mr.lkey, "rkey": mr.rkey, "iova": mr.buf, "cqe": cq.cqe}}), flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="svres", dir="/tmp"))  # a Unix socket path is short
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def sock(workdir: Path) -> Iterator[str]:
    """A private softverbsd, started and stopped as a user does."""
    path = str(workdir / "sv.sock")
    r = softverbs_cli(workdir, "service", "start", "--socket", path)
    assert r.returncode == 0, r.stderr
    yield path
    softverbs_cli(workdir, "service", "stop", "--socket", path)


def run(workdir: Path, sock: str, *args: str) -> subprocess.CompletedProcess[str]:
    r = softverbs_cli(workdir, *args, SOFTVERBS_SERVICE=sock)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stderr == "", r.stderr
    return r


def test_a_device_without_resources(workdir: Path, sock: str) -> None:
    # before any program: the device exists and holds nothing (rdma prints the zeros)
    r = run(workdir, sock, "res")
    assert r.stdout == "0: sv0: pd 0 cq 0 qp 0 cm_id 0 mr 0 ctx 0 srq 0\n"
    assert run(workdir, sock, "res", "show", "qp").stdout == ""
    assert json.loads(run(workdir, sock, "res", "show", "qp", "-j").stdout) == []
    assert run(workdir, sock, "stat", "qp").stdout == ""


@pytest.fixture(scope="module")
def app(workdir: Path, sock: str) -> Iterator[dict[str, Any]]:
    """The program's facts (pid, QP numbers, keys) while it holds its objects."""
    proc = subprocess.Popen([sys.executable, "-c", APP], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env=cli_env(workdir, SOFTVERBS_SERVICE=sock))  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the program failed before it held its objects"
        facts: dict[str, Any] = json.loads(line)
        with open(f"/proc/{facts['pid']}/comm") as f:
            facts["comm"] = f.read().strip()
        yield facts
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(TIMEOUT)


def res_json(workdir: Path, sock: str, *words: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(run(workdir, sock, "res", *words, "-j").stdout)
    return rows


def test_summary(workdir: Path, sock: str, app: dict[str, Any]) -> None:
    # two contexts: the program's, and the one its provider opens for the device's GIDs
    line = "0: sv0: pd 1 cq 1 qp 3 cm_id 0 mr 1 ctx 2 srq 0"
    assert run(workdir, sock, "res").stdout == line + "\n"
    assert run(workdir, sock, "res", "show", "sv0").stdout == line + "\n"
    assert res_json(workdir, sock) == [{"ifindex": 0, "ifname": "sv0", "pd": 1, "cq": 1,
                                        "qp": 3, "cm_id": 0, "mr": 1, "ctx": 2, "srq": 0}]


def test_qp_lines(workdir: Path, sock: str, app: dict[str, Any]) -> None:
    (pd,) = res_json(workdir, sock, "show", "pd")
    pdn, pid, comm = pd["pdn"], app["pid"], app["comm"]
    a, b, ud = app["a"], app["b"], app["ud"]
    owner = f"pdn {pdn} pid {pid} comm {comm}"
    expected = sorted([
        (a, f"link sv0/1 lqpn {a} rqpn {b} type RC state RTS rq-psn 0 sq-psn {SENDS} "
            f"path-mig-state MIGRATED {owner}"),
        (b, f"link sv0/1 lqpn {b} rqpn {a} type RC state RTS rq-psn {SENDS} sq-psn 0 "
            f"path-mig-state MIGRATED {owner}"),
        (ud, f"link sv0/- lqpn {ud} type UD state RESET sq-psn 0 {owner}"),
    ])  # fmt: skip
    r = run(workdir, sock, "res", "show", "qp")
    assert r.stdout.splitlines() == [line for _, line in expected]
    # rdma's filters, and the link it names
    only_a = run(workdir, sock, "res", "show", "qp", "link", "sv0/1", "lqpn", str(a))
    assert only_a.stdout.splitlines() == [expected[[q for q, _ in expected].index(a)][1]]
    reset = run(workdir, sock, "res", "qp", "state", "RESET", "pid", str(pid))
    assert reset.stdout.splitlines() == [expected[[q for q, _ in expected].index(ud)][1]]


def test_qp_json(workdir: Path, sock: str, app: dict[str, Any]) -> None:
    rows = {r["lqpn"]: r for r in res_json(workdir, sock, "show", "qp")}
    assert set(rows) == {app["a"], app["b"], app["ud"]}
    a = rows[app["a"]]
    assert list(a) == ["ifindex", "ifname", "port", "lqpn", "rqpn", "type", "state", "rq-psn",
                       "sq-psn", "path-mig-state", "pdn", "pid", "comm"]  # fmt: skip
    assert (a["ifname"], a["port"], a["rqpn"], a["type"], a["state"], a["sq-psn"], a["pid"]) == (
        "sv0", 1, app["b"], "RC", "RTS", SENDS, app["pid"])  # fmt: skip
    ud = rows[app["ud"]]
    assert "port" not in ud and "rqpn" not in ud and "rq-psn" not in ud
    assert (ud["type"], ud["state"]) == ("UD", "RESET")


def test_cq_mr_pd_lines(workdir: Path, sock: str, app: dict[str, Any]) -> None:
    owner = f"pid {app['pid']} comm {app['comm']}"
    (pd,) = res_json(workdir, sock, "show", "pd")
    (cq,) = res_json(workdir, sock, "show", "cq")
    (mr,) = res_json(workdir, sock, "show", "mr")
    pdn, ctxn = pd["pdn"], pd["ctxn"]
    # the PD is used by three QPs and an MR; the CQ by three QPs, each sending and receiving
    assert run(workdir, sock, "res", "show", "pd").stdout == (
        f"dev sv0 pdn {pdn} users 4 ctxn {ctxn} {owner}\n")
    assert run(workdir, sock, "res", "show", "cq", "dev", "sv0").stdout == (
        f"dev sv0 cqn {cq['cqn']} cqe {app['cqe']} users 6 ctxn {ctxn} {owner}\n")
    assert run(workdir, sock, "res", "show", "mr").stdout == (
        f"dev sv0 mrn {mr['mrn']} rkey {app['rkey']:#x} lkey {app['lkey']:#x} "
        f"iova {app['iova']:#x} mrlen 4096 pdn {pdn} {owner}\n")
    # rdma's JSON gives the keys in hex, without 0x
    assert (mr["rkey"], mr["lkey"], mr["mrlen"]) == (f"{app['rkey']:x}", f"{app['lkey']:x}", 4096)
    # -d: the service's own fields after rdma's
    detailed = run(workdir, sock, "res", "show", "cq", "-d").stdout
    assert detailed == f"dev sv0 cqn {cq['cqn']} cqe {app['cqe']} users 6 ctxn {ctxn} {owner} " \
                       "waiting 0\n"  # fmt: skip


def qp_counters(text: str) -> dict[int, tuple[str, dict[str, int]]]:
    """``stat qp``'s text: lqpn -> (first line, counters)."""
    out: dict[int, tuple[str, dict[str, int]]] = {}
    blocks = text.split("\nlink ")
    for i, block in enumerate(blocks):
        lines = (block if i == 0 else "link " + block).splitlines()
        first, *middle, last = lines
        assert last.startswith("    LQPN: <") and last.endswith(">"), last
        values = {}
        for line in middle:
            assert line.startswith("    "), line
            name, value = line.split()
            values[name] = int(value)
        out[int(last[len("    LQPN: <"):-1])] = (first, values)
    return out


def test_stat_qp(workdir: Path, sock: str, app: dict[str, Any]) -> None:
    a, b, ud = app["a"], app["b"], app["ud"]
    owner = f"pid {app['pid']} comm {app['comm']}"
    got = qp_counters(run(workdir, sock, "stat", "qp").stdout)
    assert set(got) == {a, b, ud}
    assert got[a][0] == f"link sv0/1 cntn {a} qp-type RC {owner}"
    assert got[ud][0] == f"link sv0/- cntn {ud} qp-type UD {owner}"
    # a sent the SENDs and received their ACKs; b the other way round; nothing went wrong
    assert got[a][1]["sent_pkts"] == SENDS and got[a][1]["rcvd_pkts"] == SENDS
    assert got[b][1]["sent_pkts"] == SENDS and got[b][1]["rcvd_pkts"] == SENDS
    assert got[ud][1]["sent_pkts"] == 0 and got[ud][1]["rcvd_pkts"] == 0
    for qpn in (a, b, ud):
        rest = {k: v for k, v in got[qpn][1].items() if k not in ("sent_pkts", "rcvd_pkts")}
        assert rest and set(rest.values()) == {0}, rest
    # JSON and rdma's filters
    r = run(workdir, sock, "stat", "qp", "show", "link", "sv0/1", "lqpn", str(b), "-j")
    (row,) = json.loads(r.stdout)
    assert (row["cntn"], row["qp-type"], row["pid"], row["lqpn"]) == (b, "RC", app["pid"], [b])
    assert (row["sent_pkts"], row["rcvd_pkts"]) == (SENDS, SENDS)
    by_type = json.loads(run(workdir, sock, "stat", "qp", "qp-type", "UD", "-j").stdout)
    assert [r["cntn"] for r in by_type] == [ud]


def test_mistakes(workdir: Path, sock: str) -> None:
    env = {"SOFTVERBS_SERVICE": sock}
    assert_user_error(softverbs_cli(workdir, "res", "nodev", **env), "nodev")
    assert_user_error(softverbs_cli(workdir, "res", "qp", "link", "sv0/2", **env), "sv0/2")
    assert_user_error(softverbs_cli(workdir, "res", "qp", "lqpn", **env), "NAME VALUE")
    assert_user_error(softverbs_cli(workdir, "stat", "qp", "bind", **env), "every QP")
    assert_user_error(softverbs_cli(workdir, "stat", "qp", "colour", "red", **env), "colour")


def test_no_service(workdir: Path) -> None:
    """Without a service, one line says so, nothing is shown, and none is started."""
    path = str(workdir / "none.sock")
    for args in (("res",), ("res", "show", "qp", "-j"), ("stat", "qp")):
        r = softverbs_cli(workdir, *args, SOFTVERBS_SERVICE=path)
        assert r.returncode == 0, r.stderr
        assert r.stdout == ("[]\n" if "-j" in args else "")
        (line,) = r.stderr.splitlines()
        assert f"softverbsd is not running on {path}" in line
    assert not os.path.exists(path)
