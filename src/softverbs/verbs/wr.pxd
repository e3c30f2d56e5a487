# Cython declarations for wr.py (compiled mode only; see softverbs.compiled).
# SendWR and RecvWR are extension types (on _SgeList, their shared sg list):
# the post path (qp.pxd) reads their members' slots as C struct fields.  The members
# stay Python objects, so what is stored is exactly what the checks returned.
# The constructors check each C member with base's rule, c_member: cimported,
# so the check is a C call (the module is therefore in compiled.LINKED).

cimport cython
from softverbs.verbs.base cimport PyverbsCM, c_member
from softverbs.verbs.sge cimport SGE as _SGE  # (wr.py re-exports the Python name SGE)

cdef class _SgeList(PyverbsCM):
    cdef public object sg, next_wr  # (__dealloc__ frees a next_wr list one WR at a time)
    cdef public object _wr_id  # wr_id, both kinds' (the property checks it)
    cdef dict __dict__

cdef class RecvWR(_SgeList):
    pass

cdef class SendWR(_SgeList):
    cdef public object _opcode, _imm_data, _send_flags
    cdef public object _remote_addr, _rkey_remote, _compare_add, _swap, ah, _remote_qpn
    cdef public object _remote_qkey, _remote_srqn, mw, bind_info, bind_rkey

@cython.locals(r=RecvWR, s=_SGE, length=cython.longlong, sges=list)
cpdef recv_wqe(object w, Py_ssize_t max_sge, object n, str verb)
cpdef _SGE sge_of(object item, object n, str verb, object wr_id)
