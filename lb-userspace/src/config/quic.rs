//! A UDP service's `quic = { server_id_bytes = N, ... }`: where its backends' QUIC servers put
//! their server ID in the connection IDs they issue, after the QUIC-LB draft's plaintext
//! algorithm (draft-ietf-quic-load-balancers: the first octet's three config rotation bits,
//! then the server ID). The datapath reads it from a short header's destination connection ID
//! and sends the packet to the backend whose `server_id` it is, whatever the packet's 4-tuple.

use super::fields::Fields;

/// `quic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quic {
    /// The server ID's length in bytes (the draft's "server ID length").
    pub server_id_bytes: u8,
    /// Where the server ID starts in the connection ID: 1, right after the first octet, in the
    /// draft's layout.
    pub cid_offset: u8,
    /// The config rotation bits (the first octet's top three) of the connection IDs lb routes;
    /// others go by the connection table and Maglev. None: any but 0b111 ("unroutable").
    pub config_id: Option<u8>,
}

impl Quic {
    /// The datapath's word for this layout.
    pub fn word(&self) -> u32 {
        lb_common::quic_layout_word(self.server_id_bytes, self.cid_offset, self.config_id)
    }

    /// The largest server ID of this length.
    pub fn max_server_id(&self) -> u64 {
        u64::MAX >> (64 - 8 * u32::from(self.server_id_bytes))
    }
}

/// The longest connection ID (RFC 9000): the server ID ends within it.
const MAX_CID: i64 = lb_common::QUIC_MAX_CID as i64;

/// `quic` of a service.
pub(super) fn read(f: &Fields) -> Option<Quic> {
    let bytes = f.required("server_id_bytes", |f| f.int_in("server_id_bytes", 1..=8, 2));
    let offset = f.int_in("cid_offset", 1..=MAX_CID - 1, 1);
    let config = match f.value("config_id") {
        None => Some(None),
        Some(_) => f.int_in("config_id", 0..=6, 0).map(|c| Some(c as u8)),
    };
    f.finish();
    let (bytes, offset, config_id) = (bytes?, offset?, config?);
    if offset + bytes > MAX_CID {
        f.problem(
            "cid_offset",
            format!(
                "the server ID ({bytes} bytes from byte {offset}) must end within a connection \
                 ID ({MAX_CID} bytes at most)"
            ),
        );
        return None;
    }
    Some(Quic {
        server_id_bytes: bytes as u8,
        cid_offset: offset as u8,
        config_id,
    })
}
