//! Backend servers for end-to-end tests, running in a namespace on their own thread: a TCP server
//! that greets each connection with its name and then echoes, and a UDP server that answers
//! `<name>:<datagram>`. Stopped when the guard drops.

use std::{
    net::{SocketAddr, TcpListener, UdpSocket},
    thread::JoinHandle,
};

use anyhow::Context as _;
use tokio::{io::AsyncWriteExt as _, sync::watch};

use crate::netns::Netns;

pub struct Servers {
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join(); // a panicked server thread already failed its test loudly
        }
    }
}

/// Starts both servers on `addr` (TCP and UDP, same port) inside `ns`.
pub fn start(ns: &Netns, addr: SocketAddr, name: &str) -> anyhow::Result<Servers> {
    // Sockets are created in the namespace; the runtime that serves them can live anywhere.
    let (tcp, udp) = ns.enter(|| -> anyhow::Result<_> {
        let tcp = TcpListener::bind(addr).with_context(|| format!("TCP bind {addr}"))?;
        let udp = UdpSocket::bind(addr).with_context(|| format!("UDP bind {addr}"))?;
        tcp.set_nonblocking(true)?;
        udp.set_nonblocking(true)?;
        Ok((tcp, udp))
    })?;
    let (stop, stop_rx) = watch::channel(false);
    let name = name.to_owned();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(serve(tcp, udp, name, stop_rx));
    });
    Ok(Servers {
        stop,
        thread: Some(thread),
    })
}

async fn serve(tcp: TcpListener, udp: UdpSocket, name: String, mut stop: watch::Receiver<bool>) {
    let tcp = tokio::net::TcpListener::from_std(tcp).expect("tcp");
    let udp = tokio::net::UdpSocket::from_std(udp).expect("udp");
    let greeting = format!("{name}\n");
    let mut buf = vec![0u8; 65536];
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            accepted = tcp.accept() => {
                let Ok((mut conn, _)) = accepted else { continue };
                let greeting = greeting.clone();
                tokio::spawn(async move {
                    if conn.write_all(greeting.as_bytes()).await.is_err() {
                        return;
                    }
                    let (mut r, mut w) = conn.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await; // echo until the client closes
                    let _ = w.shutdown().await;
                });
            }
            received = udp.recv_from(&mut buf) => {
                let Ok((n, from)) = received else { continue };
                let mut reply = format!("{name}:").into_bytes();
                reply.extend_from_slice(&buf[..n]);
                let _ = udp.send_to(&reply, from).await;
            }
        }
    }
}

/// Starts a minimal HTTP/1.1 server on `addr` inside `ns`: every request gets
/// `200 OK` with the body `hello from <name>\n`, then the connection closes.
pub fn start_http(ns: &Netns, addr: SocketAddr, name: &str) -> anyhow::Result<Servers> {
    serve_http(ns, addr, name, None)
}

/// The same server over TLS, with a self-signed certificate for the address (checks of it need
/// `verify_tls = false`).
pub fn start_https(ns: &Netns, addr: SocketAddr, name: &str) -> anyhow::Result<Servers> {
    serve_http(ns, addr, name, Some(self_signed(addr)?))
}

fn self_signed(addr: SocketAddr) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let ck = rcgen::generate_simple_self_signed(vec![addr.ip().to_string()])?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![ck.cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der())),
        )?;
    Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
}

fn serve_http(
    ns: &Netns,
    addr: SocketAddr,
    name: &str,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> anyhow::Result<Servers> {
    let tcp = ns.enter(|| -> anyhow::Result<_> {
        let tcp = TcpListener::bind(addr).with_context(|| format!("HTTP bind {addr}"))?;
        tcp.set_nonblocking(true)?;
        Ok(tcp)
    })?;
    let (stop, mut stop_rx) = watch::channel(false);
    let body = format!("hello from {name}\n");
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let tcp = tokio::net::TcpListener::from_std(tcp).expect("tcp");
            loop {
                tokio::select! {
                    _ = stop_rx.wait_for(|s| *s) => return,
                    accepted = tcp.accept() => {
                        let Ok((conn, _)) = accepted else { continue };
                        let body = body.clone();
                        match tls.clone() {
                            None => drop(tokio::spawn(http_reply(conn, body))),
                            Some(acceptor) => drop(tokio::spawn(async move {
                                // A failed handshake is the client's business.
                                if let Ok(conn) = acceptor.accept(conn).await {
                                    http_reply(conn, body).await;
                                }
                            })),
                        }
                    }
                }
            }
        });
    });
    Ok(Servers {
        stop,
        thread: Some(thread),
    })
}

async fn http_reply<S>(mut conn: S, body: String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt as _;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(response.as_bytes()).await;
    let _ = conn.shutdown().await;
}

/// The bytes [`start_blob`] sends: a pattern no two offsets of a megabyte repeat in phase.
pub fn blob(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[1])
        .collect()
}

/// Starts a TCP server on `addr` inside `ns` that sends [`blob`]`(len)` to each connection and
/// closes it: a download of known content.
pub fn start_blob(ns: &Netns, addr: SocketAddr, len: usize) -> anyhow::Result<Servers> {
    let body = std::sync::Arc::new(blob(len));
    start_each(ns, addr, "blob", move |mut conn| {
        let body = body.clone();
        async move {
            let _ = conn.write_all(&body).await;
            let _ = conn.shutdown().await;
        }
    })
}

/// Starts a TCP server on `addr` inside `ns` that accepts, reads whatever comes and never
/// answers (an application that hangs after accept): "no data back".
pub fn start_silent(ns: &Netns, addr: SocketAddr) -> anyhow::Result<Servers> {
    start_each(ns, addr, "silent", |mut conn| async move {
        use tokio::io::AsyncReadExt as _;
        let mut buf = [0u8; 1024];
        while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
    })
}

/// A TCP server on `addr` inside `ns` running `serve` as a task for each connection.
fn start_each<F, Fut>(ns: &Netns, addr: SocketAddr, what: &str, serve: F) -> anyhow::Result<Servers>
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let tcp = ns.enter(|| -> anyhow::Result<_> {
        let tcp = TcpListener::bind(addr).with_context(|| format!("{what} bind {addr}"))?;
        tcp.set_nonblocking(true)?;
        Ok(tcp)
    })?;
    let (stop, mut stop_rx) = watch::channel(false);
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let tcp = tokio::net::TcpListener::from_std(tcp).expect("tcp");
            loop {
                tokio::select! {
                    _ = stop_rx.wait_for(|s| *s) => return,
                    accepted = tcp.accept() => {
                        let Ok((conn, _)) = accepted else { continue };
                        tokio::spawn(serve(conn));
                    }
                }
            }
        });
    });
    Ok(Servers {
        stop,
        thread: Some(thread),
    })
}

/// Connects to `addr` from inside `ns`, reads the greeting line, returns (stream, backend name).
pub fn connect(ns: &Netns, addr: SocketAddr) -> anyhow::Result<(std::net::TcpStream, String)> {
    use std::io::BufRead as _;
    let stream = ns
        .enter(|| std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5)))?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let mut reader = std::io::BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    anyhow::ensure!(
        line.ends_with('\n'),
        "no greeting from {addr} (got {line:?})"
    );
    Ok((stream, line.trim_end().to_owned()))
}

/// Opens `n` connections to `to` from `ns`, one after the other; counts which backend greeted
/// each.
pub fn spread(ns: &Netns, to: SocketAddr, n: usize) -> std::collections::HashMap<String, usize> {
    let mut seen = std::collections::HashMap::new();
    for i in 0..n {
        let (_, name) = connect(ns, to).unwrap_or_else(|e| panic!("connection {i}: {e:#}"));
        *seen.entry(name).or_default() += 1;
    }
    seen
}
