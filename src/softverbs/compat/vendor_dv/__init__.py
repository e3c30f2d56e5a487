"""Vendor direct-verbs trees (mlx5, EFA) that softverbs does *not* implement.

pyverbs ships provider modules -- ``pyverbs.providers.mlx5.mlx5dv``,
``pyverbs.providers.efa.efadv`` and a dozen more -- and programs import them
unconditionally: rdma-core's ``tests/utils.py`` does, so not one test of the
suite loads without them.  softverbs is neither an mlx5 nor an EFA device and
never pretends to be one.  These modules exist so that imports resolve and a
vendor feature fails the way it fails on hardware of another vendor:

* **contexts**: ``Mlx5Context`` raises ``PyverbsUserError('This is not an MLX5
  device')`` exactly as pyverbs does when ``mlx5dv_is_supported`` is false.
  ``EfaContext`` is, as in pyverbs, a plain context; its EFA query fails with
  EOPNOTSUPP, as ``efadv_query_device`` does on a non-EFA device.
* **objects** that need the vendor's driver (QPs, CQs, MRs, DevX objects,
  steering rules, mkeys, ...) fail with EOPNOTSUPP, as the ``*dv_create_*``
  calls do on another vendor's device.
* **attribute holders** (``Mlx5DVQPInitAttr``, ``WqeCtrlSeg``, ...) can be
  built: they only keep the values given to them, so a program's set-up code
  runs up to the point where a device would be asked.
* **helper functions** that decode a vendor's capability bits fail with
  EOPNOTSUPP: there are no such bits to decode on softverbs.

The enum values (``mlx5_enums``, ``efa_enums``) are the C headers' own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from softverbs.errors import PyverbsUserError, eopnotsupp
from softverbs.verbs.base import PyverbsCM, PyverbsObject


def _attr_init(self: Any, *args: Any, **kwargs: Any) -> None:
    PyverbsObject.__init__(self)
    self.args = args
    for key, value in kwargs.items():
        setattr(self, key, value)


def attr_class(name: str, module: str, base: type = PyverbsObject) -> type:
    """A vendor attribute holder: keeps its positional (``args``) and keyword values."""
    doc = f"pyverbs' ``{name}``: an attribute holder (softverbs keeps the values only)."
    return type(name, (base,), {"__init__": _attr_init, "__doc__": doc, "__module__": module})


def object_class(name: str, module: str, vendor: str, base: type = PyverbsCM) -> type:
    """A vendor object: creating it fails with EOPNOTSUPP."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        (PyverbsCM if isinstance(self, PyverbsCM) else PyverbsObject).__init__(self)
        raise eopnotsupp(f"{name}: softverbs is not an {vendor} device; {vendor} direct verbs "
                         "are not available")  # fmt: skip

    def _release(self: Any) -> None:
        """Nothing was created."""

    doc = f"pyverbs' ``{name}``: needs an {vendor} device, so EOPNOTSUPP on softverbs."
    return type(name, (base,), {"__init__": __init__, "_release": _release, "__doc__": doc,
                                "__module__": module})  # fmt: skip


def user_error_context(name: str, module: str, base: type, message: str) -> type:
    """A vendor context that refuses every softverbs device with ``message``."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        PyverbsCM.__init__(self)
        raise PyverbsUserError(message)

    def _release(self: Any) -> None:
        """Nothing was opened."""

    doc = f"pyverbs' ``{name}``: raises PyverbsUserError({message!r}) on softverbs."
    return type(name, (base,), {"__init__": __init__, "_release": _release, "__doc__": doc,
                                "__module__": module})  # fmt: skip


def unsupported_function(name: str, vendor: str) -> Callable[..., Any]:
    def helper(*args: Any, **kwargs: Any) -> Any:
        raise eopnotsupp(f"{name}: softverbs is not an {vendor} device; there are no "
                         f"{vendor} capability bits to decode")  # fmt: skip

    helper.__name__ = helper.__qualname__ = name
    helper.__doc__ = f"pyverbs' ``{name}``: EOPNOTSUPP on softverbs (not an {vendor} device)."
    return helper
