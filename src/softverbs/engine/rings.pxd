# Cython declarations for rings.py (compiled mode only; see softverbs.compiled).
# SendWQE becomes an extension type: the requester and the completer read and
# write its progress fields as C integers.  The fields the application fills
# stay Python objects, so what is stored is exactly what was given.

cimport cython

# Route: a QP's or an AH's GRH fields, read into every request packet (core.pxd's
# address takes it typed, so the reads are C struct reads).
cdef class Route:
    cdef public object dgid, flow_label, hop_limit, port, sgid, sgid_index, tclass


# ObjectSlots: the in-process store of every ring; write and read per WQE and CQE.
cdef class ObjectSlots:
    cdef public long long size
    cdef public list items

    cpdef write(self, long long index, object item)
    cpdef read(self, long long index)


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

    # every field stored once: the constructor's, and SendSlots.read's C call
    cdef _fill(self, object wr_id, long long opcode, object signaled, object sges,
               long long length,
               object inline, object fence, object se, object imm, object inv_rkey,
               object rkey, object xrc_srqn, object remote_addr, object compare_add,
               object swap, object ah, object remote_qpn, object remote_qkey, object bind_mw,
               object bind_mr, object bind_rkey, object bind_addr, object bind_length,
               object bind_access, object driver_op, object caller)


# RecvWQE and CQE: one of each per received message.  As extension types their
# fields are slots of a C struct.  The fields stay Python objects, so what is
# stored is exactly what was given.  (No free list: Cython 3.3 ignores
# @cython.freelist in a .pxd, and refuses it in the .py for a class declared here.)
cdef class RecvWQE:
    cdef public object wr_id, sges, length, index, srq, bad


cdef class CQE:
    cdef public object wr_id, status, opcode, qp_num, byte_len, wc_flags, imm, vendor_err
    cdef public object src_qp, pkey_index, sl, slid, solicited, reason, wq_kind, wq_handle
    cdef public object index, dead

    # the fields of a new CQE: the constructor's and new_cqe's
    cdef _init(self, object wr_id, object status, object opcode, object qp_num,
               object byte_len, object wc_flags, object imm)


# a new CQE, as the engine makes one per completion: the object made by tp_new
# (no call through the type, no argument parsing) filled by CQE._init,
# which the constructor calls too (one list of the defaults)
@cython.locals(c=CQE)
cpdef CQE new_cqe(object wr_id, object status, object opcode, object qp_num,
                  object byte_len=*, object wc_flags=*, object imm=*)


# The packed slot stores: the byte layouts of the shared rings (docs/rings.md).  The
# device reads a send or receive WQE and writes a CQE per message through them; as
# extension types, the WQE and CQE they build or read are typed, so their fields are
# stores and loads of a C struct.  Sizes are C constants (the public names stay
# Python integers).
cdef long long _HDR, _SEND_HDR, _SGE, _RECV_HDR, _CQE
cdef long long _SEND_FLAGS, _F_SIGNALED, _F_FENCE, _F_SOLICITED, _F_INLINE
cdef long long _CQE_DEAD, _CQE_SOLICITED
cdef long long _CQ_WR_ID, _CQ_STATUS, _CQ_OPCODE, _CQ_VENDOR_ERR, _CQ_BYTE_LEN, _CQ_IMM
cdef long long _CQ_QP_NUM, _CQ_SRC_QP, _CQ_WC_FLAGS, _CQ_WQ_HANDLE, _CQ_WQE_INDEX
cdef long long _CQ_PKEY_INDEX, _CQ_SLID, _CQ_SL, _CQ_DLID_BITS, _CQ_WQ_KIND, _CQ_FLAGS
cdef long long _CQ_REASON, _CQ_REASON_WORDS
cdef long long _SQ_WR_ID, _SQ_REMOTE_ADDR, _SQ_COMPARE, _SQ_SWAP, _SQ_BIND_ADDR, _SQ_BIND_LEN
cdef long long _SQ_CALLER, _SQ_OPCODE, _SQ_FLAGS, _SQ_NUM_SGE, _SQ_INLINE_LEN, _SQ_IMM
cdef long long _SQ_INV_RKEY, _SQ_RKEY, _SQ_SRQN, _SQ_AH, _SQ_RQPN, _SQ_RQKEY, _SQ_MW, _SQ_MR
cdef long long _SQ_BIND_RKEY, _SQ_BIND_ACCESS, _SQ_DRIVER_OP, _RQ_WR_ID, _RQ_NUM_SGE
cdef long long _SGE_ADDR, _SGE_LENGTH, _SGE_LKEY


cdef class PackedSlots:
    cdef public object buf
    cdef public long long size, slot
    # the same bytes typed, one array per field width (SharedRegion.cast)
    cdef unsigned char[::1] u8
    cdef unsigned short[::1] u16
    cdef unsigned int[::1] u32
    cdef unsigned long long[::1] u64

    cpdef long long offset(self, long long index)
    cpdef detach(self)
    @cython.locals(length=cython.longlong, n=cython.longlong, _i=cython.longlong)
    cdef long long _sges(self, long long pos, long long count, list sges)


cdef class SendSlots(PackedSlots):
    cdef public object opcodes

    cpdef write(self, long long index, object w)
    @cython.locals(off=cython.longlong, w8=cython.longlong, w4=cython.longlong,
                   w2=cython.longlong, opcode=cython.longlong, flags=cython.longlong,
                   nsge=cython.longlong, inline_len=cython.longlong, pos=cython.longlong,
                   length=cython.longlong, sges=list, w=SendWQE)
    cpdef read(self, long long index)


cdef class RecvSlots(PackedSlots):
    cpdef write(self, long long index, object w)
    @cython.locals(off=cython.longlong, nsge=cython.longlong, length=cython.longlong,
                   sges=list, bad=RecvWQE)
    cpdef read(self, long long index)


cdef class CQESlots(PackedSlots):
    @cython.locals(flags=cython.longlong, off=cython.longlong, w8=cython.longlong,
                   w4=cython.longlong, w2=cython.longlong, i=cython.longlong, start=cython.longlong)
    cpdef write(self, long long index, CQE c)
    @cython.locals(c=CQE)
    cpdef read(self, long long index)


# The rings: extension types, held typed by QPCore (core.pxd), so the parts'
# fetches, takes and CQE pushes are C calls.  The indices the device keeps
# for itself are C integers; what it reads from a header (memory the
# application writes, possibly anything) is read as a Python integer and
# bounded before it is stored in one.  The header word numbers are C
# constants here and class attributes (PI, DB, ...) for everyone else.
cdef long long _W_PI, _W_DB, _W_STATE
cdef long long _S_PI, _S_TAKEN, _S_LIMIT, _S_DISCARDED
cdef long long _C_PI, _C_CI, _C_ARM, _C_FIRED, _C_ERROR


cdef class WorkRing:
    cdef public long long size, capacity, ci, seen_db
    cdef public object slots, hdr, tag, fetch
    cdef public list fetched

    cpdef push(self, object wqe)
    cpdef bint ring(self, object upto)
    @cython.locals(seen=cython.longlong, top=cython.longlong)
    cpdef long long _bound(self, object value)
    @cython.locals(seen=cython.longlong, new=cython.longlong, i=cython.longlong,
                   size=cython.longlong, fetched=list)
    cpdef long long latch(self, bint everything=*)
    cpdef get(self, long long index)
    cpdef publish_state(self, object state)


cdef class SharedRecvRing:
    cdef public long long size, max_sge, srqn, posted, released, seen_taken
    cdef public object slots, hdr, tag, on_limit, pd, xrcd, cq, owner

    @cython.locals(taken=cython.longlong, pi=cython.longlong, wqe=RecvWQE)
    cpdef take(self)


cdef class CompletionRing:
    cdef public long long capacity, tail, seen_ci, fired
    cdef public bint error
    cdef public object slots, hdr, notify, fence, owner

    @cython.locals(word=cython.ulonglong, ci=cython.longlong)
    cpdef long long _ci(self)
    @cython.locals(tail=cython.longlong)
    cpdef bint push(self, CQE cqe)


# a message's last store, its last cache line last: C functions for the responder, which
# cimports place (the hook of a span's own ordered store is still looked up by name)
@cython.locals(n=Py_ssize_t, cut=Py_ssize_t)
cpdef place(object view, Py_ssize_t offset, object data)
cpdef bint _ordered_store(object view, Py_ssize_t offset, object data)
