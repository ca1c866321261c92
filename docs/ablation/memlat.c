/* Dependent random reads in a buffer of SIZE MiB, 64 bytes apart, in 4 KiB pages (HUGE=0) or
 * transparent huge pages (HUGE=1): the latency of a read that misses the caches and the TLB,
 * which is what a new flow's table slots cost (README, Performance, "where the time goes").
 * With TWO=1 each step also reads the next cache line (a second line of the same set).
 *   gcc -O2 docs/ablation/memlat.c -o /tmp/memlat && /tmp/memlat 20 0 0
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/mman.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: memlat SIZE_MIB HUGE TWO\n");
        return 2;
    }
    size_t mib = strtoul(argv[1], 0, 10);
    int huge = atoi(argv[2]), two = atoi(argv[3]);
    size_t node = 128, n = mib * 1024 * 1024 / node;
    char *buf = mmap(0, n * node, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED || n < 2) {
        perror("mmap");
        return 1;
    }
    madvise(buf, n * node, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    size_t *order = malloc(n * sizeof *order);
    for (size_t i = 0; i < n; i++) order[i] = i;
    srand(1);
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = ((size_t)rand() * RAND_MAX + rand()) % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < n; i++) {
        *(char **)(buf + order[i] * node) = buf + order[(i + 1) % n] * node;
        *(size_t *)(buf + order[i] * node + 64) = 0;
    }
    char *p = buf;
    size_t steps = 2000000, sink = 0;
    for (size_t i = 0; i < steps; i++) p = *(char **)p; /* warm the page tables as a run does */
    double t = now_ns();
    for (size_t i = 0; i < steps; i++) {
        if (two) sink += *(size_t *)(p + 64);
        p = *(char **)p;
    }
    double d = now_ns() - t;
    printf("%zu MiB, huge pages %d, second line %d: %.1f ns a step (%zu %p)\n", mib, huge, two,
           d / steps, sink, (void *)p);
    return 0;
}
