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
/// `K` and `V`), in order. On failure the error and, when the kernel got as far as the
/// elements, the index of the one it failed at (those before it are written).
pub fn update<K, V>(
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> Result<(), (Option<usize>, io::Error)> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    let Ok(count) = u32::try_from(keys.len()) else {
        return Err((None, io::Error::from(io::ErrorKind::InvalidInput)));
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
        let e = io::Error::last_os_error();
        // The kernel writes back how many it wrote once it works on the elements; refused
        // before that (a bad descriptor, flags), `count` still holds what was asked.
        let failed = (attr.count < count).then_some(attr.count as usize);
        return Err((failed, e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn an_fd_that_is_no_map_is_an_error_with_nothing_written() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let (failed, e) = update(file.as_fd(), &[0u32, 1], &[7u32, 8]).unwrap_err();
        assert_eq!(failed, None);
        assert!(e.raw_os_error().is_some(), "{e}");
    }

    #[test]
    fn nothing_to_write_makes_no_call() {
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(update::<u32, u32>(file.as_fd(), &[], &[]).is_ok());
    }
}
