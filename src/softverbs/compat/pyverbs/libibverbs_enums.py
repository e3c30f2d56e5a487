"""``pyverbs.libibverbs_enums``: every enum and constant of :mod:`softverbs.enums`.

These are the enum classes (``ibv_qp_type``, ``ibv_access_flags`` ...), each
member again as a module constant (``IBV_QPT_RC`` ...), pyverbs' ``_IBV_*``
aliases, and softverbs' additions such as ``IBV_SEND_DEFER``. They are the
same objects as in softverbs.enums. The list is computed, so it cannot drift
from softverbs.enums (see :mod:`softverbs.compat._exports`).
"""

from softverbs import enums as _enums
from softverbs.compat._exports import enum_exports

_names = enum_exports(_enums, lambda name: True)
globals().update(_names)
__all__ = sorted(_names)
