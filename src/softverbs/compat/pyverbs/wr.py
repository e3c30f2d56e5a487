"""``pyverbs.wr``: scatter/gather elements and work requests."""

from softverbs.verbs.wr import SGE, RecvWR, SendWR, send_flags_to_str

__all__ = ["SGE", "RecvWR", "SendWR", "send_flags_to_str"]
