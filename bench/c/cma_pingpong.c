/*
 * The floor of a single-copy (CMA) rendezvous ping-pong: the least any MPI that moves a
 * message with one process_vm_readv can take per one-way message between two cores.
 *
 * Two processes pinned to cores 0 and 1, each with its own private send and receive buffer,
 * share one page of flags and nothing else. A one-way message is what an MPI rendezvous does
 * at the least: the sender raises its request flag and waits; the receiver, spinning on that
 * flag, copies the sender's buffer into its own with one process_vm_readv and raises the
 * sender's completion flag; then the roles swap. No matching, no headers, no registration:
 * two flag transfers and the system call. Also prints the system call alone, back to back,
 * for the same size.
 *
 * With --split LEAD, the floor of tmpi's split without a round trip (a pre-granted read alone
 * in flight, runtime/src/engine/rndv.rs): the receiver raises a share flag and copies the first
 * half and LEAD bytes (in whole pages) with process_vm_readv, while the sender, waiting for
 * its completion, sees the flag and writes the rest into the receiver's buffer with
 * process_vm_writev; the receiver waits for that too.
 *
 * Build: cc -O2 cma_pingpong.c -o cma_pingpong; run: ./cma_pingpong [--split LEAD] [SIZE ...]
 * (default 16384 32768 65536). Needs the rights process_vm_readv needs (same user, Yama
 * ptrace_scope 0 or 1 with the reader the parent, or root).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WARMUP 1000
#define ROUNDS 20000

struct shared {
    _Alignas(64) _Atomic long request[2]; /* request[x]: round that rank x sends in */
    _Alignas(64) _Atomic long done[2];    /* done[x]: round whose message from x was copied */
    _Alignas(64) _Atomic long share[2]; /* share[x]: round whose end x must write (--split) */
    _Alignas(64) _Atomic long wrote[2]; /* wrote[x]: round whose end x has written */
    _Alignas(64) char *sbuf[2];
    char *rbuf[2];
    pid_t pid[2];
    _Atomic int ready;
    _Atomic int failed;
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

/* Copies `n` bytes of rank `from`'s send buffer into `dst`; 0 on success, else says why and
 * tells the other rank to stop. */
static int pull(struct shared *s, int from, char *dst, size_t n)
{
    struct iovec local = {dst, n}, remote = {s->sbuf[from], n};
    if (process_vm_readv(s->pid[from], &local, 1, &remote, 1, 0) == (ssize_t)n)
        return 0;
    perror("process_vm_readv");
    atomic_store(&s->failed, 1);
    return -1;
}

/* Writes bytes [off, n) of this rank's send buffer `src` into rank `to`'s receive buffer. */
static int push(struct shared *s, int to, char *src, size_t off, size_t n)
{
    struct iovec local = {src + off, n - off}, remote = {s->rbuf[to] + off, n - off};
    if (process_vm_writev(s->pid[to], &local, 1, &remote, 1, 0) == (ssize_t)(n - off))
        return 0;
    perror("process_vm_writev");
    atomic_store(&s->failed, 1);
    return -1;
}

/* Waits until `*flag` is `want`, or the other rank failed; 0 when it came. */
static int await(struct shared *s, _Atomic long *flag, long want)
{
    while (atomic_load_explicit(flag, memory_order_acquire) != want)
        if (atomic_load_explicit(&s->failed, memory_order_relaxed))
            return -1;
    return 0;
}

/* With --split: bytes of an n-byte message the receiver copies itself (n: no split). */
static long split_lead = -1;
static size_t split_at(size_t n)
{
    size_t h = split_lead < 0 ? n : (n / 2 + (size_t)split_lead) & ~(size_t)4095;
    return h < n ? h : n;
}

/* Receives round i's message from `from` into rbuf: all of it, or with --split its start
 * while the sender writes the rest. */
static int take(struct shared *s, int from, char *rbuf, size_t n, long i)
{
    size_t h = split_at(n);
    if (h < n)
        atomic_store_explicit(&s->share[from], i, memory_order_release);
    if (pull(s, from, rbuf, h))
        return -1;
    return h < n ? await(s, &s->wrote[from], i) : 0;
}

/* Waits until round i's message from `me` was received, writing its share first with
 * --split. */
static int sent(struct shared *s, int me, char *sbuf, size_t n, long i)
{
    size_t h = split_at(n);
    if (h < n) {
        if (await(s, &s->share[me], i) || push(s, 1 - me, sbuf, h, n))
            return -1;
        atomic_store_explicit(&s->wrote[me], i, memory_order_release);
    }
    return await(s, &s->done[me], i);
}

/* One ping-pong of ROUNDS round trips of `n` bytes; rank 0 returns the one-way time (s). */
static double pingpong(struct shared *s, int me, size_t n, long base, char *sbuf, char *rbuf)
{
    double t0 = 0;
    for (long i = base + 1; i <= base + WARMUP + ROUNDS; i++) {
        if (i == base + WARMUP + 1)
            t0 = now();
        if (me == 0) {
            atomic_store_explicit(&s->request[0], i, memory_order_release);
            if (sent(s, 0, sbuf, n, i) || await(s, &s->request[1], i) || take(s, 1, rbuf, n, i))
                return -1;
            atomic_store_explicit(&s->done[1], i, memory_order_release);
        } else {
            if (await(s, &s->request[0], i) || take(s, 0, rbuf, n, i))
                return -1;
            atomic_store_explicit(&s->done[0], i, memory_order_release);
            atomic_store_explicit(&s->request[1], i, memory_order_release);
            if (sent(s, 1, sbuf, n, i))
                return -1;
        }
    }
    return (now() - t0) / ROUNDS / 2;
}

int main(int argc, char **argv)
{
    static const size_t defaults[] = {16384, 32768, 65536};
    size_t sizes[64], nsizes = 0, max = 0;
    struct shared *s;
    char *sbuf, *rbuf;
    int me, rc = 0, status;
    pid_t child;

    for (int a = 1; a < argc && nsizes < 64; a++) {
        char *end;
        if (!strcmp(argv[a], "--split") && a + 1 < argc) {
            split_lead = strtol(argv[++a], &end, 10);
            if (*end || split_lead < 0) {
                fprintf(stderr, "--split LEAD: bytes >= 0\n");
                return 2;
            }
            continue;
        }
        unsigned long v = strtoul(argv[a], &end, 10);
        if (*end || v == 0) {
            fprintf(stderr, "usage: %s [--split LEAD] [SIZE ...]  (sizes in bytes, > 0)\n", argv[0]);
            return 2;
        }
        sizes[nsizes++] = v;
    }
    if (nsizes == 0)
        for (size_t k = 0; k < 3; k++)
            sizes[nsizes++] = defaults[k];
    for (size_t k = 0; k < nsizes; k++)
        max = sizes[k] > max ? sizes[k] : max;

    s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    me = child == 0 ? 1 : 0;
    pin(me);
    /* Private buffers, written by their owner (not pages shared copy-on-write). */
    sbuf = aligned_alloc(4096, (max + 4095) / 4096 * 4096);
    rbuf = aligned_alloc(4096, (max + 4095) / 4096 * 4096);
    if (!sbuf || !rbuf) {
        fprintf(stderr, "out of memory\n");
        atomic_store(&s->failed, 1);
        return 1;
    }
    memset(sbuf, 'a' + me, max);
    memset(rbuf, 0, max);
    s->sbuf[me] = sbuf;
    s->rbuf[me] = rbuf;
    s->pid[me] = getpid();
    atomic_fetch_add(&s->ready, 1);
    while (atomic_load(&s->ready) < 2)
        ;
    if (me == 0)
        printf("# CMA rendezvous floor, cores 0 <-> 1: flag + process_vm_readv ping-pong%s\n"
               "# %-10s %14s %16s\n", split_lead < 0 ? "" : ", split with the sender's process_vm_writev",
               "size", "one-way us", "readv alone us");
    for (size_t k = 0; k < nsizes; k++) {
        double t = pingpong(s, me, sizes[k], (long)k * (WARMUP + ROUNDS), sbuf, rbuf);
        if (t < 0) {
            rc = 1;
            break;
        }
        if (me == 0) {
            /* The system call alone, reading the (idle) peer's buffer back to back. */
            double best = 1e9;
            for (int r = 0; r < 5 && !rc; r++) {
                double t0 = now();
                for (int i = 0; i < ROUNDS / 4 && !rc; i++)
                    rc = pull(s, 1, rbuf, sizes[k]) ? 1 : 0;
                double per = (now() - t0) / (ROUNDS / 4);
                best = per < best ? per : best;
            }
            if (rc)
                break;
            printf("%-12zu %14.3f %16.3f\n", sizes[k], t * 1e6, best * 1e6);
        }
        /* Both ranks start the next size together. */
        atomic_fetch_add(&s->ready, 1);
        while (atomic_load(&s->ready) < 2 * (int)(k + 2) && !atomic_load(&s->failed))
            ;
    }
    if (me == 1)
        return rc;
    if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 1;
    return rc;
}
