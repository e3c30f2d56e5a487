"""``pyverbs.pd``: protection domains and parent domains."""

from softverbs.verbs.pd import PD, ParentDomain, ParentDomainContext, ParentDomainInitAttr

__all__ = ["PD", "ParentDomain", "ParentDomainContext", "ParentDomainInitAttr"]
