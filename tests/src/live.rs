//! A running daemon's own XDP program, found through the link it pinned, run on test frames
//! with BPF_PROG_TEST_RUN: what the live datapath decides for a flow, host by host (aya opens
//! programs it loaded or pinned, not one by id).

use std::{
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use anyhow::{Context as _, bail};

const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_OBJ_GET: libc::c_long = 7;

fn bpf(cmd: libc::c_long, attr: &mut [u64]) -> std::io::Result<i64> {
    // SAFETY: `attr` is a zeroed bpf_attr of the size given, set up for `cmd`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc)
}

fn owned(fd: i64) -> OwnedFd {
    // SAFETY: a descriptor the kernel just returned to us.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// The program of the XDP link pinned at `link` (e.g. `PIN/link-IFACE`).
pub fn program_of_link(link: &Path) -> anyhow::Result<OwnedFd> {
    let path = CString::new(link.as_os_str().as_encoded_bytes())?;
    let mut get = [0u64; 3];
    get[0] = path.as_ptr() as u64;
    let fd =
        owned(bpf(BPF_OBJ_GET, &mut get).with_context(|| format!("opening {}", link.display()))?);
    let mut info = [0u32; 16];
    let mut req = [0u64; 2];
    req[0] = fd.as_raw_fd() as u32 as u64 | ((std::mem::size_of_val(&info) as u64) << 32);
    req[1] = info.as_mut_ptr() as u64;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut req).context("the link's info")?;
    let mut by_id = [0u64; 2];
    by_id[0] = u64::from(info[2]);
    Ok(owned(
        bpf(BPF_PROG_GET_FD_BY_ID, &mut by_id).context("the link's program")?,
    ))
}

/// Runs `prog` once on `frame` arriving on interface `ingress` of the calling thread's network
/// namespace: (verdict, the frame as the program left it).
pub fn run(prog: &OwnedFd, frame: &[u8], ingress: u32) -> anyhow::Result<(u32, Vec<u8>)> {
    let mut out = vec![0u8; frame.len() + 256];
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex.
    let md: [u32; 6] = [0, frame.len() as u32, 0, ingress, 0, 0];
    // union bpf_attr, BPF_PROG_TEST_RUN: prog_fd, retval, data_size_in, data_size_out,
    // data_in, data_out, repeat, duration, ctx_size_in, ctx_size_out, ctx_in, ctx_out.
    let mut attr = [0u64; 10];
    attr[0] = prog.as_raw_fd() as u32 as u64;
    attr[1] = frame.len() as u64 | ((out.len() as u64) << 32);
    attr[2] = frame.as_ptr() as u64;
    attr[3] = out.as_mut_ptr() as u64;
    attr[4] = 1; // repeat
    attr[5] = std::mem::size_of_val(&md) as u64; // ctx_size_in
    attr[6] = md.as_ptr() as u64;
    bpf(BPF_PROG_TEST_RUN, &mut attr).context("BPF_PROG_TEST_RUN")?;
    let verdict = (attr[0] >> 32) as u32;
    let size_out = (attr[1] >> 32) as usize;
    if size_out > out.len() {
        bail!("the program's output ({size_out} bytes) does not fit");
    }
    out.truncate(size_out);
    Ok((verdict, out))
}
