# Cython declarations for base.py (compiled mode only; see softverbs.compiled).
# PyverbsObject is an extension type, as in pyverbs, so that WC (cq.pxd) can
# be one too; every other verbs class stays an ordinary Python subclass.

cdef class PyverbsObject:
    cdef public object logger
