"""``pyverbs.pyverbs_error``: the very exception classes softverbs raises."""

from softverbs.errors import PyverbsError, PyverbsRDMAError, PyverbsUserError

__all__ = ["PyverbsError", "PyverbsRDMAError", "PyverbsUserError"]
