//! Client traffic through a VIP for the end-to-end tests, of either family: how flows spread
//! over backends, echoed streams compared by digest, UDP request/answer.

use std::{
    collections::HashMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{netns::Netns, servers::connect};

/// Connects to `vip` from `client` until a connection lands on backend `name`.
pub fn connect_to(client: &Netns, vip: SocketAddr, name: &str) -> TcpStream {
    for _ in 0..200 {
        let (conn, got) = connect(client, vip).unwrap();
        if got == name {
            return conn;
        }
    }
    panic!("no connection reached {name}");
}

/// Sends `data` through an echo connection and reads it back.
pub fn echo_once(conn: &mut TcpStream, data: &[u8]) {
    conn.write_all(data).unwrap();
    let mut back = vec![0u8; data.len()];
    conn.read_exact(&mut back).unwrap();
    assert_eq!(back, data);
}

/// Downloads from `to` (a server that sends and closes) for at most `limit`: the bytes
/// received, up to `expect` preallocated.
pub fn download(client: &Netns, to: SocketAddr, expect: usize, limit: Duration) -> Vec<u8> {
    let mut conn = client
        .enter(|| TcpStream::connect_timeout(&to, Duration::from_secs(5)))
        .unwrap();
    let deadline = Instant::now() + limit;
    let mut got = Vec::with_capacity(expect);
    let mut buf = vec![0u8; 65536];
    while Instant::now() < deadline {
        conn.set_read_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))
        .unwrap();
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    got
}

/// Asserts each backend's share of `n` flows is the wanted one, within what chance allows: the
/// flows' source ports place them on the ring like random draws, so a backend's count is
/// binomial. Allowed: [`SIGMAS`] standard deviations of it, so that the bound follows `n` (a
/// fixed 5 points was 3.2 of them at 900 flows); a backend left out or weights ignored are still
/// far outside it.
pub fn assert_shares(seen: &HashMap<String, usize>, n: usize, want: &[(&str, f64)]) {
    for (name, share) in want {
        let got = *seen.get(*name).unwrap_or(&0) as f64 / n as f64;
        let allowed = share_tolerance(*share, n);
        assert!(
            (got - share).abs() <= allowed,
            "{name}: {:.1}% of {n} flows, want {:.1}% ± {:.1} points ({seen:?})",
            got * 100.0,
            share * 100.0,
            allowed * 100.0
        );
    }
}

/// Standard deviations a share may stray by: two-sided, about 6 in 10 million per check.
const SIGMAS: f64 = 5.0;

/// How far a share `share` of `n` random draws may stray (as a fraction).
fn share_tolerance(share: f64, n: usize) -> f64 {
    SIGMAS * (share * (1.0 - share) / n as f64).sqrt()
}

/// FNV-1a, to compare streams without keeping both.
fn digest(data: &[u8], mut h: u64) -> u64 {
    for b in data {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Sends `len` bytes through an echo connection while reading them back; compares digests.
pub fn echo_transfer(conn: TcpStream, len: usize, seed: u8) {
    echo_transfer_counted(conn, len, seed, &AtomicUsize::new(0));
}

/// [`echo_transfer`], counting the bytes echoed back so far in `received`.
pub fn echo_transfer_counted(mut conn: TcpStream, len: usize, seed: u8, received: &AtomicUsize) {
    let mut writer = conn.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let mut h = 0xcbf2_9ce4_8422_2325;
        let mut chunk = vec![0u8; 64 * 1024];
        let mut sent = 0;
        while sent < len {
            let n = chunk.len().min(len - sent);
            for (i, b) in chunk[..n].iter_mut().enumerate() {
                *b = ((sent + i) as u8).wrapping_mul(31).wrapping_add(seed);
            }
            writer.write_all(&chunk[..n]).unwrap();
            h = digest(&chunk[..n], h);
            sent += n;
        }
        h
    });
    let mut h = 0xcbf2_9ce4_8422_2325;
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    while got < len {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed after {got} of {len} bytes");
        h = digest(&buf[..n], h);
        got += n;
        received.store(got, Ordering::Relaxed);
    }
    assert_eq!(
        sender.join().unwrap(),
        h,
        "echoed stream differs from the one sent"
    );
}

/// `n` UDP datagrams to `vip`, each from a new socket: every reply comes from the VIP and names
/// a backend; counts them by backend.
pub fn udp_echo(client: &Netns, vip: SocketAddr, n: usize) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for i in 0..n {
        let socket = client
            .enter(|| UdpSocket::bind(lb::health::probe::wildcard(vip.ip())))
            .unwrap();
        socket.connect(vip).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let payload = format!("ping {i}");
        let mut buf = [0u8; 512];
        // One retry: a first datagram may meet an unresolved neighbour on the way back.
        let n = (0..2)
            .find_map(|_| {
                socket.send(payload.as_bytes()).unwrap();
                socket.recv(&mut buf).ok()
            })
            .unwrap_or_else(|| panic!("no UDP reply for datagram {i}"));
        let reply = std::str::from_utf8(&buf[..n]).unwrap();
        let (name, echoed) = reply.split_once(':').unwrap();
        assert_eq!(echoed, payload);
        *seen.entry(name.to_owned()).or_default() += 1;
    }
    seen
}

/// A long-lived echo stream that keeps going until told to stop: a chunk sent and read back
/// every `pace`, each checked, so a stream that moves between balancers (or breaks) shows it
/// while it runs. [`PacedStream::finish`] says whether it stayed intact and how much it moved.
pub struct PacedStream {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    echoed: std::sync::Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<Result<usize, String>>,
    /// The backend that greeted it.
    pub backend: String,
}

impl PacedStream {
    /// Connects to `vip` from `client` and starts exchanging `chunk` bytes every `pace`.
    pub fn start(
        client: &Netns,
        vip: SocketAddr,
        seed: u8,
        chunk: usize,
        pace: Duration,
    ) -> anyhow::Result<Self> {
        let (mut conn, backend) = connect(client, vip)?;
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let echoed = std::sync::Arc::new(AtomicUsize::new(0));
        let (s, e) = (stop.clone(), echoed.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; chunk];
            let mut back = vec![0u8; chunk];
            let mut n = 0usize;
            while !s.load(Ordering::Relaxed) {
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = ((n + i) as u8).wrapping_mul(31).wrapping_add(seed);
                }
                conn.write_all(&buf)
                    .map_err(|err| format!("write after {n} bytes: {err}"))?;
                conn.read_exact(&mut back)
                    .map_err(|err| format!("read after {n} bytes: {err}"))?;
                if back != buf {
                    return Err(format!("echo differs after {n} bytes"));
                }
                n += chunk;
                e.store(n, Ordering::Relaxed);
                std::thread::sleep(pace);
            }
            Ok(n)
        });
        Ok(Self {
            stop,
            echoed,
            thread,
            backend,
        })
    }

    /// Bytes echoed so far.
    pub fn echoed(&self) -> usize {
        self.echoed.load(Ordering::Relaxed)
    }

    /// Whether it has ended by itself (broken).
    pub fn ended(&self) -> bool {
        self.thread.is_finished()
    }

    /// Stops it: the bytes echoed in all if it stayed intact, why not otherwise.
    pub fn finish(self) -> Result<usize, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .unwrap_or_else(|_| Err("the stream's thread panicked".into()))
    }
}

/// `n` [`PacedStream`]s to `vip` from `client`: a 1 KiB echo every 50 ms each, seeds 0..n.
pub fn paced_streams(
    client: &Netns,
    vip: SocketAddr,
    n: usize,
) -> anyhow::Result<Vec<PacedStream>> {
    (0..n)
        .map(|i| PacedStream::start(client, vip, i as u8, 1024, Duration::from_millis(50)))
        .collect()
}

/// Waits until every stream has echoed `more` bytes beyond what it had when called (or has
/// ended, broken), at most `limit`: they all went on through whatever the network just did.
pub fn wait_progress(streams: &[PacedStream], more: usize, limit: Duration) {
    let start: Vec<usize> = streams.iter().map(PacedStream::echoed).collect();
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline
        && !streams
            .iter()
            .zip(&start)
            .all(|(s, &at)| s.ended() || s.echoed() >= at + more)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// New connections in a loop until stopped (each greeted by its backend, as [`crate::servers`]
/// greets): how many were made, and the failures with why.
pub struct ConnectLoop {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl ConnectLoop {
    /// Starts connecting to `to` from `ns`, one connection after another.
    pub fn start(ns: &Netns, to: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let (s, n, ns) = (stop.clone(), done.clone(), ns.clone());
        let thread = std::thread::spawn(move || {
            let mut failures = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match connect(&ns, to) {
                    Ok(_) => {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures.push(format!("{e:#}")),
                }
            }
            failures
        });
        Self {
            stop,
            done,
            thread: Some(thread),
        }
    }

    /// Waits for `more` connections beyond those made so far.
    pub fn wait(&self, more: usize) {
        let want = self.done.load(Ordering::Relaxed) + more;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.done.load(Ordering::Relaxed) < want {
            assert!(Instant::now() < deadline, "the load stalled");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops; the connections made, and each failure with why.
    pub fn finish(mut self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let failures = self.thread.take().unwrap().join().unwrap();
        (self.done.load(Ordering::Relaxed), failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(c: [usize; 3]) -> HashMap<String, usize> {
        (0..3).map(|i| (format!("backend-{i}"), c[i])).collect()
    }

    const THIRDS: [(&str, f64); 3] = [
        ("backend-0", 1.0 / 3.0),
        ("backend-1", 1.0 / 3.0),
        ("backend-2", 1.0 / 3.0),
    ];

    #[test]
    fn a_spread_within_chance_passes() {
        // The CI run's spread: 3.4 standard deviations low for one backend.
        assert_shares(&counts([330, 319, 251]), 900, &THIRDS);
        assert!((share_tolerance(1.0 / 3.0, 900) - 0.0786).abs() < 0.001);
    }

    #[test]
    #[should_panic(expected = "backend-2")]
    fn a_backend_left_out_fails() {
        assert_shares(&counts([450, 450, 0]), 900, &THIRDS);
    }

    #[test]
    #[should_panic(expected = "backend-0")]
    fn weights_ignored_fail() {
        let weighted = [
            ("backend-0", 1.0 / 6.0),
            ("backend-1", 2.0 / 6.0),
            ("backend-2", 3.0 / 6.0),
        ];
        assert_shares(&counts([1000, 1000, 1000]), 3000, &weighted);
    }
}
