# Cython declarations for base.py (compiled mode only; see softverbs.compiled).
# PyverbsObject and PyverbsCM are extension types, as in pyverbs, so that WC
# (cq.pxd) and the post path's records (sge.pxd, wr.pxd) can be ones too; every
# other verbs class stays an ordinary Python subclass (with its own __dict__).

cdef class PyverbsObject:
    cdef object _logger  # None until the logger property first looks it up

cdef class PyverbsCM(PyverbsObject):
    cdef public object _deps
    cdef public bint _closed
    cdef object __weakref__  # resources are held in their parents' WeakSets

cimport cython

# the C-member rule: a C call from the constructors of sge.py and wr.py (their .pxd cimport it)
@cython.locals(fields=dict, limits=dict)
cpdef object c_member(object obj, str name, object value)
