# Cython declarations for psn.py (compiled mode only; see softverbs.compiled).
# The PSN arithmetic as C functions: the parts cimport this module, so their
# P.add / P.diff calls are C calls.  C long long holds any PSN sum or difference.

cimport cython

cdef long long _MASK, _HALF, _SPACE

cpdef long long add(long long psn, long long n)
# d typed: untyped, it was a Python integer made and unboxed on every call
@cython.locals(d=cython.longlong)
cpdef long long diff(long long a, long long b)
# the ACK timer of every ACK and every first request: a C call (None: no timeout)
cpdef object ack_timeout_s(object code)  # Python integers: 1 << 31 does not overflow
