"""``pyverbs.providers.efa``: EFA direct verbs (softverbs is not an EFA device)."""
