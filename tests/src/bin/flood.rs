//! Flow control under load: every rank but 0 sends COUNT messages of SIZE bytes to rank 0 as
//! fast as it can; rank 0 takes them with ANY_SOURCE and checks per-sender order. Rank 0
//! prints its peak resident memory (VmHWM) and the runtime's unexpected-buffer peak.
//!
//! `flood [COUNT] [SIZE]` (defaults 200000 and 8; SIZE >= 8).

use tmpi::{ANY_SOURCE, ANY_TAG};

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmHWM:").map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0)))
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let count: u32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(200_000);
    let size: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(8).max(8);
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());
    let mut buf = vec![0u8; size];
    let t0 = tmpi::wtime();
    if rank == 0 {
        let mut next = vec![0u32; n];
        for _ in 0..u64::from(count) * (n as u64 - 1) {
            let st = world.recv(&mut buf, ANY_SOURCE, ANY_TAG)?;
            let src = u32::from_le_bytes(buf[0..4].try_into()?) as usize;
            let seq = u32::from_le_bytes(buf[4..8].try_into()?);
            if src != st.source() || seq != next[src] || st.len() != size {
                return Err(format!(
                    "flood: from rank {} got ({src}, {seq}, {} bytes), expected ({}, {}, {size})",
                    st.source(),
                    st.len(),
                    st.source(),
                    next[st.source()]
                )
                .into());
            }
            next[src] += 1;
        }
        let secs = tmpi::wtime() - t0;
        let stats = world.stats_line();
        let ux = stats.split_whitespace().find_map(|kv| kv.strip_prefix("ux_peak_bytes=")).unwrap_or("?").to_string();
        println!(
            "flood: {} senders x {count} messages of {size} B in order ({secs:.2} s, peak_rss_kib={}, ux_peak_bytes={ux}): OK",
            n - 1,
            peak_rss_kib()
        );
    } else {
        buf[0..4].copy_from_slice(&(rank as u32).to_le_bytes());
        for i in 0..count {
            buf[4..8].copy_from_slice(&i.to_le_bytes());
            world.send(&buf, 0, 1)?;
        }
    }
    world.finalize()?;
    Ok(())
}
