//! Every example through `tmpirun` at 1, 2, 3 and 8 ranks (8 is more ranks than the
//! development machine has cores), alone as a singleton, and under every setting of the
//! soft TM-SRQ tag list (`TMPI_TM_MAX_TAGS` unset, 0, 1, 4): the output must not change.

use std::time::Duration;

use tmpi_tests::{Job, Outcome};

/// Rank counts of the main sweep.
const RANKS: [usize; 4] = [1, 2, 3, 8];
/// Rank counts of the TM matrix.
const TM_RANKS: [usize; 2] = [2, 3];
/// Settings of `TMPI_TM_MAX_TAGS` compared (`None`: unset, the default).
const TM_SETTINGS: [Option<&str>; 4] = [None, Some("0"), Some("1"), Some("4")];

fn job(example: &str, n: usize) -> Job {
    Job::tmpirun(n, example).timeout(Duration::from_secs(120))
}

/// Checks what `example` printed at `n` ranks and returns the output in a form that must not
/// depend on timing or on the runtime's configuration.
fn checked_output(example: &str, n: usize, out: &Outcome) -> String {
    out.assert_success();
    out.assert_no_leak();
    match example {
        "hello" => {
            let mut lines = out.stdout_lines();
            lines.sort_unstable();
            let mut want: Vec<String> = (0..n).map(|r| format!("Hello from rank {r} of {n}")).collect();
            want.sort_unstable();
            assert_eq!(lines, want, "hello at {n} ranks\n{}", out.report());
            lines.join("\n")
        }
        "pingpong" | "offload" | "intercomm" if n == 1 => {
            let lines = out.stdout_lines();
            assert!(
                lines.len() == 1 && lines[0].contains("needs at least 2 ranks"),
                "{example} alone should say it needs 2 ranks\n{}",
                out.report()
            );
            out.stdout.clone()
        }
        "pingpong" => {
            out.assert_ok_line("pingpong: ");
            // The latency column depends on the machine: keep the sizes and the verdict.
            let sizes: Vec<&str> =
                out.stdout_lines().into_iter().filter(|l| !l.starts_with('#')).filter_map(|l| l.split_whitespace().next()).collect();
            let want: Vec<String> = (0..=20).map(|k| (1u64 << k).to_string()).chain(["pingpong:".to_string()]).collect();
            assert_eq!(sizes, want, "pingpong sizes\n{}", out.report());
            sizes.join("\n")
        }
        _ => {
            let line = out.assert_ok_line(&format!("{example}: "));
            // Ranks wired into one job, not n singletons: those would print n lines of "1 ranks".
            let size_shown = match example {
                "wildcard" => format!("from {} senders", n - 1),
                "offload" => format!("from {} peers", n - 1),
                _ => format!("{n} ranks"),
            };
            assert!(line.contains(&size_shown), "{example} at {n} ranks: the OK line does not say {size_shown:?}: {line:?}");
            assert_eq!(out.stdout_lines().len(), 1, "{example} prints one line (from rank 0)\n{}", out.report());
            out.stdout.clone()
        }
    }
}

fn sweep(example: &str) {
    for n in RANKS {
        let out = job(example, n).run();
        checked_output(example, n, &out);
    }
}

fn tm_matrix(example: &str) {
    for n in TM_RANKS {
        let mut reference: Option<(String, String)> = None;
        for setting in TM_SETTINGS {
            let mut j = job(example, n);
            if let Some(v) = setting {
                j = j.env("TMPI_TM_MAX_TAGS", v);
            }
            let out = j.run();
            let text = checked_output(example, n, &out);
            let label = format!("TMPI_TM_MAX_TAGS={}", setting.unwrap_or("<unset>"));
            match &reference {
                None => reference = Some((label, text)),
                Some((ref_label, ref_text)) => {
                    assert_eq!(&text, ref_text, "{example} at {n} ranks: output with {label} differs from {ref_label}")
                }
            }
        }
    }
}

/// Started without `tmpirun`, an example is rank 0 of 1, and prints what `tmpirun -n 1` does
/// (but `spawn`, which has no launcher to start processes then, and says so).
fn singleton(example: &str) {
    let alone = Job::alone(example).timeout(Duration::from_secs(60)).run();
    if example == "spawn" {
        alone.assert_success();
        assert_eq!(alone.stdout_lines(), ["spawn: no launcher to start processes (run it with tmpirun)"], "{}", alone.report());
        return checked_output(example, 1, &job(example, 1).run()).truncate(0);
    }
    let text = checked_output(example, 1, &alone);
    let launched = job(example, 1).run();
    let via = checked_output(example, 1, &launched);
    assert_eq!(text, via, "{example}: alone and `tmpirun -n 1` differ");
}

macro_rules! example_tests {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn ranks_1_2_3_8() {
                super::sweep(stringify!($name));
            }
            #[test]
            fn tm_tag_list_settings_give_identical_output() {
                super::tm_matrix(stringify!($name));
            }
            #[test]
            fn singleton() {
                super::singleton(stringify!($name));
            }
        }
    )*};
}

example_tests!(
    hello,
    ring,
    pingpong,
    wildcard,
    pi,
    heat1d,
    split,
    offload,
    halo,
    overlap,
    exchange,
    rayon_hybrid,
    reqset,
    particles,
    intercomm,
    spawn
);

#[test]
fn every_example_is_tested() {
    let found = tmpi_tests::example_names();
    let mut tested = vec![
        "hello",
        "ring",
        "pingpong",
        "wildcard",
        "pi",
        "heat1d",
        "split",
        "offload",
        "halo",
        "overlap",
        "exchange",
        "rayon_hybrid",
        "reqset",
        "particles",
        "intercomm",
        "spawn",
    ];
    tested.sort_unstable();
    assert_eq!(found, tested, "examples/src/bin and this test's list differ");
}
