/* A program that forks while it holds verbs objects (tests/native/test_c_tools.py).
 *
 * A child shares its parent's context as a child shares an inherited uverbs
 * file: it queries it, and creates objects on it -- a PD, a CQ it polls, an MR
 * of pages only it has mapped, device memory -- that are its own to use.  The
 * parent's rings are not: posting to or polling the parent's QP and CQ is
 * EPERM, and the parent's rings are untouched.  Two children allocating device
 * memory on the context at once get ranges of their own (neither overwrites
 * the other's, nor the parent's).  The child can also open the device for
 * itself.  The parent goes on as if nothing happened.  Prints one line per
 * check; exits 0 if all hold.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

#define DM_LEN 256

/* Fill a DM with `byte`; 0 or an errno. */
static int fill_dm(struct ibv_dm *dm, unsigned char byte)
{
	unsigned char buf[DM_LEN];
	memset(buf, byte, sizeof(buf));
	return ibv_memcpy_to_dm(dm, 0, buf, sizeof(buf));
}

/* 1 if the DM holds `byte` throughout. */
static int dm_holds(struct ibv_dm *dm, unsigned char byte)
{
	unsigned char buf[DM_LEN];
	if (ibv_memcpy_from_dm(buf, dm, 0, sizeof(buf)))
		return 0;
	for (size_t i = 0; i < sizeof(buf); i++)
		if (buf[i] != byte)
			return 0;
	return 1;
}

/* A child holding device memory of the parent's context: it fills its DM
 * with `byte`, says so on `ready`, waits for `go`, and checks the DM is
 * still its own.  Exit status 0 if so. */
static int dm_child(struct ibv_context *ctx, unsigned char byte, int ready, int go)
{
	struct ibv_alloc_dm_attr attr = {.length = DM_LEN};
	struct ibv_dm *dm = ibv_alloc_dm(ctx, &attr);
	int ok = dm && fill_dm(dm, byte) == 0;
	char c = ok ? 'y' : 'n';
	if (write(ready, &c, 1) != 1 || read(go, &c, 1) != 1)
		return 2;
	ok = ok && dm_holds(dm, byte);
	if (dm)
		ibv_free_dm(dm);
	return ok ? 0 : 1;
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
	struct ibv_alloc_dm_attr dm_attr = {.length = DM_LEN};
	struct ibv_dm *parent_dm = ibv_alloc_dm(o.ctx, &dm_attr);
	check(parent_dm && fill_dm(parent_dm, 0xaa) == 0, "parent fills device memory");
	pid_t pid = fork();
	if (pid == 0) {
		failures = 0;
		check(post_one_recv(&o, 666) == EPERM, "child: post_recv on the parent's QP is EPERM");
		struct ibv_wc wc;
		errno = 0;
		check(ibv_poll_cq(o.cq, 1, &wc) < 0 && errno == EPERM,
		      "child: poll_cq on the parent's CQ fails with EPERM");
		check(ibv_req_notify_cq(o.cq, 0) == EPERM, "child: req_notify_cq is EPERM");
		struct ibv_device_attr da;
		check(ibv_query_device(o.ctx, &da) == 0, "child: queries the parent's context");
		struct ibv_pd *pd = ibv_alloc_pd(o.ctx);
		struct ibv_cq *cq = ibv_create_cq(o.ctx, 4, NULL, NULL, 0);
		check(pd && cq, "child: allocates a PD and creates a CQ on the parent's context");
		check(cq && ibv_poll_cq(cq, 1, &wc) == 0 && ibv_req_notify_cq(cq, 0) == 0,
		      "child: polls and arms its own CQ");
		/* pages the parent never had: the region is the child's own memory */
		size_t len = 1 << 20;
		void *own = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
				 -1, 0);
		struct ibv_mr *mr = pd && own != MAP_FAILED
				    ? ibv_reg_mr(pd, own, len, IBV_ACCESS_LOCAL_WRITE) : NULL;
		check(mr != NULL, "child: registers its own pages on its PD");
		check(parent_dm && dm_holds(parent_dm, 0xaa), "child: reads the parent's DM");
		if (mr)
			ibv_dereg_mr(mr);
		if (cq)
			ibv_destroy_cq(cq);
		if (pd)
			ibv_dealloc_pd(pd);
		/* the child's copy only: the parent's context, QP and CQ live on */
		check(ibv_close_device(o.ctx) == 0, "child: closes its copy of the parent's context");
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
	/* two children hold device memory of the context at the same time */
	int ready[2], go[2];
	pid_t kids[2];
	check(pipe(ready) == 0 && pipe(go) == 0, "pipes");
	for (int i = 0; i < 2; i++) {
		char c = 0;
		kids[i] = fork();
		if (kids[i] == 0)
			_exit(dm_child(o.ctx, (unsigned char)(0x11 * (i + 1)), ready[1], go[0]));
		check(kids[i] > 0 && read(ready[0], &c, 1) == 1 && c == 'y',
		      "a child fills device memory of its own");
	}
	check(write(go[1], "gg", 2) == 2, "children told to check");
	for (int i = 0; i < 2; i++) {
		waitpid(kids[i], &status, 0);
		check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "a child's device memory held what it wrote");
	}
	check(parent_dm && dm_holds(parent_dm, 0xaa), "parent's device memory is untouched");
	if (parent_dm)
		ibv_free_dm(parent_dm);
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
