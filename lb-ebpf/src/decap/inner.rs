//! The inner packet of an encapsulated packet to this host: its header whole inside what
//! encloses it, of the version the encapsulation announced, and no longer than the room it has.
//! A packet that fails is broken on its way to us, and dropped: the stack would drop it too.

use core::ops::ControlFlow::{self, Break, Continue};

use lb_common::decap_counter::DROP_MALFORMED;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use super::{Verdict, drop, outer::Found};
use crate::ptr::ptr_at;

/// The inner packet, checked.
pub struct Inner {
    /// Where it starts in the frame.
    pub off: usize,
    /// 4 or 6.
    pub version: u8,
    /// Its ECN bits.
    pub ecn: u8,
}

#[inline(always)]
pub fn check(data: usize, data_end: usize, found: &Found) -> ControlFlow<Verdict, Inner> {
    let off = found.inner;
    let room = found.end.saturating_sub(off);
    let ok = |ecn| {
        Continue(Inner {
            off,
            version: found.version,
            ecn,
        })
    };
    if found.version == 4 {
        let Some(ip) = ptr_at::<Ipv4Hdr>(data, data_end, off) else {
            return Break(drop(DROP_MALFORMED));
        };
        // SAFETY: bounds-checked.
        let ip = unsafe { &*ip };
        let ihl = ((ip.vihl & 0x0f) as usize) * 4;
        let tot_len = u16::from_be_bytes(ip.tot_len) as usize;
        if ip.vihl >> 4 != 4 || ihl < Ipv4Hdr::LEN || tot_len < ihl || tot_len > room {
            return Break(drop(DROP_MALFORMED));
        }
        return ok(ip.tos & 3);
    }
    let Some(ip) = ptr_at::<Ipv6Hdr>(data, data_end, off) else {
        return Break(drop(DROP_MALFORMED));
    };
    // SAFETY: bounds-checked.
    let ip = unsafe { &*ip };
    let len = Ipv6Hdr::LEN + u16::from_be_bytes(ip.payload_len) as usize;
    // A payload length of 0 is a jumbogram's (RFC 2675), which no link here carries.
    if ip.vcf[0] >> 4 != 6 || len == Ipv6Hdr::LEN || len > room {
        return Break(drop(DROP_MALFORMED));
    }
    ok((ip.vcf[1] >> 4) & 3)
}
