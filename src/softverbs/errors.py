"""Errors, sorted by who caused them.

* :class:`PyverbsRDMAError` -- a verb failed, with the errno rdma-core would
  return (``error_code``).  Raised at once for local misuse: EINVAL, ENOMEM,
  EPERM, EBUSY, EOPNOTSUPP.  The message says what was wrong and what to do.
* :class:`PyverbsUserError` -- the Python-level arguments are wrong before any
  verb runs (a wrong type, a missing SGE), exactly where pyverbs raises it.
* :class:`ConfigError` -- a setting (an environment variable, the link table)
  is wrong; the message names it.  An EINVAL ``PyverbsRDMAError`` and also a
  ``ValueError``, so code that caught either before still catches it.
* :class:`WireError` -- internal: a received packet is malformed.  It never
  leaves the receive path; the fabric counts it under ``reason`` and drops
  the packet.

Remote and protocol failures never raise: they become NAKs, WC statuses, the
ERR state and async events.

The class names, constructor shapes and message format match
``pyverbs.pyverbs_error`` so that code catching pyverbs' errors catches ours.
"""

from __future__ import annotations

import errno
import os
import threading


class PyverbsError(Exception):
    """Base class of every error softverbs raises to the application."""

    def __init__(self, msg: str, error_code: int = -1) -> None:
        if error_code != -1:
            msg = f"{msg}. Errno: {error_code}, {os.strerror(error_code)}"
        super().__init__(msg)


class PyverbsRDMAError(PyverbsError):
    """A verb failed; ``error_code`` is the errno (positive)."""

    def __init__(self, msg: str, error_code: int = -1) -> None:
        super().__init__(msg, error_code)
        self._error_code = error_code
        if error_code > 0:
            # a failed C verb leaves its errno behind; PyverbsRDMAErrno reads it
            _errno.value = error_code

    @property
    def error_code(self) -> int:
        return self._error_code


class PyverbsUserError(PyverbsError):
    """The caller passed arguments pyverbs itself would reject."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)


#: The name the design documents use for a failed verb.
VerbsError = PyverbsRDMAError


class _Errno(threading.local):
    value = 0


#: The errno of the last failed verb on this thread, like C's ``errno``.
_errno = _Errno()


def last_errno() -> int:
    """The errno of the last verb that failed on this thread (0 if none has)."""
    return _errno.value


def PyverbsRDMAErrno(msg: str) -> PyverbsRDMAError:
    """pyverbs' ``PyverbsRDMAErrno``: an error carrying the current errno.

    In C the current errno is whatever the last failed call left. softverbs
    raises its errors instead of setting errno, so here it is the errno of
    the last :class:`PyverbsRDMAError` raised on this thread.
    """
    return PyverbsRDMAError(msg, _errno.value)


def einval(msg: str) -> PyverbsRDMAError:
    return PyverbsRDMAError(msg, errno.EINVAL)


def enomem(msg: str) -> PyverbsRDMAError:
    return PyverbsRDMAError(msg, errno.ENOMEM)


def eopnotsupp(msg: str) -> PyverbsRDMAError:
    return PyverbsRDMAError(msg, errno.EOPNOTSUPP)


def ebusy(msg: str) -> PyverbsRDMAError:
    return PyverbsRDMAError(msg, errno.EBUSY)


def eperm(msg: str) -> PyverbsRDMAError:
    return PyverbsRDMAError(msg, errno.EPERM)


class ConfigError(PyverbsRDMAError, ValueError):
    """A setting the user made is wrong: an environment variable (``SOFTVERBS_FAULTS``,
    ``SOFTVERBS_PCAP`` ...), the link table, a command-line option.  The message names
    the setting and says what is wrong with it, on one line; the command-line tool
    prints it without a traceback.

    It is the EINVAL a verb (opening the device) fails with, and also a ValueError,
    which is what a bad setting raised before this class existed."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)  # no "Errno:" suffix: the message is read by people
        self._error_code = errno.EINVAL


class UserError(Exception):
    """A program's user asked for something that cannot be done (a command-line
    tool's or a sample program's option); the message says what and names the
    option, variable or file.  ``softverbs``'s :func:`~softverbs.cli.main.main`
    prints it on one line, with no traceback."""


class WireError(Exception):
    """A received packet is malformed; ``reason`` names the drop counter."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
