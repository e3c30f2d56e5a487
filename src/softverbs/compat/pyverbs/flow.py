"""``pyverbs.flow``: steering flows (EOPNOTSUPP on softverbs) and their attributes."""

from softverbs.verbs.flow import Flow, FlowAction, FlowAttr

__all__ = ["Flow", "FlowAction", "FlowAttr"]
