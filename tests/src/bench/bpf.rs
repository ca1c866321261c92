//! Raw BPF for the packet-rate benchmark, which aya does not cover: tiny XDP programs written as
//! instructions (a MAC-swap bounce, a sink that writes the next flow's frame over the page and
//! drops it), the sink's one-slot array map, their XDP links, and BPF_PROG_TEST_RUN in
//! live-frames mode (`BPF_F_TEST_XDP_LIVE_FRAMES`); and standalone maps of any type (Katran's
//! per-CPU LRUs, which aya creates only from an object).

use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
/// `enum bpf_attach_type`: BPF_XDP.
const BPF_XDP: u32 = 37;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

pub const XDP_DROP: i32 = 1;
pub const XDP_PASS: i32 = 2;
pub const XDP_TX: i32 = 3;

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

// Opcodes: class | size | mode (see the kernel's Documentation/bpf/standardization).
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const STX_W: u8 = 0x63;
const STX_H: u8 = 0x6b;
const ST_W: u8 = 0x62;
const ST_H: u8 = 0x6a;
const ST_B: u8 = 0x72;
const LD_IMM64: u8 = 0x18;
const ADD64_X: u8 = 0x0f;
const SUB64_X: u8 = 0x1f;
const LSH64_K: u8 = 0x67;
/// ALU | END | TO_BE: byte swap to big endian (network order), the width in `imm`.
const TO_BE: u8 = 0xdc;
const JEQ_K: u8 = 0x15;
const MOV64_X: u8 = 0xbf;
const MOV64_K: u8 = 0xb7;
const ADD64_K: u8 = 0x07;
const JGT_X: u8 = 0x2d;
const JNE_K: u8 = 0x55;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
/// `src` of LD_IMM64: `imm` is a map's file descriptor.
const PSEUDO_MAP_FD: u8 = 1;
/// Helper number of `bpf_map_lookup_elem`.
const MAP_LOOKUP_ELEM: i32 = 1;
/// Helper number of `bpf_xdp_adjust_head`.
const XDP_ADJUST_HEAD: i32 = 44;
/// IP in IP: what lb puts in front of a frame for direct server return (`ipip`), 20 bytes.
const IPIP_OUTER: i32 = 20;

/// `r2 = ctx->data; r3 = ctx->data_end; if r2 + len > r3 goto +skip`.
fn bounds(len: i32, skip: i16) -> [Insn; 5] {
    [
        insn(LDX_W, 2, 1, 0, 0),
        insn(LDX_W, 3, 1, 4, 0),
        insn(MOV64_X, 4, 2, 0, 0),
        insn(ADD64_K, 4, 0, 0, len),
        insn(JGT_X, 4, 3, skip, 0),
    ]
}

fn ret(action: i32) -> [Insn; 2] {
    [insn(MOV64_K, 0, 0, 0, action), insn(EXIT, 0, 0, 0, 0)]
}

/// Swaps the Ethernet source and destination and returns XDP_TX (frames shorter than an
/// Ethernet header: XDP_PASS). The classic "reflector", the ceiling of XDP forwarding.
pub fn bounce() -> Vec<Insn> {
    let mut p = bounds(14, 10).to_vec();
    p.extend([
        insn(LDX_W, 4, 2, 0, 0),  // dst[0..4]
        insn(LDX_H, 5, 2, 4, 0),  // dst[4..6]
        insn(LDX_W, 6, 2, 6, 0),  // src[0..4]
        insn(LDX_H, 7, 2, 10, 0), // src[4..6]
        insn(STX_W, 2, 6, 0, 0),
        insn(STX_H, 2, 7, 4, 0),
        insn(STX_W, 2, 4, 6, 0),
        insn(STX_H, 2, 5, 10, 0),
    ]);
    p.extend(ret(XDP_TX));
    p.extend(ret(XDP_PASS));
    p
}

/// Returns `action` and does nothing else.
pub fn just(action: i32) -> Vec<Insn> {
    ret(action).to_vec()
}

/// Where the sink varies the flow of an IPv4 TCP frame (20-byte headers): the TCP source port
/// and the first 16-bit word of the payload.
pub const SPORT_AT: usize = 14 + 20;
pub const WORD_AT: usize = 14 + 20 + 20;

/// `template` as flow `i` of its cycle: source port + i, first payload word − i. The two words'
/// sum, and so the TCP checksum, stay those of the template: every flow's frame is valid.
pub fn flow_frame(template: &[u8], i: u16) -> Vec<u8> {
    let mut f = template.to_vec();
    let word = |f: &[u8], at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
    let (sport, w) = (word(&f, SPORT_AT) + i, word(&f, WORD_AT) - i);
    f[SPORT_AT..SPORT_AT + 2].copy_from_slice(&sport.to_be_bytes());
    f[WORD_AT..WORD_AT + 2].copy_from_slice(&w.to_be_bytes());
    f
}

/// The most flows a cycle over `template` can have (its port and payload word do not wrap).
pub fn max_flows(template: &[u8]) -> u32 {
    let word = |at: usize| u32::from(u16::from_be_bytes([template[at], template[at + 1]]));
    (0x1_0000 - word(SPORT_AT)).min(word(WORD_AT) + 1)
}

/// The sink: writes frame `i` of the cycle over `template` (see [`flow_frame`]) over the start of
/// every frame it sees, moves the cycle on (`cursor`), then XDP_DROP. Attached to the veth peers
/// that receive the benchmark's output. Live-frames mode copies its input into a page once, when
/// the page pool allocates it, and then recycles the page without rewriting it: so the program
/// under test sees what the sink last wrote there, the next flow of the cycle, and never its
/// own output (lb rewrites addresses). An IPv4-in-IPv4 frame (lb's direct server return) loses
/// its outer header first, so the page's frame starts where the generator put it. With the
/// cursor's census on, it counts the arriving frames by TCP source port (lb's SNAT port).
pub fn next_flow_and_drop(template: &[u8], cursor: &Cursor) -> Vec<Insn> {
    assert!(
        template.len() >= WORD_AT + 2 && template[12..14] == [8, 0] && template[23] == 6,
        "the sink's template is an IPv4 TCP frame with a payload"
    );
    let mut stores = Vec::new();
    let mut i = 0;
    while i < template.len() {
        let rest = &template[i..];
        let (code, n, imm) = if rest.len() >= 4 {
            (
                ST_W,
                4,
                u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as i32,
            )
        } else if rest.len() >= 2 {
            (ST_H, 2, i32::from(u16::from_le_bytes([rest[0], rest[1]])))
        } else {
            (ST_B, 1, i32::from(rest[0]))
        };
        stores.push(insn(code, 2, 0, i as i16, imm));
        i += n;
    }
    let word = |at: usize| i32::from(u16::from_be_bytes([template[at], template[at + 1]]));
    // Jumps to the final XDP_DROP, their offsets set at the end.
    let mut to_drop = Vec::new();
    let mut p = vec![insn(MOV64_X, 6, 1, 0, 0)]; // r6 = ctx
    let mut check = |p: &mut Vec<Insn>, len: usize| {
        p.extend(bounds(len as i32, 0));
        to_drop.push(p.len() - 1);
    };
    check(&mut p, SPORT_AT + 2);
    p.extend([
        insn(LDX_H, 8, 2, SPORT_AT as i16, 0), // r8 = the arriving source port (census)
        // IPv4's protocol byte (14 + 9); 4 (IP in IP): strip the 20-byte outer header.
        insn(LDX_B, 4, 2, 23, 0),
        insn(JNE_K, 4, 0, 3, 4),
        insn(MOV64_K, 2, 0, 0, IPIP_OUTER),
        insn(CALL, 0, 0, 0, XDP_ADJUST_HEAD),
        insn(MOV64_X, 1, 6, 0, 0),
    ]);
    check(&mut p, template.len());
    p.extend(stores);
    p.extend([
        insn(MOV64_X, 7, 2, 0, 0), // r7 = data, kept across the helper call
        insn(ST_W, 10, 0, -4, 0),  // key 0
        insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, cursor.fd()),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_X, 2, 10, 0, 0),
        insn(ADD64_K, 2, 0, 0, -4),
        insn(CALL, 0, 0, 0, MAP_LOOKUP_ELEM),
        insn(JEQ_K, 0, 0, 0, 0),
    ]);
    to_drop.push(p.len() - 1);
    p.extend([
        insn(LDX_W, 3, 0, 0, 0), // r3 = i, this frame's flow
        insn(MOV64_X, 4, 3, 0, 0),
        insn(ADD64_K, 4, 0, 0, 1),
        insn(LDX_W, 5, 0, 4, 0), // r5 = flows
        insn(JGT_X, 5, 4, 1, 0),
        insn(MOV64_K, 4, 0, 0, 0),
        insn(STX_W, 0, 4, 0, 0), // next = (i + 1) % flows
        insn(MOV64_K, 5, 0, 0, word(SPORT_AT)),
        insn(ADD64_X, 5, 3, 0, 0),
        insn(TO_BE, 5, 0, 0, 16),
        insn(STX_H, 7, 5, SPORT_AT as i16, 0),
        insn(MOV64_K, 5, 0, 0, word(WORD_AT)),
        insn(SUB64_X, 5, 3, 0, 0),
        insn(TO_BE, 5, 0, 0, 16),
        insn(STX_H, 7, 5, WORD_AT as i16, 0),
        insn(LDX_W, 4, 0, 8, 0), // census on?
        insn(JEQ_K, 4, 0, 0, 0),
    ]);
    to_drop.push(p.len() - 1);
    p.extend([
        insn(LSH64_K, 8, 0, 0, 2),
        insn(ADD64_X, 0, 8, 0, 0),
        insn(LDX_W, 4, 0, CURSOR_HEAD as i16, 0),
        insn(ADD64_K, 4, 0, 0, 1),
        insn(STX_W, 0, 4, CURSOR_HEAD as i16, 0),
    ]);
    let drop_at = p.len();
    for j in to_drop {
        p[j].off = (drop_at - j - 1) as i16;
    }
    p.extend(ret(XDP_DROP));
    p
}

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The cursor's value: next flow (u32), flows in the cycle (u32), census on (u32), padding, then
/// a frame count per TCP source port (u32 each, indexed by the port as the sink loads it: its
/// bytes swapped).
const CURSOR_HEAD: usize = 16;
const CURSOR_SIZE: usize = CURSOR_HEAD + 4 * 0x1_0000;

/// The sinks' shared state: where the cycle of flows is, and the optional census (a one-slot
/// array map; closed on drop).
pub struct Cursor {
    fd: OwnedFd,
}

impl Cursor {
    pub fn new() -> anyhow::Result<Self> {
        let mut attr = MapCreateAttr {
            map_type: BPF_MAP_TYPE_ARRAY,
            key_size: 4,
            value_size: CURSOR_SIZE as u32,
            max_entries: 1,
            ..Default::default()
        };
        let fd = bpf(BPF_MAP_CREATE, &mut attr).context("creating the sink's cursor map")?;
        // SAFETY: the kernel returned a new file descriptor that nothing else owns.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd as RawFd) },
        })
    }

    fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    fn elem(&self, cmd: libc::c_long, value: &mut [u8]) -> anyhow::Result<()> {
        let key = 0u32;
        let mut attr = MapElemAttr {
            map_fd: self.fd() as u32,
            _pad: 0,
            key: &key as *const u32 as u64,
            value: value.as_mut_ptr() as u64,
            flags: 0,
        };
        bpf(cmd, &mut attr).context("the sink's cursor map")?;
        Ok(())
    }

    /// Starts a cycle of `flows` flows at flow 0, the census cleared and on or off.
    pub fn start(&self, flows: u32, census: bool) -> anyhow::Result<()> {
        let mut v = vec![0u8; CURSOR_SIZE];
        v[4..8].copy_from_slice(&flows.max(1).to_ne_bytes());
        v[8..12].copy_from_slice(&u32::from(census).to_ne_bytes());
        self.elem(BPF_MAP_UPDATE_ELEM, &mut v)
    }

    /// The census: frames counted per TCP source port (host order), those seen.
    pub fn census(&self) -> anyhow::Result<Vec<(u16, u32)>> {
        let mut v = vec![0u8; CURSOR_SIZE];
        self.elem(BPF_MAP_LOOKUP_ELEM, &mut v)?;
        Ok(v[CURSOR_HEAD..]
            .as_chunks::<4>()
            .0
            .iter()
            .enumerate()
            .map(|(i, c)| ((i as u16).swap_bytes(), u32::from_ne_bytes(*c)))
            .filter(|&(_, n)| n != 0)
            .collect())
    }
}

/// Creates a map of `map_type` (e.g. an LRU hash that a program's map-in-map will hold), owned
/// by the returned descriptor.
pub fn create_map(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
) -> anyhow::Result<OwnedFd> {
    let mut attr = MapCreateAttr {
        map_type,
        key_size,
        value_size,
        max_entries,
        ..Default::default()
    };
    let fd = bpf(BPF_MAP_CREATE, &mut attr).context("BPF_MAP_CREATE")?;
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, initialised attribute struct of the size passed, laid out as the
    // kernel's union bpf_attr member for `cmd`; pointers in it outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// A loaded XDP program (closed on drop).
pub struct Program {
    fd: OwnedFd,
}

impl Program {
    pub fn load(name: &str, insns: &[Insn]) -> anyhow::Result<Self> {
        let license = c"GPL";
        let mut log = vec![0u8; 65536];
        let mut prog_name = [0u8; 16];
        for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
            *d = s;
        }
        let mut attr = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_XDP,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 1,
            log_size: log.len() as u32,
            log_buf: log.as_mut_ptr() as u64,
            prog_name,
            expected_attach_type: BPF_XDP,
            ..Default::default()
        };
        match bpf(BPF_PROG_LOAD, &mut attr) {
            // SAFETY: the kernel returned a new file descriptor that nothing else owns.
            Ok(fd) => Ok(Self {
                fd: unsafe { OwnedFd::from_raw_fd(fd as RawFd) },
            }),
            Err(e) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                bail!(
                    "loading XDP program {name}: {e}\n{}",
                    String::from_utf8_lossy(&log[..end])
                )
            }
        }
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// A native-mode XDP link; the program is detached when it drops.
pub struct Link {
    _fd: OwnedFd,
}

/// Attaches `prog` (native mode) to interface `ifindex` of the calling thread's namespace.
pub fn attach(prog_fd: RawFd, ifindex: u32) -> anyhow::Result<Link> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog_fd as u32,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags: XDP_FLAGS_DRV_MODE,
    };
    let fd = bpf(BPF_LINK_CREATE, &mut attr)
        .with_context(|| format!("attaching XDP (native) to ifindex {ifindex}"))?;
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(Link {
        _fd: unsafe { OwnedFd::from_raw_fd(fd as RawFd) },
    })
}

#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// Injects `frames` copies of `frame` as if received on `ingress` (an interface of the calling
/// thread's namespace) and runs `prog_fd` on each for real: XDP_TX and XDP_REDIRECT transmit,
/// XDP_PASS goes up the stack. Returns the wall time of the call.
pub fn live_frames(
    prog_fd: RawFd,
    frame: &[u8],
    ingress: u32,
    frames: u32,
    batch: u32,
) -> anyhow::Result<Duration> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex.
    let md: [u32; 6] = [0, frame.len() as u32, 0, ingress, 0, 0];
    let mut attr = TestRunAttr {
        prog_fd: prog_fd as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        repeat: frames,
        ctx_size_in: std::mem::size_of_val(&md) as u32,
        ctx_in: md.as_ptr() as u64,
        flags: BPF_F_TEST_XDP_LIVE_FRAMES,
        batch_size: batch,
        ..Default::default()
    };
    let start = Instant::now();
    bpf(BPF_PROG_TEST_RUN, &mut attr).context("BPF_PROG_TEST_RUN (live frames)")?;
    Ok(start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_frames_keep_the_sum_and_stop_before_a_wrap() {
        let mut t = vec![0u8; 64];
        t[SPORT_AT..SPORT_AT + 2].copy_from_slice(&40000u16.to_be_bytes());
        t[WORD_AT..WORD_AT + 2].copy_from_slice(&0x5555u16.to_be_bytes());
        let f = flow_frame(&t, 7);
        assert_eq!(f[SPORT_AT..SPORT_AT + 2], 40007u16.to_be_bytes());
        assert_eq!(f[WORD_AT..WORD_AT + 2], 0x554eu16.to_be_bytes());
        assert_eq!(f[..SPORT_AT], t[..SPORT_AT]);
        // The payload word wraps first: 0x5555 - 0x5555 is its last.
        assert_eq!(max_flows(&t), 0x5555 + 1);
    }

    #[test]
    fn bounce_jumps_to_pass() {
        let p = bounce();
        assert_eq!(p.len(), 17);
        // The bounds check jumps over 8 moves and the XDP_TX return to the XDP_PASS one.
        assert_eq!(4 + 1 + p[4].off as usize, 15);
        assert_eq!(p[15].imm, XDP_PASS);
    }
}
