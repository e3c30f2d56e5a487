"""Which world device names resolve in: a simulation's, the host's, or this process's.

Three registries can answer ``Context(name=...)``:

* the innermost active :class:`~softverbs.sim.Simulation`'s (:func:`push` /
  :func:`pop`), whose devices run on its virtual clock;
* the host's devices, served by ``softverbsd`` (:mod:`softverbs.verbs.served`),
  by default;
* with ``SOFTVERBS_SERVICE=0``, this process's own in-process and UDP devices
  (:class:`~softverbs.verbs.registry.Registry`).

This module sits above both providers (the embedded one that
:mod:`softverbs.verbs.registry` builds devices with, and the served one) and
picks between them, so neither imports the other.
"""

from __future__ import annotations

import atexit

from softverbs import config
from softverbs.verbs.registry import Registry, SoftDevice
from softverbs.verbs.served import ServiceRegistry

_default = Registry()
_stack: list[Registry] = []
atexit.register(_default.shutdown)

_service: ServiceRegistry | None = None


def active() -> Registry:
    """The registry device names resolve in: the innermost simulation, else
    the host's devices (the device service), else -- ``SOFTVERBS_SERVICE=0``
    -- this process's own (:mod:`softverbs.config`)."""
    global _service
    if _stack:
        return _stack[-1]
    if config.service_disabled():
        return _default
    path = config.default_socket_path()
    if _service is None or _service.path != path:
        _service = ServiceRegistry(path)
        atexit.register(_service.shutdown)
    return _service  # type: ignore[return-value]  # the same surface, served


def worlds() -> list[Registry]:
    """This process's own registry and every active simulation's, outermost first."""
    return [_default, *_stack]


def push(registry: Registry) -> None:
    _stack.append(registry)


def pop(registry: Registry) -> None:
    if _stack and _stack[-1] is registry:
        _stack.pop()
    elif registry in _stack:
        _stack.remove(registry)


def open_device(name: str) -> SoftDevice:
    return active().open(name)
