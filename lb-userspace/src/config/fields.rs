//! A small reader over a parsed TOML table that records every problem with its path instead of
//! stopping at the first, and reports keys it was not asked about as unknown.

use std::cell::RefCell;

use super::asked::note;
pub use super::asked::{Asked, Ty};

use toml::{Table, Value};

/// One problem in a config file: where (`service[1].backends[0].address`) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Problems listed at most; the rest are counted in a last one (a file of a million broken
/// lines gets a readable answer).
pub const MAX_PROBLEMS: usize = 1000;

/// Collects problems; shared by every reader of one file.
#[derive(Debug, Default)]
pub struct Problems {
    listed: RefCell<Vec<Problem>>,
    more: std::cell::Cell<usize>,
}

impl Problems {
    pub fn push(&self, path: impl Into<String>, message: impl Into<String>) {
        let mut listed = self.listed.borrow_mut();
        if listed.len() < MAX_PROBLEMS {
            listed.push(Problem {
                path: path.into(),
                message: message.into(),
            });
        } else {
            self.more.set(self.more.get() + 1);
        }
    }

    pub fn into_vec(self) -> Vec<Problem> {
        let mut listed = self.listed.into_inner();
        if self.more.get() > 0 {
            listed.push(Problem {
                path: "file".to_owned(),
                message: format!(
                    "{} more problems not listed (the first {MAX_PROBLEMS} are)",
                    self.more.get()
                ),
            });
        }
        listed
    }
}

pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// A key as the file wrote it, for a path: bare when it is a plain word, else quoted with escapes
/// (and cut when long), so a key holding a newline, NUL or a megabyte stays one short line.
pub fn file_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key.len() <= 64
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_owned()
    } else {
        format!("{:?}", Shown(key))
    }
}

/// Reads the keys of one table. Call [`Fields::finish`] after the last read to report unknown keys.
pub struct Fields<'a> {
    table: &'a Table,
    path: String,
    problems: &'a Problems,
    seen: RefCell<Vec<&'static str>>,
}

impl<'a> Fields<'a> {
    pub fn new(table: &'a Table, path: impl Into<String>, problems: &'a Problems) -> Self {
        Self {
            table,
            path: path.into(),
            problems,
            seen: RefCell::default(),
        }
    }

    pub fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub fn problem(&self, key: &str, message: impl Into<String>) {
        self.problems.push(self.path(key), message);
    }

    fn get(&self, key: &'static str) -> Option<&'a Value> {
        self.seen.borrow_mut().push(key);
        self.note(key, || (None, None, None));
        self.table.get(key)
    }

    /// Tells a recording (see [`super::asked`]) what this read asks of `key`: its type,
    /// default and range, made only while recording (reads of a real file pay nothing).
    fn note(&self, key: &str, what: impl FnOnce() -> (Option<Ty>, Option<String>, Option<String>)) {
        note(|| {
            let (ty, default, range) = what();
            Asked {
                path: self.path(key),
                ty,
                default,
                range,
                required: false,
            }
        });
    }

    fn typed<T>(
        &self,
        key: &'static str,
        what: &str,
        conv: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Option<T> {
        let value = self.get(key)?;
        let out = conv(value);
        if out.is_none() {
            self.problem(key, format!("expected {what}, got {}", value.type_str()));
        }
        out
    }

    /// The raw value of `key`, of whatever type (the caller reports a wrong one).
    pub fn value(&self, key: &'static str) -> Option<&'a Value> {
        self.get(key)
    }

    pub fn str(&self, key: &'static str) -> Option<&'a str> {
        self.note(key, || (Some(Ty::String), None, None));
        self.typed(key, "a string", Value::as_str)
    }

    pub fn int(&self, key: &'static str) -> Option<i64> {
        self.note(key, || (Some(Ty::Integer), None, None));
        self.typed(key, "an integer", Value::as_integer)
    }

    /// A boolean; `default` when absent.
    pub fn bool_or(&self, key: &'static str, default: bool) -> Option<bool> {
        self.note(key, || (Some(Ty::Boolean), Some(default.to_string()), None));
        match self.typed(key, "a boolean", Value::as_bool) {
            None => (!self.table.contains_key(key)).then_some(default),
            b => b,
        }
    }

    pub fn array(&self, key: &'static str) -> Option<&'a Vec<Value>> {
        self.note(key, || (Some(Ty::Array), None, None));
        self.typed(key, "an array", Value::as_array)
    }

    pub fn table(&self, key: &'static str) -> Option<&'a Table> {
        self.note(key, || (Some(Ty::Table), None, None));
        self.typed(key, "a table", Value::as_table)
    }

    /// One of `options` by name; `default` when absent.
    pub fn choice<T: Copy + PartialEq>(
        &self,
        key: &'static str,
        options: &[(&'static str, T)],
        default: T,
    ) -> Option<T> {
        self.note(key, || {
            let names = options.iter().map(|(n, _)| *n).collect();
            let default = options.iter().find(|(_, o)| *o == default);
            (
                Some(Ty::OneOf(names)),
                default.map(|(n, _)| (*n).to_owned()),
                None,
            )
        });
        let Some(name) = self.str(key) else {
            return (!self.table.contains_key(key)).then_some(default);
        };
        let found = options.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        if found.is_none() {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            self.problem(
                key,
                format!(
                    "expected one of {}, got {:?}",
                    names.join(", "),
                    Shown(name)
                ),
            );
        }
        found
    }

    /// An integer in `range`; `default` when absent.
    pub fn int_in(
        &self,
        key: &'static str,
        range: std::ops::RangeInclusive<i64>,
        default: i64,
    ) -> Option<i64> {
        self.note(key, || {
            let range = format!("{}-{}", range.start(), range.end());
            (Some(Ty::Integer), Some(default.to_string()), Some(range))
        });
        match self.int(key) {
            None => (!self.table.contains_key(key)).then_some(default),
            Some(v) if range.contains(&v) => Some(v),
            Some(v) => {
                self.problem(
                    key,
                    format!("{v} is out of range {}-{}", range.start(), range.end()),
                );
                None
            }
        }
    }

    /// A duration like `500ms`, `2s`, `15m`, `1h` in `range`; `default` when absent.
    pub fn duration(
        &self,
        key: &'static str,
        range: std::ops::RangeInclusive<std::time::Duration>,
        default: std::time::Duration,
    ) -> Option<std::time::Duration> {
        self.note(key, || {
            let range = format!("{}-{}", show(*range.start()), show(*range.end()));
            (Some(Ty::Duration), Some(show(default)), Some(range))
        });
        let Some(text) = self.str(key) else {
            return (!self.table.contains_key(key)).then_some(default);
        };
        match parse_duration(text) {
            Some(d) if range.contains(&d) => Some(d),
            None if split_duration(text).is_none() => {
                self.problem(
                    key,
                    format!(
                        "expected a duration like \"500ms\", \"2s\", \"15m\", got {:?}",
                        Shown(text)
                    ),
                );
                None
            }
            // Outside the range, or written like a duration but too long for one.
            _ => {
                self.problem(
                    key,
                    format!(
                        "{} is out of range {}-{}",
                        Shown(text),
                        show(*range.start()),
                        show(*range.end())
                    ),
                );
                None
            }
        }
    }

    /// A required key: reports it missing.
    pub fn required<T>(
        &self,
        key: &'static str,
        read: impl FnOnce(&Self) -> Option<T>,
    ) -> Option<T> {
        note(|| Asked {
            required: true,
            ..Asked::of(self.path(key))
        });
        if !self.table.contains_key(key) {
            self.seen.borrow_mut().push(key);
            self.problem(key, "missing");
            return None;
        }
        read(self)
    }

    /// Whether the table has `key` (marks it as known).
    pub fn has(&self, key: &'static str) -> bool {
        self.seen.borrow_mut().push(key);
        self.note(key, || (None, None, None));
        self.table.contains_key(key)
    }

    pub fn problems(&self) -> &'a Problems {
        self.problems
    }

    /// Each element of an array of tables, with its index (its path is `key[i]`).
    pub fn tables(&self, key: &'static str) -> Vec<(usize, &'a Table)> {
        self.note(key, || (Some(Ty::Tables), None, None));
        self.items(key, "a table", Value::as_table)
    }

    /// Each element of an array of strings, with its index.
    pub fn strings(&self, key: &'static str) -> Vec<(usize, &'a str)> {
        self.note(key, || (Some(Ty::Strings), None, None));
        self.items(key, "a string", Value::as_str)
    }

    /// The elements of an array that `conv` accepts; the others are reported at `key[i]`.
    fn items<T>(
        &self,
        key: &'static str,
        what: &str,
        conv: impl Fn(&'a Value) -> Option<T>,
    ) -> Vec<(usize, T)> {
        let Some(items) = self.array(key) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match conv(item) {
                Some(v) => out.push((i, v)),
                None => self.problems.push(
                    format!("{}[{i}]", self.path(key)),
                    format!("expected {what}, got {}", item.type_str()),
                ),
            }
        }
        out
    }

    /// Reports every key of the table that no read asked for.
    pub fn finish(&self) {
        let seen = self.seen.borrow();
        for key in self.table.keys() {
            if !seen.contains(&key.as_str()) {
                self.problems
                    .push(join(&self.path, &file_key(key)), "unknown key");
            }
        }
    }
}

/// `500ms`, `2s`, `1.5s`, `15m`, `1h`, `7d`: decimal digits with at most one point, then a unit.
/// Exact (no floating point) and checked: anything that does not fit a `Duration` is `None`.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let (whole, fraction, unit_ns) = split_duration(text)?;
    // Digits only (see split_duration), so each step is a checked multiply-add; a fraction
    // finer than a nanosecond is dropped.
    let digits = |s: &str| -> Option<u128> {
        s.bytes().try_fold(0u128, |n, d| {
            n.checked_mul(10)?.checked_add(u128::from(d - b'0'))
        })
    };
    let mut nanos = digits(whole)?.checked_mul(unit_ns)?;
    let mut scale = unit_ns;
    for d in fraction.bytes() {
        scale /= 10;
        nanos = nanos.checked_add(u128::from(d - b'0') * scale)?;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(std::time::Duration::new(
        secs,
        (nanos % 1_000_000_000) as u32,
    ))
}

/// A duration's parts if it is written like one, whatever its size: (whole digits, fraction
/// digits, nanoseconds per unit).
fn split_duration(text: &str) -> Option<(&str, &str, u128)> {
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (number, unit) = text.split_at(split);
    let unit_ns: u128 = match unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return None;
    }
    Some((whole, fraction, unit_ns))
}

/// A duration the way the config writes it.
pub fn show(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".to_owned()
    } else if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else {
        format!("{}s", ms / 1000)
    }
}
/// A string as it goes into a message: cut after 64 characters, so a megabyte of input does not
/// become a megabyte of error.
pub(crate) struct Shown<'a>(pub &'a str);

impl Shown<'_> {
    const MAX: usize = 64;

    /// The shown part, and whether it was cut.
    fn part(&self) -> (&str, bool) {
        match self.0.char_indices().nth(Self::MAX) {
            None => (self.0, false),
            Some((cut, _)) => (&self.0[..cut], true),
        }
    }
}

/// Quoted, with escapes.
impl std::fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.part() {
            (all, false) => write!(f, "{all:?}"),
            (part, true) => write!(f, "{part:?}... ({} bytes)", self.0.len()),
        }
    }
}

/// As is but with control characters escaped.
impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (part, cut) = self.part();
        write!(f, "{}", part.escape_debug())?;
        if cut {
            write!(f, "... ({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}
