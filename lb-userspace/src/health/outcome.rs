//! What one probe found, whatever its kind, and why it failed in a few words an operator can act
//! on ("connection refused", "TLS: certificate not trusted (self-signed CA used as server
//! certificate)", "HTTP 503", "local: too many open files"). Small `Copy` values: a probe result
//! is made for every probe and a reason costs no allocation.

use std::{fmt, io, time::Duration};

/// What one probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    /// The expected answer arrived after `latency`.
    Success { latency: Duration },
    /// The connection failed: refused, reset, unreachable.
    TcpFailure(Reason),
    /// The TLS handshake failed (`https`): counted apart from TCP failures.
    TlsFailure(Reason),
    /// An HTTP answer, but the wrong one: unexpected status code, not HTTP.
    HttpFailure(Reason),
    /// A reply to `send` (tcp-connect, udp) that is not the expected one, or none before the
    /// connection closed.
    PayloadFailure(Reason),
    /// No answer within the timeout.
    Timeout,
    /// Failed on this host, not at the target (out of descriptors, buffers, local ports): no
    /// verdict either way, it moves no counter.
    Local(Reason),
    /// An answer in neither status set of a check that has `unhealthy_status` (seed 002): no
    /// verdict either way, it moves no counter.
    Neutral(Reason),
}

impl ProbeResult {
    /// Why the probe failed, for status, events and logs; None for a success.
    pub fn failure(&self, timeout: Duration) -> Option<String> {
        match self {
            Self::Success { .. } => None,
            Self::Timeout => Some(format!(
                "timeout after {}",
                crate::config::show_duration(timeout)
            )),
            Self::TcpFailure(r)
            | Self::TlsFailure(r)
            | Self::HttpFailure(r)
            | Self::PayloadFailure(r) => Some(r.to_string()),
            Self::Local(r) => Some(format!("local: {r}")),
            Self::Neutral(_) => None,
        }
    }
}

/// The bytes of an HTTP answer in which [`Reason::NoStatusLine`] found no status line (the HTTP
/// probe reads no more than this for it).
pub const HTTP_MAX_HEAD: usize = 8 * 1024;

/// Why a probe failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// RST to the SYN, ECONNREFUSED, ICMP port unreachable to a UDP datagram.
    Refused,
    /// The connection was reset after it was established.
    Reset,
    /// The peer closed before answering.
    Closed,
    /// An ICMP destination unreachable (its code).
    Unreachable(u8),
    /// An ICMPv6 destination unreachable (its code, RFC 4443: the codes differ from ICMP's).
    Unreachable6(u8),
    /// Another socket error (errno).
    Os(i32),
    /// An HTTP status outside the healthy set.
    Status(u16),
    /// The answer is not HTTP/1.x.
    NotHttp,
    /// No complete status line within the bytes the probe reads.
    NoStatusLine,
    /// The reply does not match `expect`.
    Mismatch,
    /// The TLS handshake failed.
    Tls(Tls),
    /// The raw socket a check kind needs is not open (a bug or a missing capability).
    NoProber,
    /// Something in lb itself failed (logged where it happened).
    Internal,
}

/// Why a TLS handshake failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    UnknownIssuer,
    /// A CA certificate presented as the server's (what `openssl req -x509` makes).
    CaUsedAsEndEntity,
    Expired,
    NotValidYet,
    WrongName,
    Revoked,
    BadSignature,
    /// Another problem with the certificate.
    Certificate,
    /// The server sent an alert (its description code).
    Alert(u8),
    /// No protocol version or cipher suite in common.
    Incompatible,
    /// The server broke the protocol.
    Protocol,
    /// The server closed or reset the connection during the handshake.
    Closed,
    Other,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused => f.write_str("connection refused"),
            Self::Reset => f.write_str("connection reset"),
            Self::Closed => f.write_str("closed before answering"),
            Self::Unreachable(code) => write!(f, "ICMP {}", unreachable_text(*code)),
            Self::Unreachable6(code) => write!(f, "ICMPv6 {}", unreachable6_text(*code)),
            Self::Os(errno) => f.write_str(&crate::resources::os_error_text(
                &io::Error::from_raw_os_error(*errno),
            )),
            Self::Status(code) => write!(f, "HTTP {code}"),
            Self::NotHttp => f.write_str("not an HTTP/1.x answer"),
            Self::NoStatusLine => write!(
                f,
                "no status line in the first {} KiB",
                HTTP_MAX_HEAD / 1024
            ),
            Self::Mismatch => f.write_str("reply does not match expect"),
            Self::Tls(t) => write!(f, "TLS: {t}"),
            Self::NoProber => f.write_str("no raw socket for this check kind"),
            Self::Internal => f.write_str("internal error (see the log)"),
        }
    }
}

impl fmt::Display for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownIssuer => f.write_str("certificate not trusted (unknown issuer)"),
            Self::CaUsedAsEndEntity => {
                f.write_str("certificate not trusted (self-signed CA used as server certificate)")
            }
            Self::Expired => f.write_str("certificate expired"),
            Self::NotValidYet => f.write_str("certificate not valid yet"),
            Self::WrongName => f.write_str("certificate not valid for the server name"),
            Self::Revoked => f.write_str("certificate revoked"),
            Self::BadSignature => f.write_str("bad certificate signature"),
            Self::Certificate => f.write_str("certificate rejected"),
            Self::Alert(code) => write!(
                f,
                "alert from the server ({:?})",
                rustls::AlertDescription::from(*code)
            ),
            Self::Incompatible => f.write_str("no protocol version or cipher suite in common"),
            Self::Protocol => f.write_str("protocol error"),
            Self::Closed => f.write_str("closed during the handshake"),
            Self::Other => f.write_str("handshake failed"),
        }
    }
}

/// ICMP destination unreachable codes (RFC 792, 1122, 1812).
fn unreachable_text(code: u8) -> &'static str {
    match code {
        0 | 6 => "network unreachable",
        1 | 7 => "host unreachable",
        2 => "protocol unreachable",
        3 => "port unreachable",
        4 => "fragmentation needed",
        9 | 10 | 13 => "communication administratively prohibited",
        _ => "destination unreachable",
    }
}

/// ICMPv6 destination unreachable codes (RFC 4443 §3.1).
fn unreachable6_text(code: u8) -> &'static str {
    match code {
        0 => "no route to destination",
        1 => "communication administratively prohibited",
        2 => "beyond scope of source address",
        3 => "address unreachable",
        4 => "port unreachable",
        5 => "source address failed ingress/egress policy",
        6 => "reject route to destination",
        _ => "destination unreachable",
    }
}

/// A socket error of a probe: local shortages are the host's, the rest the target's.
pub fn from_io(e: &io::Error) -> ProbeResult {
    if crate::resources::is_local_shortage(e) {
        return ProbeResult::Local(Reason::Os(e.raw_os_error().unwrap_or(0)));
    }
    match e.kind() {
        io::ErrorKind::TimedOut => ProbeResult::Timeout,
        io::ErrorKind::ConnectionRefused => ProbeResult::TcpFailure(Reason::Refused),
        io::ErrorKind::ConnectionReset => ProbeResult::TcpFailure(Reason::Reset),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionAborted => {
            ProbeResult::TcpFailure(Reason::Closed)
        }
        _ => match e.raw_os_error() {
            Some(errno) => ProbeResult::TcpFailure(Reason::Os(errno)),
            // Not from the socket: lb's own machinery (a task that stopped, say).
            None => ProbeResult::Local(Reason::Internal),
        },
    }
}

/// A failed TLS handshake (tokio-rustls reports rustls' error inside an io::Error).
pub fn from_tls(e: &io::Error) -> ProbeResult {
    use rustls::{CertificateError as C, Error as E};
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<E>()) else {
        // Not rustls: the transport under it failed (reset, close, a local shortage).
        return match from_io(e) {
            ProbeResult::TcpFailure(Reason::Reset | Reason::Closed) => {
                ProbeResult::TlsFailure(Reason::Tls(Tls::Closed))
            }
            other => other,
        };
    };
    let problem = match tls {
        E::InvalidCertificate(c) => match c {
            C::UnknownIssuer => Tls::UnknownIssuer,
            C::Expired | C::ExpiredContext { .. } => Tls::Expired,
            C::NotValidYet | C::NotValidYetContext { .. } => Tls::NotValidYet,
            C::NotValidForName | C::NotValidForNameContext { .. } => Tls::WrongName,
            C::Revoked => Tls::Revoked,
            C::BadSignature => Tls::BadSignature,
            // webpki's CaUsedAsEndEntity reaches rustls as an opaque "other" error; its name is
            // what identifies it.
            C::Other(other) if format!("{other:?}").contains("CaUsedAsEndEntity") => {
                Tls::CaUsedAsEndEntity
            }
            _ => Tls::Certificate,
        },
        E::AlertReceived(alert) => Tls::Alert(u8::from(*alert)),
        E::PeerIncompatible(_) => Tls::Incompatible,
        E::PeerMisbehaved(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. }
        | E::InvalidMessage(_)
        | E::PeerSentOversizedRecord
        | E::DecryptError => Tls::Protocol,
        _ => Tls::Other,
    };
    ProbeResult::TlsFailure(Reason::Tls(problem))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_as_words() {
        let t = Duration::from_secs(2);
        let text = |r: ProbeResult| r.failure(t).unwrap();
        assert_eq!(
            text(ProbeResult::TcpFailure(Reason::Refused)),
            "connection refused"
        );
        assert_eq!(text(ProbeResult::Timeout), "timeout after 2s");
        assert_eq!(
            text(ProbeResult::HttpFailure(Reason::Status(503))),
            "HTTP 503"
        );
        assert_eq!(
            text(ProbeResult::TcpFailure(Reason::Unreachable(3))),
            "ICMP port unreachable"
        );
        assert_eq!(
            text(ProbeResult::TcpFailure(Reason::Unreachable6(4))),
            "ICMPv6 port unreachable"
        );
        assert_eq!(
            text(ProbeResult::TcpFailure(Reason::Unreachable6(3))),
            "ICMPv6 address unreachable"
        );
        assert_eq!(
            text(ProbeResult::TlsFailure(Reason::Tls(Tls::CaUsedAsEndEntity))),
            "TLS: certificate not trusted (self-signed CA used as server certificate)"
        );
        assert_eq!(
            text(ProbeResult::Local(Reason::Os(libc::EMFILE))),
            "local: too many open files"
        );
        assert_eq!(
            text(ProbeResult::TcpFailure(Reason::Os(libc::EHOSTUNREACH))),
            "no route to host"
        );
        assert_eq!(ProbeResult::Success { latency: t }.failure(t), None);
    }

    #[test]
    fn socket_errors_are_told_apart() {
        let e = io::Error::from_raw_os_error;
        assert_eq!(
            from_io(&e(libc::ECONNREFUSED)),
            ProbeResult::TcpFailure(Reason::Refused)
        );
        assert_eq!(
            from_io(&e(libc::EMFILE)),
            ProbeResult::Local(Reason::Os(libc::EMFILE))
        );
        assert_eq!(
            from_io(&e(libc::ENOBUFS)),
            ProbeResult::Local(Reason::Os(libc::ENOBUFS))
        );
        assert_eq!(from_io(&e(libc::ETIMEDOUT)), ProbeResult::Timeout);
        assert_eq!(
            from_io(&e(libc::ENETUNREACH)),
            ProbeResult::TcpFailure(Reason::Os(libc::ENETUNREACH))
        );
    }
}
