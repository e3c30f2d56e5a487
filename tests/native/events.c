/* Async events and the destroy of their object, as under rdma-core and the
 * kernel (tests/native/test_c_tools.py).
 *
 * 1. An event still unread when its QP is destroyed is never handed out:
 *    ibv_get_async_event on the non-blocking async fd then fails with EAGAIN
 *    (it used to return the event with element.qp NULL, which UCX's async
 *    thread dereferenced).
 * 2. ibv_destroy_qp waits until an event it was handed is acknowledged
 *    (ibv_ack_async_event), and then succeeds.
 * 3. A failed destroy leaves errno set to the error it returns.
 *
 * The events come from QPs on an SRQ moved from INIT to ERR
 * (IBV_EVENT_QP_LAST_WQE_REACHED).  Prints one line per check; exits 0 if
 * all hold.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "check.h"

static struct ibv_qp *qp_to_error(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .srq = srq,
				      .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_send_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		return NULL;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		return NULL;
	a.qp_state = IBV_QPS_ERR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return NULL;
	return qp;
}

static int readable(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, ms) == 1;
}

struct destroyer {
	struct ibv_qp *qp;
	int ret;
	volatile int done;
};

static void *destroy_thread(void *arg)
{
	struct destroyer *d = arg;
	d->ret = ibv_destroy_qp(d->qp);
	d->done = 1;
	return NULL;
}

int main(void)
{
	struct ibv_context *ctx = open_first_device();
	if (!ctx)
		return 2;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
	struct ibv_srq *srq = cq ? ibv_create_srq(pd, &sa) : NULL;
	if (!srq)
		return printf("FAIL setup\n"), 2;
	fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
	struct ibv_async_event ev;

	/* 1 */
	struct ibv_qp *qp = qp_to_error(pd, cq, srq);
	check(qp && readable(ctx->async_fd, 5000), "an event waits on the async fd");
	check(qp && ibv_destroy_qp(qp) == 0, "its QP is destroyed before it is read");
	errno = 0;
	check(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN,
	      "the destroyed QP's event is not handed out: EAGAIN");

	/* 2 */
	qp = qp_to_error(pd, cq, srq);
	check(qp && readable(ctx->async_fd, 5000), "a second QP's event waits");
	int got = qp && ibv_get_async_event(ctx, &ev) == 0;
	check(got && ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == qp,
	      "it is read, naming its QP");
	struct destroyer d = {.qp = qp};
	pthread_t t;
	pthread_create(&t, NULL, destroy_thread, &d);
	struct timespec ts = {0, 300 * 1000 * 1000};
	nanosleep(&ts, NULL);
	check(!d.done, "ibv_destroy_qp waits for the event's acknowledgement");
	if (got)
		ibv_ack_async_event(&ev);
	pthread_join(t, NULL);
	check(d.done && d.ret == 0, "and returns 0 once it is acknowledged");

	/* 3 */
	qp = qp_to_error(pd, cq, srq);
	errno = 0;
	int ret = ibv_dealloc_pd(pd);	/* the QP, the SRQ still use it */
	check(ret == EBUSY && errno == EBUSY, "a refused ibv_dealloc_pd sets errno to EBUSY");
	if (qp) {
		readable(ctx->async_fd, 5000);
		if (ibv_get_async_event(ctx, &ev) == 0)
			ibv_ack_async_event(&ev);
		ibv_destroy_qp(qp);
	}
	ibv_destroy_srq(srq);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return failures ? 1 : 0;
}
