//! The README stays true to the code: it lists every `TMPI_*` knob and every `tmpirun` flag,
//! and its Quick start has exactly the two commands that build, run and test.

use std::process::Command;

fn readme() -> String {
    let p = tmpi_tests::workspace_root().join("README.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The text of the `## title` section (up to the next `## `).
fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let head = format!("\n## {title}\n");
    let start = text.find(&head).unwrap_or_else(|| panic!("README has no section `## {title}`")) + head.len();
    let rest = &text[start..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

#[test]
fn every_knob_is_in_the_table() {
    let text = readme();
    let table = section(&text, "Configuration: `TMPI_*` variables");
    for k in tmpi::config::KNOBS {
        let row = format!("| `{}` | `{}` |", k.name, k.default);
        assert!(table.contains(&row), "README's knob table lacks the row starting {row:?}");
    }
    let rows = table.lines().filter(|l| l.starts_with("| `TMPI_")).count();
    assert_eq!(rows, tmpi::config::KNOBS.len(), "README's knob table lists knobs the runtime does not have");
}

#[test]
fn every_tmpirun_flag_is_in_the_table() {
    let out = Command::new(tmpi_tests::tmpirun()).arg("--help").output().expect("run tmpirun --help");
    assert!(out.status.success(), "tmpirun --help failed");
    let help = String::from_utf8_lossy(&out.stdout);
    let text = readme();
    let table = section(&text, "tmpirun");
    let mut flags: Vec<String> = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        if !t.starts_with('-') {
            continue;
        }
        for word in t.split([',', ' ']) {
            if word.starts_with('-') && word.len() > 1 {
                flags.push(word.to_string());
            }
        }
    }
    assert!(flags.iter().any(|f| f == "--tag-output"), "could not read the flags from --help:\n{help}");
    for f in flags {
        assert!(table.contains(&format!("`{f}")), "README's tmpirun table lacks {f}");
    }
}

#[test]
fn quick_start_has_the_two_commands() {
    let text = readme();
    let quick = section(&text, "Quick start");
    let commands: Vec<&str> = quick.split("```").skip(1).step_by(2).map(|block| block.trim_start_matches("sh").trim()).collect();
    assert_eq!(
        commands,
        [
            "cargo build --release && target/release/tmpirun -n 4 target/release/hello",
            "cargo build --release --workspace --bins && cargo test --release --workspace",
        ]
    );
}

#[test]
fn ci_script_runs_the_readme_test_command() {
    let p = tmpi_tests::workspace_root().join(".ci/run");
    let ci = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    for c in [
        "cargo fmt --all -- --check",
        "cargo clippy --workspace --all-targets -- -D warnings",
        "cargo build --release --workspace --bins",
        "cargo test --release --workspace",
    ] {
        assert!(ci.lines().any(|l| !l.trim_start().starts_with('#') && l.contains(c)), ".ci/run does not run `{c}`");
    }
}
