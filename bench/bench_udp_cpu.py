#!/usr/bin/env python3
"""CPU time per 8-byte RC SEND over UDP on loopback, against a plain Python UDP ping-pong.

A ping-pong's wall-clock latency on a shared machine says as much about the
scheduler as about the device: each process waits for a core on every message.
The CPU time a message costs does not, so this benchmark measures that, in the
two shapes a ping-pong takes:

(1) **one process, both ends**: two UDP devices on a fresh pair of 127.0.0.0/8
    addresses, one thread driving both ends in turn (post the SEND, poll the
    other end's CQ until it arrives, repost its receive, send it back ...).
    Nothing waits, so the process's CPU time per one-way message is all the
    work of a message at both ends: the post, the encoding and the ``sendto``,
    the receive, decoding, responder and CQE, the ACK and its completion, and
    the polls.  Each end polls its CQ empty once per round trip as a busy
    poller does, so the progress threads stand back.  Reference: the same
    loop with two plain UDP sockets (``sendto`` and ``recvfrom`` of a 24-byte
    datagram, the size of the RoCEv2 payload of an 8-byte SEND).
(2) **two processes, blocking**: each end in its own process, sleeping in
    ``get_cq_event`` as ``ibv_rc_pingpong -e`` does; each process's CPU time per
    round trip (one message sent, one received, the ACKs, the wake-ups).
    Reference: two processes in a blocking ``recvfrom`` ping-pong.

Rounds alternate softverbs and Python; the table gives the median of the rounds
and their range.  The ratio is the figure to compare between runs.

With ``--baseline DIR`` each round runs this benchmark of the source tree DIR
(``DIR/bench/bench_udp_cpu.py`` with ``DIR/src`` first on ``PYTHONPATH``, e.g. a
checkout of main compiled in place) and then this tree's, each in a process of
its own, and the table sets the two side by side: versions compared in
alternation, as a loaded machine needs.

    python bench/bench_udp_cpu.py [--rounds 5] [--iters 3000] [--quick] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_loopback as bl  # its SvEnd and PingPong: the same QPs

WARMUP = 300  #: round trips before each timed run


def _addrs() -> tuple[str, str]:
    net = f"127.{random.randint(100, 254)}.{random.randint(1, 254)}"
    return f"{net}.1", f"{net}.2"


def _configure(a: str, b: str, tmp: str) -> None:
    """Two UDP devices, "a" and "b", on the two addresses, in this process and its children."""
    config = Path(tmp) / "links.json"
    config.write_text(json.dumps({"links": [{"name": "a", "addrs": [a]},
                                            {"name": "b", "addrs": [b]}]}))  # fmt: skip
    os.environ["SOFTVERBS_CONFIG"] = str(config)
    os.environ["SOFTVERBS_SERVICE"] = "0"
    for var in ("SOFTVERBS_FAULTS", "SOFTVERBS_PCAP"):
        os.environ.pop(var, None)


def _cpu_per(run: Callable[[int], None], iters: int, per: int) -> float:
    """usec of this process's CPU time per unit: ``run(iters)`` makes ``per`` units an iteration."""
    run(WARMUP)
    t0 = time.process_time()
    run(iters)
    return (time.process_time() - t0) / (iters * per) * 1e6


# --- (1) one process, both ends ---------------------------------------------------------
def inline_softverbs(iters: int) -> float:
    a_end, b_end = bl.SvEnd("a", 4096), bl.SvEnd("b", 4096)
    try:
        a_end.connect(b_end.info())
        b_end.connect(a_end.info())
        pa, pb = bl.PingPong(a_end, False), bl.PingPong(b_end, False)
        ping, pong = b"pingping", b"pongpong"

        def run(n: int) -> None:
            for _ in range(n):
                pa.send(ping)
                if pb.wait_recv() != ping:
                    raise bl.BenchError("the ping arrived changed")
                pb.send(pong)
                if pa.wait_recv() != pong:
                    raise bl.BenchError("the pong arrived changed")
                for p in (pa, pb):  # a busy poller's empty polls (the send's CQE comes first)
                    for _ in range(2):
                        for wc in p.end.cq.poll(4)[1]:
                            bl._check(wc, "ping-pong")
                            p.sends_out -= 1

        return _cpu_per(run, iters, 2)
    finally:
        a_end.close()
        b_end.close()


def inline_python(a: str, b: str, iters: int) -> float:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sa, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sb:  # fmt: skip
        sa.bind((a, 0))
        sb.bind((b, 0))
        da, db = sa.getsockname(), sb.getsockname()
        msg = os.urandom(bl.LAT_DATAGRAM)

        def run(n: int) -> None:
            for _ in range(n):
                sa.sendto(msg, db)
                sb.recvfrom(2048)
                sb.sendto(msg, da)
                sa.recvfrom(2048)

        return _cpu_per(run, iters, 2)


# --- (2) two processes, blocking ----------------------------------------------------------
def _sv_side(name: str, conn: Connection, first: bool, iters: int) -> None:
    end = bl.SvEnd(name, 4096)
    try:
        conn.send(end.info())
        end.connect(conn.recv())
        pp = bl.PingPong(end, False)
        pp.events = True
        conn.send("ready")
        conn.recv()
        ping = b"pingping"

        def run(n: int) -> None:
            for _ in range(n):
                if first:
                    pp.send(ping)
                    if pp.wait_recv() != ping:
                        raise bl.BenchError("the ping came back changed")
                else:
                    pp.send(pp.wait_recv())

        conn.send(_cpu_per(run, iters, 1))
        conn.recv()  # the peer is done too: its last message was answered
    except Exception as e:
        conn.send(f"error: {e}")
        raise
    finally:
        end.close()


def _py_side(me: str, conn: Connection, first: bool, iters: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((me, 0))
        conn.send(sock.getsockname())
        peer = conn.recv()
        sock.settimeout(bl.STALL_TIMEOUT)
        msg = os.urandom(bl.LAT_DATAGRAM)
        conn.send("ready")
        conn.recv()

        def run(n: int) -> None:
            for _ in range(n):
                if first:
                    sock.sendto(msg, peer)
                    sock.recvfrom(2048)
                else:
                    data, _ = sock.recvfrom(2048)
                    sock.sendto(data, peer)

        conn.send(_cpu_per(run, iters, 1))
        conn.recv()


def two_processes(side: Callable[..., None], args_a: tuple[Any, ...],
                  args_b: tuple[Any, ...], iters: int) -> tuple[float, float]:  # fmt: skip
    """Each side's CPU usec per round trip."""
    ctx = multiprocessing.get_context("fork")
    (ca, pa_conn), (cb, pb_conn) = ctx.Pipe(), ctx.Pipe()
    procs = [ctx.Process(target=side, args=(*args_a, pa_conn, True, iters)),
             ctx.Process(target=side, args=(*args_b, pb_conn, False, iters))]  # fmt: skip
    for p in procs:
        p.start()
    try:
        ia, ib = ca.recv(), cb.recv()
        ca.send(ib)
        cb.send(ia)
        if (ca.recv(), cb.recv()) != ("ready", "ready"):
            raise bl.BenchError("a side did not start")
        cb.send("go")
        ca.send("go")
        results = [c.recv() if c.poll(bl.STALL_TIMEOUT + 30) else "error: no answer"
                   for c in (ca, cb)]  # fmt: skip
        for c in (ca, cb):
            c.send("done")
        for r in results:
            if isinstance(r, str):
                raise bl.BenchError(r)
        return float(results[0]), float(results[1])
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


# --- against another source tree ------------------------------------------------------------
HERE = Path(__file__).resolve().parents[1]


def _tree_round(tree: Path, iters: int) -> dict[str, Any]:
    """One round of ``tree``'s benchmark, in a process of its own: its JSON."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, str(tree / "bench" / "bench_udp_cpu.py"), "--json", "--rounds", "1",
           "--iters", str(iters)]  # fmt: skip
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                       timeout=bl.STALL_TIMEOUT + 600)  # fmt: skip
    if r.returncode != 0:
        raise bl.BenchError(f"{tree}: {(r.stderr or r.stdout).strip()[-500:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def compare(baseline: Path, rounds: int, iters: int) -> int:
    """Rounds of ``baseline``'s benchmark and this tree's in turn; both in one table."""
    if not (baseline / "bench" / "bench_udp_cpu.py").is_file():
        print(f"bench_udp_cpu: {baseline} has no bench/bench_udp_cpu.py", file=sys.stderr)
        return 2
    trees = {"this tree": HERE, "baseline": baseline.resolve()}
    got: dict[str, dict[str, list[float]]] = {t: {"inline": [], "events": []} for t in trees}
    modes = {}
    try:
        for _ in range(rounds):
            for name in ("baseline", "this tree"):
                res = _tree_round(trees[name], iters)
                modes[name] = res["mode"]
                for key in ("inline", "events"):
                    got[name][key].extend(res[key]["sv"])
    except (bl.BenchError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        print(f"bench_udp_cpu: {e}", file=sys.stderr)
        return 1
    print(f"this tree {HERE}: {modes['this tree']}\nbaseline {trees['baseline']}: "
          f"{modes['baseline']}\nload {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"CPU time per message, usec: median of {rounds} alternated round(s) of {iters} "
          "round trips (range)")  # fmt: skip
    _table(("this tree", "baseline"), {k: (got["this tree"][k], got["baseline"][k]) for k in CASES},
           2)  # fmt: skip
    return 0


#: the two cases, as the table names them
CASES = {"inline": "(1) one process, both ends, per one-way message",
         "events": "(2) two processes blocking, per round trip and side"}  # fmt: skip


def _table(heads: tuple[str, str], cells: dict[str, tuple[list[float], list[float]]],
           digits: int) -> None:  # fmt: skip
    """A row per case: the median (range) of each column and their ratio."""

    def cell(v: list[float]) -> str:
        return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"

    print(f" {'case':<52}{heads[0]:>20}{heads[1]:>20}{'ratio':>8}")
    for key, (left, right) in cells.items():
        ratio = statistics.median(left) / statistics.median(right)
        print(f" {CASES[key]:<52}{cell(left):>20}{cell(right):>20}{ratio:>8.{digits}f}")


# --- main -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median shown)")
    ap.add_argument("--iters", type=int, default=3000, help="timed round trips per run")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 round, 200 round trips")
    ap.add_argument("--json", action="store_true", help="print one JSON object, not the table")
    ap.add_argument("--baseline", metavar="DIR",
                    help="alternate rounds with this benchmark of the source tree DIR")  # fmt: skip
    args = ap.parse_args(argv)
    rounds, iters = (1, 200) if args.quick else (args.rounds, args.iters)
    if args.baseline:
        return compare(Path(args.baseline), rounds, iters)
    a, b = _addrs()
    rows: dict[str, dict[str, list[float]]] = {
        "inline": {"sv": [], "py": []}, "events": {"sv": [], "py": []}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="svcpu-") as tmp:
        _configure(a, b, tmp)
        try:
            for _ in range(rounds):
                rows["inline"]["sv"].append(inline_softverbs(iters))
                rows["inline"]["py"].append(inline_python(a, b, iters))
                rows["events"]["sv"].extend(two_processes(_sv_side, ("a",), ("b",), iters))
                rows["events"]["py"].extend(two_processes(_py_side, (a,), (b,), iters))
        except bl.BenchError as e:
            print(f"bench_udp_cpu: {e}", file=sys.stderr)
            return 1
    import softverbs
    from softverbs.compiled import mode

    if args.json:
        print(json.dumps({"mode": mode(), "rounds": rounds, "iters": iters, **rows}))
        return 0
    print(f"softverbs {softverbs.__version__}, {mode()}; CPython "
          f"{sys.version.split()[0]}; load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(
        f"CPU time per message, usec: median of {rounds} interleaved round(s) of {iters} "
        "round trips (range)"
    )
    _table(("softverbs", "Python UDP"), {k: (rows[k]["sv"], rows[k]["py"]) for k in CASES}, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
