"""``pyverbs.srq``: shared receive queues."""

from softverbs.verbs.srq import SRQ, SrqAttr, SrqInitAttr, SrqInitAttrEx

__all__ = ["SRQ", "SrqAttr", "SrqInitAttr", "SrqInitAttrEx"]
