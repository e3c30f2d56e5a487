"""``pyverbs.providers.mlx5.mlx5dv_mkey``:
refuses softverbs devices (see :mod:`softverbs.compat.vendor_dv`).
"""

from softverbs.compat.vendor_dv import mlx5 as _mlx5
from softverbs.ext import mlx5dv as _sig

# With the opt-in (SOFTVERBS_MLX5=sig), the mkey and signature classes are
# softverbs' signature offload (softverbs.ext.mlx5dv); without it, nothing changes.
_names = {**_mlx5.module_names("mlx5dv_mkey"), **_sig.pyverbs_names("mlx5dv_mkey")}
globals().update(_names)
__all__ = sorted(_names)
