"""softverbs: a software RDMA verbs device in Python.

The API follows pyverbs (rdma-core's Python bindings)::

    from softverbs import Context, PD, MR, CQ, QP, QPInitAttr, QPCap, ...

See the README and docs/ for the guide.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from softverbs import compiled as _compiled

# SOFTVERBS_PURE=1: the hot modules load from their .py even where compiled
# ones are installed (softverbs.compiled); this must run before any of them
_compiled.install_pure_hook()

if TYPE_CHECKING:
    from softverbs import enums

    #: whether the hot modules run compiled (Cython); softverbs.compiled.mode() says more
    COMPILED: bool
    from softverbs.enums import IBV_SEND_DEFER
    from softverbs.errors import PyverbsError, PyverbsRDMAError, PyverbsUserError, VerbsError
    from softverbs.sim import Simulation
    from softverbs.verbs.addr import AH, GID, GRH, AHAttr, GlobalRoute
    from softverbs.verbs.capture import Capture, capture
    from softverbs.verbs.cq import CQ, WC, CompChannel, wc_status_str
    from softverbs.verbs.device import AsyncEvent, Context, Device, counters, get_device_list
    from softverbs.verbs.mr import MR, MW, MWBind, MWBindInfo, inc_rkey
    from softverbs.verbs.pd import PD
    from softverbs.verbs.qp import (
        QP,
        QPAttr,
        QPCap,
        QPEx,
        QPInitAttr,
        QPInitAttrEx,
        open_qp,
        xrc_rcv_qp_alloc,
        xrc_rcv_qp_register,
        xrc_rcv_qp_unregister,
    )
    from softverbs.verbs.srq import SRQ, SrqAttr, SrqInitAttr, SrqInitAttrEx
    from softverbs.verbs.wr import SGE, RecvWR, SendWR
    from softverbs.verbs.xrcd import XRCD, XRCDInitAttr

#: public name -> the module that defines it.  Nothing is imported until a
#: name is used (PEP 562), so a tool that needs one module of softverbs (the
#: ``rdma`` command of ``softverbs exec``, ``softverbs --help``) starts fast.
_HOMES: dict[str, str] = {
    "IBV_SEND_DEFER": "softverbs.enums",
    **dict.fromkeys(("PyverbsError", "PyverbsRDMAError", "PyverbsUserError", "VerbsError"),
                    "softverbs.errors"),
    **dict.fromkeys(("AH", "GID", "GRH", "AHAttr", "GlobalRoute"), "softverbs.verbs.addr"),
    **dict.fromkeys(("Capture", "capture"), "softverbs.verbs.capture"),
    **dict.fromkeys(("CQ", "WC", "CompChannel", "wc_status_str"), "softverbs.verbs.cq"),
    **dict.fromkeys(("AsyncEvent", "Context", "Device", "counters", "get_device_list"),
                    "softverbs.verbs.device"),
    **dict.fromkeys(("MR", "MW", "MWBind", "MWBindInfo", "inc_rkey"), "softverbs.verbs.mr"),
    "PD": "softverbs.verbs.pd",
    "Simulation": "softverbs.sim",
    **dict.fromkeys(("QP", "QPAttr", "QPCap", "QPEx", "QPInitAttr", "QPInitAttrEx", "open_qp",
                     "xrc_rcv_qp_alloc", "xrc_rcv_qp_register", "xrc_rcv_qp_unregister"),
                    "softverbs.verbs.qp"),
    **dict.fromkeys(("SRQ", "SrqAttr", "SrqInitAttr", "SrqInitAttrEx"), "softverbs.verbs.srq"),
    **dict.fromkeys(("SGE", "RecvWR", "SendWR"), "softverbs.verbs.wr"),
    **dict.fromkeys(("XRCD", "XRCDInitAttr"), "softverbs.verbs.xrcd"),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name == "COMPILED":  # not cached: SOFTVERBS_PURE is read at import
        return bool(_compiled.compiled_modules())
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    else:
        try:  # a submodule: softverbs.enums, softverbs.verbs, ...
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__version__ = "0.1.0"

__all__ = [
    "AH",
    "COMPILED",
    "CQ",
    "GID",
    "GRH",
    "IBV_SEND_DEFER",
    "MR",
    "MW",
    "PD",
    "QP",
    "SGE",
    "SRQ",
    "WC",
    "XRCD",
    "AHAttr",
    "AsyncEvent",
    "Capture",
    "CompChannel",
    "Context",
    "Device",
    "GlobalRoute",
    "MWBind",
    "MWBindInfo",
    "PyverbsError",
    "PyverbsRDMAError",
    "PyverbsUserError",
    "QPAttr",
    "QPCap",
    "QPEx",
    "QPInitAttr",
    "QPInitAttrEx",
    "RecvWR",
    "SendWR",
    "Simulation",
    "SrqAttr",
    "SrqInitAttr",
    "SrqInitAttrEx",
    "VerbsError",
    "XRCDInitAttr",
    "capture",
    "counters",
    "enums",
    "get_device_list",
    "inc_rkey",
    "open_qp",
    "wc_status_str",
    "xrc_rcv_qp_alloc",
    "xrc_rcv_qp_register",
    "xrc_rcv_qp_unregister",
]
