/* A C program that misuses verbs, for the sanitizer (tests/native/test_c_sanitizer.py).
 *
 *   misuse sqfull   an RC QP connected to itself, sq_sig_all = 0 and
 *                   max_send_wr = 4: five unsignaled SENDs; the fifth fails
 *                   with ENOMEM (the device warns at the third)
 *   misuse flush    receives posted, the QP moved to ERR, and destroyed
 *                   before the flushed completions are polled
 *   misuse mr       a SEND waiting for a receive (RNR), then its MR deregistered
 *   misuse correct  the same objects, used correctly: no report
 *
 * Prints "done" and exits 0 when the verbs behaved as expected.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

static char buf[4096];

static int connect_to_self(struct ibv_context *ctx, struct ibv_qp *qp)
{
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 1, &gid))
		return -1;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qp->qp_num;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int post_recv(struct ibv_qp *qp, struct ibv_mr *mr, uint64_t id)
{
	struct ibv_sge sge = {(uintptr_t)buf, 64, mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad;
	return ibv_post_recv(qp, &wr, &bad);
}

static int post_send(struct ibv_qp *qp, struct ibv_mr *mr, uint64_t id)
{
	struct ibv_sge sge = {(uintptr_t)buf, 64, mr->lkey};
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND}, *bad;
	return ibv_post_send(qp, &wr, &bad);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "correct";
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		return 2;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	struct ibv_mr *mr = cq ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = mr ? ibv_create_qp(pd, &ia) : NULL;
	if (!qp || connect_to_self(ctx, qp)) {
		perror("setup");
		return 2;
	}
	int ok = 1;
	if (!strcmp(mode, "sqfull")) {
		for (int i = 0; i < 4; i++)
			ok &= post_send(qp, mr, (uint64_t)i) == 0;
		ok &= post_send(qp, mr, 4) == ENOMEM;
	} else if (!strcmp(mode, "flush") || !strcmp(mode, "correct")) {
		for (int i = 0; i < 2; i++)
			ok &= post_recv(qp, mr, (uint64_t)i) == 0;
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
		ok &= ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0;
		if (!strcmp(mode, "correct")) {
			struct ibv_wc wc;
			for (int got = 0, spins = 0; got < 2 && spins < 100000000; spins++)
				got += ibv_poll_cq(cq, 1, &wc) == 1;
		}
	} else if (!strcmp(mode, "mr")) {
		ok &= post_send(qp, mr, 7) == 0;	/* no receive posted: RNR, it waits */
		ok &= ibv_dereg_mr(mr) == 0;
		mr = NULL;
	}
	ibv_destroy_qp(qp);
	if (mr)
		ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	printf(ok ? "done\n" : "unexpected verbs results\n");
	return ok ? 0 : 1;
}
