"""XRC domains (pyverbs ``xrcd``): ``XRCD(ctx, XRCDInitAttr(comp_mask, oflags, fd))``.

An XRC domain groups XRC SRQs and XRC receive QPs: a message that arrives on
an XRC receive QP may be delivered only to an SRQ of the same domain.

As ``ibv_open_xrcd`` does, a domain is shared through a file: opening the
XRCD with the file descriptor of a file that an open domain already uses
returns that same domain (the key is the file's inode).  With ``O_CREAT`` a
new domain is created if none exists; without it, opening a file no domain
uses is EINVAL; with ``O_EXCL`` too, opening a used file is EEXIST.
``fd = -1`` makes a private domain (``O_CREAT`` required).  Within one
process this works through the device; across processes it needs the
device service (``softverbs service``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from softverbs.device import ops, records
from softverbs.enums import (
    IBV_QP_STATE,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTR,
    IBV_QPT_XRC_RECV,
    IBV_XRCD_INIT_ATTR_FD,
    IBV_XRCD_INIT_ATTR_OFLAGS,
)
from softverbs.errors import einval
from softverbs.verbs.base import CStruct, PyverbsCM, PyverbsObject, require
from softverbs.verbs.provider import Attach, destroy

if TYPE_CHECKING:
    from softverbs.verbs.device import Context


class XRCDInitAttr(CStruct, PyverbsObject):
    """``ibv_xrcd_init_attr``."""

    _c_fields = {"comp_mask": 32, "oflags": -32, "fd": -32}

    def __init__(self, comp_mask: int, oflags: int, fd: int) -> None:
        super().__init__()
        self.comp_mask = comp_mask
        self.oflags = oflags
        self.fd = fd


class XRCD(PyverbsCM):
    """An XRC domain."""

    close_rank = 90

    def __init__(self, context: Context, init_attr: XRCDInitAttr) -> None:
        from softverbs.verbs.device import Context

        super().__init__()
        require(context, Context, "context")
        require(init_attr, XRCDInitAttr, "init_attr")
        context._check_open()
        need = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS
        if init_attr.comp_mask & need != need:
            raise einval("Failed to allocate XRCD: comp_mask needs IBV_XRCD_INIT_ATTR_FD "
                         "and IBV_XRCD_INIT_ATTR_OFLAGS")  # fmt: skip
        body = records.OpenXRCD(context.handle, init_attr.oflags & 0xFFFFFFFF,
                            records.OPEN_XRCD_HAS_FD if init_attr.fd != -1 else 0, 0)  # fmt: skip
        self.dev_handle: int = context.provider.call(ops.OPEN_XRCD, body,
                                                     Attach(file_fd=init_attr.fd)).handle
        self.ctx = context
        self._ctx = context
        context.add_ref(self)

    def _release(self) -> None:
        destroy(self._ctx.provider, records.KIND_XRCD, self.dev_handle)


# --- XRC receive QPs owned by the device (seed 002) ----------------------------------


def _alloc_steps(attr: Any, attr_mask: int) -> list[tuple[records.QPAttrs, int]]:
    """Split one attribute mask into the RESET->INIT and INIT->RTR modifies."""
    from softverbs.engine import qpstate
    from softverbs.verbs.qp import _attrs_of

    steps: list[tuple[records.QPAttrs, int]] = []
    left = attr_mask & ~IBV_QP_STATE
    cur = IBV_QPS_RESET
    for new in (IBV_QPS_INIT, IBV_QPS_RTR):
        rule = qpstate.rule(IBV_QPT_XRC_RECV, cur, new)
        assert rule is not None
        mask = (attr_mask & (rule[0] | rule[1])) | IBV_QP_STATE
        qpstate.check(IBV_QPT_XRC_RECV, cur, mask, new, None)
        record = _attrs_of(attr)
        record.qp_state = new
        steps.append((record, mask))
        left &= ~mask
        cur = new
    if left:
        raise einval(
            f"xrc_rcv_qp_alloc: attributes {qpstate.mask_names(left)} belong to neither "
            "RESET->INIT nor INIT->RTR"
        )
    return steps


def xrc_rcv_qp_alloc(xrcd: XRCD, attr: Any, attr_mask: int) -> int:
    """Create an XRC receive QP owned by the device, move it RESET->INIT->RTR
    with ``attr``/``attr_mask``, and register this process with it.

    Returns the QP number to hand to the sender.  The QP lives until the last
    process registered with it unregisters -- or dies (seed 002).
    """
    require(xrcd, XRCD, "xrcd")
    xrcd._check_open()
    (init, init_mask), (rtr, rtr_mask) = _alloc_steps(attr, attr_mask)
    body = records.XrcRcvAlloc(init, rtr, xrcd.dev_handle, init_mask, rtr_mask, 0)
    return xrcd.ctx.provider.call(ops.XRC_RCV_QP_ALLOC, body).qpn


def xrc_rcv_qp_register(xrcd: XRCD, qp_num: int) -> None:
    """Register this process with receive QP ``qp_num`` (once; again adds nothing).

    EINVAL if no such QP exists, it is not an XRC receive QP, or it belongs
    to another XRC domain.
    """
    require(xrcd, XRCD, "xrcd")
    xrcd._check_open()
    xrcd.ctx.provider.call(ops.XRC_RCV_QP_REGISTER, records.XrcQpn(xrcd.dev_handle, qp_num))


def xrc_rcv_qp_unregister(xrcd: XRCD, qp_num: int) -> None:
    """Drop this process's registration; the last one destroys the QP."""
    require(xrcd, XRCD, "xrcd")
    xrcd._check_open()
    xrcd.ctx.provider.call(ops.XRC_RCV_QP_UNREGISTER, records.XrcQpn(xrcd.dev_handle, qp_num))


def open_qp(ctx: Context, xrcd: XRCD, qp_num: int) -> Any:
    """``ibv_open_qp``: a QP object for an existing XRC receive QP of ``xrcd``."""
    from softverbs.verbs.qp import QP

    require(xrcd, XRCD, "xrcd")
    xrcd._check_open()
    reply = ctx.provider.call(ops.OPEN_QP, records.OpenQP(ctx.handle, xrcd.dev_handle, qp_num,
                                                      IBV_QPT_XRC_RECV))  # fmt: skip
    return QP.opened(ctx, xrcd, reply.qp, reply.qpn)
