//! The configuration file edited in place: the runtime API's changes (a service put or
//! deleted, a backend put or deleted) applied to the file's own TOML document, so that every
//! comment, the key order and the layout of what a change does not touch stay as they were.
//! Pure: text in, text out. Whether the result is a valid configuration is for [`super::parse`]
//! to judge, as it judges a file written by hand.
//!
//! Bodies are JSON in the TOML's own shape: a service as its `[[service]]` table would be
//! (`{"vip": "10.0.0.1:80", "backends": [{"address": "10.0.1.1:80"}], "check": {...}}`), a
//! backend as one entry of `backends` (`{"weight": 2}`). The name and the address come from
//! the request's path; given in the body too, they must agree.

use std::net::SocketAddr;

use serde::Deserialize;
use serde_json::Value as Json;
use toml_edit::{Array, ArrayOfTables, DocumentMut, InlineTable, Item, Table, Value};

use super::{ConfigErrors, Problem};

/// One change to the configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Change {
    /// Creates or replaces the service `service` (`create_only`: refused if it exists).
    PutService {
        service: String,
        body: Json,
        #[serde(default)]
        create_only: bool,
    },
    DeleteService {
        service: String,
    },
    /// Adds or replaces backend `backend` (IP:PORT) of service `service`.
    PutBackend {
        service: String,
        backend: String,
        #[serde(default = "empty_object")]
        body: Json,
        #[serde(default)]
        create_only: bool,
    },
    DeleteBackend {
        service: String,
        backend: String,
    },
}

fn empty_object() -> Json {
    Json::Object(Default::default())
}

impl Change {
    /// What it does, for events and logs.
    pub fn describe(&self) -> String {
        match self {
            Change::PutService { service, .. } => format!("service {service} put"),
            Change::DeleteService { service } => format!("service {service} deleted"),
            Change::PutBackend {
                service, backend, ..
            } => format!("backend {backend} of {service} put"),
            Change::DeleteBackend { service, backend } => {
                format!("backend {backend} of {service} deleted")
            }
        }
    }
}

/// Why a change could not be made to the document.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EditError {
    /// The service or backend it names is not there (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// It is there, and the change was to create it (HTTP 412).
    #[error("{0}")]
    Exists(String),
    /// The request itself is wrong (HTTP 400), every problem with its path.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
}

fn invalid(path: impl Into<String>, message: impl Into<String>) -> EditError {
    EditError::Invalid(vec![Problem {
        path: path.into(),
        message: message.into(),
    }])
}

/// A configuration file's TOML document, edited in place.
#[derive(Debug, Clone)]
pub struct Document(DocumentMut);

/// The order a new service's keys are written in (docs/operating.md's example); other keys follow, sorted.
const SERVICE_KEYS: [&str; 9] = [
    "name",
    "vip",
    "protocol",
    "forwarding",
    "snat_address",
    "existing_flows",
    "on_all_unhealthy",
    "answer_ping",
    "announce",
];

impl Document {
    /// Parses `text` as TOML (not yet as a configuration).
    pub fn parse(text: &str) -> Result<Self, ConfigErrors> {
        text.parse::<DocumentMut>().map(Self).map_err(|e| {
            let at = e.span().map_or(0, |s| s.start);
            ConfigErrors(vec![Problem {
                path: super::read::location(text, at),
                message: format!("invalid TOML: {}", e.message().trim_end()),
            }])
        })
    }

    /// The document as text.
    pub fn text(&self) -> String {
        self.0.to_string()
    }

    /// Makes `change` (nothing changes when it fails).
    pub fn apply(&mut self, change: &Change) -> Result<(), EditError> {
        match change {
            Change::PutService {
                service,
                body,
                create_only,
            } => self.put_service(service, body, *create_only),
            Change::DeleteService { service } => {
                let (services, i) = self.find_service(service)?;
                services.remove(i);
                if services.is_empty() {
                    self.0.remove("service");
                }
                Ok(())
            }
            Change::PutBackend {
                service,
                backend,
                body,
                create_only,
            } => self.put_backend(service, backend, body, *create_only),
            Change::DeleteBackend { service, backend } => {
                let address = parse_address(backend)?;
                let (services, i) = self.find_service(service)?;
                let table = services.get_mut(i).expect("found");
                let mut list = Backends::of(table, service)?;
                let at = list
                    .position(address)
                    .ok_or_else(|| no_backend(service, address))?;
                list.remove(at);
                Ok(())
            }
        }
    }

    /// The `[[service]]` tables and the index of the one named `name`.
    fn find_service(&mut self, name: &str) -> Result<(&mut ArrayOfTables, usize), EditError> {
        let services = self.services()?;
        let at = services
            .iter()
            .position(|t| t.get("name").and_then(Item::as_str) == Some(name))
            .ok_or_else(|| EditError::NotFound(format!("no service {name:?}")))?;
        Ok((services, at))
    }

    /// The `[[service]]` tables (made when there are none).
    fn services(&mut self) -> Result<&mut ArrayOfTables, EditError> {
        let item = self
            .0
            .entry("service")
            .or_insert_with(|| Item::ArrayOfTables(ArrayOfTables::new()));
        if item.is_array() {
            return Err(invalid(
                "service",
                "the file writes its services as an inline array; the runtime API edits \
                 `[[service]]` tables: write them so",
            ));
        }
        item.as_array_of_tables_mut()
            .ok_or_else(|| invalid("service", "expected `[[service]]` tables"))
    }

    fn put_service(&mut self, name: &str, body: &Json, create_only: bool) -> Result<(), EditError> {
        let table = service_table(name, body)?;
        let services = self.services()?;
        let existing = services
            .iter()
            .position(|t| t.get("name").and_then(Item::as_str) == Some(name));
        match existing {
            Some(_) if create_only => Err(EditError::Exists(format!(
                "service {name:?} exists already"
            ))),
            Some(i) => {
                let old = services.get_mut(i).expect("found");
                // The comments above its `[[service]]` line stay with it.
                let decor = old.decor().clone();
                *old = table;
                *old.decor_mut() = decor;
                Ok(())
            }
            None => {
                let mut table = table;
                table.decor_mut().set_prefix("\n");
                services.push(table);
                Ok(())
            }
        }
    }

    fn put_backend(
        &mut self,
        service: &str,
        backend: &str,
        body: &Json,
        create_only: bool,
    ) -> Result<(), EditError> {
        let address = parse_address(backend)?;
        let fields = backend_fields(address, body)?;
        let (services, i) = self.find_service(service)?;
        let table = services.get_mut(i).expect("found");
        let mut list = Backends::of(table, service)?;
        match list.position(address) {
            Some(_) if create_only => Err(EditError::Exists(format!(
                "service {service:?} has a backend {address} already"
            ))),
            Some(at) => {
                list.replace(at, &fields);
                Ok(())
            }
            None => {
                list.push(&fields);
                Ok(())
            }
        }
    }
}

/// A service's `backends`: an inline array of inline tables, or `[[service.backends]]` tables.
enum Backends<'a> {
    Inline(&'a mut Array),
    Tables(&'a mut ArrayOfTables),
}

impl<'a> Backends<'a> {
    fn of(service: &'a mut Table, name: &str) -> Result<Self, EditError> {
        let path = format!("service {name:?}.backends");
        let item = service
            .entry("backends")
            .or_insert_with(|| Item::Value(Value::Array(Array::new())));
        match item {
            Item::Value(Value::Array(a)) if a.iter().all(|v| v.is_inline_table()) => {
                Ok(Self::Inline(a))
            }
            Item::ArrayOfTables(t) => Ok(Self::Tables(t)),
            _ => Err(invalid(path, "expected an array of backend tables")),
        }
    }

    /// Where the backend at `address` is (addresses compared as addresses, not as text).
    fn position(&self, address: SocketAddr) -> Option<usize> {
        let same = |v: Option<&str>| v.and_then(|s| s.parse::<SocketAddr>().ok()) == Some(address);
        match self {
            Self::Inline(a) => a.iter().position(|v| {
                same(
                    v.as_inline_table()
                        .and_then(|t| t.get("address"))
                        .and_then(Value::as_str),
                )
            }),
            Self::Tables(t) => t
                .iter()
                .position(|t| same(t.get("address").and_then(Item::as_str))),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Inline(a) => a.len(),
            Self::Tables(t) => t.len(),
        }
    }

    fn remove(&mut self, at: usize) {
        match self {
            Self::Inline(a) => {
                with_trailing_comma(a);
                // A comment after an entry's comma is kept in the next entry's prefix (or the
                // array's trailing part): the removed entry's own goes with it, and the one of
                // the entry before it, which the removed entry held, stays.
                let prefix = prefix_of(a.get(at));
                a.remove(at);
                let (head, _) = split_line(&prefix);
                if let Some(next) = a.get_mut(at) {
                    let next_prefix = prefix_of(Some(next));
                    let joined = if next_prefix.contains('\n') || prefix.contains('\n') {
                        format!("{head}\n{}", split_line(&next_prefix).1)
                    } else if at == 0 {
                        prefix.clone()
                    } else {
                        next_prefix
                    };
                    next.decor_mut().set_prefix(joined);
                } else {
                    let trailing = a.trailing().as_str().unwrap_or_default().to_owned();
                    if trailing.contains('\n') {
                        a.set_trailing(format!("{head}\n{}", split_line(&trailing).1));
                    }
                }
                if a.is_empty() {
                    a.set_trailing("");
                    a.set_trailing_comma(false);
                }
            }
            Self::Tables(t) => {
                t.remove(at);
            }
        }
    }

    /// The entry at `at` made exactly `fields`, keeping the place and format of the keys it
    /// had.
    fn replace(&mut self, at: usize, fields: &[(String, Value)]) {
        match self {
            Self::Inline(a) => {
                let t = a
                    .get_mut(at)
                    .and_then(Value::as_inline_table_mut)
                    .expect("positions are of inline tables");
                let had = t.len();
                t.retain(|k, _| fields.iter().any(|(f, _)| f == k));
                if t.len() != had {
                    t.fmt();
                }
                for (key, value) in fields {
                    set_inline(t, key, value.clone());
                }
            }
            Self::Tables(list) => {
                let t = list.get_mut(at).expect("found");
                t.retain(|k, _| fields.iter().any(|(f, _)| f == k));
                for (key, value) in fields {
                    set_table(t, key, value.clone());
                }
            }
        }
    }

    /// A new entry with `fields`, formatted as the entries before it are.
    fn push(&mut self, fields: &[(String, Value)]) {
        match self {
            Self::Inline(a) => {
                let mut t = InlineTable::new();
                for (key, value) in fields {
                    t.insert(key, value.clone());
                }
                t.fmt();
                with_trailing_comma(a);
                let last = prefix_of(a.iter().last());
                let mut value = Value::InlineTable(t);
                if last.contains('\n') {
                    // One entry a line, indented as the last one; a comment after the last
                    // entry's comma (the array's trailing part) stays on that entry's line.
                    let trailing = a.trailing().as_str().unwrap_or_default().to_owned();
                    let (comment, close) = split_line(&trailing);
                    value
                        .decor_mut()
                        .set_prefix(format!("{comment}\n{}", split_line(&last).1));
                    value.decor_mut().set_suffix("");
                    a.push_formatted(value);
                    a.set_trailing(format!("\n{close}"));
                    a.set_trailing_comma(true);
                } else {
                    a.push(value);
                }
            }
            Self::Tables(list) => {
                let mut t = Table::new();
                for (key, value) in fields {
                    t.insert(key, Item::Value(value.clone()));
                }
                list.push(t);
            }
        }
    }
}

/// A multi-line array written with a comma after its last entry, so that whatever follows the
/// last entry (a comment on its line) is the array's trailing part, as after every other
/// entry's comma it is the next entry's prefix.
fn with_trailing_comma(a: &mut Array) {
    if a.trailing_comma() || !prefix_of(a.iter().last()).contains('\n') {
        return;
    }
    let Some(last) = a.iter_mut().last() else {
        return;
    };
    let suffix = last
        .decor()
        .suffix()
        .and_then(|s| s.as_str())
        .unwrap_or_default()
        .to_owned();
    last.decor_mut().set_suffix("");
    let trailing = a.trailing().as_str().unwrap_or_default().to_owned();
    a.set_trailing(format!("{suffix}{trailing}"));
    a.set_trailing_comma(true);
}

/// The whitespace and comments before an array entry.
fn prefix_of(v: Option<&Value>) -> String {
    v.and_then(|v| v.decor().prefix())
        .and_then(|p| p.as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Splits whitespace-and-comments at its last newline: what ends the line before (a comment),
/// and the indent after. Without a newline, all of it is indent.
fn split_line(text: &str) -> (&str, &str) {
    match text.rfind('\n') {
        Some(i) => (&text[..i], &text[i + 1..]),
        None => ("", text),
    }
}

/// Sets `key` in an inline table, keeping the spacing of the value it replaces; a new key
/// goes at the end, and the table is spaced as `{ a = 1, b = 2 }`.
fn set_inline(t: &mut InlineTable, key: &str, mut value: Value) {
    match t.get_mut(key) {
        Some(old) => {
            *value.decor_mut() = old.decor().clone();
            *old = value;
        }
        None => {
            t.insert(key, value);
            t.fmt();
        }
    }
}

/// Sets `key` in a table, keeping the spacing of the value it replaces.
fn set_table(t: &mut Table, key: &str, mut value: Value) {
    match t.get_mut(key).and_then(Item::as_value_mut) {
        Some(old) => {
            *value.decor_mut() = old.decor().clone();
            *old = value;
        }
        None => {
            t.insert(key, Item::Value(value));
        }
    }
}

fn parse_address(text: &str) -> Result<SocketAddr, EditError> {
    text.parse().map_err(|_| {
        invalid(
            "backend",
            format!("expected IPv4:PORT or [IPv6]:PORT, got {text:?}"),
        )
    })
}

fn no_backend(service: &str, address: SocketAddr) -> EditError {
    EditError::NotFound(format!("service {service:?} has no backend {address}"))
}

/// A backend body's fields, `address` first (from the path; the body's must agree).
fn backend_fields(address: SocketAddr, body: &Json) -> Result<Vec<(String, Value)>, EditError> {
    let Json::Object(map) = body else {
        return Err(invalid(
            "body",
            "expected a JSON object (the backend's fields)",
        ));
    };
    let mut problems = Vec::new();
    let mut fields = vec![("address".to_owned(), Value::from(address.to_string()))];
    for (key, json) in map {
        let path = format!("body.{key}");
        if key == "address" {
            match json.as_str().map(str::parse::<SocketAddr>) {
                Some(Ok(a)) if a == address => {}
                _ => problems.push(Problem {
                    path,
                    message: format!("{json} is not the address in the path ({address})"),
                }),
            }
            continue;
        }
        match to_value(json, &path) {
            Ok(v) => fields.push((key.clone(), v)),
            Err(p) => problems.extend(p),
        }
    }
    if problems.is_empty() {
        Ok(fields)
    } else {
        Err(EditError::Invalid(problems))
    }
}

/// `text` with every change of `changes` made, in order: all of them, or an error naming the
/// first that could not be made (with its index when there are several).
pub fn edited(text: &str, changes: &[Change]) -> Result<String, EditError> {
    let mut doc = Document::parse(text).map_err(|e| EditError::Invalid(e.0))?;
    for (i, change) in changes.iter().enumerate() {
        let at = |m: String| {
            if changes.len() > 1 {
                format!("changes[{i}]: {m}")
            } else {
                m
            }
        };
        doc.apply(change).map_err(|e| match e {
            EditError::NotFound(m) => EditError::NotFound(at(m)),
            EditError::Exists(m) => EditError::Exists(at(m)),
            EditError::Invalid(problems) => EditError::Invalid(
                problems
                    .into_iter()
                    .map(|p| Problem {
                        path: at(p.path),
                        message: p.message,
                    })
                    .collect(),
            ),
        })?;
    }
    Ok(doc.text())
}

/// A backend from DNS added to the document by [`with_discovered`]: where it went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub service: String,
    /// The service's index among the `[[service]]` tables, and the backend's in its list.
    pub at: (usize, usize),
    pub address: SocketAddr,
}

/// `text` with each service's backends from DNS (`found`: by service name) written after the
/// backends the file has, as if written by hand, so that they are validated as those are.
/// An address the service has already is left out; so is a service the file no longer has.
pub fn with_discovered(
    text: &str,
    found: &[(String, Vec<super::Backend>)],
) -> Result<(String, Vec<Appended>), ConfigErrors> {
    let mut doc = Document::parse(text)?;
    let mut appended = Vec::new();
    for (service, backends) in found {
        let Ok((services, i)) = doc.find_service(service) else {
            continue;
        };
        let table = services.get_mut(i).expect("found");
        let Ok(mut list) = Backends::of(table, service) else {
            continue;
        };
        for b in backends {
            if list.position(b.address).is_some() {
                continue;
            }
            let fields = [
                ("address".to_owned(), Value::from(b.address.to_string())),
                ("weight".to_owned(), Value::from(i64::from(b.weight))),
            ];
            list.push(&fields);
            appended.push(Appended {
                service: service.clone(),
                at: (i, list.len() - 1),
                address: b.address,
            });
        }
    }
    Ok((doc.text(), appended))
}

/// `text` with `lb.api_token`'s value (if any) replaced by `<redacted>`, the rest as it was.
pub fn redacted(text: &str) -> String {
    let Ok(mut doc) = text.parse::<DocumentMut>() else {
        return String::new();
    };
    if let Some(token) = doc
        .get_mut("lb")
        .and_then(Item::as_table_like_mut)
        .and_then(|lb| lb.get_mut("api_token"))
        .and_then(Item::as_value_mut)
    {
        let decor = token.decor().clone();
        *token = Value::from("<redacted>");
        *token.decor_mut() = decor;
    }
    doc.to_string()
}

/// A `[[service]]` table from a service body, its keys in docs/operating.md's order: scalars and
/// arrays first (`backends` as an inline array, one entry a line), then objects as
/// `[service.KEY]` tables.
fn service_table(name: &str, body: &Json) -> Result<Table, EditError> {
    let Json::Object(map) = body else {
        return Err(invalid(
            "body",
            "expected a JSON object (the service's table)",
        ));
    };
    let mut problems = Vec::new();
    if let Some(given) = map.get("name")
        && given.as_str() != Some(name)
    {
        problems.push(Problem {
            path: "body.name".to_owned(),
            message: format!("{given} is not the name in the path ({name:?})"),
        });
    }
    let rank = |k: &str| {
        SERVICE_KEYS
            .iter()
            .position(|s| *s == k)
            .unwrap_or(usize::MAX)
    };
    let mut keys: Vec<&String> = map.keys().filter(|k| *k != "name").collect();
    keys.sort_by(|a, b| rank(a).cmp(&rank(b)).then(a.cmp(b)));
    let mut table = Table::new();
    table.insert("name", Item::Value(Value::from(name)));
    let mut subtables = Vec::new();
    for key in keys {
        let json = &map[key.as_str()];
        let path = format!("body.{key}");
        match json {
            Json::Object(_) => match to_value(json, &path) {
                Ok(Value::InlineTable(t)) => {
                    let mut sub = t.into_table();
                    sub.fmt();
                    subtables.push((key.clone(), sub));
                }
                Ok(_) => unreachable!("objects convert to inline tables"),
                Err(p) => problems.extend(p),
            },
            Json::Array(items) if key == "backends" => match to_value(json, &path) {
                Ok(Value::Array(mut a)) => {
                    for v in a.iter_mut() {
                        v.decor_mut().set_prefix("\n    ");
                        v.decor_mut().set_suffix("");
                    }
                    a.set_trailing_comma(!items.is_empty());
                    a.set_trailing(if items.is_empty() { "" } else { "\n" });
                    table.insert(key, Item::Value(Value::Array(a)));
                }
                Ok(_) => unreachable!("arrays convert to arrays"),
                Err(p) => problems.extend(p),
            },
            _ => match to_value(json, &path) {
                Ok(v) => {
                    table.insert(key, Item::Value(v));
                }
                Err(p) => problems.extend(p),
            },
        }
    }
    if !problems.is_empty() {
        return Err(EditError::Invalid(problems));
    }
    for (key, sub) in subtables {
        table.insert(&key, Item::Table(sub));
    }
    Ok(table)
}

/// A JSON value as a TOML value: objects become inline tables; null has no TOML form.
fn to_value(json: &Json, path: &str) -> Result<Value, Vec<Problem>> {
    let problem = |message: &str| {
        vec![Problem {
            path: path.to_owned(),
            message: message.to_owned(),
        }]
    };
    Ok(match json {
        Json::Null => return Err(problem("null has no TOML form: leave the key out")),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(f)) if n.is_f64() => Value::from(f),
            _ => return Err(problem("a number beyond TOML's 64-bit integers")),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => {
            let mut a = Array::new();
            let mut problems = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match to_value(item, &format!("{path}[{i}]")) {
                    Ok(v) => a.push(v),
                    Err(p) => problems.extend(p),
                }
            }
            if !problems.is_empty() {
                return Err(problems);
            }
            Value::Array(a)
        }
        Json::Object(map) => {
            let mut t = InlineTable::new();
            let mut problems = Vec::new();
            // What names a table first (`kind` of a check, `address` of a backend).
            let first = |k: &str| !matches!(k, "name" | "kind" | "address");
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by_key(|k| (first(k), *k));
            for key in keys {
                let item = &map[key.as_str()];
                match to_value(item, &format!("{path}.{key}")) {
                    Ok(v) => {
                        t.insert(key, v);
                    }
                    Err(p) => problems.extend(p),
                }
            }
            if !problems.is_empty() {
                return Err(problems);
            }
            t.fmt();
            Value::InlineTable(t)
        }
    })
}

#[cfg(test)]
mod tests;
