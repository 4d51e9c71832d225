//! Ping-pong between two ranks that are threads of this process, over the real shared-memory
//! fabric (no launcher): a quick way to profile the small-message path (`perf record`,
//! `valgrind --tool=callgrind`) without processes.
//!
//! `cargo run --release -p tmpi --example threads_pingpong [SIZE] [ITERS]`

fn main() {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(8);
    let iters: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let cfg = tmpi::config::Config::from_env().expect("TMPI_* configuration");
    let out = tmpi::run_shm_threads(2, cfg, |w| {
        let peer = 1 - w.rank();
        let sb = vec![1u8; size];
        let mut rb = vec![0u8; size];
        let mut t0 = 0.0;
        for i in 0..iters + 1000 {
            if i == 1000 {
                t0 = tmpi::wtime();
            }
            if w.rank() == 0 {
                w.send(&sb, peer, 1).expect("send");
                w.recv(&mut rb, peer, 1).expect("recv");
            } else {
                w.recv(&mut rb, peer, 1).expect("recv");
                w.send(&sb, peer, 1).expect("send");
            }
        }
        (tmpi::wtime() - t0) / iters as f64 / 2.0 * 1e6
    });
    println!("{size} B one-way latency: {:.3} us", out[0]);
}
