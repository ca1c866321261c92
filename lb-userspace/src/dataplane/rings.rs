//! The Maglev rings' map (`LB_RINGS`), written through a shared mapping of its memory.
//!
//! Every ring slot is one element of an array map: through `BPF_MAP_UPDATE_BATCH` each cost
//! about 180 ns of the kernel's copying and checks (500 services of 65,537 slots: about 60% of
//! a 9.4 s start, by perf, before the API answered), while the program reads the same memory
//! the mapping shows.
//! A slot is a `u32` on its own 8 bytes (the kernel rounds an array's elements up to 8), and
//! an aligned 4-byte store is seen by the program whole: the old backend or the new one, as
//! with a map update.
//!
//! Each write maps only the pages it touches and unmaps them after: kept mapped, the array's
//! pages would count in the daemon's resident size (500 services: 256 MB more), though they are
//! the kernel's memory either way.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd},
    path::Path,
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context as _, bail};

/// `BPF_F_MMAPABLE` of `linux/bpf.h` (the program's map definition sets it).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Bytes between two elements of an array map of `u32`.
const STRIDE: usize = 8;

/// The ring array, to be written through mappings of it.
pub struct Rings {
    fd: OwnedFd,
    entries: usize,
}

impl Rings {
    /// The array map `fd` of `entries` slots, made with [`BPF_F_MMAPABLE`]: mapped once here,
    /// so that a map that cannot be is an error at load, not at the first write.
    pub fn new(fd: BorrowedFd<'_>, entries: u32) -> io::Result<Self> {
        let rings = Self {
            fd: fd.try_clone_to_owned()?,
            entries: entries as usize,
        };
        Mapping::new(&rings.fd, 0, page_size())?;
        Ok(rings)
    }

    /// Writes `id` at `first + slot` for each `(slot, id)`; nothing if any lies beyond the
    /// array.
    pub fn write(&self, first: u32, slots: &[(u32, u32)]) -> anyhow::Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let (mut low, mut high) = (u32::MAX, 0);
        for &(slot, _) in slots {
            low = low.min(slot);
            high = high.max(slot);
        }
        let first = first as usize;
        let (low, high) = (first + low as usize, first + high as usize);
        if high >= self.entries {
            bail!("slot {high} lies beyond the ring array's {}", self.entries);
        }
        let page = page_size();
        let offset = low * STRIDE / page * page;
        let mapping = Mapping::new(&self.fd, offset, (high + 1) * STRIDE - offset)
            .context("mapping the ring array")?;
        let base = mapping.base.as_ptr();
        for &(slot, id) in slots {
            let at = (first + slot as usize) * STRIDE - offset;
            // SAFETY: the slot lies between `low` and `high`, so inside the mapping, 8-byte
            // aligned (the mapping is page-aligned); the mapping lives until the loop ends.
            unsafe { (*base.add(at).cast::<AtomicU32>()).store(id, Ordering::Relaxed) };
        }
        Ok(())
    }
}

/// A writable shared mapping of part of the array, unmapped when dropped.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// `len` bytes from `offset` (a multiple of the page size).
    fn new(fd: &OwnedFd, offset: usize, len: usize) -> io::Result<Self> {
        let offset = libc::off_t::try_from(offset).map_err(io::Error::other)?;
        // SAFETY: a new shared mapping of the map's memory; the kernel checks the range and
        // the flag, and the mapping keeps the map alive until `munmap`.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(addr.cast()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Self { base, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer referenced.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
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
