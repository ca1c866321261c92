//! Checks of README.md and docs/*.md against the code: every TOML snippet is a valid
//! configuration, every `lb ...` example parses as a command line, every relative link leads to
//! a file, and every section the README had when the docs were split is still a heading
//! somewhere.

use std::path::{Path, PathBuf};

/// The README's headings before it was split into docs/ (one per line, without the `#`s).
const FORMER_README_HEADINGS: &str = include_str!("former_readme_headings.txt");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md and every docs/*.md, as (name, text).
fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| {
            e.expect("docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(root().join(&n)).expect("a page");
            (n, text)
        })
        .collect()
}

/// The fenced code blocks of a page: (info string, first line number, body).
fn blocks(text: &str) -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match (&mut open, trimmed.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), i + 2, String::new())),
            (Some(_), Some(_)) => out.push(open.take().expect("open")),
            (Some((_, _, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// The headings outside code blocks, without their `#`s.
fn headings(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(line.trim_start_matches('#').trim().to_owned());
        }
    }
    out
}

const MIN_LB: &str = "[lb]\ninterfaces = [\"eth1\"]\n";
const MIN_SERVICE: &str = "[[service]]\nname = \"s\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:80\" }]\n";

/// A snippet as a whole file: what it leaves out (`[lb]`, the service a `[service.check]`
/// belongs to) is added at its smallest.
fn as_file(snippet: &str) -> String {
    let first_table = snippet
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with('['))
        .unwrap_or("");
    let mut file = String::new();
    if !snippet.contains("[lb]") {
        file.push_str(MIN_LB);
    }
    if first_table.starts_with("[service.") {
        file.push_str(MIN_SERVICE);
    }
    file.push_str(snippet);
    file
}

#[test]
fn every_toml_snippet_is_a_valid_config() {
    let mut checked = 0;
    let mut bad = Vec::new();
    for (page, text) in pages() {
        for (info, line, body) in blocks(&text) {
            if info != "toml" {
                continue;
            }
            checked += 1;
            if let Err(e) = crate::config::parse(&as_file(&body)) {
                bad.push(format!("{page}:{line}: {e}"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(checked >= 5, "only {checked} TOML snippets found");
}

/// Words split as a shell would for these examples: whitespace, '...' and "..." quoting.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut quote = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_default().push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            (None, c) if c.is_whitespace() => out.extend(word.take()),
            (None, c) => word.get_or_insert_default().push(c),
        }
    }
    out.extend(word);
    out
}

/// The `lb` command lines of a shell block: comments dropped, continuations joined, each
/// command of `a && b`, `a | b`, `a; b` on its own, a `$ ` prompt, `sudo`, `VAR=value` and
/// `nsenter ...` prefixes skipped. Synopsis lines (`[--opt]`, `a|b` alternatives) are not
/// examples and are left out.
fn lb_commands(body: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut joined = String::new();
    for line in body.lines() {
        let line = match line.find(" #") {
            Some(at) => &line[..at],
            None => line,
        };
        if let Some(part) = line.trim_end().strip_suffix('\\') {
            joined.push_str(part);
            continue;
        }
        joined.push_str(line);
        let full = std::mem::take(&mut joined);
        let full = full.trim_start();
        let full = full.strip_prefix("$ ").unwrap_or(full);
        for command in full
            .split("&&")
            .flat_map(|c| c.split(" | "))
            .flat_map(|c| c.split("; "))
        {
            let mut w = words(command);
            let start = w
                .iter()
                .position(|w| {
                    !(w == "sudo"
                        || w.contains('=')
                        || w.starts_with("nsenter")
                        || w.starts_with("--net"))
                })
                .unwrap_or(w.len());
            w.drain(..start);
            let synopsis = w
                .iter()
                .any(|w| w.contains('[') || (w.contains('|') && !w.contains('=')));
            if w.first().is_some_and(|w| w == "lb") && w.len() > 1 && !synopsis {
                out.push(w);
            }
        }
    }
    out
}

#[test]
fn every_lb_example_parses() {
    use clap::Parser as _;
    let mut checked = 0;
    let mut bad = Vec::new();
    for (page, text) in pages() {
        for (info, line, body) in blocks(&text) {
            if info == "toml" {
                continue;
            }
            for args in lb_commands(&body) {
                checked += 1;
                if let Err(e) = crate::cli::Cli::try_parse_from(&args) {
                    bad.push(format!(
                        "{page} (block at line {line}): {}: {e}",
                        args.join(" ")
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(checked >= 20, "only {checked} lb examples found");
}

#[test]
fn the_example_finder_skips_synopses_and_prefixes() {
    let found = lb_commands(
        "$ lb status web   # a comment\n\
         lb stop [--pin-path DIR]\n\
         lb backend drain|enable web 10.0.0.1:80\n\
         nsenter --net=/run/netns/b1 lb decap --stats\n\
         systemctl reload lb && lb events --follow \\\n  --after 3\n\
         LB_API_TOKEN=x lb config diff 'a file.toml'\n",
    );
    let found: Vec<String> = found.iter().map(|w| w.join(" ")).collect();
    assert_eq!(
        found,
        [
            "lb status web",
            "lb decap --stats",
            "lb events --follow --after 3",
            "lb config diff a file.toml",
        ]
    );
}

/// The front door stays short, and gives the two commands CI runs.
#[test]
fn the_readme_is_short_and_gives_the_two_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines: move detail into docs/"
    );
    for command in [
        "rustup toolchain install && cargo xtask demo",
        "rustup toolchain install && cargo xtask test",
    ] {
        assert!(
            readme.lines().any(|l| l.trim() == command),
            "README.md lost `{command}`"
        );
    }
}

/// Nothing the README said was lost in the split: each of its former sections is a heading in
/// README.md or a page of docs/.
#[test]
fn every_former_readme_section_is_still_a_heading() {
    let all: Vec<String> = pages().iter().flat_map(|(_, t)| headings(t)).collect();
    let lost: Vec<&str> = FORMER_README_HEADINGS
        .lines()
        .filter(|h| !all.iter().any(|a| a == h))
        .collect();
    assert!(lost.is_empty(), "sections lost: {lost:?}");
}

/// Relative links lead to files that exist, and `#anchors` to headings of their page.
#[test]
fn relative_links_resolve() {
    let pages = pages();
    let mut bad = Vec::new();
    for (page, text) in &pages {
        let dir = Path::new(page).parent().expect("a directory");
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let Some(target) = rest.split(')').next() else {
                continue;
            };
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() {
                PathBuf::from(page)
            } else {
                normalise(&dir.join(file))
            };
            if !root().join(&file).exists() {
                bad.push(format!("{page}: {target}: no such file"));
                continue;
            }
            if !anchor.is_empty() {
                let name = file.to_string_lossy();
                let Some((_, target_text)) = pages.iter().find(|(n, _)| *n == name) else {
                    continue;
                };
                if !headings(target_text).iter().any(|h| slug(h) == anchor) {
                    bad.push(format!("{page}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// `docs/../README.md` → `README.md`.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            p => out.push(p),
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: lower case, spaces to `-`, punctuation other than `-`
/// and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}
