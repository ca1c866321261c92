//! Raw BPF for the packet-rate benchmark, which aya does not cover: tiny XDP programs written as
//! instructions (a MAC-swap bounce, a sink that restores the frame and drops it), their XDP
//! links, and BPF_PROG_TEST_RUN in live-frames mode (`BPF_F_TEST_XDP_LIVE_FRAMES`).

use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_XDP: u32 = 6;
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
const MOV64_X: u8 = 0xbf;
const MOV64_K: u8 = 0xb7;
const ADD64_K: u8 = 0x07;
const JGT_X: u8 = 0x2d;
const JNE_K: u8 = 0x55;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
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

/// Writes `frame` over the start of every frame it sees (when the frame is at least that long),
/// then XDP_DROP. Attached to the veth peers that receive the benchmark's output: live-frames
/// mode recycles its pages without rewriting them, so a program that rewrites the frame (lb)
/// would otherwise see its own output the next time the page comes round. An IPv4-in-IPv4 frame
/// (lb's direct server return) loses its outer header first, so the page's frame starts where
/// the generator put it.
pub fn restore_and_drop(frame: &[u8]) -> Vec<Insn> {
    let mut stores = Vec::new();
    let mut i = 0;
    while i < frame.len() {
        let rest = &frame[i..];
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
    // IPv4's protocol byte (14 + 9) read when the frame holds it; 4: strip 20 bytes.
    let strip = [
        insn(LDX_B, 4, 2, 23, 0),
        insn(JNE_K, 4, 0, 4, 4),
        insn(MOV64_X, 6, 1, 0, 0),
        insn(MOV64_K, 2, 0, 0, IPIP_OUTER),
        insn(CALL, 0, 0, 0, XDP_ADJUST_HEAD),
        insn(MOV64_X, 1, 6, 0, 0),
    ];
    let restore = bounds(frame.len() as i32, stores.len() as i16);
    let skip_all = (strip.len() + restore.len() + stores.len()) as i16;
    let mut p = bounds(24, skip_all).to_vec();
    p.extend(strip);
    p.extend(restore);
    p.extend(stores);
    p.extend(ret(XDP_DROP));
    p
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
    fn restore_covers_the_frame_and_jumps_past_the_stores() {
        let p = restore_and_drop(&[1, 2, 3, 4, 5, 6, 7]);
        // 5 bounds, 6 to strip an outer header, 5 bounds + W, H, B stores + 2 return.
        assert_eq!(p.len(), 21);
        assert_eq!(4 + 1 + p[4].off as usize, 19, "too short: to the return");
        assert_eq!(
            6 + 1 + p[6].off as usize,
            11,
            "not IP in IP: to the restore"
        );
        assert_eq!(p[15].off, 3, "skip the three stores");
        assert_eq!((p[16].code, p[16].off, p[16].imm), (ST_W, 0, 0x0403_0201));
        assert_eq!((p[17].code, p[17].off, p[17].imm), (ST_H, 4, 0x0605));
        assert_eq!((p[18].code, p[18].off, p[18].imm), (ST_B, 6, 7));
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
