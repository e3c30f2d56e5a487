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

The XRC receive QPs of a domain (``open_qp``, ``xrc_rcv_qp_*``) are QPs, and
live in :mod:`softverbs.verbs.qp`.
"""

from __future__ import annotations

from softverbs.device import ops, records
from softverbs.enums import (
    IBV_XRCD_INIT_ATTR_FD,
    IBV_XRCD_INIT_ATTR_OFLAGS,
)
from softverbs.errors import einval
from softverbs.verbs.base import CStruct, PyverbsCM, PyverbsObject, require
from softverbs.verbs.device import Context
from softverbs.verbs.provider import Attach, destroy


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
