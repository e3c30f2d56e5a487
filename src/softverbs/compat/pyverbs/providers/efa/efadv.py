"""``pyverbs.providers.efa.efadv``:
EFA direct verbs on softverbs (see :mod:`softverbs.compat.vendor_dv.efa`).
"""

from softverbs.compat.vendor_dv import efa as _efa

_names = _efa.module_names()
globals().update(_names)
__all__ = sorted(_names)
