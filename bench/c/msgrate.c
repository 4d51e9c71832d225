/*
 * Multi-pair message rate (default 8-byte messages, window 64): ranks 0..P-1 each stream to
 * rank + P, P = nprocs / 2. Same loop and output as tmpi's `osu_mbw_mr -m 8:8`.
 */
#include "common.h"

int main(int argc, char **argv)
{
    int rank, nprocs, pairs;
    struct opts o;
    char *sbuf, *rbuf;
    MPI_Request *req;
    MPI_Comm senders;
    size_t size;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    opts_defaults(&o, FAMILY_BANDWIDTH);
    o.min_size = o.max_size = 8;
    {
        int r = opts_parse(&o, argc, argv);
        if (r != 0) {
            if (rank == 0)
                fprintf(r > 0 ? stdout : stderr,
                        "Usage: mpirun -np N msgrate [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] "
                        "[-W WINDOW] [-h]   (default -m 8:8)\n");
            MPI_Finalize();
            return r > 0 ? EXIT_SUCCESS : EXIT_FAILURE;
        }
    }
    if (nprocs < 2) {
        if (rank == 0) fprintf(stderr, "This test requires at least two processes\n");
        MPI_Finalize();
        return EXIT_FAILURE;
    }
    pairs = nprocs / 2;
    sbuf = alloc_buf(o.max_size, 'a');
    rbuf = alloc_buf(slot_stride(o.max_size) * o.window, 'b');
    req = malloc(sizeof(MPI_Request) * o.window);
    if (!req) MPI_Abort(MPI_COMM_WORLD, 1);
    CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, rank < pairs, 0, &senders));
    if (rank == 0) {
        printf("# tmpi OSU-style Multiple Bandwidth / Message Rate Test\n");
        printf("# [ pairs: %d ] [ window size: %zu ]\n", pairs, o.window);
        printf("%-*s%*s%*s\n", SIZE_WIDTH, "# Size", FIELD_WIDTH, "MB/s", FIELD_WIDTH,
               "Messages/s");
        fflush(stdout);
    }
    for (size = o.min_size; size <= o.max_size; size = next_size(size)) {
        size_t iters, skip, i, j, stride = slot_stride(size);
        double t = 0.0, t_start = 0.0, t_sum = 0.0;
        if (size == 0) continue;
        opts_loops(&o, size, &iters, &skip);
        memset(sbuf, 'a', size);
        for (j = 0; j < o.window; j++) memset(rbuf + j * stride, 'b', size);
        CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
        for (i = 0; i < iters + skip; i++) {
            CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
            if (rank < pairs) {
                int target = rank + pairs;
                if (i >= skip) t_start = MPI_Wtime();
                for (j = 0; j < o.window; j++)
                    CHECK_MPI(MPI_Isend(sbuf, (int)size, MPI_CHAR, target, 100, MPI_COMM_WORLD,
                                        &req[j]));
                CHECK_MPI(MPI_Waitall((int)o.window, req, MPI_STATUSES_IGNORE));
                CHECK_MPI(MPI_Recv(rbuf, 1, MPI_CHAR, target, 101, MPI_COMM_WORLD,
                                   MPI_STATUS_IGNORE));
                if (i >= skip) t += MPI_Wtime() - t_start;
            } else if (rank < 2 * pairs) {
                int source = rank - pairs;
                for (j = 0; j < o.window; j++)
                    CHECK_MPI(MPI_Irecv(rbuf + j * stride, (int)size, MPI_CHAR, source, 100,
                                        MPI_COMM_WORLD, &req[j]));
                CHECK_MPI(MPI_Waitall((int)o.window, req, MPI_STATUSES_IGNORE));
                CHECK_MPI(MPI_Send(sbuf, 1, MPI_CHAR, source, 101, MPI_COMM_WORLD));
            }
        }
        CHECK_MPI(MPI_Reduce(&t, &t_sum, 1, MPI_DOUBLE, MPI_SUM, 0, senders));
        if (rank == 0) {
            double t_avg = t_sum / pairs;
            double bw = (double)size / 1e6 * pairs * (double)iters * (double)o.window / t_avg;
            printf("%-*zu%*.*f%*.*f\n", SIZE_WIDTH, size, FIELD_WIDTH, FLOAT_PRECISION, bw,
                   FIELD_WIDTH, FLOAT_PRECISION, bw * 1e6 / (double)size);
            fflush(stdout);
        }
    }
    MPI_Comm_free(&senders);
    free(req);
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return EXIT_SUCCESS;
}
