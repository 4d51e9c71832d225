//! `transport/CONFORMANCE.md` stays true to the source tree: every file a row names exists,
//! every test it names is a function of that file, every status is one the table defines, and
//! every "not modeled" row says why.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("transport/ is inside the repository").to_path_buf()
}

/// The cells of a table row, splitting on `|` that are not escaped as `\|`.
fn cells(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = line.trim().trim_start_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cur.push('|');
                chars.next();
            }
            '|' => out.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// The backticked spans of a cell.
fn spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Whether `src` defines a function called `name` (`fn name(` or `fn name<`).
fn defines(src: &str, name: &str) -> bool {
    src.match_indices(&format!("fn {name}")).any(|(i, m)| matches!(src[i + m.len()..].chars().next(), Some('(' | '<')))
}

struct Row {
    id: String,
    modelled: String,
    test: String,
    status: String,
}

fn rows() -> Vec<Row> {
    let text = std::fs::read_to_string(repo_root().join("transport/CONFORMANCE.md")).expect("transport/CONFORMANCE.md");
    text.lines()
        .filter(|l| l.starts_with("| T") || l.starts_with("| M"))
        .map(|l| {
            let c = cells(l);
            assert_eq!(c.len(), 5, "a row has 5 cells: {l}");
            Row { id: c[0].clone(), modelled: c[2].clone(), test: c[3].clone(), status: c[4].clone() }
        })
        .collect()
}

#[test]
fn every_named_file_and_test_exists() {
    let root = repo_root();
    let mut checked = 0;
    for r in rows() {
        for path in spans(&r.modelled) {
            assert!(root.join(path).is_file(), "{}: no file {path}", r.id);
        }
        for t in spans(&r.test) {
            let (path, name) = t.rsplit_once("::").unwrap_or_else(|| panic!("{}: a test is file::function, not {t}", r.id));
            let src = std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{}: {path}: {e}", r.id));
            assert!(defines(&src, name), "{}: {path} has no test function {name}", r.id);
            checked += 1;
        }
    }
    assert!(checked > 150, "only {checked} test references: the table lost rows?");
}

#[test]
fn statuses_are_the_defined_ones_and_reasons_are_given() {
    let rows = rows();
    let (t, m) = (rows.iter().filter(|r| r.id.starts_with('T')).count(), rows.iter().filter(|r| r.id.starts_with('M')).count());
    assert!(t >= 60 && m >= 70, "rows: {t} tag matching, {m} fi_mr");
    for (prefix, n) in [("T", t), ("M", m)] {
        let ids: Vec<String> = rows.iter().filter(|r| r.id.starts_with(prefix)).map(|r| r.id.clone()).collect();
        let want: Vec<String> = (1..=n).map(|i| format!("{prefix}{i}")).collect();
        assert_eq!(ids, want, "rows are numbered in order, none twice");
    }
    for r in &rows {
        let s = r.status.as_str();
        let has_reason = |head: &str| s.strip_prefix(head).is_some_and(|rest| rest.trim_end().ends_with(')') && rest.len() > 12);
        let ok = s.starts_with("as documented")
            || has_reason("as rdma-core implements it (source: ")
            || has_reason("as libfabric implements it (source: ")
            || has_reason("not modeled (");
        assert!(ok, "{}: status {s:?}", r.id);
        if !s.starts_with("not modeled") {
            assert!(!spans(&r.test).is_empty(), "{}: a modelled concept names a test", r.id);
            assert!(!spans(&r.modelled).is_empty(), "{}: a modelled concept names its file", r.id);
        }
    }
}

#[test]
fn checker_catches_a_missing_function() {
    let src = "fn present() {}\nfn generic<T>() {}\nfn present_too_long() {}";
    assert!(defines(src, "present") && defines(src, "generic"));
    assert!(!defines(src, "absent") && !defines(src, "present_too"));
    assert_eq!(cells("| a | b \\| c | `x` |"), vec!["a", "b | c", "`x`"]);
}
