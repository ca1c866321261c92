//! Where IPv4 replies arrive: a packet socket with a receive ring shared with the kernel
//! (`PACKET_RX_RING`, `TPACKET_V3`). The kernel runs the socket's filter ([`super::filter`]) on
//! every IPv4 packet the host receives and copies the first bytes of the few that pass into the
//! open block of the ring; the reader takes them from memory. A reply then costs no system
//! call, no socket buffer and no copy in the reader's thread, where a raw socket cost a clone of
//! every TCP segment the host received, and for each reply its dequeue, copy and free in
//! `recvmmsg`: 22% of the prober's samples at 50,000 probes a second (perf, issue 20).
//!
//! The kernel hands a block over (and wakes the reader) when it is full or its timer finds it
//! holding replies ([`RETIRE_MS`]), not once per reply as `TPACKET_V2` does: under load the
//! reader wakes once per block of some 70 replies. Two consequences:
//! - a reply may wait in the open block, unseen, for a millisecond or two. So the reader learns
//!   when each reply arrived from its kernel timestamp (the latency is right), and it may
//!   declare a probe late only once every reply that arrived before its deadline has been read:
//!   [`Frames::read_until`];
//! - a result is delivered up to that long after its reply arrived.
//!
//! A packet socket sees packets as they come off the device, before the IP layer: before
//! netfilter's PREROUTING and INPUT hooks, reverse-path filtering and IPsec policy checks, which
//! a raw socket came after. A reply that the host's firewall then drops still counts here (the
//! backend did answer). Replies of transport-mode IPsec are decrypted inside the IP layer, past
//! every packet socket: such targets time out (docs/limitations.md).

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant, SystemTime},
};

use socket2::{Domain, Socket, Type};
use tokio::io::unix::AsyncFd;

use super::filter::{REPLY_BYTES, attach_filter};
use crate::health::probe::sys::{needs_net_raw, register, setsockopt};

/// Bytes per block, the unit the kernel fills and hands over (4 pages): about 70 replies, each
/// kept in 224 bytes with its header and address.
const BLOCK: usize = 16 << 10;
/// Blocks in the ring (2 MiB): replies the reader may fall behind by before the kernel drops
/// some (those probes then time out; the reader logs how many). A slot's burst at 50,000
/// targets a second is about 500 replies, 7 blocks.
const BLOCKS: usize = 128;
/// The ring's size, as mapped.
const RING_BYTES: usize = BLOCKS * BLOCK;
/// The largest record the kernel may write: its header, address and room, then up to
/// [`REPLY_BYTES`] of the packet.
const FRAME: usize = 256;
/// How long the kernel leaves a block open before handing over the replies it holds, ms. Its
/// timer checks the open block once a period, so a reply that comes while the link is quiet
/// waits up to two periods. On kernel 6.18 here, probes answered 17–228 µs after their SYN
/// ended 0.3–2.3 ms after they started; kernels that count the period in ticks
/// (`msecs_to_jiffies`) round it up to one (4 ms at HZ=250).
pub(super) const RETIRE_MS: u32 = 1;

/// Where a record's `sockaddr_ll` starts: behind the `tpacket3_hdr`, aligned as the kernel
/// aligns it (`TPACKET_ALIGN`, 16 bytes).
const ADDRESS: usize = size_of::<libc::tpacket3_hdr>().next_multiple_of(16);
/// Where the kernel puts a record's packet (from its IP header, the socket being `SOCK_DGRAM`):
/// behind the address, aligned, plus the 16 bytes it keeps for a link-layer header.
const DATA: usize = (ADDRESS + size_of::<libc::sockaddr_ll>()).next_multiple_of(16) + 16;

/// Offsets of the block descriptor's words the reader uses (`tpacket_block_desc`, `bh1`).
const BLOCK_STATUS: usize = std::mem::offset_of!(libc::tpacket_block_desc, hdr)
    + std::mem::offset_of!(libc::tpacket_hdr_v1, block_status);
const BLOCK_PACKETS: usize = std::mem::offset_of!(libc::tpacket_block_desc, hdr)
    + std::mem::offset_of!(libc::tpacket_hdr_v1, num_pkts);

/// The IPv4 replies' packet socket and its ring (apart, so that the reader can wait on the one
/// while it reads the other).
pub(super) struct ReplyRing {
    /// For the reactor: readable when a block has been handed over.
    pub(super) socket: AsyncFd<OwnedFd>,
    pub(super) frames: Frames,
}

/// The ring's blocks, mapped.
pub(super) struct Frames {
    area: NonNull<u8>,
    /// The next block to read: only the reader task reads the ring (`&mut self`).
    next: usize,
    /// A block read said the kernel dropped packets for want of room.
    losing: bool,
    /// Every reply that arrived before this instant has been read.
    read_until: Instant,
    /// The block the kernel had open when the reader last emptied the ring, and when: once
    /// that block is read, every reply that arrived before that instant has been.
    open: Option<(usize, Instant)>,
}

// SAFETY: the mapping is plain memory shared with the kernel; blocks are handed over through
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
        let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        setsockopt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VERSION, &version)?;
        let request = libc::tpacket_req3 {
            tp_block_size: BLOCK as u32,
            tp_block_nr: BLOCKS as u32,
            tp_frame_size: FRAME as u32,
            tp_frame_nr: (RING_BYTES / FRAME) as u32,
            tp_retire_blk_tov: RETIRE_MS,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        setsockopt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_RX_RING, &request)?;
        let socket = register(fd)?;
        // SAFETY: maps the ring just set up, as long as the socket's; unmapped in Drop.
        let area = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RING_BYTES,
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
                read_until: Instant::now(),
                open: None,
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
    /// A word of block `block`'s descriptor; the kernel writes them concurrently, hence atomics.
    fn word(&self, block: usize, offset: usize) -> &AtomicU32 {
        // SAFETY: `block` < BLOCKS, so the descriptor lies inside the mapping, and its words
        // are 4-byte aligned (blocks are page-aligned).
        unsafe { AtomicU32::from_ptr(self.area.as_ptr().add(block * BLOCK + offset).cast()) }
    }

    /// Hands every packet of the next block handed over (from its IP header, at most
    /// [`REPLY_BYTES`]) and when it arrived to `take`, in order, and gives the block back; how
    /// many packets it held, None when no block waits. Packets the device received for another
    /// host (a promiscuous device) are skipped.
    pub(super) fn read_block(&mut self, mut take: impl FnMut(&[u8], Instant)) -> Option<usize> {
        let block = self.next;
        // Acquire: the block's bytes, written before the kernel set the status, are seen.
        let status_now = self.word(block, BLOCK_STATUS).load(Ordering::Acquire);
        if status_now & libc::TP_STATUS_USER == 0 {
            return None;
        }
        self.losing |= status_now & libc::TP_STATUS_LOSING != 0;
        let clock = Clock::now();
        // SAFETY: the block is the reader's until its status goes back to the kernel.
        let base = unsafe { self.area.as_ptr().add(block * BLOCK) };
        // SAFETY: the descriptor starts the block.
        let (count, first) = unsafe {
            let desc = &*base.cast::<libc::tpacket_block_desc>();
            (
                desc.hdr.bh1.num_pkts as usize,
                desc.hdr.bh1.offset_to_first_pkt as usize,
            )
        };
        let mut at = first;
        for _ in 0..count {
            if at + ADDRESS + size_of::<libc::sockaddr_ll>() > BLOCK {
                break;
            }
            // SAFETY: the record's header and address lie inside the block, as just checked;
            // records are 16-byte aligned.
            let (next, net, snap, stamp, pkttype) = unsafe {
                let record = base.add(at);
                let header = &*record.cast::<libc::tpacket3_hdr>();
                let address = &*record.add(ADDRESS).cast::<libc::sockaddr_ll>();
                (
                    header.tp_next_offset as usize,
                    usize::from(header.tp_net),
                    header.tp_snaplen as usize,
                    Duration::new(header.tp_sec.into(), header.tp_nsec),
                    address.sll_pkttype,
                )
            };
            if pkttype != libc::PACKET_OTHERHOST && at + net + snap <= BLOCK {
                // SAFETY: inside the block, as just checked.
                take(
                    unsafe { std::slice::from_raw_parts(base.add(at + net), snap) },
                    clock.instant(stamp),
                );
            }
            if next == 0 {
                break;
            }
            at += next;
        }
        // No stale count for `read_until` while the kernel has not opened the block again.
        self.word(block, BLOCK_PACKETS).store(0, Ordering::Relaxed);
        // Release: done with the bytes before the kernel may overwrite them.
        self.word(block, BLOCK_STATUS)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.next = (block + 1) % BLOCKS;
        if let Some((open, when)) = self.open
            && open == block
        {
            self.read_until = when;
            self.open = None;
        }
        Some(count)
    }

    /// Called at `now` after the ring was read empty: the instant before which every reply
    /// that arrived has been read. That is `now` when the kernel's open block is empty; else
    /// the replies in it are unseen until the kernel hands it over, and the instant stays
    /// where the last such block left it.
    pub(super) fn read_until(&mut self, now: Instant) -> Instant {
        let block = self.next;
        // Acquire: a count read after it is not older than the status.
        if self.word(block, BLOCK_STATUS).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0 {
            // Handed over since the ring was read: not empty after all.
            return self.read_until;
        }
        if self.word(block, BLOCK_PACKETS).load(Ordering::Relaxed) == 0 {
            self.read_until = now;
            self.open = None;
        } else {
            self.open = Some((block, now));
        }
        self.read_until
    }

    /// Packets the kernel dropped for want of room since the last call, if a block read since
    /// said it did (`PACKET_STATISTICS`, which also resets the counts); their probes time out.
    pub(super) fn dropped(&mut self, socket: BorrowedFd<'_>) -> Option<u32> {
        if !std::mem::take(&mut self.losing) {
            return None;
        }
        let mut stats = libc::tpacket_stats_v3 {
            tp_packets: 0,
            tp_drops: 0,
            tp_freeze_q_cnt: 0,
        };
        let mut len = size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
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
        unsafe { libc::munmap(self.area.as_ptr().cast(), RING_BYTES) };
    }
}

/// The wall clock and the monotonic clock read together, to place a packet's kernel timestamp
/// (wall clock) on the monotonic clock the probes' times are on.
struct Clock {
    wall: Duration,
    now: Instant,
}

impl Clock {
    fn now() -> Self {
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            wall,
            now: Instant::now(),
        }
    }

    /// When a packet stamped `stamp` arrived; never after the clocks were read (a wall clock
    /// stepped back), at worst too early if it was stepped forward since (the latency then
    /// reads shorter, never negative: it saturates).
    fn instant(&self, stamp: Duration) -> Instant {
        let age = self.wall.saturating_sub(stamp);
        self.now.checked_sub(age).unwrap_or(self.now)
    }
}

const _: () = {
    assert!(BLOCK.is_multiple_of(FRAME));
    assert!(
        DATA + REPLY_BYTES as usize <= FRAME,
        "a kept reply fits the largest record"
    );
};

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring in anonymous memory, written the way the kernel writes one.
    fn ring() -> Frames {
        // SAFETY: a fresh private anonymous mapping, unmapped by `Frames`' Drop.
        let area = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RING_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(area, libc::MAP_FAILED);
        Frames {
            area: NonNull::new(area.cast()).unwrap(),
            next: 0,
            losing: false,
            read_until: Instant::now(),
            open: None,
        }
    }

    /// Where the kernel puts the first record: behind the block descriptor.
    const FIRST: usize = size_of::<libc::tpacket_block_desc>().next_multiple_of(16);
    /// A record's size here: header, address, room, and a 40-byte packet.
    const RECORD: usize = 160;

    /// The kernel's side: `stamps.len()` packets (the first byte of each is its index) in
    /// block `block`, handed over or still open.
    fn fill(frames: &Frames, block: usize, stamps: &[Duration], handed_over: bool) {
        let packets: Vec<_> = stamps.iter().map(|&s| (s, libc::PACKET_HOST)).collect();
        fill_with(frames, block, &packets, handed_over, 0);
    }

    /// [`fill`] with each packet's type and more status bits.
    fn fill_with(
        frames: &Frames,
        block: usize,
        packets: &[(Duration, u8)],
        handed_over: bool,
        status_bits: u32,
    ) {
        let base = unsafe { frames.area.as_ptr().add(block * BLOCK) };
        for (i, (stamp, pkttype)) in packets.iter().enumerate() {
            let at = FIRST + i * RECORD;
            // SAFETY: inside the block; records are 16-byte aligned.
            unsafe {
                let header = &mut *base.add(at).cast::<libc::tpacket3_hdr>();
                header.tp_next_offset = if i + 1 < packets.len() {
                    RECORD as u32
                } else {
                    0
                };
                header.tp_sec = stamp.as_secs() as u32;
                header.tp_nsec = stamp.subsec_nanos();
                header.tp_snaplen = 40;
                header.tp_net = DATA as u16;
                let address = &mut *base.add(at + ADDRESS).cast::<libc::sockaddr_ll>();
                address.sll_pkttype = *pkttype;
                *base.add(at + DATA) = i as u8;
            }
        }
        // SAFETY: the descriptor starts the block.
        unsafe {
            let desc = &mut *base.cast::<libc::tpacket_block_desc>();
            desc.hdr.bh1.offset_to_first_pkt = FIRST as u32;
        }
        frames
            .word(block, BLOCK_PACKETS)
            .store(packets.len() as u32, Ordering::Relaxed);
        let status = if handed_over {
            libc::TP_STATUS_USER | status_bits
        } else {
            libc::TP_STATUS_KERNEL
        };
        frames
            .word(block, BLOCK_STATUS)
            .store(status, Ordering::Release);
    }

    fn wall_now() -> Duration {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
    }

    #[test]
    fn deadlines_wait_for_the_replies_in_the_open_block() {
        let mut frames = ring();
        let t = Instant::now();
        let ms = Duration::from_millis;
        // Nothing in the ring: everything up to now was read.
        assert_eq!(frames.read_until(t), t);
        // A reply in the open block: unseen, so nothing past `t` counts as read.
        fill(&frames, 0, &[wall_now()], false);
        assert_eq!(frames.read_until(t + ms(1)), t);
        assert_eq!(frames.read_until(t + ms(2)), t, "still open: held");
        // The block handed over while the next one fills: its replies are read, and the read
        // covers what arrived before the last look at it (t + 2 ms), not later.
        fill(&frames, 0, &[wall_now(), wall_now()], true);
        fill(&frames, 1, &[wall_now()], false);
        let mut got = Vec::new();
        assert_eq!(frames.read_block(|p, _| got.push(p[0])), Some(2));
        assert_eq!(got, [0, 1]);
        assert_eq!(frames.read_block(|_, _| ()), None, "block 1 is still open");
        assert_eq!(frames.read_until(t + ms(3)), t + ms(2));
        // Block 1 handed over and read, block 2 open and empty: read up to now.
        fill(&frames, 1, &[wall_now()], true);
        assert_eq!(frames.read_block(|_, _| ()), Some(1));
        assert_eq!(frames.read_until(t + ms(4)), t + ms(4));
        // Handed over after the last read: not read up to now.
        fill(&frames, 2, &[wall_now()], true);
        assert_eq!(frames.read_until(t + ms(5)), t + ms(4));
    }

    #[test]
    fn a_block_given_back_reads_as_empty_until_the_kernel_fills_it_again() {
        let mut frames = ring();
        fill(&frames, 0, &[wall_now(); 3], true);
        assert_eq!(frames.read_block(|_, _| ()), Some(3));
        // Round the ring: the reader is at block 0 again, which the kernel has not reopened.
        frames.next = 0;
        let t = Instant::now();
        assert_eq!(frames.read_until(t), t);
    }

    #[test]
    fn replies_are_placed_at_their_kernel_timestamps() {
        let mut frames = ring();
        let before = Instant::now();
        fill(&frames, 0, &[wall_now() - Duration::from_millis(50)], true);
        let mut arrived = None;
        frames.read_block(|_, at| arrived = Some(at));
        let age = Instant::now().duration_since(arrived.unwrap());
        assert!(
            age >= Duration::from_millis(50)
                && before.duration_since(arrived.unwrap()) > Duration::from_millis(40),
            "arrived {age:?} ago"
        );
        // A stamp from the future (a wall clock stepped back since) is placed at the read.
        let after = Instant::now();
        fill(&frames, 1, &[wall_now() + Duration::from_secs(5)], true);
        frames.read_block(|_, at| arrived = Some(at));
        assert!(arrived.unwrap() >= after);
    }

    #[test]
    fn packets_for_other_hosts_are_skipped_and_a_losing_block_is_noted() {
        let mut frames = ring();
        let now = wall_now();
        let packets = [
            (now, libc::PACKET_HOST),
            (now, libc::PACKET_OTHERHOST),
            (now, libc::PACKET_HOST),
        ];
        fill_with(&frames, 0, &packets, true, 0);
        let mut got = Vec::new();
        assert_eq!(frames.read_block(|p, _| got.push(p[0])), Some(3));
        assert_eq!(
            got,
            [0, 2],
            "the promiscuous device's packet for another host is not ours"
        );
        assert!(!frames.losing);
        fill_with(&frames, 1, &packets[..1], true, libc::TP_STATUS_LOSING);
        frames.read_block(|_, _| ());
        assert!(
            frames.losing,
            "the reader asks for the drop count after a losing block"
        );
    }
}
