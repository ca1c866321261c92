/* What a BPF program's cache misses cost on this machine: XDP programs run through
 * BPF_PROG_TEST_RUN (repeat = 1) read random 64-byte slots of array maps; the cases are
 * interleaved; mean ns a run (docs/performance.md, "Why reading the NAT set early gains
 * nothing; tables in huge pages", 2026-12-07). Needs root.
 *
 *   gcc -O2 docs/ablation/bpf-misses.c -o /tmp/bpf-misses
 *   /tmp/bpf-misses overlap 19     one read; two independent reads; two where the second's
 *                                  index depends on the first's value; two with a helper call
 *                                  between; a read and an independent write (2^19 slots)
 *   /tmp/bpf-misses small 20       one read in a big array map (vmalloc'd: 4 KiB pages)
 *                                  against the same slots spread over an array of maps whose
 *                                  inner arrays are small enough (<= 32 KiB with their header)
 *                                  for the kernel to kmalloc them (its direct map: 2 MiB and
 *                                  1 GiB pages here), and an empty program
 */
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
enum { INNER_LOG = 8 }; /* 256 slots of 64 bytes an inner map: 16 KiB and its header */

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

/* A map lookup of the key at fp+key_off, r0 the value or NULL: in `map`, or (map < 0) in the
 * inner map r0 holds. */
static int lookup(struct bpf_insn *p, int n, int map, int key_off) {
    if (map >= 0) {
        p[n++] = I(BPF_LD | BPF_DW | BPF_IMM, 1, BPF_PSEUDO_MAP_FD, 0, map);
        p[n++] = I(0, 0, 0, 0, 0);
    } else {
        p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 1, 0, 0, 0);
    }
    p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0);
    p[n++] = I(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, key_off);
    p[n++] = I(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem);
    return n;
}

/* The packet's first 8 bytes: two slot indexes, stored at fp-4 and fp-8. Case `c` of the
 * overlap mode; with `outer` >= 0, one read of slot i at inner map i >> INNER_LOG of `outer`. */
static int program(int map, int c, int outer) {
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
    if (outer >= 0) {
        p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 9, 6, 0, 0);
        p[n++] = I(BPF_ALU64 | BPF_RSH | BPF_K, 6, 0, 0, INNER_LOG);
        p[n++] = I(BPF_STX | BPF_W | BPF_MEM, 10, 6, -4, 0);
        n = lookup(p, n, outer, -4);
        exits[e++] = n;
        p[n++] = I(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 0, 0);
        p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 6, 9, 0, 0);
        p[n++] = I(BPF_ALU64 | BPF_AND | BPF_K, 6, 0, 0, (1 << INNER_LOG) - 1);
        p[n++] = I(BPF_STX | BPF_W | BPF_MEM, 10, 6, -4, 0);
        map = -1;
    }
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

/* A map of `type` with 4-byte keys; `inner` the template of an array of maps. */
static int map(uint32_t type, uint32_t value_size, uint32_t entries, int inner) {
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_type = type;
    a.key_size = 4;
    a.value_size = value_size;
    a.max_entries = entries;
    a.inner_map_fd = inner;
    int fd = bpf(BPF_MAP_CREATE, &a);
    if (fd < 0) {
        perror("BPF_MAP_CREATE");
        exit(1);
    }
    return fd;
}

static int array(uint32_t slots) { return map(BPF_MAP_TYPE_ARRAY, 64, slots, 0); }

/* An array of 2^(slots_log - INNER_LOG) arrays of 2^INNER_LOG slots. */
static int small_arrays(int slots_log) {
    uint32_t inners = 1u << (slots_log - INNER_LOG);
    int outer = map(BPF_MAP_TYPE_ARRAY_OF_MAPS, 4, inners, array(1u << INNER_LOG));
    for (uint32_t i = 0; i < inners; i++) {
        int inner = array(1u << INNER_LOG);
        union bpf_attr u;
        memset(&u, 0, sizeof u);
        u.map_fd = outer;
        u.key = (uint64_t)&i;
        u.value = (uint64_t)&inner;
        if (bpf(BPF_MAP_UPDATE_ELEM, &u)) {
            perror("BPF_MAP_UPDATE_ELEM");
            exit(1);
        }
        close(inner);
    }
    return outer;
}

int main(int argc, char **argv) {
    int small = argc == 3 && !strcmp(argv[1], "small");
    if (argc != 3 || !(small || !strcmp(argv[1], "overlap")) || atoi(argv[2]) <= INNER_LOG) {
        fprintf(stderr, "usage: bpf-misses overlap|small SLOTS_LOG2 (> %d)\n", INNER_LOG);
        return 2;
    }
    uint32_t slots = 1u << atoi(argv[2]);
    int map = array(slots);
    int progs[CASES], cases = CASES;
    const char *labels[CASES];
    if (small) {
        struct bpf_insn empty[2] = {I(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, XDP_PASS),
                                    I(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)};
        progs[0] = program(map, ONE, -1);
        progs[1] = program(-1, ONE, small_arrays(atoi(argv[2])));
        progs[2] = load(empty, 2);
        labels[0] = "one array";
        labels[1] = "array of small arrays";
        labels[2] = "empty program";
        cases = 3;
    } else {
        for (int c = 0; c < CASES; c++) {
            progs[c] = program(map, c, -1);
            labels[c] = names[c];
        }
    }
    for (int line = 0; line < 6; line++) {
        double t[CASES] = {0};
        for (int k = 0; k < 40; k++)
            for (int q = 0; q < cases; q++) {
                int c = (q + k) % cases;
                t[c] += run(progs[c], slots, 2500) / 40;
            }
        printf("%u slots of 64 B:", slots);
        for (int c = 0; c < cases; c++) printf(" %s %.0f;", labels[c], t[c]);
        printf("\n");
    }
    return 0;
}
