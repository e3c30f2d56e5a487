"""post_send on a QP that has no send queue (an XRC receive QP).

The compiled post path holds the send ring typed (verbs/qp.pxd), where a missing
ring is a None that must never be read through: the post must fail with EINVAL
naming the WR, hand it back through ``bad_wr``, and leave the QP usable for the
next call, in both modes.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from softverbs import MR, PD, QP, SGE, Context, SendWR
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_QP_INIT_ATTR_XRCD,
    IBV_QPT_XRC_RECV,
    IBV_WR_SEND,
    IBV_XRCD_INIT_ATTR_FD,
    IBV_XRCD_INIT_ATTR_OFLAGS,
)
from softverbs.errors import PyverbsRDMAError
from softverbs.verbs.qp import QPInitAttrEx
from softverbs.verbs.xrcd import XRCD, XRCDInitAttr


def test_post_send_to_an_xrc_receive_qp_is_einval(tmp_path: Path) -> None:
    with Context(name="sv0") as ctx:
        fd = os.open(tmp_path / "xrcd", os.O_RDONLY | os.O_CREAT, 0o600)
        try:
            attr = XRCDInitAttr(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS, os.O_CREAT, fd)
            xrcd = XRCD(ctx, attr)
        finally:
            os.close(fd)
        qp = QP(ctx, QPInitAttrEx(qp_type=IBV_QPT_XRC_RECV, xrcd=xrcd,
                                  comp_mask=IBV_QP_INIT_ATTR_XRCD))  # fmt: skip
        pd = PD(ctx)
        mr = MR(pd, 64, IBV_ACCESS_LOCAL_WRITE)
        second = SendWR(8, IBV_WR_SEND, 1, sg=[SGE(mr.buf, 8, mr.lkey)])
        first = SendWR(7, IBV_WR_SEND, 1, sg=[SGE(mr.buf, 8, mr.lkey)], next_wr=second)
        for _ in range(2):  # and again: the failed post left nothing behind
            bad = SendWR(0, IBV_WR_SEND, 1, sg=[SGE(0, 0, 0)])
            with pytest.raises(PyverbsRDMAError) as exc:
                qp.post_send(first, bad)
            assert exc.value.error_code == errno.EINVAL
            assert "WR #0 (wr_id=7)" in str(exc.value)
            assert "IBV_QPT_XRC_RECV QP has no send queue" in str(exc.value)
            assert bad.wr_id == 7
