/*
 * allreduce and barrier latency for the peers, with the loops of tmpi's osu_allreduce (f32 sums
 * of size/4 elements, OSU's 1000/100 iterations, 100/10 above 8 KiB) and osu_barrier (1000
 * iterations after 100 warm-up). Output: "allreduce SIZE AVG_US" lines, then "barrier AVG_US".
 * Usage: coll [MAX_SIZE]   (sizes 4, 8, then powers of two up to MAX_SIZE, default 1 MiB)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static double allreduce_us(size_t size, float *s, float *r)
{
    int iters = size > 8192 ? 100 : 1000, skip = size > 8192 ? 10 : 100;
    int count = (int)(size / sizeof(float));
    double t0 = 0.0, sum = 0.0;
    for (int i = 0; i < iters + skip; i++) {
        if (i == skip) t0 = MPI_Wtime();
        MPI_Allreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double local = (MPI_Wtime() - t0) * 1e6 / iters;
    MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return sum / n;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t max = argc > 1 ? strtoull(argv[1], NULL, 10) : (1u << 20);
    float *s = malloc(max + 4), *r = malloc(max + 4);
    for (size_t i = 0; i < max / 4 + 1; i++) s[i] = (float)i, r[i] = 0.0f;
    for (size_t size = 4; size <= max; size *= 2) {
        double us = allreduce_us(size, s, r);
        if (rank == 0) printf("allreduce %-10zu %20.2f\n", size, us);
    }
    double t0 = 0.0;
    for (int i = 0; i < 1100; i++) {
        if (i == 100) t0 = MPI_Wtime();
        MPI_Barrier(MPI_COMM_WORLD);
    }
    double local = (MPI_Wtime() - t0) * 1e6 / 1000, sum = 0.0;
    MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("barrier %20.2f\n", sum / n);
    free(s);
    free(r);
    MPI_Finalize();
    return 0;
}
