// health-tx-ring.c: the sender's CPU per frame for half-open probes' SYNs (74 bytes: Ethernet,
// IPv4, TCP with options) sent (a) as the checker does, sendmmsg of 64 on an AF_PACKET
// SOCK_DGRAM socket, or (b) through a TPACKET_V2 TX ring on a SOCK_RAW socket, one sendto()
// kick per 64 frames. README (Performance, health checking) cites its figures.
//
// usage: txr <a|b> <ifname> <peer-mac aa:bb:..> <paced|fast> [frames] [bp]
//   paced: 500 frames every 10 ms (50 kpps) for `frames` frames (default 500000 = 10 s)
//   fast : as fast as possible for `frames` frames (default 1000000)
//   bp   : (a) default SO_SNDBUF, blocking in the kernel; (b) sleeps while a frame is busy
// Output: one line of key=value pairs (ns_per_frame: getrusage user+sys of this process).
//
// The bed (namespaces of one's own; run the sender with nsenter --net=/run/netns/txr-a):
//   ip netns add txr-a; ip netns add txr-b
//   ip link add txr-a netns txr-a type veth peer name txr-b netns txr-b
//   addresses 10.77.0.1/24 (txr-a) and 10.77.0.2/24 (txr-b), both up, lo up in both
//   ip -n txr-b route add local 10.78.0.0/16 dev lo; ip -n txr-a route add 10.78.0.0/16 via 10.77.0.2
//   a TCP listener on 0.0.0.0:9 in txr-b (never accepting), a pfifo limit 10000 on both ends
//   NAPI threads on both ends: ethtool -K <dev> gro on tso off; echo 1 > /sys/class/net/<dev>/threaded
//   (with TSO on, veth hands the frames to the peer inline and the receiver's whole TCP work is
//   charged to the sender: the two modes then differ by less than the noise)
// gcc -O2 -o txr health-tx-ring.c
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>

#define BATCH 64
#define PACED_BATCH 500
#define PACED_PERIOD_NS 10000000LL

#define FRAME_SIZE 256
#define BLOCK_SIZE 65536
#define FRAME_NR 2048
#define BLOCK_NR (FRAME_NR * FRAME_SIZE / BLOCK_SIZE)

static uint8_t src_mac[6], dst_mac[6];
static int bp;   // "bp" option: (a) default SO_SNDBUF => blocks in sock_alloc_send_pskb; (b) sleep instead of spin while a frame is busy
static unsigned long long n_sleeps;
static int ifindex;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uint16_t csum_fold(uint32_t s) {
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}
static uint32_t csum_add(uint32_t s, const void *p, int len) {
    const uint8_t *b = p;
    for (int i = 0; i + 1 < len; i += 2) s += (b[i] << 8) | b[i + 1];
    if (len & 1) s += b[len - 1] << 8;
    return s;
}

// Build IPv4 (20) + TCP SYN with 20 bytes of options (40) = 60 bytes at p.
static void build_ip_tcp(uint8_t *p, uint64_t i) {
    uint32_t saddr = htonl(0x0a4d0001);             // 10.77.0.1
    uint32_t k = (uint32_t)(i % (256u * 254u));     // spread over 65024 dsts
    uint32_t daddr = htonl(0x0a4e0000 | ((k / 254) << 8) | (k % 254 + 1)); // 10.78.x.(1..254)
    uint16_t sport = 1024 + (uint16_t)((i / (256u * 254u) * 7919u + i) % 64000u);
    uint32_t seq = (uint32_t)(i * 2654435761u);

    uint8_t *ip = p, *tcp = p + 20;
    ip[0] = 0x45; ip[1] = 0;
    *(uint16_t *)(ip + 2) = htons(60);
    *(uint16_t *)(ip + 4) = htons((uint16_t)i);
    *(uint16_t *)(ip + 6) = htons(0x4000);          // DF
    ip[8] = 64; ip[9] = 6;
    *(uint16_t *)(ip + 10) = 0;
    memcpy(ip + 12, &saddr, 4);
    memcpy(ip + 16, &daddr, 4);
    *(uint16_t *)(ip + 10) = htons(csum_fold(csum_add(0, ip, 20)));

    *(uint16_t *)(tcp + 0) = htons(sport);
    *(uint16_t *)(tcp + 2) = htons(9);
    *(uint32_t *)(tcp + 4) = htonl(seq);
    *(uint32_t *)(tcp + 8) = 0;
    tcp[12] = (40 / 4) << 4;                        // data offset 10 words
    tcp[13] = 0x02;                                 // SYN
    *(uint16_t *)(tcp + 14) = htons(64240);
    *(uint16_t *)(tcp + 16) = 0;                    // csum
    *(uint16_t *)(tcp + 18) = 0;                    // urg
    uint8_t *o = tcp + 20;
    o[0] = 2; o[1] = 4; *(uint16_t *)(o + 2) = htons(1460);   // MSS
    o[4] = 4; o[5] = 2;                                        // SACK permitted
    o[6] = 8; o[7] = 10;                                       // timestamps
    *(uint32_t *)(o + 8) = htonl((uint32_t)i); *(uint32_t *)(o + 12) = 0;
    o[16] = 1;                                                 // NOP
    o[17] = 3; o[18] = 3; o[19] = 7;                           // WS 7
    uint32_t s = 0;
    s = csum_add(s, ip + 12, 8);
    s += 6; s += 40;
    s = csum_add(s, tcp, 40);
    *(uint16_t *)(tcp + 16) = htons(csum_fold(s));
}

struct hoststat { unsigned long long busy, total, idle; };
static struct hoststat read_stat(void) {
    struct hoststat h = {0, 0, 0};
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[10] = {0};
    if (f && fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                    &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]) >= 8) {
        for (int i = 0; i < 8; i++) h.total += v[i];
        h.busy = h.total - v[3] - v[4];             // minus idle, iowait
        h.idle = v[3] + v[4];                       // nohz idle time: measured, not tick-sampled
    }
    if (f) fclose(f);
    return h;
}

static double ru_ns(const struct timeval *tv) { return tv->tv_sec * 1e9 + tv->tv_usec * 1e3; }

static int parse_mac(const char *s, uint8_t *m) {
    return sscanf(s, "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) == 6 ? 0 : -1;
}

static int get_own_mac(const char *ifname, uint8_t *m) {   // SIOCGIFHWADDR: works under nsenter --net
    struct ifreq ifr;
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0) return -1;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", ifname);
    int r = ioctl(s, SIOCGIFHWADDR, &ifr);
    close(s);
    if (r) return -1;
    memcpy(m, ifr.ifr_hwaddr.sa_data, 6);
    return 0;
}

// ---- counters
static unsigned long long n_sent, n_err, n_syscalls, n_waits, n_spins, n_polls, n_rekicks;

// ---- mode a: SOCK_DGRAM + sendmmsg
static int fd;
static uint8_t abuf[BATCH][64];
static struct mmsghdr amsg[BATCH];
static struct iovec aiov[BATCH][2];
static struct sockaddr_ll asll[BATCH];

static void a_setup(void) {
    fd = socket(AF_PACKET, SOCK_DGRAM, 0);          // protocol 0: TX only, no RX hook
    if (fd < 0) { perror("socket"); exit(1); }
    int sb = 4 << 20;
    if (!bp && setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sb, sizeof sb)) perror("SO_SNDBUFFORCE");
    for (int j = 0; j < BATCH; j++) {
        memset(&asll[j], 0, sizeof asll[j]);
        asll[j].sll_family = AF_PACKET;
        asll[j].sll_ifindex = ifindex;
        asll[j].sll_protocol = htons(ETH_P_IP);
        asll[j].sll_halen = 6;
        memcpy(asll[j].sll_addr, dst_mac, 6);
        aiov[j][0].iov_base = abuf[j];
        aiov[j][0].iov_len = 20;
        aiov[j][1].iov_base = abuf[j] + 20;
        aiov[j][1].iov_len = 40;
        memset(&amsg[j], 0, sizeof amsg[j]);
        amsg[j].msg_hdr.msg_name = &asll[j];
        amsg[j].msg_hdr.msg_namelen = sizeof asll[j];
        amsg[j].msg_hdr.msg_iov = aiov[j];
        amsg[j].msg_hdr.msg_iovlen = 2;
    }
}

static void a_send(uint64_t first, int n) {
    for (int j = 0; j < n; j++) build_ip_tcp(abuf[j], first + j);
    int off = 0;
    while (off < n) {
        int r = sendmmsg(fd, amsg + off, n - off, 0);
        n_syscalls++;
        if (r < 0) {
            if (errno == EINTR) continue;
            n_err++; off++;                          // drop the failing message
            continue;
        }
        n_sent += r; off += r;
        if (off < n) { n_err++; off++; }             // message `off` failed
    }
}

// ---- mode b: SOCK_RAW + TPACKET_V2 TX ring
static uint8_t *ring;
static unsigned ring_idx;
static struct sockaddr_ll bsll;
#define DATA_OFF (TPACKET2_HDRLEN - sizeof(struct sockaddr_ll))

static void b_setup(void) {
    fd = socket(AF_PACKET, SOCK_RAW, 0);            // protocol 0: TX only, no RX hook
    if (fd < 0) { perror("socket"); exit(1); }
    int v = TPACKET_V2;
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &v, sizeof v)) { perror("PACKET_VERSION"); exit(1); }
    int loss = 1;
    if (setsockopt(fd, SOL_PACKET, PACKET_LOSS, &loss, sizeof loss)) { perror("PACKET_LOSS"); exit(1); }
    int sb = 4 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sb, sizeof sb)) perror("SO_SNDBUFFORCE");
    struct tpacket_req req = {.tp_block_size = BLOCK_SIZE, .tp_block_nr = BLOCK_NR,
                              .tp_frame_size = FRAME_SIZE, .tp_frame_nr = FRAME_NR};
    if (setsockopt(fd, SOL_PACKET, PACKET_TX_RING, &req, sizeof req)) { perror("PACKET_TX_RING"); exit(1); }
    ring = mmap(NULL, (size_t)BLOCK_SIZE * BLOCK_NR, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ring == MAP_FAILED) { perror("mmap"); exit(1); }
    memset(&bsll, 0, sizeof bsll);
    bsll.sll_family = AF_PACKET;
    bsll.sll_ifindex = ifindex;
    bsll.sll_protocol = htons(ETH_P_IP);
}

static void b_kick(void) {
    for (;;) {
        int r = sendto(fd, NULL, 0, MSG_DONTWAIT, (struct sockaddr *)&bsll, sizeof bsll);
        n_syscalls++;
        if (r < 0) {
            if (errno == EINTR) continue;
            n_err++;       // e.g. ENOBUFS: remaining frames stay SEND_REQUEST, re-kicked later
        }
        return;
    }
}

static inline struct tpacket2_hdr *b_frame(unsigned idx) {
    return (struct tpacket2_hdr *)(ring + (size_t)idx * FRAME_SIZE);   // frames never straddle blocks
}

static void b_wait_available(struct tpacket2_hdr *h) {
    uint32_t st = __atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE);
    if (st == TP_STATUS_AVAILABLE) return;
    n_waits++;
    unsigned spins = 0;
    for (;;) {
        st = __atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE);
        if (st == TP_STATUS_AVAILABLE) return;
        if (st & TP_STATUS_WRONG_FORMAT) { n_err++; return; }
        if (st == TP_STATUS_SEND_REQUEST) { n_rekicks++; b_kick(); continue; }
        // TP_STATUS_SENDING: skb still in flight, destructor not run yet
        n_spins++;
        if (++spins < 200) { _mm_pause(); continue; }
        if (bp) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            n_sleeps++;
            spins = 0;
            continue;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        n_polls++;
        poll(&p, 1, 1);
        spins = 0;
    }
}

static uint64_t b_seq;
static void b_send(uint64_t first, int n) {
    int left = n;
    while (left > 0) {
        int k = left < BATCH ? left : BATCH;
        for (int j = 0; j < k; j++) {
            struct tpacket2_hdr *h = b_frame(ring_idx);
            b_wait_available(h);
            uint8_t *d = (uint8_t *)h + DATA_OFF;
            memcpy(d, dst_mac, 6);
            memcpy(d + 6, src_mac, 6);
            d[12] = 0x08; d[13] = 0x00;
            build_ip_tcp(d + 14, first++);
            h->tp_len = 74;
            __atomic_store_n(&h->tp_status, TP_STATUS_SEND_REQUEST, __ATOMIC_RELEASE);
            ring_idx = (ring_idx + 1) % FRAME_NR;
        }
        b_kick();
        n_sent += k;                                 // requested; errors counted separately
        left -= k;
    }
    b_seq = first;
}

static void b_drain(void) {                          // wait until every frame is back to AVAILABLE
    for (unsigned i = 0; i < FRAME_NR; i++) b_wait_available(b_frame(i));
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: %s <a|b> <ifname> <peer-mac> <paced|fast> [frames]\n", argv[0]); return 2; }
    char mode = argv[1][0];
    const char *ifname = argv[2];
    if (parse_mac(argv[3], dst_mac)) { fprintf(stderr, "bad mac\n"); return 2; }
    int paced = !strcmp(argv[4], "paced");
    uint64_t frames = argc > 5 ? strtoull(argv[5], 0, 0) : (paced ? 500000 : 1000000);
    bp = argc > 6 && !strcmp(argv[6], "bp");
    ifindex = if_nametoindex(ifname);
    if (!ifindex || get_own_mac(ifname, src_mac)) { fprintf(stderr, "no if %s\n", ifname); return 2; }

    if (mode == 'a') a_setup(); else b_setup();
    void (*send_fn)(uint64_t, int) = mode == 'a' ? a_send : b_send;

    struct rusage r0, r1;
    struct hoststat h0 = read_stat();
    getrusage(RUSAGE_SELF, &r0);
    uint64_t t0 = now_ns();
    uint64_t done = 0;
    if (paced) {
        uint64_t k = 0;
        while (done < frames) {
            uint64_t deadline = t0 + k * PACED_PERIOD_NS;
            struct timespec ts = {.tv_sec = deadline / 1000000000ull, .tv_nsec = deadline % 1000000000ull};
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) ;
            int n = frames - done < PACED_BATCH ? (int)(frames - done) : PACED_BATCH;
            // send the 500 in chunks of 64 (7 x 64 + 52)
            for (int off = 0; off < n; off += BATCH) send_fn(done + off, n - off < BATCH ? n - off : BATCH);
            done += n; k++;
        }
    } else {
        while (done < frames) {
            int n = frames - done < BATCH ? (int)(frames - done) : BATCH;
            send_fn(done, n);
            done += n;
        }
    }
    if (mode == 'b') b_drain();
    uint64_t t1 = now_ns();
    getrusage(RUSAGE_SELF, &r1);
    struct hoststat h1 = read_stat();

    double u = ru_ns(&r1.ru_utime) - ru_ns(&r0.ru_utime);
    double s = ru_ns(&r1.ru_stime) - ru_ns(&r0.ru_stime);
    double el = (t1 - t0) / 1e9;
    long hz = sysconf(_SC_CLK_TCK);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    // host2: ncpu * wall - (idle+iowait); idle comes from the nohz idle clock, so this avoids
    // the aliasing of 250 Hz tick sampling with the 10 ms send bursts
    double hbusy2 = ncpu * el * 1e9 - (double)(h1.idle - h0.idle) * (1e9 / hz);
    double hbusy = (double)(h1.busy - h0.busy), htot = (double)(h1.total - h0.total);
    printf("mode=%c paced=%d frames=%llu sent=%llu err=%llu elapsed_s=%.3f pps=%.0f "
           "ns_per_frame=%.1f user_ns=%.1f sys_ns=%.1f syscalls=%llu waits=%llu spins=%llu polls=%llu rekicks=%llu "
           "host_busy_pct=%.1f host_ns_per_frame=%.1f host2_busy_pct=%.1f host2_ns_per_frame=%.1f nvcsw=%ld nivcsw=%ld bp=%d sleeps=%llu\n",
           mode, paced, (unsigned long long)frames, n_sent, n_err, el, frames / el,
           (u + s) / frames, u / frames, s / frames, n_syscalls, n_waits, n_spins, n_polls, n_rekicks,
           htot > 0 ? 100.0 * hbusy / htot : 0, hbusy * (1e9 / hz) / frames,
           100.0 * hbusy2 / (ncpu * el * 1e9), hbusy2 / frames,
           r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw, bp, n_sleeps);
    return 0;
}
