"""softverbs standing in for rdma-core's ``pyverbs`` package.

``softverbs exec`` makes this the top-level ``pyverbs``. Like the real one,
the package itself defines nothing: programs import its modules
(``pyverbs.device``, ``pyverbs.pd``, ``pyverbs.qp`` ...). Each module
re-exports the softverbs objects that bear pyverbs' names. A pyverbs name that
softverbs does not implement is left out, so using it fails at import with
an ImportError and never later with a wrong answer.
"""
