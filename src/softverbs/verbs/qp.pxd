# Cython declarations for qp.py (compiled mode only; see softverbs.compiled).
# QP stays an ordinary Python class (users and ext/mlx5dv.py subclass it); the
# post path's per-WR work is in two module functions whose ring, WQE and
# opcode facts are typed here, so the ring push is a C call and the WQE's
# fields are C struct reads and writes (the module is therefore in
# compiled.LINKED).

cimport cython
from softverbs.engine.rings cimport SendWQE, WorkRing
from softverbs.engine.wr cimport WrInfo

@cython.locals(sq=WorkRing, wqe=SendWQE, n=cython.longlong)
cpdef _post_chain(object qp, object wr, object bad_wr)

@cython.locals(sq=WorkRing, wqe=SendWQE, info=WrInfo)
cpdef SendWQE _send_wqe(object qp, object w, object n, bint type1_bind)
