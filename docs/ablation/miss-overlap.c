/* Do a BPF program's cache misses overlap on this machine? An XDP program, run through
 * BPF_PROG_TEST_RUN (repeat = 1), reads random 64-byte slots of an array map of SLOTS_LOG2
 * slots (4 KiB kernel pages): one read; two independent reads; two where the second's index
 * depends on the first's value; two with a helper call between; a read and an independent
 * write. The cases are interleaved, 40 x 2,500 runs each per line; mean ns a run.
 *   gcc -O2 docs/ablation/miss-overlap.c -o /tmp/miss-overlap && /tmp/miss-overlap 19
 * (docs/performance.md, "Why the NAT slot's miss is not hidden", 2026-12-07). Needs root. */
#include <linux/bpf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static long bpf(int cmd, union bpf_attr *a) { return syscall(__NR_bpf, cmd, a, sizeof(*a)); }

#define I(c, d, s, o, i) ((struct bpf_insn){c, d, s, o, i})
enum { ONE, TWO, DEPENDENT, HELPER_BETWEEN, READ_WRITE, CASES };
static const char *names[CASES] = {"one read", "two independent", "two dependent",
                                   "two, a helper call between", "a read and a write"};

static int load(struct bpf_insn *p, int n) {
    static char log[1 << 16];
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.prog_type = BPF_PROG_TYPE_XDP;
    a.insns = (uint64_t)p;
    a.insn_cnt = n;
    a.license = (uint64_t)"GPL";
    a.log_buf = (uint64_t)log;
    a.log_size = sizeof log;
    a.log_level = 1;
    int fd = bpf(BPF_PROG_LOAD, &a);
    if (fd < 0) {
        perror("BPF_PROG_LOAD");
        fprintf(stderr, "%s\n", log);
        exit(1);
    }
    return fd;
}

/* The packet's first 8 bytes: two slot indexes, stored at fp-4 and fp-8. */
static int lookup(struct bpf_insn *p, int n, int map, int key_off) {
    p[n++] = I(BPF_LD | BPF_DW | BPF_IMM, 1, BPF_PSEUDO_MAP_FD, 0, map);
    p[n++] = I(0, 0, 0, 0, 0);
    p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0);
    p[n++] = I(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, key_off);
    p[n++] = I(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem);
    return n;
}

static int program(int map, int c) {
    struct bpf_insn p[64];
    int n = 0, exits[4], e = 0;
    p[n++] = I(BPF_LDX | BPF_W | BPF_MEM, 2, 1, 0, 0);
    p[n++] = I(BPF_LDX | BPF_W | BPF_MEM, 3, 1, 4, 0);
    p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 4, 2, 0, 0);
    p[n++] = I(BPF_ALU64 | BPF_ADD | BPF_K, 4, 0, 0, 8);
    exits[e++] = n;
    p[n++] = I(BPF_JMP | BPF_JGT | BPF_X, 4, 3, 0, 0);
    p[n++] = I(BPF_LDX | BPF_W | BPF_MEM, 6, 2, 0, 0);
    p[n++] = I(BPF_LDX | BPF_W | BPF_MEM, 7, 2, 4, 0);
    p[n++] = I(BPF_STX | BPF_W | BPF_MEM, 10, 6, -4, 0);
    p[n++] = I(BPF_STX | BPF_W | BPF_MEM, 10, 7, -8, 0);
    n = lookup(p, n, map, -4);
    exits[e++] = n;
    p[n++] = I(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 0, 0);
    p[n++] = I(BPF_LDX | BPF_W | BPF_MEM, 8, 0, 0, 0);
    if (c != ONE) {
        if (c == DEPENDENT) { /* the second index xor the first value (0): the same, but later */
            p[n++] = I(BPF_LDX | BPF_W | BPF_MEM, 9, 10, -8, 0);
            p[n++] = I(BPF_ALU64 | BPF_XOR | BPF_X, 9, 8, 0, 0);
            p[n++] = I(BPF_STX | BPF_W | BPF_MEM, 10, 9, -8, 0);
        }
        if (c == HELPER_BETWEEN)
            p[n++] = I(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_ktime_get_coarse_ns);
        n = lookup(p, n, map, -8);
        exits[e++] = n;
        p[n++] = I(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 0, 0);
        if (c == READ_WRITE)
            p[n++] = I(BPF_STX | BPF_W | BPF_MEM, 0, 6, 0, 0);
        else
            p[n++] = I(BPF_LDX | BPF_W | BPF_MEM, 8, 0, 0, 0);
    }
    int out = n;
    p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, XDP_PASS);
    p[n++] = I(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
    for (int i = 0; i < e; i++) p[exits[i]].off = out - exits[i] - 1;
    return load(p, n);
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static double run(int prog, uint32_t slots, int iterations) {
    unsigned char pkt[64] = {0};
    uint64_t total = 0;
    for (int i = 0; i < iterations; i++) {
        uint32_t a = rnd() % slots, b = rnd() % slots;
        memcpy(pkt, &a, 4);
        memcpy(pkt + 4, &b, 4);
        union bpf_attr t;
        memset(&t, 0, sizeof t);
        t.test.prog_fd = prog;
        t.test.data_in = (uint64_t)pkt;
        t.test.data_size_in = sizeof pkt;
        t.test.repeat = 1;
        if (bpf(BPF_PROG_TEST_RUN, &t)) {
            perror("BPF_PROG_TEST_RUN");
            exit(1);
        }
        total += t.test.duration;
    }
    return (double)total / iterations;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: miss-overlap SLOTS_LOG2\n");
        return 2;
    }
    uint32_t slots = 1u << atoi(argv[1]);
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_ARRAY;
    a.key_size = 4;
    a.value_size = 64;
    a.max_entries = slots;
    int map = bpf(BPF_MAP_CREATE, &a);
    if (map < 0) {
        perror("BPF_MAP_CREATE");
        return 1;
    }
    int progs[CASES];
    for (int c = 0; c < CASES; c++) progs[c] = program(map, c);
    for (int line = 0; line < 6; line++) {
        double t[CASES] = {0};
        for (int k = 0; k < 40; k++)
            for (int q = 0; q < CASES; q++) {
                int c = (q + k) % CASES;
                t[c] += run(progs[c], slots, 2500) / 40;
            }
        printf("%u slots of 64 B:", slots);
        for (int c = 0; c < CASES; c++) printf(" %s %.0f;", names[c], t[c]);
        printf("\n");
    }
    return 0;
}
