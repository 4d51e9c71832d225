/*
 * What one process_vm_readv per message costs against one per batch of messages: the fixed
 * cost of the system call (finding and checking the other process, pinning its pages) that
 * tmpi's batched single-copy reads save (runtime/src/engine/single_copy.rs, cma_batch).
 *
 * A child process owns a window of 64 messages of SIZE bytes in its memory; the parent copies
 * the window into its own buffers with process_vm_readv, BATCH messages per call (one iovec
 * each), ITERS windows per run, and prints the best of 5 runs per message and in GB/s.
 *
 * Build: cc -O2 cma_batch.c -o cma_batch; run: ./cma_batch [SIZE [ITERS]] (default 16384
 * 200), which measures BATCH 1, 4 and 16. Needs the rights process_vm_readv needs (same user,
 * Yama ptrace_scope 0 or 1 with the reader the parent, or root).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WINDOW 64

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    size_t size = argc > 1 ? strtoul(argv[1], NULL, 10) : 16384;
    long iters = argc > 2 ? strtol(argv[2], NULL, 10) : 200;
    static const int batches[] = {1, 4, 16};
    char *src, *dst;
    int p[2];
    char x;
    pid_t child;

    if (size == 0 || size > (64ul << 20) || iters <= 0) {
        fprintf(stderr, "usage: cma_batch [SIZE (1 B-64 MiB) [ITERS > 0]]\n");
        return 2;
    }
    src = aligned_alloc(4096, (size * WINDOW + 4095) & ~4095ul);
    dst = aligned_alloc(4096, (size * WINDOW + 4095) & ~4095ul);
    if (!src || !dst || pipe(p)) {
        perror("setup");
        return 1;
    }
    memset(dst, 1, size * WINDOW);
    child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        /* The child's own pages (written after the fork), then it waits to be killed. */
        memset(src, 2, size * WINDOW);
        if (write(p[1], "x", 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    if (read(p[0], &x, 1) != 1) {
        perror("child");
        return 1;
    }
    for (unsigned b = 0; b < sizeof batches / sizeof batches[0]; b++) {
        int k = batches[b];
        struct iovec local[16], remote[16];
        double best = 1e30;
        for (int run = 0; run < 5; run++) {
            double t0 = now();
            for (long it = 0; it < iters; it++) {
                for (int m = 0; m < WINDOW; m += k) {
                    int n = 0;
                    for (; n < k && m + n < WINDOW; n++) {
                        local[n] = (struct iovec){dst + (size_t)(m + n) * size, size};
                        remote[n] = (struct iovec){src + (size_t)(m + n) * size, size};
                    }
                    if (process_vm_readv(child, local, n, remote, n, 0) != (ssize_t)(n * size)) {
                        perror("process_vm_readv");
                        kill(child, SIGKILL);
                        return 1;
                    }
                }
            }
            double t = (now() - t0) / (double)iters / WINDOW;
            if (t < best)
                best = t;
        }
        printf("size %zu, %2d per call: %.3f us per message, %.2f GB/s\n", size, k, best * 1e6, (double)size / best / 1e9);
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return 0;
}
