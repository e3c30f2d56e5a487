"""The RDMA CM inside ``softverbsd``: one agent for the service's devices.

The service's ``CM`` request carries a command of :class:`~softverbs.cm.agent.CmAgent`
(``create_id``, ``bind_addr``, ``connect`` ...) and its arguments, as JSON;
events go back to the process that owns the CM ID on the socket it passed
with ``CM_EVENTS`` for the ID's event channel (``channel`` of
``create_id`` and ``migrate_id``; 0 if not named).  A process can name
only its own IDs, and when it disconnects (exit, crash)
its IDs are destroyed -- with a DREQ or REJ to their peers, as the kernel
does when a process holding ``/dev/infiniband/rdma_cm`` dies.
"""

from __future__ import annotations

import weakref
from typing import Any

from softverbs.cm.agent import CmAgent
from softverbs.errors import einval

#: The agent commands a client may send.
COMMANDS = frozenset({
    "create_id", "destroy_id", "bind_addr", "resolve_addr", "resolve_route", "listen",
    "connect", "accept", "reject", "disconnect", "init_qp_attr", "set_option", "query",
    "migrate_id", "join_multicast", "leave_multicast",
})  # fmt: skip

_agents: weakref.WeakKeyDictionary[Any, CmAgent] = weakref.WeakKeyDictionary()


class _ServiceWorld:
    """The service's devices, as the agent sees them."""

    def __init__(self, service: Any) -> None:
        self._service = weakref.ref(service)

    def specs(self) -> list[Any]:
        service = self._service()
        return list(service.registry.specs()) if service is not None else []

    def open(self, name: str) -> Any:
        service = self._service()
        if service is None:
            raise einval("the service is shutting down")
        return service.registry.open(name)


def agent_of(service: Any) -> CmAgent:
    agent = _agents.get(service)
    if agent is None:
        agent = _agents[service] = CmAgent(_ServiceWorld(service))
    return agent


def handle(service: Any, client: Any, msg: dict[str, Any]) -> dict[str, Any]:
    """Serve one ``cm`` request of ``client``."""
    cmd = msg.get("cmd")
    args = msg.get("args") or {}
    if cmd not in COMMANDS or not isinstance(args, dict):
        raise einval(f"unknown CM command {cmd!r}")
    kw: dict[str, Any] = {str(k): v for k, v in args.items()
                          if k not in ("owner", "sink", "channel")}  # fmt: skip
    if cmd in ("create_id", "migrate_id"):
        # the ID's events go to the socket of its event channel (0 when not named)
        channel = args.get("channel", 0)
        if not isinstance(channel, int):
            raise einval(f"bad CM {cmd} request: channel {channel!r} is not a number")
        kw["sink"] = lambda event: service.cm_event(client, channel, event)
    try:
        result = getattr(agent_of(service), str(cmd))(owner=client, **kw)
    except (AttributeError, TypeError, ValueError, KeyError, OverflowError) as exc:
        # what a client sent is not what the command takes: its error, not ours
        raise einval(f"bad CM {cmd} request: {exc!r}") from None
    return {"result": result}


def drop(service: Any, client: Any) -> None:
    """``client`` is gone: destroy its CM IDs."""
    agent = _agents.get(service)
    if agent is not None:
        agent.drop_owner(client)
