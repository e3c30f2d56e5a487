/* A two-rank MPI ping-pong that checks every byte (tests/thirdparty/test_mpi.py).
 *
 *   mpi_pingpong ITERATIONS SIZE...
 *
 * For each SIZE in turn, ITERATIONS times: rank 0 sends SIZE bytes, rank 1 checks them and sends back their
 * complement, rank 0 checks that; the pattern changes every iteration, so a
 * stale or short message is caught.  Rank 0 prints, per size,
 * "pingpong SIZE bytes N iterations errors E usec/roundtrip T" (a size of
 * 1 MiB or more runs ITERATIONS / 10 times, at least 10); the exit status is
 * 1 if any byte was wrong.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned char pattern(int it, size_t i)
{
	return (unsigned char)(it * 31 + (int)(i % 251) + (int)(i >> 12));
}

/* one size: the bytes rank 0 found wrong, summed over both ranks */
static long pingpong(int rank, size_t len, int iters, double *usec)
{
	unsigned char *buf = malloc(len ? len : 1);
	long errors = 0, total = 0;
	if (!buf)
		MPI_Abort(MPI_COMM_WORLD, 3);
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (int it = 0; it < iters; it++) {
		if (rank == 0) {
			for (size_t i = 0; i < len; i++)
				buf[i] = pattern(it, i);
			MPI_Send(buf, (int)len, MPI_BYTE, 1, it, MPI_COMM_WORLD);
			MPI_Recv(buf, (int)len, MPI_BYTE, 1, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (size_t i = 0; i < len; i++)
				errors += buf[i] != (unsigned char)~pattern(it, i);
		} else {
			MPI_Recv(buf, (int)len, MPI_BYTE, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (size_t i = 0; i < len; i++) {
				errors += buf[i] != pattern(it, i);
				buf[i] = (unsigned char)~buf[i];
			}
			MPI_Send(buf, (int)len, MPI_BYTE, 0, it, MPI_COMM_WORLD);
		}
	}
	*usec = iters ? (MPI_Wtime() - t0) * 1e6 / iters : 0.0;
	MPI_Reduce(&errors, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
	free(buf);
	return total;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (argc < 3 || size != 2) {
		if (rank == 0)
			fprintf(stderr, "usage: mpirun -np 2 %s ITERATIONS SIZE...\n", argv[0]);
		MPI_Finalize();
		return 2;
	}
	int iters = atoi(argv[1]);
	long bad = 0;
	for (int a = 2; a < argc; a++) {
		size_t len = strtoul(argv[a], NULL, 0);
		int n = len >= (1u << 20) ? (iters / 10 > 10 ? iters / 10 : 10) : iters;
		double usec;
		long errors = pingpong(rank, len, n, &usec);
		bad += errors;
		if (rank == 0)
			printf("pingpong %zu bytes %d iterations errors %ld usec/roundtrip %.1f\n", len, n,
			       errors, usec);
	}
	MPI_Finalize();
	return bad ? 1 : 0;
}
