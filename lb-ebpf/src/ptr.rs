//! The one way packet memory is read: bounds-checked against `data_end` so the verifier accepts
//! every access and a short packet yields `None` instead of undefined behaviour.

/// Pointer to a `T` at `offset` bytes into the packet, if the packet holds all of it.
/// Plain arithmetic on purpose: the verifier tracks `data + offset + len <= data_end` directly.
#[inline(always)]
pub fn ptr_at<T>(data: usize, data_end: usize, offset: usize) -> Option<*const T> {
    if data + offset + core::mem::size_of::<T>() > data_end {
        return None;
    }
    Some((data + offset) as *const T)
}

/// Copy of the `T` at `offset`. Only for header types made of byte arrays and integers, for which
/// every bit pattern is valid (network-types headers are).
#[inline(always)]
pub fn read_at<T: Copy>(data: usize, data_end: usize, offset: usize) -> Option<T> {
    let p = ptr_at::<T>(data, data_end, offset)?;
    // SAFETY: `p` is in bounds (checked above); unaligned read since headers are packed.
    Some(unsafe { core::ptr::read_unaligned(p) })
}

/// Mutable pointer to a `T` at `offset`, if the packet holds all of it.
#[inline(always)]
pub fn ptr_at_mut<T>(data: usize, data_end: usize, offset: usize) -> Option<*mut T> {
    ptr_at::<T>(data, data_end, offset).map(|p| p as *mut T)
}

/// As [`ptr_at_mut`], with a bounds check the compiler cannot drop. The verifier needs a check
/// of each packet pointer it is given; LLVM removes a check it can prove from another (a later
/// one at a larger, variable offset), leaving a pointer the verifier cannot vouch for. Reading
/// `data_end` through a volatile load makes this check stand on its own.
#[inline(always)]
pub fn ptr_at_mut_checked<T>(data: usize, data_end: usize, offset: usize) -> Option<*mut T> {
    // SAFETY: a read of a local variable.
    let end = unsafe { core::ptr::read_volatile(&data_end) };
    ptr_at_mut::<T>(data, end, offset)
}

/// `r` through a volatile round trip, so the compiler cannot see where it points. For the
/// arguments of a function kept out of line: LLVM turns a pointer argument that is only read
/// into the values read, one argument each, and a BPF-to-BPF call can pass five at most (the
/// verifier refuses more).
#[inline(always)]
pub fn opaque<T>(r: &T) -> &T {
    let p: *const T = r;
    // SAFETY: a read of a local variable holding a valid pointer, which stays valid.
    unsafe { &*core::ptr::read_volatile(&p) }
}

/// As [`read_at`], with the bounds check of [`ptr_at_mut_checked`] (one the compiler cannot
/// drop in favour of an earlier comparison the verifier does not follow).
#[inline(always)]
pub fn read_at_checked<T: Copy>(data: usize, data_end: usize, offset: usize) -> Option<T> {
    let p = ptr_at_mut_checked::<T>(data, data_end, offset)?;
    // SAFETY: `p` is in bounds (checked above); unaligned read since headers are packed.
    Some(unsafe { core::ptr::read_unaligned(p) })
}

/// The IPv6 address at `p` as the maps hold it ([`lb_common::Addr6`]: 4 words of the packet's
/// bytes), read 16 bits at a time. The packet data starts 2-aligned (after XDP's headroom) and
/// the link headers are 14 or 18 bytes, so an IPv6 address in the frame is 2-aligned, never
/// 4-aligned: read as bytes, as `[u8; 16]` fields are, it took 16 byte loads and the shifts to
/// join them, the largest part of an IPv6 packet's extra cost.
///
/// # Safety
/// `p` must point to 16 readable bytes, 2-aligned.
#[inline(always)]
pub unsafe fn load_addr6(p: *const u8) -> lb_common::Addr6 {
    let h = p as *const u16;
    // SAFETY: the caller's promise; `u16::from` keeps the byte order of the packet (native
    // order words, as `addr6` builds them from bytes).
    let word = |i: usize| unsafe {
        u32::from(core::ptr::read(h.add(2 * i)))
            | u32::from(core::ptr::read(h.add(2 * i + 1))) << 16
    };
    [word(0), word(1), word(2), word(3)]
}

/// Writes `a` to the IPv6 address at `p`, 16 bits at a time (see [`load_addr6`]).
///
/// # Safety
/// `p` must point to 16 writable bytes, 2-aligned.
#[inline(always)]
pub unsafe fn store_addr6(p: *mut u8, a: &lb_common::Addr6) {
    let h = p as *mut u16;
    for (i, w) in a.iter().enumerate() {
        // SAFETY: the caller's promise.
        unsafe {
            core::ptr::write(h.add(2 * i), *w as u16);
            core::ptr::write(h.add(2 * i + 1), (*w >> 16) as u16);
        }
    }
}
