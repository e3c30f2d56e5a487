"""``pyverbs.providers.mlx5.mlx5dv_sched``:
refuses softverbs devices (see :mod:`softverbs.compat.vendor_dv`).
"""

from softverbs.compat.vendor_dv import mlx5 as _mlx5

_names = _mlx5.module_names("mlx5dv_sched")
globals().update(_names)
__all__ = sorted(_names)
