//! The configuration reference (`docs/configuration.md`) and JSON Schema
//! (`docs/config.schema.json`, `lb config schema`), both made from one source: a recording of
//! the reader reading a file with every key ([`EVERY_KEY`]), which gives each key's path, type,
//! default, range and whether it is required, joined with [`docs::DOCS`], which says what it
//! means. Tests fail when the two lists of keys differ, or the checked-in files are stale.

mod docs;
mod render;

use super::asked::{Ty, recording};

/// A file with every key, reaching every branch of the reader.
pub const EVERY_KEY: &str = include_str!("every_key.toml");

/// One key as the reference shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// `service.check.kind`; the parent's path is the table the key is in.
    pub path: String,
    pub ty: Ty,
    pub default: Option<String>,
    pub range: Option<String>,
    pub required: bool,
    pub doc: &'static str,
}

impl Setting {
    pub fn key(&self) -> &str {
        self.path.rsplit('.').next().unwrap_or(&self.path)
    }

    pub fn parent(&self) -> &str {
        self.path.rsplit_once('.').map_or("", |(p, _)| p)
    }
}

/// The keys the reader asks for, in the order it first asks, each with its documentation. A
/// key without a doc entry gets an empty doc and one without a type `Ty::String`: the tests say
/// so long before a reader sees it.
pub fn settings() -> Vec<Setting> {
    let (_, asked) = recording(|| super::parse(EVERY_KEY));
    asked
        .into_iter()
        .map(|a| {
            let doc = docs::DOCS.iter().find(|d| d.path == a.path);
            Setting {
                ty: doc
                    .and_then(|d| d.ty)
                    .map(docs::Shape::ty)
                    .or(a.ty)
                    .unwrap_or(Ty::String),
                default: doc.and_then(|d| d.default).map(str::to_owned).or(a.default),
                range: a.range,
                required: a.required,
                doc: doc.map_or("", |d| d.doc),
                path: a.path,
            }
        })
        .collect()
}

/// `docs/configuration.md`'s text.
pub fn markdown() -> String {
    render::markdown(&settings())
}

/// `docs/config.schema.json`'s text (and `lb config schema`'s output).
pub fn schema() -> String {
    let mut text = serde_json::to_string_pretty(&render::schema(&settings())).expect("JSON");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn generated_doc_configuration() {
        crate::generated::check_or_write("docs/configuration.md", &markdown());
        crate::generated::check_or_write("docs/config.schema.json", &schema());
    }

    /// The bytes a flow takes, as the table sizes' docs state them, are the slots' own: a
    /// connection slot and two NAT slots (the NAT table has twice the slots).
    #[test]
    fn the_table_sizes_docs_state_the_slots_bytes() {
        use core::mem::size_of;
        use lb_common::{CtSlot, CtSlot6, NatSlot, NatSlot6};
        for (key, ct, nat) in [
            (
                "lb.conntrack.size",
                size_of::<CtSlot>(),
                size_of::<NatSlot>(),
            ),
            (
                "lb.conntrack.ipv6_size",
                size_of::<CtSlot6>(),
                size_of::<NatSlot6>(),
            ),
        ] {
            let doc = docs::DOCS.iter().find(|d| d.path == key).unwrap().doc;
            let bytes = format!("({ct} + 2 × {nat} bytes a flow)");
            assert!(doc.contains(&bytes), "{key}: {doc:?} should say {bytes}");
        }
    }

    #[test]
    fn the_every_key_file_is_valid() {
        if let Err(e) = super::super::parse(EVERY_KEY) {
            panic!("every_key.toml: {e}");
        }
    }

    /// A key the reader reads but the docs lack, or the reverse, fails here: add it to
    /// `every_key.toml` (in a table that reaches the read) and to `docs.rs`.
    #[test]
    fn the_docs_and_the_reader_name_the_same_keys() {
        let (_, asked) = recording(|| super::super::parse(EVERY_KEY));
        let read: BTreeSet<&str> = asked.iter().map(|a| a.path.as_str()).collect();
        let documented: BTreeSet<&str> = docs::DOCS.iter().map(|d| d.path).collect();
        assert_eq!(docs::DOCS.len(), documented.len(), "a key documented twice");
        let undocumented: Vec<_> = read.difference(&documented).collect();
        let unread: Vec<_> = documented.difference(&read).collect();
        assert!(
            undocumented.is_empty() && unread.is_empty(),
            "read but not documented: {undocumented:?}; documented but not read: {unread:?}"
        );
        for a in &asked {
            let doc = docs::DOCS.iter().find(|d| d.path == a.path).unwrap();
            assert!(
                a.ty.is_some() || doc.ty.is_some(),
                "{}: neither the reader nor the docs say its type",
                a.path
            );
        }
    }

    /// Every key literal a config reader passes to `Fields` is in the reference, so a key read
    /// only in a branch `every_key.toml` does not reach fails too.
    #[test]
    fn every_key_in_the_readers_source_is_documented() {
        // Every reader in config/, including ones added later.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config");
        let sources: Vec<String> = std::fs::read_dir(&dir)
            .expect("src/config")
            .map(|e| e.expect("an entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .map(|p| std::fs::read_to_string(p).expect("a source file"))
            .collect();
        assert!(
            sources.iter().any(|s| s.contains("fn read_check")),
            "{dir:?}"
        );
        let keys: BTreeSet<&str> = docs::DOCS
            .iter()
            .map(|d| d.path.rsplit('.').next().unwrap())
            .collect();
        let methods = [
            "str", "int", "int_in", "bool_or", "array", "table", "choice", "duration", "required",
            "has", "tables", "strings", "value",
        ];
        let mut missing = Vec::new();
        for source in &sources {
            // Only the readers, not their tests.
            let code = source.split("#[cfg(test)]").next().unwrap();
            for method in methods {
                let call = format!("f.{method}(");
                for (at, _) in code.match_indices(&call) {
                    // rustfmt may put the key on the next line.
                    let Some(rest) = code[at + call.len()..].trim_start().strip_prefix('"') else {
                        continue;
                    };
                    let key = &rest[..rest.find('"').unwrap()];
                    if !keys.contains(key) {
                        missing.push(key.to_owned());
                    }
                }
            }
        }
        assert!(
            missing.is_empty(),
            "keys read but not documented: {missing:?}"
        );
    }
}
