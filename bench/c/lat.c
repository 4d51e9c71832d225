/* Ping-pong latency between ranks 0 and 1; same loop and output as tmpi's osu_latency. */
#include "common.h"

int main(int argc, char **argv)
{
    int rank, nprocs;
    struct opts o;
    char *sbuf, *rbuf;
    size_t size;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    opts_or_exit(&o, FAMILY_LATENCY, argc, argv, rank, "lat");
    if (nprocs != 2) {
        if (rank == 0) fprintf(stderr, "This test requires exactly two processes\n");
        MPI_Finalize();
        return EXIT_FAILURE;
    }
    sbuf = alloc_buf(o.max_size, 'a');
    rbuf = alloc_buf(o.max_size, 'b');
    if (rank == 0) {
        print_preamble("tmpi OSU-style Latency Test");
        print_header1("Avg Latency(us)");
    }
    for (size = o.min_size; size <= o.max_size; size = next_size(size)) {
        size_t iters, skip, i;
        double t_total = 0.0, t_start = 0.0;
        opts_loops(&o, size, &iters, &skip);
        memset(sbuf, 'a', size);
        memset(rbuf, 'b', size);
        CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
        for (i = 0; i < iters + skip; i++) {
            if (rank == 0) {
                if (i >= skip) t_start = MPI_Wtime();
                CHECK_MPI(MPI_Send(sbuf, (int)size, MPI_CHAR, 1, 1, MPI_COMM_WORLD));
                CHECK_MPI(MPI_Recv(rbuf, (int)size, MPI_CHAR, 1, 1, MPI_COMM_WORLD,
                                   MPI_STATUS_IGNORE));
                if (i >= skip) t_total += MPI_Wtime() - t_start;
            } else {
                CHECK_MPI(MPI_Recv(rbuf, (int)size, MPI_CHAR, 0, 1, MPI_COMM_WORLD,
                                   MPI_STATUS_IGNORE));
                CHECK_MPI(MPI_Send(sbuf, (int)size, MPI_CHAR, 0, 1, MPI_COMM_WORLD));
            }
        }
        if (rank == 0) print_row1(size, t_total * 1e6 / (2.0 * (double)iters));
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return EXIT_SUCCESS;
}
