"""Compatibility layers: other projects' module trees, mapped onto softverbs.

``compat/pyverbs`` is rdma-core's ``pyverbs`` package tree (``pyverbs.device``,
``pyverbs.qp``, ``pyverbs.libibverbs_enums`` ...). Each module is a thin alias
that only re-exports softverbs objects, so ``pyverbs.qp.QP`` *is*
:class:`softverbs.verbs.qp.QP`. Behaviour lives in one place, and an
``isinstance`` check or an ``except`` clause works whichever name it uses.

Installed, the tree is only ``softverbs.compat.pyverbs``, so it can never
shadow a real pyverbs. ``softverbs exec`` puts this directory first on the
child's ``PYTHONPATH``. That makes the tree the top-level ``pyverbs`` for that
one program (see :mod:`softverbs.cli.exec_`).

``compat/vendor_dv`` backs pyverbs' vendor provider modules (mlx5, EFA): the
direct verbs of other vendors' devices, which softverbs refuses as such a
device would.
"""
