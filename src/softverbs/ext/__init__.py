"""Vendor-style extensions a program opts into.

* :mod:`softverbs.ext.mlx5dv` -- mlx5 direct verbs' signature offload:
  signature memory keys (T10-DIF, CRC32, CRC32C), signature pipelining and
  ``cancel_posted_send_wrs``, in software.  Opt in with ``SOFTVERBS_MLX5=sig``
  or ``Mlx5Context(attr, name=..., features="sig")``; see docs/signature.md.
"""
