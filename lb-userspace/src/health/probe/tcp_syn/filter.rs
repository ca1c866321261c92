//! The classic BPF programs that keep the host's ordinary TCP traffic away from the raw sockets:
//! one for the IPv4 socket, which sees packets from their IP header, and one for the IPv6
//! socket, which sees them from their TCP header.

use std::{io, os::fd::BorrowedFd};

use super::wire::{ACK, RST, SYN};
use crate::health::probe::sys::setsockopt;

/// The classic BPF program on the raw socket: it passes IPv4 TCP segments with RST set, or with
/// both SYN and ACK set, and drops everything else in the kernel. A raw socket hands the filter
/// the packet from its IP header; the TCP header starts `4 × IHL` bytes in. A load past the end
/// of a short packet ends the program with "drop".
///
/// ```text
///  0  ldb  [0]                 A = version/IHL byte
///  1  rsh  #4                  A = version
///  2  jeq  #4, 0, 8            not IPv4 -> 11
///  3  ldb  [9]                 A = protocol
///  4  jeq  #6, 0, 6            not TCP -> 11
///  5  ldxb 4*([0]&0xf)         X = IP header length
///  6  ldb  [x+13]              A = TCP flags
///  7  jset #0x04, 2, 0         RST -> 10
///  8  and  #0x12               A = SYN and ACK bits
///  9  jeq  #0x12, 0, 1         both -> 10, else -> 11
/// 10  ret  #0xffffffff         accept, whole packet
/// 11  ret  #0                  drop
/// ```
/// (The socket is AF_INET / IPPROTO_TCP, so the first checks always hold today; they keep the
/// program correct on its own and cost two instructions.)
fn reply_filter() -> [libc::sock_filter; 12] {
    use libc::{
        BPF_ABS, BPF_ALU, BPF_AND, BPF_B, BPF_IND, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD,
        BPF_LDX, BPF_MSH, BPF_RET, BPF_RSH,
    };
    let op = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let tcp = libc::IPPROTO_TCP as u32;
    let syn_ack = u32::from(SYN | ACK);
    [
        op(BPF_LD | BPF_B | BPF_ABS, 0),
        op(BPF_ALU | BPF_RSH | BPF_K, 4),
        jump(BPF_JMP | BPF_JEQ | BPF_K, 4, 0, 8),
        op(BPF_LD | BPF_B | BPF_ABS, 9),
        jump(BPF_JMP | BPF_JEQ | BPF_K, tcp, 0, 6),
        op(BPF_LDX | BPF_B | BPF_MSH, 0),
        op(BPF_LD | BPF_B | BPF_IND, 13),
        jump(BPF_JMP | BPF_JSET | BPF_K, u32::from(RST), 2, 0),
        op(BPF_ALU | BPF_AND | BPF_K, syn_ack),
        jump(BPF_JMP | BPF_JEQ | BPF_K, syn_ack, 0, 1),
        op(BPF_RET | BPF_K, u32::MAX),
        op(BPF_RET | BPF_K, 0),
    ]
}

/// The classic BPF program on the IPv6 raw socket: the same test as [`reply_filter`]'s, at
/// offset 13 of the data. An AF_INET6 raw socket is handed (and its filter sees) the packet from
/// the transport header on: the kernel has pulled the IPv6 header and any extension headers
/// before delivering it, so there is no header length to skip, and the addresses come with
/// `recvmsg` instead.
///
/// ```text
///  0  ldb  [13]                A = TCP flags
///  1  jset #0x04, 2, 0         RST -> 4
///  2  and  #0x12               A = SYN and ACK bits
///  3  jeq  #0x12, 0, 1         both -> 4, else -> 5
///  4  ret  #0xffffffff         accept, whole segment
///  5  ret  #0                  drop
/// ```
fn reply_filter6() -> [libc::sock_filter; 6] {
    use libc::{
        BPF_ABS, BPF_ALU, BPF_AND, BPF_B, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET,
    };
    let op = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let syn_ack = u32::from(SYN | ACK);
    [
        op(BPF_LD | BPF_B | BPF_ABS, 13),
        jump(BPF_JMP | BPF_JSET | BPF_K, u32::from(RST), 2, 0),
        op(BPF_ALU | BPF_AND | BPF_K, syn_ack),
        jump(BPF_JMP | BPF_JEQ | BPF_K, syn_ack, 0, 1),
        op(BPF_RET | BPF_K, u32::MAX),
        op(BPF_RET | BPF_K, 0),
    ]
}

/// Attaches [`reply_filter`] to `fd` (SO_ATTACH_FILTER; the kernel copies the program).
pub(super) fn attach_filter(fd: BorrowedFd<'_>) -> io::Result<()> {
    attach(fd, &mut reply_filter())
}

/// Attaches [`reply_filter6`] to `fd`, an IPv6 raw socket.
pub(super) fn attach_filter6(fd: BorrowedFd<'_>) -> io::Result<()> {
    attach(fd, &mut reply_filter6())
}

fn attach(fd: BorrowedFd<'_>, program: &mut [libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

#[cfg(test)]
mod tests {
    use std::os::{fd::AsFd as _, unix::net::UnixDatagram};

    use super::super::wire::sample::{reply, reply6};
    use super::*;

    /// A datagram socket pair whose receiving end has `attach` on it, and a test of whether a
    /// datagram passes it. An AF_UNIX datagram socket applies its socket filter to each
    /// datagram it receives, and the datagram's bytes start where a raw socket's packet does: so
    /// the filter runs in the kernel, without privileges.
    fn filtered(attach: fn(BorrowedFd<'_>) -> io::Result<()>) -> impl Fn(&[u8]) -> bool {
        let (tx, rx) = UnixDatagram::pair().unwrap();
        rx.set_nonblocking(true).unwrap();
        attach(rx.as_fd()).unwrap();
        move |packet: &[u8]| {
            tx.send(packet).unwrap();
            let mut buf = [0u8; 128];
            match rx.recv(&mut buf) {
                Ok(n) => {
                    assert_eq!(n, packet.len(), "accepted whole");
                    true
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
                Err(e) => panic!("{e}"),
            }
        }
    }

    const FIN: u8 = 0x01;
    const PSH: u8 = 0x08;

    #[test]
    fn filter_passes_only_syn_ack_and_rst() {
        let passes = filtered(attach_filter);
        for options in [0, 4, 40] {
            assert!(
                passes(&reply(SYN | ACK, 1, options)),
                "SYN+ACK, {options} option bytes"
            );
            assert!(passes(&reply(RST | ACK, 1, options)), "RST+ACK");
            assert!(passes(&reply(RST, 1, options)), "RST");
            assert!(!passes(&reply(SYN, 1, options)), "SYN");
            assert!(!passes(&reply(ACK, 1, options)), "ACK");
            assert!(!passes(&reply(PSH | ACK, 1, options)), "PSH+ACK");
            assert!(!passes(&reply(FIN | ACK, 1, options)), "FIN+ACK");
        }
        // The flags are read behind the IP options, not at a fixed offset: with 4 option bytes,
        // offset 33 (where flags sit without options) holds SYN+ACK but the real flags are ACK.
        let mut shifted = reply(ACK, 1, 4);
        shifted[33] = SYN | ACK;
        assert!(!passes(&shifted));
        let mut udp = reply(SYN | ACK, 1, 0);
        udp[9] = 17;
        assert!(!passes(&udp), "not TCP");
        let mut v6 = reply(SYN | ACK, 1, 0);
        v6[0] = 0x65;
        assert!(!passes(&v6), "not IPv4");
        let full = reply(SYN | ACK, 1, 0);
        assert!(!passes(&full[..33]), "too short to hold the flags");
        assert!(passes(&full[..34]), "just long enough");
    }

    /// The IPv6 socket's filter reads the flags at the start of the data, where an IPv6 raw
    /// socket's segment starts.
    #[test]
    fn filter6_passes_only_syn_ack_and_rst() {
        let passes = filtered(attach_filter6);
        assert!(passes(&reply6(SYN | ACK, 1)), "SYN+ACK");
        assert!(passes(&reply6(RST | ACK, 1)), "RST+ACK");
        assert!(passes(&reply6(RST, 1)), "RST");
        for flags in [SYN, ACK, PSH | ACK, FIN | ACK] {
            assert!(!passes(&reply6(flags, 1)), "flags {flags:#x}");
        }
        // The flags at offset 13 only: an ACK with SYN+ACK where the IPv4 filter would look
        // (behind a 20-byte IP header) is an ACK.
        let mut ack = reply6(ACK, 1);
        ack.resize(40, 0);
        ack[33] = SYN | ACK;
        assert!(!passes(&ack));
        let full = reply6(SYN | ACK, 1);
        assert!(!passes(&full[..13]), "too short to hold the flags");
        assert!(passes(&full[..14]), "just long enough");
    }
}
