/*
 * Cache-line ping-pong: two threads pinned to cores 0 and 1 bounce one 64-byte line.
 * Thread A writes an odd value and waits for B to answer with the next even one; each
 * round trip is two one-way transfers of the line. Prints ns per one-way transfer, the
 * floor for any shared-memory message latency between those two cores.
 *
 * Build: cc -O2 -pthread cacheline.c -o cacheline; run: ./cacheline [ROUNDS]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

int main(int argc, char **argv)
{
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000000;
    double v[5], tmp;
    int k, j;
    if (n == 0) {
        fprintf(stderr, "usage: %s [ROUNDS>0]\n", argv[0]);
        return 1;
    }
    if (pin(0)) fprintf(stderr, "warning: could not pin initiator to core 0\n");
    run(n / 10 + 1); /* warm-up */
    for (k = 0; k < 5; k++) v[k] = run(n);
    for (k = 1; k < 5; k++) /* insertion sort of five values */
        for (j = k; j > 0 && v[j - 1] > v[j]; j--) {
            tmp = v[j];
            v[j] = v[j - 1];
            v[j - 1] = tmp;
        }
    printf("# cache-line ping-pong, cores 0 <-> 1, %llu round trips per run, 5 runs\n",
           (unsigned long long)n);
    printf("ns per one-way transfer: median %.1f, best %.1f\n", v[2], v[0]);
    return 0;
}
