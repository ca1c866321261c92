//! A recording of what the config reader asks for: every key it reads, with the type, default and
//! range its read carries. The configuration reference and JSON Schema are made from a recording
//! of reading a file with every key (see `reference`), so they cannot name a key the reader does
//! not read, nor miss one it does. Off unless [`recording`] runs: reading a file records nothing.

use std::cell::RefCell;

/// The shape of a value, as the reader's method asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ty {
    String,
    Integer,
    Boolean,
    /// A string like `500ms`, `2s`, `15m`, `1h`, `7d`.
    Duration,
    Array,
    Strings,
    Table,
    /// An array of tables (`[[service]]`).
    Tables,
    OneOf(Vec<&'static str>),
    /// The shapes below the reader takes as a raw value; only the reference's docs name them.
    StringOrStrings,
    StringMap,
    /// Status codes and `"FIRST-LAST"` ranges.
    Codes,
}

impl Ty {
    /// How much a read says about the value: `choice` reads a string and then names the
    /// options, `tables` reads an array and then says what of, `has` says nothing.
    fn rank(ty: &Option<Ty>) -> u8 {
        match ty {
            None => 0,
            Some(Ty::String | Ty::Integer | Ty::Array) => 1,
            Some(_) => 2,
        }
    }
}

/// One read of one key (or, after [`merged`], everything the reads of that key said).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    /// The key's path with array indices dropped: `service.backends.address`.
    pub path: String,
    pub ty: Option<Ty>,
    pub default: Option<String>,
    /// `FIRST-LAST`, as the reader's problems write it.
    pub range: Option<String>,
    pub required: bool,
}

impl Asked {
    pub fn of(path: String) -> Self {
        Self {
            path,
            ty: None,
            default: None,
            range: None,
            required: false,
        }
    }
}

thread_local! {
    static RECORD: RefCell<Option<Vec<Asked>>> = const { RefCell::new(None) };
}

/// Runs `read` and returns what it asked, merged per key in the order first asked.
pub fn recording<T>(read: impl FnOnce() -> T) -> (T, Vec<Asked>) {
    RECORD.with(|r| *r.borrow_mut() = Some(Vec::new()));
    let out = read();
    let asked = RECORD.with(|r| r.borrow_mut().take()).unwrap_or_default();
    (out, merged(asked))
}

/// Records one read, when recording; `asked` runs only then.
pub fn note(asked: impl FnOnce() -> Asked) {
    RECORD.with(|r| {
        if let Some(list) = r.borrow_mut().as_mut() {
            list.push(asked());
        }
    });
}

/// `service[1].backends[0].address` → `service.backends.address`.
fn without_indices(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => in_index = true,
            ']' => in_index = false,
            c if !in_index => out.push(c),
            _ => {}
        }
    }
    out
}

/// One entry per key. Required means required wherever it was asked: `backends` is, except in
/// a service with `backends_from`.
fn merged(asked: Vec<Asked>) -> Vec<Asked> {
    let required: std::collections::HashSet<String> = asked
        .iter()
        .filter(|a| a.required)
        .map(|a| a.path.clone())
        .collect();
    let mut out: Vec<Asked> = Vec::new();
    for mut a in asked {
        a.required = required.contains(&a.path);
        a.path = without_indices(&a.path);
        let Some(m) = out.iter_mut().find(|m| m.path == a.path) else {
            out.push(a);
            continue;
        };
        if Ty::rank(&a.ty) > Ty::rank(&m.ty) {
            m.ty = a.ty;
        }
        m.default = m.default.take().or(a.default);
        m.range = m.range.take().or(a.range);
        m.required &= a.required;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_merge_per_key_without_indices() {
        let (_, asked) = recording(|| {
            note(|| Asked::of("service[3].backends[12].address".into()));
            note(|| Asked {
                ty: Some(Ty::String),
                ..Asked::of("service[0].protocol".into())
            });
            note(|| Asked {
                ty: Some(Ty::OneOf(vec!["tcp", "udp"])),
                default: Some("tcp".into()),
                required: true,
                ..Asked::of("service[1].protocol".into())
            });
            for i in 0..2 {
                note(|| Asked::of(format!("service[{i}].name")));
                note(|| Asked {
                    required: true,
                    ..Asked::of(format!("service[{i}].name"))
                });
            }
        });
        assert_eq!(asked.len(), 3);
        assert_eq!(asked[0].path, "service.backends.address");
        assert_eq!(asked[1].ty, Some(Ty::OneOf(vec!["tcp", "udp"])));
        assert_eq!(asked[1].default.as_deref(), Some("tcp"));
        // Required in service[1], not in service[0]: not required.
        assert!(!asked[1].required);
        assert!(asked[2].required);
        // Not recording: nothing is kept, nothing leaks into the next recording.
        note(|| Asked::of("lb.api".into()));
        assert!(recording(|| ()).1.is_empty());
    }
}
