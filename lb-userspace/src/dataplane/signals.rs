//! Draining the datapath's passive health signals: the `LB_SIGNALS` ring buffer of
//! [`PassiveSignal`] records (why a ring buffer: lb-ebpf/src/passive.rs).

use anyhow::Context as _;
use aya::maps::RingBuf;
use lb_common::{PassiveSignal, SIGNALS_RING_BYTES, map_name};
use tracing::warn;

use super::Dataplane;

/// Records taken per call at most: more than the ring holds (a record takes at least 8 bytes),
/// so one call empties it, yet a datapath writing as fast as it is read cannot keep the caller
/// in the loop.
const MAX_PER_TAKE: usize = SIGNALS_RING_BYTES as usize / 8;

impl Dataplane {
    /// Takes the passive health signals the datapath wrote since the last call (their order
    /// carries no meaning). Signals that found the ring buffer full were counted in the
    /// `signal_lost` counter instead; call this often enough that it stays at 0 (the ring holds
    /// 2730 signals).
    ///
    /// When the datapath is pinned the ring buffer is one of its maps, so signals written while
    /// no daemon ran are there for the next one that adopts it.
    pub fn take_signals(&mut self) -> anyhow::Result<Vec<PassiveSignal>> {
        let map = self
            .ebpf
            .map_mut(map_name::SIGNALS)
            .with_context(|| format!("map {} missing", map_name::SIGNALS))?;
        let mut ring = RingBuf::try_from(map).context("opening the signal ring buffer")?;
        let mut signals = Vec::new();
        let mut malformed = 0usize;
        while signals.len() + malformed < MAX_PER_TAKE {
            let Some(item) = ring.next() else { break };
            match decode(&item) {
                Some(s) => signals.push(s),
                None => malformed += 1,
            }
        }
        if malformed > 0 {
            warn!(
                malformed,
                "signal records of an unexpected size (an XDP object of another lb version?): skipped"
            );
        }
        Ok(signals)
    }
}

/// A record as the datapath wrote it (native byte order, `#[repr(C)]` u32 fields).
fn decode(bytes: &[u8]) -> Option<PassiveSignal> {
    let b: &[u8; size_of::<PassiveSignal>()] = bytes.try_into().ok()?;
    let field = |i: usize| u32::from_ne_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    Some(PassiveSignal {
        backend_id: field(0),
        service_id: field(1),
        kind: field(2),
        detail: field(3),
    })
}

#[cfg(test)]
mod tests {
    use lb_common::signal_kind;

    use super::*;

    #[test]
    fn decodes_a_record_in_field_order() {
        let mut bytes = Vec::new();
        for v in [7u32, 2, signal_kind::UNREACHABLE, 3] {
            bytes.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(
            decode(&bytes),
            Some(PassiveSignal {
                backend_id: 7,
                service_id: 2,
                kind: signal_kind::UNREACHABLE,
                detail: 3,
            })
        );
        assert_eq!(decode(&bytes[..12]), None);
        bytes.push(0);
        assert_eq!(decode(&bytes), None);
    }
}
