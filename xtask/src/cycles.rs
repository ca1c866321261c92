//! `cargo xtask cycles`: fails when modules of a crate import each other in a cycle.
//!
//! Every `crate::...` and `super::...` path of a `src/` tree (in `use` and `pub use`, grouped
//! imports expanded, and inline in code) is resolved to the deepest module file it names. At every
//! folder level the sibling modules then form a graph: an edge a → b when something inside a
//! names something inside b (a parent naming its child, or a child its parent, is no edge). Each
//! strongly connected component of more than one module is a cycle. Comments and string literals
//! are skipped; inline modules (`mod tests { ... }`) belong to their file's module.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    path::Path,
};

use anyhow::{Context as _, bail};

/// The crates checked, by folder under the workspace root.
const CRATES: &[&str] = &["lb-userspace", "lb-ebpf", "lb-common"];

/// Checks every crate of [`CRATES`], prints the cycles found and fails if there is one.
pub(crate) fn check(root: &Path) -> anyhow::Result<()> {
    let mut found = 0;
    for krate in CRATES {
        let sources = read_tree(&root.join(krate).join("src"))?;
        let cycles = find_cycles(&sources);
        print!("{}", report(krate, &cycles));
        found += cycles.len();
    }
    if found > 0 {
        bail!("{found} import cycle(s)");
    }
    println!("no import cycles in {}", CRATES.join(", "));
    Ok(())
}

/// One `.rs` file of a `src/` tree: its path below `src/` (`/`-separated) and its text.
pub(crate) struct Source {
    pub(crate) path: String,
    pub(crate) text: String,
}

/// A module by its path below the crate root (`[]` is the root).
type Module = Vec<String>;

/// One place where a module names another: file below `src/`, line, path as written (a grouped
/// import expanded to the one path).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Use {
    file: String,
    line: usize,
    path: String,
}

/// Edges between sibling modules, with every use behind each.
type Graph = BTreeMap<(Module, Module), Vec<Use>>;

/// A strongly connected component of sibling modules and its edges.
#[derive(Debug)]
pub(crate) struct Cycle {
    members: Vec<Module>,
    edges: Vec<(Module, Module, Vec<Use>)>,
}

/// The `.rs` files below `src`, sorted by path.
fn read_tree(src: &Path) -> anyhow::Result<Vec<Source>> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(src)?;
                let rel: Vec<_> = rel.iter().map(|c| c.to_string_lossy()).collect();
                let text = fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                out.push(Source {
                    path: rel.join("/"),
                    text,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The module a file is: `lib.rs`/`main.rs` the root, `x.rs` and `x/mod.rs` module `x`.
fn module_of(path: &str) -> Module {
    if path == "lib.rs" || path == "main.rs" {
        return Vec::new();
    }
    let stem = path.strip_suffix(".rs").unwrap_or(path);
    let mut segs: Module = stem.split('/').map(String::from).collect();
    if segs.last().is_some_and(|s| s == "mod") {
        segs.pop();
    }
    segs
}

/// The cycles of a crate given its files, sorted.
pub(crate) fn find_cycles(sources: &[Source]) -> Vec<Cycle> {
    let graph = sibling_graph(sources);
    let mut cycles: Vec<Cycle> = strong_components(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|mut members| {
            members.sort();
            let edges = graph
                .iter()
                .filter(|((a, b), _)| members.contains(a) && members.contains(b))
                .map(|((a, b), uses)| (a.clone(), b.clone(), uses.clone()))
                .collect();
            Cycle { members, edges }
        })
        .collect();
    cycles.sort_by(|a, b| a.members.cmp(&b.members));
    cycles
}

/// What `cargo xtask cycles` prints for one crate's cycles (nothing when there is none).
pub(crate) fn report(krate: &str, cycles: &[Cycle]) -> String {
    let name = |m: &Module| m.join("::");
    let mut out = String::new();
    for cycle in cycles {
        let members: Vec<_> = cycle.members.iter().map(name).collect();
        let _ = writeln!(out, "{krate}: cycle {}", members.join(" <-> "));
        for (a, b, uses) in &cycle.edges {
            let (first, rest) = uses.split_first().expect("an edge has a use");
            let _ = writeln!(
                out,
                "    {} -> {} ({}:{} {})",
                name(a),
                name(b),
                first.file,
                first.line,
                first.path
            );
            for u in rest {
                let _ = writeln!(out, "        also {}:{} {}", u.file, u.line, u.path);
            }
        }
    }
    out
}

/// The edges between sibling modules at every folder level.
fn sibling_graph(sources: &[Source]) -> Graph {
    let modules: BTreeSet<Module> = sources.iter().map(|s| module_of(&s.path)).collect();
    let mut graph = Graph::new();
    for source in sources {
        let from = module_of(&source.path);
        for (to, use_) in references(&source.path, &from, &source.text, &modules) {
            // The level where the two diverge; none when one contains the other.
            let level = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if level < from.len() && level < to.len() {
                let key = (from[..=level].to_vec(), to[..=level].to_vec());
                graph.entry(key).or_default().push(use_);
            }
        }
    }
    graph
}

/// Every `crate::`/`super::` path of a file, as the deepest existing module it names and where.
fn references(
    file: &str,
    module: &[String],
    text: &str,
    modules: &BTreeSet<Module>,
) -> Vec<(Module, Use)> {
    let toks = tokenize(text);
    let mut out = Vec::new();
    // Inline modules (`mod tests { ... }`) open here, with the brace depth inside each: `super`
    // within them counts from them.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    for (i, t) in toks.iter().enumerate() {
        match &t.tok {
            Tok::Open => depth += 1,
            Tok::Close => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(w) if w == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Open)) =
                    (tok(&toks, i + 1), tok(&toks, i + 2))
                {
                    inline.push((name.clone(), depth + 1));
                }
            }
            // The start of a path (`super` after `::` is inside one).
            Tok::Ident(w)
                if (w == "crate" || w == "super")
                    && !matches!(i.checked_sub(1).map(|p| &toks[p].tok), Some(Tok::PathSep)) =>
            {
                let scope: Module = module
                    .iter()
                    .cloned()
                    .chain(inline.iter().map(|(n, _)| n.clone()))
                    .collect();
                let mut paths = Vec::new();
                tree(&toks, i, Vec::new(), t.line, &mut paths);
                for (written, line) in paths {
                    let target = deepest(modules, &absolute(&scope, &written));
                    if target != module {
                        let use_ = Use {
                            file: file.to_string(),
                            line,
                            path: written.join("::"),
                        };
                        out.push((target, use_));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Parses the path or use tree starting at `toks[i]` below `path`, pushing every full path it
/// names (a group `a::{b, c::d}` gives `a::b` and `a::c::d`); returns the index after it.
fn tree(
    toks: &[Token],
    mut i: usize,
    mut path: Vec<String>,
    mut line: usize,
    out: &mut Vec<(Vec<String>, usize)>,
) -> usize {
    loop {
        match tok(toks, i) {
            Some(Tok::Ident(w)) => {
                if w != "self" {
                    path.push(w.clone());
                }
                line = toks[i].line;
                i += 1;
            }
            Some(Tok::Open) => {
                i += 1;
                loop {
                    match tok(toks, i) {
                        Some(Tok::Close) => return i + 1,
                        None => return i,
                        Some(Tok::Ident(_) | Tok::Open | Tok::Star) => {
                            i = tree(toks, i, path.clone(), line, out);
                        }
                        // Commas, and anything unexpected: step over it.
                        Some(_) => i += 1,
                    }
                }
            }
            Some(Tok::Star) => {
                path.push("*".to_string());
                i += 1;
                break;
            }
            _ => break,
        }
        if tok(toks, i) == Some(&Tok::PathSep) {
            i += 1;
        } else {
            break;
        }
    }
    if matches!(tok(toks, i), Some(Tok::Ident(w)) if w == "as") {
        i += 2;
    }
    out.push((path, line));
    i
}

/// A written path made absolute: `crate::` from the root, each `super::` one level up from
/// `scope` (the file's module and the inline modules around the path).
fn absolute(scope: &[String], written: &[String]) -> Module {
    let mut segs = written.iter().peekable();
    let mut abs = match segs.next().map(String::as_str) {
        Some("super") => {
            let mut abs = scope.to_vec();
            abs.pop();
            while segs.next_if(|s| *s == "super").is_some() {
                abs.pop();
            }
            abs
        }
        _ => Vec::new(),
    };
    abs.extend(segs.cloned());
    abs
}

/// The deepest module of `modules` that `path` starts with (the root if none).
fn deepest(modules: &BTreeSet<Module>, path: &[String]) -> Module {
    (0..=path.len())
        .rev()
        .map(|n| &path[..n])
        .find(|p| modules.contains(*p))
        .unwrap_or(&[])
        .to_vec()
}

/// Tarjan's strongly connected components of the graph's nodes.
fn strong_components(graph: &Graph) -> Vec<Vec<Module>> {
    let mut next: BTreeMap<&Module, Vec<&Module>> = BTreeMap::new();
    for (a, b) in graph.keys() {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    let mut tarjan = Tarjan {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in next.keys() {
        if !tarjan.index.contains_key(v) {
            tarjan.visit(v);
        }
    }
    tarjan.out
}

struct Tarjan<'a> {
    next: &'a BTreeMap<&'a Module, Vec<&'a Module>>,
    index: BTreeMap<&'a Module, usize>,
    low: BTreeMap<&'a Module, usize>,
    stack: Vec<&'a Module>,
    on_stack: BTreeSet<&'a Module>,
    out: Vec<Vec<Module>>,
}

impl<'a> Tarjan<'a> {
    fn visit(&mut self, v: &'a Module) {
        let n = self.index.len();
        self.index.insert(v, n);
        self.low.insert(v, n);
        self.stack.push(v);
        self.on_stack.insert(v);
        let next = self.next;
        for &w in &next[v] {
            if !self.index.contains_key(w) {
                self.visit(w);
                let low = self.low[v].min(self.low[w]);
                self.low.insert(v, low);
            } else if self.on_stack.contains(w) {
                let low = self.low[v].min(self.index[w]);
                self.low.insert(v, low);
            }
        }
        if self.low[v] == self.index[v] {
            let mut component = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            self.out.push(component);
        }
    }
}

/// What the scan needs of Rust's tokens; comments, strings and char literals are dropped.
#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Star,
    Other,
}

#[derive(Debug)]
struct Token {
    tok: Tok,
    line: usize,
}

fn tok(toks: &[Token], i: usize) -> Option<&Tok> {
    toks.get(i).map(|t| &t.tok)
}

fn tokenize(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while let Some(c) = at(i) {
        let start_line = line;
        let mut push = |tok| {
            out.push(Token {
                tok,
                line: start_line,
            })
        };
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            '/' if at(i + 1) == Some('/') => {
                while at(i).is_some_and(|c| c != '\n') {
                    i += 1;
                }
            }
            '/' if at(i + 1) == Some('*') => {
                // Block comments nest.
                let mut depth = 0;
                while let Some(c) = at(i) {
                    if c == '/' && at(i + 1) == Some('*') {
                        depth += 1;
                        i += 2;
                    } else if c == '*' && at(i + 1) == Some('/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        if c == '\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                }
            }
            '"' => i = skip_string(&chars, i + 1, &mut line),
            '\'' => i = skip_char_or_lifetime(&chars, i),
            c if c == '_' || c.is_alphabetic() => {
                let start = i;
                while at(i).is_some_and(|c| c == '_' || c.is_alphanumeric()) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                match (word.as_str(), at(i)) {
                    ("b" | "c", Some('"')) => i = skip_string(&chars, i + 1, &mut line),
                    ("b", Some('\'')) => i = skip_char_or_lifetime(&chars, i),
                    ("r" | "br" | "cr", Some('"' | '#')) => {
                        let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
                        if at(i + hashes) == Some('"') {
                            i = skip_raw_string(&chars, i + hashes + 1, hashes, &mut line);
                        } else {
                            // A raw identifier (`r#type`): the identifier follows.
                            push(Tok::Other);
                            i += hashes;
                        }
                    }
                    _ => push(Tok::Ident(word)),
                }
            }
            c if c.is_ascii_digit() => {
                while at(i).is_some_and(|c| c == '_' || c.is_alphanumeric()) {
                    i += 1;
                }
                push(Tok::Other);
            }
            ':' if at(i + 1) == Some(':') => {
                push(Tok::PathSep);
                i += 2;
            }
            _ => {
                push(match c {
                    '{' => Tok::Open,
                    '}' => Tok::Close,
                    ',' => Tok::Comma,
                    '*' => Tok::Star,
                    _ => Tok::Other,
                });
                i += 1;
            }
        }
    }
    out
}

/// Skips a string's body from just after its opening quote; returns the index after it.
fn skip_string(chars: &[char], mut i: usize, line: &mut usize) -> usize {
    while let Some(&c) = chars.get(i) {
        match c {
            '\\' => {
                if chars.get(i + 1) == Some(&'\n') {
                    *line += 1;
                }
                i += 2;
            }
            '"' => return i + 1,
            _ => {
                if c == '\n' {
                    *line += 1;
                }
                i += 1;
            }
        }
    }
    i
}

/// Skips a raw string's body (`"` then `hashes` times `#` closes it).
fn skip_raw_string(chars: &[char], mut i: usize, hashes: usize, line: &mut usize) -> usize {
    while let Some(&c) = chars.get(i) {
        if c == '"'
            && chars[i + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == '#')
                .count()
                == hashes
        {
            return i + 1 + hashes;
        }
        if c == '\n' {
            *line += 1;
        }
        i += 1;
    }
    i
}

/// At a `'`: skips a char literal (`'a'`, `'\n'`, `'\''`, `'\u{1F600}'`), or only the quote of a
/// lifetime or label (`'a`), whose name is then an identifier like any other.
fn skip_char_or_lifetime(chars: &[char], i: usize) -> usize {
    match chars.get(i + 1) {
        Some('\\') => {
            let mut j = i + 3;
            while chars.get(j).is_some_and(|&c| c != '\'' && c != '\n') {
                j += 1;
            }
            j + 1
        }
        Some(_) if chars.get(i + 2) == Some(&'\'') => i + 3,
        _ => i + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(files: &[(&str, &str)]) -> Vec<Source> {
        files
            .iter()
            .map(|(path, text)| Source {
                path: path.to_string(),
                text: text.to_string(),
            })
            .collect()
    }

    fn module(path: &str) -> Module {
        path.split("::")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    }

    /// The sibling edges as `a -> b` strings.
    fn edges(files: &[(&str, &str)]) -> Vec<String> {
        sibling_graph(&sources(files))
            .keys()
            .map(|(a, b)| format!("{} -> {}", a.join("::"), b.join("::")))
            .collect()
    }

    #[test]
    fn a_cycle_is_reported_with_its_edges() {
        let files = [
            ("lib.rs", "mod api;\nmod daemon;\nmod model;\n"),
            (
                "api/mod.rs",
                "//! The API.\nuse crate::model::View;\n\nfn f(s: &crate::daemon::Shared) {}\n",
            ),
            (
                "daemon/mod.rs",
                "mod state;\nuse crate::model::View;\npub use crate::api::serve;\n",
            ),
            ("daemon/state.rs", "fn g() { crate::api::serve(); }\n"),
            ("model.rs", "pub struct View;\n"),
        ];
        let cycles = find_cycles(&sources(&files));
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].members, [module("api"), module("daemon")]);
        assert_eq!(
            report("lb-userspace", &cycles),
            "lb-userspace: cycle api <-> daemon\n    \
             api -> daemon (api/mod.rs:4 crate::daemon::Shared)\n    \
             daemon -> api (daemon/mod.rs:3 crate::api::serve)\n        \
             also daemon/state.rs:1 crate::api::serve\n"
        );
    }

    #[test]
    fn a_chain_is_no_cycle_and_comments_and_strings_do_not_count() {
        let files = [
            ("main.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::b::B;\n"),
            (
                "b.rs",
                "use crate::c::C;\n// crate::a::A\n/// crate::a::A\n",
            ),
            (
                "c.rs",
                "//! crate::a\n/* crate::a /* nested */ crate::b */\n\
                 const S: &str = \"crate::a::A\";\n\
                 const R: &str = r#\"crate::a \" crate::b\"#;\nconst Q: char = '\"';\n\
                 fn f<'a>(x: &'a u8) -> char { b'a' as char }\n",
            ),
        ];
        assert_eq!(edges(&files), ["a -> b", "b -> c"]);
        assert!(find_cycles(&sources(&files)).is_empty());
        assert_eq!(report("lb-common", &[]), "");
    }

    #[test]
    fn grouped_imports_are_expanded() {
        let files = [
            ("lib.rs", "mod a;\nmod b;\nmod d;\nmod e;\n"),
            (
                "a.rs",
                "use crate::{\n    b::{c::Deep, self},\n    d as dee,\n    Root,\n};\n",
            ),
            ("b/mod.rs", "mod c;\npub use super::{e::{self, E as F}};\n"),
            ("b/c.rs", "pub struct Deep;\nuse crate::{a::*};\n"),
            ("d.rs", ""),
            ("e.rs", ""),
        ];
        assert_eq!(edges(&files), ["a -> b", "a -> d", "b -> a", "b -> e"]);
        let cycles = find_cycles(&sources(&files));
        assert_eq!(
            report("lb-ebpf", &cycles),
            "lb-ebpf: cycle a <-> b\n    \
             a -> b (a.rs:2 crate::b::c::Deep)\n        \
             also a.rs:2 crate::b\n    \
             b -> a (b/c.rs:2 crate::a::*)\n"
        );
    }

    #[test]
    fn parent_and_child_are_no_edge() {
        let files = [
            (
                "lib.rs",
                "mod health;\nuse crate::health::checker::Check;\n",
            ),
            (
                "health/mod.rs",
                "mod checker;\nmod schedule;\npub use crate::health::checker::Check;\n\
                 use self::schedule::run;\nuse super::Config;\n",
            ),
            (
                "health/checker.rs",
                "use super::Settings;\nuse crate::health::Reason;\nuse crate::Config;\n\
                 pub(crate) fn f() {}\npub(in crate::health) fn g() {}\n",
            ),
            ("health/schedule.rs", "use super::checker::Check;\n"),
        ];
        assert_eq!(edges(&files), ["health::schedule -> health::checker"]);
        assert!(find_cycles(&sources(&files)).is_empty());
    }

    #[test]
    fn cycles_between_nested_siblings_and_super_in_inline_modules() {
        let files = [
            ("lib.rs", "mod health;\n"),
            ("health/mod.rs", "mod checker;\nmod schedule;\nmod probe;\n"),
            (
                "health/checker.rs",
                "use super::schedule::Task;\n\
                 #[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::probe::P;\n}\n\
                 use super::Settings;\n",
            ),
            ("health/schedule.rs", "fn f() -> super::checker::Check {}\n"),
            ("health/probe/mod.rs", "mod tcp;\n"),
            ("health/probe/tcp.rs", "use super::super::window::W;\n"),
        ];
        assert_eq!(
            edges(&files),
            [
                "health::checker -> health::probe",
                "health::checker -> health::schedule",
                "health::schedule -> health::checker",
            ]
        );
        let cycles = find_cycles(&sources(&files));
        assert_eq!(cycles.len(), 1);
        assert_eq!(
            cycles[0].members,
            [module("health::checker"), module("health::schedule")]
        );
    }

    #[test]
    fn three_modules_in_one_component() {
        let files = [
            ("lib.rs", ""),
            ("flow.rs", "use crate::{passive, snat::Port};\n"),
            ("passive.rs", "use crate::flow::Flow;\n"),
            ("snat.rs", "use crate::flow;\n"),
            ("table.rs", "use crate::flow;\n"),
        ];
        let cycles = find_cycles(&sources(&files));
        assert_eq!(cycles.len(), 1);
        assert_eq!(
            cycles[0].members,
            [module("flow"), module("passive"), module("snat")]
        );
        assert_eq!(cycles[0].edges.len(), 4);
    }

    #[test]
    fn module_files() {
        assert_eq!(module_of("lib.rs"), module(""));
        assert_eq!(module_of("main.rs"), module(""));
        assert_eq!(module_of("api/mod.rs"), module("api"));
        assert_eq!(
            module_of("health/probe/tcp_syn.rs"),
            module("health::probe::tcp_syn")
        );
        assert_eq!(module_of("x/lib.rs"), module("x::lib"));
    }
}
