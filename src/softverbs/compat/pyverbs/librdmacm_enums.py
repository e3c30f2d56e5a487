"""``pyverbs.librdmacm_enums``: the RDMA CM enums of :mod:`softverbs.enums`.

These are the ``rdma_*`` enum classes and the ``RDMA_*`` / ``RAI_*``
constants that programs (rdma-core's tests among them) use to spell port
spaces and event types for ``pyverbs.cmid`` (:mod:`softverbs.cm`).
"""

from softverbs import enums as _enums
from softverbs.compat._exports import enum_exports

_names = enum_exports(_enums, lambda name: name.startswith(("rdma_", "RDMA_", "RAI_")))
globals().update(_names)
__all__ = sorted(_names)
