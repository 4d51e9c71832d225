//! Forwarding of the ranks' stdout and stderr, a whole line at a time.
//!
//! Each rank's stream is read into its own buffer; only complete lines are written out, all
//! complete lines of one read in a single write, so lines of different ranks never mix.
//! A partial last line is written when the stream ends (tagged: with a newline added, so the
//! next tagged line starts on its own line; untagged: exactly as the rank wrote it). A line
//! longer than [`MAX_LINE`] is written in pieces of that size. `tmpirun`'s own messages go
//! through [`write_own`], which starts them on a line of their own after such a fragment on
//! stderr.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Longest partial line kept before it is written anyway.
pub const MAX_LINE: usize = 1 << 20;

/// Which of `tmpirun`'s outputs a stream goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// `tmpirun`'s stdout.
    Stdout,
    /// `tmpirun`'s stderr.
    Stderr,
}

/// The line buffer of one rank's stdout or stderr.
#[derive(Debug)]
pub struct LineBuf {
    prefix: Option<Vec<u8>>,
    partial: Vec<u8>,
}

impl LineBuf {
    /// A buffer for the process labelled `label` (a rank's label is its number, a spawned
    /// process's `spawn<n>.<rank>`); `tag` adds the `"[label] "` prefix to every line.
    pub fn labelled(label: &str, tag: bool) -> Self {
        LineBuf { prefix: tag.then(|| format!("[{label}] ").into_bytes()), partial: Vec::new() }
    }

    /// Takes newly read bytes; returns what to write now (possibly nothing).
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let Some(last_nl) = data.iter().rposition(|&b| b == b'\n') else {
            self.partial.extend_from_slice(data);
            if self.partial.len() >= MAX_LINE {
                let chunk = std::mem::take(&mut self.partial);
                self.emit(&mut out, &chunk, true);
            }
            return out;
        };
        let (lines, rest) = data.split_at(last_nl + 1);
        match &self.prefix {
            None => {
                out.reserve(self.partial.len() + lines.len());
                out.append(&mut self.partial);
                out.extend_from_slice(lines);
            }
            Some(_) => {
                let mut first = true;
                for line in lines.split_inclusive(|&b| b == b'\n') {
                    if first {
                        first = false;
                        let mut l = std::mem::take(&mut self.partial);
                        l.extend_from_slice(line);
                        self.emit(&mut out, &l, false);
                    } else {
                        self.emit(&mut out, line, false);
                    }
                }
            }
        }
        self.partial.extend_from_slice(rest);
        out
    }

    /// The stream ended: what is left to write.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if !self.partial.is_empty() {
            let chunk = std::mem::take(&mut self.partial);
            self.emit(&mut out, &chunk, true);
        }
        out
    }

    /// Appends one line (or a final fragment) with its prefix.
    fn emit(&self, out: &mut Vec<u8>, line: &[u8], fragment: bool) {
        match &self.prefix {
            Some(p) => {
                out.extend_from_slice(p);
                out.extend_from_slice(line);
                if fragment && !line.ends_with(b"\n") {
                    out.push(b'\n');
                }
            }
            None => out.extend_from_slice(line),
        }
    }
}

/// Whether the last byte written to `tmpirun`'s stderr ended a line (or nothing was written).
static STDERR_AT_LINE_START: AtomicBool = AtomicBool::new(true);

/// Writes `data` to a sink in one call. Errors (a closed pipe) are ignored: the ranks'
/// output keeps being drained so that they never block on a full pipe.
pub fn write_to(sink: Sink, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let _ = match sink {
        Sink::Stdout => {
            let mut o = std::io::stdout().lock();
            o.write_all(data).and_then(|()| o.flush())
        }
        Sink::Stderr => {
            let mut e = std::io::stderr().lock();
            STDERR_AT_LINE_START.store(data.ends_with(b"\n"), Ordering::Relaxed);
            e.write_all(data)
        }
    };
}

/// Longest line of `tmpirun`'s own (bytes, before the newline): lists are summarized long
/// before it ([`summarize`], [`rank_ranges`]); what is longer still (a command-line value quoted
/// in an error, say) is cut ([`bounded`]).
pub const MAX_OWN_LINE: usize = 2000;

/// `text`, or when it is longer than `max` bytes its start and end with what was cut between
/// them said.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let keep = max.saturating_sub(40) / 2;
    let mut head = keep;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - keep;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{} [... {} bytes cut ...] {}", &text[..head], tail - head, &text[tail..])
}

/// The first `show` of `items` joined with `, `, then how many more there are.
pub fn summarize(items: &[String], show: usize) -> String {
    let mut out = items.iter().take(show).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > show {
        out.push_str(&format!(" and {} more", items.len() - show));
    }
    out
}

/// `ranks` (any order) as ascending ranges, `0-3, 7, 9-10`, at most `show` of them, then how
/// many ranks are left out.
pub fn rank_ranges(ranks: &[usize], show: usize) -> String {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for r in sorted {
        match ranges.last_mut() {
            Some((_, hi)) if *hi + 1 == r => *hi = r,
            _ => ranges.push((r, r)),
        }
    }
    let text: Vec<String> =
        ranges.iter().take(show).map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") }).collect();
    let mut out = text.join(", ");
    let left: usize = ranges.iter().skip(show).map(|&(lo, hi)| hi - lo + 1).sum();
    if left > 0 {
        out.push_str(&format!(" and {left} more"));
    }
    out
}

/// Writes `tmpirun`'s own `text` (whole lines) to its stderr, starting on a line of its own:
/// after a rank's unfinished last line (a rank ended while it was printing, say), a newline
/// comes first, so the message is never glued to the end of the rank's text. An empty `text`
/// ends such a line and writes nothing else.
pub fn write_own(text: &str) {
    write_to(Sink::Stderr, &own_line(text, STDERR_AT_LINE_START.load(Ordering::Relaxed)));
}

/// `text` as [`write_own`] writes it, after output that ended a line (`at_line_start`) or not.
fn own_line(text: &str, at_line_start: bool) -> Vec<u8> {
    let mut data = Vec::with_capacity(text.len() + 1);
    if !at_line_start {
        data.push(b'\n');
    }
    data.extend_from_slice(text.as_bytes());
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_summarized_and_bounded() {
        let cases: [(&[usize], usize, &str); 6] = [
            (&[], 4, ""),
            (&[5], 4, "5"),
            (&[3, 1, 2, 7, 9, 10, 2], 4, "1-3, 7, 9-10"),
            (&[0, 2, 4, 6, 8], 2, "0, 2 and 3 more"),
            (&[0, 1, 2, 10, 11, 20], 1, "0-2 and 3 more"),
            (&[999, 0], 8, "0, 999"),
        ];
        for (ranks, show, want) in cases {
            assert_eq!(rank_ranges(ranks, show), want, "{ranks:?}");
        }
        let ids: Vec<String> = (0..10).map(|i| format!("j{i}")).collect();
        assert_eq!(summarize(&ids[..2], 3), "j0, j1");
        assert_eq!(summarize(&ids, 3), "j0, j1, j2 and 7 more");
        assert_eq!(bounded("short", 10), "short");
        let long = "é".repeat(3000);
        let b = bounded(&long, MAX_OWN_LINE);
        assert!(b.len() <= MAX_OWN_LINE + 40 && b.contains("bytes cut"), "{}", b.len());
        assert!(b.starts_with('é') && b.ends_with('é'));
    }

    #[test]
    fn own_lines_start_on_a_line_of_their_own() {
        assert_eq!(own_line("tmpirun: x\n", true), b"tmpirun: x\n");
        assert_eq!(own_line("tmpirun: x\n", false), b"\ntmpirun: x\n");
        assert_eq!(own_line("", true), b"");
        assert_eq!(own_line("", false), b"\n");
    }

    #[test]
    fn untagged_keeps_bytes_and_holds_partial_lines() {
        let mut b = LineBuf::labelled("3", false);
        assert_eq!(b.feed(b"ab"), b"");
        assert_eq!(b.feed(b"c\nde\nf"), b"abc\nde\n");
        assert_eq!(b.feed(b"g"), b"");
        assert_eq!(b.finish(), b"fg");
        assert_eq!(b.finish(), b"");
    }

    #[test]
    fn tagged_prefixes_every_line() {
        let mut b = LineBuf::labelled("12", true);
        assert_eq!(b.feed(b"he"), b"");
        assert_eq!(b.feed(b"llo\n\nworld\nx"), b"[12] hello\n[12] \n[12] world\n");
        assert_eq!(b.finish(), b"[12] x\n");
    }

    #[test]
    fn overlong_lines_are_cut() {
        let mut b = LineBuf::labelled("0", true);
        let big = vec![b'a'; MAX_LINE];
        let out = b.feed(&big);
        assert_eq!(out.len(), MAX_LINE + 5);
        assert!(out.starts_with(b"[0] a") && out.ends_with(b"a\n"));
        assert_eq!(b.finish(), b"");
    }
}
