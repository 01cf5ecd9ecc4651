//! manuals: the man pages and shell completions, generated from the CLI definition.
//!
//! Theory of operation
//! -------------------
//! The clap definition in main.rs is the one description of the CLI. From it come:
//!
//! ```text
//!   contrib/man/zilla.1, zilla-pool.1, zilla-pool-create.1, ...   (clap_mangen)
//!   contrib/completions/zilla.bash, _zilla, zilla.fish            (clap_complete)
//! ```
//!
//! They are checked in so a package build needs no Rust toolchain run to install them.
//! A test of the binary's crate (`manuals_are_current`) generates them in memory and
//! fails when the checked-in files differ, are missing, or are left over from a
//! command that is gone; the same test with `ZILLA_REGENERATE_MANUALS=1` rewrites them
//! (the command is [`REGENERATE`]). The output depends only on the definition and the
//! crate version: no dates, no paths.

use std::path::{Path, PathBuf};

/// The one command that rewrites the checked-in files.
pub const REGENERATE: &str = "ZILLA_REGENERATE_MANUALS=1 cargo test --release -p zilla --bin zilla manuals_are_current";

/// Where the files go, relative to the repository root.
pub const MAN_DIR: &str = "contrib/man";
pub const COMPLETIONS_DIR: &str = "contrib/completions";

/// A man page for `cmd` and one for each visible subcommand, recursively
/// (`zilla-pool-create.1`): (file name, roff).
fn man_pages(cmd: &clap::Command, out: &mut Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub, out)?;
    }
    let man = clap_mangen::Man::new(cmd.clone()).manual("Zilla Manual").source(format!("zilla {}", env!("CARGO_PKG_VERSION")));
    let mut roff = vec![];
    man.render(&mut roff)?;
    out.push((man.get_filename(), roff));
    Ok(())
}

/// Every generated file: (path relative to the repository root, bytes), sorted.
pub fn generate(cmd: clap::Command) -> std::io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut pages = vec![];
    man_pages(&cmd, &mut pages)?;
    let mut files: Vec<(PathBuf, Vec<u8>)> = pages.into_iter().map(|(name, roff)| (Path::new(MAN_DIR).join(name), roff)).collect();
    use clap_complete::Shell;
    for (shell, name) in [(Shell::Bash, "zilla.bash"), (Shell::Zsh, "_zilla"), (Shell::Fish, "zilla.fish")] {
        let mut script = vec![];
        clap_complete::generate(shell, &mut cmd, "zilla", &mut script);
        files.push((Path::new(COMPLETIONS_DIR).join(name), script));
    }
    files.sort();
    Ok(files)
}

/// The checked-in files under the two directories (relative paths), sorted.
fn checked_in(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for dir in [MAN_DIR, COMPLETIONS_DIR] {
        if let Ok(entries) = std::fs::read_dir(root.join(dir)) {
            out.extend(entries.flatten().map(|e| Path::new(dir).join(e.file_name())));
        }
    }
    out.sort();
    out
}

/// What differs between `generated` and the files under `root`: one line each.
pub fn stale(root: &Path, generated: &[(PathBuf, Vec<u8>)]) -> Vec<String> {
    let mut problems = vec![];
    for (path, bytes) in generated {
        match std::fs::read(root.join(path)) {
            Ok(on_disk) if &on_disk == bytes => {}
            Ok(_) => problems.push(format!("{} differs from the CLI definition", path.display())),
            Err(_) => problems.push(format!("{} is missing", path.display())),
        }
    }
    for path in checked_in(root) {
        if !generated.iter().any(|(p, _)| *p == path) {
            problems.push(format!("{} is left over (no such command now)", path.display()));
        }
    }
    problems
}

/// Replace the files under `root` with `generated` (left-over files removed).
pub fn write(root: &Path, generated: &[(PathBuf, Vec<u8>)]) -> std::io::Result<()> {
    for path in checked_in(root) {
        std::fs::remove_file(root.join(path))?;
    }
    for (path, bytes) in generated {
        let path = root.join(path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, bytes)?;
    }
    Ok(())
}
