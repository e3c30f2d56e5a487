/* librdmacm's connection parameters from C: the agent decides them
 * (tests/native/test_c_tools.py; docs/cm.md, QP attributes and connection
 * parameters).
 *
 * 1. Explicit values: rdma_connect(resources 6, depth 5), rdma_accept(3, 2).
 *    The CONNECT_REQUEST reports them crosswise (5, 6); the passive QP gets
 *    max_dest_rd_atomic 3 and max_rd_atomic 2 (passed with CM_INIT_QP_ATTR
 *    before the REP), the active QP 2 and 3 from the REP, which its
 *    ESTABLISHED event reports as (2, 3).
 * 2. RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH on both sides: the device's
 *    limits (max_qp_rd_atom, max_qp_init_rd_atom) on both QPs.
 * 3. A value above the device's limit is EINVAL, on connect and on accept,
 *    and a refused accept leaves the QP in INIT.
 * 4. fio's rdma engine (engines/rdma.c): an rdma_conn_param zeroed but for
 *    retry_count 10 on connect, responder resources and initiator depth 1
 *    on both sides.  rnr_retry_count 0 reaches the active QP as rnr_retry 0,
 *    as under the kernel's CM (the REP's value), so a SEND that finds no
 *    receive posted is not retried: IBV_WC_RNR_RETRY_EXC_ERR at once, and the
 *    QP in ERR.  This is where fio's --verb=send hangs when its receiver falls
 *    behind (docs/status.md, tests/thirdparty/test_fio.py).
 *
 * Prints one line per check; exits 0 if all hold.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <rdma/rdma_cma.h>

#include "check.h"

struct pair {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen, *active, *passive;
};

static struct rdma_cm_event *wait_for(struct rdma_event_channel *ch, enum rdma_cm_event_type t)
{
	struct rdma_cm_event *ev = NULL;
	if (rdma_get_cm_event(ch, &ev))
		return NULL;
	if (ev->event != t) {
		printf("# got %s, wanted %s\n", rdma_event_str(ev->event), rdma_event_str(t));
		rdma_ack_cm_event(ev);
		return NULL;
	}
	return ev;
}

static int qp_for(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr init = {.cap = {.max_send_wr = 4, .max_recv_wr = 4,
						 .max_send_sge = 1, .max_recv_sge = 1},
					.qp_type = IBV_QPT_RC};
	return rdma_create_qp(id, NULL, &init);
}

/* A listener and an active ID with a QP, connecting with ``req``: the
 * request's ID as p->passive, with a QP, and its parameters in *seen;
 * *err is rdma_connect's errno if it failed. */
static int request(struct pair *p, uint16_t port, struct rdma_conn_param *req, int *err,
		   struct rdma_conn_param *seen)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	memset(p, 0, sizeof(*p));
	*err = 0;
	p->ch = rdma_create_event_channel();
	if (!p->ch || rdma_create_id(p->ch, &p->listen, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(p->listen, (struct sockaddr *)&a) || rdma_listen(p->listen, 1) ||
	    rdma_create_id(p->ch, &p->active, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(p->active, NULL, (struct sockaddr *)&a, 2000))
		return -1;
	struct rdma_cm_event *ev = wait_for(p->ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (!ev)
		return -1;
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(p->active, 2000) ||
	    !(ev = wait_for(p->ch, RDMA_CM_EVENT_ROUTE_RESOLVED)))
		return -1;
	rdma_ack_cm_event(ev);
	if (qp_for(p->active))
		return -1;
	if (rdma_connect(p->active, req)) {
		*err = errno;
		return -1;
	}
	if (!(ev = wait_for(p->ch, RDMA_CM_EVENT_CONNECT_REQUEST)))
		return -1;
	p->passive = ev->id;
	*seen = ev->param.conn;
	rdma_ack_cm_event(ev);
	return qp_for(p->passive);
}

static int rnr_retry(struct rdma_cm_id *id)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(id->qp, &attr, IBV_QP_RNR_RETRY, &ia))
		return -1;
	return attr.rnr_retry;
}

static int rd(struct rdma_cm_id *id, int *dest, int *init, enum ibv_qp_state *state)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(id->qp, &attr, IBV_QP_STATE | IBV_QP_MAX_DEST_RD_ATOMIC |
			 IBV_QP_MAX_QP_RD_ATOMIC, &ia))
		return -1;
	*dest = attr.max_dest_rd_atomic;
	*init = attr.max_rd_atomic;
	*state = attr.qp_state;
	return 0;
}

static void done(struct pair *p)
{
	struct rdma_cm_id *ids[] = {p->passive, p->active, p->listen};
	for (int i = 0; i < 3; i++) {
		if (!ids[i])
			continue;
		if (ids[i]->qp)
			rdma_destroy_qp(ids[i]);
		rdma_destroy_id(ids[i]);
	}
	if (p->ch)
		rdma_destroy_event_channel(p->ch);
}

/* Connect with ``req``, accept with ``rep``; the QPs' values and the
 * ESTABLISHED event's parameters. */
static int connect_pair(uint16_t port, struct rdma_conn_param *req, struct rdma_conn_param *rep,
			struct rdma_conn_param *seen_req, struct rdma_conn_param *seen_rep,
			int v[4])
{
	struct pair p;
	int err, rc = -1;
	enum ibv_qp_state s;
	if (request(&p, port, req, &err, seen_req) || rdma_accept(p.passive, rep))
		goto out;
	for (int n = 0; n < 2; n++) {	/* the active side's and the passive side's */
		struct rdma_cm_event *ev = wait_for(p.ch, RDMA_CM_EVENT_ESTABLISHED);
		if (!ev)
			goto out;
		if (ev->id == p.active)
			*seen_rep = ev->param.conn;
		rdma_ack_cm_event(ev);
	}
	rc = rd(p.passive, &v[0], &v[1], &s) || rd(p.active, &v[2], &v[3], &s);
out:
	done(&p);
	return rc;
}

int main(void)
{
	struct ibv_context *ctx = open_first_device();
	struct ibv_device_attr dev;
	if (!ctx || ibv_query_device(ctx, &dev))
		return printf("FAIL setup\n"), 2;
	ibv_close_device(ctx);
	const int mr = dev.max_qp_rd_atom, mi = dev.max_qp_init_rd_atom;
	struct rdma_conn_param seen_req, seen_rep;
	int v[4] = {0};

	/* 1 */
	struct rdma_conn_param req = {.responder_resources = 6, .initiator_depth = 5,
				      .retry_count = 7, .rnr_retry_count = 7};
	struct rdma_conn_param rep = {.responder_resources = 3, .initiator_depth = 2,
				      .rnr_retry_count = 7};
	int rc = connect_pair(7730, &req, &rep, &seen_req, &seen_rep, v);
	check(!rc && seen_req.responder_resources == 5 && seen_req.initiator_depth == 6,
	      "the CONNECT_REQUEST reports the REQ's values crosswise");
	check(!rc && v[0] == 3 && v[1] == 2, "the passive QP has rdma_accept's values");
	check(!rc && v[2] == 2 && v[3] == 3 && seen_rep.responder_resources == 2 &&
	      seen_rep.initiator_depth == 3, "the active QP has the REP's, crosswise");

	/* 2 */
	struct rdma_conn_param dflt = {.responder_resources = RDMA_MAX_RESP_RES,
				       .initiator_depth = RDMA_MAX_INIT_DEPTH,
				       .retry_count = 7, .rnr_retry_count = 7};
	rc = connect_pair(7731, &dflt, &dflt, &seen_req, &seen_rep, v);
	check(!rc && v[0] == mr && v[1] == mi && v[2] == mr && v[3] == mi,
	      "RDMA_MAX_RESP_RES/RDMA_MAX_INIT_DEPTH: the device's limits on both QPs");

	/* 3 */
	struct pair p;
	int err;
	struct rdma_conn_param big = req;
	big.responder_resources = (uint8_t)(mr + 1);
	rc = request(&p, 7732, &big, &err, &seen_req);
	check(rc && err == EINVAL, "rdma_connect above max_qp_rd_atom: EINVAL");
	done(&p);
	big = req;
	big.initiator_depth = (uint8_t)(mi + 1);
	rc = request(&p, 7733, &big, &err, &seen_req);
	check(rc && err == EINVAL, "rdma_connect above max_qp_init_rd_atom: EINVAL");
	done(&p);
	rc = request(&p, 7734, &req, &err, &seen_req);
	big = rep;
	big.responder_resources = (uint8_t)(mr + 1);
	errno = 0;
	int refused = !rc && rdma_accept(p.passive, &big) == -1 && errno == EINVAL;
	enum ibv_qp_state s = IBV_QPS_ERR;
	int d, i;
	check(refused && !rd(p.passive, &d, &i, &s) && s == IBV_QPS_INIT,
	      "rdma_accept above max_qp_rd_atom: EINVAL, the QP still in INIT");
	done(&p);

	/* 4 */
	struct rdma_conn_param fio_req = {.responder_resources = 1, .initiator_depth = 1,
					  .retry_count = 10};
	struct rdma_conn_param fio_rep = {.responder_resources = 1, .initiator_depth = 1};
	char buf[64] = "a SEND no receive waits for";
	struct ibv_wc wc = {.status = IBV_WC_SUCCESS};
	struct ibv_mr *m = NULL;
	rc = request(&p, 7735, &fio_req, &err, &seen_req) || rdma_accept(p.passive, &fio_rep);
	for (int n = 0; !rc && n < 2; n++) {
		struct rdma_cm_event *ev = wait_for(p.ch, RDMA_CM_EVENT_ESTABLISHED);
		rc = !ev;
		if (ev)
			rdma_ack_cm_event(ev);
	}
	check(!rc && rnr_retry(p.active) == 0 && rnr_retry(p.passive) == 0,
	      "a zeroed rnr_retry_count (fio's): rnr_retry 0 on both QPs");
	if (!rc)
		m = ibv_reg_mr(p.active->pd, buf, sizeof(buf), 0);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = sizeof(buf),
			      .lkey = m ? m->lkey : 0};
	struct ibv_send_wr wr = {.wr_id = 4, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
	s = IBV_QPS_RTS;
	int got = m && !ibv_post_send(p.active->qp, &wr, &bad) ? poll_n(p.active->send_cq, &wc, 1)
							      : 0;
	check(got == 1 && wc.wr_id == 4 && wc.status == IBV_WC_RNR_RETRY_EXC_ERR &&
	      !rd(p.active, &d, &i, &s) && s == IBV_QPS_ERR,
	      "rnr_retry 0, no receive posted: IBV_WC_RNR_RETRY_EXC_ERR, the QP in ERR");
	if (m)
		ibv_dereg_mr(m);
	done(&p);
	return failures ? 1 : 0;
}
