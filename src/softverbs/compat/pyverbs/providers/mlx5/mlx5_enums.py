"""``pyverbs.providers.mlx5.mlx5_enums``: mlx5dv.h's enum values."""

from softverbs.compat._exports import enum_exports
from softverbs.compat.vendor_dv import mlx5_enums as _enums

_names = enum_exports(_enums, lambda name: True, private=("_MLX5DV_",))
globals().update(_names)
__all__ = sorted(_names)
