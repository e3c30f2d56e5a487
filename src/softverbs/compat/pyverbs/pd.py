"""``pyverbs.pd``: protection domains."""

from softverbs.verbs.pd import PD

__all__ = ["PD"]
