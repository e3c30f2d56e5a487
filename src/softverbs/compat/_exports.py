"""Which names of :mod:`softverbs.enums` the pyverbs enum modules re-export.

pyverbs' enum modules hold two kinds of names: the enum classes
(``ibv_qp_type``) and the module constants (``IBV_QPT_RC``, plus pyverbs'
``_IBV_*`` spellings of verbs.h ``#define`` values). :mod:`softverbs.enums`
holds those names and also some machinery: ``enum``, ``Final``, private
tables and MTU helper functions. This module picks out the first kind, so
the compat modules stay exactly in step with softverbs.enums without
listing its hundreds of names a second time.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from types import ModuleType

_CONSTANT = re.compile(r"_?[A-Z][A-Z0-9_]*")


def enum_exports(
    module: ModuleType, keep: Callable[[str], bool], private: tuple[str, ...] = ("_IBV_",)
) -> dict[str, object]:
    """``name -> object`` for the enum classes and constants of ``module`` that ``keep``.

    ``private``: the prefixes of pyverbs' underscore spellings to keep
    (``_IBV_*`` for verbs.h, ``_MLX5DV_*`` for mlx5dv.h).
    """
    out: dict[str, object] = {}
    for name, value in vars(module).items():
        if isinstance(value, type):
            # classes: only enums defined there, not the IntEnum/IntFlag bases it imports
            wanted = issubclass(value, enum.Enum) and value.__module__ == module.__name__
        else:
            # constants: IBV_*, RAI_*, ... and pyverbs' _IBV_* aliases, never private tables
            wanted = bool(_CONSTANT.fullmatch(name)) and (
                not name.startswith("_") or name.startswith(private)
            )
        if wanted and keep(name):
            out[name] = value
    return out
