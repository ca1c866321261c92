//! The one definition of everything the XDP program and userspace share: map names and sizes,
//! map key/value layouts, flag bits and counter indices. Nothing here is re-declared elsewhere.
//!
//! Layout rules for map types: `#[repr(C)]`, explicit padding fields, only integers and byte
//! arrays (no `bool`, enum or `Option`), so the bytes the kernel stores are fully defined on both
//! sides. Addresses and ports are kept in network byte order, as in the packet.
//!
//! One module per concern, each item re-exported here: both sides name `lb_common::Item`, never
//! the module, so moving an item between modules changes no user.
#![no_std]

mod addrs;
mod counters;
mod decap;
mod encap;
mod flow;
mod maps;
mod params;
mod quic;
mod services;
mod signals;
mod synproxy;
mod tables;
mod trace;
mod tunnel;

pub use addrs::*;
pub use counters::*;
pub use decap::*;
pub use encap::*;
pub use flow::*;
pub use maps::*;
pub use params::*;
pub use quic::*;
pub use services::*;
pub use signals::*;
pub use synproxy::*;
pub use tables::*;
pub use trace::*;
pub use tunnel::*;
