"""Fork support (pyverbs ``fork``): ``ibv_fork_init``, ``ibv_is_fork_initialized``.

libibverbs needs ``ibv_fork_init`` on old kernels because a registered page
is pinned: after ``fork()`` copy-on-write could give the parent a new
physical page while the NIC keeps writing the old one.  softverbs pins
nothing -- the device reaches memory through the process's own mappings at
the moment of each access -- so fork is always safe: ``fork_init`` succeeds
and fork support is reported as ``IBV_FORK_UNNEEDED``, as libibverbs does on
kernels with copy-on-fork for pinned pages.
"""

from __future__ import annotations

from softverbs.enums import IBV_FORK_UNNEEDED


def fork_init() -> None:
    """``ibv_fork_init``: nothing to prepare (see the module docstring)."""


def is_fork_initialized() -> int:
    """``ibv_is_fork_initialized``: always ``IBV_FORK_UNNEEDED``."""
    return int(IBV_FORK_UNNEEDED)
