"""``pyverbs.providers.efa.efa_enums``: efadv.h's enum values."""

from softverbs.compat._exports import enum_exports
from softverbs.compat.vendor_dv import efa_enums as _enums

_names = enum_exports(_enums, lambda name: True)
globals().update(_names)
__all__ = sorted(_names)
