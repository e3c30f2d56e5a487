/* ibv_attach_mcast and ibv_detach_mcast through the C library, with
 * rdma-core's errno rules (tests/native/test_c_multicast.py):
 *
 *  - a QP that is not UD, or a GID that is not multicast: EINVAL;
 *  - a detach of a QP that is not attached: EINVAL;
 *  - attaching twice: 0 (one membership, as in rxe);
 *  - ibv_destroy_qp of an attached QP: EBUSY (the kernel's uverbs_free_qp);
 *  - a UD SEND to the group (QP 0xFFFFFF) reaches the attached QP with the GRH,
 *    whose IPv4 destination is the group; after the detach it does not.
 *
 * Prints one line per check; exits 0 if all hold.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "check.h"

#define QKEY 0x11111111u
#define MCAST_QPN 0xFFFFFFu

static char buf[8192];

static struct ibv_qp *ud_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		return NULL;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return NULL;
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return NULL;
	a.qp_state = IBV_QPS_RTS;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		return NULL;
	return qp;
}

static int post_recv(struct ibv_qp *qp, struct ibv_mr *mr)
{
	struct ibv_sge sge = {(uintptr_t)buf + 4096, 40 + 64, mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = 7, .sg_list = &sge, .num_sge = 1}, *bad;
	return ibv_post_recv(qp, &wr, &bad);
}

static int send_to_group(struct ibv_qp *qp, struct ibv_mr *mr, struct ibv_ah *ah)
{
	memcpy(buf, "to the group", 12);
	struct ibv_sge sge = {(uintptr_t)buf, 12, mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = MCAST_QPN;
	wr.wr.ud.remote_qkey = QKEY;
	return ibv_post_send(qp, &wr, &bad);
}

int main(void)
{
	struct ibv_context *ctx = open_first_device();
	if (!ctx)
		return 1;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!pd || !cq || !rcq || !mr) {
		printf("FAIL setup\n");
		return 1;
	}
	struct ibv_device_attr da;
	check(!ibv_query_device(ctx, &da) && da.max_mcast_grp > 0 && da.max_mcast_qp_attach > 0,
	      "the device reports multicast groups");

	union ibv_gid group, ucast;
	memset(&group, 0, sizeof(group));
	group.raw[10] = group.raw[11] = 0xff;
	inet_pton(AF_INET, "230.7.7.7", &group.raw[12]);
	check(!ibv_query_gid(ctx, 1, 1, &ucast), "query the IPv4 GID");

	struct ibv_qp_init_attr rcia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					.cap = {.max_send_wr = 1, .max_recv_wr = 1,
						.max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *rc = ibv_create_qp(pd, &rcia);
	struct ibv_qp *sender = ud_qp(pd, cq);
	struct ibv_qp_init_attr ia = {.send_cq = rcq, .recv_cq = rcq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = 1, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *member = ibv_create_qp(pd, &ia);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
	if (!rc || !sender || !member ||
	    ibv_modify_qp(member, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) {
		printf("FAIL QPs\n");
		return 1;
	}
	a.qp_state = IBV_QPS_RTR;
	ibv_modify_qp(member, &a, IBV_QP_STATE);

	check(ibv_attach_mcast(rc, &group, 0) == EINVAL, "an RC QP: EINVAL");
	check(ibv_attach_mcast(member, &ucast, 0) == EINVAL, "a unicast GID: EINVAL");
	check(ibv_detach_mcast(member, &group, 0) == EINVAL, "detach, not attached: EINVAL");
	check(ibv_attach_mcast(member, &group, 0) == 0, "attach");
	check(ibv_attach_mcast(member, &group, 0) == 0, "attach again: 0");
	check(ibv_destroy_qp(member) == EBUSY, "destroy while attached: EBUSY");

	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1};
	aa.grh.dgid = group;
	aa.grh.sgid_index = 1;
	aa.grh.hop_limit = 1;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	check(ah != NULL, "an AH to the group");
	struct ibv_wc wc[2];
	check(!post_recv(member, mr) && ah && !send_to_group(sender, mr, ah), "post");
	check(poll_n(cq, wc, 1) == 1 && wc[0].status == IBV_WC_SUCCESS, "the SEND completes");
	int got = poll_n(rcq, wc, 1);
	unsigned char dst[4];
	inet_pton(AF_INET, "230.7.7.7", dst);
	check(got == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].byte_len == 40 + 12 &&
	      (wc[0].wc_flags & IBV_WC_GRH) && wc[0].src_qp == sender->qp_num,
	      "the member receives it, with the GRH");
	check(!memcmp(buf + 4096 + 36, dst, 4) && !memcmp(buf + 4096 + 40, "to the group", 12),
	      "the GRH's destination is the group; the payload follows");

	check(ibv_detach_mcast(member, &group, 0) == 0, "detach");
	check(!post_recv(member, mr) && !send_to_group(sender, mr, ah) && poll_n(cq, wc, 1) == 1,
	      "send again");
	check(poll_n(rcq, wc, 1) == 0, "a detached QP receives nothing");
	check(ibv_destroy_qp(member) == 0, "destroy once detached");
	ibv_destroy_ah(ah);
	ibv_destroy_qp(sender);
	ibv_destroy_qp(rc);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(rcq);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return failures ? 1 : 0;
}
