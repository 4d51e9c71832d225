//! Flow control under load through real jobs: 7 senders flood one receiver (issue: flow control).

use std::time::Duration;

use tmpi_tests::Job;

fn field(line: &str, key: &str) -> u64 {
    line.split([' ', ',', ')'])
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{key} missing in {line:?}"))
}

/// 7 x 200 000 small messages: all arrive, in order per sender, and the receiver's unexpected
/// buffering stays within its budget (here 4 MiB).
#[test]
fn seven_senders_small_messages() {
    let out = Job::tmpirun(8, "flood").arg("200000").arg("8").env("TMPI_UNEXPECTED_MAX", "4194304").timeout(Duration::from_secs(240)).run();
    let line = out.assert_ok_line("flood: ");
    assert!(field(&line, "ux_peak_bytes") <= 4 * 1024 * 1024 + 4096, "{line}");
    eprintln!("{line}");
}

/// The same with 1 MiB messages (rendezvous): nothing is buffered unexpected but requests.
#[test]
fn seven_senders_large_messages() {
    let out = Job::tmpirun(8, "flood").arg("40").arg("1048576").timeout(Duration::from_secs(240)).run();
    let line = out.assert_ok_line("flood: ");
    assert!(field(&line, "ux_peak_bytes") < 1 << 20, "{line}");
    eprintln!("{line}");
}
