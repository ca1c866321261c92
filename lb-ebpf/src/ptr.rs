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
