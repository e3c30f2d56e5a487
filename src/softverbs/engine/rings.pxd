# Cython declarations for rings.py (compiled mode only; see softverbs.compiled).
# SendWQE becomes an extension type: the requester and the completer read and
# write its progress fields as C integers.  The fields the application fills
# stay Python objects, so what is stored is exactly what was given.

cimport cython

@cython.freelist(64)
cdef class SendWQE:
    # the WR as posted
    cdef public object wr_id, signaled, sges, inline, fence, se, imm, inv_rkey, rkey
    cdef public object remote_addr, compare_add, swap, ah, remote_qpn, remote_qkey, xrc_srqn
    cdef public object bind_mw, bind_mr, bind_rkey, bind_addr, bind_length, bind_access
    cdef public object driver_op, caller, route, bind, local_op
    cdef public long long opcode, length, index
    # the requester's progress
    cdef public object state  # a WqeState member: its name appears in messages
    cdef public long long psn, npkts, tx, rxd
    cdef public object data, status, reason


# RecvWQE and CQE: one of each per received message.  As extension types they
# are allocated from a freelist and their fields are slots of a C struct.  The
# fields stay Python objects, so what is stored is exactly what was given.
@cython.freelist(64)
cdef class RecvWQE:
    cdef public object wr_id, sges, length, index, srq, bad


@cython.freelist(64)
cdef class CQE:
    cdef public object wr_id, status, opcode, qp_num, byte_len, wc_flags, imm, vendor_err
    cdef public object src_qp, pkey_index, sl, slid, solicited, reason, wq_kind, wq_handle
    cdef public object index, dead
