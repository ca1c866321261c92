//! The backend's decapsulator for direct server return (`lb decap`): an object of its own, so a
//! backend loads none of the balancer's tables. This file declares its maps (names and types
//! from lb-common) and the entry point; the logic is the library's (`lb_ebpf::decap`).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod prog {
    use aya_ebpf::{
        macros::{map, xdp},
        maps::{Array, HashMap, PerCpuArray},
        programs::XdpContext,
    };
    use lb_common::{Addr6, DECAP_MAX_ADDRS, DecapParams, decap_counter};
    use lb_ebpf::decap::{self, Host};

    /// The parameters (one entry), written by every `lb decap`.
    #[map(name = "LB_DECAP_PARAMS")]
    static PARAMS: Array<DecapParams> = Array::with_max_entries(1, 0);

    /// This host's IPv4 addresses, network byte order (strict destination).
    #[map(name = "LB_DECAP_ADDRS")]
    static ADDRS: HashMap<u32, u32> = HashMap::with_max_entries(DECAP_MAX_ADDRS, 0);

    /// This host's IPv6 addresses.
    #[map(name = "LB_DECAP_ADDRS6")]
    static ADDRS6: HashMap<Addr6, u32> = HashMap::with_max_entries(DECAP_MAX_ADDRS, 0);

    /// Per-CPU counters indexed by `decap_counter`.
    #[map(name = "LB_DECAP_STATS")]
    static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(decap_counter::COUNT, 0);

    struct Maps;

    impl Host for Maps {
        #[inline(always)]
        fn params(&self) -> DecapParams {
            PARAMS.get(0).copied().unwrap_or_default()
        }

        #[inline(always)]
        fn is_local4(&self, addr: u32) -> bool {
            // SAFETY: the value is only tested for presence, never kept.
            unsafe { ADDRS.get(&addr) }.is_some()
        }

        #[inline(always)]
        fn is_local6(&self, addr: &Addr6) -> bool {
            // SAFETY: as above.
            unsafe { ADDRS6.get(addr) }.is_some()
        }

        #[inline(always)]
        fn count(&self, counter: u32) {
            if let Some(c) = STATS.get_ptr_mut(counter) {
                // SAFETY: this CPU's slot; only this CPU writes it while the program runs.
                unsafe { *c += 1 };
            }
        }
    }

    /// The decapsulator. Every frame ends in exactly one verdict counter.
    #[xdp]
    pub fn lb_decap(ctx: XdpContext) -> u32 {
        let (action, counter) = decap::handle(&ctx, &Maps);
        Maps.count(counter);
        action
    }

    #[cfg(not(test))]
    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 4] = *b"GPL\0";
}

/// Host builds (`cargo clippy --workspace`) only type-check the library.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
