//! Empty on purpose: a library target lets lb-userspace declare lb-ebpf as a build-dependency, so
//! cargo rebuilds the XDP object when this crate changes. The program is the `lb-xdp` binary.
#![no_std]
