//! What differs between IPv4 and IPv6, behind one trait: the maps that hold a family's
//! addresses, services, backends and flows, its IP header's rewrite, and its route lookup. The
//! flow logic (flow.rs, table.rs, snat.rs) is written once over [`Family`]; each family's code
//! is its own monomorphised copy, so IPv4 packets run exactly the IPv4 code.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{
    bindings::bpf_fib_lookup as FibParams,
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
};
use lb_common::{
    ADDR_WAYS, Addr6, AddrSetOf, BackendInfoOf, CtSlotOf, FlowAddr, NatSlotOf, Params, ProxyFast,
    ProxyFlow, ServiceInfo, ServiceKeyOf, addr_set,
};
use network_types::{ip::Ipv4Hdr, ip::Ipv6Hdr};

use crate::{
    csum::{diff16, diff32, update},
    maps::{
        ADDRS, ADDRS6, BACKENDS, BACKENDS6, CONNTRACK, CONNTRACK6, NAT, NAT6, PROXY, PROXY_FAST,
        PROXY_FAST6, PROXY6, SEARCH, SEARCH6, SERVICES, SERVICES6, SnatSearch,
    },
    outer,
    ptr::{ptr_at_mut, store_addr6},
};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

pub trait Family {
    type A: FlowAddr;
    /// Its IP header's length (without options or extension headers).
    const HDR_LEN: u32;
    /// The outer header's protocol of `ipip` for this family.
    const ENCAP_PROTO: u8;
    /// The SYN proxy's program of this family (slot of `LB_PROXY_PROGS`), and the MSS it
    /// announces to clients (an Ethernet MTU's).
    const PROXY_SLOT: u32;
    const PROXY_MSS: u16;
    /// The proxied flows' translations.
    fn proxies() -> &'static LruHashMap<lb_common::FlowKeyOf<Self::A>, ProxyFlow>;
    /// The open proxied flows' offsets where the balancer reads them (lb_common's `ProxyFast`).
    fn proxy_fast() -> &'static Array<ProxyFast>;
    fn addrs() -> &'static Array<AddrSetOf<Self::A>>;
    fn services() -> &'static HashMap<ServiceKeyOf<Self::A>, ServiceInfo>;
    fn backends() -> &'static Array<BackendInfoOf<Self::A>>;
    fn conntrack() -> &'static Array<CtSlotOf<Self::A>>;
    fn nat() -> &'static Array<NatSlotOf<Self::A>>;
    fn search() -> &'static PerCpuArray<SnatSearch<Self::A>>;
    /// The connection table's and the NAT table's size - 1.
    fn table_mask(p: &Params) -> u32;
    fn nat_mask(p: &Params) -> u32;
    /// The checksum change of an address from `old` to `new` (see [`crate::csum`]).
    fn addr_diff(old: &Self::A, new: &Self::A) -> u32;
    /// The unfolded checksum sum of two addresses' 16-bit words.
    fn addr_sum(a: &Self::A, b: &Self::A) -> u32;
    /// Rewrites the IP header at `l3_off` to `src → dst` and lowers its TTL / hop limit by one
    /// (callers drop 0 and 1 first); `addrs` is the addresses' checksum change (IPv4's header
    /// checksum covers them). `None` if the header is out of bounds.
    fn rewrite_ip(
        data: usize,
        data_end: usize,
        l3_off: usize,
        new: (&Self::A, &Self::A),
        addrs: u32,
    ) -> Option<()>;
    /// The frame parsed as this family's (`None`: a frame of the other family, or none).
    fn parse(data: usize, data_end: usize) -> Option<crate::parse::Parsed<Self::A>>;
    /// Sets the IP header at `l3_off`'s length to `len` bytes from its start (the datagram's).
    fn set_ip_len(data: usize, data_end: usize, l3_off: usize, len: usize) -> Option<()>;
    /// Fills a route lookup's family and addresses.
    fn fib_addrs(p: &mut FibParams, src: Self::A, dst: Self::A);
    /// Writes the outer header of direct server return at `offs.0` for the packet at `offs.1`
    /// (see [`crate::encap`]); the inner packet's length, `None` if out of bounds.
    fn write_outer(
        data: usize,
        data_end: usize,
        offs: (usize, usize),
        addrs: (&Self::A, &Self::A, u32),
        proto: u8,
        hash: u64,
    ) -> Option<u16>;
    /// GUE's UDP checksum for the inner packet at `inner_off` from the outer addresses' sum
    /// `addr_sum`, with the UDP header's fields as written (network order), or `None` to leave
    /// it 0.
    fn gue_checksum(
        data: usize,
        data_end: usize,
        inner_off: usize,
        addr_sum: u32,
        sport: u16,
        dport: u16,
        udp_len: u16,
    ) -> Option<u16>;
}

/// The [`lb_common::addr_flags`] of `addr` (network byte order); 0 when it is not one of lb's.
/// An array lookup the verifier inlines (see [`lb_common::AddrSet`]), no helper call.
#[inline(always)]
pub fn lookup_addr<F: Family>(addr: F::A) -> u32 {
    let Some(set) = F::addrs().get_ptr(addr_set(addr)) else {
        return 0;
    };
    // SAFETY: an array map value of plain integers. A free slot (address 0, flags 0) only
    // matches the all-zero address, which is never lb's: its flags 0 say so.
    let set = unsafe { &*set };
    for i in 0..ADDR_WAYS {
        if set.addrs[i] == addr {
            return set.flags[i];
        }
    }
    0
}

pub struct V4;
pub struct V6;

impl Family for V4 {
    type A = u32;
    const HDR_LEN: u32 = lb_common::IPV4_HDR_LEN;
    const ENCAP_PROTO: u8 = lb_common::PROTO_IPIP;
    const PROXY_SLOT: u32 = lb_common::PROXY_PROG;
    const PROXY_MSS: u16 = 1460;
    #[inline(always)]
    fn proxies() -> &'static LruHashMap<lb_common::FlowKey, ProxyFlow> {
        &PROXY
    }
    #[inline(always)]
    fn proxy_fast() -> &'static Array<ProxyFast> {
        &PROXY_FAST
    }
    #[inline(always)]
    fn addr_sum(a: &u32, b: &u32) -> u32 {
        (a & 0xffff) + (a >> 16) + (b & 0xffff) + (b >> 16)
    }
    #[inline(always)]
    fn addr_diff(old: &u32, new: &u32) -> u32 {
        diff32(*old, *new)
    }
    #[inline(always)]
    fn addrs() -> &'static Array<AddrSetOf<u32>> {
        &ADDRS
    }
    #[inline(always)]
    fn services() -> &'static HashMap<ServiceKeyOf<u32>, ServiceInfo> {
        &SERVICES
    }
    #[inline(always)]
    fn backends() -> &'static Array<BackendInfoOf<u32>> {
        &BACKENDS
    }
    #[inline(always)]
    fn conntrack() -> &'static Array<CtSlotOf<u32>> {
        &CONNTRACK
    }
    #[inline(always)]
    fn nat() -> &'static Array<NatSlotOf<u32>> {
        &NAT
    }
    #[inline(always)]
    fn search() -> &'static PerCpuArray<SnatSearch<u32>> {
        &SEARCH
    }
    #[inline(always)]
    fn table_mask(p: &Params) -> u32 {
        p.table_mask
    }
    #[inline(always)]
    fn nat_mask(p: &Params) -> u32 {
        p.nat_mask
    }
    #[inline(always)]
    fn rewrite_ip(
        data: usize,
        data_end: usize,
        l3_off: usize,
        new: (&u32, &u32),
        addrs: u32,
    ) -> Option<()> {
        let ip = ptr_at_mut::<Ipv4Hdr>(data, data_end, l3_off)?;
        // SAFETY: bounds-checked; network-types headers are byte arrays.
        unsafe {
            let old_ttl_word = u16::from_ne_bytes([(*ip).ttl, (*ip).proto]);
            (*ip).ttl -= 1;
            let new_ttl_word = u16::from_ne_bytes([(*ip).ttl, (*ip).proto]);
            let check = u16::from_ne_bytes((*ip).check);
            let check = update(check, addrs + diff16(old_ttl_word, new_ttl_word));
            (*ip).check = check.to_ne_bytes();
            (*ip).src_addr = new.0.to_ne_bytes();
            (*ip).dst_addr = new.1.to_ne_bytes();
        }
        Some(())
    }
    #[inline(always)]
    fn parse(data: usize, data_end: usize) -> Option<crate::parse::Parsed<u32>> {
        match crate::parse::link(data, data_end, false)? {
            (crate::parse::ETH_P_IP, l3_off) => Some(crate::parse::ipv4(data, data_end, l3_off)),
            _ => None,
        }
    }
    #[inline(always)]
    fn set_ip_len(data: usize, data_end: usize, l3_off: usize, len: usize) -> Option<()> {
        let ip = ptr_at_mut::<Ipv4Hdr>(data, data_end, l3_off)?;
        let new = (len as u16).to_be_bytes();
        // SAFETY: bounds-checked; network-types headers are byte arrays.
        unsafe {
            let old = u16::from_ne_bytes((*ip).tot_len);
            let check = update(
                u16::from_ne_bytes((*ip).check),
                diff16(old, u16::from_ne_bytes(new)),
            );
            (*ip).check = check.to_ne_bytes();
            (*ip).tot_len = new;
        }
        Some(())
    }
    #[inline(always)]
    fn fib_addrs(p: &mut FibParams, src: u32, dst: u32) {
        p.family = AF_INET;
        p.__bindgen_anon_3.ipv4_src = src;
        p.__bindgen_anon_4.ipv4_dst = dst;
    }
    #[inline(always)]
    fn write_outer(
        data: usize,
        data_end: usize,
        offs: (usize, usize),
        addrs: (&u32, &u32, u32),
        proto: u8,
        _hash: u64,
    ) -> Option<u16> {
        outer::outer_v4(data, data_end, offs, addrs, proto)
    }
    /// IPv4's UDP checksum may be 0 (none), which spares reading anything.
    #[inline(always)]
    fn gue_checksum(
        _data: usize,
        _data_end: usize,
        _inner_off: usize,
        _addr_sum: u32,
        _sport: u16,
        _dport: u16,
        _udp_len: u16,
    ) -> Option<u16> {
        None
    }
}

/// The checksum change of an IPv6 address: its eight 16-bit words.
#[inline(always)]
pub fn diff128(old: Addr6, new: Addr6) -> u32 {
    diff32(old[0], new[0])
        + diff32(old[1], new[1])
        + diff32(old[2], new[2])
        + diff32(old[3], new[3])
}

impl Family for V6 {
    type A = Addr6;
    const HDR_LEN: u32 = lb_common::IPV6_HDR_LEN;
    const ENCAP_PROTO: u8 = lb_common::PROTO_IPV6_IN_IP;
    const PROXY_SLOT: u32 = lb_common::PROXY6_PROG;
    const PROXY_MSS: u16 = 1440;
    #[inline(always)]
    fn proxies() -> &'static LruHashMap<lb_common::FlowKey6, ProxyFlow> {
        &PROXY6
    }
    #[inline(always)]
    fn proxy_fast() -> &'static Array<ProxyFast> {
        &PROXY_FAST6
    }
    #[inline(always)]
    fn addr_sum(a: &Addr6, b: &Addr6) -> u32 {
        let w = |v: u32| (v & 0xffff) + (v >> 16);
        w(a[0]) + w(a[1]) + w(a[2]) + w(a[3]) + w(b[0]) + w(b[1]) + w(b[2]) + w(b[3])
    }
    #[inline(always)]
    fn addr_diff(old: &Addr6, new: &Addr6) -> u32 {
        diff128(*old, *new)
    }
    #[inline(always)]
    fn addrs() -> &'static Array<AddrSetOf<Addr6>> {
        &ADDRS6
    }
    #[inline(always)]
    fn services() -> &'static HashMap<ServiceKeyOf<Addr6>, ServiceInfo> {
        &SERVICES6
    }
    #[inline(always)]
    fn backends() -> &'static Array<BackendInfoOf<Addr6>> {
        &BACKENDS6
    }
    #[inline(always)]
    fn conntrack() -> &'static Array<CtSlotOf<Addr6>> {
        &CONNTRACK6
    }
    #[inline(always)]
    fn nat() -> &'static Array<NatSlotOf<Addr6>> {
        &NAT6
    }
    #[inline(always)]
    fn search() -> &'static PerCpuArray<SnatSearch<Addr6>> {
        &SEARCH6
    }
    #[inline(always)]
    fn table_mask(p: &Params) -> u32 {
        p.table6_mask
    }
    #[inline(always)]
    fn nat_mask(p: &Params) -> u32 {
        p.nat6_mask
    }
    /// IPv6 has no header checksum: the addresses and the hop limit are written as they are.
    #[inline(always)]
    fn rewrite_ip(
        data: usize,
        data_end: usize,
        l3_off: usize,
        new: (&Addr6, &Addr6),
        _addrs: u32,
    ) -> Option<()> {
        let ip = ptr_at_mut::<Ipv6Hdr>(data, data_end, l3_off)?;
        // SAFETY: bounds-checked; the addresses are 2-aligned (see `store_addr6`).
        unsafe {
            (*ip).hop_limit -= 1;
            store_addr6((*ip).src_addr.as_mut_ptr(), new.0);
            store_addr6((*ip).dst_addr.as_mut_ptr(), new.1);
        }
        Some(())
    }
    #[inline(always)]
    fn parse(data: usize, data_end: usize) -> Option<crate::parse::Parsed<Addr6>> {
        match crate::parse::link(data, data_end, false)? {
            (crate::parse::ETH_P_IPV6, l3_off) => Some(crate::parse::ipv6(data, data_end, l3_off)),
            _ => None,
        }
    }
    #[inline(always)]
    fn set_ip_len(data: usize, data_end: usize, l3_off: usize, len: usize) -> Option<()> {
        let ip = ptr_at_mut::<Ipv6Hdr>(data, data_end, l3_off)?;
        // SAFETY: bounds-checked; network-types headers are byte arrays.
        unsafe { (*ip).payload_len = (len.checked_sub(Ipv6Hdr::LEN)? as u16).to_be_bytes() };
        Some(())
    }
    #[inline(always)]
    fn fib_addrs(p: &mut FibParams, src: Addr6, dst: Addr6) {
        p.family = AF_INET6;
        p.__bindgen_anon_3.ipv6_src = src;
        p.__bindgen_anon_4.ipv6_dst = dst;
    }
    #[inline(always)]
    fn write_outer(
        data: usize,
        data_end: usize,
        offs: (usize, usize),
        addrs: (&Addr6, &Addr6, u32),
        proto: u8,
        hash: u64,
    ) -> Option<u16> {
        outer::outer_v6(
            data,
            data_end,
            offs.0,
            offs.1,
            (addrs.0, addrs.1),
            proto,
            hash,
        )
    }
    #[inline(always)]
    fn gue_checksum(
        data: usize,
        data_end: usize,
        inner_off: usize,
        addr_sum: u32,
        sport: u16,
        dport: u16,
        udp_len: u16,
    ) -> Option<u16> {
        outer::gue_checksum_v6(data, data_end, inner_off, addr_sum, sport, dport, udp_len)
    }
}
