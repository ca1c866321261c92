//! The docs generated from the code (`docs/configuration.md`, `docs/config.schema.json`,
//! `docs/metrics.md`): each is compared with its checked-in file by a test named
//! `generated_doc_*`, so `cargo xtask test` fails when one is stale; `cargo xtask docs` runs
//! those tests with `LB_WRITE_DOCS=1`, which writes the files instead.

use std::path::Path;

/// Checks `text` against the workspace file `path` (or writes it, under `LB_WRITE_DOCS`).
pub(crate) fn check_or_write(path: &str, text: &str) {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    if std::env::var_os("LB_WRITE_DOCS").is_some() {
        std::fs::write(&file, text).unwrap_or_else(|e| panic!("writing {path}: {e}"));
        return;
    }
    let current = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        current == text,
        "{path} is stale (or missing): run `cargo xtask docs` and commit it"
    );
}
