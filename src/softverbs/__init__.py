"""softverbs: a software RDMA verbs device in Python.

The API follows pyverbs (rdma-core's Python bindings)::

    from softverbs import Context, PD, MR, CQ, QP, QPInitAttr, QPCap, ...

See the README and docs/ for the guide.
"""

from softverbs import enums
from softverbs.enums import IBV_SEND_DEFER
from softverbs.errors import PyverbsError, PyverbsRDMAError, PyverbsUserError, VerbsError
from softverbs.verbs.addr import AH, GID, GRH, AHAttr, GlobalRoute
from softverbs.verbs.cq import CQ, WC, CompChannel, wc_status_str
from softverbs.verbs.device import AsyncEvent, Context, Device, counters, get_device_list
from softverbs.verbs.mr import MR, MW, MWBind, MWBindInfo, inc_rkey
from softverbs.verbs.pd import PD
from softverbs.verbs.qp import QP, QPAttr, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from softverbs.verbs.srq import SRQ, SrqAttr, SrqInitAttr, SrqInitAttrEx
from softverbs.verbs.wr import SGE, RecvWR, SendWR
from softverbs.verbs.xrcd import (
    XRCD,
    XRCDInitAttr,
    open_qp,
    xrc_rcv_qp_alloc,
    xrc_rcv_qp_register,
    xrc_rcv_qp_unregister,
)

__version__ = "0.1.0"

__all__ = [
    "AH",
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
    "SrqAttr",
    "SrqInitAttr",
    "SrqInitAttrEx",
    "VerbsError",
    "XRCDInitAttr",
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
