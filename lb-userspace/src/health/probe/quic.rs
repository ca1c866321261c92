//! QUIC probes (`kind = "quic"`): the first datagram a client would send, a long header padded
//! to 1200 bytes (RFC 9000 §14.1), but of a version reserved to exercise version negotiation
//! (0x?a?a?a?a, §15). A QUIC server answers it with a Version Negotiation packet (§6.1): the
//! long-header bit, version 0, and our connection IDs swapped, which is the success. Nothing
//! of a connection is started on the server: it keeps no state for such a packet. An ICMP port
//! unreachable is a `TcpFailure` and silence a `Timeout`, as for a UDP check with a payload.

use std::sync::LazyLock;

use crate::config::Expect;

/// A reserved version (RFC 9000 §15: 0x?a?a?a?a are never supported).
const VERSION: [u8; 4] = [0x1a, 0x2a, 0x3a, 0x4a];
/// Our destination connection ID (any 8 bytes) and our source connection ID, which the
/// server's answer carries as its destination.
const DCID: [u8; 8] = *b"lb-check";
const SCID: [u8; 8] = *b"lb-probe";
/// The size of a client's first datagram, below which servers may ignore it.
const SIZE: usize = 1200;

/// The datagram sent.
pub static DATAGRAM: LazyLock<Vec<u8>> = LazyLock::new(|| {
    // Long header, fixed bit, Initial's type bits.
    let mut d = vec![0xc0];
    d.extend_from_slice(&VERSION);
    d.push(DCID.len() as u8);
    d.extend_from_slice(&DCID);
    d.push(SCID.len() as u8);
    d.extend_from_slice(&SCID);
    d.resize(SIZE, 0);
    d
});

/// The answer wanted: a long header (its other bits are the server's choice) of version 0 to
/// our source connection ID.
pub static EXPECT: LazyLock<Expect> = LazyLock::new(|| {
    let mut bytes = vec![0x80, 0, 0, 0, 0, SCID.len() as u8];
    bytes.extend_from_slice(&SCID);
    let mut mask = vec![0x80, 0xff, 0xff, 0xff, 0xff, 0xff];
    mask.extend_from_slice(&[0xff; 8]);
    Expect {
        bytes,
        offset: 0,
        mask: Some(mask),
    }
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_negotiation_answer_matches_and_others_do_not() {
        assert_eq!(DATAGRAM.len(), 1200);
        assert_eq!(DATAGRAM[0] & 0x80, 0x80, "a long header");
        let mut vn = vec![0xd7, 0, 0, 0, 0, 8];
        vn.extend_from_slice(&SCID);
        vn.push(8);
        vn.extend_from_slice(&DCID);
        vn.extend_from_slice(&[0, 0, 0, 1]);
        assert!(EXPECT.matches(&vn));
        let mut other_cid = vn.clone();
        other_cid[6] ^= 1;
        assert!(!EXPECT.matches(&other_cid), "not an answer to this probe");
        let mut initial = vn.clone();
        initial[1..5].copy_from_slice(&[0, 0, 0, 1]);
        assert!(!EXPECT.matches(&initial), "version 1, not a negotiation");
        let mut short = vn;
        short[0] = 0x40;
        assert!(!EXPECT.matches(&short), "a short header");
    }
}
