//! Server in a thread, several clients in threads.

use super::*;
use std::ffi::OsString;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh socket path in a private directory (removed by the guard).
struct TmpSock {
    dir: PathBuf,
    path: PathBuf,
}

impl TmpSock {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("tmpi-bs-test-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kv.sock");
        TmpSock { dir, path }
    }
}

impl Drop for TmpSock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn serve(size: usize) -> (TmpSock, ServerThread) {
    let s = TmpSock::new();
    let srv = BootstrapServer::bind(&s.path, size).unwrap().spawn().unwrap();
    (s, srv)
}

fn events_until(srv: &ServerThread, mut stop: impl FnMut(&ServerEvent) -> bool) -> Vec<ServerEvent> {
    let mut got = Vec::new();
    loop {
        let ev = srv.events().recv_timeout(Duration::from_secs(10)).expect("server event");
        let done = stop(&ev);
        got.push(ev);
        if done {
            return got;
        }
    }
}

#[test]
fn put_fence_get_across_ranks() {
    let n = 5;
    let (sock, srv) = serve(n);
    let path = sock.path.clone();
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut c = BootstrapClient::connect(&path, r, n).unwrap();
                assert_eq!((c.rank(), c.size()), (r, n));
                c.put(&format!("addr-{r}"), format!("value of {r}").as_bytes()).unwrap();
                c.fence().unwrap();
                let mut seen = Vec::new();
                for p in 0..n {
                    seen.push(String::from_utf8(c.get(&format!("addr-{p}")).unwrap()).unwrap());
                }
                // A second fence works too.
                c.fence().unwrap();
                c.finalize().unwrap();
                assert!(c.put("late", b"x").is_err(), "calls after finalize must fail");
                seen
            })
        })
        .collect();
    for h in handles {
        let seen = h.join().unwrap();
        let want: Vec<String> = (0..n).map(|p| format!("value of {p}")).collect();
        assert_eq!(seen, want);
    }
    let mut count = 0;
    let evs = events_until(&srv, |_| {
        count += 1;
        count == 2 * n
    });
    let fin = evs.iter().filter(|e| matches!(e, ServerEvent::Finalized { .. })).count();
    let con = evs.iter().filter(|e| matches!(e, ServerEvent::Connected { .. })).count();
    assert_eq!((fin, con), (n, n), "{evs:?}");
    srv.stop().unwrap();
    assert!(!path.exists(), "socket file removed when the server stops");
}

#[test]
fn get_blocks_until_put() {
    let (sock, srv) = serve(2);
    let path = sock.path.clone();
    let getter = std::thread::spawn(move || {
        let mut c = BootstrapClient::connect(&path, 1, 2).unwrap();
        c.get("late-key").unwrap()
    });
    let mut c0 = BootstrapClient::connect(&sock.path, 0, 2).unwrap();
    // Give the getter time to be waiting (if it is not yet, the test still holds).
    std::thread::sleep(Duration::from_millis(50));
    assert!(!getter.is_finished(), "get must wait for the put");
    c0.put("late-key", b"now").unwrap();
    assert_eq!(getter.join().unwrap(), b"now");
    // Overwrite.
    c0.put("late-key", b"again").unwrap();
    assert_eq!(c0.get("late-key").unwrap(), b"again");
    drop(srv);
}

#[test]
fn abort_is_reported() {
    let (sock, srv) = serve(3);
    let mut c = BootstrapClient::connect(&sock.path, 2, 3).unwrap();
    c.abort(17, "out of cheese").unwrap();
    let evs = events_until(&srv, |e| matches!(e, ServerEvent::Abort { .. }));
    assert_eq!(evs.last().unwrap(), &ServerEvent::Abort { rank: 2, code: 17, message: "out of cheese".into() });
}

#[test]
fn bad_hellos_are_refused() {
    let (sock, _srv) = serve(2);
    let _c0 = BootstrapClient::connect(&sock.path, 0, 2).unwrap();
    let e = BootstrapClient::connect(&sock.path, 0, 2).unwrap_err();
    assert!(e.to_string().contains("already connected"), "{e}");
    let e = BootstrapClient::connect(&sock.path, 1, 3).unwrap_err();
    assert!(e.to_string().contains("3 ranks"), "{e}");
    assert!(BootstrapClient::connect(&sock.path, 2, 2).is_err());
    // Rank 1 may still connect after the refusals.
    BootstrapClient::connect(&sock.path, 1, 2).unwrap();
}

#[test]
fn fence_fails_when_a_rank_leaves() {
    let (sock, _srv) = serve(3);
    let path = sock.path.clone();
    let waiter = std::thread::spawn(move || {
        let mut c = BootstrapClient::connect(&path, 0, 3).unwrap();
        c.fence()
    });
    let c1 = BootstrapClient::connect(&sock.path, 1, 3).unwrap();
    let _c2 = BootstrapClient::connect(&sock.path, 2, 3).unwrap();
    drop(c1); // rank 1 dies without finalize
    let e = waiter.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("rank 1 is gone"), "{e}");
}

#[test]
fn deadlocked_get_errors_instead_of_hanging() {
    let (sock, _srv) = serve(2);
    let path = sock.path.clone();
    let t = std::thread::spawn(move || {
        let mut c = BootstrapClient::connect(&path, 0, 2).unwrap();
        c.get("never")
    });
    let mut c1 = BootstrapClient::connect(&sock.path, 1, 2).unwrap();
    c1.finalize().unwrap();
    let e = t.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("never"), "{e}");
}

#[test]
fn server_gone_is_an_error() {
    let (sock, srv) = serve(2);
    let path = sock.path.clone();
    let t = std::thread::spawn(move || {
        let mut c = BootstrapClient::connect(&path, 0, 2).unwrap();
        c.get("x")
    });
    std::thread::sleep(Duration::from_millis(30));
    srv.stop().unwrap();
    let e = t.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("closed the connection"), "{e}");
}

#[test]
fn malformed_frames_disconnect_only_that_client() {
    let (sock, srv) = serve(2);
    let mut good = BootstrapClient::connect(&sock.path, 0, 2).unwrap();
    let mut raw = UnixStream::connect(&sock.path).unwrap();
    // Declared length far above the cap.
    raw.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(raw.read(&mut b).unwrap(), 0, "server closes the bad connection");
    // Garbage body with a sane length.
    let mut raw = UnixStream::connect(&sock.path).unwrap();
    raw.write_all(&[3, 0, 0, 0, 0x42, 1, 2]).unwrap();
    assert_eq!(raw.read(&mut b).unwrap(), 0);
    let evs = events_until(&srv, |e| matches!(e, ServerEvent::Rejected { .. }));
    assert!(matches!(evs.last(), Some(ServerEvent::Rejected { rank: None, .. })));
    good.put("k", b"v").unwrap();
    assert_eq!(good.get("k").unwrap(), b"v");
}

#[test]
fn large_values_cross_intact() {
    let (sock, _srv) = serve(1);
    let mut c = BootstrapClient::connect(&sock.path, 0, 1).unwrap();
    let v: Vec<u8> = (0..proto::MAX_VALUE_LEN).map(|i| (i * 7 % 251) as u8).collect();
    c.put("big", &v).unwrap();
    assert_eq!(c.get("big").unwrap(), v);
    assert!(c.put("too-big", &vec![0; proto::MAX_VALUE_LEN + 1]).is_err());
    c.fence().unwrap();
}

fn env_of<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
    move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v))
}

#[test]
fn env_parsing() {
    assert_eq!(BootstrapEnv::from_lookup(env_of(&[])).unwrap(), None);
    let jobid = "0123456789abcdef";
    let shm = "tmpi-0123456789abcdef-fedcba9876543210";
    let ok = [("TMPI_RANK", "2"), ("TMPI_SIZE", "4"), ("TMPI_JOBID", jobid), ("TMPI_SHM_NAME", shm), ("TMPI_BOOTSTRAP", "/tmp/x.sock")];
    let e = BootstrapEnv::from_lookup(env_of(&ok)).unwrap().unwrap();
    assert_eq!((e.rank, e.size, e.local_rank, e.local_size), (2, 4, 2, 4));
    assert_eq!((e.jobid.as_str(), e.shm_name.as_str()), (jobid, shm));
    for (var, bad) in [
        ("TMPI_RANK", "x"),
        ("TMPI_RANK", "4"),
        ("TMPI_SIZE", "0"),
        ("TMPI_JOBID", "0123"),
        ("TMPI_JOBID", "0123456789ABCDEF"),
        ("TMPI_SHM_NAME", "tmpi-0123456789abcdef-zz"),
        ("TMPI_SHM_NAME", "other"),
        ("TMPI_LOCAL_RANK", "9"),
    ] {
        let mut vars = ok.to_vec();
        vars.retain(|(n, _)| *n != var);
        vars.push((var, bad));
        let err = BootstrapEnv::from_lookup(env_of(&vars)).unwrap_err().to_string();
        assert!(err.contains(var), "{var}={bad}: {err}");
    }
    let missing: Vec<_> = ok.iter().copied().filter(|(n, _)| *n != "TMPI_BOOTSTRAP").collect();
    let err = BootstrapEnv::from_lookup(env_of(&missing)).unwrap_err().to_string();
    assert!(err.contains("TMPI_BOOTSTRAP"), "{err}");
}

#[test]
fn ids_have_the_promised_shape() {
    let a = new_jobid().unwrap();
    let b = new_jobid().unwrap();
    assert!(is_hex16(&a) && is_hex16(&b));
    assert_ne!(a, b);
    let s = new_shm_name(&a).unwrap();
    assert!(s.starts_with(&format!("tmpi-{a}-")) && is_hex16(&s[22..]), "{s}");
}

#[test]
fn knob_table_is_complete() {
    for name in [
        "TMPI_STATS",
        "TMPI_EAGER_LIMIT",
        "TMPI_RNDV_THRESHOLD",
        "TMPI_TM_MAX_TAGS",
        "TMPI_TM_THRESH",
        "TMPI_SHM_RING_SIZE",
        "TMPI_MR_CACHE_MAX_COUNT",
        "TMPI_MR_CACHE_MAX_SIZE",
        "TMPI_MR_CACHE_MONITOR",
        "TMPI_POLL_SPIN",
        "TMPI_UNEXPECTED_MAX",
    ] {
        assert!(KNOBS.iter().any(|k| k.name == name), "{name} missing");
    }
}
