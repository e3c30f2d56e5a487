"""Placeholder for ``pyverbs.cmid`` until softverbs' RDMA CM lands.

The RDMA connection manager (``CMID``, ``CMEventChannel``, ``AddrInfo`` ...)
is being written separately.  Until then these names exist so that programs
that import them load, and creating any of them fails with EOPNOTSUPP -- the
way librdmacm fails on a device it cannot drive -- which rdma-core's tests
turn into a skip.  The CM implementation replaces this module in the compat
tree.
"""

from __future__ import annotations

from typing import Any

from softverbs.errors import eopnotsupp
from softverbs.verbs.base import PyverbsCM


class _NotYet(PyverbsCM):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        raise eopnotsupp(f"{type(self).__name__}: softverbs has no RDMA connection manager yet")


class AddrInfo(_NotYet):
    """``rdma_addrinfo`` (placeholder)."""


class ConnParam(_NotYet):
    """``rdma_conn_param`` (placeholder)."""


class UDParam(_NotYet):
    """``rdma_ud_param`` (placeholder)."""


class JoinMCAttrEx(_NotYet):
    """``rdma_cm_join_mc_attr_ex`` (placeholder)."""


class CMEventChannel(_NotYet):
    """``rdma_event_channel`` (placeholder)."""


class CMEvent(_NotYet):
    """``rdma_cm_event`` (placeholder)."""


class CMID(_NotYet):
    """``rdma_cm_id`` (placeholder)."""


__all__ = ["CMID", "AddrInfo", "CMEvent", "CMEventChannel", "ConnParam", "JoinMCAttrEx",
           "UDParam"]  # fmt: skip
