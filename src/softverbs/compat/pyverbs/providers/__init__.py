"""``pyverbs.providers``: vendor direct verbs, which softverbs devices do not have
(see :mod:`softverbs.compat.vendor_dv`)."""
