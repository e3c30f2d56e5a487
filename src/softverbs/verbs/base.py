"""Base classes of every verbs object: lifetime, context managers, errors.

Lifetime follows pyverbs.  Objects are context managers; ``close()`` is
idempotent and first closes the objects that depend on this one (a PD closes
its QPs, MRs and windows; a CQ closes the QPs that use it), so a program
that closes its context releases everything.  ``destroy()`` is the C verb:
like ``ibv_destroy_*`` it refuses with EBUSY while dependents are alive,
and says which.
"""

from __future__ import annotations

import logging
import math
import weakref
from typing import Any, ClassVar, overload

from softverbs.errors import PyverbsUserError, ebusy


class PyverbsObject:
    """Carries a logger, as pyverbs objects do.

    Every object's ``logger`` is the one named after its class, as
    pyverbs' ``PyverbsObject`` gives every object it makes, ``poll``'s
    ``WC``s included.  It is looked up when first used, not made by a
    constructor: the records made in bulk (``SGE``, the WRs, ``poll``'s
    ``WC``s) fill their fields without calling this class's constructor,
    and the answer is the same in both modes either way.

    An extension type when compiled (base.pxd), as pyverbs' is; its one slot
    keeps the interpreted class the same shape (subclasses without
    ``__slots__`` get an instance dictionary either way).
    """

    __slots__ = ("_logger",)
    _logger: logging.Logger | None

    @property
    def logger(self) -> logging.Logger:
        try:
            log: logging.Logger | None = self._logger
        except AttributeError:  # interpreted, never set (compiled, the slot starts as None)
            log = None
        if log is None:
            log = self._logger = logging.getLogger(type(self).__name__)
        return log

    @logger.setter
    def logger(self, log: logging.Logger) -> None:
        self._logger = log

    def set_log_level(self, val: int) -> None:
        self.logger.setLevel(val)


class PyverbsCM(PyverbsObject):
    """A verbs resource with dependents and an idempotent close().

    An extension type when compiled (base.pxd), as pyverbs' is, so that the
    records of the post path (``SGE``, ``SendWR``, ``RecvWR``) can be extension
    types too; every resource class stays an ordinary Python subclass.
    """

    #: Dependents close in increasing rank: QPs before CQs before PDs.
    close_rank = 50

    def __init__(self) -> None:
        super().__init__()
        self._deps: weakref.WeakSet[PyverbsCM] = weakref.WeakSet()
        self._closed = False

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def add_ref(self, obj: PyverbsCM) -> None:
        """Record that ``obj`` depends on this object."""
        self._deps.add(obj)

    def dependents(self) -> list[PyverbsCM]:
        return sorted((d for d in self._deps if not d._closed), key=lambda d: d.close_rank)

    def close(self) -> None:
        if self._closed:
            return
        for dep in self.dependents():
            dep.close()
        self._closed = True
        self._release()

    def destroy(self) -> None:
        """Like ``ibv_destroy_*``: EBUSY while dependents are alive."""
        if self._closed:
            return
        deps = self.dependents()
        if deps:
            names = ", ".join(sorted({type(d).__name__ for d in deps}))
            raise ebusy(
                f"Cannot destroy {type(self).__name__}: {len(deps)} dependent object(s) "
                f"({names}) still use it; destroy them first or use close(), which "
                "closes them too"
            )
        self.close()

    def _release(self) -> None:
        """Free the device resources.  Called once, by close()."""

    def _check_open(self) -> None:
        if self._closed:
            raise PyverbsUserError(f"{type(self).__name__} is closed")


def require(obj: object, cls: type | tuple[type, ...], what: str, optional: bool = False) -> None:
    """Raise PyverbsUserError unless ``obj`` is an instance of ``cls`` (or, if
    ``optional``, None: an argument the verb may go without)."""
    if not isinstance(obj, cls) and not (optional and obj is None):
        names = cls.__name__ if isinstance(cls, type) else "/".join(c.__name__ for c in cls)
        raise PyverbsUserError(f"{what} must be a {names}, got {type(obj).__name__}")


def as_uint(value: object, bits: int, what: str) -> int:
    """``value`` as a C ``uint<bits>_t`` takes it, or PyverbsUserError.

    pyverbs stores attribute fields in C structs and passes verb arguments as
    C integers, so a non-integer or a value that does not fit is refused
    when it is given, not later deep inside a verb.  (``bool`` is an ``int``,
    as in C.)
    """
    if not isinstance(value, int):
        raise PyverbsUserError(f"{what} must be an int, got {type(value).__name__}")
    if not 0 <= value < 1 << bits:
        raise PyverbsUserError(f"{what}={value} does not fit in {bits} unsigned bits")
    return int(value)


def as_int(value: object, what: str, bits: int = 32) -> int:
    """``value`` as a C signed ``int`` takes it, or PyverbsUserError."""
    if not isinstance(value, int):
        raise PyverbsUserError(f"{what} must be an int, got {type(value).__name__}")
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise PyverbsUserError(f"{what}={value} does not fit in a {bits}-bit int")
    return int(value)


def as_count(value: Any, what: str) -> int:
    """An entry count as a C ``int`` parameter takes it: ints, and floats
    truncated toward zero (pyverbs passes Python numbers straight to C)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PyverbsUserError(f"{what} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise PyverbsUserError(f"{what} must be a finite number, got {value}")
    return int(value)


#: unsigned member width -> the first value it cannot hold (signed widths: absent)
_LIMIT = {bits: 1 << bits for bits in (8, 16, 32, 64)}


def c_member(obj: Any, name: str, value: object) -> int:
    """The value C member ``name`` of ``obj`` holds when given ``value``.

    The member's width is ``obj._c_fields[name]`` (negative: signed).  An int
    that fits an unsigned member -- nearly every value a program gives -- is
    returned as it is, with no call and no message; anything else goes to
    :func:`as_uint` / :func:`as_int`, which convert it or say what is wrong
    with ``TypeName.name`` in the message.  The one rule for every C member:
    ``CStruct.__setattr__`` applies it to an assignment, and the records of the
    post path (``SGE``, ``SendWR``, ``RecvWR``) in their constructors and their
    members' setters (compiled, a C call: base.pxd).
    """
    fields: dict[str, int] = obj._c_fields  # typed in base.pxd: C dict lookups
    limits: dict[int, int] = _LIMIT
    bits = fields[name]
    if type(value) is int and 0 <= value < limits.get(bits, 0):
        return value
    what = f"{type(obj).__name__}.{name}"
    return as_uint(value, bits, what) if bits > 0 else as_int(value, what, -bits)


class CMember:
    """A C member of a record that keeps its value in the slot ``_<name>``:
    reading it reads the slot, and setting it stores what :func:`c_member` makes
    of the value.  The records of the post path (``SGE``, ``SendWR``,
    ``RecvWR``) declare their members so; compiled, the slots are C struct
    fields the post path reads directly."""

    __slots__ = ("name", "slot")

    def __init__(self, name: str) -> None:
        self.name = name
        self.slot = "_" + name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> CMember: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> int: ...
    def __get__(self, obj: object, owner: type | None = None) -> CMember | int:
        if obj is None:
            return self
        value: int = getattr(obj, self.slot)
        return value

    def __set__(self, obj: object, value: object) -> None:
        setattr(obj, self.slot, c_member(obj, self.name, value))


class CStruct:
    """Mixin for attribute objects whose fields are members of a C struct.

    ``_c_fields`` maps a field name to its width in bits (negative: signed).
    Setting such a field checks the value as the C member would take it
    (:func:`c_member`); other attributes are free.
    """

    _c_fields: ClassVar[dict[str, int]] = {}

    def __setattr__(self, name: str, value: object) -> None:
        if name in self._c_fields:
            value = c_member(self, name, value)
        object.__setattr__(self, name, value)
