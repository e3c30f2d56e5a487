"""Sample programs on the verbs API, each a ``softverbs`` subcommand.

These are programs *on* softverbs, as rdma-core's ``libibverbs/examples`` are
programs on libibverbs: the RC, UC and UD ping-pongs, the SRQ and XRC SRQ
ping-pongs (each interoperable with its ``ibv_*_pingpong`` namesake), and
``demo``, a perftest-style RC benchmark.  They use only the public pyverbs
API (:mod:`softverbs`), so they are also worked examples of it.  The command
line's plumbing (argument parsing, error rules) is :mod:`softverbs.cli`'s.
"""
