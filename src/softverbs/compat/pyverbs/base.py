"""``pyverbs.base``: the base classes, ``inc_rkey`` and ``PyverbsRDMAErrno``."""

from softverbs.errors import PyverbsRDMAErrno
from softverbs.verbs.base import PyverbsCM, PyverbsObject
from softverbs.verbs.mr import inc_rkey

__all__ = ["PyverbsCM", "PyverbsObject", "PyverbsRDMAErrno", "inc_rkey"]
