"""``pyverbs.dmabuf``: GPU dma-buf allocation (EOPNOTSUPP on softverbs)."""

from softverbs.verbs.dmabuf import DmaBuf

__all__ = ["DmaBuf"]
