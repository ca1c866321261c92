//! The probe kinds. Each takes a target and a timeout and returns a [`ProbeResult`]; the window
//! state machine and the scheduler do the rest.

pub mod http;
pub mod icmp;
pub mod tcp_connect;
pub mod tcp_syn;
pub mod udp;

mod link;
mod sys;

pub use super::window::ProbeResult;
