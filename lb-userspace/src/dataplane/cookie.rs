//! The SYN cookie key: read from `syn_cookie_key_file` (shared by the lb hosts behind the same
//! routers, so an ACK validates on another host than its SYN's), or drawn at random.

use std::{io::Read as _, path::Path};

use anyhow::{Context as _, bail};
use lb_common::CookieKey;

/// The key of `file` (32 hex digits, surrounding whitespace ignored), or a random one.
pub fn key(file: Option<&Path>) -> anyhow::Result<CookieKey> {
    match file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading syn_cookie_key_file {}", path.display()))?;
            parse(&text).with_context(|| format!("syn_cookie_key_file {}", path.display()))
        }
        None => {
            let mut bytes = [0u8; 16];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut bytes))
                .context("drawing a SYN cookie key from /dev/urandom")?;
            Ok(from_bytes(bytes))
        }
    }
}

/// 32 hex digits as a key; not all zeros (the datapath reads zeros as "no key").
pub fn parse(text: &str) -> anyhow::Result<CookieKey> {
    let hex = text.trim();
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "expected 32 hex digits (a 128-bit key), got {} characters",
            hex.len()
        );
    }
    let mut bytes = [0u8; 16];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked above");
    }
    if bytes == [0; 16] {
        bail!("the key is all zeros");
    }
    Ok(from_bytes(bytes))
}

fn from_bytes(b: [u8; 16]) -> CookieKey {
    CookieKey {
        k0: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
        k1: u64::from_le_bytes(b[8..].try_into().expect("8 bytes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_holds_32_hex_digits() {
        let k = parse(" 000102030405060708090a0b0c0d0e0f\n").unwrap();
        assert_eq!(k.k0, 0x0706_0504_0302_0100);
        assert_eq!(k.k1, 0x0f0e_0d0c_0b0a_0908);
        for bad in [
            "",
            "0011",
            "zz0102030405060708090a0b0c0d0e0f",
            &"0".repeat(32),
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(
            format!(
                "{:#}",
                key(Some(Path::new("/nonexistent/key"))).unwrap_err()
            )
            .contains("/nonexistent/key")
        );
        assert_ne!(key(None).unwrap(), key(None).unwrap());
    }
}
