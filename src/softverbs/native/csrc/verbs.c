/* The verbs: PDs, MRs, CQs and channels, QPs, SRQs, AHs, XRC domains, and
 * the data path -- posting into the rings and polling CQEs (docs/rings.md).
 *
 * Every object is the service's; this file keeps only what the data path
 * needs in this process (the rings, the application's slot counts) and the
 * structs the program sees.  The service judges every request; the checks
 * here exist to give a program rdma-core's errno at the call, not to decide.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "sv.h"
#include "sv_dv.h"

/* --- handle -> object --------------------------------------------------------------- */

void sv_map_put(struct sv_context *ctx, uint32_t kind, uint32_t handle, void *obj)
{
	ctx = sv_home(ctx);
	pthread_mutex_lock(&ctx->map_lock);
	if (ctx->map_len == ctx->map_cap) {
		size_t cap = ctx->map_cap ? ctx->map_cap * 2 : 16;
		struct sv_map_entry *m = realloc(ctx->map, cap * sizeof(*m));
		if (!m) {
			pthread_mutex_unlock(&ctx->map_lock);
			return;	/* lookups then miss: a CQE frees no slot, an event names NULL */
		}
		ctx->map = m;
		ctx->map_cap = cap;
	}
	ctx->map[ctx->map_len++] = (struct sv_map_entry){handle, kind, obj, 0, 0};
	pthread_mutex_unlock(&ctx->map_lock);
}

/* The entry of (kind, handle) in home's map, or NULL; the caller holds map_lock. */
static struct sv_map_entry *map_find(struct sv_context *home, uint32_t kind, uint32_t handle)
{
	for (size_t i = 0; i < home->map_len; i++)
		if (home->map[i].handle == handle && home->map[i].kind == kind)
			return &home->map[i];
	return NULL;
}

void *sv_map_get(struct sv_context *ctx, uint32_t kind, uint32_t handle)
{
	ctx = sv_home(ctx);
	pthread_mutex_lock(&ctx->map_lock);
	struct sv_map_entry *e = map_find(ctx, kind, handle);
	void *obj = e ? e->obj : NULL;
	pthread_mutex_unlock(&ctx->map_lock);
	return obj;
}

void *sv_map_get_event(struct sv_context *ctx, uint32_t kind, uint32_t handle, int comp)
{
	ctx = sv_home(ctx);
	pthread_mutex_lock(&ctx->map_lock);
	struct sv_map_entry *e = map_find(ctx, kind, handle);
	if (e) {
		if (comp)
			e->comp_events++;
		else
			e->events++;
	}
	void *obj = e ? e->obj : NULL;
	pthread_mutex_unlock(&ctx->map_lock);
	return obj;
}

void sv_map_del(struct sv_context *ctx, uint32_t kind, uint32_t handle, uint32_t *events,
		uint32_t *comp_events)
{
	ctx = sv_home(ctx);
	uint32_t ev = 0, comp = 0;
	pthread_mutex_lock(&ctx->map_lock);
	struct sv_map_entry *e = map_find(ctx, kind, handle);
	if (e) {
		ev = e->events;
		comp = e->comp_events;
		*e = ctx->map[--ctx->map_len];
	}
	pthread_mutex_unlock(&ctx->map_lock);
	if (events)
		*events = ev;
	if (comp_events)
		*comp_events = comp;
}

/* As rdma-core's destroy verbs: wait until the program has acknowledged every
 * event it was handed for the object (ibv_ack_cq_events, ibv_ack_async_event). */
static void wait_acked(pthread_mutex_t *mutex, pthread_cond_t *cond, const uint32_t *completed,
		       uint32_t reported)
{
	pthread_mutex_lock(mutex);
	while (*completed != reported)
		pthread_cond_wait(cond, mutex);
	pthread_mutex_unlock(mutex);
}

/* The two halves of a create verb as one step: the device call that makes
 * the object, then `size` zeroed bytes for this library's side of it.  If
 * that memory cannot be had, the device's new object (its handle in the
 * reply, at *handle) is destroyed again, so a create that fails leaves
 * nothing on the device.  NULL with errno set when either half fails.
 * (handle is not const: it points into rep, which the call fills.) */
static void *call_and_alloc(uint16_t op, const void *req, size_t req_len, const int *fds, int nfds,
			    void *rep, size_t rep_len, uint32_t kind, uint32_t *handle, size_t size)
{
	int err = sv_call(op, req, req_len, fds, nfds, rep, rep_len, NULL, NULL);
	if (err)
		return sv_fail_null(err);
	void *obj = calloc(1, size);
	if (!obj) {
		sv_destroy(kind, *handle);
		return sv_fail_null(ENOMEM);
	}
	return obj;
}

/* --- protection domains and memory regions ------------------------------------------- */

/* A PD, or a parent domain (ibv_alloc_parent_domain): a PD of this library's
 * own that stands for its protection domain -- its handle is that PD's, so
 * whatever is created in it is the device's object of that PD -- and carries
 * a thread domain and the program's pd_context.  softverbs' queues live in the
 * device's shared memory, never in buffers the program allocates, so the
 * parent domain's custom allocators are kept but never called (as on a
 * provider whose buffers are not the program's to place). */
struct sv_pd {
	struct ibv_pd pd;		/* first: the program's */
	struct sv_pd *protection;	/* a parent domain's PD; NULL for a PD */
	struct ibv_td *td;
	unsigned parents;		/* parent domains made on this PD */
};

struct sv_td {
	struct ibv_td td;		/* first: the program's */
	unsigned parents;
};

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	if (!context)
		return sv_fail_null(EINVAL);
	struct sv_ctx req = {.ctx = sv_ctx(context)->handle};
	struct sv_handle rep;
	struct sv_pd *p = call_and_alloc(SV_OP_ALLOC_PD, &req, sizeof(req), NULL, 0,
					 &rep, sizeof(rep), SV_KIND_PD, &rep.handle, sizeof(*p));
	if (!p)
		return NULL;
	p->pd.context = context;
	p->pd.handle = rep.handle;
	sv_map_put(sv_ctx(context), SV_KIND_PD, rep.handle, p);	/* for ibv_import_pd */
	return &p->pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	if (!pd)
		return EINVAL;
	struct sv_pd *p = (struct sv_pd *)pd;
	if (p->protection) {	/* a parent domain: the device never saw it */
		__atomic_sub_fetch(&p->protection->parents, 1, __ATOMIC_RELAXED);
		if (p->td)
			__atomic_sub_fetch(&((struct sv_td *)p->td)->parents, 1, __ATOMIC_RELAXED);
		free(p);
		return 0;
	}
	if (__atomic_load_n(&p->parents, __ATOMIC_RELAXED))
		return EBUSY;	/* as rdma-core's providers: a parent domain still uses it */
	int err = sv_destroy(SV_KIND_PD, pd->handle);
	if (!err) {
		sv_map_del(sv_ctx(pd->context), SV_KIND_PD, pd->handle, NULL, NULL);
		free(p);
	}
	return err;
}

static struct ibv_pd *alloc_parent_domain(struct ibv_context *context,
					  struct ibv_parent_domain_init_attr *attr)
{
	const uint32_t known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			       IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
	if (!attr || !attr->pd || attr->pd->context != context || (attr->comp_mask & ~known) ||
	    (attr->td && attr->td->context != context))
		return sv_fail_null(EINVAL);
	struct sv_pd *protection = (struct sv_pd *)attr->pd;
	if (protection->protection)	/* a parent domain of a parent domain */
		return sv_fail_null(EINVAL);
	if ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) &&
	    (!attr->alloc || !attr->free))
		return sv_fail_null(EINVAL);
	struct sv_pd *p = calloc(1, sizeof(*p));
	if (!p)
		return sv_fail_null(ENOMEM);
	p->pd.context = context;
	p->pd.handle = protection->pd.handle;
	p->protection = protection;
	p->td = attr->td;
	__atomic_add_fetch(&protection->parents, 1, __ATOMIC_RELAXED);
	if (attr->td)
		__atomic_add_fetch(&((struct sv_td *)attr->td)->parents, 1, __ATOMIC_RELAXED);
	return &p->pd;
}

/* A thread domain: a promise that one thread uses the objects of its parent
 * domains, which lets a provider drop locks.  softverbs keeps its locks. */
static struct ibv_td *alloc_td(struct ibv_context *context, struct ibv_td_init_attr *attr)
{
	if (!attr || attr->comp_mask)
		return sv_fail_null(EINVAL);
	struct sv_td *t = calloc(1, sizeof(*t));
	if (!t)
		return sv_fail_null(ENOMEM);
	t->td.context = context;
	return &t->td;
}

static int dealloc_td(struct ibv_td *td)
{
	struct sv_td *t = (struct sv_td *)td;
	if (__atomic_load_n(&t->parents, __ATOMIC_RELAXED))
		return EBUSY;
	free(t);
	return 0;
}

/* --- device memory (ibv_alloc_dm) ----------------------------------------------------------
 *
 * As softverbs' Python verbs have it (softverbs/verbs/dm.py): each context has
 * the device's max_dm_size bytes of device memory, a memfd mapped here and,
 * once registered (ibv_reg_dm_mr), by the device, which is handed the memfd
 * (SV_REG_MR_HAS_FD) as for any region it cannot reach by address.  Allocations
 * are first-fit with the requested alignment (at least a word); copies move
 * whole 32-bit words (EINVAL otherwise) inside the allocation (EFAULT); a DM MR
 * is zero-based (IBV_ACCESS_ZERO_BASED, else EINVAL) and fits in its DM.
 *
 * The pool's allocation table is this process's memory, so after fork() the
 * parent and child would each hand out the same free ranges of the shared
 * memfd.  A forked child therefore allocates from a pool of its own (made on
 * its first ibv_alloc_dm on that context), while the device memory it
 * inherited stays where it is, shared with the parent as a real device's
 * mapping of it would be. */

#define SV_DM_WORD 4
#define SV_MAP_DM_MR 0x101	/* not a device kind: this library's lkey -> struct sv_dm */
#define SV_MAP_DM 0x102		/* not a device kind: ibv_dm.handle -> struct sv_dm */

/* A device memory has no device object, so this library numbers them, per process. */
static uint32_t dm_handles;

struct sv_dm_pool {
	pthread_mutex_t lock;
	unsigned forks;			/* sv_forks in the process that made it */
	struct sv_dm_pool *inherited;	/* a forked child's: the pool before it, still used */
	int fd;
	char *base;
	uint64_t size;
	struct { uint64_t start, length; } *used;
	size_t nused, cap;
};

struct sv_dm {
	struct ibv_dm dm;	/* first: the program's */
	uint64_t start, length;
	unsigned mrs;		/* DM MRs registered on it */
	struct sv_dm_pool *pool;
};

void sv_dm_pool_free(struct sv_dm_pool *pool)
{
	if (!pool)
		return;
	sv_dm_pool_free(pool->inherited);
	munmap(pool->base, pool->size);
	close(pool->fd);
	free(pool->used);
	free(pool);
}

static struct sv_dm_pool *dm_pool(struct sv_context *ctx, uint64_t size)
{
	ctx = sv_home(ctx);
	pthread_mutex_lock(&ctx->map_lock);
	struct sv_dm_pool *pool = ctx->dm_pool;
	unsigned forks = __atomic_load_n(&sv_forks, __ATOMIC_RELAXED);
	if (pool && pool->forks != forks)
		pool = NULL;	/* made before a fork: its table is the parent's too */
	if (!pool && (pool = calloc(1, sizeof(*pool)))) {
		pool->forks = forks;
		pool->inherited = ctx->dm_pool;
		pool->fd = sv_sealed_memfd("softverbs-dm", size);
		pool->size = size;
		pool->base = pool->fd < 0 ? MAP_FAILED
			     : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, pool->fd, 0);
		if (pool->base == MAP_FAILED) {
			if (pool->fd >= 0)
				close(pool->fd);
			free(pool);
			pool = NULL;	/* (the inherited one stays the context's) */
		} else {
			pthread_mutex_init(&pool->lock, NULL);
			ctx->dm_pool = pool;
		}
	}
	pthread_mutex_unlock(&ctx->map_lock);
	return pool;
}

static int dm_reserve(struct sv_dm_pool *pool, uint64_t length, uint32_t log_align,
		      uint64_t *start)
{
	uint64_t align = 1ull << (log_align > 2 ? log_align : 2), pos = 0;
	pthread_mutex_lock(&pool->lock);
	for (int moved = 1; moved;) {	/* first fit: past every allocation it overlaps */
		moved = 0;
		pos = (pos + align - 1) & ~(align - 1);
		for (size_t i = 0; i < pool->nused; i++)
			if (pos < pool->used[i].start + pool->used[i].length &&
			    pool->used[i].start < pos + length) {
				pos = pool->used[i].start + pool->used[i].length;
				moved = 1;
			}
	}
	int err = pos + length > pool->size ? ENOMEM : 0;
	if (!err && pool->nused == pool->cap) {
		size_t cap = pool->cap ? pool->cap * 2 : 8;
		void *grown = realloc(pool->used, cap * sizeof(*pool->used));
		if (grown) {
			pool->used = grown;
			pool->cap = cap;
		} else {
			err = ENOMEM;
		}
	}
	if (!err) {
		pool->used[pool->nused].start = pos;
		pool->used[pool->nused++].length = length;
		memset(pool->base + pos, 0, length);
		*start = pos;
	}
	pthread_mutex_unlock(&pool->lock);
	return err;
}

static int dm_range(const struct sv_dm *d, uint64_t offset, size_t length)
{
	if (offset > d->length || length > d->length - offset)
		return EFAULT;
	if (offset % SV_DM_WORD || length % SV_DM_WORD)
		return EINVAL;
	return 0;
}

static int memcpy_to_dm(struct ibv_dm *dm, uint64_t offset, const void *host, size_t length)
{
	struct sv_dm *d = (struct sv_dm *)dm;
	int err = dm_range(d, offset, length);
	if (!err)
		memcpy(d->pool->base + d->start + offset, host, length);
	return err;
}

static int memcpy_from_dm(void *host, struct ibv_dm *dm, uint64_t offset, size_t length)
{
	struct sv_dm *d = (struct sv_dm *)dm;
	int err = dm_range(d, offset, length);
	if (!err)
		memcpy(host, d->pool->base + d->start + offset, length);
	return err;
}

static struct ibv_dm *alloc_dm(struct ibv_context *context, struct ibv_alloc_dm_attr *attr)
{
	struct ibv_device_attr_ex ex;
	int err = sv_query_device_ex(context, NULL, &ex, sizeof(ex));
	if (err)
		return sv_fail_null(err);
	if (!ex.max_dm_size)
		return sv_fail_null(EOPNOTSUPP);
	if (!attr || attr->comp_mask || attr->log_align_req >= 32 || !attr->length)
		return sv_fail_null(EINVAL);
	if (attr->length > ex.max_dm_size)
		return sv_fail_null(ENOMEM);
	struct sv_dm_pool *pool = dm_pool(sv_ctx(context), ex.max_dm_size);
	struct sv_dm *d = pool ? calloc(1, sizeof(*d)) : NULL;
	if (!d)
		return sv_fail_null(ENOMEM);
	err = dm_reserve(pool, attr->length, attr->log_align_req, &d->start);
	if (err) {
		free(d);
		return sv_fail_null(err);
	}
	d->length = attr->length;
	d->pool = pool;
	d->dm.context = context;
	d->dm.memcpy_to_dm = memcpy_to_dm;
	d->dm.memcpy_from_dm = memcpy_from_dm;
	d->dm.handle = __atomic_add_fetch(&dm_handles, 1, __ATOMIC_RELAXED);
	sv_map_put(sv_ctx(context), SV_MAP_DM, d->dm.handle, d);	/* for ibv_import_dm */
	return &d->dm;
}

static int free_dm(struct ibv_dm *dm)
{
	struct sv_dm *d = (struct sv_dm *)dm;
	struct sv_dm_pool *pool = d->pool;
	if (__atomic_load_n(&d->mrs, __ATOMIC_RELAXED))
		return EBUSY;	/* an MR still uses it */
	pthread_mutex_lock(&pool->lock);
	for (size_t i = 0; i < pool->nused; i++)
		if (pool->used[i].start == d->start) {
			pool->used[i] = pool->used[--pool->nused];
			break;
		}
	pthread_mutex_unlock(&pool->lock);
	sv_map_del(sv_ctx(dm->context), SV_MAP_DM, dm->handle, NULL, NULL);
	free(d);
	return 0;
}

static struct ibv_mr *reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *dm, uint64_t offset,
				size_t length, unsigned int access)
{
	if (!pd || !dm || dm->context != pd->context)
		return sv_fail_null(EINVAL);
	struct sv_dm *d = (struct sv_dm *)dm;
	if (!(access & IBV_ACCESS_ZERO_BASED) || offset > d->length || length > d->length - offset)
		return sv_fail_null(EINVAL);
	struct sv_dm_pool *pool = d->pool;
	struct sv_reg_mr req = {.length = length, .offset = d->start + offset, .pd = pd->handle,
				.access = access, .flags = SV_REG_MR_HAS_FD};
	struct sv_reg_mr_reply rep;
	struct ibv_mr *mr = call_and_alloc(SV_OP_REG_MR, &req, sizeof(req), &pool->fd, 1,
					   &rep, sizeof(rep), SV_KIND_MR, &rep.mr, sizeof(*mr));
	if (!mr)
		return NULL;
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = NULL;	/* zero-based: work requests address it from 0 */
	mr->length = length;
	mr->handle = rep.mr;
	mr->lkey = rep.lkey;
	mr->rkey = rep.rkey;
	__atomic_add_fetch(&d->mrs, 1, __ATOMIC_RELAXED);
	sv_map_put(sv_ctx(pd->context), SV_MAP_DM_MR, mr->lkey, d);
	sv_map_put(sv_ctx(pd->context), SV_KIND_MR, mr->handle, mr);
	return mr;
}

/* --- memory windows ------------------------------------------------------------------
 *
 * The device keeps the window (type, binding, key); this side holds its
 * handle.  A type 1 window is bound with ibv_bind_mw, a type 2 window with an
 * IBV_WR_BIND_MW WR (encode_send); either way the bind is a send WQE whose
 * new rkey the library writes into ibv_mw.rkey once it is posted, as the key
 * the program hands to its peer. */

static struct ibv_mw *alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	if (!pd)
		return sv_fail_null(EINVAL);
	struct sv_alloc_mw req = {.pd = pd->handle, .type = (uint32_t)type};
	struct sv_alloc_mw_reply rep;
	struct ibv_mw *mw = call_and_alloc(SV_OP_ALLOC_MW, &req, sizeof(req), NULL, 0,
					   &rep, sizeof(rep), SV_KIND_MW, &rep.mw, sizeof(*mw));
	if (!mw)
		return NULL;
	mw->context = pd->context;
	mw->pd = pd;
	mw->rkey = rep.rkey;
	mw->handle = rep.mw;
	mw->type = type;
	return mw;
}

static int dealloc_mw(struct ibv_mw *mw)
{
	int err = sv_destroy(SV_KIND_MW, mw->handle);
	if (!err)
		free(mw);
	return err;
}

/* --- on-demand paging MRs and ibv_advise_mr ----------------------------------------------
 *
 * The device reaches a process's memory through its page tables, so a
 * prefetch (ibv_advise_mr) is done here, in the process: each page of the
 * range is read once, which faults it in; PREFETCH_NO_FAULT leaves absent
 * pages alone.  The reading goes through process_vm_readv on this process, so
 * a page that is not mapped (an ODP MR may cover such) is an error skipped,
 * not a SIGSEGV.  advise_mr needs each SGE's MR from its lkey: the ODP MRs are
 * in the context's handle map under a kind of their own, keyed by lkey. */

#define SV_MAP_ODP_MR 0x100	/* not a device kind: this library's lkey -> struct sv_mr */

struct sv_mr {
	struct ibv_mr mr;	/* first: the program's */
	uint64_t iova;
	unsigned access;
	int implicit;
};

static void touch_pages(uint64_t addr, uint64_t length)
{
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	char byte;
	for (uint64_t p = addr & ~(page - 1); p < addr + length; p += page) {
		struct iovec local = {&byte, 1}, remote = {(void *)(uintptr_t)p, 1};
		(void)process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
	}
}

static int advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
		     struct ibv_sge *sg_list, uint32_t num_sge)
{
	if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH &&
	    advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
	    advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
		return EOPNOTSUPP;
	if (flags & ~(uint32_t)IBV_ADVISE_MR_FLAG_FLUSH)
		return EOPNOTSUPP;
	if (!sg_list || !num_sge)
		return EINVAL;
	struct sv_context *ctx = sv_ctx(pd->context);
	for (uint32_t i = 0; i < num_sge; i++) {	/* every SGE checked before any is touched */
		const struct sv_mr *m = sv_map_get(ctx, SV_MAP_ODP_MR, sg_list[i].lkey);
		if (!m || m->mr.pd != pd)
			return EINVAL;	/* not an on-demand paging MR of this PD */
		if (!m->implicit && (sg_list[i].addr < m->iova ||
				     sg_list[i].addr + sg_list[i].length > m->iova + m->mr.length))
			return EINVAL;
	}
	if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
		for (uint32_t i = 0; i < num_sge; i++)
			touch_pages(sg_list[i].addr, sg_list[i].length);
	return 0;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				unsigned int access)
{
	if (!pd)
		return sv_fail_null(EINVAL);
	struct sv_reg_mr req = {.addr = (uintptr_t)addr, .length = length, .iova = iova,
				.pd = pd->handle, .access = access};
	/* rdma-core's implicit on-demand paging MR: no address, SIZE_MAX bytes, the
	 * whole address space (the device pages it in as it is used) */
	if (!addr && length == SIZE_MAX && (access & IBV_ACCESS_ON_DEMAND))
		req.flags = SV_REG_MR_IMPLICIT;
	struct sv_reg_mr_reply rep;
	struct sv_mr *m = call_and_alloc(SV_OP_REG_MR, &req, sizeof(req), NULL, 0,
					 &rep, sizeof(rep), SV_KIND_MR, &rep.mr, sizeof(*m));
	if (!m)
		return NULL;
	struct ibv_mr *mr = &m->mr;
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = addr;
	mr->length = length;
	mr->handle = rep.mr;
	mr->lkey = rep.lkey;
	mr->rkey = rep.rkey;
	m->iova = iova;
	m->access = access;
	m->implicit = req.flags == SV_REG_MR_IMPLICIT;
	if (access & IBV_ACCESS_ON_DEMAND)
		sv_map_put(sv_ctx(pd->context), SV_MAP_ODP_MR, mr->lkey, m);
	sv_map_put(sv_ctx(pd->context), SV_KIND_MR, mr->handle, mr);	/* for ibv_import_mr */
	return mr;
}

#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

#undef ibv_reg_mr_iova
struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
			       int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

/* rdma-core's return codes: IBV_REREG_MR_ERR_INPUT for a bad argument (errno
 * EINVAL), IBV_REREG_MR_ERR_CMD when the device refuses (errno says why). */
int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
		 int access)
{
	const int known = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD |
			  IBV_REREG_MR_CHANGE_ACCESS;
	if (!mr || !flags || (flags & ~known) || ((flags & IBV_REREG_MR_CHANGE_PD) && !pd) ||
	    ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!addr || !length))) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	struct sv_rereg_mr req = {.mr = mr->handle, .change = (uint32_t)flags,
				  .access = (uint32_t)access};
	if (flags & IBV_REREG_MR_CHANGE_PD)
		req.pd = pd->handle;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		req.addr = (uintptr_t)addr;
		req.length = length;
	}
	struct sv_keys rep;
	if (sv_call(SV_OP_REREG_MR, &req, sizeof(req), NULL, 0, &rep, sizeof(rep), NULL, NULL))
		return IBV_REREG_MR_ERR_CMD;
	struct sv_context *ctx = sv_ctx(mr->context);
	struct sv_mr *odp = sv_map_get(ctx, SV_MAP_ODP_MR, mr->lkey);
	if (odp) {	/* re-keyed, and perhaps no longer on demand */
		sv_map_del(ctx, SV_MAP_ODP_MR, mr->lkey, NULL, NULL);
		if (flags & IBV_REREG_MR_CHANGE_ACCESS)
			odp->access = (unsigned)access;
		if (flags & IBV_REREG_MR_CHANGE_TRANSLATION)
			odp->iova = (uintptr_t)addr;
		if (odp->access & IBV_ACCESS_ON_DEMAND)
			sv_map_put(ctx, SV_MAP_ODP_MR, rep.lkey, odp);
	}
	mr->lkey = rep.lkey;
	mr->rkey = rep.rkey;
	if (flags & IBV_REREG_MR_CHANGE_PD)
		mr->pd = pd;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		mr->addr = addr;
		mr->length = length;
	}
	return 0;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	if (!mr)
		return EINVAL;
	int err = sv_destroy(SV_KIND_MR, mr->handle);
	if (!err) {
		struct sv_context *ctx = sv_ctx(mr->context);
		struct sv_dm *d = sv_map_get(ctx, SV_MAP_DM_MR, mr->lkey);
		if (d) {
			__atomic_sub_fetch(&d->mrs, 1, __ATOMIC_RELAXED);
			sv_map_del(ctx, SV_MAP_DM_MR, mr->lkey, NULL, NULL);
		}
		sv_map_del(ctx, SV_MAP_ODP_MR, mr->lkey, NULL, NULL);
		sv_map_del(ctx, SV_KIND_MR, mr->handle, NULL, NULL);
		free(mr);
	}
	return err;
}

/* --- completion channels and CQs ------------------------------------------------------ */

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	if (!context)
		return sv_fail_null(EINVAL);
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv))
		return NULL;
	struct sv_ctx req = {.ctx = sv_ctx(context)->handle};
	struct sv_handle rep;
	int err = sv_call(SV_OP_CREATE_COMP_CHANNEL, &req, sizeof(req), &sv[1], 1, &rep, sizeof(rep),
			  NULL, NULL);
	close(sv[1]);
	struct ibv_comp_channel *ch = err ? NULL : calloc(1, sizeof(*ch) + sizeof(uint32_t));
	if (!ch) {
		close(sv[0]);
		if (!err)
			sv_destroy(SV_KIND_CHANNEL, rep.handle);
		return sv_fail_null(err ? err : ENOMEM);
	}
	ch->context = context;
	ch->fd = sv[0];
	memcpy(ch + 1, &rep.handle, sizeof(uint32_t));	/* the service's handle, after it */
	return ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	if (!channel)
		return EINVAL;
	if (channel->refcnt)
		return EBUSY;
	uint32_t handle;
	memcpy(&handle, channel + 1, sizeof(handle));
	int err = sv_destroy(SV_KIND_CHANNEL, handle);
	if (err)
		return err;
	close(channel->fd);
	free(channel);
	return 0;
}

static void cqx_init(struct sv_cq *cq, uint64_t wc_flags);
static void release(struct sv_context *ctx, const struct sv_cq_entry *e);

static struct sv_cq *create_cq(struct ibv_context *context, int cqe, void *cq_context,
			       struct ibv_comp_channel *channel, int comp_vector)
{
	if (!context || cqe < 1)
		return sv_fail_null(EINVAL);
	struct sv_context *ctx = sv_ctx(context);
	struct sv_cq *cq = calloc(1, sizeof(*cq));
	if (!cq)
		return sv_fail_null(ENOMEM);
	int err = sv_ring_create(&cq->ring, (uint32_t)cqe, SV_RING_CQE_SIZE, "softverbs-cq");
	if (err) {
		free(cq);
		return sv_fail_null(err);
	}
	uint32_t ch = 0;
	if (channel)
		memcpy(&ch, channel + 1, sizeof(ch));
	struct sv_create_cq req = {.ctx = ctx->handle, .cqe = (uint32_t)cqe, .channel = ch,
				   .comp_vector = (uint32_t)comp_vector};
	struct sv_create_cq_reply rep;
	err = sv_call(SV_OP_CREATE_CQ, &req, sizeof(req), &cq->ring.fd, 1, &rep, sizeof(rep), NULL,
		      NULL);
	if (err) {
		sv_ring_destroy(&cq->ring);
		free(cq);
		return sv_fail_null(err);
	}
	cq->ctx = ctx;
	cq->cq.context = context;
	cq->cq.channel = channel;
	cq->cq.cq_context = cq_context;
	cq->cq.handle = rep.cq;
	cq->cq.cqe = (int)rep.cqe;
	pthread_mutex_init(&cq->cq.mutex, NULL);
	pthread_cond_init(&cq->cq.cond, NULL);
	if (channel)
		__atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_RELAXED);
	sv_map_put(ctx, SV_KIND_CQ, rep.cq, &cq->cq);
	return cq;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	struct sv_cq *cq = create_cq(context, cqe, cq_context, channel, comp_vector);
	return cq ? &cq->cq : NULL;
}

/* --- extended CQs (ibv_create_cq_ex): the same CQ, read one field at a time ---------- */

/* the work completion fields softverbs' CQEs carry; a timestamp, flow tag,
 * tag matching or VLAN field cannot be asked for */
#define SV_CQX_WC_FLAGS IBV_WC_STANDARD_FLAGS

static struct ibv_cq_ex *create_cq_ex(struct ibv_context *context,
				      struct ibv_cq_init_attr_ex *attr)
{
	const uint32_t known = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
	if (!attr || (attr->comp_mask & ~known) || attr->cqe > INT32_MAX)
		return sv_fail_null(EINVAL);
	if (attr->wc_flags & ~(uint64_t)SV_CQX_WC_FLAGS)
		return sv_fail_null(EOPNOTSUPP);
	if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	    (attr->flags & ~(uint32_t)IBV_CREATE_CQ_ATTR_SINGLE_THREADED))
		return sv_fail_null(EOPNOTSUPP);
	/* a CQ's PD must be a parent domain (of this context) */
	if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) &&
	    (!attr->parent_domain || attr->parent_domain->context != context ||
	     !((struct sv_pd *)attr->parent_domain)->protection))
		return sv_fail_null(EINVAL);
	struct sv_cq *cq = create_cq(context, (int)attr->cqe, attr->cq_context, attr->channel,
				     (int)attr->comp_vector);
	if (!cq)
		return NULL;
	cqx_init(cq, attr->wc_flags);
	return &cq->cqx;
}

/* The next live CQE at cq->ci, as cq->cur, and the program's wr_id and status;
 * ENOENT when there is none. */
static int cqx_fetch(struct sv_cq *cq)
{
	struct sv_ring *r = &cq->ring;
	uint64_t pi = sv_load(r, SV_RING_CQ_PI);
	while (cq->ci < pi) {
		const struct sv_cq_entry *e = sv_slot(r, cq->ci++);
		if (e->flags & SV_RING_CQE_DEAD)
			continue;
		cq->cur = e;
		cq->cqx.wr_id = e->wr_id;
		cq->cqx.status = (enum ibv_wc_status)e->status;
		return 0;
	}
	cq->cur = NULL;
	return ENOENT;
}

/* Every 4096th poll of a CQ that keeps finding nothing asks whether the device
 * is still there: a peek at the context's event socket, which reads end of file
 * once the service has gone (killed, or crashed).  Its CQ can then never fill,
 * and a program that polls it would spin for ever; ibv_poll_cq fails instead
 * (-1, errno EIO; ibv_start_poll returns EIO), as a provider whose device died
 * does, so the program sees the error and can stop.  Completions already in
 * the ring are still returned first. */
static int service_gone(struct sv_cq *cq)
{
	char c;
	if (cq->empty_polls & 4095)
		return 0;
	return recv(cq->ctx->vctx.context.async_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static int cqx_start_poll(struct ibv_cq_ex *x, struct ibv_poll_cq_attr *attr)
{
	struct sv_cq *cq = (struct sv_cq *)x;
	if (attr && attr->comp_mask)
		return EINVAL;
	if (sv_ring_foreign(&cq->ring))
		return EPERM;
	pthread_mutex_lock(&x->mutex);
	cq->ci = sv_load(&cq->ring, SV_RING_CQ_CI);
	int err = cqx_fetch(cq);
	if (err) {	/* the program does not call end_poll after ENOENT */
		if (++cq->empty_polls >= 64) {
			sched_yield();	/* as poll_cq: let the device run */
			if (service_gone(cq))
				err = EIO;
		}
		pthread_mutex_unlock(&x->mutex);
		return err;
	}
	cq->empty_polls = 0;
	return 0;
}

static int cqx_next_poll(struct ibv_cq_ex *x)
{
	struct sv_cq *cq = (struct sv_cq *)x;
	if (cq->cur)
		release(cq->ctx, cq->cur);
	return cqx_fetch(cq);
}

static void cqx_end_poll(struct ibv_cq_ex *x)
{
	struct sv_cq *cq = (struct sv_cq *)x;
	if (cq->cur)
		release(cq->ctx, cq->cur);
	cq->cur = NULL;
	sv_store(&cq->ring, SV_RING_CQ_CI, cq->ci);
	pthread_mutex_unlock(&x->mutex);
}

static const struct sv_cq_entry *cqx_cur(struct ibv_cq_ex *x)
{
	return ((struct sv_cq *)x)->cur;
}

static enum ibv_wc_opcode cqx_opcode(struct ibv_cq_ex *x)
{
	return (enum ibv_wc_opcode)cqx_cur(x)->opcode;
}

static uint32_t cqx_vendor_err(struct ibv_cq_ex *x)
{
	return cqx_cur(x)->vendor_err;
}

static uint32_t cqx_byte_len(struct ibv_cq_ex *x)
{
	return cqx_cur(x)->byte_len;
}

/* the immediate data, or the invalidated rkey: the CQE's one field for both
 * (protocol.h), and ibv_wc_read_invalidated_rkey is be32toh of this */
static __be32 cqx_imm_data(struct ibv_cq_ex *x)
{
	return htobe32(cqx_cur(x)->imm_data);
}

static uint32_t cqx_qp_num(struct ibv_cq_ex *x)
{
	return cqx_cur(x)->qp_num;
}

static uint32_t cqx_src_qp(struct ibv_cq_ex *x)
{
	return cqx_cur(x)->src_qp;
}

static unsigned int cqx_wc_flags(struct ibv_cq_ex *x)
{
	return cqx_cur(x)->wc_flags;
}

static uint32_t cqx_slid(struct ibv_cq_ex *x)
{
	return cqx_cur(x)->slid;
}

static uint8_t cqx_sl(struct ibv_cq_ex *x)
{
	return cqx_cur(x)->sl;
}

static uint8_t cqx_dlid_path_bits(struct ibv_cq_ex *x)
{
	return cqx_cur(x)->dlid_path_bits;
}

static void cqx_init(struct sv_cq *cq, uint64_t wc_flags)
{
	struct ibv_cq_ex *x = &cq->cqx;
	x->comp_mask = 0;
	x->start_poll = cqx_start_poll;
	x->next_poll = cqx_next_poll;
	x->end_poll = cqx_end_poll;
	x->read_opcode = cqx_opcode;
	x->read_vendor_err = cqx_vendor_err;
	x->read_wc_flags = cqx_wc_flags;
	/* the readers of fields not asked for stay NULL, as rdma-core's providers leave them */
	if (wc_flags & IBV_WC_EX_WITH_BYTE_LEN)
		x->read_byte_len = cqx_byte_len;
	if (wc_flags & IBV_WC_EX_WITH_IMM)
		x->read_imm_data = cqx_imm_data;
	if (wc_flags & IBV_WC_EX_WITH_QP_NUM)
		x->read_qp_num = cqx_qp_num;
	if (wc_flags & IBV_WC_EX_WITH_SRC_QP)
		x->read_src_qp = cqx_src_qp;
	if (wc_flags & IBV_WC_EX_WITH_SLID)
		x->read_slid = cqx_slid;
	if (wc_flags & IBV_WC_EX_WITH_SL)
		x->read_sl = cqx_sl;
	if (wc_flags & IBV_WC_EX_WITH_DLID_PATH_BITS)
		x->read_dlid_path_bits = cqx_dlid_path_bits;
}

int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	if (!ibcq)
		return EINVAL;
	struct sv_cq *cq = (struct sv_cq *)ibcq;
	int err = sv_destroy(SV_KIND_CQ, ibcq->handle);
	if (err)
		return err;
	uint32_t events, comp_events;
	sv_map_del(cq->ctx, SV_KIND_CQ, ibcq->handle, &events, &comp_events);
	wait_acked(&ibcq->mutex, &ibcq->cond, &ibcq->comp_events_completed, comp_events);
	wait_acked(&ibcq->mutex, &ibcq->cond, &ibcq->async_events_completed, events);
	if (ibcq->channel)
		__atomic_sub_fetch(&ibcq->channel->refcnt, 1, __ATOMIC_RELAXED);
	sv_ring_destroy(&cq->ring);
	free(cq);
	return 0;
}

/* A new ring in shared memory; the device moves the CQEs not yet polled into it
 * (at the same indices) and uses it from then on. */
int ibv_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	if (!ibcq || cqe < 1)
		return EINVAL;
	struct sv_cq *cq = (struct sv_cq *)ibcq;
	if (sv_ring_foreign(&cq->ring))
		return EPERM;
	struct sv_ring ring;
	int err = sv_ring_create(&ring, (uint32_t)cqe, SV_RING_CQE_SIZE, "softverbs-cq");
	if (err)
		return err;
	struct sv_resize_cq req = {.cq = ibcq->handle, .cqe = (uint32_t)cqe};
	struct sv_create_cq_reply rep;
	pthread_mutex_lock(&ibcq->mutex);	/* no poll reads the old ring meanwhile */
	err = sv_call(SV_OP_RESIZE_CQ, &req, sizeof(req), &ring.fd, 1, &rep, sizeof(rep), NULL,
		      NULL);
	if (!err) {
		struct sv_ring old = cq->ring;
		cq->ring = ring;
		ibcq->cqe = (int)rep.cqe;
		ring = old;
	}
	pthread_mutex_unlock(&ibcq->mutex);
	sv_ring_destroy(&ring);	/* the old one, or the new one the device refused */
	return err;
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	struct sv_comp_event_record rec;
	struct ibv_cq *c;
	/* An event for a CQ destroyed since is dropped, as the kernel drops a
	 * destroyed CQ's unread events: the next one is read instead.  A signal
	 * ends the wait with EINTR, as rdma-core's plain read() does: programs
	 * such as qperf break a blocked wait with SIGALRM. */
	do {
		ssize_t n = recv(channel->fd, &rec, sizeof(rec), 0);
		if (n != (ssize_t)sizeof(rec)) {
			if (n >= 0)
				errno = n ? EPROTO : ENODEV;	/* the service is gone */
			return -1;
		}
		c = sv_map_get_event(sv_ctx(channel->context), SV_KIND_CQ, rec.cq, 1);
	} while (!c);
	*cq = c;
	*cq_context = c->cq_context;
	return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

static int req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	if (sv_ring_foreign(&((struct sv_cq *)ibcq)->ring))
		return EPERM;
	struct sv_ring *r = &((struct sv_cq *)ibcq)->ring;
	uint64_t seq = (sv_load(r, SV_RING_CQ_ARM) >> 1) + 1;
	sv_store(r, SV_RING_CQ_ARM, seq << 1 | (solicited_only ? 1 : 0));
	/* The arm before the next poll's load of pi: the device stores pi, then loads
	 * arm, so each side needs a full barrier (docs/rings.md, Arming). */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return 0;
}

/* Give a polled CQE's WQE slot back to its ring (docs/rings.md, Polling). */
static void release(struct sv_context *ctx, const struct sv_cq_entry *e)
{
	if (e->wq_kind == SV_RING_WQ_SQ || e->wq_kind == SV_RING_WQ_RQ) {
		struct sv_qp *qp = sv_map_get(ctx, SV_KIND_QP, e->wq_handle);
		if (!qp)
			return;
		int sq = e->wq_kind == SV_RING_WQ_SQ;
		struct sv_ring *ring = sq ? &qp->sq : &qp->rq;
		uint64_t *ci = sq ? &qp->sq_ci : &qp->rq_ci;
		uint64_t pi = sv_load(ring, SV_RING_SQ_PI);
		uint64_t index = pi - ((pi - e->wqe_index) & 0xFFFFFFFFu);
		uint64_t cur = __atomic_load_n(ci, __ATOMIC_RELAXED);
		while (index >= cur &&
		       !__atomic_compare_exchange_n(ci, &cur, index + 1, 0, __ATOMIC_RELEASE,
						    __ATOMIC_RELAXED))
			;
	} else if (e->wq_kind == SV_RING_WQ_SRQ) {
		struct sv_srq *srq = sv_map_get(ctx, SV_KIND_SRQ, e->wq_handle);
		if (srq)
			__atomic_add_fetch(&srq->released, 1, __ATOMIC_RELEASE);
	}
}

/* Move up to num_entries CQEs into wc; the caller holds the CQ's mutex. */
static int take_cqes(struct sv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	struct sv_ring *r = &cq->ring;
	uint64_t ci = sv_load(r, SV_RING_CQ_CI);
	uint64_t pi = sv_load(r, SV_RING_CQ_PI);
	int n = 0;
	while (ci < pi && n < num_entries) {
		const struct sv_cq_entry *e = sv_slot(r, ci);
		ci++;
		if (e->flags & SV_RING_CQE_DEAD)
			continue;
		struct ibv_wc *w = &wc[n++];
		memset(w, 0, sizeof(*w));
		w->wr_id = e->wr_id;
		w->status = (enum ibv_wc_status)e->status;
		w->opcode = (enum ibv_wc_opcode)e->opcode;
		w->vendor_err = e->vendor_err;
		w->byte_len = e->byte_len;
		w->imm_data = (e->wc_flags & IBV_WC_WITH_INV) ? e->imm_data : htobe32(e->imm_data);
		w->qp_num = e->qp_num;
		w->src_qp = e->src_qp;
		w->wc_flags = e->wc_flags;
		w->pkey_index = e->pkey_index;
		w->slid = e->slid;
		w->sl = e->sl;
		w->dlid_path_bits = e->dlid_path_bits;
		release(cq->ctx, e);
	}
	sv_store(r, SV_RING_CQ_CI, ci);
	return n;
}

static int poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc)
{
	struct sv_cq *cq = (struct sv_cq *)ibcq;
	if (sv_ring_foreign(&cq->ring)) {
		errno = EPERM;
		return -1;
	}
	pthread_mutex_lock(&ibcq->mutex);
	int n = take_cqes(cq, num_entries, wc);
	/* The device is a process on the same CPUs: a program that spins on an empty
	 * CQ must let it run, or a busy-polling pair of processes starves it (on two
	 * cores an RC ping-pong took 3.5 ms a round instead of 0.3).  The ring is
	 * read again after the yield: "empty" must be the state when poll returns,
	 * not a time slice before, or a program that polls its CQ and then reads
	 * its CM events sees a disconnect that came after a completion it was told
	 * was not there (libfabric's RXM then lost or mishandled that completion). */
	if (n == 0 && ++cq->empty_polls >= 64) {
		sched_yield();
		n = take_cqes(cq, num_entries, wc);
		if (n == 0 && service_gone(cq)) {
			pthread_mutex_unlock(&ibcq->mutex);
			errno = EIO;
			return -1;
		}
	}
	if (n)
		cq->empty_polls = 0;
	pthread_mutex_unlock(&ibcq->mutex);
	return n;
}

/* --- QPs: creation and state --------------------------------------------------------- */

/* a send flag of this library's own, on the WR ibv_bind_mw posts: "this binds
 * a type 1 window" (IBV_WR_BIND_MW WRs of the program bind type 2 ones) */
#define SV_SEND_TYPE1_BIND (1u << 31)

static int send_flags_of(unsigned flags)
{
	return ((flags & IBV_SEND_SIGNALED) ? SV_RING_F_SIGNALED : 0) |
	       ((flags & IBV_SEND_FENCE) ? SV_RING_F_FENCE : 0) |
	       ((flags & IBV_SEND_SOLICITED) ? SV_RING_F_SOLICITED : 0);
}

static void qpx_init(struct sv_qp *qp);

/* dv_flags: the provider's create flags (CreateQP.dv_flags); dv_size: bytes of
 * the provider's own state, zeroed, freed with the QP (sv_dv_create_qp). */
static struct ibv_qp *create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr,
				uint32_t dv_flags, size_t dv_size)
{
	struct sv_context *ctx = sv_ctx(context);
	enum ibv_qp_type type = attr->qp_type;
	int xrc = type == IBV_QPT_XRC_SEND || type == IBV_QPT_XRC_RECV;
	size_t base = (sizeof(struct sv_qp) + 15) & ~(size_t)15;
	struct sv_qp *qp = calloc(1, base + dv_size);
	if (!qp)
		return sv_fail_null(ENOMEM);
	qp->dv = dv_size ? (char *)qp + base : NULL;
	qp->has_sq = type != IBV_QPT_XRC_RECV;
	qp->has_rq = !xrc && !attr->srq;
	struct ibv_qp_cap *cap = &attr->cap;
	uint32_t sq_slot = sv_send_slot_size(cap->max_send_sge, cap->max_inline_data);
	uint32_t rq_slot = sv_recv_slot_size(cap->max_recv_sge);
	int fds[2], nfds = 0, err = 0;
	qp->sq.fd = qp->rq.fd = -1;
	if (qp->has_sq) {
		/* a queue of 0 WRs still has a ring of one slot (rings.ring_slots);
		 * every post to it finds it full */
		err = sv_ring_create(&qp->sq, cap->max_send_wr ? cap->max_send_wr : 1, sq_slot,
				     "softverbs-sq");
		fds[nfds++] = qp->sq.fd;
	}
	if (!err && qp->has_rq) {
		err = sv_ring_create(&qp->rq, cap->max_recv_wr ? cap->max_recv_wr : 1, rq_slot,
				     "softverbs-rq");
		fds[nfds++] = qp->rq.fd;
	}
	if (err)
		goto fail;
	struct sv_create_qp req = {
		.send_ops_flags = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
					  ? attr->send_ops_flags : 0,
		.caps = {cap->max_send_wr, cap->max_recv_wr, cap->max_send_sge, cap->max_recv_sge,
			 cap->max_inline_data, 0},
		.ctx = ctx->handle,
		.pd = attr->pd ? attr->pd->handle : 0,
		.qp_type = type,
		.send_cq = attr->send_cq ? attr->send_cq->handle : 0,
		.recv_cq = attr->recv_cq ? attr->recv_cq->handle : 0,
		.srq = attr->srq ? attr->srq->handle : 0,
		.xrcd = (attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) && attr->xrcd
				? sv_xrcd_handle(attr->xrcd) : 0,
		.sq_sig_all = attr->sq_sig_all ? 1 : 0,
		.create_flags = (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS)
					? attr->create_flags : 0,
		.sq_slot = qp->has_sq ? sq_slot : 0,
		.rq_slot = qp->has_rq ? rq_slot : 0,
		.dv_flags = dv_flags,
	};
	struct sv_create_qp_reply rep;
	err = sv_call(SV_OP_CREATE_QP, &req, sizeof(req), fds, nfds, &rep, sizeof(rep), NULL, NULL);
	if (err)
		goto fail;
	/* as rdma-core: the capabilities the device gave are written back */
	cap->max_send_wr = rep.caps.max_send_wr;
	cap->max_recv_wr = rep.caps.max_recv_wr;
	cap->max_send_sge = rep.caps.max_send_sge;
	cap->max_recv_sge = rep.caps.max_recv_sge;
	cap->max_inline_data = rep.caps.max_inline_data;
	qp->cap = *cap;
	qp->sq_sig_all = attr->sq_sig_all;
	qp->ctx = ctx;
	pthread_spin_init(&qp->sq_lock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&qp->rq_lock, PTHREAD_PROCESS_PRIVATE);
	struct ibv_qp *q = &qp->qpx.qp_base;
	q->context = context;
	q->qp_context = attr->qp_context;
	q->pd = attr->pd;
	q->send_cq = attr->send_cq;
	q->recv_cq = attr->recv_cq;
	q->srq = attr->srq;
	q->handle = rep.qp;
	q->qp_num = rep.qpn;
	q->state = IBV_QPS_RESET;
	q->qp_type = type;
	pthread_mutex_init(&q->mutex, NULL);
	pthread_cond_init(&q->cond, NULL);
	if (req.send_ops_flags || dv_size)
		qpx_init(qp);
	sv_map_put(ctx, SV_KIND_QP, rep.qp, qp);
	if (qp->has_sq)
		sv_bell_queues(1);
	return q;
fail:
	sv_ring_destroy(&qp->sq);
	sv_ring_destroy(&qp->rq);
	free(qp);
	return sv_fail_null(err);
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	if (!pd || !qp_init_attr)
		return sv_fail_null(EINVAL);
	struct ibv_qp_init_attr_ex ex;
	memset(&ex, 0, sizeof(ex));
	memcpy(&ex, qp_init_attr, sizeof(*qp_init_attr));
	ex.comp_mask = IBV_QP_INIT_ATTR_PD;
	ex.pd = pd;
	struct ibv_qp *qp = create_qp(pd->context, &ex, 0, 0);
	if (qp)
		qp_init_attr->cap = ex.cap;
	return qp;
}

static struct ibv_qp *create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr)
{
	uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD |
			 IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	if (!attr || attr->comp_mask & ~known)
		return sv_fail_null(attr ? EOPNOTSUPP : EINVAL);
	return create_qp(context, attr, 0, 0);
}

int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	if (!ibqp)
		return EINVAL;
	struct sv_qp *qp = (struct sv_qp *)ibqp;
	int err = sv_destroy(SV_KIND_QP, ibqp->handle);
	if (err)
		return err;
	uint32_t events;
	sv_map_del(qp->ctx, SV_KIND_QP, ibqp->handle, &events, NULL);
	wait_acked(&ibqp->mutex, &ibqp->cond, &ibqp->events_completed, events);
	if (qp->has_sq)
		sv_bell_queues(-1);
	sv_ring_destroy(&qp->sq);
	sv_ring_destroy(&qp->rq);
	free(qp);
	return 0;
}

static void av_to_wire(const struct ibv_ah_attr *a, struct sv_address_vector *v)
{
	memset(v, 0, sizeof(*v));
	memcpy(v->dgid, a->grh.dgid.raw, sizeof(v->dgid));
	v->dlid = a->dlid;
	v->sl = a->sl;
	v->src_path_bits = a->src_path_bits;
	v->static_rate = a->static_rate;
	v->is_global = a->is_global;
	v->port_num = a->port_num;
	v->flow_label = a->grh.flow_label;
	v->sgid_index = a->grh.sgid_index;
	v->hop_limit = a->grh.hop_limit;
	v->traffic_class = a->grh.traffic_class;
}

static void av_from_wire(const struct sv_address_vector *v, struct ibv_ah_attr *a)
{
	memset(a, 0, sizeof(*a));
	memcpy(a->grh.dgid.raw, v->dgid, sizeof(v->dgid));
	a->dlid = (uint16_t)v->dlid;
	a->sl = (uint8_t)v->sl;
	a->src_path_bits = (uint8_t)v->src_path_bits;
	a->static_rate = (uint8_t)v->static_rate;
	a->is_global = (uint8_t)v->is_global;
	a->port_num = (uint8_t)v->port_num;
	a->grh.flow_label = v->flow_label;
	a->grh.sgid_index = (uint8_t)v->sgid_index;
	a->grh.hop_limit = (uint8_t)v->hop_limit;
	a->grh.traffic_class = (uint8_t)v->traffic_class;
}

static void attrs_to_wire(const struct ibv_qp_attr *a, struct sv_qp_attrs *w)
{
	memset(w, 0, sizeof(*w));
	av_to_wire(&a->ah_attr, &w->ah);
	av_to_wire(&a->alt_ah_attr, &w->alt_ah);
	w->qp_state = a->qp_state;
	w->cur_qp_state = a->cur_qp_state;
	w->path_mtu = a->path_mtu;
	w->path_mig_state = a->path_mig_state;
	w->qkey = a->qkey;
	w->rq_psn = a->rq_psn;
	w->sq_psn = a->sq_psn;
	w->dest_qp_num = a->dest_qp_num;
	w->qp_access_flags = a->qp_access_flags;
	w->pkey_index = a->pkey_index;
	w->alt_pkey_index = a->alt_pkey_index;
	w->en_sqd_async_notify = a->en_sqd_async_notify;
	w->sq_draining = a->sq_draining;
	w->max_rd_atomic = a->max_rd_atomic;
	w->max_dest_rd_atomic = a->max_dest_rd_atomic;
	w->min_rnr_timer = a->min_rnr_timer;
	w->port_num = a->port_num;
	w->timeout = a->timeout;
	w->retry_cnt = a->retry_cnt;
	w->rnr_retry = a->rnr_retry;
	w->alt_port_num = a->alt_port_num;
	w->alt_timeout = a->alt_timeout;
	w->rate_limit = a->rate_limit;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	if (!qp || !attr)
		return EINVAL;
	struct sv_modify_qp req;
	attrs_to_wire(attr, &req.attr);
	req.qp = qp->handle;
	req.mask = (uint32_t)attr_mask;
	struct sv_modify_qp_reply rep;
	int err = sv_call(SV_OP_MODIFY_QP, &req, sizeof(req), NULL, 0, &rep, sizeof(rep), NULL, NULL);
	if (err)
		return err;
	qp->state = (enum ibv_qp_state)rep.state;
	if (rep.state == IBV_QPS_RESET) {	/* every slot is free again (docs/rings.md) */
		struct sv_qp *q = (struct sv_qp *)qp;
		if (q->has_sq)
			q->sq_ci = sv_load(&q->sq, SV_RING_SQ_PI);
		if (q->has_rq)
			q->rq_ci = sv_load(&q->rq, SV_RING_SQ_PI);
	}
	return 0;
}

int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
		 struct ibv_qp_init_attr *init_attr)
{
	if (!qp || !attr)
		return EINVAL;
	(void)attr_mask;	/* everything is returned, as rxe does */
	struct sv_handle req = {.handle = qp->handle};
	struct sv_query_qp_reply rep;
	int err = sv_call(SV_OP_QUERY_QP, &req, sizeof(req), NULL, 0, &rep, sizeof(rep), NULL, NULL);
	if (err)
		return err;
	const struct sv_qp_attrs *w = &rep.attr;
	memset(attr, 0, sizeof(*attr));
	av_from_wire(&w->ah, &attr->ah_attr);
	av_from_wire(&w->alt_ah, &attr->alt_ah_attr);
	attr->qp_state = (enum ibv_qp_state)w->qp_state;
	attr->cur_qp_state = (enum ibv_qp_state)w->cur_qp_state;
	attr->path_mtu = (enum ibv_mtu)w->path_mtu;
	attr->path_mig_state = (enum ibv_mig_state)w->path_mig_state;
	attr->qkey = w->qkey;
	attr->rq_psn = w->rq_psn;
	attr->sq_psn = w->sq_psn;
	attr->dest_qp_num = w->dest_qp_num;
	attr->qp_access_flags = w->qp_access_flags;
	attr->pkey_index = (uint16_t)w->pkey_index;
	attr->alt_pkey_index = (uint16_t)w->alt_pkey_index;
	attr->en_sqd_async_notify = (uint8_t)w->en_sqd_async_notify;
	attr->sq_draining = (uint8_t)w->sq_draining;
	attr->max_rd_atomic = (uint8_t)w->max_rd_atomic;
	attr->max_dest_rd_atomic = (uint8_t)w->max_dest_rd_atomic;
	attr->min_rnr_timer = (uint8_t)w->min_rnr_timer;
	attr->port_num = (uint8_t)w->port_num;
	attr->timeout = (uint8_t)w->timeout;
	attr->retry_cnt = (uint8_t)w->retry_cnt;
	attr->rnr_retry = (uint8_t)w->rnr_retry;
	attr->alt_port_num = (uint8_t)w->alt_port_num;
	attr->alt_timeout = (uint8_t)w->alt_timeout;
	attr->rate_limit = w->rate_limit;
	attr->cap.max_send_wr = rep.caps.max_send_wr;
	attr->cap.max_recv_wr = rep.caps.max_recv_wr;
	attr->cap.max_send_sge = rep.caps.max_send_sge;
	attr->cap.max_recv_sge = rep.caps.max_recv_sge;
	attr->cap.max_inline_data = rep.caps.max_inline_data;
	qp->state = attr->qp_state;
	if (init_attr) {
		memset(init_attr, 0, sizeof(*init_attr));
		init_attr->qp_context = qp->qp_context;
		init_attr->send_cq = qp->send_cq;
		init_attr->recv_cq = qp->recv_cq;
		init_attr->srq = qp->srq;
		init_attr->cap = attr->cap;
		init_attr->qp_type = qp->qp_type;
		init_attr->sq_sig_all = (int)rep.sq_sig_all;
	}
	return 0;
}

/* --- posting ------------------------------------------------------------------------ */

/* The state the device last published in the send ring (docs/rings.md). */
static int published_state(const struct sv_qp *qp)
{
	uint64_t v = qp->has_sq ? sv_load(&qp->sq, SV_RING_SQ_STATE) : 0;
	return v ? (int)(v - 1) : IBV_QPS_RESET;
}

static int can_post_send(int state)
{
	return state == IBV_QPS_RTS || state == IBV_QPS_SQD || state == IBV_QPS_SQE ||
	       state == IBV_QPS_ERR;
}

/* Encode one send WR into the slot at ``index``; 0 or an errno. */
static int encode_send(struct sv_qp *qp, const struct ibv_send_wr *wr, uint64_t index,
		       uintptr_t caller)
{
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge)
		return EINVAL;
	if ((unsigned)wr->opcode > IBV_WR_DRIVER1)
		return EINVAL;
	struct sv_send_wqe_header *h = sv_slot(&qp->sq, index);
	memset(h, 0, sizeof(*h));
	h->wr_id = wr->wr_id;
	h->opcode = (uint8_t)wr->opcode;
	h->flags = (uint8_t)send_flags_of(wr->send_flags);
	if (qp->sq_sig_all)
		h->flags |= SV_RING_F_SIGNALED;
	switch (wr->opcode) {
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		h->imm_data = be32toh(wr->imm_data);
		break;
	case IBV_WR_SEND_WITH_INV:
	case IBV_WR_LOCAL_INV:
		h->invalidate_rkey = wr->invalidate_rkey;
		break;
	default:
		break;
	}
	switch (wr->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		h->remote_addr = wr->wr.rdma.remote_addr;
		h->rkey = wr->wr.rdma.rkey;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		h->remote_addr = wr->wr.atomic.remote_addr;
		h->rkey = wr->wr.atomic.rkey;
		h->compare_add = wr->wr.atomic.compare_add;
		h->swap = wr->wr.atomic.swap;
		break;
	default:
		break;
	}
	if (wr->opcode == IBV_WR_BIND_MW) {
		/* a WR binds type 2 windows; type 1 ones are bound with ibv_bind_mw,
		 * which marks its WR with IBV_SEND_RESERVED_TYPE1 (below) */
		const struct ibv_mw *mw = wr->bind_mw.mw;
		const struct ibv_mw_bind_info *b = &wr->bind_mw.bind_info;
		int type1 = (wr->send_flags & SV_SEND_TYPE1_BIND) != 0;
		if (!mw || mw->type != (type1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2))
			return EINVAL;
		h->bind_mw = mw->handle;
		h->bind_mr = b->mr ? b->mr->handle : 0;
		h->bind_rkey = wr->bind_mw.rkey;
		h->bind_addr = b->addr;
		h->bind_length = b->length;
		h->bind_access = b->mw_access_flags;
	}
	if (qp->qpx.qp_base.qp_type == IBV_QPT_UD) {
		if (!wr->wr.ud.ah)
			return EINVAL;
		h->ah = wr->wr.ud.ah->handle;
		h->remote_qpn = wr->wr.ud.remote_qpn;
		h->remote_qkey = wr->wr.ud.remote_qkey;
	}
	if (qp->qpx.qp_base.qp_type == IBV_QPT_XRC_SEND)
		h->remote_srqn = wr->qp_type.xrc.remote_srqn;
	h->caller = caller;
	char *p = (char *)(h + 1);
	if (wr->send_flags & IBV_SEND_INLINE) {
		size_t total = 0;
		for (int i = 0; i < wr->num_sge; i++)
			total += wr->sg_list[i].length;
		if (total > qp->cap.max_inline_data)
			return EINVAL;
		for (int i = 0; i < wr->num_sge; i++) {
			memcpy(p, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
			p += wr->sg_list[i].length;
		}
		h->flags |= SV_RING_F_INLINE;
		h->inline_len = (uint32_t)total;
	} else {
		struct sv_sg_entry *s = (struct sv_sg_entry *)p;
		for (int i = 0; i < wr->num_sge; i++)
			s[i] = (struct sv_sg_entry){wr->sg_list[i].addr, wr->sg_list[i].length,
						    wr->sg_list[i].lkey};
		h->num_sge = (uint16_t)wr->num_sge;
	}
	return 0;
}

/* How many WRs the send (receive) queue holds: its capability, which is
 * below the ring's slots only for a queue of 0 WRs (a post then fails with
 * ENOMEM, as on rxe). */
static uint64_t sq_room(const struct sv_qp *qp)
{
	return qp->cap.max_send_wr < qp->sq.nslots ? qp->cap.max_send_wr : qp->sq.nslots;
}

static uint64_t rq_room(const struct sv_qp *qp)
{
	return qp->cap.max_recv_wr < qp->rq.nslots ? qp->cap.max_recv_wr : qp->rq.nslots;
}

/* The sanitizer's report for a post refused with ENOMEM: the one check made
 * in the program's process, since only the driver sees a full queue.  The
 * format is the device's (softverbs/sanitizer.py). */
static void sanitize_sq_full(const struct sv_qp *qp, uint64_t used, uintptr_t caller)
{
	int mode = sv_sanitizing();
	if (!mode)
		return;
	const char *rule = "a send slot is freed only when a CQE of its WR, or of a later WR of "
			   "the same send queue, is polled (seed 000)";
	if (mode == 2)
		fprintf(stderr, "{\"sanitizer\": \"softverbs\", \"check\": \"send-queue-full\", "
			"\"rule\": \"%s\", \"pid\": %d, \"qp\": \"%#x\", \"send queue\": "
			"\"%llu of %u slots held by WRs whose completions have not been polled\", "
			"\"result\": \"post_send fails with ENOMEM\", \"where\": [\"%#lx\"]}\n",
			rule, (int)getpid(), qp->qpx.qp_base.qp_num, (unsigned long long)used,
			(unsigned)sq_room(qp), (unsigned long)caller);
	else
		fprintf(stderr, "softverbs-sanitizer: send-queue-full\n    rule: %s\n    qp: %#x\n"
			"    send queue: %llu of %u slots held by WRs whose completions have not "
			"been polled\n    result: post_send fails with ENOMEM\n    where:\n"
			"      %#lx\n", rule, qp->qpx.qp_base.qp_num, (unsigned long long)used,
			(unsigned)sq_room(qp), (unsigned long)caller);
	const char *v = getenv("SOFTVERBS_SANITIZE");
	if (strstr(v, "halt_on_error=1"))
		abort();
}

/* Hand the send queue's WQEs below pi to the device (docs/rings.md, "Doorbell
 * suppression").  While the service is awake and polling this queue it sets
 * the queue's `polled` word, and a store of `db` is all it needs; else the
 * DOORBELL message wakes it.  The full fence orders our store of db before our
 * load of polled, as the service's orders its store of polled = 0 before its
 * last load of db: one of the two sides sees the other's store, so a WQE is
 * never left unseen by a sleeping service. */
static void sq_doorbell(struct sv_qp *qp, uint64_t pi)
{
	sv_store(&qp->sq, SV_RING_SQ_DB, pi);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (!sv_load(&qp->sq, SV_RING_SQ_POLLED))
		sv_doorbell(qp->qpx.qp_base.handle, SV_DB_SQ);
}

static int post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct sv_qp *qp = (struct sv_qp *)ibqp;
	uintptr_t caller = (uintptr_t)__builtin_return_address(0);	/* the program's post */
	int err = 0;
	if (!qp->has_sq || sv_ring_foreign(&qp->sq)) {
		*bad_wr = wr;
		return qp->has_sq ? EPERM : EINVAL;
	}
	pthread_spin_lock(&qp->sq_lock);
	uint64_t pi = sv_load(&qp->sq, SV_RING_SQ_PI);
	if (!can_post_send(published_state(qp)))
		err = EINVAL;
	for (; wr && !err; wr = wr->next) {
		uint64_t used = pi - __atomic_load_n(&qp->sq_ci, __ATOMIC_ACQUIRE);
		if (used >= sq_room(qp)) {
			err = ENOMEM;
			if (qp->cap.max_send_wr)	/* not a trap: a queue of 0 WRs */
				sanitize_sq_full(qp, used, caller);
			break;
		}
		err = encode_send(qp, wr, pi, caller);
		if (err)
			break;
		if (wr->opcode == IBV_WR_BIND_MW)
			wr->bind_mw.mw->rkey = wr->bind_mw.rkey;
		pi++;
		sv_store(&qp->sq, SV_RING_SQ_PI, pi);
	}
	if (err)
		*bad_wr = wr;
	uint64_t db = sv_load(&qp->sq, SV_RING_SQ_DB);
	if (pi > db)	/* even after an error: what was posted must run */
		sq_doorbell(qp, pi);
	pthread_spin_unlock(&qp->sq_lock);
	return err;
}

/* ibv_bind_mw (type 1 windows): a BIND_MW WR with the window's next key */
static int bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *bind)
{
	struct ibv_send_wr wr = {
		.wr_id = bind->wr_id, .opcode = IBV_WR_BIND_MW,
		.send_flags = bind->send_flags | SV_SEND_TYPE1_BIND,
		.bind_mw = {.mw = mw, .rkey = ibv_inc_rkey(mw->rkey), .bind_info = bind->bind_info},
	};
	struct ibv_send_wr *bad;
	return post_send(qp, &wr, &bad);
}

static int encode_recv(struct sv_ring *ring, uint32_t max_sge, const struct ibv_recv_wr *wr,
		       uint64_t index)
{
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > max_sge)
		return EINVAL;
	struct sv_recv_wqe_header *h = sv_slot(ring, index);
	h->wr_id = wr->wr_id;
	h->num_sge = (uint32_t)wr->num_sge;
	h->reserved = 0;
	struct sv_sg_entry *s = (struct sv_sg_entry *)(h + 1);
	for (int i = 0; i < wr->num_sge; i++)
		s[i] = (struct sv_sg_entry){wr->sg_list[i].addr, wr->sg_list[i].length,
					    wr->sg_list[i].lkey};
	return 0;
}

static int post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct sv_qp *qp = (struct sv_qp *)ibqp;
	int err = 0;
	if (!qp->has_rq || sv_ring_foreign(&qp->rq)) {
		*bad_wr = wr;
		return qp->has_rq ? EPERM : EINVAL;
	}
	/* as rdma-core's providers: no receive WR before INIT (the state is the
	 * device's, published on the send ring, so only a QP with one can tell) */
	if (qp->has_sq && published_state(qp) == IBV_QPS_RESET) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_spin_lock(&qp->rq_lock);
	uint64_t pi = sv_load(&qp->rq, SV_RING_SQ_PI);
	for (; wr; wr = wr->next) {
		if (pi - __atomic_load_n(&qp->rq_ci, __ATOMIC_ACQUIRE) >= rq_room(qp)) {
			err = ENOMEM;
			break;
		}
		err = encode_recv(&qp->rq, qp->cap.max_recv_sge, wr, pi);
		if (err)
			break;
		pi++;
		sv_store(&qp->rq, SV_RING_SQ_PI, pi);
	}
	if (err)
		*bad_wr = wr;
	if (pi > sv_load(&qp->rq, SV_RING_SQ_DB)) {
		sv_store(&qp->rq, SV_RING_SQ_DB, pi);
		/* As a NIC reads an RQ's doorbell record when a message finds no receive
		 * WQE fetched (mlx5's RQ has no MMIO doorbell), the device reads this one;
		 * a doorbell message is sent only where it must act now: to flush what is
		 * posted to a QP in ERR (the device publishes ERR before it flushes, and
		 * the flush reads the record: the fence orders our store before our load,
		 * so one side sees the other), and for the sanitizer's checks. */
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (published_state(qp) == IBV_QPS_ERR || sv_sanitizing())
			sv_doorbell(ibqp->handle, SV_DB_RQ);
	}
	pthread_spin_unlock(&qp->rq_lock);
	return err;
}

/* --- the extended send API (ibv_qp_ex): WRs are built in place, published at
 *     wr_complete --------------------------------------------------------------------- */

struct qpx_state {
	uint64_t start;		/* pi at wr_start */
	uint64_t next;		/* where the next WR goes */
	struct sv_send_wqe_header *cur;
	int err;
};

static __thread struct qpx_state qpx_st;

static struct sv_qp *qpx_qp(struct ibv_qp_ex *x)
{
	return (struct sv_qp *)x;
}

static void qpx_start(struct ibv_qp_ex *x)
{
	struct sv_qp *qp = qpx_qp(x);
	pthread_spin_lock(&qp->sq_lock);
	qpx_st.start = qpx_st.next = sv_load(&qp->sq, SV_RING_SQ_PI);
	qpx_st.cur = NULL;
	qpx_st.err = sv_ring_foreign(&qp->sq) ? EPERM
		     : can_post_send(published_state(qp)) ? 0 : EINVAL;
}

static struct sv_send_wqe_header *qpx_new(struct ibv_qp_ex *x, enum ibv_wr_opcode op)
{
	struct sv_qp *qp = qpx_qp(x);
	qpx_st.cur = NULL;
	if (qpx_st.err)
		return NULL;
	if (qpx_st.next - __atomic_load_n(&qp->sq_ci, __ATOMIC_ACQUIRE) >= sq_room(qp)) {
		qpx_st.err = ENOMEM;
		return NULL;
	}
	struct sv_send_wqe_header *h = sv_slot(&qp->sq, qpx_st.next++);
	memset(h, 0, sizeof(*h));
	h->wr_id = x->wr_id;
	h->opcode = (uint8_t)op;
	h->flags = (uint8_t)send_flags_of(x->wr_flags);
	if (qp->sq_sig_all)
		h->flags |= SV_RING_F_SIGNALED;
	qpx_st.cur = h;
	return h;
}

static void qpx_send(struct ibv_qp_ex *x)
{
	qpx_new(x, IBV_WR_SEND);
}

static void qpx_send_imm(struct ibv_qp_ex *x, __be32 imm)
{
	struct sv_send_wqe_header *h = qpx_new(x, IBV_WR_SEND_WITH_IMM);
	if (h)
		h->imm_data = be32toh(imm);
}

static void qpx_send_inv(struct ibv_qp_ex *x, uint32_t rkey)
{
	struct sv_send_wqe_header *h = qpx_new(x, IBV_WR_SEND_WITH_INV);
	if (h)
		h->invalidate_rkey = rkey;
}

static void qpx_rdma(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint32_t rkey, uint64_t addr)
{
	struct sv_send_wqe_header *h = qpx_new(x, op);
	if (h) {
		h->rkey = rkey;
		h->remote_addr = addr;
	}
}

static void qpx_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr)
{
	qpx_rdma(x, IBV_WR_RDMA_WRITE, rkey, addr);
}

static void qpx_write_imm(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, __be32 imm)
{
	qpx_rdma(x, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr);
	if (qpx_st.cur)
		qpx_st.cur->imm_data = be32toh(imm);
}

static void qpx_read(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr)
{
	qpx_rdma(x, IBV_WR_RDMA_READ, rkey, addr);
}

static void qpx_cas(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, uint64_t cmp,
		    uint64_t swap)
{
	qpx_rdma(x, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, addr);
	if (qpx_st.cur) {
		qpx_st.cur->compare_add = cmp;
		qpx_st.cur->swap = swap;
	}
}

static void qpx_faa(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, uint64_t add)
{
	qpx_rdma(x, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, addr);
	if (qpx_st.cur)
		qpx_st.cur->compare_add = add;
}

static void qpx_local_inv(struct ibv_qp_ex *x, uint32_t rkey)
{
	struct sv_send_wqe_header *h = qpx_new(x, IBV_WR_LOCAL_INV);
	if (h)
		h->invalidate_rkey = rkey;
}

static void qpx_bind_mw(struct ibv_qp_ex *x, struct ibv_mw *mw, uint32_t rkey,
			const struct ibv_mw_bind_info *info)
{
	struct sv_send_wqe_header *h = qpx_new(x, IBV_WR_BIND_MW);
	if (!h)
		return;
	if (!mw || !info) {
		qpx_st.err = EINVAL;
		return;
	}
	h->bind_mw = mw->handle;
	h->bind_mr = info->mr ? info->mr->handle : 0;
	h->bind_rkey = rkey;
	h->bind_addr = info->addr;
	h->bind_length = info->length;
	h->bind_access = info->mw_access_flags;
	mw->rkey = rkey;	/* the key the program hands to its peer, as after a posted bind */
}

static void qpx_ud(struct ibv_qp_ex *x, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	(void)x;
	if (qpx_st.cur && ah) {
		qpx_st.cur->ah = ah->handle;
		qpx_st.cur->remote_qpn = qpn;
		qpx_st.cur->remote_qkey = qkey;
	} else if (!qpx_st.err) {
		qpx_st.err = EINVAL;
	}
}

static void qpx_xrc(struct ibv_qp_ex *x, uint32_t srqn)
{
	(void)x;
	if (qpx_st.cur)
		qpx_st.cur->remote_srqn = srqn;
}

static void qpx_sge_list(struct ibv_qp_ex *x, size_t n, const struct ibv_sge *sg)
{
	struct sv_send_wqe_header *h = qpx_st.cur;
	if (!h)
		return;
	if (n > qpx_qp(x)->cap.max_send_sge) {
		qpx_st.err = EINVAL;
		return;
	}
	struct sv_sg_entry *s = (struct sv_sg_entry *)(h + 1);
	for (size_t i = 0; i < n; i++)
		s[i] = (struct sv_sg_entry){sg[i].addr, sg[i].length, sg[i].lkey};
	h->num_sge = (uint16_t)n;
}

static void qpx_sge(struct ibv_qp_ex *x, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge sg = {.addr = addr, .length = length, .lkey = lkey};
	qpx_sge_list(x, 1, &sg);
}

static void qpx_inline_list(struct ibv_qp_ex *x, size_t n, const struct ibv_data_buf *buf)
{
	struct sv_send_wqe_header *h = qpx_st.cur;
	if (!h)
		return;
	size_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += buf[i].length;
	if (total > qpx_qp(x)->cap.max_inline_data) {
		qpx_st.err = EINVAL;
		return;
	}
	char *p = (char *)(h + 1);
	for (size_t i = 0; i < n; i++) {
		memcpy(p, buf[i].addr, buf[i].length);
		p += buf[i].length;
	}
	h->flags |= SV_RING_F_INLINE;
	h->inline_len = (uint32_t)total;
	h->num_sge = 0;
}

static void qpx_inline(struct ibv_qp_ex *x, void *addr, size_t length)
{
	struct ibv_data_buf b = {.addr = addr, .length = length};
	qpx_inline_list(x, 1, &b);
}

static int qpx_complete(struct ibv_qp_ex *x)
{
	struct sv_qp *qp = qpx_qp(x);
	int err = qpx_st.err;
	if (!err && qpx_st.next > qpx_st.start) {
		sv_store(&qp->sq, SV_RING_SQ_PI, qpx_st.next);
		sq_doorbell(qp, qpx_st.next);
	}
	pthread_spin_unlock(&qp->sq_lock);
	return err;
}

static void qpx_abort(struct ibv_qp_ex *x)
{
	pthread_spin_unlock(&qpx_qp(x)->sq_lock);	/* nothing was published */
}

static void qpx_init(struct sv_qp *qp)
{
	struct ibv_qp_ex *x = &qp->qpx;
	x->comp_mask = 0;
	x->wr_send = qpx_send;
	x->wr_send_imm = qpx_send_imm;
	x->wr_send_inv = qpx_send_inv;
	x->wr_rdma_write = qpx_write;
	x->wr_rdma_write_imm = qpx_write_imm;
	x->wr_rdma_read = qpx_read;
	x->wr_atomic_cmp_swp = qpx_cas;
	x->wr_atomic_fetch_add = qpx_faa;
	x->wr_local_inv = qpx_local_inv;
	x->wr_bind_mw = qpx_bind_mw;
	x->wr_set_ud_addr = qpx_ud;
	x->wr_set_xrc_srqn = qpx_xrc;
	x->wr_set_sge = qpx_sge;
	x->wr_set_sge_list = qpx_sge_list;
	x->wr_set_inline_data = qpx_inline;
	x->wr_set_inline_data_list = qpx_inline_list;
	x->wr_start = qpx_start;
	x->wr_complete = qpx_complete;
	x->wr_abort = qpx_abort;
	qp->is_ex = 1;
}

struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	if (!qp || !((struct sv_qp *)qp)->is_ex)
		return sv_fail_null(EOPNOTSUPP);
	return &((struct sv_qp *)qp)->qpx;
}

/* --- for softverbs' libmlx5.so.1 (exported as SOFTVERBS_PRIVATE_2; sv_dv.h) --------- */

/* ibv_create_qp_ex with dv_flags, and dv_size zeroed bytes for the caller
 * (sv_dv_qp), freed with the QP.  The QP always has the ibv_qp_ex ops. */
struct ibv_qp *sv_dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr,
			       uint32_t dv_flags, size_t dv_size)
{
	uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
			 IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	if (!context || !attr || !dv_size)
		return sv_fail_null(EINVAL);
	if (attr->comp_mask & ~known)
		return sv_fail_null(EOPNOTSUPP);
	return create_qp(context, attr, dv_flags, dv_size);
}

/* The caller's state of a QP made by sv_dv_create_qp; NULL for other QPs. */
void *sv_dv_qp(struct ibv_qp *qp)
{
	return qp ? ((struct sv_qp *)qp)->dv : NULL;
}

/* A driver WQE for driver_op in the batch open on x (wr_id and wr_flags as any
 * WR); *room gets the bytes of inline data its slot holds after the header.
 * NULL if the batch already failed or the send queue is full. */
struct sv_send_wqe_header *sv_dv_wr_driver(struct ibv_qp_ex *x, uint32_t driver_op,
					   size_t *room)
{
	struct sv_send_wqe_header *h = qpx_new(x, IBV_WR_DRIVER1);
	if (h) {
		h->driver_op = driver_op;
		*room = qpx_qp(x)->sq.slot - sizeof(*h);
	}
	return h;
}

/* Fail the batch open on x: its wr_complete returns err and publishes nothing. */
void sv_dv_wr_fail(struct ibv_qp_ex *x, int err)
{
	(void)x;
	if (!qpx_st.err)
		qpx_st.err = err;
}

/* One request of the mkey operations (CREATE_MKEY, MKEY_CHECK, CANCEL_SEND,
 * DESTROY) to the service; 0 or an errno (also in errno). */
int sv_dv_call(uint16_t op, const void *req, size_t req_len, void *reply, size_t reply_len)
{
	char none[1];
	if (op != SV_OP_CREATE_MKEY && op != SV_OP_MKEY_CHECK && op != SV_OP_CANCEL_SEND &&
	    op != SV_OP_DESTROY)
		return errno = EINVAL;
	return sv_call(op, req, req_len, NULL, 0, reply ? reply : none, reply ? reply_len : 0,
		       NULL, NULL);
}

/* --- shared receive queues ------------------------------------------------------------ */

static struct ibv_srq *create_srq(struct ibv_context *context, struct ibv_pd *pd,
				  struct ibv_srq_init_attr_ex *attr)
{
	struct sv_context *ctx = sv_ctx(context);
	struct sv_srq *srq = calloc(1, sizeof(*srq));
	if (!srq)
		return sv_fail_null(ENOMEM);
	uint32_t max_wr = attr->attr.max_wr ? attr->attr.max_wr : 1;
	uint32_t slot = sv_recv_slot_size(attr->attr.max_sge);
	int err = sv_ring_create(&srq->ring, max_wr, slot, "softverbs-srq");
	if (err) {
		free(srq);
		return sv_fail_null(err);
	}
	int xrc = (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type == IBV_SRQT_XRC;
	struct sv_create_srq req = {
		.ctx = ctx->handle,
		.pd = pd ? pd->handle : 0,
		.srq_type = xrc ? IBV_SRQT_XRC : IBV_SRQT_BASIC,
		.max_wr = attr->attr.max_wr,
		.max_sge = attr->attr.max_sge,
		.limit = attr->attr.srq_limit,
		.xrcd = xrc && attr->xrcd ? sv_xrcd_handle(attr->xrcd) : 0,
		.cq = xrc && attr->cq ? attr->cq->handle : 0,
		.slot = slot,
	};
	struct sv_create_srq_reply rep;
	err = sv_call(SV_OP_CREATE_SRQ, &req, sizeof(req), &srq->ring.fd, 1, &rep, sizeof(rep),
		      NULL, NULL);
	if (err) {
		sv_ring_destroy(&srq->ring);
		free(srq);
		return sv_fail_null(err);
	}
	attr->attr.max_wr = rep.max_wr;
	attr->attr.max_sge = rep.max_sge;
	srq->srqn = rep.srqn;
	srq->max_wr = rep.max_wr;
	srq->max_sge = rep.max_sge;
	srq->ctx = ctx;
	pthread_spin_init(&srq->lock, PTHREAD_PROCESS_PRIVATE);
	srq->srq.context = context;
	srq->srq.srq_context = attr->srq_context;
	srq->srq.pd = pd;
	srq->srq.handle = rep.srq;
	pthread_mutex_init(&srq->srq.mutex, NULL);
	pthread_cond_init(&srq->srq.cond, NULL);
	sv_map_put(ctx, SV_KIND_SRQ, rep.srq, srq);
	return &srq->srq;
}

struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *srq_init_attr)
{
	if (!pd || !srq_init_attr)
		return sv_fail_null(EINVAL);
	struct ibv_srq_init_attr_ex ex;
	memset(&ex, 0, sizeof(ex));
	ex.srq_context = srq_init_attr->srq_context;
	ex.attr = srq_init_attr->attr;
	ex.comp_mask = IBV_SRQ_INIT_ATTR_PD;
	ex.pd = pd;
	struct ibv_srq *srq = create_srq(pd->context, pd, &ex);
	if (srq)
		srq_init_attr->attr = ex.attr;
	return srq;
}

static struct ibv_srq *create_srq_ex(struct ibv_context *context,
				     struct ibv_srq_init_attr_ex *attr)
{
	uint32_t known = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD |
			 IBV_SRQ_INIT_ATTR_CQ;
	if (!attr || attr->comp_mask & ~known)
		return sv_fail_null(attr ? EOPNOTSUPP : EINVAL);
	return create_srq(context, (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) ? attr->pd : NULL,
			  attr);
}

int ibv_destroy_srq(struct ibv_srq *ibsrq)
{
	if (!ibsrq)
		return EINVAL;
	struct sv_srq *srq = (struct sv_srq *)ibsrq;
	int err = sv_destroy(SV_KIND_SRQ, ibsrq->handle);
	if (err)
		return err;
	uint32_t events;
	sv_map_del(srq->ctx, SV_KIND_SRQ, ibsrq->handle, &events, NULL);
	wait_acked(&ibsrq->mutex, &ibsrq->cond, &ibsrq->events_completed, events);
	sv_ring_destroy(&srq->ring);
	free(srq);
	return 0;
}

int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask)
{
	if (!srq || !srq_attr)
		return EINVAL;
	struct sv_srq *s = (struct sv_srq *)srq;
	struct sv_modify_srq req = {.srq = srq->handle, .mask = (uint32_t)srq_attr_mask,
				    .limit = srq_attr->srq_limit};
	char none[1];
	if (!(srq_attr_mask & IBV_SRQ_MAX_WR))
		return sv_call(SV_OP_MODIFY_SRQ, &req, sizeof(req), NULL, 0, none, 0, NULL, NULL);
	/* Resizing: a new ring, into which the device moves the WQEs it has not taken. */
	if (sv_ring_foreign(&s->ring))
		return EPERM;
	if (srq_attr->max_wr < 1)
		return EINVAL;
	struct sv_ring ring;
	int err = sv_ring_create(&ring, srq_attr->max_wr, sv_recv_slot_size(s->max_sge),
				 "softverbs-srq");
	if (err)
		return err;
	req.max_wr = srq_attr->max_wr;
	pthread_spin_lock(&s->lock);	/* no post writes the old ring meanwhile */
	err = sv_call(SV_OP_MODIFY_SRQ, &req, sizeof(req), &ring.fd, 1, none, 0, NULL, NULL);
	if (!err) {
		struct sv_ring old = s->ring;
		s->ring = ring;
		s->max_wr = srq_attr->max_wr;
		ring = old;
	}
	pthread_spin_unlock(&s->lock);
	sv_ring_destroy(&ring);	/* the old one, or the new one the device refused */
	return err;
}

int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr)
{
	if (!srq || !srq_attr)
		return EINVAL;
	struct sv_handle req = {.handle = srq->handle};
	struct sv_query_srq_reply rep;
	int err = sv_call(SV_OP_QUERY_SRQ, &req, sizeof(req), NULL, 0, &rep, sizeof(rep), NULL,
			  NULL);
	if (err)
		return err;
	srq_attr->max_wr = rep.max_wr;
	srq_attr->max_sge = rep.max_sge;
	srq_attr->srq_limit = rep.limit;
	return 0;
}

static int get_srq_num(struct ibv_srq *srq, uint32_t *srq_num)
{
	*srq_num = ((struct sv_srq *)srq)->srqn;
	return 0;
}

static int post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
			 struct ibv_recv_wr **bad_wr)
{
	struct sv_srq *srq = (struct sv_srq *)ibsrq;
	int err = 0;
	if (sv_ring_foreign(&srq->ring)) {
		*bad_wr = wr;
		return EPERM;
	}
	pthread_spin_lock(&srq->lock);
	uint64_t pi = sv_load(&srq->ring, SV_RING_SRQ_PI);
	for (; wr; wr = wr->next) {
		uint64_t out = pi - __atomic_load_n(&srq->released, __ATOMIC_ACQUIRE) -
			       sv_load(&srq->ring, SV_RING_SRQ_DISCARDED);
		if (out >= srq->ring.nslots) {
			err = ENOMEM;
			break;
		}
		err = encode_recv(&srq->ring, srq->max_sge, wr, pi);
		if (err)
			break;
		pi++;
		sv_store(&srq->ring, SV_RING_SRQ_PI, pi);
	}
	if (err)
		*bad_wr = wr;
	pthread_spin_unlock(&srq->lock);
	return err;
}

/* --- address handles ----------------------------------------------------------------- */

struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	if (!pd || !attr)
		return sv_fail_null(EINVAL);
	struct sv_create_ah req;
	av_to_wire(attr, &req.av);
	req.pd = pd->handle;
	req.reserved = 0;
	struct sv_handle rep;
	struct ibv_ah *ah = call_and_alloc(SV_OP_CREATE_AH, &req, sizeof(req), NULL, 0,
					   &rep, sizeof(rep), SV_KIND_AH, &rep.handle, sizeof(*ah));
	if (!ah)
		return NULL;
	ah->context = pd->context;
	ah->pd = pd;
	ah->handle = rep.handle;
	return ah;
}

int ibv_destroy_ah(struct ibv_ah *ah)
{
	if (!ah)
		return EINVAL;
	int err = sv_destroy(SV_KIND_AH, ah->handle);
	if (!err)
		free(ah);
	return err;
}

/* Which header the 40 bytes before a UD payload hold: a GRH (6), or, on
 * RoCEv2 over IPv4, an IPv4 header in their last 20 bytes (4) -- as rdma-core
 * tells them apart: a well-formed IPv4 header with a good checksum wins. */
static int grh_version(const struct ibv_grh *grh)
{
	const uint8_t *ip4 = (const uint8_t *)grh + 20;
	int v6 = (int)(be32toh(grh->version_tclass_flow) >> 28);
	if (v6 != 6)
		return ip4[0] >> 4 == 4 ? 4 : -1;
	if (ip4[0] != 0x45)
		return 6;
	uint32_t sum = 0;
	for (int i = 0; i < 20; i += 2)
		sum += (uint32_t)(ip4[i] << 8 | ip4[i + 1]);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return sum == 0xffff ? 4 : 6;
}

static void v4_mapped(union ibv_gid *gid, const uint8_t *ip)
{
	memset(gid->raw, 0, 10);
	gid->raw[10] = gid->raw[11] = 0xff;
	memcpy(gid->raw + 12, ip, 4);
}

int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
			struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
	memset(ah_attr, 0, sizeof(*ah_attr));
	ah_attr->dlid = wc->slid;
	ah_attr->sl = wc->sl;
	ah_attr->src_path_bits = wc->dlid_path_bits;
	ah_attr->port_num = port_num;
	if (!(wc->wc_flags & IBV_WC_GRH) || !grh)
		return 0;
	union ibv_gid local;
	ah_attr->is_global = 1;
	ah_attr->grh.hop_limit = 0xFF;
	switch (grh_version(grh)) {
	case 4: {
		const uint8_t *ip4 = (const uint8_t *)grh + 20;
		v4_mapped(&ah_attr->grh.dgid, ip4 + 12);	/* the sender's address */
		v4_mapped(&local, ip4 + 16);
		ah_attr->grh.traffic_class = ip4[1];
		break;
	}
	case 6:
		ah_attr->grh.dgid = grh->sgid;
		local = grh->dgid;
		ah_attr->grh.traffic_class =
			(uint8_t)((be32toh(grh->version_tclass_flow) >> 20) & 0xFF);
		ah_attr->grh.flow_label = be32toh(grh->version_tclass_flow) & 0xFFFFF;
		break;
	default:
		return errno = EPROTONOSUPPORT, -1;
	}
	/* the source GID is the local GID the datagram was sent to */
	for (int i = 0; i < 16; i++) {
		union ibv_gid gid;
		if (ibv_query_gid(context, port_num, i, &gid))
			break;
		if (!memcmp(gid.raw, local.raw, sizeof(gid.raw))) {
			ah_attr->grh.sgid_index = (uint8_t)i;
			return 0;
		}
	}
	return errno = ENOENT, -1;
}

struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
				     uint8_t port_num)
{
	struct ibv_ah_attr attr;
	if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr))
		return NULL;
	return ibv_create_ah(pd, &attr);
}

/* --- XRC domains and shared QPs ------------------------------------------------------- */

static struct ibv_xrcd *open_xrcd(struct ibv_context *context, struct ibv_xrcd_init_attr *attr)
{
	if (!attr || attr->comp_mask & ~(uint32_t)(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS))
		return sv_fail_null(EINVAL);
	int has_fd = (attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) && attr->fd >= 0;
	struct sv_open_xrcd req = {.ctx = sv_ctx(context)->handle,
				   .oflags = (attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS)
						     ? (uint32_t)attr->oflags : 0,
				   .flags = has_fd ? SV_OPEN_XRCD_HAS_FD : 0};
	struct sv_handle rep;
	struct sv_xrcd *x = call_and_alloc(SV_OP_OPEN_XRCD, &req, sizeof(req), &attr->fd,
					   has_fd ? 1 : 0, &rep, sizeof(rep), SV_KIND_XRCD,
					   &rep.handle, sizeof(*x));
	if (!x)
		return NULL;
	x->xrcd.context = context;
	x->handle = rep.handle;
	return &x->xrcd;
}

static int close_xrcd(struct ibv_xrcd *xrcd)
{
	int err = sv_destroy(SV_KIND_XRCD, sv_xrcd_handle(xrcd));
	if (!err)
		free(xrcd);
	return err;
}

static struct ibv_qp *open_qp(struct ibv_context *context, struct ibv_qp_open_attr *attr)
{
	uint32_t need = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	if (!attr || (attr->comp_mask & need) != need || !attr->xrcd)
		return sv_fail_null(EINVAL);
	struct sv_context *ctx = sv_ctx(context);
	struct sv_open_qp req = {.ctx = ctx->handle,
				 .xrcd = sv_xrcd_handle(attr->xrcd),
				 .qpn = attr->qp_num, .qp_type = attr->qp_type};
	struct sv_open_qp_reply rep;
	struct sv_qp *qp = call_and_alloc(SV_OP_OPEN_QP, &req, sizeof(req), NULL, 0,
					  &rep, sizeof(rep), SV_KIND_QP, &rep.qp, sizeof(*qp));
	if (!qp)
		return NULL;
	qp->sq.fd = qp->rq.fd = -1;
	qp->ctx = ctx;
	struct ibv_qp *q = &qp->qpx.qp_base;
	q->context = context;
	q->qp_context = (attr->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? attr->qp_context : NULL;
	q->handle = rep.qp;
	q->qp_num = rep.qpn;
	q->state = (enum ibv_qp_state)rep.state;
	q->qp_type = attr->qp_type;
	pthread_mutex_init(&q->mutex, NULL);
	pthread_cond_init(&q->cond, NULL);
	sv_map_put(ctx, SV_KIND_QP, rep.qp, qp);
	return q;
}

/* --- multicast ------------------------------------------------------------------------ */

/* The device checks the QP (UD only) and the GID (multicast only) and keeps
 * the membership; on RoCE there is no multicast LID, and ``lid`` is ignored. */
static int mcast(int op, struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	if (!qp || !gid)
		return EINVAL;
	struct sv_mcast req;
	memset(&req, 0, sizeof(req));
	memcpy(req.gid, gid->raw, sizeof(req.gid));
	req.qp = qp->handle;
	req.lid = lid;
	char none[1];
	return sv_call((uint16_t)op, &req, sizeof(req), NULL, 0, none, 0, NULL, NULL);
}

int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return mcast(SV_OP_ATTACH_MCAST, qp, gid, lid);
}

int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return mcast(SV_OP_DETACH_MCAST, qp, gid, lid);
}

/* --- what softverbs does not offer ---------------------------------------------------- */

/* --- importing objects (ibv_import_pd, ibv_import_mr, ibv_import_dm) ---------------------
 *
 * A context imported from another's cmd_fd (ibv_import_device, device.c) is
 * the same device context, so a handle of the one names the very object in
 * the other, as with rdma-core's shared ucontext.  The import is a second
 * struct for the same object: the device is not asked, and ibv_unimport_*
 * frees only the struct; destroying either destroys the object. */

struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	if (!context)
		return sv_fail_null(EINVAL);
	if (!sv_map_get(sv_ctx(context), SV_KIND_PD, pd_handle))
		return sv_fail_null(EINVAL);	/* no PD of this device context has the handle */
	struct sv_pd *p = calloc(1, sizeof(*p));
	if (!p)
		return sv_fail_null(ENOMEM);
	p->pd.context = context;
	p->pd.handle = pd_handle;
	return &p->pd;
}

void ibv_unimport_pd(struct ibv_pd *pd)
{
	free(pd);
}

struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	if (!pd)
		return sv_fail_null(EINVAL);
	struct sv_context *ctx = sv_ctx(pd->context);
	pthread_mutex_lock(&sv_home(ctx)->map_lock);	/* the MR stays while it is copied */
	struct sv_context *home = sv_home(ctx);
	const struct sv_map_entry *e = map_find(home, SV_KIND_MR, mr_handle);
	const struct ibv_mr *orig = e ? e->obj : NULL;
	struct sv_mr *m = orig ? calloc(1, sizeof(*m)) : NULL;
	if (m) {
		m->mr = *orig;
		m->mr.context = pd->context;
		m->mr.pd = pd;
	}
	pthread_mutex_unlock(&home->map_lock);
	if (!orig)
		return sv_fail_null(EINVAL);	/* no MR of this device context has the handle */
	return m ? &m->mr : sv_fail_null(ENOMEM);
}

void ibv_unimport_mr(struct ibv_mr *mr)
{
	free(mr);
}

struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
	if (!context)
		return sv_fail_null(EINVAL);
	struct sv_context *home = sv_home(sv_ctx(context));
	pthread_mutex_lock(&home->map_lock);
	const struct sv_map_entry *e = map_find(home, SV_MAP_DM, dm_handle);
	const struct sv_dm *orig = e ? e->obj : NULL;
	struct sv_dm *d = orig ? calloc(1, sizeof(*d)) : NULL;
	if (d) {
		d->dm = orig->dm;
		d->dm.context = context;
		d->start = orig->start;
		d->length = orig->length;
		d->pool = orig->pool;
	}
	pthread_mutex_unlock(&home->map_lock);
	if (!orig)
		return sv_fail_null(EINVAL);	/* no DM of this device context has the handle */
	return d ? &d->dm : sv_fail_null(ENOMEM);
}

void ibv_unimport_dm(struct ibv_dm *dm)
{
	free(dm);
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				 uint64_t iova, int fd, int access)
{
	(void)pd;
	(void)offset;
	(void)length;
	(void)iova;
	(void)fd;
	(void)access;
	return sv_fail_null(EOPNOTSUPP);	/* no dma-buf exporter reaches a soft device */
}

/* rdma-core answers 0 (not guaranteed) when the provider does not say. */
int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp;
	(void)op;
	(void)flags;
	return 0;
}

int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
				uint8_t eth_mac[6], uint16_t *vid)
{
	(void)context;
	(void)attr;
	(void)eth_mac;
	(void)vid;
	return EOPNOTSUPP;	/* the device sends UDP datagrams; the kernel resolves L2 */
}

/* Not in verbs.h, but exported by rdma-core: madvise(DONTFORK) of a range when
 * ibv_fork_init was called.  Nothing to protect here (ibv_fork_init). */
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);

int ibv_dontfork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

int ibv_dofork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	return EOPNOTSUPP;
}

int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	return EOPNOTSUPP;
}

/* The kernel-ABI copies librdmacm imports: structures of the kernel's uverbs
 * ABI, which softverbs never speaks; librdmacm calls them only on its kernel
 * path. */
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, void *src)
{
	(void)src;
	memset(dst, 0, sizeof(*dst));
}

void ibv_copy_path_rec_from_kern(void *dst, void *src)
{
	(void)dst;
	(void)src;
}

void ibv_copy_path_rec_to_kern(void *dst, void *src)
{
	(void)dst;
	(void)src;
}

void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, void *src)
{
	(void)src;
	memset(dst, 0, sizeof(*dst));
}

/* --- the ops tables ------------------------------------------------------------------ */

void sv_set_ops(struct sv_context *ctx)
{
	struct ibv_context_ops *ops = &ctx->vctx.context.ops;
	ops->poll_cq = poll_cq;
	ops->req_notify_cq = req_notify_cq;
	ops->post_send = post_send;
	ops->post_recv = post_recv;
	ops->post_srq_recv = post_srq_recv;
	ops->alloc_mw = alloc_mw;
	ops->dealloc_mw = dealloc_mw;
	ops->bind_mw = bind_mw;
	struct verbs_context *v = &ctx->vctx;
	v->query_port = sv_query_port;
	v->query_device_ex = sv_query_device_ex;
	v->advise_mr = advise_mr;
	v->alloc_parent_domain = alloc_parent_domain;
	v->alloc_td = alloc_td;
	v->create_cq_ex = create_cq_ex;
	v->alloc_dm = alloc_dm;
	v->free_dm = free_dm;
	v->reg_dm_mr = reg_dm_mr;
	v->dealloc_td = dealloc_td;
	v->create_qp_ex = create_qp_ex;
	v->create_srq_ex = create_srq_ex;
	v->get_srq_num = get_srq_num;
	v->open_xrcd = open_xrcd;
	v->close_xrcd = close_xrcd;
	v->open_qp = open_qp;
}
