/* Unit tests of libibverbs' own pieces, driven by tests/native/test_c_unit.py.
 *
 * The library's sources are included here, so the static functions of the
 * data path (encoding WQEs, polling CQEs, arming) are tested directly, on
 * rings whose memfds the Python side made and checks with its own codec --
 * one layout, two implementations, one test.  The connection to the service
 * is replaced by the stubs below.  Built with -Wall -Wextra -Werror and
 * under AddressSanitizer and UndefinedBehaviorSanitizer.
 *
 *   unit sizes
 *   unit send FD NSLOTS SLOT MAX_SGE MAX_INLINE QP_TYPE
 *   unit recv FD NSLOTS SLOT MAX_SGE
 *   unit poll FD CAPACITY N
 *   unit arm FD CAPACITY SOLICITED
 */
#include "ring.c"
#include "verbs.c"

#include <stdio.h>
#include <sys/mman.h>

/* --- stubs for the connection ------------------------------------------------------- */
static int doorbells;
unsigned sv_forks;
static struct sv_context unit_ctx;	/* opened before any fork */

int sv_call(uint16_t op, const void *req, size_t req_len, const int *fds, int nfds, void *reply,
	    size_t reply_len, void *tail, size_t *tail_len)
{
	(void)op, (void)req, (void)req_len, (void)fds, (void)nfds, (void)reply, (void)reply_len;
	(void)tail, (void)tail_len;
	return ENOSYS;
}

void sv_doorbell(uint32_t qp, uint32_t queue)
{
	(void)qp, (void)queue;
	doorbells++;
}

void sv_bell_queues(int delta)
{
	(void)delta;
}

int sv_sanitizing(void)
{
	return 0;
}

int sv_destroy(uint32_t kind, uint32_t handle)
{
	(void)kind, (void)handle;
	return 0;
}

int sv_query_port(struct ibv_context *c, uint8_t p, struct ibv_port_attr *a, size_t l)
{
	(void)c, (void)p, (void)a, (void)l;
	return ENOSYS;
}

int sv_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *i,
		       struct ibv_device_attr_ex *a, size_t l)
{
	(void)c, (void)i, (void)a, (void)l;
	return ENOSYS;
}

int ibv_query_gid(struct ibv_context *c, uint8_t p, int i, union ibv_gid *g)
{
	(void)c, (void)p, (void)i, (void)g;
	return ENOSYS;
}

static void map_ring(struct sv_ring *r, int fd, uint32_t nslots, uint32_t slot)
{
	r->fd = fd;
	r->nslots = nslots;
	r->slot = slot;
	r->bytes = SV_RING_HEADER_SIZE + (size_t)nslots * slot;
	r->mem = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r->mem == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
}

/* --- send: a set of WRs every test knows ------------------------------------------- */
static int cmd_send(char **a)
{
	static struct sv_qp qp;	/* static: zeroed */
	int fd = atoi(a[0]);
	map_ring(&qp.sq, fd, (uint32_t)atoi(a[1]), (uint32_t)atoi(a[2]));
	qp.has_sq = 1;
	qp.cap.max_send_wr = qp.sq.nslots;	/* as create_qp sizes the ring */
	qp.cap.max_send_sge = (uint32_t)atoi(a[3]);
	qp.cap.max_inline_data = (uint32_t)atoi(a[4]);
	qp.qpx.qp_base.qp_type = (enum ibv_qp_type)atoi(a[5]);
	qp.qpx.qp_base.handle = 7;
	qp.ctx = &unit_ctx;
	pthread_spin_init(&qp.sq_lock, 0);
	char payload[64] = "inline bytes";
	struct ibv_sge sg[2] = {{0x1000, 100, 0x11}, {0x2000, 200, 0x22}};
	struct ibv_sge in = {(uintptr_t)payload, 12, 0};
	struct ibv_ah ah = {.handle = 42};
	struct ibv_send_wr w[7];
	memset(w, 0, sizeof(w));
	w[0] = (struct ibv_send_wr){.wr_id = 1, .sg_list = sg, .num_sge = 2, .opcode = IBV_WR_SEND,
				    .send_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED};
	w[1] = (struct ibv_send_wr){.wr_id = 2, .sg_list = &in, .num_sge = 1,
				    .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_INLINE,
				    .imm_data = htobe32(0x01020304)};
	w[2] = (struct ibv_send_wr){.wr_id = 3, .sg_list = sg, .num_sge = 1,
				    .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_FENCE};
	w[2].wr.rdma.remote_addr = 0xabcdef00;
	w[2].wr.rdma.rkey = 0x99;
	w[3] = (struct ibv_send_wr){.wr_id = 4, .sg_list = sg, .num_sge = 1,
				    .opcode = IBV_WR_ATOMIC_CMP_AND_SWP};
	w[3].wr.atomic.remote_addr = 0x5008;
	w[3].wr.atomic.rkey = 0x77;
	w[3].wr.atomic.compare_add = 5;
	w[3].wr.atomic.swap = 6;
	w[4] = (struct ibv_send_wr){.wr_id = 5, .sg_list = sg, .num_sge = 1,
				    .opcode = IBV_WR_SEND_WITH_INV, .invalidate_rkey = 0x1234};
	w[5] = (struct ibv_send_wr){.wr_id = 6, .sg_list = sg, .num_sge = 1, .opcode = IBV_WR_SEND};
	w[5].wr.ud.ah = &ah;
	w[5].wr.ud.remote_qpn = 0x123456;
	w[5].wr.ud.remote_qkey = 0x11111111;
	int n = 5;	/* RC: the first five; UD: the datagram alone */
	if (qp.qpx.qp_base.qp_type == IBV_QPT_UD) {
		w[0] = w[5];
		n = 1;
	}
	for (int i = 0; i + 1 < n; i++)
		w[i].next = &w[i + 1];
	struct ibv_send_wr *bad = NULL;
	sv_store(&qp.sq, SV_RING_SQ_STATE, IBV_QPS_RTS + 1);
	int err = post_send(&qp.qpx.qp_base, &w[0], &bad);
	printf("post %d bad %lu doorbells %d pi %lu db %lu\n", err,
	       bad ? (unsigned long)bad->wr_id : 0UL, doorbells,
	       (unsigned long)sv_load(&qp.sq, SV_RING_SQ_PI),
	       (unsigned long)sv_load(&qp.sq, SV_RING_SQ_DB));
	/* the ring is now full or not: one more, and a WR with too many SGEs */
	struct ibv_send_wr extra = {.wr_id = 99, .sg_list = sg, .num_sge = 2,
				    .opcode = IBV_WR_SEND};
	extra.wr.ud.ah = &ah;
	err = post_send(&qp.qpx.qp_base, &extra, &bad);
	printf("extra %d\n", err);
	struct ibv_send_wr toomany = extra;
	toomany.num_sge = (int)qp.cap.max_send_sge + 1;
	err = post_send(&qp.qpx.qp_base, &toomany, &bad);
	printf("toomany %d\n", err);
	/* a QP the device has not moved to RTS takes no sends */
	sv_store(&qp.sq, SV_RING_SQ_STATE, IBV_QPS_INIT + 1);
	err = post_send(&qp.qpx.qp_base, &extra, &bad);
	printf("init %d\n", err);
	return 0;
}

static int cmd_recv(char **a)
{
	static struct sv_qp qp;
	map_ring(&qp.rq, atoi(a[0]), (uint32_t)atoi(a[1]), (uint32_t)atoi(a[2]));
	qp.has_rq = 1;
	qp.ctx = &unit_ctx;
	qp.cap.max_recv_wr = qp.rq.nslots;
	qp.cap.max_recv_sge = (uint32_t)atoi(a[3]);
	pthread_spin_init(&qp.rq_lock, 0);
	struct ibv_sge sg[2] = {{0x3000, 64, 0x33}, {0x4000, 32, 0x44}};
	struct ibv_recv_wr w[3] = {{.wr_id = 10, .sg_list = sg, .num_sge = 2},
				   {.wr_id = 11, .sg_list = sg, .num_sge = 1},
				   {.wr_id = 12, .sg_list = sg, .num_sge = 0}};
	w[0].next = &w[1];
	w[1].next = &w[2];
	struct ibv_recv_wr *bad = NULL;
	int err = post_recv(&qp.qpx.qp_base, w, &bad);
	printf("post %d bad %lu doorbells %d pi %lu\n", err, bad ? (unsigned long)bad->wr_id : 0UL,
	       doorbells, (unsigned long)sv_load(&qp.rq, SV_RING_SQ_PI));
	/* the device reads an RQ's doorbell record itself, but flushes a QP in ERR
	 * only when told: a post to one rings (the state lives in the send ring) */
	qp.sq = qp.rq;
	qp.has_sq = 1;
	sv_store(&qp.sq, SV_RING_SQ_STATE, IBV_QPS_ERR + 1);
	w[2].next = NULL;
	err = post_recv(&qp.qpx.qp_base, &w[2], &bad);
	printf("in-err %d doorbells %d db %lu\n", err, doorbells,
	       (unsigned long)sv_load(&qp.rq, SV_RING_SQ_DB));
	return 0;
}

static int cmd_poll(char **a)
{
	static struct sv_cq cq;
	static struct sv_context ctx;
	pthread_mutex_init(&ctx.map_lock, NULL);
	map_ring(&cq.ring, atoi(a[0]), (uint32_t)atoi(a[1]), SV_RING_CQE_SIZE);
	cq.ctx = &ctx;
	pthread_mutex_init(&cq.cq.mutex, NULL);
	int want = atoi(a[2]);
	struct ibv_wc wc[8];
	int got = 0;
	while (got < want) {
		int n = poll_cq(&cq.cq, want - got < 3 ? want - got : 3, wc);	/* in pieces */
		if (n <= 0)
			break;
		for (int i = 0; i < n; i++)
			printf("wc %lu %d %d %u %08x %u %u %u\n", (unsigned long)wc[i].wr_id,
			       wc[i].status, wc[i].opcode, wc[i].byte_len, be32toh(wc[i].imm_data),
			       wc[i].qp_num, wc[i].src_qp, wc[i].wc_flags);
		got += n;
	}
	printf("ci %lu again %d\n", (unsigned long)sv_load(&cq.ring, SV_RING_CQ_CI),
	       poll_cq(&cq.cq, 8, wc));
	free(ctx.map);
	return 0;
}

static int cmd_arm(char **a)
{
	static struct sv_cq cq;
	map_ring(&cq.ring, atoi(a[0]), (uint32_t)atoi(a[1]), SV_RING_CQE_SIZE);
	cq.ctx = &unit_ctx;
	req_notify_cq(&cq.cq, atoi(a[2]));
	printf("arm %lu\n", (unsigned long)sv_load(&cq.ring, SV_RING_CQ_ARM));
	req_notify_cq(&cq.cq, 0);
	printf("arm %lu\n", (unsigned long)sv_load(&cq.ring, SV_RING_CQ_ARM));
	return 0;
}

static int cmd_sizes(void)
{
	unsigned sge[] = {0, 1, 2, 3, 16, 32}, inl[] = {0, 1, 64, 100, 1024};
	for (unsigned i = 0; i < sizeof(sge) / sizeof(sge[0]); i++) {
		for (unsigned j = 0; j < sizeof(inl) / sizeof(inl[0]); j++)
			printf("send %u %u %u\n", sge[i], inl[j], sv_send_slot_size(sge[i], inl[j]));
		printf("recv %u %u\n", sge[i], sv_recv_slot_size(sge[i]));
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "sizes"))
		return cmd_sizes();
	if (argc == 8 && !strcmp(argv[1], "send"))
		return cmd_send(argv + 2);
	if (argc == 6 && !strcmp(argv[1], "recv"))
		return cmd_recv(argv + 2);
	if (argc == 5 && !strcmp(argv[1], "poll"))
		return cmd_poll(argv + 2);
	if (argc == 5 && !strcmp(argv[1], "arm"))
		return cmd_arm(argv + 2);
	fprintf(stderr, "usage: unit sizes|send|recv|poll|arm ...\n");
	return 2;
}
