"""``pyverbs.mr``: memory regions and memory windows."""

from softverbs.verbs.mr import MR, MW, MWBind, MWBindInfo
from softverbs.verbs.strings import mwtype2str

__all__ = ["MR", "MW", "MWBind", "MWBindInfo", "mwtype2str"]
