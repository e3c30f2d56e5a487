"""``pyverbs.base``: the base classes, ``inc_rkey`` and ``PyverbsRDMAErrno``.

pyverbs' ``base`` imports ``PyverbsRDMAError`` from ``pyverbs_error``, and
programs import it from either module; it is the same class here too.
"""

from softverbs.errors import PyverbsRDMAErrno, PyverbsRDMAError
from softverbs.verbs.base import PyverbsCM, PyverbsObject
from softverbs.verbs.mr import inc_rkey

__all__ = ["PyverbsCM", "PyverbsObject", "PyverbsRDMAErrno", "PyverbsRDMAError", "inc_rkey"]
