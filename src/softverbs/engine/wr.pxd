# Cython declarations for wr.py (compiled mode only; see softverbs.compiled).

cimport cython

from softverbs.engine.rings cimport SendWQE

cdef class WrInfo:
    cdef public object klass  # a WrClass member: compared with `is`
    cdef public long long wc_opcode
    cdef public bint imm, inv, rd
    cdef public dict ops

# the tables the per-WQE calls read: C globals
cdef tuple _BY_OPCODE
cdef unsigned long long _MOVE_BITS
cdef long long _I_CANCELLED, _I_ACTIVE

@cython.locals(info=WrInfo)
cpdef WrInfo info_of(long long opcode)
@cython.locals(old=cython.longlong, to=cython.longlong)
cpdef move(SendWQE wqe, object new)
@cython.locals(state=cython.longlong)
cpdef bint finished(SendWQE wqe)
@cython.locals(state=cython.longlong)
cpdef bint pending(SendWQE wqe)
