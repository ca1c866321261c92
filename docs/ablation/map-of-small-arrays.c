/* Would tables in the kernel's direct map (huge pages) make a cold slot cheaper? One random
 * slot read per BPF_PROG_TEST_RUN (repeat = 1) from a big array map (vmalloc'd: 4 KiB pages)
 * against the same slots spread over an array of maps whose inner arrays are small enough
 * (<= 32 KiB with their header) for the kernel to kmalloc them (the direct map: 2 MiB and
 * 1 GiB pages here), and an empty program; interleaved, mean ns a run.
 *   gcc -O2 docs/ablation/map-of-small-arrays.c -o /tmp/mosa && /tmp/mosa 20 64
 * (docs/performance.md, "Why the NAT slot's miss is not hidden", 2026-12-07). Needs root. */
#include <linux/bpf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <stdint.h>
#include <sys/syscall.h>

static long bpf(int cmd, union bpf_attr *a) { return syscall(__NR_bpf, cmd, a, sizeof(*a)); }

static int map_create(int type, int ksz, int vsz, int n, int inner) {
    union bpf_attr a; memset(&a, 0, sizeof a);
    a.map_type = type; a.key_size = ksz; a.value_size = vsz; a.max_entries = n; a.inner_map_fd = inner;
    int fd = bpf(BPF_MAP_CREATE, &a);
    if (fd < 0) { perror("map_create"); exit(1); }
    return fd;
}
static void upd(int fd, void *k, void *v) {
    union bpf_attr a; memset(&a, 0, sizeof a);
    a.map_fd = fd; a.key = (uint64_t)k; a.value = (uint64_t)v;
    if (bpf(BPF_MAP_UPDATE_ELEM, &a)) { perror("update"); exit(1); }
}
#define I(c, d, s, o, i) ((struct bpf_insn){c, d, s, o, i})
static char log_buf[1 << 20];
static int load(struct bpf_insn *p, int n) {
    union bpf_attr a; memset(&a, 0, sizeof a);
    a.prog_type = BPF_PROG_TYPE_XDP; a.insns = (uint64_t)p; a.insn_cnt = n;
    a.license = (uint64_t)"GPL"; a.log_buf = (uint64_t)log_buf; a.log_size = sizeof log_buf; a.log_level = 1;
    int fd = bpf(BPF_PROG_LOAD, &a);
    if (fd < 0) { perror("load"); fprintf(stderr, "%s\n", log_buf); exit(1); }
    return fd;
}
/* r6 = index from the packet */
static int prog(int outer, int flat, int shift, int write) {
    struct bpf_insn p[64]; int n = 0;
    p[n++] = I(BPF_LDX | BPF_W | BPF_MEM, 2, 1, 0, 0);
    p[n++] = I(BPF_LDX | BPF_W | BPF_MEM, 3, 1, 4, 0);
    p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 4, 2, 0, 0);
    p[n++] = I(BPF_ALU64 | BPF_ADD | BPF_K, 4, 0, 0, 8);
    int jout1 = n; p[n++] = I(BPF_JMP | BPF_JGT | BPF_X, 4, 3, 0, 0);
    p[n++] = I(BPF_LDX | BPF_W | BPF_MEM, 6, 2, 0, 0);
    int jouts[4], nj = 0;
    if (flat >= 0) {
        p[n++] = I(BPF_STX | BPF_W | BPF_MEM, 10, 6, -4, 0);
        p[n++] = I(BPF_LD | BPF_DW | BPF_IMM, 1, BPF_PSEUDO_MAP_FD, 0, flat); p[n++] = I(0, 0, 0, 0, 0);
        p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0);
        p[n++] = I(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, -4);
        p[n++] = I(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem);
        jouts[nj++] = n; p[n++] = I(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 0, 0);
    } else {
        p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 7, 6, 0, 0);
        p[n++] = I(BPF_ALU64 | BPF_RSH | BPF_K, 7, 0, 0, shift);
        p[n++] = I(BPF_STX | BPF_W | BPF_MEM, 10, 7, -4, 0);
        p[n++] = I(BPF_LD | BPF_DW | BPF_IMM, 1, BPF_PSEUDO_MAP_FD, 0, outer); p[n++] = I(0, 0, 0, 0, 0);
        p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0);
        p[n++] = I(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, -4);
        p[n++] = I(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem);
        jouts[nj++] = n; p[n++] = I(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 0, 0);
        p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 1, 0, 0, 0);
        p[n++] = I(BPF_ALU64 | BPF_AND | BPF_K, 6, 0, 0, (1 << shift) - 1);
        p[n++] = I(BPF_STX | BPF_W | BPF_MEM, 10, 6, -8, 0);
        p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0);
        p[n++] = I(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, -8);
        p[n++] = I(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem);
        jouts[nj++] = n; p[n++] = I(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 0, 0);
    }
    p[n++] = I(BPF_LDX | BPF_DW | BPF_MEM, 1, 0, 0, 0);
    if (write) { p[n++] = I(BPF_ALU64 | BPF_ADD | BPF_K, 1, 0, 0, 1); p[n++] = I(BPF_STX | BPF_DW | BPF_MEM, 0, 1, 0, 0); }
    int out = n;
    p[n++] = I(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, XDP_PASS);
    p[n++] = I(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
    p[jout1].off = out - jout1 - 1;
    for (int i = 0; i < nj; i++) p[jouts[i]].off = out - jouts[i] - 1;
    return load(p, n);
}
static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static double run(int fd, uint32_t mask, int iters) {
    unsigned char pkt[64]; memset(pkt, 0, sizeof pkt);
    uint64_t tot = 0;
    for (int i = 0; i < iters; i++) {
        uint32_t idx = rnd() & mask; memcpy(pkt, &idx, 4);
        union bpf_attr a; memset(&a, 0, sizeof a);
        a.test.prog_fd = fd; a.test.data_in = (uint64_t)pkt; a.test.data_size_in = sizeof pkt; a.test.repeat = 1;
        if (bpf(BPF_PROG_TEST_RUN, &a)) { perror("test_run"); exit(1); }
        tot += a.test.duration;
    }
    return (double)tot / iters;
}
int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: map-of-small-arrays SLOTS_LOG2 SLOT_BYTES [WRITE]\n");
        return 2;
    }
    int slots_log = atoi(argv[1]), vsz = atoi(argv[2]), write = argc > 3 ? atoi(argv[3]) : 0;
    uint32_t n = 1u << slots_log;
    int inner_log = 0; while (((1 << (inner_log + 1)) * vsz) + 512 <= 32768) inner_log++;
    int flat = map_create(BPF_MAP_TYPE_ARRAY, 4, vsz, n, 0);
    int tmpl = map_create(BPF_MAP_TYPE_ARRAY, 4, vsz, 1 << inner_log, 0);
    int outer = map_create(BPF_MAP_TYPE_ARRAY_OF_MAPS, 4, 4, n >> inner_log, tmpl);
    for (uint32_t i = 0; i < (n >> inner_log); i++) { int in = map_create(BPF_MAP_TYPE_ARRAY, 4, vsz, 1 << inner_log, 0); upd(outer, &i, &in); close(in); }
    int pf = prog(-1, flat, 0, write), po = prog(outer, -1, inner_log, write);
    int empty; { struct bpf_insn p[2] = {I(BPF_ALU64|BPF_MOV|BPF_K,0,0,0,XDP_PASS), I(BPF_JMP|BPF_EXIT,0,0,0,0)}; empty = load(p, 2); }
    for (int r = 0; r < 8; r++) {
        double a = 0, b = 0, c = 0;
        for (int k = 0; k < 20; k++) { a += run(pf, n - 1, 10000) / 20; b += run(po, n - 1, 10000) / 20; c += run(empty, n - 1, 10000) / 20; }
        printf("%u slots of %d B (%d MiB), inner %d: flat %.1f ns, array of maps %.1f ns, empty %.1f ns\n", n, vsz, (int)((uint64_t)n * vsz >> 20), 1 << inner_log, a, b, c);
    }
    return 0;
}
