//! The Maglev rings' map (`LB_RINGS`), written through a shared mapping of its memory.
//!
//! Every ring slot is one element of an array map: through `BPF_MAP_UPDATE_BATCH` each cost
//! about 180 ns of the kernel's copying and checks (500 services of 65,537 slots: some 6 s of a
//! start, before the API answered), while the program reads the same memory the mapping shows.
//! A slot is a `u32` on its own 8 bytes (the kernel rounds an array's elements up to 8), and
//! an aligned 4-byte store is seen by the program whole: the old backend or the new one, as
//! with a map update.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd},
    path::Path,
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
};

/// `BPF_F_MMAPABLE` of `linux/bpf.h` (the program's map definition sets it).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Bytes between two elements of an array map of `u32`.
const STRIDE: usize = 8;

/// A writable shared mapping of the whole ring array.
pub struct Rings {
    base: NonNull<u8>,
    bytes: usize,
    entries: usize,
}

// SAFETY: the mapping is plain shared memory, written only through atomic stores.
unsafe impl Send for Rings {}
unsafe impl Sync for Rings {}

impl Rings {
    /// Maps the `entries` slots of the array map `fd` (created with [`BPF_F_MMAPABLE`]).
    pub fn map(fd: BorrowedFd<'_>, entries: u32) -> io::Result<Self> {
        let entries = entries as usize;
        let page = page_size();
        let bytes = (entries * STRIDE).div_ceil(page).max(1) * page;
        // SAFETY: a new shared mapping of the map's memory; the kernel checks the size and the
        // flag, and the mapping keeps the map alive until `munmap`.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(addr.cast()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Self {
            base,
            bytes,
            entries,
        })
    }

    /// Writes `id` at `first + slot` for each `(slot, id)`; nothing if any lies beyond the
    /// array (the index of the first such pair is the error).
    pub fn write(&self, first: u32, slots: &[(u32, u32)]) -> Result<(), usize> {
        if let Some(bad) = slots
            .iter()
            .position(|&(slot, _)| first as usize + slot as usize >= self.entries)
        {
            return Err(bad);
        }
        for &(slot, id) in slots {
            self.slot(first as usize + slot as usize)
                .store(id, Ordering::Relaxed);
        }
        Ok(())
    }

    fn slot(&self, index: usize) -> &AtomicU32 {
        debug_assert!(index < self.entries);
        // SAFETY: index < entries, so the slot lies inside the mapping, 8-byte aligned (the
        // mapping is page-aligned); the memory lives as long as `self`.
        unsafe { &*self.base.as_ptr().add(index * STRIDE).cast::<AtomicU32>() }
    }
}

impl Drop for Rings {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, no longer referenced.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}

/// Whether the ring array pinned at `path` was made by an lb that wrote it with system calls
/// (without [`BPF_F_MMAPABLE`]): such a map cannot be mapped, and only differs in that flag.
pub fn pinned_without_mapping(path: &Path) -> bool {
    aya::maps::MapInfo::from_pin(path).is_ok_and(|info| info.map_flags() & BPF_F_MMAPABLE == 0)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096).max(1)
}
