"""Shared set-up for the signature tests, written the way an mlx5dv program is.

Two :class:`~softverbs.ext.mlx5dv.Mlx5QP` RC QPs on ``sv0`` connected to each
other: ``target`` (a storage target: it moves data through signature mkeys
and sends responses) and ``initiator`` (plain memory, receives responses).
Nothing waits without a bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from softverbs import (
    CQ,
    MR,
    PD,
    SGE,
    WC,
    PyverbsRDMAError,
    QPCap,
    QPInitAttrEx,
    RecvWR,
    SendWR,
    testing,
    wc_status_str,
)
from softverbs.compat.vendor_dv.mlx5_enums import (
    mlx5dv_block_size,
    mlx5dv_mkey_init_attr_flags,
    mlx5dv_qp_create_flags,
    mlx5dv_qp_create_send_ops_flags,
    mlx5dv_qp_init_attr_mask,
    mlx5dv_sig_crc_type,
    mlx5dv_sig_mask,
    mlx5dv_sig_t10dif_bg_type,
    mlx5dv_sig_t10dif_flags,
    mlx5dv_sig_type,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QP_EX_WITH_RDMA_READ,
    IBV_QP_EX_WITH_RDMA_WRITE,
    IBV_QP_EX_WITH_SEND,
    IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    IBV_QPT_RC,
    IBV_SEND_FENCE,
    IBV_SEND_INLINE,
    IBV_SEND_SIGNALED,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_SEND,
    ibv_event_type,
)
from softverbs.ext.mlx5dv import (
    Mlx5Context,
    Mlx5DVContextAttr,
    Mlx5DVQPInitAttr,
    Mlx5Mkey,
    Mlx5MkeyConfAttr,
    Mlx5MrInterleaved,
    Mlx5QP,
    Mlx5SigBlockAttr,
    Mlx5SigBlockDomain,
    Mlx5SigCrc,
    Mlx5SigT10Dif,
)

RW = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
SIG_MKEY = (
    mlx5dv_mkey_init_attr_flags.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
    | mlx5dv_mkey_init_attr_flags.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE
)
PLAIN_MKEY = mlx5dv_mkey_init_attr_flags.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
BS_512 = mlx5dv_block_size.MLX5DV_BLOCK_SIZE_512
BS_4096 = mlx5dv_block_size.MLX5DV_BLOCK_SIZE_4096
MASK_CRC32 = mlx5dv_sig_mask.MLX5DV_SIG_MASK_CRC32
MASK_T10 = (
    mlx5dv_sig_mask.MLX5DV_SIG_MASK_T10DIF_GUARD
    | mlx5dv_sig_mask.MLX5DV_SIG_MASK_T10DIF_APPTAG
    | mlx5dv_sig_mask.MLX5DV_SIG_MASK_T10DIF_REFTAG
)
MR_SIZE = 1 << 16


def open_ctx(name: str = "sv0") -> Mlx5Context:
    return Mlx5Context(Mlx5DVContextAttr(), name=name, features="sig")


def crc_domain(
    crc_type: int = mlx5dv_sig_crc_type.MLX5DV_SIG_CRC_TYPE_CRC32,
    block_size: int = BS_512,
    seed: int = 0xFFFFFFFF,
) -> Mlx5SigBlockDomain:
    return Mlx5SigBlockDomain(
        sig_type=mlx5dv_sig_type.MLX5DV_SIG_TYPE_CRC,
        crc=Mlx5SigCrc(crc_type, seed),
        block_size=block_size,
    )


def t10_domain(
    block_size: int = BS_512,
    app_tag: int = 0xABCD,
    ref_tag: int = 0x100,
    flags: int = mlx5dv_sig_t10dif_flags.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP,
    bg_type: int = mlx5dv_sig_t10dif_bg_type.MLX5DV_SIG_T10DIF_CRC,
    bg: int = 0,
) -> Mlx5SigBlockDomain:
    dif = Mlx5SigT10Dif(bg_type=bg_type, bg=bg, app_tag=app_tag, ref_tag=ref_tag, flags=flags)
    return Mlx5SigBlockDomain(
        sig_type=mlx5dv_sig_type.MLX5DV_SIG_TYPE_T10DIF, dif=dif, block_size=block_size
    )


@dataclass
class End:
    qp: Mlx5QP
    cq: CQ
    mr: MR

    def sge(self, offset: int, length: int) -> SGE:
        return SGE(self.mr.buf + offset, length, self.mr.lkey)


@dataclass
class Pair:
    ctx: Mlx5Context
    pd: PD
    target: End
    initiator: End
    extras: list[Any] = field(default_factory=list)


def make_qp(ctx: Mlx5Context, pd: PD, cq: CQ, *, pipelining: bool, max_send_wr: int) -> Mlx5QP:
    cap = QPCap(
        max_send_wr=max_send_wr,
        max_recv_wr=max_send_wr,
        max_send_sge=2,
        max_recv_sge=2,
        max_inline_data=512,
    )
    init = QPInitAttrEx(
        qp_type=IBV_QPT_RC,
        scq=cq,
        rcq=cq,
        pd=pd,
        cap=cap,
        comp_mask=IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        send_ops_flags=IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ,
    )
    flags = mlx5dv_qp_create_flags.MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE
    if pipelining:
        flags |= mlx5dv_qp_create_flags.MLX5DV_QP_CREATE_SIG_PIPELINING
    mask = mlx5dv_qp_init_attr_mask
    dv = Mlx5DVQPInitAttr(
        comp_mask=mask.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS
        | mask.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
        create_flags=flags,
        send_ops_flags=mlx5dv_qp_create_send_ops_flags.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE,
    )
    return Mlx5QP(ctx, init, dv)


def connect(
    ctx: Mlx5Context, qp: Mlx5QP, remote_qpn: int, gid_index: int = 1, timeout: int = 14
) -> None:
    testing.connect_qp(qp, remote_qpn, testing.route(ctx, gid_index), qp_access_flags=RW,
                       timeout=timeout)  # fmt: skip


def make_pair(
    ctx: Mlx5Context, *, pipelining: bool = True, max_send_wr: int = 64, timeout: int = 14
) -> Pair:
    pd = PD(ctx)
    ends = []
    for _ in range(2):
        cq = CQ(ctx, 1024)
        qp = make_qp(ctx, pd, cq, pipelining=pipelining, max_send_wr=max_send_wr)
        ends.append(End(qp, cq, MR(pd, MR_SIZE, RW)))
    target, initiator = ends
    connect(ctx, target.qp, initiator.qp.qp_num, timeout=timeout)
    connect(ctx, initiator.qp, target.qp.qp_num, timeout=timeout)
    return Pair(ctx, pd, target, initiator)


def configure(
    end: End,
    mkey: Mlx5Mkey,
    layout: list[SGE] | tuple[int, list[Mlx5MrInterleaved]],
    access: int = RW,
    sig: Mlx5SigBlockAttr | None = None,
    wr_id: int = 0xC0F,
) -> None:
    """A signaled ``wr_mkey_configure`` WR with access flags, a layout and maybe a
    signature; waits for its completion."""
    qp = end.qp
    qp.wr_start()
    qp.wr_id = wr_id
    qp.wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE
    qp.wr_mkey_configure(mkey, 3 if sig is not None else 2, Mlx5MkeyConfAttr())
    qp.wr_set_mkey_access_flags(access)
    if isinstance(layout, list):
        qp.wr_set_mkey_layout_list(layout)
    else:
        qp.wr_set_mkey_layout_interleaved(layout[0], layout[1])
    if sig is not None:
        qp.wr_set_mkey_sig_block(sig)
    qp.wr_complete()
    wc = poll_n(end.cq, 1, what="mkey configuration")[0]
    assert (wc.wr_id, wc.status, wc.opcode) == (wr_id, 0, 135), describe([wc])


def write_wr(wr_id: int, sge: SGE, rkey: int, remote_addr: int, flags: int = 0) -> SendWR:
    wr = SendWR(wr_id=wr_id, opcode=IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=flags)
    wr.set_wr_rdma(rkey, remote_addr)
    return wr


def read_wr(wr_id: int, sge: SGE, rkey: int, remote_addr: int, flags: int = 0) -> SendWR:
    wr = SendWR(wr_id=wr_id, opcode=IBV_WR_RDMA_READ, num_sge=1, sg=[sge], send_flags=flags)
    wr.set_wr_rdma(rkey, remote_addr)
    return wr


def response_wr(wr_id: int, sge: SGE, fence: bool = True) -> SendWR:
    flags = IBV_SEND_SIGNALED | (IBV_SEND_FENCE if fence else 0)
    return SendWR(wr_id=wr_id, opcode=IBV_WR_SEND, num_sge=1, sg=[sge], send_flags=flags)


def recv_wr(wr_id: int, sge: SGE) -> RecvWR:
    return RecvWR(wr_id=wr_id, num_sge=1, sg=[sge])


def describe(wcs: list[WC]) -> str:
    return ", ".join(
        f"(wr_id={w.wr_id}, {wc_status_str(w.status)}, opcode={w.opcode}, byte_len={w.byte_len})"
        for w in wcs
    )


#: the world of the running test (the ``ctx`` fixture's); :func:`poll_n` waits in it
current: testing.World | None = None


def poll_n(cq: CQ, n: int, timeout: float = 5.0, what: str = "CQ") -> list[WC]:
    """Exactly ``n`` completions of any status (:func:`softverbs.testing.wait_completions`)."""
    assert current is not None, "a signature test waited outside the ctx fixture"
    wcs: list[WC] = testing.wait_completions(current, cq, n, timeout=timeout, status=None,
                                             what=what)  # fmt: skip
    return wcs


def poll_until_empty(cq: CQ) -> list[WC]:
    """Step 1 of the seed: poll everything, until the CQ is empty once."""
    out: list[WC] = []
    while True:
        k, wcs = cq.poll(16)
        if not k:
            return out
        out.extend(wcs)


def expect_event(ctx: Mlx5Context, event_type: int, timeout: float = 3.0) -> Any:
    try:
        ev = ctx.get_async_event(timeout=timeout)
    except PyverbsRDMAError as e:
        pytest.fail(f"expected {ibv_event_type(event_type).name}, none came: {e}")
    assert ev.event_type == event_type, (ev.event_type, ev.reason)
    ev.ack()
    return ev


def no_event(ctx: Mlx5Context) -> None:
    with pytest.raises(PyverbsRDMAError):
        ev = ctx.get_async_event(timeout=0.01)
        pytest.fail(f"unexpected async event {ev.event_type} ({ev.reason})")


def engine_xform(mkey: Mlx5Mkey) -> Any:
    """The mkey's transform in the engine when the device runs in this process
    (for tests that look inside), else None."""
    from softverbs.device import records

    engine_of = getattr(mkey.pd.ctx.provider, "engine_of", None)
    if engine_of is None:
        return None
    return engine_of(records.KIND_MKEY, mkey.dev_handle).xform


def set_faults(ctx: Any, rules: str) -> None:
    """Seeded faults on this process's packets (SOFTVERBS_FAULTS syntax), on
    either kind of device."""
    from softverbs.device import ops, records
    from softverbs.verbs.provider import Attach

    ctx.provider.call(ops.FAULTS, records.Ctx(ctx.handle, 0), Attach(text=rules))
