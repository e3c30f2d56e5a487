"""``pyverbs.librdmacm_enums``: the RDMA CM enums of :mod:`softverbs.enums`.

These are the ``rdma_*`` enum classes and the ``RDMA_*`` / ``RAI_*``
constants. softverbs has no connection manager yet, but programs (rdma-core's
tests among them) import these names to spell port spaces and event types.
"""

from softverbs import enums as _enums
from softverbs.compat._exports import enum_exports

_names = enum_exports(_enums, lambda name: name.startswith(("rdma_", "RDMA_", "RAI_")))
globals().update(_names)
__all__ = sorted(_names)
