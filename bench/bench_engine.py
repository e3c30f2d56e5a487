#!/usr/bin/env python3
"""The bare engine's own work per message: two QP engines, no service, no fabric.

Two HCAs (``softverbs.engine.hca``) each with one RC QP, connected by hand;
their memory is a ``bytearray`` registered in each device's key table.  A
message is posted straight into the send ring, the doorbell is rung, and the
packets are carried from one device's outbox to the other's ``receive`` until
both outboxes are empty; the send CQE (and, for a SEND, the receive CQE) is
taken from its ring.  This is the path the service runs between the WQE
leaving the ring and the CQE, without the system calls and with the memory a
plain ``bytearray`` (so the copies are memcpy) -- or, with ``--proc``, with the
memory an anonymous mapping reached through this process's ``/proc/self/mem``
and registered by address with its ``Pin``, as the service registers a C
program's buffer (``device/memory.py``: the copies are the service's ``pread``
and ``pwritev``, the key checks its span checks; one pass throughout, so no
``PROCMAP_QUERY`` after the first):

* ``write4k``: a signaled 4 KiB RDMA WRITE (one RDMA_WRITE_ONLY packet at
  path MTU 4096, its ACK);
* ``send8``: an 8-byte SEND into a posted receive (SEND_ONLY, its ACK, two CQEs).

With ``--packed`` the send and receive queues are shared-memory rings in their byte
layout (``SendSlots``, ``RecvSlots``: docs/rings.md), as the service's are for a C
program, so each WQE is decoded from its slot when the device fetches it; without it
they hold the Python records (``ObjectSlots``), as the in-process device's do.

Each figure is microseconds of CPU time (``time.process_time``) per message,
the best and the median of ``--runs`` runs; the posting of the WQE into the
ring and the taking of the CQE are in it (the same in every tree).  Compiled
or not is whatever ``softverbs`` imports as (``softverbs --version``;
``SOFTVERBS_PURE=1`` for the interpreted modules).  Not a test: nothing
asserts a speed.

    python bench/bench_engine.py [--quick] [--iters N] [--runs N] [--kinds write4k,send8]
                                 [--proc] [--packed]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import mmap
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from softverbs.device.memory import ProcessMemory
from softverbs.engine.hca import HCA
from softverbs.engine.memory import MemKind
from softverbs.engine.qp import QPEngine
from softverbs.engine.rings import (
    HEADER_SIZE,
    WQ_RQ,
    WQ_SQ,
    RecvWQE,
    Route,
    SendWQE,
    SharedRegion,
    WorkRing,
    local_cq,
    local_work_ring,
    recv_slot_size,
    send_slot_size,
    shared_work_ring,
)
from softverbs.engine.wr import WR_INFO
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QPS_INIT,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPT_RC,
    IBV_WC_SUCCESS,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
)

# a plain int, as the service stores a QP's access flags (an IntFlag's & is a Python call)
ACCESS = int(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
MEM = 1 << 16
BASE = 0x10_0000


RING = 256


def work_ring(packed: bool, send: bool) -> WorkRing:
    """A queue of ``RING`` slots: Python records, or (``packed``) the byte layout in
    shared memory with one SGE and no inline data per slot."""
    if not packed:
        return local_work_ring(RING)
    slot = send_slot_size(1, 0) if send else recv_slot_size(1)
    region = SharedRegion(HEADER_SIZE + RING * slot, name="bench-engine")
    return shared_work_ring(region, RING, slot, send, frozenset(WR_INFO))


class Node:
    def __init__(self, name: str, last: int, proc: ProcessMemory | None = None,
                 packed: bool = False) -> None:
        self.gid = b"\x00" * 10 + b"\xff\xff" + bytes([10, 0, 0, last])
        self.hca = HCA(name, [self.gid], functools.partial(random.Random(name).getrandbits, 8))
        self.pd = object()
        self.scq = local_cq(4096)
        self.rcq = local_cq(4096)
        self.sq = work_ring(packed, True)
        self.rq = work_ring(packed, False)
        self.sq.tag = (WQ_SQ, 1)
        self.rq.tag = (WQ_RQ, 1)
        qpn = self.hca.alloc_qpn()
        self.qp = QPEngine(self.hca, qpn, IBV_QPT_RC, self.pd, self.scq, self.rcq, self.sq,
                           self.rq, None, False)  # fmt: skip
        self.hca.qps[qpn] = self.qp
        self.mem: bytearray | mmap.mmap
        if proc is None:
            self.mem = bytearray(MEM)
            self.base = BASE
            view: Any = memoryview(self.mem)
        else:  # the service's view of a client's buffer
            self.mem = mmap.mmap(-1, MEM)
            self.mem.write(b"\0" * MEM)  # its pages present, as a program's written buffer
            self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))
            view = proc.span(self.base, MEM, pinned=True)
        self.mr = self.hca.keys.register(MemKind.MR, self.pd, view, self.base, ACCESS)


def connect(a: Node, b: Node) -> None:
    for me, peer in ((a, b), (b, a)):
        qp = me.qp
        qp.set_state(IBV_QPS_INIT, 0.0)
        qp.set_attrs({"pkey_index": 0, "access": ACCESS})
        qp.set_attrs({"route": Route(dgid=peer.gid, sgid=me.gid), "pmtu": 4096,
                      "dest_qpn": peer.qp.qpn, "rq_psn": 0})  # fmt: skip
        qp.set_state(IBV_QPS_RTR, 0.0)
        qp.set_attrs({"sq_psn": 0, "timeout": 14, "retry_cnt": 7, "rnr_retry": 7})
        qp.set_state(IBV_QPS_RTS, 0.0)


def make(kind: str, proc: ProcessMemory | None = None,
         packed: bool = False) -> Callable[[int], None]:
    """A function running ``n`` messages of ``kind`` end to end."""
    a, b = Node("a", 1, proc, packed), Node("b", 2, proc, packed)
    connect(a, b)
    length = 4096 if kind == "write4k" else 8
    opcode = IBV_WR_RDMA_WRITE if kind == "write4k" else IBV_WR_SEND
    ha, hb = a.hca, b.hca
    sq, rq = a.sq, b.rq
    a.mem[:length] = bytes((i * 7 + 1) & 0xFF for i in range(length))
    target = 0 if kind == "write4k" else 4096  # where the bytes land in b's memory

    def carry(now: float) -> None:
        moved = True
        while moved:
            moved = False
            for src, dst in ((ha, hb), (hb, ha)):
                out = src.outbox
                while out:
                    dst.receive(out.popleft(), now)
                    moved = True

    def run(n: int) -> None:
        for i in range(n):
            if opcode == IBV_WR_SEND:
                rq.push(RecvWQE(i, [(b.base + 4096, 64, b.mr.key)], 64))
                rq.ring(rq.pi)
                b.qp.rq_doorbell(0.0)
            wqe = SendWQE(i, opcode, True, [(a.base, length, a.mr.key)], length)
            wqe.remote_addr = b.base
            wqe.rkey = b.mr.key
            sq.push(wqe)
            sq.ring(sq.pi)
            a.qp.doorbell(0.0)
            carry(0.0)
            ha.next_deadline()  # as the service's loop asks each turn (drops stale timers)
            hb.next_deadline()
            for cq, ring in ((a.scq, sq), (b.rcq, rq)):
                for cqe in cq.take(cq.capacity):
                    if cqe.status != IBV_WC_SUCCESS or cqe.byte_len != length:
                        raise SystemExit(f"{kind}: completion status {cqe.status}, "
                                         f"{cqe.byte_len} bytes: {cqe.reason}")  # fmt: skip
                    ring.release(cqe.index)
        if b.mem[target : target + length] != a.mem[:length]:
            raise SystemExit(f"{kind}: the bytes that arrived are not the bytes sent")

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a fast smoke run (fewer, shorter runs)")
    ap.add_argument("--iters", type=int, help="messages per run (default 20000; --quick 2000)")
    ap.add_argument("--runs", type=int, help="timed runs per figure (default 7; --quick 3)")
    ap.add_argument("--kinds", default="write4k,send8")
    ap.add_argument("--proc", action="store_true",
                    help="the memory reached through /proc/self/mem, as the service's")
    ap.add_argument("--packed", action="store_true",
                    help="the queues in their shared byte layout, as the service's")
    args = ap.parse_args()
    iters = args.iters or (2000 if args.quick else 20000)
    runs = args.runs or (3 if args.quick else 7)
    from softverbs.compiled import mode

    print(f"softverbs: {mode()}{', packed queues' if args.packed else ''}")
    proc = None
    if args.proc:
        proc = ProcessMemory(os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC), os.getpid(),
                             reuse=True)  # fmt: skip
        if proc.maps < 0:
            raise SystemExit("--proc: no PROCMAP_QUERY on this kernel (Linux 6.11+)")
    for kind in args.kinds.split(","):
        if kind not in ("write4k", "send8"):
            raise SystemExit(f"--kinds: {kind!r} is not write4k or send8")
        run = make(kind, proc, args.packed)
        run(2000)  # warm up
        per: list[float] = []
        for _ in range(runs):
            t = time.process_time()
            run(iters)
            per.append((time.process_time() - t) / iters * 1e6)
        print(f"{kind:8} CPU us/message: best {min(per):.2f}  median {statistics.median(per):.2f}")


if __name__ == "__main__":
    main()
