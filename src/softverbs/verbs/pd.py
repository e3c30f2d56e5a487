"""Protection domains (pyverbs ``PD``)."""

from __future__ import annotations

from typing import Any

from softverbs.verbs.base import PyverbsCM, require


class PD(PyverbsCM):
    """A protection domain: ``PD(ctx)``.

    Memory keys and QPs of one PD can reach each other; a key from another
    PD is refused (local protection or remote access error).
    """

    close_rank = 80

    def __init__(self, creator: Any, **kwargs: Any) -> None:
        from softverbs.verbs.device import Context

        super().__init__()
        require(creator, Context, "creator")
        creator._check_open()
        self.ctx: Context = creator
        self._ctx = creator
        creator.provider.alloc_pd(self)
        creator.add_ref(self)

    def _release(self) -> None:
        self.ctx.provider.dealloc_pd(self)

    @property
    def context(self) -> Any:
        return self.ctx

    @property
    def handle(self) -> int:
        return id(self) & 0xFFFFFFFF
