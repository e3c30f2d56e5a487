/* Send and receive queues of 0 WRs from C (tests/native/test_c_tools.py).
 *
 * rdma-core on rxe accepts max_send_wr=0 or max_recv_wr=0 and reports 0
 * back in cap; qperf's one-sided tests create such QPs.  A post to a queue
 * of 0 WRs fails with ENOMEM, as to a full queue, and names the WR in
 * bad_wr.  Prints one line per check; exits 0 if all hold.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "check.h"

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t send, uint32_t recv,
			    struct ibv_qp_init_attr *ia)
{
	memset(ia, 0, sizeof(*ia));
	ia->send_cq = ia->recv_cq = cq;
	ia->qp_type = IBV_QPT_RC;
	ia->cap = (struct ibv_qp_cap){.max_send_wr = send, .max_recv_wr = recv,
				      .max_send_sge = 1, .max_recv_sge = 1};
	struct ibv_qp *qp = ibv_create_qp(pd, ia);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	if (qp && ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				IBV_QP_ACCESS_FLAGS))
		return NULL;
	return qp;
}

int main(void)
{
	struct ibv_context *ctx = open_first_device();
	if (!ctx)
		return 2;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 4, NULL, NULL, 0) : NULL;
	if (!cq)
		return printf("FAIL setup\n"), 2;
	struct ibv_qp_init_attr ia;

	struct ibv_qp *nosend = rc_qp(pd, cq, 0, 4, &ia);
	check(nosend && ia.cap.max_send_wr == 0 && ia.cap.max_recv_wr == 4,
	      "max_send_wr=0 is accepted and reported back as 0");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	check(nosend && !ibv_query_qp(nosend, &qa, IBV_QP_CAP, &qi) && qa.cap.max_send_wr == 0,
	      "ibv_query_qp says max_send_wr 0");

	/* INIT: post_recv is allowed, so the receive side's ENOMEM is the queue's */
	struct ibv_qp *norecv = rc_qp(pd, cq, 4, 0, &ia);
	check(norecv && ia.cap.max_recv_wr == 0, "max_recv_wr=0 is accepted and reported as 0");
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr ? mr->lkey : 0};
	struct ibv_recv_wr rwr = {.wr_id = 9, .sg_list = &sge, .num_sge = 1}, *rbad = NULL;
	check(norecv && ibv_post_recv(norecv, &rwr, &rbad) == ENOMEM && rbad == &rwr,
	      "ibv_post_recv to it fails with ENOMEM, bad_wr the WR");
	check(nosend && ibv_post_recv(nosend, &rwr, &rbad) == 0,
	      "the QP without a send queue takes receives");

	/* RTS needs a peer; the send-side check is the same ring rule, seen in ERR
	 * (post_send is allowed there: the WR would be flushed) */
	struct ibv_qp_attr err = {.qp_state = IBV_QPS_ERR};
	struct ibv_send_wr swr = {.wr_id = 8, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND}, *sbad = NULL;
	check(nosend && !ibv_modify_qp(nosend, &err, IBV_QP_STATE) &&
	      ibv_post_send(nosend, &swr, &sbad) == ENOMEM && sbad == &swr,
	      "ibv_post_send to max_send_wr=0 fails with ENOMEM, bad_wr the WR");

	if (nosend)
		ibv_destroy_qp(nosend);
	if (norecv)
		ibv_destroy_qp(norecv);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return failures ? 1 : 0;
}
