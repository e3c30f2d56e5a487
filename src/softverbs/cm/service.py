"""The RDMA CM inside ``softverbsd``: one agent for the service's devices.

Each ``CM_*`` request (:mod:`softverbs.device.records`) is one command of
:class:`~softverbs.cm.agent.CmAgent`; :data:`softverbs.cm.wire.BY_OP` says
which, and how its record becomes the agent's arguments and the agent's
answer the reply record.  Events go back to the process that owns the CM ID,
as :class:`~softverbs.device.records.CmEvent` records, on the socket it passed
with ``CM_EVENTS`` for the ID's event channel (``channel`` of
``CM_CREATE_ID`` and ``CM_MIGRATE_ID``; 0 if not named).  A process can name
only its own IDs, and when it disconnects (exit, crash) its IDs are
destroyed -- with a DREQ or REJ to their peers, as the kernel does when a
process holding ``/dev/infiniband/rdma_cm`` dies.
"""

from __future__ import annotations

import weakref
from typing import Any

from softverbs.cm import wire
from softverbs.cm.agent import CmAgent
from softverbs.errors import einval

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


def handle(service: Any, client: Any, code: int, req: Any) -> Any:
    """Serve one ``CM_*`` request of ``client``: its reply record."""
    cmd = wire.BY_OP[code]
    kw = cmd.kwargs(req)
    if "channel" in kw:
        # the ID's events go to the socket of its event channel (0 when not named)
        channel = int(kw.pop("channel"))
        kw["sink"] = lambda event: service.cm_event(client, channel, event)
    return cmd.reply(cmd.method(agent_of(service), owner=client, **kw))


def drop(service: Any, client: Any) -> None:
    """``client`` is gone: destroy its CM IDs."""
    agent = _agents.get(service)
    if agent is not None:
        agent.drop_owner(client)
