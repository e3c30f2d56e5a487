"""ECN marks on a real socket path between two namespaces, and DCQCN's answer to them.

This kernel has none of the qdiscs that mark ECN (``red``, ``fq_codel``, ``codel``,
``pie``, ...: docs/congestion.md, "ECN on UDP links"), so the marking point is
netfilter's ``ECN`` target (``xt_ECN``, ``--ecn-ip-ect 3``: the IPv4 ECN field set to
CE, the header checksum fixed) in the receiving host's ``mangle`` table, on every Nth
RoCEv2 datagram (the ``statistic`` match; a UDP GSO burst counts as one) -- a marking
switch that marks at a fixed rate.  Both devices run DCQCN (``softverbs link set svnet
cc dcqcn``); the client WRITEs, SENDs and READs one message to the server through the veth pair.

The server's device must count the packets the rule marked (``np_ecn_marked_roce_packets``)
and answer with CNPs (``np_cnp_sent``, at most one per ``min_time_between_cnps`` per QP);
the client's device must receive them (``rp_cnp_handled``) and cut its QP's rate; the
data must arrive intact.  An unmarked run is the control: no CE, no CNP, no cut.
"""

from __future__ import annotations

import re
import shutil
from typing import Any

import pytest
from netns_kit import Topology
from test_multihost import run_pair

from softverbs.enums import IBV_WC_SUCCESS
from softverbs.wire.opcodes import ROCEV2_PORT

IPTABLES = "iptables-legacy"  # x_tables: this kernel has them (nf_tables is not needed)
EVERY = 4  #: one RoCEv2 datagram (or GSO burst) in EVERY reaching the server is marked CE
SIZE = 1 << 20
MISSING = re.compile(r"No chain/target/match by that name|Couldn't load (target|match)")


def _mark_ce(topo: Topology) -> str | None:
    """Mark every EVERY-th RoCEv2 datagram into the server's namespace CE; or why not."""
    if shutil.which(IPTABLES) is None:
        return f"{IPTABLES} is not installed (iptables, scripts/apt-packages.txt)"
    rule = ["-p", "udp", "--dport", str(ROCEV2_PORT), "-m", "statistic", "--mode", "nth",
            "--every", str(EVERY), "--packet", "0", "-j", "ECN", "--ecn-ip-ect", "3"]  # fmt: skip
    r = topo.exec_ns(topo.hosts[0].ns, IPTABLES, "-t", "mangle", "-A", "PREROUTING", *rule,
                     check=False)  # fmt: skip
    if r.returncode != 0 and MISSING.search(r.stderr):
        return f"this kernel has no xt_ECN or xt_statistic: {r.stderr.strip()}"
    assert r.returncode == 0, r.stderr
    return None


def _marked(topo: Topology) -> int:
    """Packets the ECN rule marked (its packet counter)."""
    out = topo.exec_ns(topo.hosts[0].ns, IPTABLES, "-t", "mangle", "-L", "PREROUTING", "-v",
                       "-x", "-n").stdout  # fmt: skip
    rows = [line.split() for line in out.splitlines() if re.search(r"\bECN\b", line)]
    assert len(rows) == 1, out
    return int(rows[0][0])


def _check_transfer(s: dict[str, Any], c: dict[str, Any]) -> None:
    assert s["write_sha"] == c["src_sha"] and s["send_sha"] == c["src_sha"]
    assert all(wc["status"] == IBV_WC_SUCCESS for wc in c["wcs"].values()), c["wcs"]


def test_ce_marks_on_a_veth_path_make_cnps_and_rate_cuts(make_topology: Any) -> None:
    topo = make_topology(hosts=2, mtu=9000)
    why = _mark_ce(topo)
    if why:
        pytest.skip(why)
    s, c = run_pair(topo, "large", "--size", str(SIZE), "--cc", "dcqcn", timeout=90)
    _check_transfer(s, c)
    marked = _marked(topo)
    # The rule marks socket buffers: a burst the client's device sent with one UDP GSO
    # sendmsg crosses the veth pair as one, and the server's device counts the RoCE
    # packets in it (docs/wire.md), so each mark is at least one marked packet.
    assert marked >= 2, marked
    sc, cc = s["counters"], c["counters"]
    assert marked <= sc.get("np_ecn_marked_roce_packets", 0), (marked, sc)
    assert 1 <= sc.get("np_cnp_sent", 0) <= sc["np_ecn_marked_roce_packets"], sc
    # every CNP reaches the client's QP and is acted on; none is foreign or malformed
    assert cc.get("rp_cnp_handled") == sc["np_cnp_sent"], (sc, cc)
    assert cc.get("rp_cnp_ignored", 0) == 0, cc
    cut = [q for q in c["rate"] if q["cuts"]]
    assert len(cut) == 1 and cut[0]["kind"] == "Dcqcn", c["rate"]
    assert cut[0]["cuts"] <= cc["rp_cnp_handled"], (cut, cc)  # one per monitor period at most
    # the client sends nothing marked to itself: its notification point stays quiet
    assert not cc.get("np_cnp_sent") and not sc.get("rp_cnp_handled"), (sc, cc)


def test_without_marks_no_cnps(make_topology: Any) -> None:
    topo = make_topology(hosts=2, mtu=9000)
    s, c = run_pair(topo, "large", "--size", str(SIZE), "--cc", "dcqcn", timeout=90)
    _check_transfer(s, c)
    for res in (s, c):
        assert not any(k.startswith(("np_", "rp_")) for k in res["counters"]), res["counters"]
        assert all(q["cuts"] == 0 and q["rc"] == q["line_rate"] for q in res["rate"]), res
    assert c["rate"], "the client's QP runs no rate limiter: is DCQCN on?"
