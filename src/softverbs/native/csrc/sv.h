/* softverbs' libibverbs: internal declarations.
 *
 * The library is a thin client of the softverbs device service (softverbsd):
 * control verbs are request/reply messages on a Unix socket
 * (docs/service-protocol.md, softverbs/protocol.h), and the data path is
 * rings in shared memory (docs/rings.md): posting writes WQEs and rings a
 * doorbell, polling reads CQEs.  Nothing here knows the transport; the device
 * runs in the service.
 */
#ifndef SV_H
#define SV_H

#include <sys/types.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "softverbs/protocol.h"

#define SV_HIDDEN __attribute__((visibility("hidden")))

/* --- the connection to the service (conn.c) --------------------------------------- */

/* A request and its reply.  req/reply are the bodies (without the header);
 * tail, if not NULL, receives what follows the reply body (tail_len: its
 * capacity on entry, its length on return).  Returns 0, or a positive errno
 * (the service's, or a local one); the service's message is kept for
 * sv_last_error() and printed when SOFTVERBS_DEBUG is set.  A failure also
 * sets errno to it, as a failed kernel command does under rdma-core. */
SV_HIDDEN int sv_call(uint16_t op, const void *req, size_t req_len, const int *fds, int nfds,
		      void *reply, size_t reply_len, void *tail, size_t *tail_len);
/* The one-way doorbell: the application moved a queue's db. */
SV_HIDDEN void sv_doorbell(uint32_t qp, uint32_t queue);
/* The process made (+1) or destroyed (-1) a send queue: the eventfd doorbell
 * is used while it holds at most SV_BELL_MAX_QUEUES of them (conn.c). */
#define SV_BELL_MAX_QUEUES 16
SV_HIDDEN void sv_bell_queues(int delta);
/* The service's message for the last failed call of this thread. */
SV_HIDDEN const char *sv_last_error(void);
/* Connect (once per process; again after fork) and say HELLO; 0 or an errno. */
SV_HIDDEN int sv_connect(void);
/* SOFTVERBS_SANITIZE: 0 off, 1 text reports, 2 JSON reports (docs/sanitizer.md). */
SV_HIDDEN int sv_sanitizing(void);

/* --- rings in shared memory (ring.c) ------------------------------------------------- */

struct sv_ring {
	int fd;			/* the memfd, passed to the service when the object is made */
	void *mem;		/* header, then nslots slots */
	size_t bytes;
	uint32_t nslots;
	uint32_t slot;		/* bytes per slot */
	unsigned forks;		/* sv_forks in the process that made it */
};

/* A memfd of `bytes`, sealed SHRINK|GROW|SEAL as the service requires of every
 * memfd it maps; -1 with errno on failure. */
SV_HIDDEN int sv_sealed_memfd(const char *name, size_t bytes);
SV_HIDDEN int sv_ring_create(struct sv_ring *ring, uint32_t nslots, uint32_t slot,
			     const char *name);
SV_HIDDEN void sv_ring_destroy(struct sv_ring *ring);
SV_HIDDEN uint32_t sv_send_slot_size(uint32_t max_sge, uint32_t max_inline);
SV_HIDDEN uint32_t sv_recv_slot_size(uint32_t max_sge);

static inline uint64_t *sv_word(const struct sv_ring *ring, unsigned i)
{
	return (uint64_t *)ring->mem + i;
}

static inline uint64_t sv_load(const struct sv_ring *ring, unsigned i)
{
	return __atomic_load_n(sv_word(ring, i), __ATOMIC_ACQUIRE);
}

static inline void sv_store(const struct sv_ring *ring, unsigned i, uint64_t v)
{
	__atomic_store_n(sv_word(ring, i), v, __ATOMIC_RELEASE);
}

static inline void *sv_slot(const struct sv_ring *ring, uint64_t index)
{
	return (char *)ring->mem + SV_RING_HEADER_SIZE + (size_t)(index % ring->nslots) * ring->slot;
}

/* --- objects (verbs.c) ------------------------------------------------------------ */

struct sv_context;

struct sv_cq {
	union {			/* ibv_cq_ex begins with ibv_cq's fields (ibv_cq_ex_to_cq) */
		struct ibv_cq cq;
		struct ibv_cq_ex cqx;	/* a CQ of ibv_create_cq_ex */
	};
	struct sv_ring ring;
	struct sv_context *ctx;
	unsigned empty_polls;	/* consecutive polls that found nothing */
	/* ibv_start_poll .. ibv_end_poll: the CQE being read, and the next index */
	const struct sv_cq_entry *cur;
	uint64_t ci;
};

struct sv_qp {
	struct ibv_qp_ex qpx;	/* first: qpx.qp_base is the program's ibv_qp */
	int is_ex;		/* created with send_ops_flags: ibv_qp_to_qp_ex works */
	struct sv_ring sq, rq;
	uint64_t sq_ci, rq_ci;	/* the application's counts of freed slots */
	struct ibv_qp_cap cap;
	int sq_sig_all;
	int has_sq, has_rq;
	pthread_spinlock_t sq_lock, rq_lock;
	struct sv_context *ctx;
	void *dv;		/* libmlx5's own state for an mlx5dv QP (sv_dv_create_qp) */
};

struct sv_srq {
	struct ibv_srq srq;
	struct sv_ring ring;
	uint64_t released;	/* WQEs whose CQE was polled */
	uint32_t srqn;
	uint32_t max_wr, max_sge;
	pthread_spinlock_t lock;
	struct sv_context *ctx;
};

struct sv_xrcd {
	struct ibv_xrcd xrcd;	/* first: the program's ibv_xrcd */
	uint32_t handle;
};

static inline uint32_t sv_xrcd_handle(struct ibv_xrcd *x)
{
	return ((struct sv_xrcd *)x)->handle;
}

/* Handle -> object, for what CQEs and events name (a QP's rings, an SRQ).
 * events and comp_events count the async and completion events handed to the
 * program for the object, which its destroy waits to see acknowledged, as
 * rdma-core's does with the kernel's events_reported. */
struct sv_map_entry {
	uint32_t handle;
	uint32_t kind;
	void *obj;
	uint32_t events, comp_events;
};

struct sv_context {
	struct verbs_context vctx;	/* must stay first: the program's ibv_context is inside */
	uint32_t handle;
	int ndevice;			/* index in the device list */
	pthread_mutex_t map_lock;
	struct sv_map_entry *map;
	size_t map_len, map_cap;
	struct sv_dm_pool *dm_pool;	/* device memory (ibv_alloc_dm), made on first use */
	/* ibv_import_device: a context imported from a duplicate of another's
	 * cmd_fd shares that context's device context (the same handle) and its
	 * home's map and device memory; home is the opened one (itself when
	 * opened).  The home lives until it and every import of it are closed. */
	struct sv_context *home;
	unsigned imports;		/* home only: open contexts imported from it */
	unsigned forks;			/* home only: sv_forks in the process that opened it */
	int closed;			/* home only: ibv_close_device was called on it */
	dev_t fd_dev;			/* home only: its cmd_fd's file (a memfd) */
	ino_t fd_ino;
	struct sv_context *next;	/* home only: the process's list of homes */
};

static inline struct sv_context *sv_home(struct sv_context *ctx)
{
	return ctx->home;
}

SV_HIDDEN void sv_dm_pool_free(struct sv_dm_pool *pool);

/* How many fork()s this process is from its first ancestor (conn.c counts
 * them in the child).  A forked child shares its parent's contexts and the
 * objects on them (conn.c), as it shares an inherited uverbs file; but a ring
 * belongs to the process that made it: the child's copy of its parent's
 * producer and consumer indexes is stale, so a child that posts to or polls
 * its parent's queues gets EPERM and the parent's rings stay as they were.
 * Queues the child makes, on its parent's context or its own, are its own. */
SV_HIDDEN extern unsigned sv_forks;

static inline int sv_ring_foreign(const struct sv_ring *ring)
{
	return ring->forks != __atomic_load_n(&sv_forks, __ATOMIC_RELAXED);
}

SV_HIDDEN void sv_map_put(struct sv_context *ctx, uint32_t kind, uint32_t handle, void *obj);
SV_HIDDEN void *sv_map_get(struct sv_context *ctx, uint32_t kind, uint32_t handle);
/* sv_map_get for an event about to be handed to the program: counts it
 * (comp: a completion event, else an async event). */
SV_HIDDEN void *sv_map_get_event(struct sv_context *ctx, uint32_t kind, uint32_t handle, int comp);
/* Forget the object; *events and *comp_events (either may be NULL) get the
 * counts of events handed out for it.  After it, no event names the object. */
SV_HIDDEN void sv_map_del(struct sv_context *ctx, uint32_t kind, uint32_t handle,
			  uint32_t *events, uint32_t *comp_events);

static inline struct sv_context *sv_ctx(struct ibv_context *c)
{
	return (struct sv_context *)((char *)c - offsetof(struct sv_context, vctx.context));
}

/* Destroy a service object by kind and handle (pyverbs' close(): what still
 * uses it goes first only with cascade). */
SV_HIDDEN int sv_destroy(uint32_t kind, uint32_t handle);

/* The context's verbs (verbs.c): fills the ops tables. */
SV_HIDDEN void sv_set_ops(struct sv_context *ctx);
/* verbs_context.query_port (device.c) */
SV_HIDDEN int sv_query_device_ex(struct ibv_context *context,
				 const struct ibv_query_device_ex_input *input,
				 struct ibv_device_attr_ex *attr, size_t attr_size);
SV_HIDDEN int sv_query_port(struct ibv_context *context, uint8_t port,
			    struct ibv_port_attr *attr, size_t len);

/* errno-setting helpers */
static inline void *sv_fail_null(int err)
{
	errno = err;
	return NULL;
}

#endif
