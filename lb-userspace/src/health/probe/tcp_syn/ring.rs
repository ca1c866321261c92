//! Where IPv4 replies arrive: a packet socket with a receive ring shared with the kernel
//! (`PACKET_RX_RING`, `TPACKET_V2`). The kernel runs the socket's filter ([`super::filter`]) on
//! every IPv4 packet the host receives and copies the first bytes of the few that pass into the
//! next free frame of the ring; the reader takes them from memory. A reply then costs no system
//! call, no socket buffer and no copy in the reader's thread, where a raw socket cost a clone of
//! every TCP segment the host received, and for each reply its dequeue, copy and free in
//! `recvmmsg`: 22% of the prober's samples at 50,000 probes a second (perf, issue 20).
//!
//! A packet socket sees packets as they come off the device, before the IP layer: before
//! netfilter's PREROUTING and INPUT hooks, reverse-path filtering and IPsec policy checks, which
//! a raw socket came after. A reply that the host's firewall then drops still counts here (the
//! backend did answer). Replies of transport-mode IPsec are decrypted inside the IP layer, past
//! every packet socket: such targets time out (README, limitations).

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
};

use socket2::{Domain, Socket, Type};
use tokio::io::unix::AsyncFd;

use super::filter::{REPLY_BYTES, attach_filter};
use crate::health::probe::sys::{needs_net_raw, register, setsockopt};

/// Bytes per frame: the `tpacket2_hdr`, the `sockaddr_ll` and the kernel's 16 bytes of room
/// before the data (80 in all), then up to [`REPLY_BYTES`] of the packet.
const FRAME: usize = 256;
/// Frames per block (a block is the unit the kernel allocates: 4 pages).
const BLOCK: usize = 16 << 10;
/// Frames in the ring: replies the reader may fall behind by before the kernel drops some
/// (those probes then time out; the reader logs how many). A slot's burst at 50,000 targets a
/// second is about 500. 2 MiB.
const FRAMES: usize = 8192;

/// Where a frame's `sockaddr_ll` starts: behind the `tpacket2_hdr`, aligned as the kernel
/// aligns it (`TPACKET_ALIGN`, 16 bytes).
const ADDRESS: usize = size_of::<libc::tpacket2_hdr>().next_multiple_of(16);

/// The IPv4 replies' packet socket and its ring (apart, so that the reader can wait on the one
/// while it reads the other).
pub(super) struct ReplyRing {
    /// For the reactor: readable when a frame waits.
    pub(super) socket: AsyncFd<OwnedFd>,
    pub(super) frames: Frames,
}

/// The ring's frames, mapped.
pub(super) struct Frames {
    area: NonNull<u8>,
    /// The next frame to read: only the reader task reads the ring (`&mut self`).
    next: usize,
    /// A frame read said the kernel dropped packets for want of a free frame.
    losing: bool,
}

// SAFETY: the mapping is plain memory shared with the kernel; frames are handed over through
// their status word (atomic loads and stores), and only the owner of the `Frames` reads them.
unsafe impl Send for Frames {}

impl ReplyRing {
    /// Opens the socket (needs CAP_NET_RAW, as a raw socket does), filters it, maps its ring and
    /// only then binds it to IPv4 on every device: nothing reaches the ring unfiltered.
    pub(super) fn open() -> io::Result<Self> {
        // Protocol 0: no packet arrives before `bind`.
        let kind = Type::DGRAM.nonblocking().cloexec();
        let socket = Socket::new(Domain::PACKET, kind, None).map_err(|e| {
            needs_net_raw(
                e,
                "half-open TCP probes read their replies through a packet socket",
            )
        })?;
        let fd = OwnedFd::from(socket);
        attach_filter(fd.as_fd())?;
        let version = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        setsockopt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VERSION, &version)?;
        let request = libc::tpacket_req {
            tp_block_size: BLOCK as u32,
            tp_block_nr: (FRAMES * FRAME / BLOCK) as u32,
            tp_frame_size: FRAME as u32,
            tp_frame_nr: FRAMES as u32,
        };
        setsockopt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_RX_RING, &request)?;
        let socket = register(fd)?;
        // SAFETY: maps the ring just set up, as long as the socket's; unmapped in Drop.
        let area = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FRAMES * FRAME,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                socket.as_raw_fd(),
                0,
            )
        };
        let area = match NonNull::new(area.cast::<u8>()) {
            Some(area) if area.as_ptr() != libc::MAP_FAILED.cast() => area,
            _ => return Err(io::Error::last_os_error()),
        };
        let ring = Self {
            socket,
            frames: Frames {
                area,
                next: 0,
                losing: false,
            },
        };
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut at: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        at.sll_family = libc::AF_PACKET as u16;
        at.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        // SAFETY: valid fd and address.
        let bound = unsafe {
            libc::bind(
                ring.socket.as_raw_fd(),
                (&raw const at).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if bound != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ring)
    }
}

impl Frames {
    /// Hands up to `most` waiting packets (from their IP header, at most [`REPLY_BYTES`]) to
    /// `take` in order and gives their frames back to the kernel; how many frames it read.
    /// Packets the device received for another host (a promiscuous device) are skipped.
    pub(super) fn read(&mut self, most: usize, mut take: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < most {
            // SAFETY: `next` < FRAMES, so the frame lies inside the mapping.
            let frame = unsafe { self.area.as_ptr().add(self.next * FRAME) };
            // SAFETY: the status word starts the frame, 4-byte aligned (frames are 256 bytes
            // apart in page-aligned blocks); the kernel writes it concurrently, hence an atomic.
            let status = unsafe { AtomicU32::from_ptr(frame.cast()) };
            // Acquire: the frame's bytes, written before the kernel set the status, are seen.
            let status_now = status.load(Ordering::Acquire);
            if status_now & libc::TP_STATUS_USER == 0 {
                break;
            }
            self.losing |= status_now & libc::TP_STATUS_LOSING != 0;
            // SAFETY: the frame is the reader's until its status goes back to the kernel; the
            // header is 4-byte aligned, the address follows it (see ADDRESS).
            let (net, snap, pkttype) = unsafe {
                let header = &*frame.cast::<libc::tpacket2_hdr>();
                let at = frame.add(ADDRESS).cast::<libc::sockaddr_ll>();
                (
                    usize::from(header.tp_net),
                    header.tp_snaplen as usize,
                    (*at).sll_pkttype,
                )
            };
            if pkttype != libc::PACKET_OTHERHOST && net + snap <= FRAME {
                // SAFETY: inside the frame, as just checked.
                take(unsafe { std::slice::from_raw_parts(frame.add(net), snap) });
            }
            // Release: done with the bytes before the kernel may overwrite them.
            status.store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.next = (self.next + 1) % FRAMES;
            n += 1;
        }
        n
    }
}

impl Frames {
    /// Packets the kernel dropped for want of a free frame since the last call, if a frame
    /// read since said it did (`PACKET_STATISTICS`, which also resets the counts); their probes
    /// time out.
    pub(super) fn dropped(&mut self, socket: BorrowedFd<'_>) -> Option<u32> {
        if !std::mem::take(&mut self.losing) {
            return None;
        }
        let mut stats = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: valid fd; `stats` is writable for `len` bytes.
        let got = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&raw mut stats).cast(),
                &raw mut len,
            )
        };
        (got == 0).then_some(stats.tp_drops)
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, no longer used.
        unsafe { libc::munmap(self.area.as_ptr().cast(), FRAMES * FRAME) };
    }
}

const _: () = {
    assert!(BLOCK.is_multiple_of(FRAME) && (FRAMES * FRAME).is_multiple_of(BLOCK));
    // The kernel's offset of the data: TPACKET2_HDRLEN aligned, plus 16 bytes.
    assert!(
        libc::TPACKET2_HDRLEN.next_multiple_of(16) + 16 + REPLY_BYTES as usize <= FRAME,
        "a kept reply fits its frame"
    );
};
