"""``pyverbs.mr``: memory regions (host, device memory, dma-buf) and memory windows."""

from softverbs.verbs.dm import DMMR
from softverbs.verbs.dmabuf import DmaBufMR
from softverbs.verbs.mr import MR, MW, MWBind, MWBindInfo
from softverbs.verbs.strings import mwtype2str

__all__ = ["DMMR", "MR", "MW", "DmaBufMR", "MWBind", "MWBindInfo", "mwtype2str"]
