/* A program that reaches the host device, forks, and reaches it from the child
 * too (tests/native/test_c_ptracer.py): each process's connection says HELLO,
 * after which the C library names the service the process's ptracer
 * (csrc/conn.c, name_ptracer).  Whatever prctl answers, every verb works:
 * one line per check, "ok ..." or "FAIL ..."; exits 0 if all hold. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "check.h"

/* The first device opened, a PD made and freed, the device closed. */
static void use_the_device(const char *who)
{
	char what[128];
	struct ibv_context *ctx = open_first_device();
	if (!ctx)
		return;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	snprintf(what, sizeof(what), "%s: a PD on the device", who);
	check(pd != NULL, what);
	if (pd)
		ibv_dealloc_pd(pd);
	snprintf(what, sizeof(what), "%s: the device closes", who);
	check(ibv_close_device(ctx) == 0, what);
}

int main(void)
{
	use_the_device("parent");
	fflush(stdout);
	pid_t child = fork();
	if (child == 0) {
		use_the_device("child");
		_exit(failures ? 1 : 0);
	}
	int status = 0;
	check(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
		      WEXITSTATUS(status) == 0,
	      "parent: the child's verbs worked");
	return failures ? 1 : 0;
}
