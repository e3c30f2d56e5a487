"""``pyverbs.cmid``: the RDMA connection manager (:mod:`softverbs.cm.api`)."""

from softverbs.cm.api import (
    CMID,
    AddrInfo,
    CMEvent,
    CMEventChannel,
    ConnParam,
    JoinMCAttrEx,
    UDParam,
)

__all__ = ["CMID", "AddrInfo", "CMEvent", "CMEventChannel", "ConnParam", "JoinMCAttrEx", "UDParam"]
