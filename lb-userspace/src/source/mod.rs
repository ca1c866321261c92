//! Where the configuration is kept, and how a change goes back there: the file, read with its
//! version (a digest of its bytes) and replaced atomically, so that a change made through the
//! API is the file's from then on, and a restart, a reload or an editor see it.

mod file;

pub use file::FileStore;

use serde::{Deserialize, Serialize};

/// A version of the configuration: a digest of the file. Compared, never ordered.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Version(pub String);

impl Version {
    /// The version of a file holding `bytes`: the first 64 bits of their SHA-256, in hex.
    pub fn of(bytes: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
        Self(
            digest.as_ref()[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        )
    }

    /// As an HTTP entity tag (quoted).
    pub fn etag(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// Whether an `If-Match` header's value names this version (quoted or not, weak or not;
    /// `*` names any).
    pub fn matches(&self, if_match: &str) -> bool {
        if_match.split(',').any(|tag| {
            let tag = tag.trim();
            let tag = tag.strip_prefix("W/").unwrap_or(tag);
            tag == "*" || tag.trim_matches('"') == self.0
        })
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The configuration as kept, and its version.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub text: String,
    pub version: Version,
}

/// Why a change could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The configuration is no longer the version the change was made to (edited by hand, or
    /// by another writer): nothing was written.
    #[error(
        "the configuration changed since version {expected} (it is now {found}); nothing was \
         written"
    )]
    Conflict { expected: Version, found: Version },
    /// It could not be written (read-only, disk full, ...): nothing was written.
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_digests_matched_as_entity_tags() {
        let v = Version::of(b"[lb]\n");
        assert_eq!(v.0.len(), 16);
        assert_eq!(v, Version::of(b"[lb]\n"));
        assert_ne!(v, Version::of(b"[lb]\n\n"));
        assert!(v.matches(&v.etag()));
        assert!(v.matches(&v.0));
        assert!(v.matches(&format!("W/{}", v.etag())));
        assert!(v.matches(&format!("\"0000\", {}", v.etag())));
        assert!(v.matches("*"));
        assert!(!v.matches("\"0000000000000000\""));
    }
}
