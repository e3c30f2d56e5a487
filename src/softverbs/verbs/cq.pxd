# Cython declarations for cq.py (compiled mode only; see softverbs.compiled).
# WC becomes an extension type: poll fills one per completion from the
# engine's CQE (also an extension type) by C struct reads and writes.  The
# fields stay Python objects, so what is stored is exactly what the CQE held.
# (Read from interpreted code, such a field costs more than a __slots__ one;
# making the WC costs far less: measured in docs/performance.md.)

cimport cython
from softverbs.engine.rings cimport CQE, WorkRing
from softverbs.verbs.base cimport PyverbsObject

cdef class WC(PyverbsObject):
    cdef public object wr_id, status, opcode, vendor_err, byte_len, qp_num, src_qp, imm_data
    cdef public object wc_flags, pkey_index, slid, sl, dlid_path_bits, reason

cpdef WC _fill_wc(WC wc, CQE cqe)

# the slots of a poll's CQEs given back: the CQEs read as C structs, a queue's
# release once per run of its CQEs
@cython.locals(cqe=CQE, pending=WorkRing)
cpdef _give_back(list cqes, dict rings)
