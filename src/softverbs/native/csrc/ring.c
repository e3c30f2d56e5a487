/* Rings in shared memory: a memfd both the program and the service map
 * (docs/rings.md gives the layout and who writes which word). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sv.h"

static uint32_t round_up(uint32_t v, uint32_t to)
{
	return (v + to - 1) / to * to;
}

uint32_t sv_send_slot_size(uint32_t max_sge, uint32_t max_inline)
{
	return round_up(sizeof(struct sv_send_wqe_header) +
			(max_sge ? max_sge : 1) * sizeof(struct sv_sg_entry) + max_inline, 64);
}

uint32_t sv_recv_slot_size(uint32_t max_sge)
{
	return round_up(sizeof(struct sv_recv_wqe_header) +
			(max_sge ? max_sge : 1) * sizeof(struct sv_sg_entry), 16);
}

int sv_sealed_memfd(const char *name, size_t bytes)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -1;
	/* The service maps only memfds sealed against shrinking: a shorter file
	 * would make its accesses fault.  The size is fixed for the memfd's life. */
	if (ftruncate(fd, (off_t)bytes) ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		int err = errno;
		close(fd);
		errno = err;
		return -1;
	}
	return fd;
}

int sv_ring_create(struct sv_ring *ring, uint32_t nslots, uint32_t slot, const char *name)
{
	ring->fd = -1;
	ring->mem = NULL;
	if (!nslots || !slot)
		return EINVAL;
	size_t bytes = SV_RING_HEADER_SIZE + (size_t)nslots * slot;
	int fd = sv_sealed_memfd(name, bytes);
	if (fd < 0)
		return errno;
	void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (mem == MAP_FAILED) {
		int err = errno;
		close(fd);
		return err;
	}
	ring->fd = fd;
	ring->mem = mem;
	ring->bytes = bytes;
	ring->nslots = nslots;
	ring->slot = slot;
	ring->forks = __atomic_load_n(&sv_forks, __ATOMIC_RELAXED);
	return 0;
}

void sv_ring_destroy(struct sv_ring *ring)
{
	if (ring->mem)
		munmap(ring->mem, ring->bytes);
	if (ring->fd >= 0)
		close(ring->fd);
	ring->mem = NULL;
	ring->fd = -1;
}
