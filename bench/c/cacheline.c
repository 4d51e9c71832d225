/*
 * Cache-line ping-pong: two threads pinned to cores 0 and 1 bounce one 64-byte line.
 * Thread A writes an odd value and waits for B to answer with the next even one; each
 * round trip is two one-way transfers of the line. Prints ns per one-way transfer, the
 * floor for any shared-memory message latency between those two cores.
 *
 * With a second argument MIB > 0 it then also measures the host's copy bandwidth the way a
 * two-copy message pipeline uses it: core 0 copies 128 KiB messages into a 4 MiB ring, core 1
 * copies them out into a window of 64 buffers, MIB MiB per run, 5 runs. That pattern streams
 * through the last-level cache, and it is the one that halves for seconds at a time when
 * other guests share the host's memory bandwidth (while the cache-line time can stay level).
 *
 * Build: cc -O2 -pthread cacheline.c -o cacheline; run: ./cacheline [ROUNDS [MIB]]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct line {
    _Alignas(64) _Atomic uint64_t v;
    char pad[64 - sizeof(uint64_t)];
};

static struct line flag;
/* Set by the responder once it runs, pinned: the timing starts after it, so thread start-up
 * and migration are not counted (they dominated short runs). */
static struct line ready;
static uint64_t rounds = 2000000;

static int pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *responder(void *arg)
{
    uint64_t i;
    (void)arg;
    if (pin(1)) fprintf(stderr, "warning: could not pin responder to core 1\n");
    atomic_store_explicit(&ready.v, 1, memory_order_release);
    for (i = 0; i < rounds; i++) {
        uint64_t want = 2 * i + 1;
        while (atomic_load_explicit(&flag.v, memory_order_acquire) != want) {
        }
        atomic_store_explicit(&flag.v, want + 1, memory_order_release);
    }
    return NULL;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double run(uint64_t n)
{
    pthread_t t;
    uint64_t i;
    double t0, t1;
    rounds = n;
    atomic_store(&flag.v, 0);
    atomic_store(&ready.v, 0);
    if (pthread_create(&t, NULL, responder, NULL)) {
        perror("pthread_create");
        exit(1);
    }
    while (atomic_load_explicit(&ready.v, memory_order_acquire) == 0) {
    }
    t0 = now_ns();
    for (i = 0; i < n; i++) {
        uint64_t mine = 2 * i + 1;
        atomic_store_explicit(&flag.v, mine, memory_order_release);
        while (atomic_load_explicit(&flag.v, memory_order_acquire) != mine + 1) {
        }
    }
    t1 = now_ns();
    pthread_join(t, NULL);
    return (t1 - t0) / (2.0 * (double)n);
}

enum { PIPE_MSG = 128 << 10, PIPE_RING = 4 << 20, PIPE_WIN = 64 };

/* A spin-wait hint: the waiting core then takes fewer of the line's transfers from the
 * copying one. */
static void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static char *pipe_src, *pipe_ring, *pipe_dst;
static struct line pipe_head, pipe_tail;
static uint64_t pipe_msgs;

/* The producer: message after message into the ring, waiting for room. */
static void *pipe_producer(void *arg)
{
    uint64_t h = 0, i;
    (void)arg;
    if (pin(0)) fprintf(stderr, "warning: could not pin the copy producer to core 0\n");
    for (i = 0; i < pipe_msgs; i++) {
        while (h + PIPE_MSG - atomic_load_explicit(&pipe_tail.v, memory_order_acquire) > PIPE_RING) {
            relax();
        }
        memcpy(pipe_ring + h % PIPE_RING, pipe_src, PIPE_MSG);
        h += PIPE_MSG;
        atomic_store_explicit(&pipe_head.v, h, memory_order_release);
    }
    return NULL;
}

/* One run of the copy pipeline: GB/s through it (the consumer runs on core 1). */
static double pipe_run(uint64_t msgs)
{
    pthread_t t;
    uint64_t tail = 0, i;
    double t0;
    pipe_msgs = msgs;
    atomic_store(&pipe_head.v, 0);
    atomic_store(&pipe_tail.v, 0);
    t0 = now_ns();
    if (pthread_create(&t, NULL, pipe_producer, NULL)) {
        perror("pthread_create");
        exit(1);
    }
    for (i = 0; i < msgs; i++) {
        while (atomic_load_explicit(&pipe_head.v, memory_order_acquire) < tail + PIPE_MSG) {
            relax();
        }
        memcpy(pipe_dst + (i % PIPE_WIN) * PIPE_MSG, pipe_ring + tail % PIPE_RING, PIPE_MSG);
        tail += PIPE_MSG;
        atomic_store_explicit(&pipe_tail.v, tail, memory_order_release);
    }
    pthread_join(t, NULL);
    return (double)msgs * PIPE_MSG / (now_ns() - t0);
}

static void sort5(double *v)
{
    double tmp;
    int k, j;
    for (k = 1; k < 5; k++) /* insertion sort of five values */
        for (j = k; j > 0 && v[j - 1] > v[j]; j--) {
            tmp = v[j];
            v[j] = v[j - 1];
            v[j - 1] = tmp;
        }
}

/* The copy-bandwidth figure: MIB MiB per run through the pipeline, 5 runs. */
static void pipe_probe(uint64_t mib)
{
    uint64_t msgs = mib * (1 << 20) / PIPE_MSG;
    double v[5];
    int k;
    pipe_src = aligned_alloc(4096, PIPE_MSG);
    pipe_ring = aligned_alloc(4096, PIPE_RING);
    pipe_dst = aligned_alloc(4096, (size_t)PIPE_MSG * PIPE_WIN);
    if (!pipe_src || !pipe_ring || !pipe_dst) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memset(pipe_src, 1, PIPE_MSG);
    memset(pipe_ring, 0, PIPE_RING);
    memset(pipe_dst, 2, (size_t)PIPE_MSG * PIPE_WIN);
    if (pin(1)) fprintf(stderr, "warning: could not pin the copy consumer to core 1\n");
    pipe_run(msgs / 4 + 1); /* warm-up */
    for (k = 0; k < 5; k++) v[k] = pipe_run(msgs);
    sort5(v);
    printf("pipe copy GB/s (128 KiB messages, 4 MiB ring, %llu MiB per run, 5 runs): median %.1f, best %.1f\n",
           (unsigned long long)mib, v[2], v[4]);
}

int main(int argc, char **argv)
{
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000000;
    uint64_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 0;
    double v[5];
    int k;
    if (n == 0 || mib > (1 << 20)) {
        fprintf(stderr, "usage: %s [ROUNDS>0 [MIB<=1048576]]\n", argv[0]);
        return 1;
    }
    if (pin(0)) fprintf(stderr, "warning: could not pin initiator to core 0\n");
    run(n / 10 + 1); /* warm-up */
    for (k = 0; k < 5; k++) v[k] = run(n);
    sort5(v);
    printf("# cache-line ping-pong, cores 0 <-> 1, %llu round trips per run, 5 runs\n",
           (unsigned long long)n);
    printf("ns per one-way transfer: median %.1f, best %.1f\n", v[2], v[0]);
    if (mib > 0) pipe_probe(mib);
    return 0;
}
