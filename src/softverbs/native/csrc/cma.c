/* librdmacm.so.1 for softverbs: the RDMA CM API on the service's CM agent.
 *
 * The CM itself -- the MADs (REQ, REP, RTU, DREQ ...), their timers, port
 * spaces and route lookup -- runs in the service (softverbs/cm/agent.py),
 * as it runs in the kernel for rdma-core.  This file is librdmacm's user
 * half: it sends the agent's commands (one CM_* request record each, from the
 * generated softverbs/protocol.h, on this process's one connection to the
 * service, through libibverbs' SOFTVERBS_PRIVATE_1 calls), reads events (one
 * struct sv_cm_event each) from each event channel's own socket, and does
 * what librdmacm does with them in user space:
 *
 *  - a CONNECT_REQUEST creates the new connection's rdma_cm_id;
 *  - the QP of an ID is moved through its states with the attributes the
 *    agent computes (rdma_init_qp_attr): INIT when created (RTS for UD),
 *    RTR and RTS on accept or when the REP arrives, ERR on reject and
 *    disconnect; this file computes no attribute and no default -- the agent
 *    also decides responder_resources/initiator_depth (RDMA_MAX_RESP_RES:
 *    the device's choice), rdma_accept passing its values with
 *    CM_INIT_QP_ATTR (docs/cm.md);
 *  - a CONNECT_RESPONSE on an ID with a QP sends the RTU and is reported as
 *    ESTABLISHED;
 *  - IDs without a channel (rdma_create_ep) are synchronous: each call waits
 *    for its event on a private channel.
 *
 *  - a MULTICAST_JOIN attaches the ID's QP to the group (ucma_process_join),
 *    unless the join was send-only; rdma_leave_multicast detaches it.  The
 *    join itself is the agent's: a local join, as the kernel's rdma_cm does
 *    on RoCE (docs/cm.md, Multicast).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include "softverbs/protocol.h"

/* libibverbs' (SOFTVERBS_PRIVATE_1) */
int sv_cm_call(uint16_t op, const void *req, size_t req_len, void *reply, size_t reply_len);
int sv_cm_events(uint32_t channel, int fd);
const char *sv_cm_error(void);

#define MAX_DEVICES 16

struct cma_channel {
	struct rdma_event_channel ch;	/* first: the program's */
	uint32_t number;
};

struct cma_device {
	char name[64];
	struct ibv_context *verbs;
	struct ibv_pd *pd;		/* the default PD: every ID's id->pd until it has a QP */
	struct ibv_xrcd *xrcd;		/* the default XRC domain (XRC_RECV IDs) */
};

/* librdmacm's cma_multicast: one group an ID joined. */
struct cma_mc {
	struct sockaddr_storage addr;
	void *context;
	int flags;			/* enum rdma_cm_mc_join_flags */
	int attached;			/* the ID's QP is attached to mgid */
	union ibv_gid mgid;		/* from the MULTICAST_JOIN event */
	uint16_t mlid;
	struct cma_mc *next;
};

struct cma_id {
	struct rdma_cm_id id;		/* first: the program's */
	struct cma_mc *mc;		/* the groups joined (under ``lock``) */
	uint32_t handle;
	int sync;			/* rdma_create_ep's: calls wait for their event */
	int connect_error;		/* the REP could not be completed: hide what follows */
	struct cma_device *dev;
	struct ibv_qp_init_attr *qp_init;	/* rdma_create_ep's passive IDs: for get_request */
	struct ibv_sa_path_rec path;
	struct ibv_ece local_ece;	/* rdma_set_local_ece's; the CM does not carry it */
	struct cma_id *next;
};

struct cma_event {
	struct rdma_cm_event event;	/* first: the program's */
	uint8_t private_data[256];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct cma_device devices[MAX_DEVICES];
static int ndevices;
static struct cma_id *ids;
static uint32_t next_channel = 1;	/* 0 is the Python client's */

static int fail(int err)
{
	errno = err;
	return -1;
}

/* --- commands ------------------------------------------------------------------------ */

/* Send the CM_* request ``req`` of operation ``op``; its reply record into
 * ``reply`` (``reply_len`` bytes, 0 for none).  0, or -1 with errno. */
static int call(uint16_t op, const char *name, const void *req, size_t req_len, void *reply,
		size_t reply_len)
{
	int err = sv_cm_call(op, req, req_len, reply, reply_len);
	if (err) {
		if (getenv("SOFTVERBS_DEBUG"))
			fprintf(stderr, "librdmacm: %s: %s\n", name, sv_cm_error());
		return fail(err);
	}
	return 0;
}

#define CALL(op, req, reply) call(SV_OP_##op, #op, &(req), sizeof(req), reply, \
				  sizeof(*(reply)))
#define CALL0(op, req) call(SV_OP_##op, #op, &(req), sizeof(req), NULL, 0)

/* A sockaddr as the agent takes it (family 0: none). */
static void cm_addr_of(const struct sockaddr *sa, struct sv_cm_addr *out)
{
	memset(out, 0, sizeof(*out));
	if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;
		memcpy(out->ip, &in->sin_addr, 4);
		out->family = AF_INET;
		out->port = ntohs(in->sin_port);
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;
		memcpy(out->ip, &in6->sin6_addr, 16);
		out->family = AF_INET6;
		out->port = ntohs(in6->sin6_port);
	}
}

static int valid_addr(const struct sockaddr *sa)
{
	return sa && (sa->sa_family == AF_INET || sa->sa_family == AF_INET6);
}

/* The agent's address into a sockaddr; 0 if it holds none. */
static int addr_of(const struct sv_cm_addr *a, struct sockaddr_storage *out)
{
	memset(out, 0, sizeof(*out));
	if (a->family == AF_INET) {
		struct sockaddr_in *in = (void *)out;
		in->sin_family = AF_INET;
		memcpy(&in->sin_addr, a->ip, 4);
		in->sin_port = htons(a->port);
		return 1;
	}
	if (a->family == AF_INET6) {
		struct sockaddr_in6 *in6 = (void *)out;
		in6->sin6_family = AF_INET6;
		memcpy(&in6->sin6_addr, a->ip, 16);
		in6->sin6_port = htons(a->port);
		return 1;
	}
	return 0;
}

/* --- devices and IDs -------------------------------------------------------------------- */

static struct cma_device *device_named(const char *name)
{
	pthread_mutex_lock(&lock);
	struct cma_device *d = NULL;
	for (int i = 0; i < ndevices && !d; i++)
		if (!strcmp(devices[i].name, name))
			d = &devices[i];
	if (!d && ndevices < MAX_DEVICES) {
		int n = 0;
		struct ibv_device **list = ibv_get_device_list(&n);
		for (int i = 0; list && i < n && !d; i++) {
			if (strcmp(ibv_get_device_name(list[i]), name))
				continue;
			struct ibv_context *verbs = ibv_open_device(list[i]);
			if (!verbs)
				break;
			d = &devices[ndevices++];
			snprintf(d->name, sizeof(d->name), "%s", name);
			d->verbs = verbs;
		}
		if (list)
			ibv_free_device_list(list);
	}
	pthread_mutex_unlock(&lock);
	return d;
}

static struct ibv_pd *default_pd(struct cma_device *d)
{
	pthread_mutex_lock(&lock);
	if (!d->pd)
		d->pd = ibv_alloc_pd(d->verbs);
	struct ibv_pd *pd = d->pd;
	pthread_mutex_unlock(&lock);
	return pd;
}

/* ucma_get_xrcd: the device's XRC domain, opened on first use. */
static struct ibv_xrcd *default_xrcd(struct cma_device *d)
{
	pthread_mutex_lock(&lock);
	if (!d->xrcd) {
		struct ibv_xrcd_init_attr a = {.comp_mask = IBV_XRCD_INIT_ATTR_FD |
							    IBV_XRCD_INIT_ATTR_OFLAGS,
					       .fd = -1, .oflags = O_CREAT};
		d->xrcd = ibv_open_xrcd(d->verbs, &a);
	}
	struct ibv_xrcd *x = d->xrcd;
	pthread_mutex_unlock(&lock);
	return x;
}

static struct cma_id *id_of(uint32_t handle)
{
	pthread_mutex_lock(&lock);
	struct cma_id *c = ids;
	while (c && c->handle != handle)
		c = c->next;
	pthread_mutex_unlock(&lock);
	return c;
}

static struct cma_id *cma(struct rdma_cm_id *id)
{
	return (struct cma_id *)id;
}

/* What the agent says of an ID (its info): device, addresses and GIDs. */
static void attach(struct cma_id *c, const struct sv_cm_id_info *info)
{
	char name[sizeof(info->dev) + 1];
	memcpy(name, info->dev, sizeof(info->dev));
	name[sizeof(info->dev)] = '\0';
	if (name[0] && !c->dev) {
		c->dev = device_named(name);
		if (c->dev) {
			c->id.verbs = c->dev->verbs;
			c->id.port_num = 1;
			if (!c->id.pd)	/* as ucma_get_device: the device's own PD */
				c->id.pd = default_pd(c->dev);
		}
	}
	struct sockaddr_storage a;
	if (addr_of(&info->src, &a))
		c->id.route.addr.src_storage = a;
	if (addr_of(&info->dst, &a))
		c->id.route.addr.dst_storage = a;
	struct rdma_ib_addr *ib = &c->id.route.addr.addr.ibaddr;
	if (info->has_path) {
		memcpy(ib->sgid.raw, info->sgid, 16);
		memcpy(ib->dgid.raw, info->dgid, 16);
		ib->pkey = htobe16(0xffff);
		c->path.sgid = ib->sgid;
		c->path.dgid = ib->dgid;
		c->path.pkey = ib->pkey;
		c->path.mtu = IBV_MTU_1024;
		c->path.hop_limit = 64;
		c->id.route.path_rec = &c->path;
		c->id.route.num_paths = 1;
	}
}

static struct rdma_event_channel *new_channel(void)
{
	struct cma_channel *ch = calloc(1, sizeof(*ch));
	if (!ch)
		return NULL;
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
		free(ch);
		return NULL;
	}
	pthread_mutex_lock(&lock);
	ch->number = next_channel++;
	pthread_mutex_unlock(&lock);
	int err = sv_cm_events(ch->number, sv[1]);
	close(sv[1]);
	if (err) {
		close(sv[0]);
		free(ch);
		errno = err;
		return NULL;
	}
	ch->ch.fd = sv[0];
	return &ch->ch;
}

struct rdma_event_channel *rdma_create_event_channel(void)
{
	return new_channel();
}

void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	if (!channel)
		return;
	close(channel->fd);
	free(channel);
}

static int ps_qp_type(enum rdma_port_space ps)
{
	return ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
}

static int create_id(struct rdma_event_channel *channel, struct rdma_cm_id **out, void *context,
		     enum rdma_port_space ps, enum ibv_qp_type qp_type)
{
	if (!out)
		return fail(EINVAL);
	struct cma_id *c = calloc(1, sizeof(*c));
	if (!c)
		return fail(ENOMEM);
	if (!channel) {
		channel = new_channel();
		if (!channel) {
			free(c);
			return -1;
		}
		c->sync = 1;
	}
	struct sv_cm_create_id req = {.ps = (uint32_t)ps, .qp_type = (uint32_t)qp_type,
				       .channel = ((struct cma_channel *)channel)->number};
	struct sv_handle got;
	if (CALL(CM_CREATE_ID, req, &got)) {
		int err = errno;
		if (c->sync)
			rdma_destroy_event_channel(channel);
		free(c);
		return fail(err);
	}
	c->handle = got.handle;
	c->id.channel = channel;
	c->id.context = context;
	c->id.ps = ps;
	c->id.qp_type = qp_type;
	pthread_mutex_lock(&lock);
	c->next = ids;
	ids = c;
	pthread_mutex_unlock(&lock);
	*out = &c->id;
	return 0;
}

int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
		   enum rdma_port_space ps)
{
	return create_id(channel, id, context, ps, ps_qp_type(ps));
}

/* A command that names only the ID. */
static int simple(struct cma_id *c, uint16_t op, const char *name)
{
	struct sv_handle req = {.handle = c->handle};
	return call(op, name, &req, sizeof(req), NULL, 0);
}

int rdma_destroy_id(struct rdma_cm_id *id)
{
	if (!id)
		return fail(EINVAL);
	struct cma_id *c = cma(id);
	simple(c, SV_OP_CM_DESTROY_ID, "CM_DESTROY_ID");
	pthread_mutex_lock(&lock);
	for (struct cma_id **p = &ids; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			break;
		}
	pthread_mutex_unlock(&lock);
	if (c->id.event)
		rdma_ack_cm_event(c->id.event);
	if (c->sync)
		rdma_destroy_event_channel(c->id.channel);
	while (c->mc) {
		struct cma_mc *mc = c->mc;
		c->mc = mc->next;
		free(mc);
	}
	free(c->qp_init);
	free(c);
	return 0;
}

/* A synchronous ID's call waits here for its event (librdmacm's ucma_complete). */
static int complete(struct cma_id *c)
{
	if (!c->sync)
		return 0;
	if (c->id.event) {
		rdma_ack_cm_event(c->id.event);
		c->id.event = NULL;
	}
	if (rdma_get_cm_event(c->id.channel, &c->id.event))
		return -1;
	int status = c->id.event->status;
	if (!status)
		return 0;
	if (c->id.event->event == RDMA_CM_EVENT_REJECTED)
		return fail(ECONNREFUSED);
	return fail(status < 0 ? -status : status);
}

int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	if (!id || !valid_addr(addr))
		return fail(EINVAL);
	struct sv_cm_bind req = {.handle = cma(id)->handle};
	cm_addr_of(addr, &req.addr);
	struct sv_cm_id_info info;
	if (CALL(CM_BIND_ADDR, req, &info))
		return -1;
	attach(cma(id), &info);
	return 0;
}

int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr,
		      int timeout_ms)
{
	if (!id || !valid_addr(dst_addr))
		return fail(EINVAL);
	struct sv_cm_resolve_addr req = {.handle = cma(id)->handle,
					  .timeout_ms = timeout_ms > 0 ? (uint32_t)timeout_ms : 2000};
	cm_addr_of(valid_addr(src_addr) ? src_addr : NULL, &req.src);
	cm_addr_of(dst_addr, &req.dst);
	if (CALL0(CM_RESOLVE_ADDR, req))
		return -1;
	size_t len = dst_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
						    : sizeof(struct sockaddr_in6);
	memcpy(&id->route.addr.dst_storage, dst_addr, len);
	return complete(cma(id));
}

int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	if (!id)
		return fail(EINVAL);
	struct sv_cm_timeout req = {.handle = cma(id)->handle,
				     .timeout_ms = timeout_ms > 0 ? (uint32_t)timeout_ms : 2000};
	if (CALL0(CM_RESOLVE_ROUTE, req))
		return -1;
	return complete(cma(id));
}

int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	if (!id)
		return fail(EINVAL);
	struct sv_cm_listen req = {.handle = cma(id)->handle, .backlog = backlog};
	struct sv_cm_id_info info;
	if (CALL(CM_LISTEN, req, &info))
		return -1;
	attach(cma(id), &info);
	return 0;
}

/* --- the QP's states -------------------------------------------------------------------- */

/* The agent's address vector (a RoCE path: always global). */
static void ah_attr_of(const struct sv_address_vector *ah, struct ibv_ah_attr *out)
{
	out->is_global = 1;
	out->port_num = (uint8_t)ah->port_num;
	memcpy(out->grh.dgid.raw, ah->dgid, 16);
	out->grh.sgid_index = (uint8_t)ah->sgid_index;
	out->grh.flow_label = ah->flow_label;
	out->grh.hop_limit = (uint8_t)ah->hop_limit;
	out->grh.traffic_class = (uint8_t)ah->traffic_class;
}

/* The agent's attributes for ``state`` into attr/mask (rdma_init_qp_attr).
 * rdma_accept passes its parameters ``p`` (the agent decides on them: its
 * REP carries them only after the QP moved); NULL leaves them to the ID. */
static int qp_attr(struct cma_id *c, enum ibv_qp_state state, const struct rdma_conn_param *p,
		   struct ibv_qp_attr *attr, int *mask)
{
	struct sv_cm_qp_state req = {
		.handle = c->handle, .qp_state = (uint32_t)state,
		.responder_resources = p ? p->responder_resources : RDMA_MAX_RESP_RES,
		.initiator_depth = p ? p->initiator_depth : RDMA_MAX_INIT_DEPTH};
	struct sv_cm_qp_attr got;
	if (CALL(CM_INIT_QP_ATTR, req, &got))
		return -1;
	const struct sv_qp_attrs *a = &got.attr;
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = state;
	attr->port_num = (uint8_t)a->port_num;
	attr->pkey_index = (uint16_t)a->pkey_index;
	attr->qkey = a->qkey;
	attr->qp_access_flags = a->qp_access_flags;
	attr->path_mtu = (enum ibv_mtu)a->path_mtu;
	attr->dest_qp_num = a->dest_qp_num;
	attr->rq_psn = a->rq_psn;
	attr->sq_psn = a->sq_psn;
	attr->max_dest_rd_atomic = (uint8_t)a->max_dest_rd_atomic;
	attr->max_rd_atomic = (uint8_t)a->max_rd_atomic;
	attr->min_rnr_timer = (uint8_t)a->min_rnr_timer;
	attr->retry_cnt = (uint8_t)a->retry_cnt;
	attr->rnr_retry = (uint8_t)a->rnr_retry;
	attr->timeout = (uint8_t)a->timeout;
	if (got.mask & IBV_QP_AV)
		ah_attr_of(&a->ah, &attr->ah_attr);
	*mask = (int)got.mask;
	return 0;
}

int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr_out, int *qp_attr_mask)
{
	if (!id || !qp_attr_out || !qp_attr_mask)
		return fail(EINVAL);
	return qp_attr(cma(id), qp_attr_out->qp_state, NULL, qp_attr_out, qp_attr_mask);
}

static int modify(struct cma_id *c, enum ibv_qp_state state, const struct rdma_conn_param *p)
{
	struct ibv_qp_attr attr;
	int mask;
	if (qp_attr(c, state, p, &attr, &mask))
		return -1;
	int err = ibv_modify_qp(c->id.qp, &attr, mask);
	return err ? fail(err) : 0;
}

/* ucma_modify_qp_rtr and ucma_modify_qp_rts: INIT again first (the access
 * rights are known only now), RTR, RTS. */
static int modify_rtr_rts(struct cma_id *c, const struct rdma_conn_param *p)
{
	if (!c->id.qp)
		return 0;
	if (modify(c, IBV_QPS_INIT, p) || modify(c, IBV_QPS_RTR, p))
		return -1;
	return modify(c, IBV_QPS_RTS, p);
}

static void modify_err(struct cma_id *c)
{
	if (c->id.qp) {
		struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
		ibv_modify_qp(c->id.qp, &attr, IBV_QP_STATE);
	}
}

static int init_qp(struct cma_id *c)
{
	if (modify(c, IBV_QPS_INIT, NULL))
		return -1;
	if (c->id.qp_type != IBV_QPT_UD)
		return 0;
	return modify(c, IBV_QPS_RTR, NULL) || modify(c, IBV_QPS_RTS, NULL) ? -1 : 0;
}

/* ucma_create_cqs: the CQs (each with its own completion channel) of a queue
 * the caller gave none for, sized by its WRs; a queue of 0 WRs gets none.
 * They are librdmacm's: ucma_destroy_cqs frees them. */
static int create_cqs(struct rdma_cm_id *id, uint32_t send_size, uint32_t recv_size)
{
	if (recv_size) {
		id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
		if (!id->recv_cq_channel)
			return -1;
		id->recv_cq = ibv_create_cq(id->verbs, (int)recv_size, id, id->recv_cq_channel, 0);
		if (!id->recv_cq)
			return -1;
	}
	if (send_size) {
		id->send_cq_channel = ibv_create_comp_channel(id->verbs);
		if (!id->send_cq_channel)
			return -1;
		id->send_cq = ibv_create_cq(id->verbs, (int)send_size, id, id->send_cq_channel, 0);
		if (!id->send_cq)
			return -1;
	}
	return 0;
}

static void destroy_cqs(struct rdma_cm_id *id)
{
	if (id->qp_type == IBV_QPT_XRC_RECV && id->srq)
		return;	/* the XRC SRQ still uses its CQ */
	if (id->recv_cq)
		ibv_destroy_cq(id->recv_cq);
	if (id->send_cq && id->send_cq != id->recv_cq)
		ibv_destroy_cq(id->send_cq);
	if (id->recv_cq_channel)
		ibv_destroy_comp_channel(id->recv_cq_channel);
	if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
		ibv_destroy_comp_channel(id->send_cq_channel);
	id->send_cq = id->recv_cq = NULL;
	id->send_cq_channel = id->recv_cq_channel = NULL;
}

/* As librdmacm: the ID's PD when none is given (its device's, or its QP's),
 * CQs made for the queues that have none, the ID's SRQ, an XRC domain for
 * XRC_RECV; then the QP is moved to INIT (UD: RTS) and becomes id->qp. */
int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	if (!id || !attr)
		return fail(EINVAL);
	struct cma_id *c = cma(id);
	if (id->qp)
		return fail(EINVAL);
	if (!c->dev)
		return fail(ENODEV);	/* no address yet: no device to make it on */
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
		attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
		attr->pd = id->pd;
	} else if (attr->pd->context != id->verbs) {
		return fail(EINVAL);	/* a PD of another device */
	}
	if ((id->recv_cq && attr->recv_cq && id->recv_cq != attr->recv_cq) ||
	    (id->send_cq && attr->send_cq && id->send_cq != attr->send_cq))
		return fail(EINVAL);
	if (id->qp_type == IBV_QPT_XRC_RECV &&
	    (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd)) {
		attr->xrcd = default_xrcd(c->dev);
		if (!attr->xrcd)
			return -1;
		attr->comp_mask |= IBV_QP_INIT_ATTR_XRCD;
	}
	if (create_cqs(id, attr->send_cq || id->send_cq ? 0 : attr->cap.max_send_wr,
		       attr->recv_cq || id->recv_cq ? 0 : attr->cap.max_recv_wr))
		goto fail_cqs;
	if (!attr->send_cq)
		attr->send_cq = id->send_cq;
	if (!attr->recv_cq)
		attr->recv_cq = id->recv_cq;
	if (id->srq && !attr->srq)
		attr->srq = id->srq;
	attr->qp_type = id->qp_type;
	struct ibv_qp *qp = ibv_create_qp_ex(id->verbs, attr);
	if (!qp)
		goto fail_cqs;
	id->qp = qp;
	if (init_qp(c)) {
		int err = errno;
		id->qp = NULL;
		ibv_destroy_qp(qp);
		errno = err;
		goto fail_cqs;
	}
	id->pd = qp->pd;
	return 0;
fail_cqs: {
		int err = errno ? errno : ENOMEM;
		destroy_cqs(id);
		return fail(err);
	}
}

int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
	if (!id || !init)
		return fail(EINVAL);
	struct ibv_qp_init_attr_ex ex;
	memset(&ex, 0, sizeof(ex));
	memcpy(&ex, init, sizeof(*init));
	ex.comp_mask = IBV_QP_INIT_ATTR_PD;
	ex.pd = pd ? pd : id->pd;
	int ret = rdma_create_qp_ex(id, &ex);
	memcpy(init, &ex, sizeof(*init));	/* the caps, CQs and SRQ used, as librdmacm */
	return ret;
}

void rdma_destroy_qp(struct rdma_cm_id *id)
{
	if (!id)
		return;
	if (id->qp)
		ibv_destroy_qp(id->qp);
	id->qp = NULL;
	destroy_cqs(id);
}

/* --- shared receive queues ------------------------------------------------------------ */

int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	if (!id || !attr || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE))
		return fail(EINVAL);
	struct cma_id *c = cma(id);
	if (!c->dev)
		return fail(ENODEV);
	if (id->srq)
		return fail(EINVAL);
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
		attr->pd = id->pd;
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
	}
	if (attr->srq_type == IBV_SRQT_XRC) {
		if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd) {
			attr->xrcd = default_xrcd(c->dev);
			if (!attr->xrcd)
				return -1;
		}
		if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq) {
			if (create_cqs(id, 0, attr->attr.max_wr))
				goto fail_cqs;
			attr->cq = id->recv_cq;
		}
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
	}
	struct ibv_srq *srq = ibv_create_srq_ex(id->verbs, attr);
	if (!srq)
		goto fail_cqs;
	if (!id->pd)
		id->pd = attr->pd;
	id->srq = srq;
	return 0;
fail_cqs: {
		int err = errno ? errno : ENOMEM;
		destroy_cqs(id);
		return fail(err);
	}
}

int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	if (!id || !attr)
		return fail(EINVAL);
	struct ibv_srq_init_attr_ex ex;
	memset(&ex, 0, sizeof(ex));
	memcpy(&ex, attr, sizeof(*attr));
	ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	ex.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
	ex.pd = pd;
	int ret = rdma_create_srq_ex(id, &ex);
	memcpy(attr, &ex, sizeof(*attr));
	return ret;
}

void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (!id)
		return;
	if (id->srq)
		ibv_destroy_srq(id->srq);
	id->srq = NULL;
	destroy_cqs(id);
}

/* --- connecting --------------------------------------------------------------------------- */

/* The connection parameters as the agent takes them (ucma_copy_conn_param_to_kern):
 * as given -- the agent decides the responder resources and initiator depth,
 * RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH asking for its default. */
static void conn_to_agent(struct cma_id *c, const struct rdma_conn_param *p,
			  struct sv_cm_connect *req)
{
	memset(req, 0, sizeof(*req));
	req->handle = c->handle;
	struct sv_cm_conn_param *k = &req->param;
	k->qp_num = c->id.qp ? c->id.qp->qp_num : p ? p->qp_num : 0;
	k->responder_resources = p ? p->responder_resources : RDMA_MAX_RESP_RES;
	k->initiator_depth = p ? p->initiator_depth : RDMA_MAX_INIT_DEPTH;
	if (p) {
		k->flow_control = p->flow_control;
		k->retry_count = p->retry_count;
		k->rnr_retry_count = p->rnr_retry_count;
		k->srq = c->id.srq ? 1 : p->srq;
		if (p->private_data && p->private_data_len) {
			memcpy(k->private_data, p->private_data, p->private_data_len);
			k->private_data_len = p->private_data_len;
		}
	} else {
		k->retry_count = 7;
		k->rnr_retry_count = 7;
	}
	/* UD: the agent gives the SIDR_REP the ID's Q_Key (RDMA_UDP_QKEY) */
}

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	if (!id)
		return fail(EINVAL);
	struct cma_id *c = cma(id);
	if (!c->dev)
		return fail(EINVAL);
	if (id->qp_type != IBV_QPT_UD && !id->qp && !p)
		return fail(EINVAL);	/* ucma_valid_param: no QP needs a qp_num */
	struct sv_cm_connect req;
	conn_to_agent(c, p, &req);
	if (CALL0(CM_CONNECT, req))
		return -1;
	return complete(c);
}

int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	if (!id)
		return fail(EINVAL);
	struct cma_id *c = cma(id);
	if (!c->dev)
		return fail(EINVAL);
	if (id->qp_type != IBV_QPT_UD) {
		if (!id->qp && !p)
			return fail(EINVAL);
		if (modify_rtr_rts(c, p))
			return -1;
	}
	struct sv_cm_connect req;
	conn_to_agent(c, p, &req);
	if (CALL0(CM_ACCEPT, req)) {
		int err = errno;
		modify_err(c);
		return fail(err);
	}
	return id->qp_type == IBV_QPT_UD ? 0 : complete(c);
}

int rdma_establish(struct rdma_cm_id *id)
{
	if (!id || id->qp)
		return fail(EINVAL);	/* an ID with a QP completes by itself */
	return simple(cma(id), SV_OP_CM_ESTABLISH, "CM_ESTABLISH");
}

int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	if (!id)
		return fail(EINVAL);
	struct sv_cm_connect req = {.handle = cma(id)->handle};
	if (private_data && private_data_len) {
		memcpy(req.param.private_data, private_data, private_data_len);
		req.param.private_data_len = private_data_len;
	}
	return CALL0(CM_REJECT, req);
}

int rdma_disconnect(struct rdma_cm_id *id)
{
	if (!id)
		return fail(EINVAL);
	modify_err(cma(id));
	if (simple(cma(id), SV_OP_CM_DISCONNECT, "CM_DISCONNECT"))
		return -1;
	return complete(cma(id));
}

int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	(void)event;
	return id ? 0 : fail(EINVAL);	/* the agent needs no help to see COMM_EST */
}

/* The agent checks the option and its length as the kernel's ucma does
 * (TOS and ACK_TIMEOUT a uint8_t, REUSEADDR and AFONLY an int). */
int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	if (!id || !optval || !optlen)
		return fail(EINVAL);
	if (level < 0 || optname < 0 || optlen > UINT32_MAX)
		return fail(EINVAL);
	struct sv_cm_option req = {
		.value = optlen == 1 ? *(uint8_t *)optval
		       : optlen == sizeof(int) ? (uint64_t)(uint32_t)*(int *)optval : 0,
		.handle = cma(id)->handle, .level = (uint32_t)level, .name = (uint32_t)optname,
		.length = (uint32_t)optlen};
	return CALL0(CM_SET_OPTION, req);
}

int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	if (!id)
		return fail(EINVAL);
	struct cma_id *c = cma(id);
	int sync = !channel;
	if (sync && !(channel = new_channel()))
		return -1;
	struct sv_cm_channel req = {.handle = c->handle,
				     .channel = ((struct cma_channel *)channel)->number};
	if (CALL0(CM_MIGRATE_ID, req)) {
		int err = errno;
		if (sync)
			rdma_destroy_event_channel(channel);
		return fail(err);
	}
	if (c->sync)
		rdma_destroy_event_channel(id->channel);
	id->channel = channel;
	c->sync = sync;
	return 0;
}

/* --- multicast -------------------------------------------------------------------------- */

static socklen_t addr_len(const struct sockaddr *sa)
{
	return sa->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

static int same_addr(const struct sockaddr *a, const struct sockaddr *b)
{
	return a->sa_family == b->sa_family && !memcmp(a, b, addr_len(a));
}

static int join(struct rdma_cm_id *id, struct sockaddr *addr, int flags, void *context)
{
	if (!id || !valid_addr(addr))
		return fail(EINVAL);
	struct cma_id *c = cma(id);
	struct cma_mc *mc = calloc(1, sizeof(*mc));
	if (!mc)
		return fail(ENOMEM);
	memcpy(&mc->addr, addr, addr_len(addr));
	mc->context = context;
	mc->flags = flags;
	pthread_mutex_lock(&lock);
	mc->next = c->mc;
	c->mc = mc;
	pthread_mutex_unlock(&lock);
	struct sv_cm_mcast req = {.handle = c->handle, .join_flags = (uint32_t)flags};
	cm_addr_of(addr, &req.addr);
	if (CALL0(CM_JOIN_MCAST, req)) {
		int err = errno;
		pthread_mutex_lock(&lock);
		for (struct cma_mc **p = &c->mc; *p; p = &(*p)->next)
			if (*p == mc) {
				*p = mc->next;
				break;
			}
		pthread_mutex_unlock(&lock);
		free(mc);
		return fail(err);
	}
	return complete(c);
}

int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	return join(id, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context);
}

int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *attr,
			   void *context)
{
	if (!id || !attr)
		return fail(EINVAL);
	if (attr->comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED)
		return fail(ENOTSUP);
	if (!(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) || !attr->addr)
		return fail(EINVAL);
	if (!(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) ||
	    attr->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED)
		return fail(EINVAL);
	return join(id, attr->addr, (int)attr->join_flags, context);
}

int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	if (!id || !valid_addr(addr))
		return fail(EINVAL);
	struct cma_id *c = cma(id);
	struct cma_mc *mc = NULL;
	pthread_mutex_lock(&lock);
	for (struct cma_mc **p = &c->mc; *p; p = &(*p)->next)
		if (same_addr((struct sockaddr *)&(*p)->addr, addr)) {
			mc = *p;
			*p = mc->next;
			break;
		}
	pthread_mutex_unlock(&lock);
	if (!mc)
		return fail(EADDRNOTAVAIL);
	if (id->qp && mc->attached)
		ibv_detach_mcast(id->qp, &mc->mgid, mc->mlid);
	struct sv_cm_mcast req = {.handle = c->handle};
	cm_addr_of((struct sockaddr *)&mc->addr, &req.addr);
	int err = CALL0(CM_LEAVE_MCAST, req) ? errno : 0;
	free(mc);
	return err ? fail(err) : 0;
}

/* librdmacm's ucma_process_join: the group's GID, and the ID's QP attached to
 * it unless the join was send-only; 0 or an errno. */
static int process_join(struct cma_id *c, struct cma_event *e, const struct sv_cm_event *raw)
{
	struct sockaddr_storage group;
	if (!(raw->flags & SV_CM_EVENT_MC) || !addr_of(&raw->mc, &group))
		return 0;
	pthread_mutex_lock(&lock);
	struct cma_mc *mc = c->mc;
	while (mc && !same_addr((struct sockaddr *)&mc->addr, (struct sockaddr *)&group))
		mc = mc->next;
	pthread_mutex_unlock(&lock);
	if (!mc)
		return 0;
	e->event.param.ud.private_data = mc->context;
	mc->mgid = e->event.param.ud.ah_attr.grh.dgid;
	mc->mlid = e->event.param.ud.ah_attr.dlid;
	if (!c->id.qp || mc->flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER || mc->attached)
		return 0;
	int err = ibv_attach_mcast(c->id.qp, &mc->mgid, mc->mlid);
	if (!err)
		mc->attached = 1;
	return err;
}

/* --- events -------------------------------------------------------------------------------- */

/* The event's private data (CM_EVENT_CONN or _UD) into the event's own copy. */
static const void *private_data_of(struct cma_event *e, const struct sv_cm_conn_param *k,
				   uint8_t *len)
{
	size_t n = k->private_data_len;
	if (n > sizeof(e->private_data))
		n = sizeof(e->private_data);
	memcpy(e->private_data, k->private_data, n);
	*len = (uint8_t)n;
	return n ? e->private_data : NULL;
}

static void conn_param_of(struct cma_event *e, const struct sv_cm_conn_param *k)
{
	struct rdma_conn_param *p = &e->event.param.conn;
	p->private_data = private_data_of(e, k, &p->private_data_len);
	p->responder_resources = k->responder_resources;
	p->initiator_depth = k->initiator_depth;
	p->flow_control = k->flow_control;
	p->retry_count = k->retry_count;
	p->rnr_retry_count = k->rnr_retry_count;
	p->srq = k->srq;
	p->qp_num = k->qp_num;
}

static void ud_param_of(struct cma_event *e, const struct sv_cm_event *raw)
{
	struct rdma_ud_param *p = &e->event.param.ud;
	p->private_data = private_data_of(e, &raw->param, &p->private_data_len);
	p->qp_num = raw->param.qp_num;
	p->qkey = raw->param.qkey;
	if (raw->flags & SV_CM_EVENT_AH)
		ah_attr_of(&raw->ah, &p->ah_attr);
}

/* A CONNECT_REQUEST's new ID (ucma_process_conn_req). */
static struct cma_id *new_child(struct cma_id *listen, const struct sv_cm_event *raw)
{
	struct cma_id *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->handle = raw->info.handle;
	c->id.channel = listen->id.channel;
	c->id.context = listen->id.context;
	c->id.ps = listen->id.ps;
	c->id.qp_type = (enum ibv_qp_type)raw->info.qp_type;	/* RC for a REQ, UD for a SIDR_REQ */
	attach(c, &raw->info);
	if (listen->id.pd && c->id.verbs == listen->id.verbs)
		c->id.pd = listen->id.pd;
	pthread_mutex_lock(&lock);
	c->next = ids;
	ids = c;
	pthread_mutex_unlock(&lock);
	if (listen->sync && rdma_migrate_id(&c->id, NULL)) {	/* a channel of its own */
		rdma_destroy_id(&c->id);
		return NULL;
	}
	return c;
}

/* librdmacm's processing of one raw event; NULL when it is not reported. */
static struct cma_event *process(const struct sv_cm_event *raw)
{
	struct cma_id *c = id_of(raw->handle);
	if (!c)
		return NULL;	/* destroyed meanwhile */
	struct cma_event *e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	struct rdma_cm_event *ev = &e->event;
	ev->id = &c->id;
	ev->event = (enum rdma_cm_event_type)raw->event;
	ev->status = raw->status;
	if (raw->flags & SV_CM_EVENT_CONN)
		conn_param_of(e, &raw->param);
	else if (raw->flags & SV_CM_EVENT_UD)
		ud_param_of(e, raw);
	switch (ev->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST: {
		struct cma_id *child = new_child(c, raw);
		if (!child) {
			free(e);
			return NULL;
		}
		ev->id = &child->id;
		ev->listen_id = &c->id;
		break;
	}
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
		if (!c->id.qp) {
			c->connect_error = 0;
			break;
		}
		if (modify_rtr_rts(c, NULL) || simple(c, SV_OP_CM_ESTABLISH, "CM_ESTABLISH")) {
			modify_err(c);
			ev->event = RDMA_CM_EVENT_CONNECT_ERROR;
			ev->status = -(errno ? errno : EINVAL);
			c->connect_error = 1;
		} else {
			ev->event = RDMA_CM_EVENT_ESTABLISHED;
		}
		break;
	case RDMA_CM_EVENT_REJECTED:
	case RDMA_CM_EVENT_DISCONNECTED:
		if (c->connect_error) {
			free(e);
			return NULL;
		}
		if (ev->event == RDMA_CM_EVENT_REJECTED)
			modify_err(c);
		break;
	case RDMA_CM_EVENT_ADDR_RESOLVED:
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		if (raw->flags & SV_CM_EVENT_INFO)
			attach(c, &raw->info);
		if (!c->dev) {
			ev->event = RDMA_CM_EVENT_ADDR_ERROR;
			ev->status = -ENODEV;
		}
		break;
	case RDMA_CM_EVENT_UNREACHABLE:
		modify_err(c);
		break;
	case RDMA_CM_EVENT_MULTICAST_JOIN: {
		int err = process_join(c, e, raw);
		if (err) {
			ev->event = RDMA_CM_EVENT_MULTICAST_ERROR;
			ev->status = -err;
		}
		break;
	}
	default:
		break;
	}
	return e;
}

int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	if (!channel || !event)
		return fail(EINVAL);
	for (;;) {
		/* a signal ends the wait with EINTR, as librdmacm's read() does */
		struct sv_cm_event raw;
		ssize_t n = recv(channel->fd, &raw, sizeof(raw), MSG_TRUNC);	/* n: its real size */
		if (n <= 0)
			return fail(n < 0 ? errno : ENODEV);	/* 0: the service is gone */
		if ((size_t)n != sizeof(raw))
			return fail(EPROTO);
		struct cma_event *e = process(&raw);
		if (e) {
			*event = &e->event;
			return 0;
		}
	}
}

int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	if (!event)
		return fail(EINVAL);
	free(event);
	return 0;
}

const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const names[] = {
		[RDMA_CM_EVENT_ADDR_RESOLVED] = "RDMA_CM_EVENT_ADDR_RESOLVED",
		[RDMA_CM_EVENT_ADDR_ERROR] = "RDMA_CM_EVENT_ADDR_ERROR",
		[RDMA_CM_EVENT_ROUTE_RESOLVED] = "RDMA_CM_EVENT_ROUTE_RESOLVED",
		[RDMA_CM_EVENT_ROUTE_ERROR] = "RDMA_CM_EVENT_ROUTE_ERROR",
		[RDMA_CM_EVENT_CONNECT_REQUEST] = "RDMA_CM_EVENT_CONNECT_REQUEST",
		[RDMA_CM_EVENT_CONNECT_RESPONSE] = "RDMA_CM_EVENT_CONNECT_RESPONSE",
		[RDMA_CM_EVENT_CONNECT_ERROR] = "RDMA_CM_EVENT_CONNECT_ERROR",
		[RDMA_CM_EVENT_UNREACHABLE] = "RDMA_CM_EVENT_UNREACHABLE",
		[RDMA_CM_EVENT_REJECTED] = "RDMA_CM_EVENT_REJECTED",
		[RDMA_CM_EVENT_ESTABLISHED] = "RDMA_CM_EVENT_ESTABLISHED",
		[RDMA_CM_EVENT_DISCONNECTED] = "RDMA_CM_EVENT_DISCONNECTED",
		[RDMA_CM_EVENT_DEVICE_REMOVAL] = "RDMA_CM_EVENT_DEVICE_REMOVAL",
		[RDMA_CM_EVENT_MULTICAST_JOIN] = "RDMA_CM_EVENT_MULTICAST_JOIN",
		[RDMA_CM_EVENT_MULTICAST_ERROR] = "RDMA_CM_EVENT_MULTICAST_ERROR",
		[RDMA_CM_EVENT_ADDR_CHANGE] = "RDMA_CM_EVENT_ADDR_CHANGE",
		[RDMA_CM_EVENT_TIMEWAIT_EXIT] = "RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};
	unsigned i = (unsigned)event;
	return i < sizeof(names) / sizeof(names[0]) && names[i] ? names[i]
								 : "UNKNOWN EVENT";
}

/* --- addresses, ports and devices ---------------------------------------------------------- */

static __be16 port_of(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)sa)->sin_port;
	if (sa->sa_family == AF_INET6)
		return ((const struct sockaddr_in6 *)sa)->sin6_port;
	return 0;
}

__be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return port_of(&id->route.addr.src_addr);
}

__be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return port_of(&id->route.addr.dst_addr);
}

struct ibv_context **rdma_get_devices(int *num_devices)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context **out = calloc((size_t)n + 1, sizeof(*out));
	int got = 0;
	for (int i = 0; list && out && i < n; i++) {
		struct cma_device *d = device_named(ibv_get_device_name(list[i]));
		if (d)
			out[got++] = d->verbs;
	}
	if (list)
		ibv_free_device_list(list);
	if (num_devices)
		*num_devices = got;
	return out;
}

void rdma_free_devices(struct ibv_context **list)
{
	free(list);	/* the contexts stay open while the library is loaded */
}

static struct sockaddr *copy_addr(const struct sockaddr *sa, socklen_t len)
{
	struct sockaddr *out = malloc(len);
	if (out)
		memcpy(out, sa, len);
	return out;
}

static int copy_into(struct sockaddr **dst, socklen_t *dst_len, const struct sockaddr *src,
		     socklen_t len)
{
	*dst = copy_addr(src, len);
	if (!*dst)
		return fail(ENOMEM);
	*dst_len = len;
	return 0;
}

/* The hints as getaddrinfo(3)'s: the QP type chooses the socket type, the port
 * space the protocol, and the family is passed on unless it is AF_IB (which
 * softverbs does not speak). */
static void to_ai_hints(const struct rdma_addrinfo *h, struct addrinfo *ai)
{
	memset(ai, 0, sizeof(*ai));
	if (h->ai_flags & RAI_PASSIVE)
		ai->ai_flags |= AI_PASSIVE;
	if (h->ai_flags & RAI_NUMERICHOST)
		ai->ai_flags |= AI_NUMERICHOST;
	if (h->ai_family != AF_IB)
		ai->ai_family = h->ai_family;
	if (h->ai_qp_type == IBV_QPT_UD)
		ai->ai_socktype = SOCK_DGRAM;
	else if (h->ai_qp_type == IBV_QPT_RC || h->ai_qp_type == IBV_QPT_UC ||
		 h->ai_qp_type == IBV_QPT_XRC_SEND || h->ai_qp_type == IBV_QPT_XRC_RECV)
		ai->ai_socktype = SOCK_STREAM;
	if (h->ai_port_space == RDMA_PS_TCP)
		ai->ai_protocol = IPPROTO_TCP;
	else if (h->ai_port_space == RDMA_PS_UDP || h->ai_port_space == RDMA_PS_IPOIB)
		ai->ai_protocol = IPPROTO_UDP;
	else if (h->ai_port_space == RDMA_PS_IB && ai->ai_socktype)
		ai->ai_protocol = ai->ai_socktype == SOCK_STREAM ? IPPROTO_TCP : IPPROTO_UDP;
}

/* rdma_getaddrinfo, by librdmacm's rules.  With a node or a service, getaddrinfo(3)
 * resolves them with the hints translated (to_ai_hints) and its first answer is the
 * destination -- the source, with RAI_PASSIVE; a QP type or port space the hints
 * leave 0 follows from the answer's socket type and protocol.  With neither, the
 * hints alone are the answer (libfabric's verbs provider asks so): their flags,
 * family, QP type and port space, and their destination address.  Either way a
 * source address in the hints is the answer's when it has none.  EINVAL when
 * there is no node, no service and no hints. */
int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
		     struct rdma_addrinfo **res)
{
	static const struct rdma_addrinfo none;
	if (!res || (!node && !service && !hints))
		return fail(EINVAL);
	struct rdma_addrinfo *r = calloc(1, sizeof(*r));
	if (!r)
		return fail(ENOMEM);
	const struct rdma_addrinfo *h = hints ? hints : &none;
	int rc = 0;
	if (node || service) {
		struct addrinfo ai_hints, *ai = NULL;
		if (hints)
			to_ai_hints(hints, &ai_hints);
		int gai = getaddrinfo(node, service, hints ? &ai_hints : NULL, &ai);
		if (gai) {
			int err = gai == EAI_SYSTEM ? errno : ENOENT;
			free(r);
			return fail(err);
		}
		r->ai_qp_type = h->ai_qp_type ? h->ai_qp_type
			: ai->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD
			: ai->ai_socktype == SOCK_STREAM ? IBV_QPT_RC : 0;
		r->ai_port_space = h->ai_port_space ? h->ai_port_space
			: ai->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP
			: ai->ai_protocol == IPPROTO_TCP ? RDMA_PS_TCP : 0;
		r->ai_family = ai->ai_family;
		if (ai->ai_flags & AI_PASSIVE) {
			r->ai_flags = RAI_PASSIVE;
			rc = copy_into(&r->ai_src_addr, &r->ai_src_len, ai->ai_addr, ai->ai_addrlen);
		} else {
			rc = copy_into(&r->ai_dst_addr, &r->ai_dst_len, ai->ai_addr, ai->ai_addrlen);
		}
		freeaddrinfo(ai);
	} else {
		r->ai_flags = h->ai_flags;
		r->ai_family = h->ai_family;
		r->ai_qp_type = h->ai_qp_type;
		r->ai_port_space = h->ai_port_space;
		if (h->ai_dst_len && h->ai_dst_addr)
			rc = copy_into(&r->ai_dst_addr, &r->ai_dst_len, h->ai_dst_addr, h->ai_dst_len);
	}
	if (!rc && !r->ai_src_len && h->ai_src_len && h->ai_src_addr)
		rc = copy_into(&r->ai_src_addr, &r->ai_src_len, h->ai_src_addr, h->ai_src_len);
	if (rc) {
		int err = errno;
		rdma_freeaddrinfo(r);
		return fail(err);
	}
	*res = r;
	return 0;
}

void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *next = res->ai_next;
		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = next;
	}
}

/* --- endpoints: rdma_create_ep's synchronous IDs ---------------------------------------------- */

int rdma_create_ep(struct rdma_cm_id **out, struct rdma_addrinfo *res, struct ibv_pd *pd,
		   struct ibv_qp_init_attr *qp_init)
{
	if (!out || !res)
		return fail(EINVAL);
	struct rdma_cm_id *id;
	if (create_id(NULL, &id, NULL, (enum rdma_port_space)res->ai_port_space,
		      (enum ibv_qp_type)res->ai_qp_type))
		return -1;
	struct cma_id *c = cma(id);
	int rc;
	if (res->ai_flags & RAI_PASSIVE) {
		rc = rdma_bind_addr(id, res->ai_src_addr);
		if (!rc && pd)
			id->pd = pd;
		if (!rc && qp_init) {	/* for the requests rdma_get_request hands out */
			c->qp_init = malloc(sizeof(*qp_init));
			if (c->qp_init) {
				*c->qp_init = *qp_init;
				c->qp_init->qp_type = (enum ibv_qp_type)res->ai_qp_type;
			}
			rc = c->qp_init ? 0 : fail(ENOMEM);
		}
	} else {
		rc = rdma_resolve_addr(id, res->ai_src_addr, res->ai_dst_addr, 2000);
		if (!rc)
			rc = rdma_resolve_route(id, 2000);
		if (!rc && qp_init) {
			qp_init->qp_type = (enum ibv_qp_type)res->ai_qp_type;
			rc = rdma_create_qp(id, pd, qp_init);
		}
	}
	if (rc) {
		int err = errno;
		rdma_destroy_ep(id);
		return fail(err);
	}
	*out = id;
	return 0;
}

void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (!id)
		return;
	if (id->qp)
		rdma_destroy_qp(id);
	if (id->srq)
		rdma_destroy_srq(id);
	rdma_destroy_id(id);
}

/* As librdmacm: the listener's previous event is acknowledged first; a
 * failed request is kept in listen->event (acknowledged by the next call or
 * rdma_destroy_id); the new ID gets a QP if rdma_create_ep was given its
 * attributes, and its CONNECT_REQUEST event as id->event. */
int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **out)
{
	if (!listen || !out || !cma(listen)->sync)
		return fail(EINVAL);
	struct cma_id *l = cma(listen);
	if (listen->event) {
		rdma_ack_cm_event(listen->event);
		listen->event = NULL;
	}
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(listen->channel, &ev))
		return -1;
	int err = 0;
	if (ev->event == RDMA_CM_EVENT_REJECTED)
		err = ECONNREFUSED;
	else if (ev->status)
		err = ev->status < 0 ? -ev->status : ev->status;
	else if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		err = EINVAL;
	if (!err && l->qp_init) {
		struct ibv_qp_init_attr attr = *l->qp_init;
		if (rdma_create_qp(ev->id, listen->pd, &attr))
			err = errno;
	}
	if (err) {
		listen->event = ev;
		return fail(err);
	}
	*out = ev->id;
	ev->id->event = ev;	/* acknowledged by the ID's next synchronous call */
	return 0;
}

/* --- Enhanced Connection Establishment ---------------------------------------------------------
 *
 * ECE lets two ends negotiate vendor options in the REQ/REP.  softverbs' CM
 * carries none, so each end sees a peer without ECE: rdma_set_local_ece keeps
 * the options (checked as librdmacm checks them), rdma_get_remote_ece reports
 * vendor_id 0 and no options -- what librdmacm reports when the peer sent no
 * ECE -- and rdma_reject_ece is a reject.  (librdmacm sends reject reason 35,
 * "vendor option not supported"; softverbs' agent sends its one reason, 28,
 * "consumer defined", so the peer's REJECTED event's status differs.) */

int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	if (!id || id->qp || !ece || !ece->vendor_id || ece->comp_mask)
		return fail(EINVAL);
	cma(id)->local_ece = *ece;
	return 0;
}

int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	if (!id || id->qp || !ece)
		return fail(EINVAL);
	*ece = (struct ibv_ece){0};
	return 0;
}

int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	return rdma_reject(id, private_data, private_data_len);
}

/* rsockets' poll and select, which rdma-core's tools link: softverbs has no
 * rsockets (unsupported_rdmacm.c), so every descriptor is an ordinary one. */
int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	return poll(fds, nfds, timeout);
}

int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds,
	    struct timeval *timeout)
{
	return select(nfds, readfds, writefds, exceptfds, timeout);
}
