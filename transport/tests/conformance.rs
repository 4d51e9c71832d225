//! `transport/CONFORMANCE.md` stays true to the source tree: every file a row names exists,
//! every test it names is a function of that file and names the row (its id appears in the
//! function or in the comments and attributes right above it), every status is one the table
//! defines, and every "not modeled" row says why.

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

/// The text of function `name` in `src`: the doc comments, comments and attributes right
/// above its `fn` line, and the function itself up to the line that closes it (a `}` at the
/// indentation of the `fn` line, as rustfmt writes it). `None` if `src` has no such function.
fn function_text(src: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = src.lines().collect();
    let is_fn = |l: &str| {
        let mut t = l.trim_start();
        for q in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", "unsafe "] {
            t = t.strip_prefix(q).unwrap_or(t);
        }
        t.strip_prefix("fn ").and_then(|r| r.strip_prefix(name)).is_some_and(|r| r.starts_with('(') || r.starts_with('<'))
    };
    let at = lines.iter().position(|l| is_fn(l))?;
    let indent = &lines[at][..lines[at].len() - lines[at].trim_start().len()];
    let closing = format!("{indent}}}");
    let end = if lines[at].trim_end().ends_with('}') { at } else { (at + 1..lines.len()).find(|&i| lines[i].trim_end() == closing)? };
    let above = |l: &str| {
        let t = l.trim_start();
        t.starts_with("//") || t.starts_with("#[")
    };
    let start = (0..at).rev().take_while(|&i| above(lines[i])).last().unwrap_or(at);
    Some(lines[start..=end].join("\n"))
}

/// Whether `text` names row `id` (`T3`, `M13`): the id as a word of its own, so that `T3` is
/// not found in `T30` or `MT3`.
fn names_row(text: &str, id: &str) -> bool {
    text.match_indices(id).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + id.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
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

/// A row may cite only tests that touch it: each cited test function names the row's id
/// (see `function_text` for where it may appear). A list of every row/test pair that does not.
#[test]
fn every_cited_test_names_its_row() {
    let root = repo_root();
    let mut missing = Vec::new();
    let mut checked = 0;
    for r in rows() {
        for t in spans(&r.test) {
            let Some((path, name)) = t.rsplit_once("::") else { continue };
            let src = std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{}: {path}: {e}", r.id));
            match function_text(&src, name) {
                Some(text) if names_row(&text, &r.id) => checked += 1,
                Some(_) => missing.push(format!("{}: {t} does not name the row", r.id)),
                None => missing.push(format!("{}: {t}: no such function", r.id)),
            }
        }
    }
    assert!(missing.is_empty(), "{} cited tests do not name their row:\n{}", missing.len(), missing.join("\n"));
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

/// The row check fails on a test that does not name its row: an id found only in another
/// function, in a longer id, or nowhere does not count.
#[test]
fn checker_catches_a_test_that_does_not_name_its_row() {
    let src = "\
/// Checks the race.
///
/// CONFORMANCE.md: T3, M13.
#[test]
fn names_them() {
    let x = 1; // T30 is another row
}

#[test]
fn names_none() {
    // only T30 and MT3 here
    if true {
        let y = 2;
    }
}

/// T31 belongs to the next function, not to the one above.
fn next() {}

mod tests {
    #[test]
    fn nested_names_it_in_its_body() {
        assert_eq!(1, 1, \"M7\");
    }
}
";
    let named = function_text(src, "names_them").expect("a function");
    assert!(named.starts_with("/// Checks the race.") && named.ends_with('}'), "{named}");
    assert!(names_row(&named, "T3") && names_row(&named, "M13") && names_row(&named, "T30"));
    assert!(!names_row(&named, "T31") && !names_row(&named, "M1"));
    let none = function_text(src, "names_none").expect("a function");
    assert!(!names_row(&none, "T3") && !names_row(&none, "T31"), "{none}");
    assert!(names_row(&function_text(src, "nested_names_it_in_its_body").expect("a function"), "M7"));
    assert!(names_row(&function_text(src, "next").expect("a one-line function"), "T31"));
    assert!(function_text(src, "absent").is_none() && function_text(src, "names").is_none());
}
