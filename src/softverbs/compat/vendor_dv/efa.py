"""The EFA direct-verbs classes of pyverbs, on softverbs devices.

As in pyverbs, :class:`EfaContext` opens any device (it is a plain context);
what makes a device an EFA device is that ``efadv_query_device`` answers, and
on softverbs it fails with EOPNOTSUPP.  Everything that needs the EFA driver
(SRD QPs, EFA CQs, MRs, AHs) fails the same way.  See :mod:`softverbs.compat.vendor_dv`.
"""

from __future__ import annotations

import errno
from functools import cache
from typing import Any

from softverbs.compat.vendor_dv import attr_class, object_class, unsupported_function
from softverbs.errors import PyverbsRDMAError
from softverbs.verbs.base import PyverbsObject

VENDOR = "EFA"
_MODULE = "pyverbs.providers.efa.efadv"


@cache
def _efa_context() -> type:
    from softverbs.verbs.device import Context

    class EfaContext(Context):
        """pyverbs' ``EfaContext``: a context whose EFA queries fail on softverbs."""

        def __init__(self, name: str = "") -> None:
            super().__init__(name=name)

        def query_efa_device(self) -> Any:
            raise PyverbsRDMAError(f"Failed to query efa device {self.name}: softverbs is "
                                   "not an EFA device", errno.EOPNOTSUPP)  # fmt: skip

    EfaContext.__module__ = _MODULE
    return EfaContext


@cache
def module_names() -> dict[str, object]:
    """``name -> object`` for ``pyverbs.providers.efa.efadv``."""
    from softverbs.verbs.addr import AH
    from softverbs.verbs.cqex import CQEX
    from softverbs.verbs.mr import MR
    from softverbs.verbs.qp import QP, QPEx

    out: dict[str, object] = {"EfaContext": _efa_context()}
    for name in ("EfaDVDeviceAttr", "EfaDVAHAttr", "EfaQPInitAttr", "EfaDVCQInitAttr",
                 "EfaDVMRAttr"):  # fmt: skip
        out[name] = attr_class(name, _MODULE, PyverbsObject)
    bases: dict[str, type] = {"EfaAH": AH, "SRDQP": QP, "SRDQPEx": QPEx, "EfaCQ": CQEX,
                              "EfaMR": MR}  # fmt: skip
    for name, base in bases.items():
        out[name] = object_class(name, _MODULE, VENDOR, base)
    for name in ("dev_cap_to_str", "bitmask_to_str"):
        out[name] = unsupported_function(name, VENDOR)
    return out
