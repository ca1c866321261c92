// health-floor.c: what half-open probes cost the prober's process on this machine with no
// scheduler, window, verdict or per-target table beyond an array: the kernel work any design
// pays (the SYNs as lb sends them, the replies as lb reads them) and the least wake-ups. README
// (Performance, health checking) compares it with lb's checker, run alternately in one sitting.
//
// Each 10 ms slot it sends the slot's share of `targets` SYNs (10.50.i/250.1+i%250, port 8080,
// as lb-health-bench's targets) as lb's link-layer path does: IPv4 header + 24-byte TCP SYN
// (MSS option) through an AF_PACKET SOCK_DGRAM socket, sendmmsg of 64. Replies come through a
// raw IPPROTO_TCP socket with lb's classic BPF filter (SYN+ACK or RST), recvmmsg of 64 into
// 128-byte buffers; each is matched to its target by address, port and ack (seq + 1). The
// kernel resets the SYN+ACKs (no local socket owns the ports), as it does lb's.
//
// usage: floor <slot|readable> <ifname> <peer-mac aa:bb:..> <source-ip> [targets] [seconds]
//   slot    : wakes once per slot: sends, then reads every reply queued since (the least wake-ups)
//   readable: also wakes when replies arrive, and pauses 1 ms after a read of several (lb's
//             reader, COALESCE)
//   targets : default 50000; seconds: measured, after 3 s of warm-up (default 10)
// Output: one line of key=value pairs (cpu_pct and us_per_probe from getrusage of this process).
//
// The bed (as lb-health-bench's NAPI-thread mode; namespaces of one's own, the prober run with
// nsenter --net=/run/netns/hfl-c): docs/ablation/health-floor.sh.
// gcc -O2 -Wall -o floor health-floor.c
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define SLOT_NS 10000000LL
#define SLOTS 100 // per 1 s interval
#define PORT 8080
#define SRC_PORT_BASE 40000
#define SRC_PORTS 1024
#define REPLY_BYTES 128

struct target {
    uint32_t seq;
    uint16_t sport;
    uint8_t waiting;
};

static struct target *targets;
static int n_targets;
// FLOOR_TOUCH=k: each probe also updates k cache lines of its target's own in a separate
// table (at the send and at the reply), as a design with k scattered per-target records would.
static int touch;
static uint64_t *lines; // n_targets * touch lines of 8 words

static void touch_lines(int i) {
    // Scattered: a slot's targets are neighbours here, which lb's per-target phases are not.
    size_t at = (size_t)i * 7919 % (size_t)n_targets;
    for (int k = 0; k < touch; k++)
        lines[((size_t)k * n_targets + at) * 8] += 1;
}
static uint32_t src_ip; // network order
static uint64_t sent, matched, unmatched;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uint32_t target_ip(int i) { // host order
    return (10u << 24) | (50u << 16) | ((uint32_t)(i / 250) << 8) | (uint32_t)(1 + i % 250);
}

static int target_of(uint32_t ip) { // host order; -1 if not one
    if ((ip >> 16) != ((10u << 8) | 50u))
        return -1;
    int hi = (ip >> 8) & 0xff, lo = ip & 0xff;
    if (lo < 1 || lo > 250)
        return -1;
    int i = hi * 250 + lo - 1;
    return i < n_targets ? i : -1;
}

static uint32_t sum16(const uint8_t *p, int len, uint32_t sum) {
    for (int i = 0; i + 1 < len; i += 2)
        sum += (uint32_t)p[i] << 8 | p[i + 1];
    if (len & 1)
        sum += (uint32_t)p[len - 1] << 8;
    return sum;
}

static uint16_t fold(uint32_t sum) {
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)~sum;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t xorshift(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

// IPv4 header (DF, TTL 64) + TCP SYN with the MSS option: 44 bytes, as lb's link path.
static void build_syn(uint8_t *p, int i) {
    struct target *t = &targets[i];
    t->seq = xorshift();
    t->sport = SRC_PORT_BASE + (t->sport - SRC_PORT_BASE + 1) % SRC_PORTS;
    uint32_t dst = htonl(target_ip(i));
    memset(p, 0, 44);
    p[0] = 0x45;
    p[3] = 44;
    p[6] = 0x40; // DF
    p[8] = 64;
    p[9] = IPPROTO_TCP;
    memcpy(p + 12, &src_ip, 4);
    memcpy(p + 16, &dst, 4);
    uint16_t c = fold(sum16(p, 20, 0));
    p[10] = c >> 8;
    p[11] = c & 0xff;
    uint8_t *s = p + 20;
    s[0] = t->sport >> 8;
    s[1] = t->sport & 0xff;
    s[2] = PORT >> 8;
    s[3] = PORT & 0xff;
    s[4] = t->seq >> 24;
    s[5] = t->seq >> 16;
    s[6] = t->seq >> 8;
    s[7] = t->seq;
    s[12] = 6 << 4;
    s[13] = 0x02;
    s[14] = 0xff;
    s[15] = 0xff;
    s[20] = 2;
    s[21] = 4;
    s[22] = 1460 >> 8;
    s[23] = 1460 & 0xff;
    uint8_t pseudo[12];
    memcpy(pseudo, p + 12, 8);
    pseudo[8] = 0;
    pseudo[9] = IPPROTO_TCP;
    pseudo[10] = 0;
    pseudo[11] = 24;
    c = fold(sum16(s, 24, sum16(pseudo, 12, 0)));
    s[16] = c >> 8;
    s[17] = c & 0xff;
    t->waiting = 1;
    touch_lines(i);
}

static int packet_fd, raw_fd;
static struct sockaddr_ll peer;

static void send_slot(int first, int last) {
    static uint8_t bufs[BATCH][44];
    static struct iovec iov[BATCH];
    static struct mmsghdr msgs[BATCH];
    for (int i = first; i < last;) {
        int n = 0;
        for (; n < BATCH && i < last; n++, i++) {
            build_syn(bufs[n], i);
            iov[n].iov_base = bufs[n];
            iov[n].iov_len = 44;
            memset(&msgs[n], 0, sizeof msgs[n]);
            msgs[n].msg_hdr.msg_name = &peer;
            msgs[n].msg_hdr.msg_namelen = sizeof peer;
            msgs[n].msg_hdr.msg_iov = &iov[n];
            msgs[n].msg_hdr.msg_iovlen = 1;
        }
        int done = 0;
        while (done < n) {
            int r = sendmmsg(packet_fd, msgs + done, n - done, 0);
            if (r < 0) {
                if (errno == EAGAIN || errno == ENOBUFS) {
                    struct pollfd pf = {packet_fd, POLLOUT, 0};
                    poll(&pf, 1, 10);
                    continue;
                }
                perror("sendmmsg");
                exit(1);
            }
            done += r;
        }
        sent += n;
    }
}

// Reads every queued reply; how many it read.
static int drain(void) {
    static uint8_t bufs[BATCH][REPLY_BYTES];
    static struct iovec iov[BATCH];
    static struct mmsghdr msgs[BATCH];
    int total = 0;
    for (;;) {
        for (int i = 0; i < BATCH; i++) {
            iov[i].iov_base = bufs[i];
            iov[i].iov_len = REPLY_BYTES;
            memset(&msgs[i], 0, sizeof msgs[i]);
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        int r = recvmmsg(raw_fd, msgs, BATCH, MSG_DONTWAIT, NULL);
        if (r <= 0)
            return total;
        total += r;
        for (int k = 0; k < r; k++) {
            uint8_t *p = bufs[k];
            int ihl = (p[0] & 0xf) * 4;
            if ((int)msgs[k].msg_len < ihl + 20)
                continue;
            uint32_t from;
            memcpy(&from, p + 12, 4);
            int i = target_of(ntohl(from));
            uint8_t *s = p + ihl;
            uint16_t dport = s[2] << 8 | s[3];
            uint32_t ack = (uint32_t)s[8] << 24 | s[9] << 16 | s[10] << 8 | s[11];
            if (i >= 0 && targets[i].waiting && targets[i].sport == dport &&
                ack == targets[i].seq + 1) {
                targets[i].waiting = 0;
                touch_lines(i);
                matched++;
            } else {
                unmatched++;
            }
        }
        if (r < BATCH)
            return total;
    }
}

static void sleep_until(uint64_t t) {
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
}

static double cpu_s(struct rusage *u) {
    return u->ru_utime.tv_sec + u->ru_utime.tv_usec / 1e6 + u->ru_stime.tv_sec +
           u->ru_stime.tv_usec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s <slot|readable> <ifname> <peer-mac> <source-ip> [targets] [seconds]\n", argv[0]);
        return 2;
    }
    int readable = strcmp(argv[1], "readable") == 0;
    n_targets = argc > 5 ? atoi(argv[5]) : 50000;
    int seconds = argc > 6 ? atoi(argv[6]) : 10;
    targets = calloc(n_targets, sizeof *targets);
    touch = getenv("FLOOR_TOUCH") ? atoi(getenv("FLOOR_TOUCH")) : 0;
    lines = calloc((size_t)n_targets * (touch ? touch : 1) * 8, sizeof *lines);
    for (int i = 0; i < n_targets; i++)
        targets[i].sport = SRC_PORT_BASE + i % SRC_PORTS;
    inet_pton(AF_INET, argv[4], &src_ip);

    packet_fd = socket(AF_PACKET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int sndbuf = 1 << 20;
    setsockopt(packet_fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    memset(&peer, 0, sizeof peer);
    peer.sll_family = AF_PACKET;
    peer.sll_protocol = htons(ETH_P_IP);
    peer.sll_ifindex = if_nametoindex(argv[2]);
    peer.sll_halen = 6;
    unsigned m[6];
    sscanf(argv[3], "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]);
    for (int i = 0; i < 6; i++)
        peer.sll_addr[i] = m[i];

    raw_fd = socket(AF_INET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
    if (packet_fd < 0 || raw_fd < 0 || !peer.sll_ifindex) {
        perror("socket");
        return 1;
    }
    // lb's reply filter: IPv4 TCP with RST, or with SYN and ACK.
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 0),
        BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 4),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 4, 0, 8),
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 9),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_TCP, 0, 6),
        BPF_STMT(BPF_LDX | BPF_B | BPF_MSH, 0),
        BPF_STMT(BPF_LD | BPF_B | BPF_IND, 13),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x04, 2, 0),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0x12),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x12, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, 0xffffffff),
        BPF_STMT(BPF_RET | BPF_K, 0),
    };
    struct sock_fprog prog = {sizeof code / sizeof code[0], code};
    int rcvbuf = 4 << 20;
    if (setsockopt(raw_fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) ||
        setsockopt(raw_fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf)) {
        perror("setsockopt");
        return 1;
    }

    uint64_t start = now_ns();
    uint64_t measure_from = start + 3000000000ull;
    uint64_t measure_to = measure_from + (uint64_t)seconds * 1000000000ull;
    struct rusage u0 = {0}, u1;
    uint64_t sent0 = 0, matched0 = 0;
    int measuring = 0;
    for (uint64_t slot = 0;; slot++) {
        uint64_t at = start + slot * SLOT_NS;
        if (!measuring && at >= measure_from) {
            getrusage(RUSAGE_SELF, &u0);
            sent0 = sent;
            matched0 = matched;
            measuring = 1;
        }
        if (at >= measure_to)
            break;
        int s = slot % SLOTS;
        int first = (int)(((long)s * n_targets + SLOTS - 1) / SLOTS);
        int last = (int)(((long)(s + 1) * n_targets + SLOTS - 1) / SLOTS);
        send_slot(first, last);
        drain();
        uint64_t next = at + SLOT_NS;
        if (!readable) {
            sleep_until(next);
            continue;
        }
        for (;;) {
            uint64_t t = now_ns();
            if (t >= next)
                break;
            struct pollfd pf = {raw_fd, POLLIN, 0};
            struct timespec ts = {0, (long)(next - t)};
            if (ppoll(&pf, 1, &ts, NULL) > 0 && drain() > 1 && now_ns() + 1000000 < next) {
                struct timespec pause = {0, 1000000};
                nanosleep(&pause, NULL);
            }
        }
    }
    drain();
    getrusage(RUSAGE_SELF, &u1);
    double cpu = cpu_s(&u1) - cpu_s(&u0);
    uint64_t probes = sent - sent0;
    printf("mode=%s touch=%d targets=%d probes_per_s=%.0f cpu_pct=%.1f us_per_probe=%.2f matched_pct=%.1f "
           "unmatched=%llu sleeps_per_s=%.0f\n",
           argv[1], touch, n_targets, probes / (double)seconds, 100 * cpu / seconds, 1e6 * cpu / probes,
           100.0 * (matched - matched0) / probes, (unsigned long long)unmatched,
           (u1.ru_nvcsw - u0.ru_nvcsw) / (double)seconds);
    return 0;
}
