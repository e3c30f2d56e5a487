/* Devices, contexts and the queries: ibv_get_device_list .. ibv_query_gid,
 * async events, and the string and rate helpers of libibverbs. */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sv.h"

/* What libibverbs' driver.h declares for ibv_devinfo (IBVERBS_PRIVATE_34). */
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       enum ibv_gid_type_sysfs *type);

struct sv_device {
	struct ibv_device dev;
	uint64_t guid;
	uint32_t index;
};

/* Devices live as long as the process: contexts keep pointers to them. */
static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sv_device *devices[64];
static int ndevices;

static struct sv_device *device_for(const struct sv_device_entry *e)
{
	for (int i = 0; i < ndevices; i++)
		if (!strncmp(devices[i]->dev.name, e->name, sizeof(e->name)))
			return devices[i];
	if (ndevices == (int)(sizeof(devices) / sizeof(devices[0])))
		return NULL;
	struct sv_device *d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	snprintf(d->dev.name, sizeof(d->dev.name), "%.*s", (int)sizeof(e->name), e->name);
	/* The kernel's name would be uverbsN, the node of a real device in
	 * /dev/infiniband.  softverbs has no node there; its own name cannot be
	 * taken for a real device's node, and it is the one a program that
	 * looks for /dev/infiniband/<dev_name> (UCX) asks for
	 * (docs/c-programs.md, UCX). */
	snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "softverbs%u", e->index);
	snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "/sys/class/infiniband_verbs/%s",
		 d->dev.dev_name);
	snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "/sys/class/infiniband/%s",
		 d->dev.name);
	d->dev.node_type = (enum ibv_node_type)e->node_type;
	d->dev.transport_type = (enum ibv_transport_type)e->transport;
	d->guid = e->node_guid;
	d->index = e->index;
	devices[ndevices++] = d;
	return d;
}

struct ibv_device **ibv_get_device_list(int *num_devices)
{
	static __thread char tail[SV_MAX_MESSAGE];
	struct sv_list_devices_reply rep;
	size_t len = sizeof(tail);
	int err = sv_call(SV_OP_LIST_DEVICES, NULL, 0, NULL, 0, &rep, sizeof(rep), tail, &len);
	if (err) {
		if (num_devices)
			*num_devices = 0;
		errno = err;
		return NULL;
	}
	size_t n = len / sizeof(struct sv_device_entry);
	if (n > rep.count)
		n = rep.count;
	struct ibv_device **list = calloc(n + 1, sizeof(*list));
	if (!list)
		return sv_fail_null(ENOMEM);
	int got = 0;
	pthread_mutex_lock(&dev_lock);
	for (size_t i = 0; i < n; i++) {
		struct sv_device_entry e;
		memcpy(&e, tail + i * sizeof(e), sizeof(e));
		struct sv_device *d = device_for(&e);
		if (d)
			list[got++] = &d->dev;
	}
	pthread_mutex_unlock(&dev_lock);
	if (num_devices)
		*num_devices = got;
	return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
	return device ? device->name : NULL;
}

__be64 ibv_get_device_guid(struct ibv_device *device)
{
	return device ? htobe64(((struct sv_device *)device)->guid) : 0;
}

int ibv_get_device_index(struct ibv_device *device)
{
	return device ? (int)((struct sv_device *)device)->index : -1;
}

/* SOFTVERBS_PCAP's file, opened once for the process ({pid} becomes its id):
 * the first device tapped has the device write the pcap header, the others
 * append to it. */
static pthread_mutex_t pcap_lock = PTHREAD_MUTEX_INITIALIZER;
static int pcap_fd = -1, pcap_headed;

static int open_pcap(const char *spec)
{
	char path[PATH_MAX];
	size_t n = 0;
	for (const char *s = spec; *s && n + 24 < sizeof(path); s++) {
		if (!strncmp(s, "{pid}", 5)) {
			n += (size_t)snprintf(path + n, sizeof(path) - n, "%d", (int)getpid());
			s += 4;
		} else {
			path[n++] = *s;
		}
	}
	path[n] = 0;
	pcap_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (pcap_fd >= 0)
		return 0;
	int err = errno;
	fprintf(stderr, "softverbs: SOFTVERBS_PCAP: cannot write %s: %s\n", path, strerror(err));
	return err;
}

static int tap_device(uint32_t ctx, const char *spec)
{
	char reply[8];
	pthread_mutex_lock(&pcap_lock);
	int err = pcap_fd < 0 ? open_pcap(spec) : 0;
	if (!err) {
		struct sv_capture_req req = {.ctx = ctx,
					     .flags = pcap_headed ? SV_CAPTURE_APPEND : 0};
		err = sv_call(SV_OP_CAPTURE, &req, sizeof(req), &pcap_fd, 1, reply, sizeof(reply),
			      NULL, NULL);
		pcap_headed |= !err;
	}
	pthread_mutex_unlock(&pcap_lock);
	return err;
}

/* SOFTVERBS_FAULTS and SOFTVERBS_PCAP apply to a C program as to a Python one
 * (docs/environment.md): the device drops, delays or corrupts what this
 * program's QPs send by those rules, and writes every frame of the device to
 * the file. */
static int apply_environment(uint32_t ctx)
{
	char none[1];
	const char *rules = getenv("SOFTVERBS_FAULTS");
	if (rules && *rules) {
		size_t n = strlen(rules);
		char *req = malloc(sizeof(struct sv_ctx) + n);
		if (!req)
			return ENOMEM;
		struct sv_ctx c = {.ctx = ctx};
		memcpy(req, &c, sizeof(c));
		memcpy(req + sizeof(c), rules, n);
		int err = sv_call(SV_OP_FAULTS, req, sizeof(c) + n, NULL, 0, none, 0, NULL, NULL);
		free(req);
		if (err) {
			fprintf(stderr, "softverbs: SOFTVERBS_FAULTS: %s\n", sv_last_error());
			return err;
		}
	}
	const char *spec = getenv("SOFTVERBS_PCAP");
	return spec && *spec ? tap_device(ctx, spec) : 0;
}

/* The opened contexts of this process, which ibv_import_device finds by their
 * cmd_fd's file. */
static pthread_mutex_t homes_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sv_context *homes;

/* A context's ops and fields, opened or imported. */
static void init_context(struct sv_context *ctx, struct ibv_device *device, int cmd_fd,
			 int async_fd)
{
	pthread_mutex_init(&ctx->map_lock, NULL);
	struct ibv_context *c = &ctx->vctx.context;
	c->device = device;
	c->cmd_fd = cmd_fd;
	c->async_fd = async_fd;
	c->num_comp_vectors = 1;
	pthread_mutex_init(&c->mutex, NULL);
	c->abi_compat = __VERBS_ABI_IS_EXTENDED;
	ctx->vctx.sz = sizeof(ctx->vctx);
	sv_set_ops(ctx);
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	if (!device)
		return sv_fail_null(EINVAL);
	/* The context's command descriptor, as /dev/infiniband/uverbsN's on rdma-core:
	 * a file of its own (an empty memfd) whose duplicate ibv_import_device takes. */
	int cmd_fd = memfd_create("softverbs-cmd", MFD_CLOEXEC);
	struct stat st;
	if (cmd_fd < 0 || fstat(cmd_fd, &st)) {
		if (cmd_fd >= 0)
			close(cmd_fd);
		return NULL;
	}
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
		close(cmd_fd);
		return NULL;
	}
	struct sv_open_device req;
	memset(&req, 0, sizeof(req));
	snprintf(req.name, sizeof(req.name), "%s", device->name);
	struct sv_open_device_reply rep;
	int err = sv_call(SV_OP_OPEN_DEVICE, &req, sizeof(req), &sv[1], 1, &rep, sizeof(rep),
			  NULL, NULL);
	close(sv[1]);
	if (!err) {
		err = apply_environment(rep.ctx);
		if (err)
			sv_destroy(SV_KIND_CTX, rep.ctx);
	}
	if (err) {
		close(sv[0]);
		close(cmd_fd);
		return sv_fail_null(err);
	}
	struct sv_context *ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		close(sv[0]);
		close(cmd_fd);
		sv_destroy(SV_KIND_CTX, rep.ctx);
		return sv_fail_null(ENOMEM);
	}
	ctx->handle = rep.ctx;
	ctx->forks = __atomic_load_n(&sv_forks, __ATOMIC_RELAXED);
	ctx->home = ctx;
	ctx->fd_dev = st.st_dev;
	ctx->fd_ino = st.st_ino;
	init_context(ctx, device, cmd_fd, sv[0]);
	pthread_mutex_lock(&homes_lock);
	ctx->next = homes;
	homes = ctx;
	pthread_mutex_unlock(&homes_lock);
	return &ctx->vctx.context;
}

/* ibv_import_device: a second context on the device context whose cmd_fd
 * ``cmd_fd`` duplicates, taking the descriptor over (ibv_close_device closes
 * it).  Handles of the one name the same objects in the other (ibv_import_pd
 * and the rest, verbs.c).  A forked child may import a context its parent
 * opened, as it may import the uverbs file it inherited (conn.c: it shares
 * the parent's objects); a descriptor that is not a context's is EINVAL. */
struct ibv_context *ibv_import_device(int cmd_fd)
{
	struct stat st;
	if (fstat(cmd_fd, &st))
		return NULL;	/* errno EBADF */
	pthread_mutex_lock(&homes_lock);
	struct sv_context *home = homes;
	while (home && (home->fd_dev != st.st_dev || home->fd_ino != st.st_ino))
		home = home->next;
	int err = !home ? EINVAL : 0;
	int async_fd = err ? -1 : fcntl(home->vctx.context.async_fd, F_DUPFD_CLOEXEC, 0);
	struct sv_context *ctx = err || async_fd < 0 ? NULL : calloc(1, sizeof(*ctx));
	if (ctx) {
		ctx->handle = home->handle;
		ctx->home = home;
		home->imports++;
		init_context(ctx, home->vctx.context.device, cmd_fd, async_fd);
	} else if (!err) {
		err = async_fd < 0 ? errno : ENOMEM;
		if (async_fd >= 0)
			close(async_fd);
	}
	pthread_mutex_unlock(&homes_lock);
	return ctx ? &ctx->vctx.context : sv_fail_null(err);
}

/* The device context goes when its home and every import of it are closed --
 * in the process that opened it.  A forked child closing its copy drops only
 * its own hold, as closing an inherited uverbs descriptor does: the parent's
 * context lives on (and goes with the owner's last process otherwise). */
static void free_home(struct sv_context *home)
{
	struct sv_context **p = &homes;
	while (*p != home)
		p = &(*p)->next;
	*p = home->next;
	struct sv_destroy d = {.kind = SV_KIND_CTX, .handle = home->handle, .flags = 1};
	char none[1];
	if (home->forks == __atomic_load_n(&sv_forks, __ATOMIC_RELAXED))
		sv_call(SV_OP_DESTROY, &d, sizeof(d), NULL, 0, none, 0, NULL, NULL);
	sv_dm_pool_free(home->dm_pool);
	free(home->map);
	free(home);
}

int ibv_close_device(struct ibv_context *context)
{
	if (!context)
		return EINVAL;
	struct sv_context *ctx = sv_ctx(context), *home = ctx->home;
	close(context->async_fd);
	if (context->cmd_fd >= 0)
		close(context->cmd_fd);
	pthread_mutex_lock(&homes_lock);
	if (ctx != home) {
		free(ctx);
		home->imports--;
	} else {
		home->closed = 1;
	}
	if (home->closed && !home->imports)
		free_home(home);
	pthread_mutex_unlock(&homes_lock);
	return 0;
}

/* --- queries ------------------------------------------------------------------------- */

static int query_device(struct ibv_context *context, struct ibv_device_attr *attr,
			struct sv_device_attrs *out)
{
	struct sv_ctx req = {.ctx = sv_ctx(context)->handle};
	struct sv_device_attrs a;
	int err = sv_call(SV_OP_QUERY_DEVICE, &req, sizeof(req), NULL, 0, &a, sizeof(a), NULL, NULL);
	if (err)
		return err;
	if (out)
		*out = a;
	memset(attr, 0, sizeof(*attr));
	memcpy(attr->fw_ver, a.fw_ver, sizeof(attr->fw_ver));
	attr->fw_ver[sizeof(attr->fw_ver) - 1] = 0;
	attr->node_guid = htobe64(a.node_guid);
	attr->sys_image_guid = htobe64(a.sys_image_guid);
	attr->max_mr_size = a.max_mr_size;
	attr->page_size_cap = a.page_size_cap;
	attr->vendor_id = a.vendor_id;
	attr->vendor_part_id = a.vendor_part_id;
	attr->hw_ver = a.hw_ver;
	attr->max_qp = (int)a.max_qp;
	attr->max_qp_wr = (int)a.max_qp_wr;
	attr->device_cap_flags = a.device_cap_flags;
	attr->max_sge = (int)a.max_sge;
	attr->max_sge_rd = (int)a.max_sge_rd;
	attr->max_cq = (int)a.max_cq;
	attr->max_cqe = (int)a.max_cqe;
	attr->max_mr = (int)a.max_mr;
	attr->max_pd = (int)a.max_pd;
	attr->max_qp_rd_atom = (int)a.max_qp_rd_atom;
	attr->max_ee_rd_atom = (int)a.max_ee_rd_atom;
	attr->max_res_rd_atom = (int)a.max_res_rd_atom;
	attr->max_qp_init_rd_atom = (int)a.max_qp_init_rd_atom;
	attr->max_ee_init_rd_atom = (int)a.max_ee_init_rd_atom;
	attr->atomic_cap = (enum ibv_atomic_cap)a.atomic_cap;
	attr->max_ee = (int)a.max_ee;
	attr->max_rdd = (int)a.max_rdd;
	attr->max_mw = (int)a.max_mw;
	attr->max_raw_ipv6_qp = (int)a.max_raw_ipv6_qp;
	attr->max_raw_ethy_qp = (int)a.max_raw_ethy_qp;
	attr->max_mcast_grp = (int)a.max_mcast_grp;
	attr->max_mcast_qp_attach = (int)a.max_mcast_qp_attach;
	attr->max_total_mcast_qp_attach = (int)a.max_total_mcast_qp_attach;
	attr->max_ah = (int)a.max_ah;
	attr->max_fmr = (int)a.max_fmr;
	attr->max_map_per_fmr = (int)a.max_map_per_fmr;
	attr->max_srq = (int)a.max_srq;
	attr->max_srq_wr = (int)a.max_srq_wr;
	attr->max_srq_sge = (int)a.max_srq_sge;
	attr->max_pkeys = (uint16_t)a.max_pkeys;
	attr->local_ca_ack_delay = (uint8_t)a.local_ca_ack_delay;
	attr->phys_port_cnt = (uint8_t)a.phys_port_cnt;
	return 0;
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	return query_device(context, attr, NULL);
}

/* ibv_query_device_ex's provider half: the legacy attributes and the extended
 * ones the device reports (on-demand paging, device memory, the 64-bit
 * capability flags, the port count).  The rest -- TSO, RSS, packet pacing, tag
 * matching, CQ moderation, PCI atomics, a completion timestamp clock -- are
 * features this library does not offer: 0, as rdma-core reports them for
 * such a device.  Like rdma-core, fills at most ``attr_size`` bytes (a program
 * built against an older, shorter struct). */
int sv_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
		       struct ibv_device_attr_ex *attr, size_t attr_size)
{
	if (input && input->comp_mask)
		return EINVAL;
	if (attr_size < sizeof(attr->orig_attr) + sizeof(attr->comp_mask))
		return EINVAL;
	struct ibv_device_attr_ex ex;
	struct sv_device_attrs a;
	memset(&ex, 0, sizeof(ex));
	int err = query_device(context, &ex.orig_attr, &a);
	if (err)
		return err;
	ex.odp_caps.general_caps = a.odp_general_caps;
	ex.odp_caps.per_transport_caps.rc_odp_caps = a.odp_rc_caps;
	ex.odp_caps.per_transport_caps.uc_odp_caps = a.odp_uc_caps;
	ex.odp_caps.per_transport_caps.ud_odp_caps = a.odp_ud_caps;
	ex.xrc_odp_caps = a.odp_xrc_caps;
	ex.device_cap_flags_ex = a.device_cap_flags_ex;
	ex.max_dm_size = a.max_dm_size;
	ex.phys_port_cnt_ex = a.phys_port_cnt;
	memcpy(attr, &ex, attr_size < sizeof(ex) ? attr_size : sizeof(ex));
	return 0;
}

static int query_port(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr)
{
	struct sv_query_port req = {.ctx = sv_ctx(context)->handle, .port = port};
	struct sv_port_attrs a;
	int err = sv_call(SV_OP_QUERY_PORT, &req, sizeof(req), NULL, 0, &a, sizeof(a), NULL, NULL);
	if (err)
		return err;
	memset(attr, 0, sizeof(*attr));
	attr->state = (enum ibv_port_state)a.state;
	attr->max_mtu = (enum ibv_mtu)a.max_mtu;
	attr->active_mtu = (enum ibv_mtu)a.active_mtu;
	attr->gid_tbl_len = (int)a.gid_tbl_len;
	attr->port_cap_flags = a.port_cap_flags;
	attr->max_msg_sz = (uint32_t)(a.max_msg_sz > UINT32_MAX ? UINT32_MAX : a.max_msg_sz);
	attr->bad_pkey_cntr = a.bad_pkey_cntr;
	attr->qkey_viol_cntr = a.qkey_viol_cntr;
	attr->pkey_tbl_len = (uint16_t)a.pkey_tbl_len;
	attr->lid = (uint16_t)a.lid;
	attr->sm_lid = (uint16_t)a.sm_lid;
	attr->lmc = (uint8_t)a.lmc;
	attr->max_vl_num = (uint8_t)a.max_vl_num;
	attr->sm_sl = (uint8_t)a.sm_sl;
	attr->subnet_timeout = (uint8_t)a.subnet_timeout;
	attr->init_type_reply = (uint8_t)a.init_type_reply;
	attr->active_width = (uint8_t)a.active_width;
	attr->active_speed = (uint8_t)a.active_speed;
	attr->phys_state = (uint8_t)a.phys_state;
	attr->link_layer = (uint8_t)a.link_layer;
	attr->flags = (uint8_t)a.flags;
	attr->port_cap_flags2 = (uint16_t)a.port_cap_flags2;
	return 0;
}

/* verbs_context.query_port: what ibv_query_port() in verbs.h calls. */
int sv_query_port(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr,
		  size_t len)
{
	struct ibv_port_attr full;
	int err = query_port(context, port, &full);
	if (!err)
		memcpy(attr, &full, len < sizeof(full) ? len : sizeof(full));
	return err;
}

/* The exported symbol, for programs built before the extensible query_port:
 * the old struct is the new one up to link_layer. */
#undef ibv_query_port
int ibv_query_port(struct ibv_context *context, uint8_t port_num,
		   struct _compat_ibv_port_attr *port_attr)
{
	return sv_query_port(context, port_num, (struct ibv_port_attr *)port_attr,
			     offsetof(struct ibv_port_attr, link_layer) + 1);
}

static int query_gid(struct ibv_context *context, uint8_t port, unsigned index,
		     struct sv_query_gid_reply *rep)
{
	struct sv_query_gid req = {.ctx = sv_ctx(context)->handle, .port = port, .index = index};
	int err = sv_call(SV_OP_QUERY_GID, &req, sizeof(req), NULL, 0, rep, sizeof(*rep), NULL, NULL);
	if (err == ENODATA) {	/* an empty entry reads as zeros, as in sysfs */
		memset(rep, 0, sizeof(*rep));
		return 0;
	}
	return err;
}

int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	struct sv_query_gid_reply rep;
	if (index < 0)
		return errno = EINVAL, -1;
	int err = query_gid(context, port_num, (unsigned)index, &rep);
	if (err)
		return errno = err, -1;
	memcpy(gid->raw, rep.gid, sizeof(gid->raw));
	return 0;
}

int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       enum ibv_gid_type_sysfs *type)
{
	struct sv_query_gid_reply rep;
	int err = query_gid(context, port_num, index, &rep);
	if (err)
		return errno = err, -1;
	*type = rep.gid_type == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2
						      : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
	return 0;
}

int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
		      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct sv_query_gid_reply rep;
	if (flags || entry_size < sizeof(*entry))
		return EINVAL;
	struct sv_query_gid req = {.ctx = sv_ctx(context)->handle, .port = port_num,
				   .index = gid_index};
	int err = sv_call(SV_OP_QUERY_GID, &req, sizeof(req), NULL, 0, &rep, sizeof(rep), NULL,
			  NULL);
	if (err)
		return err;
	memset(entry, 0, sizeof(*entry));
	memcpy(entry->gid.raw, rep.gid, sizeof(entry->gid.raw));
	entry->gid_index = gid_index;
	entry->port_num = port_num;
	entry->gid_type = rep.gid_type;
	entry->ndev_ifindex = rep.ifindex;
	return 0;
}

/* ibv_query_gid_table: every valid GID of every port (a soft device's table has
 * no holes: it ends at the first index the device does not have). */
ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
			     size_t max_entries, uint32_t flags, size_t entry_size)
{
	if (!context || flags || entry_size < sizeof(*entries))
		return -EINVAL;
	struct ibv_port_attr pattr;
	size_t n = 0;
	for (uint32_t port = 1; port <= 255; port++) {
		if (query_port(context, (uint8_t)port, &pattr))
			break;
		for (uint32_t i = 0; i < (uint32_t)pattr.gid_tbl_len; i++) {
			if (n == max_entries)
				return -EINVAL;	/* rdma-core: the table does not fit */
			struct ibv_gid_entry *e = (void *)((char *)entries + n * entry_size);
			int err = _ibv_query_gid_ex(context, port, i, e, 0, entry_size);
			if (err == ENODATA)
				break;
			if (err)
				return -err;
			n++;
		}
	}
	return (ssize_t)n;
}

int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	struct sv_query_gid req = {.ctx = sv_ctx(context)->handle, .port = port_num,
				   .index = (uint32_t)index};
	struct sv_query_pkey_reply rep;
	int err = sv_call(SV_OP_QUERY_PKEY, &req, sizeof(req), NULL, 0, &rep, sizeof(rep), NULL,
			  NULL);
	if (err)
		return errno = err, -1;
	*pkey = htobe16((uint16_t)rep.pkey);
	return 0;
}

int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	for (int i = 0; i < 128; i++) {
		__be16 p;
		if (ibv_query_pkey(context, port_num, i, &p))
			break;
		if (p == pkey)
			return i;
	}
	errno = ENOENT;
	return -1;
}

/* --- async events ------------------------------------------------------------------- */

int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	char buf[sizeof(struct sv_async_event_record) + 512];
	struct sv_async_event_record rec;
	struct sv_context *ctx = sv_ctx(context);
	void *obj;
	/* An event for an object destroyed since is dropped, as the kernel drops
	 * a destroyed object's unread events: the next one is read instead (or
	 * EAGAIN on a non-blocking fd). */
	do {
		/* no retry on EINTR: a signal ends the wait, as in rdma-core */
		ssize_t n = recv(context->async_fd, buf, sizeof(buf), 0);
		if (n < (ssize_t)sizeof(struct sv_async_event_record)) {
			if (n >= 0)
				errno = n ? EPROTO : ENODEV;	/* the service is gone */
			return -1;
		}
		memcpy(&rec, buf, sizeof(rec));
		obj = NULL;
		if (rec.kind == SV_KIND_QP || rec.kind == SV_KIND_CQ || rec.kind == SV_KIND_SRQ)
			obj = sv_map_get_event(ctx, rec.kind, rec.handle, 0);
		else
			break;
	} while (!obj);
	memset(event, 0, sizeof(*event));
	event->event_type = (enum ibv_event_type)rec.event_type;
	switch (rec.kind) {
	case SV_KIND_QP:
		event->element.qp = obj;
		break;
	case SV_KIND_CQ:
		event->element.cq = obj;
		break;
	case SV_KIND_SRQ:
		event->element.srq = obj;
		break;
	default:
		event->element.port_num = 1;
	}
	return 0;
}

/* As rdma-core: the acknowledgement a destroy of the event's object waits for. */
void ibv_ack_async_event(struct ibv_async_event *event)
{
	pthread_mutex_t *mutex;
	pthread_cond_t *cond;
	uint32_t *completed;
	switch (event->event_type) {
	case IBV_EVENT_CQ_ERR:
		mutex = &event->element.cq->mutex;
		cond = &event->element.cq->cond;
		completed = &event->element.cq->async_events_completed;
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		mutex = &event->element.qp->mutex;
		cond = &event->element.qp->cond;
		completed = &event->element.qp->events_completed;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		mutex = &event->element.srq->mutex;
		cond = &event->element.srq->cond;
		completed = &event->element.srq->events_completed;
		break;
	default:
		return;
	}
	pthread_mutex_lock(mutex);
	++*completed;
	pthread_cond_signal(cond);
	pthread_mutex_unlock(mutex);
}

/* --- strings -------------------------------------------------------------------------- */

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const str[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};
	if ((unsigned)status >= sizeof(str) / sizeof(str[0]) || !str[status])
		return "unknown";
	return str[status];
}

const char *ibv_node_type_str(enum ibv_node_type node_type)
{
	static const char *const str[] = {
		[IBV_NODE_CA] = "InfiniBand channel adapter",
		[IBV_NODE_SWITCH] = "InfiniBand switch",
		[IBV_NODE_ROUTER] = "InfiniBand router",
		[IBV_NODE_RNIC] = "iWARP NIC",
		[IBV_NODE_USNIC] = "usNIC",
		[IBV_NODE_USNIC_UDP] = "usNIC UDP",
		[IBV_NODE_UNSPECIFIED] = "unspecified",
	};
	if ((unsigned)node_type >= sizeof(str) / sizeof(str[0]) || !str[node_type])
		return "unknown";
	return str[node_type];
}

const char *ibv_port_state_str(enum ibv_port_state port_state)
{
	static const char *const str[] = {
		[IBV_PORT_NOP] = "no state change (NOP)",
		[IBV_PORT_DOWN] = "down",
		[IBV_PORT_INIT] = "init",
		[IBV_PORT_ARMED] = "armed",
		[IBV_PORT_ACTIVE] = "active",
		[IBV_PORT_ACTIVE_DEFER] = "active defer",
	};
	if ((unsigned)port_state >= sizeof(str) / sizeof(str[0]))
		return "unknown";
	return str[port_state];
}

const char *ibv_event_type_str(enum ibv_event_type event)
{
	static const char *const str[] = {
		[IBV_EVENT_CQ_ERR] = "CQ error",
		[IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
		[IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
		[IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
		[IBV_EVENT_COMM_EST] = "communication established",
		[IBV_EVENT_SQ_DRAINED] = "send queue drained",
		[IBV_EVENT_PATH_MIG] = "path migrated",
		[IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
		[IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
		[IBV_EVENT_PORT_ACTIVE] = "port active",
		[IBV_EVENT_PORT_ERR] = "port error",
		[IBV_EVENT_LID_CHANGE] = "LID change",
		[IBV_EVENT_PKEY_CHANGE] = "P_Key change",
		[IBV_EVENT_SM_CHANGE] = "SM change",
		[IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
		[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
		[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
		[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
		[IBV_EVENT_GID_CHANGE] = "GID table change",
		[IBV_EVENT_WQ_FATAL] = "WQ fatal",
	};
	if ((unsigned)event >= sizeof(str) / sizeof(str[0]) || !str[event])
		return "unknown";
	return str[event];
}

/* --- rates --------------------------------------------------------------------------- */

static const struct {
	enum ibv_rate rate;
	int mult;
	int mbps;
} rates[] = {
	{IBV_RATE_2_5_GBPS, 1, 2500},	{IBV_RATE_5_GBPS, 2, 5000},
	{IBV_RATE_10_GBPS, 4, 10000},	{IBV_RATE_20_GBPS, 8, 20000},
	{IBV_RATE_30_GBPS, 12, 30000},	{IBV_RATE_40_GBPS, 16, 40000},
	{IBV_RATE_60_GBPS, 24, 60000},	{IBV_RATE_80_GBPS, 32, 80000},
	{IBV_RATE_120_GBPS, 48, 120000}, {IBV_RATE_14_GBPS, 6, 14062},
	{IBV_RATE_56_GBPS, 22, 56250},	{IBV_RATE_112_GBPS, 45, 112500},
	{IBV_RATE_168_GBPS, 67, 168750}, {IBV_RATE_25_GBPS, 10, 25781},
	{IBV_RATE_100_GBPS, 40, 103125}, {IBV_RATE_200_GBPS, 80, 206250},
	{IBV_RATE_300_GBPS, 120, 309375}, {IBV_RATE_28_GBPS, 11, 28125},
	{IBV_RATE_50_GBPS, 20, 53125},	{IBV_RATE_400_GBPS, 160, 425000},
	{IBV_RATE_600_GBPS, 240, 637500},
};

int ibv_rate_to_mult(enum ibv_rate rate)
{
	for (size_t i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
		if (rates[i].rate == rate)
			return rates[i].mult;
	return -1;
}

enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (size_t i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
		if (rates[i].mult == mult)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(enum ibv_rate rate)
{
	for (size_t i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
		if (rates[i].rate == rate)
			return rates[i].mbps;
	return -1;
}

enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (size_t i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
		if (rates[i].mbps == mbps)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

/* --- sysfs and fork: softverbs has neither to offer ------------------------------------- */

int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	(void)dir;
	(void)file;
	(void)buf;
	(void)size;
	errno = ENOENT;	/* a soft device has no sysfs entries; callers skip the field */
	return -1;
}

const char *ibv_get_sysfs_path(void)
{
	return "/sys";
}

int ibv_fork_init(void)
{
	return 0;	/* nothing to protect: the device reads memory through the service */
}

enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}
