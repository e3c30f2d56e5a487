"""Receive work queues and RSS (pyverbs ``wq``): ``ibv_create_wq``,
``ibv_create_rwq_ind_table``.

A receive WQ and an RSS indirection table exist to spread raw Ethernet
traffic over several receive queues by a hash of its headers.  softverbs
carries RDMA traffic only (no raw packet QPs), so it has no receive WQs:
``max_wq_type_rq`` and the RSS caps are 0 and creating either object fails
with EOPNOTSUPP, as ``ibv_create_wq`` does on a device without them.  The
attribute objects are complete, so a program builds them and learns from the
creation error, not from a missing name.
"""

from __future__ import annotations

from typing import Any

from softverbs.enums import IBV_WQT_RQ
from softverbs.errors import PyverbsUserError, eopnotsupp
from softverbs.verbs.base import PyverbsCM, PyverbsObject, as_uint, require


class WQInitAttr(PyverbsObject):
    """``ibv_wq_init_attr``."""

    def __init__(self, wq_context: Any = None, wq_pd: Any = None, wq_cq: Any = None,
                 wq_type: int = IBV_WQT_RQ, max_wr: int = 100, max_sge: int = 1,
                 comp_mask: int = 0, create_flags: int = 0) -> None:  # fmt: skip
        from softverbs.verbs.cq import CQBase
        from softverbs.verbs.pd import PD

        super().__init__()
        require(wq_pd, PD, "wq_pd", optional=True)
        require(wq_cq, CQBase, "wq_cq", optional=True)
        self.wq_context = wq_context
        self.pd = wq_pd
        self.cq = wq_cq
        self.wq_type = wq_type
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.comp_mask = comp_mask
        self.create_flags = create_flags


class WQAttr(PyverbsObject):
    """``ibv_wq_attr`` (for ``WQ.modify``)."""

    def __init__(self, attr_mask: int = 0, wq_state: int = 0, curr_wq_state: int = 0,
                 flags: int = 0, flags_mask: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.attr_mask = attr_mask
        self.wq_state = wq_state
        self.curr_wq_state = curr_wq_state
        self.flags = flags
        self.flags_mask = flags_mask


class WQ(PyverbsCM):
    """A receive work queue: ``WQ(ctx, WQInitAttr(...))`` -- EOPNOTSUPP on softverbs."""

    def __init__(self, ctx: Any, attr: WQInitAttr) -> None:
        from softverbs.verbs.device import Context

        super().__init__()
        require(ctx, Context, "ctx")
        require(attr, WQInitAttr, "attr")
        raise eopnotsupp("Failed to create WQ: softverbs devices have no receive work queues "
                         "(max_wq_type_rq is 0; there are no raw packet QPs to feed)")  # fmt: skip


class RwqIndTableInitAttr(PyverbsObject):
    """``ibv_rwq_ind_table_init_attr``: ``RwqIndTableInitAttr(log_ind_tbl_size, wqs_list)``."""

    def __init__(self, log_ind_tbl_size: int = 5, wqs_list: list[Any] | None = None,
                 comp_mask: int = 0) -> None:  # fmt: skip
        super().__init__()
        if wqs_list is not None and not isinstance(wqs_list, (list, tuple)):
            raise PyverbsUserError(f"wqs_list must be a list of WQs, got {type(wqs_list).__name__}")
        wqs = list(wqs_list or [])
        if as_uint(log_ind_tbl_size, 32, "log_ind_tbl_size") <= 0:
            raise PyverbsUserError("Invalid indirection table size. Log size must be > 0")
        if (1 << log_ind_tbl_size) < len(wqs):
            raise PyverbsUserError(f"Requested table size ({1 << log_ind_tbl_size}) is smaller "
                                   f"than the number of wqs ({len(wqs)})")  # fmt: skip
        for wq in wqs:
            require(wq, WQ, "wqs_list entry")
        self.log_ind_tbl_size = log_ind_tbl_size
        self.wqs_list = wqs
        self.comp_mask = comp_mask


class RwqIndTable(PyverbsCM):
    """An RSS indirection table -- EOPNOTSUPP on softverbs."""

    def __init__(self, ctx: Any, attr: RwqIndTableInitAttr) -> None:
        from softverbs.verbs.device import Context

        super().__init__()
        require(ctx, Context, "ctx")
        require(attr, RwqIndTableInitAttr, "attr")
        raise eopnotsupp("Failed to create RWQ IND TBL: softverbs devices have no receive "
                         "work queues to spread traffic over")  # fmt: skip

    @property
    def wqs(self) -> list[Any]:
        return []


class RxHashConf(PyverbsObject):
    """``ibv_rx_hash_conf``: the hash an RSS QP would spread traffic by."""

    def __init__(self, rx_hash_function: int = 0, rx_hash_key_len: int = 0,
                 rx_hash_key: list[int] | None = None,
                 rx_hash_fields_mask: int = 0) -> None:  # fmt: skip
        super().__init__()
        if rx_hash_key is not None and not isinstance(rx_hash_key, (list, tuple, bytes)):
            raise PyverbsUserError(f"rx_hash_key must be a list of bytes, got "
                                   f"{type(rx_hash_key).__name__}")  # fmt: skip
        if rx_hash_key and rx_hash_key_len != len(rx_hash_key):
            raise PyverbsUserError("Length of rx_hash_key not equal to rx_hash_key_len")
        self.rx_hash_function = rx_hash_function
        self.rx_hash_key_len = rx_hash_key_len
        self.rx_hash_key = list(rx_hash_key or [])
        self.rx_hash_fields_mask = rx_hash_fields_mask
