//! QUIC routing by server ID (a UDP service's `quic`): where the server ID sits in a connection
//! ID (the layout word of [`map_name::QUIC_LAYOUTS`](crate::map_name::QUIC_LAYOUTS)), and the
//! maps from server IDs to backends and back.

/// The longest QUIC connection ID (RFC 9000 §17.2): where a server ID may end.
pub const QUIC_MAX_CID: u32 = 20;

/// Bits 0-3 of a layout word: the server ID's length in bytes (1-8); 0: not a QUIC service.
const ID_BYTES_MASK: u32 = 0xf;
/// Bits 8-12: where the server ID starts in the connection ID (1-19).
const OFFSET_SHIFT: u32 = 8;
/// Bits 16-18: the config rotation bits connection IDs must carry, if ...
const CONFIG_SHIFT: u32 = 16;
/// ... this bit is set; otherwise any but 0b111 ("unroutable").
const CONFIG_CHECKED: u32 = 1 << 20;

/// The config rotation bits QUIC-LB reserves for connection IDs no load balancer routes.
pub const QUIC_UNROUTABLE: u32 = 7;

/// The layout word of a QUIC service: `id_bytes` (1-8) from byte `offset` (1-19) of the
/// connection ID, whose first byte's top three bits are `config` if given.
pub const fn quic_layout_word(id_bytes: u8, offset: u8, config: Option<u8>) -> u32 {
    let checked = match config {
        Some(c) => ((c as u32 & 7) << CONFIG_SHIFT) | CONFIG_CHECKED,
        None => 0,
    };
    (id_bytes as u32 & ID_BYTES_MASK) | ((offset as u32 & 0x1f) << OFFSET_SHIFT) | checked
}

/// A layout word's parts: (server ID bytes, 0 for no QUIC; offset; config bits if checked).
#[inline(always)]
pub const fn quic_layout(word: u32) -> (u32, u32, Option<u32>) {
    let config = if word & CONFIG_CHECKED != 0 {
        Some((word >> CONFIG_SHIFT) & 7)
    } else {
        None
    };
    (word & ID_BYTES_MASK, (word >> OFFSET_SHIFT) & 0x1f, config)
}

/// Key of [`map_name::QUIC_SERVERS`](crate::map_name::QUIC_SERVERS): a service's server ID
/// (the connection ID's bytes, big-endian) → the id of the backend it names.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuicServerKey {
    pub service_id: u32,
    pub _pad: u32,
    pub server_id: u64,
}

/// Value of [`map_name::QUIC_IDS`](crate::map_name::QUIC_IDS), indexed by backend id: the
/// backend's own server ID, so a packet on its flow is checked without a hash lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuicServerId {
    pub server_id: u64,
    /// 1: the backend has a server ID.
    pub set: u32,
    pub _pad: u32,
}

const _: () = {
    assert!(core::mem::size_of::<QuicServerKey>() == 16);
    assert!(core::mem::size_of::<QuicServerId>() == 16);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers with explicit padding, valid for any bit pattern.
    unsafe impl aya::Pod for super::QuicServerKey {}
    unsafe impl aya::Pod for super::QuicServerId {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_words_round_trip() {
        for (n, off, config) in [
            (1, 1, None),
            (8, 12, Some(0)),
            (2, 19, Some(6)),
            (4, 1, Some(7)),
        ] {
            let word = quic_layout_word(n, off, config);
            let want = (u32::from(n), u32::from(off), config.map(u32::from));
            assert_eq!(quic_layout(word), want);
        }
        assert_eq!(quic_layout(0).0, 0, "no layout: not QUIC");
    }
}
