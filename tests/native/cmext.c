/* librdmacm's options, SRQs and endpoints from C (tests/native/test_c_tools.py).
 *
 * 1. rdma_set_option: TOS and ACK_TIMEOUT take a uint8_t, REUSEADDR and
 *    AFONLY an int (another length: EINVAL); an unknown name is ENOSYS.
 * 2. AFONLY: "::" with AFONLY and "0.0.0.0" hold one port together (tgt's
 *    iSER portals); without it the second bind is EADDRNOTAVAIL.
 *    REUSEADDR: two IDs that both set it bind one address and port.
 * 3. rdma_create_srq on an endpoint: id->srq, taking receives; a QP made
 *    next on the ID uses it (rdma_create_qp writes it back into the
 *    attributes), with librdmacm's own CQs (id->send_cq, id->recv_cq);
 *    rdma_destroy_qp frees those, rdma_destroy_srq clears id->srq.
 * 4. rdma_create_ep's ID has its device's PD as id->pd before any QP.
 *
 * Prints one line per check; exits 0 if all hold.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "check.h"

static struct rdma_cm_id *new_id(struct rdma_event_channel *ch)
{
	struct rdma_cm_id *id = NULL;
	return rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ? NULL : id;
}

static int bind_to(struct rdma_cm_id *id, const char *ip, uint16_t port)
{
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	if (strchr(ip, ':')) {
		struct sockaddr_in6 *a = (void *)&ss;
		a->sin6_family = AF_INET6;
		a->sin6_port = htons(port);
		inet_pton(AF_INET6, ip, &a->sin6_addr);
	} else {
		struct sockaddr_in *a = (void *)&ss;
		a->sin_family = AF_INET;
		a->sin_port = htons(port);
		inet_pton(AF_INET, ip, &a->sin_addr);
	}
	return rdma_bind_addr(id, (struct sockaddr *)&ss);
}

static int set(struct rdma_cm_id *id, int name, void *val, size_t len)
{
	errno = 0;
	return rdma_set_option(id, RDMA_OPTION_ID, name, val, len) ? errno : 0;
}

int main(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		return printf("FAIL setup\n"), 2;
	int one = 1;
	uint8_t tos = 32, timeout = 18;

	/* 1 */
	struct rdma_cm_id *a = new_id(ch);
	check(a && !set(a, RDMA_OPTION_ID_TOS, &tos, 1) &&
	      !set(a, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, 1) &&
	      !set(a, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one)) &&
	      !set(a, RDMA_OPTION_ID_AFONLY, &one, sizeof(one)),
	      "TOS, ACK_TIMEOUT (uint8_t), REUSEADDR and AFONLY (int) are taken");
	check(a && set(a, RDMA_OPTION_ID_TOS, &one, sizeof(one)) == EINVAL &&
	      set(a, RDMA_OPTION_ID_REUSEADDR, &tos, 1) == EINVAL,
	      "another length is EINVAL");
	check(a && set(a, 9, &one, sizeof(one)) == ENOSYS, "an unknown option is ENOSYS");
	if (a)
		rdma_destroy_id(a);

	/* 2 */
	const uint16_t port = 7710;
	struct rdma_cm_id *v6 = new_id(ch), *v4 = new_id(ch), *v6b = new_id(ch);
	check(v6 && !set(v6, RDMA_OPTION_ID_AFONLY, &one, sizeof(one)) && !bind_to(v6, "::", port) &&
	      v4 && !bind_to(v4, "0.0.0.0", port),
	      "AFONLY: :: and 0.0.0.0 hold one port together");
	check(v6b && bind_to(v6b, "::", port) == -1 && errno == EADDRNOTAVAIL,
	      "without AFONLY, :: on that port is EADDRNOTAVAIL");
	struct rdma_cm_id *r1 = new_id(ch), *r2 = new_id(ch), *r3 = new_id(ch);
	check(r1 && r2 && !set(r1, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one)) &&
	      !set(r2, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one)) &&
	      !bind_to(r1, "127.0.0.1", port + 1) && !bind_to(r2, "127.0.0.1", port + 1),
	      "REUSEADDR: two IDs bind one address and port");
	check(r3 && bind_to(r3, "127.0.0.1", port + 1) == -1 && errno == EADDRINUSE,
	      "a third without it: EADDRINUSE");
	struct rdma_cm_id *ids[] = {v6, v4, v6b, r1, r2, r3};
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
		if (ids[i])
			rdma_destroy_id(ids[i]);

	/* 3, 4: an active endpoint to a listener of this process */
	struct rdma_addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof(hints));
	hints.ai_port_space = RDMA_PS_TCP;
	struct rdma_cm_id *ep = NULL;
	int ok = !rdma_getaddrinfo("127.0.0.1", "7712", &hints, &res) &&
		 !rdma_create_ep(&ep, res, NULL, NULL);
	check(ok && ep->pd && ep->verbs && ep->pd->context == ep->verbs && !ep->qp,
	      "rdma_create_ep's ID has its device's PD before any QP");
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
	ok = ok && !rdma_create_srq(ep, NULL, &sa) && ep->srq;
	static char buf[64];
	struct ibv_mr *mr = ok ? ibv_reg_mr(ep->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr ? mr->lkey : 0};
	struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
	check(ok && mr && !ibv_post_srq_recv(ep->srq, &rwr, &bad),
	      "rdma_create_srq: id->srq, on the ID's PD, takes receives");
	/* a receive CQ is still needed with an SRQ (rxe refuses a QP without one),
	 * and librdmacm sizes it by max_recv_wr */
	struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 2, .max_recv_wr = 1,
					      .max_send_sge = 1}};
	ok = ok && !rdma_create_qp(ep, NULL, &qa);
	check(ok && qa.srq == ep->srq && ep->qp && qa.send_cq == ep->send_cq &&
	      qa.recv_cq == ep->recv_cq && ep->send_cq != ep->recv_cq && ep->recv_cq_channel,
	      "rdma_create_qp uses the ID's SRQ and makes a CQ (and channel) per queue");
	if (ok)
		rdma_destroy_qp(ep);
	check(ok && !ep->qp && !ep->send_cq && !ep->recv_cq && !ep->recv_cq_channel,
	      "rdma_destroy_qp frees librdmacm's CQs and channels");
	if (ep && ep->srq)
		rdma_destroy_srq(ep);
	check(ep && !ep->srq, "rdma_destroy_srq clears id->srq");
	if (mr)
		ibv_dereg_mr(mr);
	if (ep)
		rdma_destroy_ep(ep);
	if (res)
		rdma_freeaddrinfo(res);
	rdma_destroy_event_channel(ch);
	return failures ? 1 : 0;
}
