"""The mlx5 direct-verbs classes of pyverbs, refusing softverbs devices.

See :mod:`softverbs.compat.vendor_dv` for what each kind does.  :func:`module_names`
gives the names of one pyverbs module (``mlx5dv``, ``dr_action``, ...), for
the compat tree under ``pyverbs.providers.mlx5``.
"""

from __future__ import annotations

from functools import cache

from softverbs.compat.vendor_dv import (
    attr_class,
    object_class,
    unsupported_function,
    user_error_context,
)
from softverbs.verbs.base import PyverbsCM

VENDOR = "mlx5"

#: module -> (attribute holders, objects, helper functions)
_MODULES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "mlx5dv": (
        ("Mlx5DVPortAttr", "Mlx5DVContextAttr", "Mlx5DVContext", "Mlx5DCIStreamInitAttr",
         "Mlx5DVDCInitAttr", "Mlx5DVQPInitAttr", "Mlx5DVCQInitAttr", "WqeSeg", "WqeCtrlSeg",
         "WqeDataSeg", "Wqe", "Mlx5Cqe64"),
        ("Mlx5DevxObj", "Mlx5QP", "Mlx5CQ", "Mlx5VAR", "Mlx5PP", "Mlx5UAR", "Mlx5DmOpAddr",
         "Mlx5UMEM", "Mlx5DevxMsiVector", "Mlx5DevxEq"),
        ("qpts_to_str", "bitmask_to_str", "context_comp_mask_to_str", "context_flags_to_str",
         "swp_to_str", "cqe_comp_to_str", "tunnel_offloads_to_str", "dc_type_to_str",
         "qp_comp_mask_to_str", "qp_create_flags_to_str", "send_ops_flags_to_str"),
    ),
    "mlx5_vfio": (("Mlx5VfioAttr",), (), ()),
    "dr_action": (
        ("DrActionDestAttr", "DrFlowSamplerAttr", "DrFlowMeterAttr"),
        ("DrAction", "DrActionQp", "DrActionFlowCounter", "DrActionDrop", "DrActionModify",
         "DrActionTag", "DrActionDestTable", "DrActionPopVLan", "DrActionPushVLan",
         "DrActionDestArray", "DrActionDefMiss", "DrActionVPort", "DrActionIBPort",
         "DrActionDestTir", "DrActionPacketReformat", "DrActionFlowSample", "DrActionFlowMeter"),
        (),
    ),
    "dr_domain": ((), ("DrDomain",), ()),
    "dr_matcher": ((), ("DrMatcher",), ()),
    "dr_rule": ((), ("DrRule",), ()),
    "dr_table": ((), ("DrTable",), ()),
    "mlx5dv_crypto": (
        ("Mlx5CryptoLoginAttr", "Mlx5CryptoExtLoginAttr", "Mlx5DEKInitAttr", "Mlx5DEKAttr",
         "Mlx5CryptoAttr"),
        ("Mlx5DEK", "Mlx5CryptoLogin"),
        (),
    ),
    "mlx5dv_dmabuf": ((), ("Mlx5DmaBufMR",), ()),
    "mlx5dv_flow": (
        ("Mlx5FlowMatchParameters", "Mlx5FlowMatcherAttr", "Mlx5FlowActionAttr"),
        ("Mlx5FlowMatcher", "Mlx5PacketReformatFlowAction", "Mlx5Flow"),
        (),
    ),
    "mlx5dv_mkey": (
        ("Mlx5SigCrc", "Mlx5SigT10Dif", "Mlx5SigBlockDomain", "Mlx5SigBlockAttr", "Mlx5SigErr",
         "Mlx5MkeyErr", "Mlx5MkeyConfAttr", "Mlx5MrInterleaved"),
        ("Mlx5Mkey",),
        (),
    ),
    "mlx5dv_objects": (("Mlx5DvPD", "Mlx5DvCQ", "Mlx5DvQP", "Mlx5DvSRQ"), ("Mlx5DvObj",), ()),
    "mlx5dv_sched": (("Mlx5dvSchedAttr",), ("Mlx5dvSchedNode", "Mlx5dvSchedLeaf"), ()),
}  # fmt: skip


def _bases() -> dict[str, type]:
    """The generic pyverbs class each vendor class extends, where it extends one."""
    from softverbs.verbs.cqex import CQEX
    from softverbs.verbs.dmabuf import DmaBufMR
    from softverbs.verbs.flow import Flow, FlowAction
    from softverbs.verbs.qp import QPEx

    return {"Mlx5QP": QPEx, "Mlx5CQ": CQEX, "Mlx5DmaBufMR": DmaBufMR, "Mlx5Flow": Flow,
            "Mlx5PacketReformatFlowAction": FlowAction}  # fmt: skip


@cache
def _context_classes() -> tuple[type, type]:
    from softverbs.verbs.device import Context

    module = "pyverbs.providers.mlx5.mlx5dv"
    mlx5 = user_error_context("Mlx5Context", module, Context, "This is not an MLX5 device")
    vfio = user_error_context("Mlx5VfioContext", "pyverbs.providers.mlx5.mlx5_vfio", mlx5,
                              "This is not an MLX5 device")  # fmt: skip
    return mlx5, vfio


@cache
def module_names(module: str) -> dict[str, object]:
    """``name -> object`` for pyverbs module ``pyverbs.providers.mlx5.<module>``."""
    attrs, objects, functions = _MODULES[module]
    qualname = f"pyverbs.providers.mlx5.{module}"
    bases = _bases()
    out: dict[str, object] = {}
    seg: type | None = None
    for name in attrs:
        base = seg if name in ("WqeCtrlSeg", "WqeDataSeg") and seg is not None else PyverbsCM
        out[name] = cls = attr_class(name, qualname, base)
        if name == "WqeSeg":
            seg = cls
    action: type | None = None
    for name in objects:
        base = bases.get(name, PyverbsCM)
        if name.startswith("DrAction") and action is not None:
            base = action
        out[name] = cls = object_class(name, qualname, VENDOR, base)
        if name == "DrAction":
            action = cls
    for name in functions:
        out[name] = unsupported_function(name, VENDOR)
    mlx5_ctx, vfio_ctx = _context_classes()
    if module == "mlx5dv":
        out["Mlx5Context"] = mlx5_ctx
    if module == "mlx5_vfio":
        out["Mlx5VfioContext"] = vfio_ctx
    return out


MODULES = tuple(_MODULES)
