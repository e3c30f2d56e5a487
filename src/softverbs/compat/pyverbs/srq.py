"""``pyverbs.srq``: shared receive queues."""

from softverbs.verbs.srq import SRQ, OpsWr, SrqAttr, SrqInitAttr, SrqInitAttrEx

__all__ = ["SRQ", "OpsWr", "SrqAttr", "SrqInitAttr", "SrqInitAttrEx"]
