/* Bidirectional windowed bandwidth 0 <-> 1; same loop and output as tmpi's osu_bibw. */
#include "common.h"

int main(int argc, char **argv)
{
    int rank, nprocs, peer;
    struct opts o;
    char *sbuf, *rbuf;
    MPI_Request *sreq, *rreq;
    size_t size;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    opts_or_exit(&o, FAMILY_BANDWIDTH, argc, argv, rank, "bibw");
    if (nprocs != 2) {
        if (rank == 0) fprintf(stderr, "This test requires exactly two processes\n");
        MPI_Finalize();
        return EXIT_FAILURE;
    }
    peer = 1 - rank;
    sbuf = alloc_buf(o.max_size, 'a');
    rbuf = alloc_buf(slot_stride(o.max_size) * o.window, 'b');
    sreq = malloc(sizeof(MPI_Request) * o.window);
    rreq = malloc(sizeof(MPI_Request) * o.window);
    if (!sreq || !rreq) MPI_Abort(MPI_COMM_WORLD, 1);
    if (rank == 0) {
        print_preamble("tmpi OSU-style Bi-Directional Bandwidth Test");
        print_header1("Bandwidth (MB/s)");
    }
    for (size = o.min_size; size <= o.max_size; size = next_size(size)) {
        size_t iters, skip, i, j, stride = slot_stride(size);
        double t_total = 0.0, t_start = 0.0;
        if (size == 0) continue;
        opts_loops(&o, size, &iters, &skip);
        memset(sbuf, 'a', size);
        for (j = 0; j < o.window; j++) memset(rbuf + j * stride, 'b', size);
        CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
        for (i = 0; i < iters + skip; i++) {
            if (rank == 0 && i >= skip) t_start = MPI_Wtime();
            for (j = 0; j < o.window; j++)
                CHECK_MPI(MPI_Irecv(rbuf + j * stride, (int)size, MPI_CHAR, peer, 10 + peer,
                                    MPI_COMM_WORLD, &rreq[j]));
            for (j = 0; j < o.window; j++)
                CHECK_MPI(MPI_Isend(sbuf, (int)size, MPI_CHAR, peer, 10 + rank, MPI_COMM_WORLD,
                                    &sreq[j]));
            CHECK_MPI(MPI_Waitall((int)o.window, sreq, MPI_STATUSES_IGNORE));
            CHECK_MPI(MPI_Waitall((int)o.window, rreq, MPI_STATUSES_IGNORE));
            if (rank == 0 && i >= skip) t_total += MPI_Wtime() - t_start;
        }
        if (rank == 0)
            print_row1(size,
                       (double)size / 1e6 * (double)iters * (double)o.window * 2.0 / t_total);
    }
    free(sreq);
    free(rreq);
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return EXIT_SUCCESS;
}
