"""``pyverbs.enums``: the old name of ``pyverbs.libibverbs_enums``.

rdma-core's pyverbs shipped its verbs enums as ``pyverbs.enums`` until
rdma-core v58 (the module was a second build of ``libibverbs_enums``), and
most public pyverbs examples still start with ``import pyverbs.enums as e``.
This module is the same names as :mod:`softverbs.compat.pyverbs.libibverbs_enums`,
which are the objects of :mod:`softverbs.enums`.
"""

from softverbs.compat.pyverbs.libibverbs_enums import *  # noqa: F403
from softverbs.compat.pyverbs.libibverbs_enums import __all__ as __all__
