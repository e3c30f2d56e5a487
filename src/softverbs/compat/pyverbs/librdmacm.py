"""``pyverbs.librdmacm``: in pyverbs, the C declarations of ``<rdma/rdma_cma.h>``.

It defines no Python names; the RDMA CM itself is ``pyverbs.cmid``
(:mod:`softverbs.cm`) and its constants are ``pyverbs.librdmacm_enums``.
"""

__all__: list[str] = []
