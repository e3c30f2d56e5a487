# Cython declarations for base.py (compiled mode only; see softverbs.compiled).
# PyverbsObject is an extension type, as in pyverbs, so that WC (cq.pxd) can
# be one too; every other verbs class stays an ordinary Python subclass.

cdef class PyverbsObject:
    cdef object _logger  # None until the logger property first looks it up

cimport cython

# the C-member rule: a C call from the constructors of sge.py and wr.py (their .pxd cimport it)
@cython.locals(fields=dict, limits=dict)
cpdef object c_member(object obj, str name, object value)
