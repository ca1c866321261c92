//! ECN at decapsulation (RFC 6040 §4.2, what Linux's tunnels do in INET_ECN_decapsulate): a
//! router between the balancer and this host may have marked the outer header CE (congestion
//! experienced); the mark is copied into an ECN-capable inner packet, so that its transport
//! sees it. Around a packet that is not ECN-capable the mark stands for a drop, which it
//! becomes. Other outer ECN values change nothing (RFC 6040 would also turn an inner ECT(0)
//! into the outer ECT(1); Linux does not, nor does this).

use core::ops::ControlFlow::{self, Break, Continue};

use lb_common::decap_counter::{DROP_ECN, ECN_CE};
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};

use super::{Host, Verdict, drop, inner::Inner};
use crate::ptr::ptr_at_mut;

const NOT_ECT: u8 = 0;
const CE: u8 = 3;

#[inline(always)]
pub fn propagate<H: Host>(
    data: usize,
    data_end: usize,
    outer_ecn: u8,
    inner: &Inner,
    host: &H,
) -> ControlFlow<Verdict> {
    if outer_ecn != CE || inner.ecn == CE {
        return Continue(());
    }
    if inner.ecn == NOT_ECT {
        return Break(drop(DROP_ECN));
    }
    if inner.version == 4 {
        let Some(ip) = ptr_at_mut::<Ipv4Hdr>(data, data_end, inner.off) else {
            return Continue(()); // not reached: inner::check read it
        };
        // SAFETY: bounds-checked; this program owns the frame.
        let ip = unsafe { &mut *ip };
        // The header checksum follows the first 16-bit word (version, IHL, TOS) incrementally
        // (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')).
        let old = u16::from_be_bytes([ip.vihl, ip.tos]);
        let new = old | u16::from(CE);
        let mut sum = u32::from(!u16::from_be_bytes(ip.check)) + u32::from(!old) + u32::from(new);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        ip.tos |= CE;
        ip.check = (!(sum as u16)).to_be_bytes();
    } else {
        let Some(ip) = ptr_at_mut::<Ipv6Hdr>(data, data_end, inner.off) else {
            return Continue(()); // not reached: inner::check read it
        };
        // SAFETY: bounds-checked; this program owns the frame. The ECN bits are the low two
        // bits of the traffic class, bits 5-4 of the header's second byte.
        unsafe { (*ip).vcf[1] |= CE << 4 };
    }
    host.count(ECN_CE);
    Continue(())
}
