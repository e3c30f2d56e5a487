"""``pyverbs.cm_enums``: the old name of ``pyverbs.librdmacm_enums``.

rdma-core's pyverbs shipped its RDMA CM enums as ``pyverbs.cm_enums`` until
rdma-core v58; older examples import them from there.  Same names and
objects as :mod:`softverbs.compat.pyverbs.librdmacm_enums`.
"""

from softverbs.compat.pyverbs.librdmacm_enums import *  # noqa: F403
from softverbs.compat.pyverbs.librdmacm_enums import __all__ as __all__
