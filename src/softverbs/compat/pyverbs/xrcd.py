"""``pyverbs.xrcd``: XRC domains.

softverbs does not implement ``XRCD`` and ``XRCDInitAttr`` yet, so the
module exists but is empty. ``from pyverbs.xrcd import XRCD`` therefore
fails with an ImportError that names the missing class.
"""

__all__: list[str] = []
