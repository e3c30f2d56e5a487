"""``pyverbs.providers.mlx5.mlx5dv``: refuses softverbs devices (see
:mod:`softverbs.compat.vendor_dv`)."""

from softverbs.compat.vendor_dv import mlx5 as _mlx5
from softverbs.ext import mlx5dv as _sig

# With the opt-in (SOFTVERBS_MLX5=sig), Mlx5Context, Mlx5QP and their attributes are
# softverbs' signature offload (softverbs.ext.mlx5dv); without it, nothing changes.
_names = {**_mlx5.module_names("mlx5dv"), **_sig.pyverbs_names("mlx5dv")}
globals().update(_names)
__all__ = sorted(_names)
