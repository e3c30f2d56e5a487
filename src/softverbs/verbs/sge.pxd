# Cython declarations for sge.py (compiled mode only; see softverbs.compiled).
# SGE is an extension type: the post path (wr.pxd, qp.pxd) reads its members'
# slots as C struct fields.  They stay Python objects, so what is stored is
# exactly what the checks returned.  The constructor checks each C member with base's rule,
# c_member: cimported, so the check is a C call (the module is therefore in
# compiled.LINKED).

from softverbs.verbs.base cimport PyverbsCM, c_member

cdef class SGE(PyverbsCM):
    cdef public object _addr, _length, _lkey
    cdef dict __dict__
