//! Draining the datapath's passive health signals: the `LB_SIGNALS` ring buffer of
//! [`PassiveSignal`] records (why a ring buffer: lb-ebpf/src/passive.rs).

use std::{
    borrow::Borrow,
    os::fd::{AsRawFd, RawFd},
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use lb_common::{PassiveSignal, SIGNALS_RING_BYTES, map_name};
use tracing::warn;

use super::Dataplane;

/// Records taken per call at most: more than the ring holds (a record takes at least 8 bytes),
/// so one call empties it, yet a datapath writing as fast as it is read cannot keep the caller
/// in the loop.
pub const MAX_PER_TAKE: usize = SIGNALS_RING_BYTES as usize / 8;

/// The ring buffer of passive signals taken out of the datapath ([`Dataplane::signal_ring`]):
/// its reader waits on its descriptor (readable when records came) and drains it without any
/// lock on the rest of the datapath.
pub struct SignalRing(RingBuf<MapData>);

impl SignalRing {
    /// Takes the signals written since the last call (see [`Dataplane::take_signals`]).
    pub fn take(&mut self) -> Vec<PassiveSignal> {
        drain(&mut self.0)
    }
}

impl AsRawFd for SignalRing {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

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
        Ok(drain(&mut ring))
    }

    /// Moves the signal ring buffer out of the datapath, for a reader of its own (once: after
    /// it, [`Dataplane::take_signals`] fails). Pinned, it stays pinned.
    pub fn signal_ring(&mut self) -> anyhow::Result<SignalRing> {
        let map = self
            .ebpf
            .take_map(map_name::SIGNALS)
            .with_context(|| format!("map {} missing (taken already?)", map_name::SIGNALS))?;
        let ring = RingBuf::try_from(map).context("opening the signal ring buffer")?;
        Ok(SignalRing(ring))
    }
}

/// Takes what the ring holds, at most [`MAX_PER_TAKE`] records.
fn drain<T: Borrow<MapData>>(ring: &mut RingBuf<T>) -> Vec<PassiveSignal> {
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
    signals
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
