/*
 * Ping-pong latency while the matching queues are deep: the loops and the output of tmpi's
 * osu_latency_depth, for the peers.
 *
 * Ranks 0 and 1 ping-pong (tag 1) while each holds D entries that every match has to get past:
 *   posted-specific  D receives from the peer on tag 77, never sent, stay posted (cancelled and
 *                    checked at the end);
 *   posted-any       the same with MPI_ANY_SOURCE receives;
 *   unexpected       D one-word messages from the peer on tag 78 wait unreceived (received and
 *                    checked in order at the end).
 * Defaults: D in 0 16 256 1024 4096, sizes 8 and 1024 bytes, every variant.
 * Usage: depth [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-v VARIANT[,VARIANT...]] [-d D[,D...]] [-h]
 */
#include "common.h"

#define PING 1
#define NEVER 77
#define LATER 78
#define MAX_LIST 32

enum variant { POSTED_SPECIFIC, POSTED_ANY, UNEXPECTED, NVARIANTS };

static const char *const variant_name[NVARIANTS] = {"posted-specific", "posted-any", "unexpected"};
static const char *const variant_text[NVARIANTS] = {
    "D never-matching receives from the peer stay posted",
    "D never-matching ANY_SOURCE receives stay posted",
    "D unreceived messages from the peer wait in the unexpected queue",
};

struct depth_opts {
    struct opts o;
    int sizes_given;
    int variants[NVARIANTS];
    size_t depths[MAX_LIST];
    size_t ndepths;
};

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: mpirun -np 2 depth [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] "
            "[-v VARIANT[,VARIANT...]] [-d D[,D...]] [-h]\n"
            "  -v  posted-specific, posted-any, unexpected (default: all three)\n"
            "  -d  queue depths (default 0,16,256,1024,4096)\n"
            "  -m  sizes, doubling (default: 8 and 1024 only)\n");
}

/* Returns 0 to run, 1 after -h, -1 on a bad command line. */
static int parse(struct depth_opts *d, int argc, char **argv)
{
    static const size_t default_depths[] = {0, 16, 256, 1024, 4096};
    int c, any_variant = 0;
    size_t n;
    char buf[256], *tok, *save;

    opts_defaults(&d->o, FAMILY_LATENCY);
    d->sizes_given = 0;
    d->ndepths = 0;
    for (int v = 0; v < NVARIANTS; v++) d->variants[v] = 0;
    while ((c = getopt(argc, argv, "m:i:x:v:d:h")) != -1) {
        switch (c) {
        case 'h':
            return 1;
        case 'm': {
            char *colon;
            if (strlen(optarg) >= sizeof buf) return -1;
            strcpy(buf, optarg);
            colon = strchr(buf, ':');
            if (!colon) {
                if (parse_size(buf, &d->o.max_size)) return -1;
            } else {
                *colon = '\0';
                if (buf[0] == '\0' && colon[1] == '\0') return -1;
                if (buf[0] && parse_size(buf, &d->o.min_size)) return -1;
                if (colon[1] && parse_size(colon + 1, &d->o.max_size)) return -1;
            }
            d->sizes_given = 1;
            break;
        }
        case 'i':
            if (parse_size(optarg, &n) || n == 0) return -1;
            d->o.iterations = d->o.iterations_large = n;
            break;
        case 'x':
            if (parse_size(optarg, &n)) return -1;
            d->o.skip = d->o.skip_large = n;
            break;
        case 'v':
            if (strlen(optarg) >= sizeof buf) return -1;
            strcpy(buf, optarg);
            for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                int found = 0;
                for (int v = 0; v < NVARIANTS; v++) {
                    if (strcmp(tok, variant_name[v]) == 0) d->variants[v] = found = any_variant = 1;
                }
                if (!found) return -1;
            }
            break;
        case 'd':
            if (strlen(optarg) >= sizeof buf) return -1;
            strcpy(buf, optarg);
            d->ndepths = 0;
            for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (d->ndepths == MAX_LIST || parse_size(tok, &n) || n > (1u << 20)) return -1;
                d->depths[d->ndepths++] = n;
            }
            if (d->ndepths == 0) return -1;
            break;
        default:
            return -1;
        }
    }
    if (optind != argc || d->o.min_size > d->o.max_size) return -1;
    if (!any_variant)
        for (int v = 0; v < NVARIANTS; v++) d->variants[v] = 1;
    if (d->ndepths == 0) {
        d->ndepths = sizeof default_depths / sizeof default_depths[0];
        for (size_t i = 0; i < d->ndepths; i++) d->depths[i] = default_depths[i];
    }
    return 0;
}

/* iters + skip ping-pongs of size bytes; the mean one-way latency in us (at rank 0). */
static double pingpong(int rank, char *s, char *r, size_t size, size_t iters, size_t skip)
{
    int peer = 1 - rank;
    double total = 0.0;
    for (size_t i = 0; i < iters + skip; i++) {
        if (rank == 0) {
            double t0 = MPI_Wtime();
            CHECK_MPI(MPI_Send(s, (int)size, MPI_CHAR, peer, PING, MPI_COMM_WORLD));
            CHECK_MPI(MPI_Recv(r, (int)size, MPI_CHAR, peer, PING, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
            if (i >= skip) total += MPI_Wtime() - t0;
        } else {
            CHECK_MPI(MPI_Recv(r, (int)size, MPI_CHAR, peer, PING, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
            CHECK_MPI(MPI_Send(s, (int)size, MPI_CHAR, peer, PING, MPI_COMM_WORLD));
        }
    }
    return total * 1e6 / (2.0 * (double)iters);
}

/* The ping-pong with depth never-matching receives posted; checks they were all cancelled. */
static double with_posted(int rank, int any, size_t depth, char *s, char *r, size_t size,
                          size_t iters, size_t skip)
{
    int src = any ? MPI_ANY_SOURCE : 1 - rank;
    double lat;
    size_t not_cancelled = 0;
    char *dummies = malloc(depth * 8 + 8);
    MPI_Request *reqs = malloc((depth + 1) * sizeof *reqs);
    MPI_Status *st = malloc((depth + 1) * sizeof *st);
    if (!dummies || !reqs || !st) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t k = 0; k < depth; k++)
        CHECK_MPI(MPI_Irecv(dummies + 8 * k, 8, MPI_CHAR, src, NEVER, MPI_COMM_WORLD, &reqs[k]));
    CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
    lat = pingpong(rank, s, r, size, iters, skip);
    for (size_t k = 0; k < depth; k++) CHECK_MPI(MPI_Cancel(&reqs[k]));
    CHECK_MPI(MPI_Waitall((int)depth, reqs, st));
    for (size_t k = 0; k < depth; k++) {
        int flag = 0;
        CHECK_MPI(MPI_Test_cancelled(&st[k], &flag));
        not_cancelled += !flag;
    }
    if (not_cancelled) {
        fprintf(stderr, "%zu of %zu never-matching receives were not cancelled\n", not_cancelled, depth);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    free(dummies);
    free(reqs);
    free(st);
    return lat;
}

/* The ping-pong with depth unreceived messages queued at each side; drains them after. */
static double with_unexpected(int rank, size_t depth, char *s, char *r, size_t size, size_t iters,
                              size_t skip)
{
    int peer = 1 - rank;
    double lat;
    /* One side sends while the other waits in the barrier, then the other way round. */
    for (int turn = 0; turn < 2; turn++) {
        if (rank == turn)
            for (size_t k = 0; k < depth; k++) {
                unsigned long long v = k;
                CHECK_MPI(MPI_Send(&v, 1, MPI_UNSIGNED_LONG_LONG, peer, LATER, MPI_COMM_WORLD));
            }
        CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
    }
    lat = pingpong(rank, s, r, size, iters, skip);
    for (size_t k = 0; k < depth; k++) {
        unsigned long long v = 0;
        CHECK_MPI(MPI_Recv(&v, 1, MPI_UNSIGNED_LONG_LONG, peer, LATER, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        if (v != k) {
            fprintf(stderr, "queued message %zu arrived as %llu (order broken)\n", k, v);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    return lat;
}

int main(int argc, char **argv)
{
    int rank, nprocs, r;
    struct depth_opts d;
    size_t sizes[64], nsizes = 0, max = 0;
    char *sbuf, *rbuf;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    r = parse(&d, argc, argv);
    if (r != 0) {
        if (rank == 0) usage(r > 0 ? stdout : stderr);
        MPI_Finalize();
        return r > 0 ? EXIT_SUCCESS : EXIT_FAILURE;
    }
    if (nprocs != 2) {
        if (rank == 0) fprintf(stderr, "This test requires exactly two processes\n");
        MPI_Finalize();
        return EXIT_FAILURE;
    }
    if (d.sizes_given) {
        for (size_t s = d.o.min_size; s <= d.o.max_size && nsizes < 64; s = next_size(s)) sizes[nsizes++] = s;
    } else {
        sizes[nsizes++] = 8;
        sizes[nsizes++] = 1024;
    }
    for (size_t i = 0; i < nsizes; i++) max = sizes[i] > max ? sizes[i] : max;
    sbuf = alloc_buf(max, 'a');
    rbuf = alloc_buf(max, 'b');
    if (rank == 0) print_preamble("tmpi OSU-style Latency vs Matching-Queue Depth Test");
    for (int v = 0; v < NVARIANTS; v++) {
        if (!d.variants[v]) continue;
        if (rank == 0) {
            printf("# Variant %s: %s\n", variant_name[v], variant_text[v]);
            printf("%-*s%-*s%*s\n", SIZE_WIDTH, "# Depth", SIZE_WIDTH, "Size", FIELD_WIDTH, "Latency(us)");
            fflush(stdout);
        }
        for (size_t k = 0; k < d.ndepths; k++) {
            for (size_t i = 0; i < nsizes; i++) {
                size_t iters, skip, size = sizes[i];
                double lat;
                opts_loops(&d.o, size, &iters, &skip);
                CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
                if (v == UNEXPECTED)
                    lat = with_unexpected(rank, d.depths[k], sbuf, rbuf, size, iters, skip);
                else
                    lat = with_posted(rank, v == POSTED_ANY, d.depths[k], sbuf, rbuf, size, iters, skip);
                if (rank == 0) {
                    printf("%-*zu%-*zu%*.*f\n", SIZE_WIDTH, d.depths[k], SIZE_WIDTH, size, FIELD_WIDTH,
                           FLOAT_PRECISION, lat);
                    fflush(stdout);
                }
            }
        }
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return EXIT_SUCCESS;
}
