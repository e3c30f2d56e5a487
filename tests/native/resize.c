/* Verbs that move an object to new memory, and the GID table
 * (tests/native/test_c_tools.py):
 *
 * 1. ibv_resize_cq with completions waiting: they are polled after it, in
 *    order, from the bigger CQ; a size below the waiting ones is EINVAL.
 * 2. ibv_modify_srq(IBV_SRQ_MAX_WR) with receives posted: they stay posted and
 *    are used in order, and the SRQ takes the larger number of receives.
 * 3. ibv_rereg_mr(IBV_REREG_MR_CHANGE_TRANSLATION): a SEND through the new
 *    lkey carries the new buffer's bytes; bad flags give
 *    IBV_REREG_MR_ERR_INPUT and EINVAL; unmapped memory is EFAULT, for
 *    ibv_reg_mr too, and so are read-only pages with a writable access.
 * 4. ibv_query_gid_table lists GID 0 (the link-local one) and GID 1 (RoCEv2).
 *
 * The traffic is UD SENDs from a QP to itself.  Prints one line per check;
 * exits 0 if all hold.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "check.h"

#define QKEY 0x11111111
#define MSG 64
#define GRH 40

static int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return -1;
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return -1;
	a.qp_state = IBV_QPS_RTS;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

static int post_recv(struct ibv_srq *srq, struct ibv_mr *mr, char *buf, uint64_t id)
{
	struct ibv_sge sge = {.addr = (uintptr_t)(buf + id * (GRH + MSG)), .length = GRH + MSG,
			      .lkey = mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad;
	return ibv_post_srq_recv(srq, &wr, &bad);
}

static int post_send(struct ibv_qp *qp, struct ibv_ah *ah, uint32_t lkey, void *src, uint64_t id)
{
	struct ibv_sge sge = {.addr = (uintptr_t)src, .length = MSG, .lkey = lkey};
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qp->qp_num;
	wr.wr.ud.remote_qkey = QKEY;
	return ibv_post_send(qp, &wr, &bad);
}

int main(void)
{
	static char rbuf[32 * (GRH + MSG)], sbuf[MSG], other[MSG];
	struct ibv_context *ctx = open_first_device();
	if (!ctx)
		return 2;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 4, NULL, NULL, 0) : NULL;
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
	struct ibv_srq *srq = cq ? ibv_create_srq(pd, &sa) : NULL;
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .srq = srq,
				      .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = 16, .max_send_sge = 1}};
	struct ibv_qp *qp = srq ? ibv_create_qp(pd, &ia) : NULL;
	struct ibv_mr *rmr = qp ? ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_mr *smr = rmr ? ibv_reg_mr(pd, sbuf, sizeof(sbuf), 0) : NULL;
	union ibv_gid gid;
	if (!smr || to_rts(qp) || ibv_query_gid(ctx, 1, 1, &gid))
		return printf("FAIL setup\n"), 2;
	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1,
				 .grh = {.dgid = gid, .sgid_index = 1, .hop_limit = 64}};
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah)
		return printf("FAIL setup\n"), 2;
	struct ibv_wc wc[32];

	/* 2: three receives posted, then the SRQ grows to 16 */
	int ok = 1;
	for (uint64_t i = 0; i < 3; i++)
		ok &= post_recv(srq, rmr, rbuf, i) == 0;
	struct ibv_srq_attr grow = {.max_wr = 16};
	check(ok && ibv_modify_srq(srq, &grow, IBV_SRQ_MAX_WR) == 0,
	      "ibv_modify_srq(IBV_SRQ_MAX_WR) to 16 with 3 receives posted");
	ok = 1;
	for (uint64_t i = 3; i < 15; i++)
		ok &= post_recv(srq, rmr, rbuf, i) == 0;
	struct ibv_srq_attr q;
	check(ok && ibv_query_srq(srq, &q) == 0 && q.max_wr == 16,
	      "twelve more receives fit (15 posted), and ibv_query_srq says 16");

	/* 1: three SENDs complete (six CQEs) into a CQ of 4 ... after it grows */
	check(ibv_resize_cq(cq, 32) == 0 && cq->cqe >= 32, "ibv_resize_cq from 4 to 32");
	ok = 1;
	for (uint64_t i = 0; i < 3; i++) {
		memset(sbuf, 'a' + (int)i, MSG);
		ok &= post_send(qp, ah, smr->lkey, sbuf, 100 + i) == 0;
		nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);	/* one at a time */
	}
	struct timespec ts = {0, 200 * 1000 * 1000};
	nanosleep(&ts, NULL);	/* all six CQEs are waiting, none polled yet */
	check(ok && ibv_resize_cq(cq, 2) == EINVAL, "a size below the 6 waiting: EINVAL");
	check(ibv_resize_cq(cq, 8) == 0, "ibv_resize_cq to 8 with the 6 waiting");
	int got = poll_n(cq, wc, 6);
	int sends = 0, recvs = 0;
	uint64_t next = 0;
	for (int i = 0; i < got; i++) {
		if (wc[i].status != IBV_WC_SUCCESS)
			continue;
		if (wc[i].opcode == IBV_WC_SEND)
			sends++;
		else if (wc[i].opcode == IBV_WC_RECV && wc[i].wr_id == next &&
			 rbuf[next * (GRH + MSG) + GRH] == 'a' + (char)next)
			recvs++, next++;
	}
	check(got == 6 && sends == 3 && recvs == 3,
	      "then the 6 are polled: 3 sends, 3 receives in the order posted, bytes intact");

	/* 3: the send MR moves to another buffer */
	memset(other, 'z', MSG);
	check(ibv_rereg_mr(smr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, other, MSG, 0) == 0 &&
		      smr->addr == other,
	      "ibv_rereg_mr(IBV_REREG_MR_CHANGE_TRANSLATION) to another buffer");
	check(post_send(qp, ah, smr->lkey, other, 200) == 0 && poll_n(cq, wc, 2) == 2 &&
		      wc[0].status == IBV_WC_SUCCESS && wc[1].status == IBV_WC_SUCCESS &&
		      rbuf[3 * (GRH + MSG) + GRH] == 'z',
	      "a SEND through its new lkey carries the new buffer's bytes");
	errno = 0;
	check(ibv_rereg_mr(smr, 0x100, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT &&
		      errno == EINVAL,
	      "unknown rereg flags: IBV_REREG_MR_ERR_INPUT, errno EINVAL");
	/* memory that is not mapped: EFAULT, as the kernel's ib_umem_get */
	errno = 0;
	check(ibv_rereg_mr(smr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, (void *)0x1000, MSG, 0) ==
			  IBV_REREG_MR_ERR_CMD && errno == EFAULT,
	      "rereg to unmapped memory: IBV_REREG_MR_ERR_CMD, errno EFAULT");
	errno = 0;
	check(!ibv_reg_mr(pd, (void *)0x1000, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT,
	      "ibv_reg_mr of unmapped memory: NULL, errno EFAULT");
	void *ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *romr = ibv_reg_mr(pd, ro, 4096, IBV_ACCESS_REMOTE_READ);
	check(romr != NULL, "read-only pages register for IBV_ACCESS_REMOTE_READ");
	errno = 0;
	check(!ibv_reg_mr(pd, ro, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT,
	      "and with IBV_ACCESS_LOCAL_WRITE: NULL, errno EFAULT");
	if (romr)
		ibv_dereg_mr(romr);
	munmap(ro, 4096);

	/* 4 */
	struct ibv_gid_entry table[16];
	ssize_t k = ibv_query_gid_table(ctx, table, 16, 0);
	check(k >= 2 && table[0].gid_index == 0 && table[0].gid.raw[0] == 0xfe &&
		      table[1].gid_index == 1 && table[1].gid_type == IBV_GID_TYPE_ROCE_V2 &&
		      !memcmp(&table[1].gid, &gid, sizeof(gid)),
	      "ibv_query_gid_table: GID 0 link-local, GID 1 RoCEv2");

	ibv_destroy_ah(ah);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(rmr);
	ibv_destroy_srq(srq);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return failures ? 1 : 0;
}
