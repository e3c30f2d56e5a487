"""XRC domains.

An XRC domain (``ibv_open_xrcd``) is shared by the processes that open it
with the same file: the device keys it by the file's identity, counts its
openers and forgets it when the last one closes.  The XRC receive QPs that
live in a domain are QPs: :mod:`softverbs.device.qp` opens and holds them.
"""

from __future__ import annotations

import errno
import os

from softverbs.device import records
from softverbs.device.core import CtxObj, Host, Obj, Owner, Resources, kind_class
from softverbs.device.records import KIND_XRCD
from softverbs.engine.hca import HCA, XrcDomain
from softverbs.errors import PyverbsRDMAError, einval


@kind_class
class XRCDObj(Obj):
    KIND = KIND_XRCD
    __slots__ = ()

    engine: XrcDomain

    def __init__(self, owner: Owner, ctx: CtxObj, domain: XrcDomain) -> None:
        super().__init__(owner, ctx.device, ctx)
        self.engine = domain

    def teardown(self, hca: HCA) -> None:
        hca.close_xrcd(self.engine)


def open_xrcd(host: Host, owner: Owner, req: records.OpenXRCD, res: Resources) -> records.Handle:
    ctx = host.ctx(owner, req.ctx)
    dev = ctx.device
    key = res.file_key
    hca = dev.hca
    with host.on(dev):
        domain = hca.xrcds.get(key) if key is not None else None
        if domain is not None:
            if req.oflags & os.O_CREAT and req.oflags & os.O_EXCL:
                raise PyverbsRDMAError("Failed to allocate XRCD: the file already backs "
                                       "an XRC domain and O_EXCL was given", errno.EEXIST)
        else:
            if not req.oflags & os.O_CREAT:
                raise einval("Failed to allocate XRCD: no XRC domain uses this file; "
                             "pass O_CREAT to create one")  # fmt: skip
            domain = hca.open_xrcd(key)
        domain.refs += 1
        rec = host.add(XRCDObj(owner, ctx, domain), (ctx,))
    return records.Handle(rec.handle, 0)
