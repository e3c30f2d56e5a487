"""24-bit packet sequence numbers and the IBA transport timers.

PSNs wrap at 2**24.  Two PSNs are compared inside a window of half the
space (IBA 9.7.1): ``a`` is *after* ``b`` when ``(a - b) mod 2**24`` is in
``1 .. 2**23 - 1``.  :func:`diff` returns that signed distance.

Timers (IBA 9.7.6.1.3 and table 45):

* local ACK timeout: 4.096 us * 2**timeout; timeout 0 means "wait forever".
* RNR NAK timer: a 5-bit code into :data:`RNR_TIMER_S`.
"""

from __future__ import annotations

PSN_MASK = 0xFFFFFF
_MASK = PSN_MASK  # C globals when compiled (psn.pxd); PSN_MASK stays a Python name
_HALF = 1 << 23
_SPACE = 1 << 24


def add(psn: int, n: int) -> int:
    return (psn + n) & _MASK


def diff(a: int, b: int) -> int:
    """Signed distance ``a - b`` in the 24-bit PSN space (-2**23 .. 2**23-1)."""
    d = (a - b) & _MASK
    return d - _SPACE if d >= _HALF else d


#: RNR NAK timer values in seconds, indexed by the 5-bit code.  Code 0 is
#: the longest (655.36 ms); code 1 is 0.01 ms.
RNR_TIMER_S: tuple[float, ...] = tuple(
    us / 1e6
    for us in (
        655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
        2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
        163840, 245760, 327680, 491520,
    )
)  # fmt: skip


def ack_timeout_s(code: int) -> float | None:
    """Local ACK timeout for a 5-bit ``timeout`` code; None means infinite."""
    if code == 0:
        return None
    return 4.096e-6 * (1 << code)


#: rnr_retry value meaning "retry forever" (IBA 9.7.5.2.8).
RNR_RETRY_INFINITE = 7
