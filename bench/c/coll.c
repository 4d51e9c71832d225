/*
 * Collective latency for the peers, with the loops and the output of tmpi's osu_allreduce and
 * osu_barrier (OSU Micro-Benchmarks' osu_allreduce and osu_barrier):
 *   coll allreduce [-m [MIN:]MAX] [-i N] [-x N]   f32 sums of size/4 elements (sizes below 4
 *                                                 skipped); each timed call is followed by an
 *                                                 untimed barrier; 1000/100 iterations up to
 *                                                 8 KiB, 100/10 above; sizes 1..1 MiB by default
 *   coll bcast [-m [MIN:]MAX] [-i N] [-x N]       bytes from rank 0 (as osu_bcast); each timed
 *                                                 call is followed by an untimed barrier;
 *                                                 iterations as allreduce
 *   coll barrier [-i N] [-x N]                    1000 barriers after 100 warm-up
 * The figure is each rank's mean time per call, averaged over the ranks; rows as tmpi prints
 * them ("SIZE AVG" for allreduce and bcast, a lone "AVG" for barrier).
 */
#include "common.h"

static double avg_over_ranks(double local)
{
    double sum = 0.0;
    int n;
    CHECK_MPI(MPI_Reduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD));
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return sum / n;
}

enum sized { ALLREDUCE, BCAST };

/* allreduce (f32 sums of size/4 elements; sizes below 4 skipped) or bcast (size bytes from
 * rank 0): each timed call is followed by an untimed barrier; one row per size. */
static void sized(const struct opts *o, int rank, enum sized which)
{
    char *s = alloc_buf(o->max_size, 0), *r = alloc_buf(o->max_size, 0);
    if (rank == 0) {
        print_preamble(which == ALLREDUCE ? "tmpi OSU-style Allreduce Latency Test"
                                          : "tmpi OSU-style Broadcast Latency Test");
        print_header1("Avg Latency(us)");
    }
    for (size_t size = o->min_size; size <= o->max_size; size = next_size(size)) {
        size_t count = which == ALLREDUCE ? size / sizeof(float) : size, iters, skip;
        double timer = 0.0, avg;
        if (count == 0) continue;
        opts_loops(o, size, &iters, &skip);
        if (which == ALLREDUCE)
            for (size_t i = 0; i < count; i++) ((float *)s)[i] = 1.0f;
        else
            memset(s, 'a', size);
        CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
        for (size_t i = 0; i < iters + skip; i++) {
            double t0 = MPI_Wtime(), t1;
            if (which == ALLREDUCE)
                CHECK_MPI(MPI_Allreduce(s, r, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
            else
                CHECK_MPI(MPI_Bcast(s, (int)count, MPI_CHAR, 0, MPI_COMM_WORLD));
            t1 = MPI_Wtime();
            CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
            if (i >= skip) timer += t1 - t0;
        }
        avg = avg_over_ranks(timer * 1e6 / (double)iters);
        if (rank == 0) print_row1(size, avg);
        CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
    }
    free(s);
    free(r);
}

static void barrier(const struct opts *o, int rank)
{
    size_t iters, skip;
    double timer = 0.0, avg;
    opts_loops(o, 0, &iters, &skip);
    if (rank == 0) {
        print_preamble("tmpi OSU-style Barrier Latency Test");
        printf("# Avg Latency(us)\n");
    }
    for (size_t i = 0; i < iters + skip; i++) {
        double t0 = MPI_Wtime();
        CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
        if (i >= skip) timer += MPI_Wtime() - t0;
    }
    CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
    avg = avg_over_ranks(timer * 1e6 / (double)iters);
    if (rank == 0) {
        printf("%17.*f\n", FLOAT_PRECISION, avg);
        fflush(stdout);
    }
}

int main(int argc, char **argv)
{
    int rank, nprocs, which;
    struct opts o;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    which = argc < 2                            ? -1
            : strcmp(argv[1], "allreduce") == 0 ? 0
            : strcmp(argv[1], "barrier") == 0   ? 1
            : strcmp(argv[1], "bcast") == 0     ? 2
                                                : -1;
    if (which < 0) {
        if (rank == 0) fprintf(stderr, "Usage: mpirun -np N coll allreduce|bcast|barrier [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-h]\n");
        MPI_Finalize();
        return EXIT_FAILURE;
    }
    /* getopt sees the benchmark name as the program name. */
    opts_or_exit(&o, FAMILY_COLLECTIVE, argc - 1, argv + 1, rank,
                 which == 0 ? "coll allreduce" : which == 1 ? "coll barrier" : "coll bcast");
    if (nprocs < 2) {
        if (rank == 0) fprintf(stderr, "This test requires at least two processes\n");
        MPI_Finalize();
        return EXIT_FAILURE;
    }
    if (which == 1)
        barrier(&o, rank);
    else
        sized(&o, rank, which == 0 ? ALLREDUCE : BCAST);
    MPI_Finalize();
    return EXIT_SUCCESS;
}
