# Cython declarations for packet.py (compiled mode only; see softverbs.compiled).
# Packet becomes an extension type: one is made per message (and per ACK), and
# its constructor's 35 stores are C struct stores.  It has no free list and is
# tracked by the collector: Cython 3.3 ignores @cython.freelist and @cython.no_gc
# in a .pxd, and refuses them in the .py for a class the .pxd declares.  The
# header fields stay Python objects, so a field holds exactly what was stored (a bool stays a bool, an IntEnum stays one); only count, no
# header field, is a C integer.  Burst is an extension type on it whose own
# fields (where in its message it is) are C integers: the responder executes
# a burst, and splits off its last packet, by C struct reads and C calls.

cimport cython

cdef class Packet:
    # BTH
    cdef public object opcode, se, mig, pad, tver, pkey, fecn, becn, dqpn, ackreq, psn
    # RETH / AtomicETH; AETH / AtomicAckETH; DETH; ImmDt, IETH, XRCETH
    cdef public object va, rkey, dma_len, swap_add, compare, syndrome, msn, orig
    cdef public object qkey, src_qp, imm, inv_rkey, srqn
    # data; network and UDP layers; not on the wire
    cdef public object payload, sgid, dgid, sport, tclass, flow_label, hop_limit
    cdef public object sqpn, corrupt_bit
    # packets this object stands for (1; a Burst's count): read for every
    # packet by the runtime, the device, the QP and its parts, a C integer
    cdef public long long count

    # the fields of a new packet: the constructor's and new_packet's
    cdef _init(self, object opcode, object dqpn, object psn, object payload)


cdef class Burst(Packet):
    cdef public object ops
    cdef public long long ack_every, first_index, last_opcode, msg_packets, seg

    # packet j, as it goes on the wire: its fields C struct copies and stores
    @cython.locals(pkt=Packet, seg=cython.longlong)
    cpdef Packet segment(self, long long j)


# a new packet, as the engine makes its requests and responses: the object made by
# tp_new (no call through the type, no argument parsing) filled by
# Packet._init, which the constructor calls too (one list of the defaults)
@cython.locals(pkt=Packet)
cpdef Packet new_packet(object opcode, object dqpn, object psn, object payload=*)

# every field of src onto dst: C struct copies (a burst and each packet split from it)
cpdef _copy_fields(Packet src, Packet dst)

# a one-packet message is shaped in place (burst -> _shape): C calls, and the
# packet's fields C struct stores rather than attribute stores by name
@cython.locals(b=Burst, last=cython.longlong)
cpdef burst(Packet template, object ops, long long first_index, long long count,
            long long msg_packets, long long seg, long long ack_every)
cpdef _opcode_at(object ops, long long i, long long n)
cpdef _shape(Packet pkt, object ops, long long i, long long n, long long ack_every)
cpdef bint ackreq_at(long long i, long long n, long long ack_every)
