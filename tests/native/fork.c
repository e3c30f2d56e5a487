/* A program that forks while it holds verbs objects (tests/native/test_c_unit.py).
 *
 * The child touches its parent's QP, SRQ-less receive queue and CQ: each
 * verb fails with EPERM and the parent's rings are untouched.  The child can
 * then open the device for itself and use it.  The parent goes on as if
 * nothing happened.  Prints one line per check; exits 0 if all hold.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "check.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

struct objs {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[64];
};

static int open_all(struct objs *o)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		return -1;
	o->ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!o->ctx)
		return -1;
	o->pd = ibv_alloc_pd(o->ctx);
	o->cq = o->pd ? ibv_create_cq(o->ctx, 8, NULL, NULL, 0) : NULL;
	o->mr = o->cq ? ibv_reg_mr(o->pd, o->buf, sizeof(o->buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_qp_init_attr ia = {.send_cq = o->cq, .recv_cq = o->cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	o->qp = o->mr ? ibv_create_qp(o->pd, &ia) : NULL;
	if (!o->qp)
		return -1;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	return ibv_modify_qp(o->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			     IBV_QP_ACCESS_FLAGS);
}

static void close_all(struct objs *o)
{
	ibv_destroy_qp(o->qp);
	ibv_dereg_mr(o->mr);
	ibv_destroy_cq(o->cq);
	ibv_dealloc_pd(o->pd);
	ibv_close_device(o->ctx);
}

static int post_one_recv(struct objs *o, uint64_t id)
{
	struct ibv_sge sge = {(uintptr_t)o->buf, sizeof(o->buf), o->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
	return ibv_post_recv(o->qp, &wr, &bad);
}

int main(void)
{
	struct objs o;
	memset(&o, 0, sizeof(o));
	if (open_all(&o)) {
		perror("setup");
		return 2;
	}
	check(post_one_recv(&o, 1) == 0, "parent posts a receive");
	pid_t pid = fork();
	if (pid == 0) {
		failures = 0;
		check(post_one_recv(&o, 666) == EPERM, "child: post_recv on the parent's QP is EPERM");
		struct ibv_wc wc;
		errno = 0;
		check(ibv_poll_cq(o.cq, 1, &wc) < 0 && errno == EPERM,
		      "child: poll_cq on the parent's CQ fails with EPERM");
		check(ibv_req_notify_cq(o.cq, 0) == EPERM, "child: req_notify_cq is EPERM");
		errno = 0;
		check(ibv_create_cq(o.ctx, 4, NULL, NULL, 0) == NULL && errno != 0,
		      "child: the parent's context creates nothing");
		struct objs mine;
		memset(&mine, 0, sizeof(mine));
		check(open_all(&mine) == 0 && post_one_recv(&mine, 7) == 0,
		      "child: its own device works");
		close_all(&mine);
		_exit(failures ? 1 : 0);
	}
	int status = 0;
	waitpid(pid, &status, 0);
	check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exited cleanly");
	check(post_one_recv(&o, 2) == 0, "parent posts again");
	/* the parent's receive queue holds exactly its own two WRs: moving the QP to
	 * ERR flushes them, and no wr_id 666 appears */
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	check(ibv_modify_qp(o.qp, &a, IBV_QP_STATE) == 0, "parent moves its QP to ERR");
	uint64_t seen[4] = {0};
	int got = 0;
	for (double t0 = now(); now() - t0 < (got < 2 ? 10 : 0.3) && got < 3;) {
		struct ibv_wc wc;
		if (ibv_poll_cq(o.cq, 1, &wc) == 1)
			seen[got++] = wc.wr_id;
	}
	check(got == 2 && seen[0] == 1 && seen[1] == 2, "parent's flush: wr_id 1 and 2 only");
	close_all(&o);
	return failures ? 1 : 0;
}
