# Cython declarations for qp.py (compiled mode only; see softverbs.compiled).
# QP stays an ordinary Python class (users and ext/mlx5dv.py subclass it); the
# post path's work is in module functions that hold the QP's facts of a post
# (_SendFacts, read once per post), the WRs, their SGEs, the rings and the
# WQEs typed, so the ring pushes are C calls and the reads and writes of WRs,
# SGEs and WQEs are C struct reads and writes (the module is therefore in
# compiled.LINKED).

cimport cython
from softverbs.engine.rings cimport SendWQE, WorkRing
from softverbs.engine.wr cimport WrInfo, info_of
from softverbs.verbs.sge cimport SGE
from softverbs.verbs.wr cimport RecvWR, SendWR, recv_wqe, sge_of

cdef unsigned long long _POST_SEND_STATE_BITS
cdef long long _DEFER, _SIGNALED, _INLINE, _FENCE, _SOLICITED, _NOT_SEND_FLAGS
cdef long long _UD, _XRC_SEND, _LOCAL_INV, _BIND_MW

cdef class _SendFacts:
    cdef public object qp
    cdef public WorkRing sq
    cdef public long long qp_type, max_sge, max_inline, room, unsignaled
    cdef public unsigned long long opcodes
    cdef public bint sig_all, can_post
    cdef public object state

@cython.locals(room=cython.longlong, n=cython.longlong, r=RecvWR)
cpdef _post_recvs(WorkRing rq, object wr, object max_sge, object bad_wr)

@cython.locals(sq=WorkRing, wqe=SendWQE, w=SendWR, f=_SendFacts, own=bint, n=cython.longlong,
               flags=cython.longlong)
cpdef _post_chain(object qp, object wr, object bad_wr)

cpdef SendWQE _send_wqe(object qp, object w, object n, bint type1_bind)

@cython.locals(wqe=SendWQE, info=WrInfo, s=SGE, qp_type=cython.longlong,
               opcode=cython.longlong, flags=cython.longlong, length=cython.longlong, sges=list)
cpdef SendWQE _wqe_of(_SendFacts f, SendWR w, object n, bint type1_bind)
