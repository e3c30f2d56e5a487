"""Signature pipelining: a storage target that answers before its data is verified.

A block storage target keeps each 512-byte sector with its T10-DIF tuple (a
CRC16 guard, an application tag and the sector's LBA as reference tag), as
disks with protection information do.  To serve a READ command it must send
the sectors to the initiator -- checking every DIF on the way, and stripping
it -- and then a response saying whether the data was good.

Waiting for the data transfer to finish, checking it, and only then sending
the response costs a round trip per command.  With signature pipelining
(mlx5dv, and softverbs with ``features="sig"``) the target posts, for each
command, in one go:

1. ``wr_mkey_configure``: an mkey over the command's sectors that checks and
   strips their DIFs (memory domain T10-DIF, wire domain none);
2. an RDMA WRITE of the data through that mkey, into the initiator's buffer;
3. the good response: a SEND with ``IBV_SEND_FENCE``.

If a sector fails its check, the send queue stops in SQD before that
command's response leaves, and the device posts ``IBV_EVENT_SQ_DRAINED``.
The target then follows the recipe of mlx5dv_qp_cancel_posted_send_wrs(3):
poll the CQ until it is empty, check the mkeys of the open commands, cancel
the failed command's response by its wr_id, send an error response instead,
and move the QP back to RTS.

Run it: ``python examples/sig_pipelining.py [--device sv0] [--commands 8]
[--corrupt 5]``.  Both ends run in this process; the exit status is 0 when
every command got the response its data deserved.
"""

from __future__ import annotations

import argparse
import sys

from softverbs import (
    CQ,
    MR,
    PD,
    SGE,
    AHAttr,
    GlobalRoute,
    PyverbsRDMAError,
    QPAttr,
    QPCap,
    QPInitAttrEx,
    RecvWR,
    SendWR,
)
from softverbs.compat.vendor_dv.mlx5_enums import mlx5dv_block_size as bs
from softverbs.compat.vendor_dv.mlx5_enums import mlx5dv_mkey_err_type as err
from softverbs.compat.vendor_dv.mlx5_enums import mlx5dv_mkey_init_attr_flags as mkflags
from softverbs.compat.vendor_dv.mlx5_enums import mlx5dv_qp_create_flags as qpflags
from softverbs.compat.vendor_dv.mlx5_enums import mlx5dv_qp_create_send_ops_flags as ops
from softverbs.compat.vendor_dv.mlx5_enums import mlx5dv_qp_init_attr_mask as mask
from softverbs.compat.vendor_dv.mlx5_enums import mlx5dv_sig_mask as sigmask
from softverbs.compat.vendor_dv.mlx5_enums import mlx5dv_sig_t10dif_flags as difflags
from softverbs.compat.vendor_dv.mlx5_enums import mlx5dv_sig_type as sigtype
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_EVENT_SQ_DRAINED,
    IBV_MTU_1024,
    IBV_QP_CUR_STATE,
    IBV_QP_EX_WITH_RDMA_WRITE,
    IBV_QP_EX_WITH_SEND,
    IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    IBV_QP_STATE,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPT_RC,
    IBV_SEND_FENCE,
    IBV_SEND_INLINE,
    IBV_SEND_SIGNALED,
    IBV_WC_SUCCESS,
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
    Mlx5SigT10Dif,
    sig_image,
)

SECTOR = 512
PI = 8  #: T10-DIF tuple per sector
PER_CMD = 4  #: sectors per READ command
APP_TAG = 0x5354
ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
RESP = 32  #: bytes of a response


def dif_domain(first_lba: int) -> Mlx5SigBlockDomain:
    """T10-DIF per 512-byte sector; the reference tag is the LBA (REF_REMAP: +1 per sector)."""
    dif = Mlx5SigT10Dif(
        app_tag=APP_TAG, ref_tag=first_lba, flags=difflags.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP
    )
    return Mlx5SigBlockDomain(
        sig_type=sigtype.MLX5DV_SIG_TYPE_T10DIF, dif=dif, block_size=bs.MLX5DV_BLOCK_SIZE_512
    )


def make_qp(ctx: Mlx5Context, pd: PD, cq: CQ, pipelining: bool) -> Mlx5QP:
    init = QPInitAttrEx(
        qp_type=IBV_QPT_RC,
        scq=cq,
        rcq=cq,
        pd=pd,
        cap=QPCap(max_send_wr=256, max_recv_wr=64, max_inline_data=512),
        comp_mask=IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        send_ops_flags=IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE,
    )
    flags = qpflags.MLX5DV_QP_CREATE_SIG_PIPELINING if pipelining else 0
    dv = Mlx5DVQPInitAttr(
        comp_mask=mask.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS
        | mask.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
        create_flags=flags,
        send_ops_flags=ops.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE,
    )
    return Mlx5QP(ctx, init, dv)


def connect(ctx: Mlx5Context, qp: Mlx5QP, peer: Mlx5QP) -> None:
    attr = QPAttr()
    attr.qp_access_flags = ACCESS
    attr.dest_qp_num = peer.qp_num
    attr.path_mtu = IBV_MTU_1024
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 4
    attr.min_rnr_timer = 1
    attr.timeout, attr.retry_cnt, attr.rnr_retry = 14, 7, 7
    # the device's IPv4 GID: index 1 on the in-process device, 0 on a UDP one bound to an address
    index = 1 if ctx.query_gid(1, 1).gid != "0000:0000:0000:0000:0000:0000:0000:0000" else 0
    route = GlobalRoute(dgid=ctx.query_gid(1, index), sgid_index=index)
    attr.ah_attr = AHAttr(is_global=1, port_num=1, gr=route)
    qp.to_rts(attr)


def poll(cq: CQ, n: int) -> list:  # type: ignore[type-arg]
    out = []
    while len(out) < n:
        out.extend(cq.poll(n - len(out))[1])
    return out


class Target:
    """The storage target: a 'disk' of protected sectors, and the command loop."""

    def __init__(self, ctx: Mlx5Context, pd: PD, commands: int) -> None:
        self.ctx = ctx
        self.cq = CQ(ctx, 1024)
        self.qp = make_qp(ctx, pd, self.cq, pipelining=True)
        sectors = commands * PER_CMD
        self.disk = MR(pd, sectors * (SECTOR + PI) + commands * RESP, ACCESS)
        self.resp_base = sectors * (SECTOR + PI)
        # the disk: each sector's data followed by its DIF (guard, app tag, LBA)
        for lba in range(sectors):
            data = bytes([lba & 0xFF]) * SECTOR
            self.disk.write(sig_image(data, dif_domain(lba)), SECTOR + PI, lba * (SECTOR + PI))
        self.mkeys = [
            Mlx5Mkey(
                pd,
                mkflags.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
                | mkflags.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE,
                1,
            )
            for _ in range(commands)
        ]
        self.open: set[int] = set()

    def corrupt(self, cmd: int) -> None:
        """Flip a bit in the second sector of command ``cmd`` (a latent media error)."""
        lba = cmd * PER_CMD + 1
        off = lba * (SECTOR + PI) + 100
        byte = self.disk.read(1, off)[0] ^ 0x04
        self.disk.write(bytes([byte]), 1, off)

    def respond(self, cmd: int, text: str, wr_id: int) -> None:
        off = self.resp_base + cmd * RESP
        self.disk.write(text.encode().ljust(RESP), RESP, off)
        flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE
        self.qp.post_send(
            SendWR(
                wr_id=wr_id,
                opcode=IBV_WR_SEND,
                num_sge=1,
                send_flags=flags,
                sg=[SGE(self.disk.buf + off, RESP, self.disk.lkey)],
            )
        )

    def serve(self, cmd: int, rkey: int, raddr: int) -> None:
        """Configure the command's mkey, WRITE the data through it, send the good response:
        posted together, nothing waited for."""
        first = cmd * PER_CMD
        mkey = self.mkeys[cmd]
        qp = self.qp
        qp.wr_start()
        qp.wr_id = cmd
        qp.wr_flags = IBV_SEND_INLINE  # an unsignaled configuration
        qp.wr_mkey_configure(mkey, 3, Mlx5MkeyConfAttr())
        qp.wr_set_mkey_access_flags(IBV_ACCESS_LOCAL_WRITE)
        qp.wr_set_mkey_layout_list(
            [SGE(self.disk.buf + first * (SECTOR + PI), PER_CMD * (SECTOR + PI), self.disk.lkey)]
        )
        qp.wr_set_mkey_sig_block(
            Mlx5SigBlockAttr(
                mem=dif_domain(first),
                check_mask=sigmask.MLX5DV_SIG_MASK_T10DIF_GUARD
                | sigmask.MLX5DV_SIG_MASK_T10DIF_REFTAG
                | sigmask.MLX5DV_SIG_MASK_T10DIF_APPTAG,
            )
        )
        qp.wr_flags = 0  # the data: unsignaled
        qp.wr_rdma_write(rkey, raddr)
        qp.wr_set_sge(SGE(0, PER_CMD * SECTOR, mkey.lkey))  # wire bytes: the DIFs are stripped
        qp.wr_complete()
        self.open.add(cmd)
        self.respond(cmd, f"cmd {cmd}: GOOD", wr_id=cmd)

    def handle_completions(self, wcs: list) -> None:  # type: ignore[type-arg]
        for wc in wcs:
            if wc.status != IBV_WC_SUCCESS:
                raise SystemExit(f"target: WR {wc.wr_id} failed: {wc.reason}")
            if wc.opcode == 0 and wc.wr_id in self.open:  # IBV_WC_SEND: a response went out
                self.open.discard(wc.wr_id)

    def recover(self) -> None:
        """The SQ stopped: the recipe of mlx5dv_qp_cancel_posted_send_wrs(3)."""
        print("target: IBV_EVENT_SQ_DRAINED -- a transfer failed its signature check")
        # 1. poll everything, until the CQ is empty once
        while True:
            n, wcs = self.cq.poll(16)
            if not n:
                break
            self.handle_completions(wcs)
        # 2. check the mkeys of the open commands; the failed ones are found by wr_id
        for cmd in sorted(self.open):
            e = self.mkeys[cmd].mkey_check()
            if e.err_type == err.MLX5DV_MKEY_NO_ERR:
                continue
            lba = cmd * PER_CMD + e.sig_err.offset // SECTOR
            what = err(e.err_type).name.rsplit("_", 1)[-1].lower()
            print(
                f"target: cmd {cmd}: bad {what} in LBA {lba} (tuple holds "
                f"{e.sig_err.expected_value:#x}, data gives {e.sig_err.actual_value:#x})"
            )
            # 3. cancel its good response, and queue an error response instead
            assert self.qp.cancel_posted_send_wrs(cmd) == 1
            self.respond(cmd, f"cmd {cmd}: MEDIUM ERROR lba {lba}", wr_id=cmd)
        # 4. back to RTS: the send queue resumes with the next WQE
        self.qp.modify(
            QPAttr(qp_state=IBV_QPS_RTS, cur_qp_state=IBV_QPS_SQD), IBV_QP_STATE | IBV_QP_CUR_STATE
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="sv0")
    ap.add_argument("--commands", type=int, default=8)
    ap.add_argument(
        "--corrupt",
        type=int,
        action="append",
        default=None,
        help="corrupt a sector of this command (repeatable; default: 5; -1: none)",
    )
    args = ap.parse_args(argv)
    n = args.commands
    bad = {c for c in (args.corrupt if args.corrupt is not None else [5]) if 0 <= c < n}
    # Opening the context with features="sig" is the opt-in (or SOFTVERBS_MLX5=sig).
    ctx = Mlx5Context(Mlx5DVContextAttr(), name=args.device, features="sig")
    pd = PD(ctx)
    target = Target(ctx, pd, n)
    for cmd in bad:
        target.corrupt(cmd)
    # the initiator: a buffer per command and a receive per response
    icq = CQ(ctx, 1024)
    iqp = make_qp(ctx, pd, icq, pipelining=False)
    buf = MR(pd, n * (PER_CMD * SECTOR + RESP), ACCESS)
    connect(ctx, target.qp, iqp)
    connect(ctx, iqp, target.qp)
    resp_base = n * PER_CMD * SECTOR
    for cmd in range(n):
        sge = SGE(buf.buf + resp_base + cmd * RESP, RESP, buf.lkey)
        iqp.post_recv(RecvWR(wr_id=cmd, num_sge=1, sg=[sge]))

    for cmd in range(n):
        target.serve(cmd, buf.rkey, buf.buf + cmd * PER_CMD * SECTOR)
    responses = 0
    while responses < n:
        try:
            ev = ctx.get_async_event(timeout=0)
            ev.ack()
            if ev.event_type == IBV_EVENT_SQ_DRAINED:
                target.recover()
        except PyverbsRDMAError:
            pass  # no event
        target.handle_completions(target.cq.poll(16)[1])
        k, wcs = icq.poll(16)
        responses += k
        for wc in wcs:
            assert wc.status == IBV_WC_SUCCESS
    ok = True
    for k in range(n):
        text = buf.read(RESP, resp_base + k * RESP).decode().strip()
        cmd = int(text.split()[1].rstrip(":"))
        first = cmd * PER_CMD
        got = buf.read(PER_CMD * SECTOR, first * SECTOR)
        data_ok = got == b"".join(bytes([first + s]) * SECTOR for s in range(PER_CMD))
        good = "GOOD" in text
        print(f"initiator: {text:<32} data {'intact' if data_ok else 'corrupt'}")
        ok &= good == data_ok == (cmd not in bad)
    print("every command got the response its data deserved" if ok else "MISMATCH")
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
