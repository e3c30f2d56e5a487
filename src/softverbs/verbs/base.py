"""Base classes of every verbs object: lifetime, context managers, errors.

Lifetime follows pyverbs.  Objects are context managers; ``close()`` is
idempotent and first closes the objects that depend on this one (a PD closes
its QPs, MRs and windows; a CQ closes the QPs that use it), so a program
that closes its context releases everything.  ``destroy()`` is the C verb:
like ``ibv_destroy_*`` it refuses with EBUSY while dependents are alive,
and says which.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, ClassVar

from softverbs.errors import PyverbsUserError, ebusy


class PyverbsObject:
    """Carries a logger, as pyverbs objects do."""

    def __init__(self) -> None:
        self.logger = logging.getLogger(type(self).__name__)

    def set_log_level(self, val: int) -> None:
        self.logger.setLevel(val)


class PyverbsCM(PyverbsObject):
    """A verbs resource with dependents and an idempotent close()."""

    #: Dependents close in increasing rank: QPs before CQs before PDs.
    close_rank: ClassVar[int] = 50

    def __init__(self) -> None:
        super().__init__()
        self._deps: weakref.WeakSet[PyverbsCM] = weakref.WeakSet()
        self._closed = False

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def add_ref(self, obj: PyverbsCM) -> None:
        """Record that ``obj`` depends on this object."""
        self._deps.add(obj)

    def dependents(self) -> list[PyverbsCM]:
        return sorted((d for d in self._deps if not d._closed), key=lambda d: d.close_rank)

    def close(self) -> None:
        if self._closed:
            return
        for dep in self.dependents():
            dep.close()
        self._closed = True
        self._release()

    def destroy(self) -> None:
        """Like ``ibv_destroy_*``: EBUSY while dependents are alive."""
        if self._closed:
            return
        deps = self.dependents()
        if deps:
            names = ", ".join(sorted({type(d).__name__ for d in deps}))
            raise ebusy(
                f"Cannot destroy {type(self).__name__}: {len(deps)} dependent object(s) "
                f"({names}) still use it; destroy them first or use close(), which "
                "closes them too"
            )
        self.close()

    def _release(self) -> None:
        """Free the device resources.  Called once, by close()."""

    def _check_open(self) -> None:
        if self._closed:
            raise PyverbsUserError(f"{type(self).__name__} is closed")


def require(obj: object, cls: type | tuple[type, ...], what: str) -> None:
    """Raise PyverbsUserError unless ``obj`` is an instance of ``cls``."""
    if not isinstance(obj, cls):
        names = cls.__name__ if isinstance(cls, type) else "/".join(c.__name__ for c in cls)
        raise PyverbsUserError(f"{what} must be a {names}, got {type(obj).__name__}")
