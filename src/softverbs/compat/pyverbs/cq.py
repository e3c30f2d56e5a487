"""``pyverbs.cq``: completion queues (plain and extended), channels, work completions."""

from softverbs.verbs.cq import CQ, WC, CompChannel
from softverbs.verbs.cqex import CQEX, CqInitAttrEx, PollCqAttr, WcTmInfo
from softverbs.verbs.strings import (
    cqe_flags_to_str,
    cqe_opcode_to_str,
    cqe_status_to_str,
    create_wc_flags_to_str,
    flags_to_str,
)

__all__ = [
    "CQ",
    "CQEX",
    "WC",
    "CompChannel",
    "CqInitAttrEx",
    "PollCqAttr",
    "WcTmInfo",
    "cqe_flags_to_str",
    "cqe_opcode_to_str",
    "cqe_status_to_str",
    "create_wc_flags_to_str",
    "flags_to_str",
]
