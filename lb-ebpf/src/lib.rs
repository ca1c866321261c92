//! What the XDP programs share: bounds-checked packet access ([`ptr`]), used by the balancer
//! (`lb-xdp`, src/main.rs) and the backend's decapsulator (`lb-decap`, src/bin/lb-decap.rs), and
//! the decapsulator's logic ([`decap`]). Nothing here declares a map: each program's object holds
//! only the maps its binary declares. Being a library also lets lb-userspace declare lb-ebpf as
//! a build-dependency, so cargo rebuilds the XDP objects when this crate changes.
#![no_std]

pub mod decap;
pub mod ptr;
