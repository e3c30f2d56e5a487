/* The connection to softverbsd: one Unix SOCK_SEQPACKET socket per process.
 *
 * Every control verb is one request and its reply under the connection's
 * lock; the doorbell is a request without a reply.  The first message is
 * HELLO, passing the process's own /proc/self/mem so the service can read
 * and write registered memory anywhere in it.
 *
 * fork(): a child shares its parent's contexts as a child shares an inherited
 * /dev/infiniband/uverbs file: the objects belong to the file, not to a pid.
 * It never speaks on the parent's socket (their requests and replies would
 * mix); on first use it opens one of its own and joins the parent's owner
 * with HELLO_JOIN and the owner's token, a 64-bit secret only the parent's
 * memory holds (the service also requires the same uid).  Its commands then
 * reach the parent's objects and what it creates belongs to the same owner,
 * destroyed when the last connection of that owner closes.  It passes its
 * own /proc/self/mem too: a region it registers is its own pages.  It never
 * touches the rings its parent made (sv_ring_foreign).  If the parent's
 * owner is already gone, the child starts an owner of its own.
 *
 * The send queues' doorbell (docs/rings.md): a DOORBELL message, or -- with
 * SOFTVERBS_DOORBELL=eventfd -- a write of an eventfd passed with HELLO,
 * after which the service rings every queue of ours whose db moved.  Which
 * one is a value (bell_fd), chosen once per connection; a forked child makes
 * its own with its own connection.
 *
 * After HELLO the process names the service its ptracer (name_ptracer), for
 * the service's copies of large transfers under Yama (docs/architecture.md).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "sv.h"

extern char **environ;

static pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;
static int conn_fd = -1;
static pid_t conn_pid;
static uint64_t conn_token;	/* our owner's, from HELLO's reply: a forked child joins it */
static int conn_joinable;	/* conn_token is set */
static uint32_t conn_seq;
/* The doorbell eventfd the service took (SV_FEATURE_DOORBELL_FD), -1: DOORBELL
 * messages; bell_forks is sv_forks when it was made (a forked child's copy of
 * its parent's is not its own). */
static int bell_fd = -1;
static unsigned bell_forks;
/* Send queues this process holds: each write of the eventfd makes the service
 * read the db of every one, so beyond SV_BELL_MAX_QUEUES a post rings by
 * message, whose cost does not grow with them. */
static unsigned bell_queues;

void sv_bell_queues(int delta)
{
	__atomic_add_fetch(&bell_queues, (unsigned)delta, __ATOMIC_RELAXED);
}
static __thread char last_error[256];

const char *sv_last_error(void)
{
	return last_error;
}

static void set_error(const char *msg, size_t len)
{
	if (len >= sizeof(last_error))
		len = sizeof(last_error) - 1;
	memcpy(last_error, msg, len);
	last_error[len] = 0;
	if (getenv("SOFTVERBS_DEBUG"))
		fprintf(stderr, "softverbs: %s\n", last_error);
}

static void set_error_s(const char *msg)
{
	set_error(msg, strlen(msg));
}

static int off_value(const char *v)
{
	return !strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "no") ||
	       !strcasecmp(v, "false");
}

/* The initial network namespace's inode (the kernel's PROC_NET_INIT_INO). */
#define INIT_NETNS_INO 0xEFFFFFF9u

/* "" in the initial network namespace, else "-net<inode>", as
 * softverbs.config.netns_suffix(): each namespace has a host device of its own. */
static void netns_suffix(char *out, size_t len)
{
	struct stat st;
	out[0] = 0;
	if (!stat("/proc/self/ns/net", &st) && st.st_ino != INIT_NETNS_INO)
		snprintf(out, len, "-net%llu", (unsigned long long)st.st_ino);
}

/* The socket path, as softverbs.config.default_socket_path(); 0 or an errno. */
static int socket_path(char *out, size_t len, int *is_default)
{
	const char *env = getenv("SOFTVERBS_SERVICE");
	*is_default = 0;
	if (env && *env && off_value(env)) {
		set_error_s("SOFTVERBS_SERVICE=0 asks for in-process devices, which only Python "
			  "programs have; C programs use the host device (unset it)");
		return ENODEV;
	}
	if (env && *env && strcasecmp(env, "1") && strcasecmp(env, "yes") && strcasecmp(env, "on")) {
		if (snprintf(out, len, "%s", env) >= (int)len)
			return ENAMETOOLONG;
		return 0;
	}
	*is_default = 1;
	char ns[32];
	netns_suffix(ns, sizeof(ns));
	const char *run = getenv("XDG_RUNTIME_DIR");
	int n = run && *run ? snprintf(out, len, "%s/softverbsd%s.sock", run, ns)
			    : snprintf(out, len, "/tmp/softverbs-%u/softverbsd%s.sock", getuid(), ns);
	return n >= (int)len ? ENAMETOOLONG : 0;
}

static int try_connect(const char *path)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(addr.sun_path))
		return -ENAMETOOLONG;
	strcpy(addr.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
		int err = errno;
		close(fd);
		return -err;
	}
	return fd;
}

/* Start the service on demand, as softverbs' Python does: only when
 * SOFTVERBS_PYTHON names the interpreter (softverbs exec sets it). */
static int spawn_service(const char *path, int is_default)
{
	const char *python = getenv("SOFTVERBS_PYTHON");
	if (!python || !*python)
		return ENOENT;
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = 0;
		if (is_default)
			mkdir(dir, 0700);
	}
	const char *idle = getenv("SOFTVERBS_IDLE_EXIT");
	char *argv[] = {(char *)python, "-m", "softverbs.service", "--socket", (char *)path,
			"--idle-exit", (char *)(idle && *idle ? idle : "60"), NULL};
	posix_spawnattr_t attr;
	posix_spawnattr_init(&attr);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	pid_t pid;
	int err = posix_spawnp(&pid, python, &fa, &attr, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	return err;
}

static int send_msg(int fd, const void *buf, size_t len, const int *fds, int nfds)
{
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	union {
		char buf[CMSG_SPACE(SV_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds > SV_MAX_FDS)
		return EINVAL;
	if (nfds > 0) {
		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.buf;
		msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
	}
	for (;;) {
		ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (n == (ssize_t)len)
			return 0;
		if (n < 0 && errno == EINTR)
			continue;
		return n < 0 ? errno : EPROTO;
	}
}

/* Exchange one message with the service; the caller holds conn_lock. */
static int exchange(uint16_t op, const void *req, size_t req_len, const int *fds, int nfds,
		    void *reply, size_t reply_len, void *tail, size_t *tail_len)
{
	static __thread char buf[SV_MAX_MESSAGE];
	size_t len = sizeof(struct sv_header) + req_len;
	if (len > sizeof(buf))
		return EINVAL;
	struct sv_header *h = (struct sv_header *)buf;
	memset(h, 0, sizeof(*h));
	h->length = (uint32_t)len;
	h->op = op;
	h->seq = ++conn_seq;
	if (req_len)
		memcpy(buf + sizeof(*h), req, req_len);
	int err = send_msg(conn_fd, buf, len, fds, nfds);
	/* A service that refuses this connection (another uid) sends its reason
	 * and shuts the connection: read the reason even if our send failed. */
	if (err && err != EPIPE && err != ECONNRESET)
		return err;
	ssize_t n;
	do
		n = recv(conn_fd, buf, sizeof(buf), err ? MSG_DONTWAIT : 0);
	while (n < 0 && errno == EINTR);
	if (n <= 0) {
		set_error_s("the softverbs device service closed the connection");
		return ECONNRESET;
	}
	/* seq 0 with an errno: unsolicited, the service refuses the connection */
	if ((size_t)n < sizeof(*h) || h->length != (uint32_t)n || !(h->flags & SV_FLAG_REPLY) ||
	    (h->seq != conn_seq && !(h->seq == 0 && h->status))) {
		set_error_s("a reply that is not a softverbs reply");
		return EPROTO;
	}
	if (h->status) {
		set_error(buf + sizeof(*h), (size_t)n - sizeof(*h));
		return h->status > 0 ? h->status : EIO;
	}
	size_t body = (size_t)n - sizeof(*h);
	if (body < reply_len) {
		set_error_s("a reply shorter than its record");
		return EPROTO;
	}
	memcpy(reply, buf + sizeof(*h), reply_len);
	if (tail && tail_len) {
		size_t have = body - reply_len;
		if (have > *tail_len)
			have = *tail_len;
		memcpy(tail, buf + sizeof(*h) + reply_len, have);
		*tail_len = have;
	}
	return 0;
}

unsigned sv_forks;

static void count_fork(void)
{
	__atomic_add_fetch(&sv_forks, 1, __ATOMIC_RELAXED);
}

__attribute__((constructor)) static void watch_forks(void)
{
	pthread_atfork(NULL, NULL, count_fork);
}

/* SOFTVERBS_SANITIZE: the device watches this program and writes its
 * reports to our stderr (docs/sanitizer.md).  A malformed value is refused
 * by the device, which says why. */
static int sanitize_locked(void)
{
	const char *v = getenv("SOFTVERBS_SANITIZE");
	if (!v || !*v || !strcmp(v, "0"))
		return 0;
	int fd = STDERR_FILENO;
	char none[1];
	int err = exchange(SV_OP_SANITIZE, v, strlen(v), &fd, 1, none, 0, NULL, NULL);
	if (err)
		fprintf(stderr, "softverbs: %s\n", sv_last_error());
	return err;
}

int sv_sanitizing(void)
{
	const char *v = getenv("SOFTVERBS_SANITIZE");
	if (!v || !*v || !strcmp(v, "0"))
		return 0;
	return strncmp(v, "json", 4) ? 1 : 2;
}

/* SOFTVERBS_DOORBELL (softverbs.config.DOORBELLS; unset: "eventfd", as
 * config.DEFAULT_DOORBELL): an eventfd to pass with HELLO, or -1.  A word it
 * does not know is reported and rings by message. */
static int doorbell_eventfd(void)
{
	const char *v = getenv("SOFTVERBS_DOORBELL");
	if (v && *v && !strcasecmp(v, "message"))
		return -1;
	if (v && *v && strcasecmp(v, "eventfd")) {
		fprintf(stderr, "softverbs: SOFTVERBS_DOORBELL=%s: give message or eventfd (how a "
			"process rings its send queues); ringing by message\n", v);
		return -1;
	}
	return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61	/* <linux/prctl.h>: Yama's */
#endif

/* After HELLO: name the service our ptracer, so that under Yama's
 * ptrace_scope 1 it may copy our memory with process_vm_readv/writev
 * (docs/architecture.md, *Copies that bypass the descriptor*); as
 * softverbs.verbs.served.name_ptracer.  Only when the pid the reply gives is
 * the process at the other end of our socket (SO_PEERCRED, in our pid
 * namespace; 0 if not in it) and not ourselves: a service in another pid
 * namespace, whose pid would name another process here, is not named.  Never
 * PR_SET_PTRACER_ANY.  Yama keeps one ptracer per process, so this replaces
 * one the program named itself (a crash handler's); SOFTVERBS_NO_PTRACER=1
 * leaves it alone.  Every error is ignored: EINVAL without Yama, and the
 * service copies through the descriptor when it may not ptrace us. */
static void name_ptracer(uint32_t service_pid)
{
	const char *v = getenv("SOFTVERBS_NO_PTRACER");
	if (v && *v && !off_value(v))
		return;
	struct ucred peer;
	socklen_t len = sizeof(peer);
	if (!service_pid || service_pid == (uint32_t)getpid() ||
	    getsockopt(conn_fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) || len < sizeof(peer) ||
	    peer.pid <= 0 || (uint32_t)peer.pid != service_pid)
		return;
	int saved = errno;
	prctl(PR_SET_PTRACER, (unsigned long)service_pid, 0UL, 0UL, 0UL);
	errno = saved;
}

/* HELLO with our memory and, if asked for, a doorbell eventfd; the eventfd
 * becomes bell_fd if the service took it. */
static int hello_locked(struct sv_hello *hello, int mem, struct sv_hello_reply *rep)
{
	int fds[2], nfds = 0;
	int bell = doorbell_eventfd();
	if (mem >= 0)
		fds[nfds++] = mem;
	if (bell >= 0) {
		fds[nfds++] = bell;
		hello->flags |= SV_HELLO_DOORBELL_FD;
	}
	int err = exchange(SV_OP_HELLO, hello, sizeof(*hello), fds, nfds, rep, sizeof(*rep),
			   NULL, NULL);
	if (bell >= 0) {
		if (!err && (rep->features & SV_FEATURE_DOORBELL_FD)) {
			bell_forks = __atomic_load_n(&sv_forks, __ATOMIC_RELAXED);
			__atomic_store_n(&bell_fd, bell, __ATOMIC_RELEASE);
		} else {
			close(bell);
		}
	}
	return err;
}

static int connect_locked(void)
{
	if (conn_fd >= 0 && conn_pid == getpid())
		return 0;
	int join = 0;
	if (conn_fd >= 0) {	/* a forked child: the parent's socket is not ours */
		close(conn_fd);
		conn_fd = -1;
		join = conn_joinable;
		int bell = __atomic_exchange_n(&bell_fd, -1, __ATOMIC_ACQ_REL);
		if (bell >= 0)
			close(bell);	/* our copy of the parent's: it rings the parent's queues */
	}
	char path[PATH_MAX];
	int is_default;
	int err = socket_path(path, sizeof(path), &is_default);
	if (err)
		return err;
	int fd = try_connect(path);
	if (fd == -ENOENT || fd == -ECONNREFUSED) {
		if (spawn_service(path, is_default) == 0) {
			for (int i = 0; i < 300 && fd < 0; i++) {
				struct timespec ts = {0, 50 * 1000 * 1000};
				nanosleep(&ts, NULL);
				fd = try_connect(path);
			}
		}
	}
	if (fd < 0) {
		char msg[sizeof(last_error)];
		int m = snprintf(msg, sizeof(msg), "cannot reach the softverbs device service at %s "
			"(%s); start it with 'softverbs service start', or run the program "
			"with 'softverbs exec'", path, strerror(-fd));
		set_error(msg, m > 0 ? (size_t)m : 0);
		return -fd;
	}
	conn_fd = fd;
	conn_pid = getpid();
	int mem = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
	struct sv_hello hello = {.version = SV_PROTOCOL_VERSION, .pid = (uint32_t)getpid()};
	if (mem >= 0)
		hello.flags = SV_HELLO_MEMORY;
	struct sv_hello_reply rep;
	if (join) {
		struct sv_hello joining = hello;
		joining.flags |= SV_HELLO_JOIN;
		joining.token = conn_token;
		err = hello_locked(&joining, mem, &rep);
		join = !err;
	}
	/* not forked, or the parent's owner is gone (EPERM): an owner of our own */
	if (!join)
		err = hello_locked(&hello, mem, &rep);
	if (mem >= 0)
		close(mem);
	if (!err) {
		conn_token = rep.token;
		conn_joinable = 1;
		name_ptracer(rep.service_pid);
		/* a joined owner is watched already, its reports going where the parent's go */
		if (!join)
			err = sanitize_locked();
	}
	if (err) {
		close(conn_fd);
		conn_fd = -1;
	}
	return err;
}

int sv_connect(void)
{
	pthread_mutex_lock(&conn_lock);
	int err = connect_locked();
	pthread_mutex_unlock(&conn_lock);
	return err;
}

int sv_call(uint16_t op, const void *req, size_t req_len, const int *fds, int nfds, void *reply,
	    size_t reply_len, void *tail, size_t *tail_len)
{
	pthread_mutex_lock(&conn_lock);
	int err = connect_locked();
	if (!err)
		err = exchange(op, req, req_len, fds, nfds, reply, reply_len, tail, tail_len);
	pthread_mutex_unlock(&conn_lock);
	if (err)
		errno = err;	/* as rdma-core's failed kernel command leaves it */
	return err;
}

void sv_doorbell(uint32_t qp, uint32_t queue)
{
	/* A send queue's db moved: a write of the eventfd is the whole doorbell
	 * (the service compares every db of ours).  A receive queue's, or a
	 * failed write (the counter full, the descriptor closed): the message. */
	int bell = __atomic_load_n(&bell_fd, __ATOMIC_ACQUIRE);
	if (queue == SV_DB_SQ && bell >= 0 &&
	    bell_forks == __atomic_load_n(&sv_forks, __ATOMIC_RELAXED) &&
	    __atomic_load_n(&bell_queues, __ATOMIC_RELAXED) <= SV_BELL_MAX_QUEUES) {
		uint64_t one = 1;
		if (write(bell, &one, sizeof(one)) == (ssize_t)sizeof(one))
			return;
	}
	char buf[sizeof(struct sv_header) + sizeof(struct sv_doorbell)];
	struct sv_header *h = (struct sv_header *)buf;
	struct sv_doorbell db = {.qp = qp, .queue = queue};
	pthread_mutex_lock(&conn_lock);
	if (conn_fd >= 0 && conn_pid == getpid()) {
		memset(h, 0, sizeof(*h));
		h->length = sizeof(buf);
		h->op = SV_OP_DOORBELL;
		h->seq = ++conn_seq;
		memcpy(buf + sizeof(*h), &db, sizeof(db));
		send_msg(conn_fd, buf, sizeof(buf), NULL, 0);
	}
	pthread_mutex_unlock(&conn_lock);
}

int sv_destroy(uint32_t kind, uint32_t handle)
{
	struct sv_destroy d = {.kind = kind, .handle = handle};
	char none[1];
	return sv_call(SV_OP_DESTROY, &d, sizeof(d), NULL, 0, none, 0, NULL, NULL);
}

/* --- for librdmacm (exported as SOFTVERBS_PRIVATE_1) ----------------------------------- */

/* One RDMA CM command: operation ``op`` (an SV_OP_CM_*) with its request
 * record, and its reply record of ``reply_len`` bytes.  0 or an errno;
 * sv_cm_error() says why. */
int sv_cm_call(uint16_t op, const void *req, size_t req_len, void *reply, size_t reply_len)
{
	char none[1];
	return sv_call(op, req, req_len, NULL, 0, reply_len ? reply : none, reply_len, NULL,
		       NULL);
}

/* The socket the events of CM event channel ``channel`` go to. */
int sv_cm_events(uint32_t channel, int fd)
{
	struct sv_handle h = {.handle = channel};
	char none[1];
	return sv_call(SV_OP_CM_EVENTS, &h, sizeof(h), &fd, 1, none, 0, NULL, NULL);
}

const char *sv_cm_error(void)
{
	return sv_last_error();
}
