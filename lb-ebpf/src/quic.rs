//! QUIC routing by server ID (a UDP service's `quic`; see lb_common's quic.rs). A QUIC
//! short-header packet's destination connection ID follows its first byte, and the backends'
//! servers write their server ID into the connection IDs they issue: the packet goes to the
//! backend it names, whatever its 4-tuple, so a connection survives its client's new address
//! or port. Only UDP packets to a VIP flagged QUIC are read here; long headers (the handshake)
//! and connection IDs naming no available backend go by the connection table and Maglev.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::programs::XdpContext;
use lb_common::{
    BackendInfoOf, QUIC_UNROUTABLE, ServiceInfo, backend_flags, counter, quic_layout, service_flags,
};

use crate::{
    family::Family,
    maps::{QUIC_IDS, QUIC_KEY, QUIC_LAYOUTS, QUIC_SERVERS},
    parse::Flow,
    ptr::read_at,
    stats, trace,
};

const UDP_HEADER: usize = 8;
/// The header form bit of a QUIC packet's first byte: set for long headers.
const LONG_HEADER: u8 = 0x80;

/// What a packet's connection ID says.
enum Cid {
    /// Not a short header of a QUIC service: nothing to route by.
    NotShort,
    /// A short header lb cannot route by: too short to hold the server ID, or another config
    /// rotation (0b111: unroutable by design).
    Unroutable,
    Server(u64),
}

/// The server ID in the connection ID of `flow`'s packet, by service `service_id`'s layout.
#[inline(always)]
fn read<A>(ctx: &XdpContext, flow: &Flow<A>, service_id: u32) -> Cid {
    let Some(&word) = QUIC_LAYOUTS.get(service_id) else {
        return Cid::NotShort;
    };
    let (bytes, offset, config) = quic_layout(word);
    if bytes == 0 {
        return Cid::NotShort;
    }
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let payload = flow.l4_off + UDP_HEADER;
    // The first byte and the connection ID's first (its config rotation bits).
    let Some([first, cid0]) = read_at::<[u8; 2]>(data, data_end, payload) else {
        return Cid::NotShort;
    };
    if first & LONG_HEADER != 0 {
        return Cid::NotShort;
    }
    let rotation = u32::from(cid0 >> 5);
    if rotation == QUIC_UNROUTABLE || config.is_some_and(|c| c != rotation) {
        return Cid::Unroutable;
    }
    // Eight bytes from the server ID's start, whatever its length: one bounds check. A QUIC
    // packet has them (at least 20 bytes follow its connection ID: RFC 9001 §5.4.2).
    let Some(raw) = read_at::<[u8; 8]>(data, data_end, payload + 1 + offset as usize) else {
        return Cid::Unroutable;
    };
    Cid::Server(u64::from_be_bytes(raw) >> (64 - 8 * bytes))
}

/// The backend of service `service_id` whose server ID is `server_id`, if it may take the
/// packet: available, or any under `USE_UNAVAILABLE` (`service_flags`). Counts why not.
#[inline(always)]
fn backend<F: Family>(
    service_id: u32,
    service_flags: u32,
    server_id: u64,
) -> Option<(u32, &'static BackendInfoOf<F::A>)> {
    let k = QUIC_KEY.get_ptr_mut(0)?;
    // SAFETY: this CPU's value, plain integers; the packet runs to its end on this CPU. The
    // value found is a plain integer, only read.
    let found = unsafe {
        (*k).service_id = service_id;
        (*k).server_id = server_id;
        QUIC_SERVERS.get(&*k)
    };
    let Some(&id) = found else {
        stats::count(counter::QUIC_UNKNOWN_SERVER_ID);
        return None;
    };
    let b = F::backends().get(id)?;
    if b.flags & backend_flags::UP == 0 && service_flags & service_flags::USE_UNAVAILABLE == 0 {
        stats::count(counter::QUIC_FALLBACK);
        return None;
    }
    Some((id, b))
}

/// Whether the packet of a live flow to `backend_id` names another backend of its service that
/// may take it: then the flow moves there. Counts a packet routed where it is.
#[inline(always)]
pub fn names_other<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    service_id: u32,
    backend_id: u32,
) -> bool {
    let server_id = match read(ctx, flow, service_id) {
        Cid::NotShort => return false,
        Cid::Unroutable => {
            stats::count(counter::QUIC_FALLBACK);
            return false;
        }
        Cid::Server(id) => id,
    };
    // Its own server ID (nearly always): no hash lookup.
    if let Some(own) = QUIC_IDS.get(backend_id)
        && own.set != 0
        && own.server_id == server_id
    {
        stats::count(counter::QUIC_ROUTED);
        return false;
    }
    // Another backend's only if it may take the packet (the flags would allow the flow's own
    // backend; only the flow's id is known here): otherwise the flow stays where it is.
    backend::<F>(service_id, 0, server_id).is_some_and(|(id, _)| id != backend_id)
}

/// The backend a new flow's packet (or a live flow's that [`names_other`] moves) names in its
/// connection ID, if there is one that may take it.
#[inline(always)]
pub fn pick<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    svc: &ServiceInfo,
) -> Option<(u32, &'static BackendInfoOf<F::A>)> {
    let server_id = match read(ctx, flow, svc.id) {
        Cid::NotShort => return None,
        Cid::Unroutable => {
            stats::count(counter::QUIC_FALLBACK);
            return None;
        }
        Cid::Server(id) => id,
    };
    let found = backend::<F>(svc.id, svc.flags, server_id)?;
    stats::count(counter::QUIC_ROUTED);
    stats::count(counter::QUIC_LEARNED);
    if trace::on() {
        trace::quic_routed();
    }
    Some(found)
}
