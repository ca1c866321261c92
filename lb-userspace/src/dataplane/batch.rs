//! BPF_MAP_UPDATE_BATCH (Linux 5.6+), which aya does not wrap: many elements of a map written
//! in one system call. A verdict rewrites a third of a Maglev ring or more (tens of thousands
//! of slots, up to a million with the largest ring); one syscall per slot took 24–46 ms for a
//! 65,537-slot ring on an idle machine, with the daemon's state locked meanwhile.

use std::{io, os::fd::BorrowedFd};

/// `BPF_MAP_UPDATE_BATCH` in `enum bpf_cmd`.
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Writes `values[i]` at `keys[i]` of the map `fd` (keys and values of the map's own sizes,
/// `K` and `V`), in order. On failure, how many were written before it, and the error.
pub fn update<K, V>(
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> Result<(), (usize, io::Error)> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    let Ok(count) = u32::try_from(keys.len()) else {
        return Err((0, io::Error::from(io::ErrorKind::InvalidInput)));
    };
    if count == 0 {
        return Ok(());
    }
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count,
        map_fd: std::os::fd::AsRawFd::as_raw_fd(&fd) as u32,
        ..BatchAttr::default()
    };
    // SAFETY: `attr` is a valid bpf_attr prefix of the size given; the kernel reads `count`
    // keys and values from the slices, which hold that many, and writes only `attr.count`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
            &mut attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err((attr.count as usize, io::Error::last_os_error()));
    }
    Ok(())
}
