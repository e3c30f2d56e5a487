#!/usr/bin/env python3
"""XRC message rate through the device service, with 1, 8 and 32 receiving processes.

A private ``softverbsd`` serves ``sv0``.  One sending process has an XRC
send QP; N receiving processes share one XRC domain (a file) and one XRC
receive QP -- the first allocates it with ``xrc_rcv_qp_alloc``, the others
``xrc_rcv_qp_register`` -- and each has its own XRC SRQ with receives
posted ahead, reposted as they complete.  The sender sends ``--size``-byte
messages round robin to the N SRQs: chains of 16 WRs per ``post_send`` (one
doorbell each), the last signaled.  Every message carries its target and
sequence number, and each receiver checks that it got exactly its own, in
order.

The rate is messages / seconds, from the moment the sender starts until the
last receiver has polled its last message.  Every participant is a separate
OS process; the engine runs in the service, single-threaded, so the figure
is the service's XRC delivery rate on this machine (an idle receiver sleeps
between polls, 50 us doubling up to 2 ms, so that 32 of them do not starve
the service of CPU).
Each figure is the median of ``--runs`` runs.  Not a test: nothing asserts
a speed.

    python bench/bench_xrc.py [--quick] [--runs N] [--receivers 1,8,32] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from progress import Progress, add_quiet

BATCH = 16  #: WRs per post_send chain (one doorbell)
DEPTH = 256  #: the sender's send queue
SRQ_DEPTH = 512  #: receives each receiver keeps posted
#: an idle receiver sleeps between polls, doubling from IDLE_MIN to IDLE_MAX seconds
IDLE_MIN, IDLE_MAX = 0.00005, 0.002


# --- the processes ---------------------------------------------------------------------------


def _receiver(pipe: multiprocessing.connection.Connection, me: int, xrcd_path: str,
              size: int, alloc_for: int | None) -> None:  # fmt: skip
    from softverbs import (
        CQ,
        MR,
        PD,
        SGE,
        SRQ,
        XRCD,
        AHAttr,
        Context,
        GlobalRoute,
        QPAttr,
        RecvWR,
        SrqInitAttrEx,
        XRCDInitAttr,
        xrc_rcv_qp_alloc,
        xrc_rcv_qp_register,
    )
    from softverbs import enums as e

    ctx = Context(name="sv0")
    pd = PD(ctx)
    fd = os.open(xrcd_path, os.O_RDONLY | os.O_CREAT, 0o600)
    xrcd = XRCD(ctx, XRCDInitAttr(e.IBV_XRCD_INIT_ATTR_FD | e.IBV_XRCD_INIT_ATTR_OFLAGS,
                                  os.O_CREAT, fd))  # fmt: skip
    cq = CQ(ctx, SRQ_DEPTH * 2)
    slot = max(size, 32)
    mr = MR(pd, SRQ_DEPTH * slot, e.IBV_ACCESS_LOCAL_WRITE)
    attr = SrqInitAttrEx(max_wr=SRQ_DEPTH, max_sge=1)
    attr.srq_type, attr.pd, attr.xrcd, attr.cq = e.IBV_SRQT_XRC, pd, xrcd, cq
    attr.comp_mask = (e.IBV_SRQ_INIT_ATTR_TYPE | e.IBV_SRQ_INIT_ATTR_PD
                      | e.IBV_SRQ_INIT_ATTR_CQ | e.IBV_SRQ_INIT_ATTR_XRCD)  # fmt: skip
    srq = SRQ(ctx, attr)
    wrs = [RecvWR(i, 1, [SGE(mr.buf + i * slot, slot, mr.lkey)]) for i in range(SRQ_DEPTH)]
    for wr in wrs:
        srq.post_recv(wr)
    if alloc_for is not None:
        a = QPAttr()
        a.qp_access_flags, a.pkey_index, a.port_num = 0, 0, 1
        a.dest_qp_num, a.path_mtu, a.rq_psn = alloc_for, e.IBV_MTU_1024, 0
        a.max_dest_rd_atomic, a.min_rnr_timer = 1, 1
        a.ah_attr = AHAttr(is_global=1, port_num=1,
                           gr=GlobalRoute(dgid=ctx.query_gid(1, 1), sgid_index=1))  # fmt: skip
        mask = (e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS
                | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN
                | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)  # fmt: skip
        qpn = xrc_rcv_qp_alloc(xrcd, a, mask)
    else:
        pipe.send(("srqn", srq.get_srq_num()))
        qpn = pipe.recv()
        xrc_rcv_qp_register(xrcd, qpn)
    pipe.send(("ready", qpn, srq.get_srq_num()))
    while True:
        cmd = pipe.recv()
        if cmd is None:
            return
        expect = int(cmd)
        got = 0
        nap = IDLE_MIN
        idle_since = time.monotonic()
        while got < expect:
            n, wcs = cq.poll(64)
            if not n:
                time.sleep(nap)
                nap = min(nap * 2, IDLE_MAX)
                if time.monotonic() - idle_since > 10:  # say why, if it ever hangs
                    ring: Any = cq.ring
                    print(f"receiver {me}: idle at {got} of {expect} messages; its CQ: "
                          f"{ring.pending()} waiting, error {ring.error}", file=sys.stderr)
                    idle_since = time.monotonic()
                continue
            nap = IDLE_MIN
            idle_since = time.monotonic()
            for wc in wcs:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise SystemExit(f"receiver {me}: {wc}")
                head = bytes(mr.read(16, wc.wr_id * slot))
                target, seq = int(head[:8]), int(head[8:16])
                if target != me or seq != got:
                    raise SystemExit(f"receiver {me}: got message {seq} for {target}, "
                                     f"expected {got}")  # fmt: skip
                got += 1
                srq.post_recv(wrs[wc.wr_id])
        pipe.send(("done", got))


def _sender(pipe: multiprocessing.connection.Connection, size: int) -> None:
    from softverbs import (
        CQ,
        MR,
        PD,
        QP,
        SGE,
        Context,
        QPAttr,
        QPCap,
        QPInitAttrEx,
        SendWR,
        testing,
    )
    from softverbs import enums as e

    ctx = Context(name="sv0")
    pd = PD(ctx)
    cq = CQ(ctx, DEPTH * 2)
    mr = MR(pd, DEPTH * size, e.IBV_ACCESS_LOCAL_WRITE)
    init = QPInitAttrEx(qp_type=e.IBV_QPT_XRC_SEND, scq=cq, pd=pd,
                        comp_mask=e.IBV_QP_INIT_ATTR_PD,
                        cap=QPCap(max_send_wr=DEPTH, max_recv_wr=0, max_send_sge=1,
                                  max_recv_sge=0))  # fmt: skip
    qp = QP(ctx, init, QPAttr())
    pipe.send(("qpn", qp.qp_num))
    recv_qpn, srqns = pipe.recv()
    testing.connect_qp(qp, recv_qpn, testing.route(ctx, 1), max_rd_atomic=1,
                       max_dest_rd_atomic=1)  # fmt: skip
    pipe.send(("ready",))
    while True:
        cmd = pipe.recv()
        if cmd is None:
            return
        total = int(cmd)
        n = len(srqns)
        seqs = [0] * n
        posted = 0
        freed = 0  # slots given back by polled (signaled) completions
        t0 = time.perf_counter()
        while posted < total:
            chunk = min(BATCH, total - posted)
            while posted + chunk - freed > DEPTH:
                got, wcs = cq.poll(16)
                for wc in wcs:
                    if wc.status != e.IBV_WC_SUCCESS:
                        raise SystemExit(f"sender: {wc}")
                    freed = wc.wr_id + 1
                if not got:
                    time.sleep(0.0001)
            head = None
            for k in reversed(range(chunk)):
                i = posted + k
                target = i % n
                off = (i % DEPTH) * size
                mr.write(b"%08d%08d" % (target, seqs[target] + k // n), 16, off)
                wr = SendWR(i, e.IBV_WR_SEND, 1, sg=[SGE(mr.buf + off, size, mr.lkey)],
                            send_flags=e.IBV_SEND_SIGNALED if k == chunk - 1 else 0,
                            next_wr=head)  # fmt: skip
                wr.set_qp_type_xrc(srqns[target])
                head = wr
            assert head is not None
            qp.post_send(head)
            for k in range(chunk):
                seqs[(posted + k) % n] += 1
            posted += chunk
        while freed < total:
            got, wcs = cq.poll(16)
            for wc in wcs:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise SystemExit(f"sender: {wc}")
                freed = wc.wr_id + 1
            if not got:
                time.sleep(0.0001)
        pipe.send(("sent", time.perf_counter() - t0))


# --- the driver ---------------------------------------------------------------------------------


def _recv(pipe: multiprocessing.connection.Connection, proc: Any, timeout: float = 120) -> Any:
    if not pipe.poll(timeout):
        raise SystemExit(f"{proc.name} did not answer in {timeout} s; the device: {_device()}")
    try:
        return pipe.recv()
    except EOFError:
        raise SystemExit(f"{proc.name} died (exit code {proc.exitcode})") from None


def measure(receivers: int, messages: int, runs: int, size: int, workdir: str,
            mp: Any) -> dict[str, Any]:  # fmt: skip
    """Median message rate of ``runs`` runs with ``receivers`` receiving processes."""
    messages -= messages % receivers  # the same count for each
    xrcd_path = os.path.join(workdir, f"xrcd-{receivers}")
    s_pipe, child = mp.Pipe()
    sender = mp.Process(target=_sender, args=(child, size), name="sender", daemon=True)
    sender.start()
    send_qpn = _recv(s_pipe, sender)[1]
    procs, pipes = [], []
    for me in range(receivers):
        pipe, child = mp.Pipe()
        p = mp.Process(target=_receiver, args=(child, me, xrcd_path, size,
                                               send_qpn if me == 0 else None),
                       name=f"receiver-{me}", daemon=True)  # fmt: skip
        p.start()
        procs.append(p)
        pipes.append(pipe)
    _, qpn, srqn0 = _recv(pipes[0], procs[0])
    srqns = [srqn0]
    for pipe, p in zip(pipes[1:], procs[1:], strict=True):
        srqns.append(_recv(pipe, p)[1])
        pipe.send(qpn)
    for pipe, p in zip(pipes[1:], procs[1:], strict=True):
        _recv(pipe, p)  # ready
    s_pipe.send((qpn, srqns))
    _recv(s_pipe, sender)
    rates, send_rates = [], []
    for _ in range(runs + 1):  # the first is a warm-up
        for pipe in pipes:
            pipe.send(messages // receivers)
        t0 = time.perf_counter()
        s_pipe.send(messages)
        for pipe, p in zip(pipes, procs, strict=True):
            got = _recv(pipe, p)
            assert got == ("done", messages // receivers), got
        elapsed = time.perf_counter() - t0
        sent = _recv(s_pipe, sender)[1]
        rates.append(messages / elapsed)
        send_rates.append(messages / sent)
    for pipe in [s_pipe, *pipes]:
        pipe.send(None)
    for p in [sender, *procs]:
        p.join(30)
    return {"receivers": receivers, "messages": messages, "size": size, "runs": runs,
            "msg_per_s": statistics.median(rates[1:]),
            "send_completion_msg_per_s": statistics.median(send_rates[1:]),
            "all_msg_per_s": [round(r) for r in rates[1:]]}  # fmt: skip


def _device() -> dict[str, Any]:
    """The service's counters and live objects (for a failure message)."""
    from softverbs.verbs.served import Connection

    try:
        conn = Connection(os.environ["SOFTVERBS_SERVICE"], spawn=False)
        try:
            counters = conn.call("counters", dev="sv0")["counters"]
            stats = conn.call("stats")
        finally:
            conn.close()
    except Exception as exc:
        return {"unreachable": repr(exc)}
    return {"counters": counters, "objects": stats.get("objects"), "stats": stats.get("stats")}


def _start_service(path: str) -> subprocess.Popen[bytes]:
    from softverbs.config import service_command

    proc = subprocess.Popen(service_command("--socket", path),
                            stdout=subprocess.DEVNULL)  # fmt: skip
    from softverbs.verbs.served import Connection

    deadline = time.monotonic() + 20
    while True:
        try:
            Connection(path, spawn=False).close()
            return proc
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("softverbsd did not start") from None
            time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a fast smoke run")
    ap.add_argument("--runs", type=int, default=None, help="timed runs per figure (default 3)")
    ap.add_argument("--messages", type=int, default=None,
                    help="messages per run (default 9600; --quick 960)")  # fmt: skip
    ap.add_argument("--receivers", default="1,8,32", help="receiving process counts")
    ap.add_argument("--size", type=int, default=64, help="message size in bytes (>= 16)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    add_quiet(ap)
    args = ap.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    messages = args.messages or (960 if args.quick else 9600)
    counts = [int(x) for x in args.receivers.split(",")]
    size = max(args.size, 16)
    with tempfile.TemporaryDirectory(prefix="svbx", dir="/tmp") as workdir:
        path = os.path.join(workdir, "sv.sock")
        os.environ["SOFTVERBS_SERVICE"] = path
        service = _start_service(path)
        mp = multiprocessing.get_context("forkserver")
        mp.set_forkserver_preload(["softverbs", "softverbs.verbs.served"])
        try:
            progress = Progress(len(counts), args.quiet)
            results = []
            for n in counts:
                progress.step(f"{n} receiving process{'es' if n != 1 else ''}")
                results.append(measure(n, messages, runs, size, workdir, mp))
        finally:
            service.terminate()
            service.wait(30)
    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "quick": args.quick}  # fmt: skip
    if args.json:
        print(json.dumps({"info": info, "results": results}, indent=2))
        return 0
    print(f"XRC message rate through softverbsd ({size}-byte SENDs, chains of {BATCH}, "
          f"median of {runs}; Python {info['python']}, {info['cpus']} CPUs)")
    print(f"{'receivers':>9}  {'messages':>8}  {'msg/s':>8}  {'sender-side msg/s':>17}")
    for r in results:
        print(f"{r['receivers']:>9}  {r['messages']:>8}  {r['msg_per_s']:>8.0f}  "
              f"{r['send_completion_msg_per_s']:>17.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
