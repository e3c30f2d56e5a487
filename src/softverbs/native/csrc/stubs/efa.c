/* libefa.so.1 for programs linked against it (perftest): softverbs is not an
 * EFA device; every efadv entry point says so (NULL with errno, or EOPNOTSUPP). */
#include <errno.h>
#include <stddef.h>

void *efadv_create_qp_ex(void);
void *efadv_create_qp_ex(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

int efadv_query_device(void);
int efadv_query_device(void)
{
	return EOPNOTSUPP;
}
