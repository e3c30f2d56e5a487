/* What softverbs' C libraries answer where tests/native/test_abi.py only checks
 * that a symbol is there: rdma_getaddrinfo by librdmacm's rules (with the
 * addresses in the hints and no node or service, as libfabric asks), and the
 * unsupported tables' answers (unsupported.h).  No device is needed.  Prints
 * "ok N" per check; exits 1 at the first failure, saying what it was. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/efadv.h>
#include <infiniband/mlx5dv.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int checks;

#define CHECK(cond) do { \
	if (!(cond)) { \
		printf("FAIL line %d: %s (errno %d: %s)\n", __LINE__, #cond, errno, strerror(errno)); \
		exit(1); \
	} \
	printf("ok %d\n", ++checks); \
} while (0)

static struct sockaddr_in sin4(const char *ip, unsigned port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

static void getaddrinfo_hints_only(void)
{
	struct sockaddr_in dst = sin4("127.0.0.1", 7471), src = sin4("127.0.0.2", 0);
	struct rdma_addrinfo hints = {
		.ai_family = AF_INET, .ai_qp_type = IBV_QPT_RC, .ai_port_space = RDMA_PS_TCP,
		.ai_src_len = sizeof(src), .ai_src_addr = (struct sockaddr *)&src,
		.ai_dst_len = sizeof(dst), .ai_dst_addr = (struct sockaddr *)&dst,
	};
	struct rdma_addrinfo *res = NULL;
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0 && res);
	CHECK(res->ai_family == AF_INET && res->ai_qp_type == IBV_QPT_RC &&
	      res->ai_port_space == RDMA_PS_TCP && res->ai_flags == 0);
	/* copies, not the caller's buffers */
	CHECK(res->ai_dst_len == sizeof(dst) && res->ai_dst_addr != (struct sockaddr *)&dst &&
	      !memcmp(res->ai_dst_addr, &dst, sizeof(dst)));
	CHECK(res->ai_src_len == sizeof(src) && res->ai_src_addr != (struct sockaddr *)&src &&
	      !memcmp(res->ai_src_addr, &src, sizeof(src)));
	rdma_freeaddrinfo(res);

	/* passive, source only: the answer is the source */
	struct rdma_addrinfo passive = {
		.ai_flags = RAI_PASSIVE, .ai_family = AF_INET, .ai_port_space = RDMA_PS_UDP,
		.ai_src_len = sizeof(src), .ai_src_addr = (struct sockaddr *)&src,
	};
	res = NULL;
	CHECK(rdma_getaddrinfo(NULL, NULL, &passive, &res) == 0 && res);
	CHECK(res->ai_flags == RAI_PASSIVE && res->ai_port_space == RDMA_PS_UDP &&
	      !res->ai_dst_addr && res->ai_dst_len == 0 &&
	      res->ai_src_len == sizeof(src) && !memcmp(res->ai_src_addr, &src, sizeof(src)));
	rdma_freeaddrinfo(res);

	/* nothing at all to resolve */
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL);
}

static void getaddrinfo_node(void)
{
	struct sockaddr_in src = sin4("127.0.0.2", 0);
	/* a UD QP type: a datagram socket, so the UDP port space */
	struct rdma_addrinfo hints = {
		.ai_flags = RAI_NUMERICHOST, .ai_qp_type = IBV_QPT_UD,
		.ai_src_len = sizeof(src), .ai_src_addr = (struct sockaddr *)&src,
	};
	struct rdma_addrinfo *res = NULL;
	CHECK(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res) == 0 && res);
	struct sockaddr_in *d = (struct sockaddr_in *)res->ai_dst_addr;
	CHECK(res->ai_family == AF_INET && res->ai_qp_type == IBV_QPT_UD &&
	      res->ai_port_space == RDMA_PS_UDP && d && d->sin_port == htons(7471) &&
	      d->sin_addr.s_addr == htonl(INADDR_LOOPBACK));
	/* the hints' source is the answer's, when resolving gave none */
	CHECK(res->ai_src_addr && !memcmp(res->ai_src_addr, &src, sizeof(src)));
	rdma_freeaddrinfo(res);

	/* no hints: the first answer, a stream socket: RC in the TCP port space */
	res = NULL;
	CHECK(rdma_getaddrinfo("127.0.0.1", "7471", NULL, &res) == 0 && res);
	CHECK(res->ai_qp_type == IBV_QPT_RC && res->ai_port_space == RDMA_PS_TCP &&
	      res->ai_dst_addr && !res->ai_src_addr);
	rdma_freeaddrinfo(res);

	/* passive with a service only: the wildcard source */
	struct rdma_addrinfo ph = {.ai_flags = RAI_PASSIVE, .ai_family = AF_INET};
	res = NULL;
	CHECK(rdma_getaddrinfo(NULL, "7471", &ph, &res) == 0 && res);
	struct sockaddr_in *s = (struct sockaddr_in *)res->ai_src_addr;
	CHECK(res->ai_flags == RAI_PASSIVE && s && s->sin_addr.s_addr == htonl(INADDR_ANY) &&
	      s->sin_port == htons(7471) && !res->ai_dst_addr);
	rdma_freeaddrinfo(res);

	errno = 0;
	CHECK(rdma_getaddrinfo("no-such-host.invalid", NULL, NULL, &res) == -1 && errno);
}

static void unsupported(void)
{
	errno = 0;
	CHECK(rsocket(AF_INET, SOCK_STREAM, 0) == -1 && errno == ENOSYS);
	errno = 0;
	CHECK(rsend(3, "x", 1, 0) == -1 && errno == ENOSYS);
	errno = 0;
	CHECK(riomap(3, NULL, 0, 0, 0, 0) == -1 && errno == ENOSYS);
	errno = 0;
	CHECK(rdma_set_local_ece(NULL, NULL) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(efadv_create_cq(NULL, NULL, NULL, 0) == NULL && errno == EOPNOTSUPP);
	CHECK(efadv_query_ah(NULL, NULL, 0) == EOPNOTSUPP);
	errno = 0;
	CHECK(mlx5dv_dr_domain_create(NULL, MLX5DV_DR_DOMAIN_TYPE_NIC_RX) == NULL &&
	      errno == EOPNOTSUPP);
	CHECK(mlx5dv_devx_query_eqn(NULL, 0, NULL) == EOPNOTSUPP);

	/* rpoll and rselect: every descriptor is an ordinary one */
	int p[2];
	CHECK(pipe(p) == 0 && write(p[1], "x", 1) == 1);
	struct pollfd pfd = {.fd = p[0], .events = POLLIN};
	CHECK(rpoll(&pfd, 1, 1000) == 1 && (pfd.revents & POLLIN));
	fd_set rd;
	FD_ZERO(&rd);
	FD_SET(p[0], &rd);
	struct timeval tv = {.tv_sec = 1};
	CHECK(rselect(p[0] + 1, &rd, NULL, NULL, &tv) == 1 && FD_ISSET(p[0], &rd));
	close(p[0]);
	close(p[1]);
}

int main(void)
{
	getaddrinfo_hints_only();
	getaddrinfo_node();
	unsupported();
	printf("all %d ok\n", checks);
	return 0;
}
