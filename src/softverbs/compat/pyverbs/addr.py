"""``pyverbs.addr``: GIDs, global routes and address handles."""

from softverbs.verbs.addr import AH, GID, GRH, AHAttr, GlobalRoute

__all__ = ["AH", "GID", "GRH", "AHAttr", "GlobalRoute"]
