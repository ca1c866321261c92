//! Probe payloads: what `send`/`send_hex` send and what `expect`/`expect_hex` accept, at an
//! offset and under a mask, so a binary protocol (a DNS query's ID and RCODE, say) can be
//! checked. Pure: parsed from the config, matched against replies by the probes.

/// What a reply must hold: `bytes` at `offset`, compared under `mask` (a 1 bit is compared)
/// when there is one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Expect {
    pub bytes: Vec<u8>,
    pub offset: usize,
    /// As long as `bytes`.
    pub mask: Option<Vec<u8>>,
}

impl Expect {
    /// The text's bytes, at the start, every bit compared (the `expect = "..."` of before).
    pub fn prefix(bytes: &[u8]) -> Self {
        Self {
            bytes: bytes.to_vec(),
            offset: 0,
            mask: None,
        }
    }

    /// How much of a reply is needed to decide.
    pub fn needed(&self) -> usize {
        self.offset + self.bytes.len()
    }

    /// Whether `reply` matches.
    pub fn matches(&self, reply: &[u8]) -> bool {
        reply.len() >= self.needed() && self.may_match(reply)
    }

    /// Whether a reply that begins with `prefix` can still match: a stream fails early.
    pub fn may_match(&self, prefix: &[u8]) -> bool {
        let seen = prefix.get(self.offset..).unwrap_or_default();
        seen.iter()
            .zip(&self.bytes)
            .enumerate()
            .all(|(i, (&got, &want))| {
                let m = self.mask.as_ref().map_or(0xff, |m| m[i]);
                got & m == want & m
            })
    }
}

/// Bytes written as hex digit pairs, with any whitespace between pairs ("12 34 0a").
pub fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
    if digits.len() % 2 == 1 {
        return Err("an odd number of hex digits".to_owned());
    }
    digits
        .chunks(2)
        .map(|pair| {
            let s: String = pair.iter().collect();
            u8::from_str_radix(&s, 16).map_err(|_| format!("{s:?} is not a hex byte"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex() {
        assert_eq!(parse_hex("12 34\n0aFF"), Ok(vec![0x12, 0x34, 0x0a, 0xff]));
        assert!(parse_hex("123").unwrap_err().contains("odd"));
        assert!(parse_hex("zz").unwrap_err().contains("\"zz\""));
    }

    #[test]
    fn prefix_offset_and_mask() {
        let pong = Expect::prefix(b"PONG");
        assert!(pong.matches(b"PONG\r\n") && !pong.matches(b"PON") && !pong.matches(b"PING"));
        assert!(pong.may_match(b"PO") && !pong.may_match(b"PI"));
        // A DNS reply: ID 0x1234, QR set, RCODE 0, other flag bits free.
        let dns = Expect {
            bytes: vec![0x12, 0x34, 0x80, 0x00],
            offset: 0,
            mask: Some(vec![0xff, 0xff, 0x80, 0x0f]),
        };
        assert!(dns.matches(&[0x12, 0x34, 0x85, 0x80, 0, 1]));
        assert!(!dns.matches(&[0x12, 0x34, 0x85, 0x85]), "RCODE 5 (refused)");
        assert!(
            !dns.matches(&[0x12, 0x34, 0x01, 0x00]),
            "a query, not a reply"
        );
        assert!(!dns.matches(&[0x12, 0x35, 0x80, 0x00]), "another ID");
        let at = Expect {
            bytes: b"OK".to_vec(),
            offset: 3,
            mask: None,
        };
        assert!(at.matches(b"xx OK") && !at.matches(b"OK xx") && !at.matches(b"xx O"));
        assert!(at.may_match(b"abc") && at.may_match(b"abcO") && !at.may_match(b"abcX"));
    }
}
