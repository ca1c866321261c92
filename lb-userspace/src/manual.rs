//! Shell completions and man pages, generated from the CLI's own definition so they cannot
//! drift from it (the package ships them; `lb completions` and `lb man` print them).

use std::{io::Write, path::Path};

use anyhow::Context as _;
use clap::CommandFactory as _;

use crate::cli::Cli;

/// Writes the completion script of `shell` for `lb`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut Cli::command(), "lb", out);
}

/// Writes lb(1), the top-level page.
pub fn man_page(out: &mut dyn Write) -> anyhow::Result<()> {
    clap_mangen::Man::new(Cli::command())
        .render(out)
        .context("writing the man page")
}

/// Writes lb.1 and one page per subcommand (lb-run.1, lb-status.1, ...) into `dir`.
pub fn man_pages(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("writing man pages into {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_name_every_subcommand() {
        let mut out = Vec::new();
        completions(clap_complete::Shell::Bash, &mut out);
        let script = String::from_utf8(out).unwrap();
        for sub in Cli::command().get_subcommands() {
            assert!(script.contains(sub.get_name()), "{}", sub.get_name());
        }
    }

    #[test]
    fn man_pages_for_lb_and_each_subcommand() {
        let mut page = Vec::new();
        man_page(&mut page).unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(
            page.starts_with(".ie") || page.contains(".TH lb 1"),
            "{page}"
        );
        assert!(page.contains("check\\-config"), "{page}");
        let dir = std::env::temp_dir().join(format!("lb-man-{}", std::process::id()));
        man_pages(&dir).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(names.contains(&"lb.1".to_owned()), "{names:?}");
        assert!(names.contains(&"lb-run.1".to_owned()), "{names:?}");
        assert!(names.contains(&"lb-check-config.1".to_owned()), "{names:?}");
    }
}
