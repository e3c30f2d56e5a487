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

from typing import TYPE_CHECKING

from softverbs.engine.hca import XrcDomain
from softverbs.enums import IBV_XRCD_INIT_ATTR_FD, IBV_XRCD_INIT_ATTR_OFLAGS
from softverbs.errors import einval
from softverbs.verbs.base import PyverbsCM, PyverbsObject, require

if TYPE_CHECKING:
    from softverbs.verbs.device import Context


class XRCDInitAttr(PyverbsObject):
    """``ibv_xrcd_init_attr``."""

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
        self.domain: XrcDomain = context.provider.open_xrcd(init_attr.fd, init_attr.oflags)
        self.ctx = context
        self._ctx = context
        context.add_ref(self)

    def _release(self) -> None:
        self._ctx.provider.close_xrcd(self.domain)
