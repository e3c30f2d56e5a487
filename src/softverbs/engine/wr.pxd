# Cython declarations for wr.py (compiled mode only; see softverbs.compiled).

from softverbs.engine.rings cimport SendWQE

cdef class WrInfo:
    cdef public object klass  # a WrClass member: compared with `is`
    cdef public long long wc_opcode
    cdef public bint imm, inv, rd
    cdef public dict ops

cpdef move(SendWQE wqe, object new)
cpdef bint finished(SendWQE wqe)
cpdef bint pending(SendWQE wqe)
