/* A signal ends every blocking wait with EINTR, as in rdma-core
 * (tests/native/test_c_tools.py).
 *
 * rdma-core's ibv_get_cq_event, ibv_get_async_event and rdma_get_cm_event
 * are plain read()s of a file descriptor: a signal whose handler was
 * installed without SA_RESTART makes them return -1 with errno EINTR.
 * Programs rely on it -- qperf breaks its blocked ibv_get_cq_event with
 * SIGALRM when a test's time is up; a library that retried would hang it.
 *
 * For each call: nothing is pending, an alarm fires 200 ms into the wait,
 * the call returns -1/EINTR (and the handler ran).  Then a real event is
 * still delivered by the same call afterwards, so the interrupted wait lost
 * nothing.  Prints one line per check; exits 0 if all hold.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "check.h"

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

/* One SIGALRM in 200 ms; the count of alarms before it. */
static int arm(void)
{
	struct itimerval t = {.it_value = {.tv_sec = 0, .tv_usec = 200 * 1000}};
	setitimer(ITIMER_REAL, &t, NULL);
	return alarms;
}

int main(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;	/* no SA_RESTART: a blocked read() ends */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);

	struct ibv_context *ctx = open_first_device();
	if (!ctx)
		return 2;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *ch = pd ? ibv_create_comp_channel(ctx) : NULL;
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
	if (!cq || ibv_req_notify_cq(cq, 0))
		return printf("FAIL setup\n"), 2;

	/* ibv_get_cq_event */
	struct ibv_cq *got;
	void *cq_ctx;
	int before = arm();
	errno = 0;
	int rc = ibv_get_cq_event(ch, &got, &cq_ctx);
	check(rc == -1 && errno == EINTR && alarms == before + 1,
	      "ibv_get_cq_event: SIGALRM ends the wait with -1/EINTR");

	/* ... and a completion afterwards is still reported: a QP in ERR
	 * flushes a posted receive into the armed CQ */
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 1, .max_recv_wr = 1,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	int ok = qp && !ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				      IBV_QP_ACCESS_FLAGS);
	static char buf[64];
	struct ibv_mr *mr = ok ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = sizeof(buf),
			      .lkey = mr ? mr->lkey : 0};
	struct ibv_recv_wr rwr = {.wr_id = 7, .sg_list = &sge, .num_sge = 1}, *bad;
	ok = mr && !ibv_post_recv(qp, &rwr, &bad);
	a.qp_state = IBV_QPS_ERR;
	ok = ok && !ibv_modify_qp(qp, &a, IBV_QP_STATE);
	ok = ok && ibv_get_cq_event(ch, &got, &cq_ctx) == 0 && got == cq;
	check(ok, "then the flushed receive's event is read by the same call");
	if (ok)
		ibv_ack_cq_events(cq, 1);

	/* ibv_get_async_event: the QP in ERR with nothing else raises nothing */
	struct ibv_async_event ev;
	before = arm();
	errno = 0;
	rc = ibv_get_async_event(ctx, &ev);
	check(rc == -1 && errno == EINTR && alarms == before + 1,
	      "ibv_get_async_event: SIGALRM ends the wait with -1/EINTR");

	/* rdma_get_cm_event on a channel with nothing to say */
	struct rdma_event_channel *ech = rdma_create_event_channel();
	struct rdma_cm_event *cev;
	before = arm();
	errno = 0;
	rc = ech ? rdma_get_cm_event(ech, &cev) : 0;
	check(rc == -1 && errno == EINTR && alarms == before + 1,
	      "rdma_get_cm_event: SIGALRM ends the wait with -1/EINTR");

	/* ... and the channel still works: an ID's address resolution reports */
	struct rdma_cm_id *id = NULL;
	struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(7471),
				  .sin_addr.s_addr = htonl(0x7f000001)};
	ok = ech && !rdma_create_id(ech, &id, NULL, RDMA_PS_TCP) &&
	     !rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) &&
	     !rdma_get_cm_event(ech, &cev);
	check(ok && (cev->event == RDMA_CM_EVENT_ADDR_RESOLVED ||
		     cev->event == RDMA_CM_EVENT_ADDR_ERROR),
	      "then the same channel delivers the next event");
	if (ok)
		rdma_ack_cm_event(cev);
	if (id)
		rdma_destroy_id(id);
	if (ech)
		rdma_destroy_event_channel(ech);

	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(ch);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return failures ? 1 : 0;
}
