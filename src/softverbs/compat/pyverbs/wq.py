"""``pyverbs.wq``: receive work queues and RSS indirection tables (EOPNOTSUPP on softverbs)."""

from softverbs.verbs.wq import WQ, RwqIndTable, RwqIndTableInitAttr, RxHashConf, WQAttr, WQInitAttr

__all__ = ["WQ", "RwqIndTable", "RwqIndTableInitAttr", "RxHashConf", "WQAttr", "WQInitAttr"]
