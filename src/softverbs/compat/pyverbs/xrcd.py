"""``pyverbs.xrcd``: XRC domains."""

from softverbs.verbs.xrcd import XRCD, XRCDInitAttr

__all__ = ["XRCD", "XRCDInitAttr"]
