/*
 * Shared helpers of the C peer benchmarks (lat.c, bw.c, bibw.c, msgrate.c, coll.c, depth.c).
 *
 * These programs exist to measure Open MPI and MPICH on this machine with exactly the loops
 * and exactly the output layout of tmpi's Rust binaries in bench/src/bin/ (osu_latency,
 * osu_bw, osu_bibw, osu_mbw_mr), which themselves follow OSU Micro-Benchmarks 7.x:
 * options -m [MIN:]MAX, -i N, -x N, -W N, -h; sizes left-aligned in 10 columns, values
 * right-aligned in 20 with 2 decimals. Receive windows use one buffer slot per message in
 * flight (OSU's "-b multiple" for receives), as the Rust binaries must.
 */
#ifndef TMPI_PEER_COMMON_H
#define TMPI_PEER_COMMON_H

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIELD_WIDTH 20
#define SIZE_WIDTH 10
#ifndef FLOAT_PRECISION
#define FLOAT_PRECISION 2
#endif
#define LARGE_MESSAGE_SIZE 8192
#define MAX_MESSAGE_SIZE (1 << 22)

enum family { FAMILY_LATENCY, FAMILY_BANDWIDTH, FAMILY_COLLECTIVE };

/* Default largest size of the collectives (OSU's MAX_MSG_SIZE_COLL). */
#define MAX_MSG_SIZE_COLL (1 << 20)

struct opts {
    size_t min_size, max_size;
    size_t iterations, skip, iterations_large, skip_large;
    size_t window;
};

static inline void opts_defaults(struct opts *o, enum family f)
{
    o->max_size = MAX_MESSAGE_SIZE;
    o->window = 64;
    if (f == FAMILY_LATENCY) {
        o->min_size = 0;
        o->iterations = 10000;
        o->skip = 100;
        o->iterations_large = 1000;
        o->skip_large = 10;
    } else if (f == FAMILY_COLLECTIVE) {
        o->min_size = 1;
        o->max_size = MAX_MSG_SIZE_COLL;
        o->iterations = 1000;
        o->skip = 100;
        o->iterations_large = 100;
        o->skip_large = 10;
    } else {
        o->min_size = 1;
        o->iterations = 100;
        o->skip = 10;
        o->iterations_large = 20;
        o->skip_large = 2;
    }
}

static inline int parse_size(const char *s, size_t *out)
{
    char *end = NULL;
    long long v;
    if (*s == '\0') return -1;
    v = strtoll(s, &end, 10);
    if (*end != '\0' || v < 0) return -1;
    *out = (size_t)v;
    return 0;
}

/* Returns 0 to run, 1 after -h, -1 on a bad command line. */
static inline int opts_parse(struct opts *o, int argc, char **argv)
{
    int c;
    size_t n;
    while ((c = getopt(argc, argv, "m:i:x:W:h")) != -1) {
        switch (c) {
        case 'h':
            return 1;
        case 'm': {
            char buf[64];
            char *colon;
            if (strlen(optarg) >= sizeof buf) return -1;
            strcpy(buf, optarg);
            colon = strchr(buf, ':');
            if (!colon) {
                if (parse_size(buf, &o->max_size)) return -1;
            } else {
                *colon = '\0';
                if (buf[0] == '\0' && colon[1] == '\0') return -1;
                if (buf[0] && parse_size(buf, &o->min_size)) return -1;
                if (colon[1] && parse_size(colon + 1, &o->max_size)) return -1;
            }
            break;
        }
        case 'i':
            if (parse_size(optarg, &n) || n == 0) return -1;
            o->iterations = o->iterations_large = n;
            break;
        case 'x':
            if (parse_size(optarg, &n)) return -1;
            o->skip = o->skip_large = n;
            break;
        case 'W':
            if (parse_size(optarg, &n) || n == 0) return -1;
            o->window = n;
            break;
        default:
            return -1;
        }
    }
    if (optind != argc || o->min_size > o->max_size) return -1;
    return 0;
}

static inline void opts_loops(const struct opts *o, size_t size, size_t *iters, size_t *skip)
{
    *iters = size > LARGE_MESSAGE_SIZE ? o->iterations_large : o->iterations;
    *skip = size > LARGE_MESSAGE_SIZE ? o->skip_large : o->skip;
}

static inline size_t next_size(size_t s) { return s == 0 ? 1 : s * 2; }

/* Parses options; on -h or error prints usage at rank 0, finalizes and exits. */
static inline void opts_or_exit(struct opts *o, enum family f, int argc, char **argv, int rank,
                         const char *name)
{
    int r;
    opts_defaults(o, f);
    r = opts_parse(o, argc, argv);
    if (r == 0) return;
    if (rank == 0) {
        FILE *out = r > 0 ? stdout : stderr;
        fprintf(out,
                "Usage: mpirun -np N %s [-m [MIN:]MAX] [-i ITERS] [-x WARMUP]%s [-h]\n",
                name, f == FAMILY_BANDWIDTH ? " [-W WINDOW]" : "");
    }
    MPI_Finalize();
    exit(r > 0 ? EXIT_SUCCESS : EXIT_FAILURE);
}

/* A page-aligned buffer of len bytes (at least one page), every byte set to fill. */
static inline char *alloc_buf(size_t len, int fill)
{
    void *p = NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (len == 0) len = 1;
    if (posix_memalign(&p, (size_t)page, len)) {
        fprintf(stderr, "out of memory allocating %zu bytes\n", len);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(p, fill, len);
    return p;
}

/* Distance between receive slots: size rounded up to 64 bytes, never 0. */
static inline size_t slot_stride(size_t size) { return (size == 0 ? 1 : (size + 63) / 64) * 64; }

static inline void print_preamble(const char *title)
{
    printf("\n# %s\n", title);
}

static inline void print_header1(const char *col)
{
    printf("%-*s%*s\n", SIZE_WIDTH, "# Size", FIELD_WIDTH, col);
    fflush(stdout);
}

static inline void print_row1(size_t size, double v)
{
    printf("%-*zu%*.*f\n", SIZE_WIDTH, size, FIELD_WIDTH, FLOAT_PRECISION, v);
    fflush(stdout);
}

#define CHECK_MPI(call)                                                        \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ != MPI_SUCCESS) {                                              \
            fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__,     \
                    #call, rc_);                                               \
            MPI_Abort(MPI_COMM_WORLD, 1);                                      \
        }                                                                      \
    } while (0)

#endif
