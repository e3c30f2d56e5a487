#!/usr/bin/env python3
"""Signature pipelining: transaction latency, pipelined against wait-check-send.

A storage target answers a READ command: it moves the data to the initiator
with an RDMA WRITE through a signature mkey (a CRC32 after every 512-byte
block in memory, checked and stripped; or T10-DIF), then sends a 64-byte
response.  The latency of one transaction -- from the target's first post to
the initiator's receive completion of the response -- is measured two ways
on the same QPs:

* **pipelined**: the WRITE and the response (a SEND with IBV_SEND_FENCE) are
  posted together on a ``MLX5DV_QP_CREATE_SIG_PIPELINING`` QP: the response
  leaves right behind the data, and would be held back only if a check
  failed;
* **wait-check-send**: the WRITE is posted signaled, its completion polled,
  the mkey checked (``mkey_check``), and only then the response posted --
  what a target must do without signature pipelining.

The saving is the WRITE's acknowledgement round trip.  It is measured on
three links: the in-process device (a function call away), the same with a
simulated one-way delay on every packet (``--delay``, default 50 us: a
datacenter hop), and two UDP (RoCEv2) devices on loopback addresses.

Every completion must succeed and every payload is checked, no check may
fail, and the QP must never stop.  Each figure is the median of the timed
transactions after warm-up.  Not a test: nothing asserts a speed.

    python bench/bench_sig.py [--quick] [--iters N] [--delay SECONDS] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from progress import Progress, add_quiet

import softverbs
from softverbs import (
    CQ,
    MR,
    PD,
    SGE,
    Context,
    QPCap,
    QPInitAttrEx,
    RecvWR,
    SendWR,
    testing,
    wc_status_str,
)
from softverbs.compat.vendor_dv.mlx5_enums import (
    mlx5dv_block_size,
    mlx5dv_mkey_err_type,
    mlx5dv_mkey_init_attr_flags,
    mlx5dv_qp_create_flags,
    mlx5dv_qp_create_send_ops_flags,
    mlx5dv_qp_init_attr_mask,
    mlx5dv_sig_crc_type,
    mlx5dv_sig_mask,
    mlx5dv_sig_type,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_MTU_4096,
    IBV_QP_EX_WITH_RDMA_WRITE,
    IBV_QP_EX_WITH_SEND,
    IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    IBV_QPS_RTS,
    IBV_QPT_RC,
    IBV_SEND_FENCE,
    IBV_SEND_INLINE,
    IBV_SEND_SIGNALED,
    IBV_WC_SUCCESS,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
)
from softverbs.ext.mlx5dv import (
    Mlx5Context,
    Mlx5DVContextAttr,
    Mlx5DVQPInitAttr,
    Mlx5Mkey,
    Mlx5MkeyConfAttr,
    Mlx5QP,
    Mlx5SigBlockAttr,
    Mlx5SigBlockDomain,
    Mlx5SigCrc,
    Mlx5SigT10Dif,
    sig_image,
)
from softverbs.fabric.faults import FaultInjector, FaultRule

ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
RESP = 64
BLOCK = 512
#: (name, data bytes, signature) of each row
CASES = [("CRC32", 4096, "crc32"), ("CRC32", 65536, "crc32"), ("T10-DIF", 4096, "t10dif")]
QUICK_CASES = [("CRC32", 4096, "crc32"), ("T10-DIF", 4096, "t10dif")]


class BenchError(Exception):
    pass


def domain(sig: str) -> tuple[Mlx5SigBlockDomain, int, int]:
    """(memory domain, field size, check mask) of a signature name."""
    if sig == "crc32":
        crc = Mlx5SigCrc(mlx5dv_sig_crc_type.MLX5DV_SIG_CRC_TYPE_CRC32, 0xFFFFFFFF)
        return (
            Mlx5SigBlockDomain(
                sig_type=mlx5dv_sig_type.MLX5DV_SIG_TYPE_CRC,
                crc=crc,
                block_size=mlx5dv_block_size.MLX5DV_BLOCK_SIZE_512,
            ),
            4,
            mlx5dv_sig_mask.MLX5DV_SIG_MASK_CRC32,
        )
    dif = Mlx5SigT10Dif(app_tag=0x1234, ref_tag=0)
    mask = (
        mlx5dv_sig_mask.MLX5DV_SIG_MASK_T10DIF_GUARD
        | mlx5dv_sig_mask.MLX5DV_SIG_MASK_T10DIF_APPTAG
        | mlx5dv_sig_mask.MLX5DV_SIG_MASK_T10DIF_REFTAG
    )
    return (
        Mlx5SigBlockDomain(
            sig_type=mlx5dv_sig_type.MLX5DV_SIG_TYPE_T10DIF,
            dif=dif,
            block_size=mlx5dv_block_size.MLX5DV_BLOCK_SIZE_512,
        ),
        8,
        mask,
    )


def make_qp(ctx: Mlx5Context, pd: PD, cq: CQ, pipelining: bool) -> Mlx5QP:
    init = QPInitAttrEx(
        qp_type=IBV_QPT_RC,
        scq=cq,
        rcq=cq,
        pd=pd,
        cap=QPCap(max_send_wr=64, max_recv_wr=64, max_inline_data=512),
        comp_mask=IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        send_ops_flags=IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE,
    )
    m = mlx5dv_qp_init_attr_mask
    flags = mlx5dv_qp_create_flags.MLX5DV_QP_CREATE_SIG_PIPELINING if pipelining else 0
    dv = Mlx5DVQPInitAttr(
        comp_mask=m.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS
        | m.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
        create_flags=flags,
        send_ops_flags=mlx5dv_qp_create_send_ops_flags.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE,
    )
    return Mlx5QP(ctx, init, dv)


def connect(qp: Mlx5QP, peer: Mlx5QP, peer_ctx: Context, gid_index: int) -> None:
    testing.connect_qp(qp, peer.qp_num, testing.route(peer_ctx, gid_index), IBV_MTU_4096,
                       qp_access_flags=ACCESS, timeout=17)  # fmt: skip


#: Contexts whose devices a busy-polling loop also drives, as a peer process would
#: drive its own (two UDP devices in one process otherwise wait for their progress
#: threads to get the GIL, up to a switch interval, 5 ms, away).
PEERS: list[Context] = []


def poll(cq: CQ, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while True:
        n, wcs = cq.poll(1)
        if n:
            wc = wcs[0]
            if wc.status != IBV_WC_SUCCESS:
                raise BenchError(f"{what}: {wc_status_str(wc.status)} ({wc.reason})")
            return
        for peer in PEERS:
            with peer.lock:
                peer.runtime.progress()
        if time.monotonic() > end:
            raise BenchError(f"{what}: no completion within {timeout} s")


@dataclass
class Row:
    link: str
    signature: str
    size: int
    pipelined_us: float
    wait_check_send_us: float

    @property
    def saving_us(self) -> float:
        return self.wait_check_send_us - self.pipelined_us


class Rig:
    """A target (pipelining QP, signature mkey over protected data) and an initiator."""

    def __init__(
        self, tctx: Mlx5Context, ictx: Mlx5Context, gid_index: int, size: int, sig: str
    ) -> None:
        self.size = size
        dom, fsize, mask = domain(sig)
        self.tpd, self.ipd = PD(tctx), PD(ictx)
        self.tcq, self.icq = CQ(tctx, 256), CQ(ictx, 256)
        self.tqp = make_qp(tctx, self.tpd, self.tcq, pipelining=True)
        self.iqp = make_qp(ictx, self.ipd, self.icq, pipelining=False)
        connect(self.tqp, self.iqp, ictx, gid_index)
        connect(self.iqp, self.tqp, tctx, gid_index)
        self.data = os.urandom(size)
        mem = sig_image(self.data, dom)
        self.tmr = MR(self.tpd, len(mem) + RESP, ACCESS)
        self.tmr.write(mem, len(mem), 0)
        self.tmr.write(b"GOOD".ljust(RESP, b"."), RESP, len(mem))
        self.resp_sge = SGE(self.tmr.buf + len(mem), RESP, self.tmr.lkey)
        self.imr = MR(self.ipd, size + RESP, ACCESS)
        flags = (
            mlx5dv_mkey_init_attr_flags.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
            | mlx5dv_mkey_init_attr_flags.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE
        )
        self.mkey = Mlx5Mkey(self.tpd, flags, 1)
        q = self.tqp
        q.wr_start()
        q.wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE
        q.wr_mkey_configure(self.mkey, 3, Mlx5MkeyConfAttr())
        q.wr_set_mkey_access_flags(IBV_ACCESS_LOCAL_WRITE)
        q.wr_set_mkey_layout_list([SGE(self.tmr.buf, len(mem), self.tmr.lkey)])
        q.wr_set_mkey_sig_block(Mlx5SigBlockAttr(mem=dom, check_mask=mask))
        q.wr_complete()
        poll(self.tcq, "mkey configuration")
        assert len(mem) == size // BLOCK * (BLOCK + fsize)
        self.recv()

    def recv(self) -> None:
        sge = SGE(self.imr.buf + self.size, RESP, self.imr.lkey)
        self.iqp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[sge]))

    def write_wr(self, flags: int) -> SendWR:
        wr = SendWR(
            wr_id=1,
            opcode=IBV_WR_RDMA_WRITE,
            num_sge=1,
            send_flags=flags,
            sg=[SGE(0, self.size, self.mkey.lkey)],
        )
        wr.set_wr_rdma(self.imr.rkey, self.imr.buf)
        return wr

    def response_wr(self, fence: bool) -> SendWR:
        flags = IBV_SEND_SIGNALED | (IBV_SEND_FENCE if fence else 0)
        return SendWR(wr_id=2, opcode=IBV_WR_SEND, num_sge=1, sg=[self.resp_sge], send_flags=flags)

    def pipelined(self) -> float:
        wr = self.write_wr(0)
        wr.next_wr = self.response_wr(fence=True)
        t0 = time.perf_counter()
        self.tqp.post_send(wr)
        poll(self.icq, "pipelined: the response")
        dt = time.perf_counter() - t0
        poll(self.tcq, "pipelined: the response's send completion")
        return dt

    def wait_check_send(self) -> float:
        t0 = time.perf_counter()
        self.tqp.post_send(self.write_wr(IBV_SEND_SIGNALED))
        poll(self.tcq, "wait-check-send: the WRITE")
        if self.mkey.mkey_check().err_type != mlx5dv_mkey_err_type.MLX5DV_MKEY_NO_ERR:
            raise BenchError("a signature check failed")
        self.tqp.post_send(self.response_wr(fence=False))
        poll(self.icq, "wait-check-send: the response")
        dt = time.perf_counter() - t0
        poll(self.tcq, "wait-check-send: the response's send completion")
        return dt

    def verify(self) -> None:
        if self.imr.read(self.size, 0) != self.data:
            raise BenchError("the initiator's data differ from the target's")
        if self.mkey.mkey_check().err_type != mlx5dv_mkey_err_type.MLX5DV_MKEY_NO_ERR:
            raise BenchError("a signature check failed")
        if self.tqp.qp_state != IBV_QPS_RTS:
            raise BenchError("the target's QP left RTS")


def measure(rig: Rig, run: Callable[[], float], warmup: int, iters: int) -> float:
    times = []
    for i in range(warmup + iters):
        rig.imr.write(bytes(8), 8, 0)
        dt = run()
        rig.recv()
        rig.verify()
        if i >= warmup:
            times.append(dt)
    return statistics.median(times) * 1e6


@contextlib.contextmanager
def link(name: str, delay: float) -> Iterator[tuple[Mlx5Context, Mlx5Context, int]]:
    """(target context, initiator context, GID index) for one link configuration."""
    if name == "udp":
        with tempfile.TemporaryDirectory(prefix="bench-sig-") as tmp:
            x = 100 + os.getpid() % 100
            cfg = Path(tmp) / "links.json"
            cfg.write_text(
                json.dumps(
                    {
                        "links": [
                            {"name": "bsig1", "addrs": [f"127.{x}.11.1"]},
                            {"name": "bsig2", "addrs": [f"127.{x}.11.2"]},
                        ]
                    }
                )
            )
            old = os.environ.get("SOFTVERBS_CONFIG")
            os.environ["SOFTVERBS_CONFIG"] = str(cfg)
            try:
                a = Mlx5Context(Mlx5DVContextAttr(), name="bsig1", features="sig")
                b = Mlx5Context(Mlx5DVContextAttr(), name="bsig2", features="sig")
                PEERS[:] = [a, b]
                try:
                    yield a, b, 0
                finally:
                    PEERS.clear()
                    a.close()
                    b.close()
            finally:
                if old is None:
                    os.environ.pop("SOFTVERBS_CONFIG", None)
                else:
                    os.environ["SOFTVERBS_CONFIG"] = old
        return
    ctx = Mlx5Context(Mlx5DVContextAttr(), name="sv0", features="sig")
    try:
        if delay:
            ctx.runtime.faults = FaultInjector([FaultRule(delay=delay)])
        yield ctx, ctx, 1
    finally:
        ctx.runtime.faults = None
        ctx.close()


def machine() -> str:
    cpus = os.cpu_count()
    return (
        f"machine: {platform.machine()}, {cpus} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}, softverbs {softverbs.__version__}"
    )


def human(size: int) -> str:
    return f"{size >> 10} KiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a fast smoke run")
    ap.add_argument("--iters", type=int, help="timed transactions per figure (median reported)")
    ap.add_argument(
        "--delay",
        type=float,
        default=50e-6,
        help="one-way delay of the simulated link, seconds (default 50e-6)",
    )
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead")
    add_quiet(ap)
    args = ap.parse_args()
    iters = args.iters or (15 if args.quick else 200)
    warmup = 2 if args.quick else 20
    cases = QUICK_CASES if args.quick else CASES
    links = [
        ("in-process", "inproc", 0.0),
        (f"in-process + {args.delay * 1e6:g} us/hop", "inproc", args.delay),
        ("UDP loopback", "udp", 0.0),
    ]
    rows: list[Row] = []
    progress = Progress(len(links) * len(cases), args.quiet)
    if not args.json:
        print(machine())
        print(
            f"median of {iters} transactions after {warmup} warm-up; one transaction = RDMA "
            f"WRITE of the data through a signature mkey + a {RESP}-byte response"
        )
        print()
        print(
            f" {'link':<24} {'signature':<9} {'size':>7} {'pipelined us':>13} "
            f"{'wait-check-send us':>19} {'saving us':>10} {'saving':>7}"
        )
    try:
        for label, kind, delay in links:
            with link(kind, delay) as (tctx, ictx, gid):
                for sig_name, size, sig in cases:
                    progress.step(f"{label}, {sig_name}, {human(size)}")
                    rig = Rig(tctx, ictx, gid, size, sig)
                    pipe = measure(rig, rig.pipelined, warmup, iters)
                    wcs = measure(rig, rig.wait_check_send, warmup, iters)
                    row = Row(label, sig_name, size, pipe, wcs)
                    rows.append(row)
                    if not args.json:
                        print(
                            f" {label:<24} {sig_name:<9} {human(size):>7} {pipe:>13.1f} "
                            f"{wcs:>19.1f} {row.saving_us:>10.1f} "
                            f"{row.saving_us / wcs:>7.0%}"
                        )
    except (BenchError, softverbs.PyverbsError) as e:
        print(f"bench_sig: FAILED: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps(
                {
                    "machine": machine(),
                    "iters": iters,
                    "rows": [asdict(r) | {"saving_us": r.saving_us} for r in rows],
                },
                indent=2,
            )
        )
    else:
        print()
        print(
            "saving = the WRITE's acknowledgement round trip (plus a poll and a post) that "
            "wait-check-send spends before the response may leave"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
