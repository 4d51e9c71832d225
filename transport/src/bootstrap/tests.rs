//! Server in a thread, several clients in threads.

use super::*;
use crate::auth::{self, Purpose};
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

/// The secret of the test jobs.
fn secret() -> JobSecret {
    JobSecret::from_bytes(*b"tmpi-test-secret")
}

fn serve(size: usize) -> (TmpSock, ServerThread) {
    let s = TmpSock::new();
    let srv = BootstrapServer::bind(&s.path, size, secret()).unwrap().spawn().unwrap();
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
                let mut c = BootstrapClient::connect(&path, r, n, &secret()).unwrap();
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
        let mut c = BootstrapClient::connect(&path, 1, 2, &secret()).unwrap();
        c.get("late-key").unwrap()
    });
    let mut c0 = BootstrapClient::connect(&sock.path, 0, 2, &secret()).unwrap();
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
    let mut c = BootstrapClient::connect(&sock.path, 2, 3, &secret()).unwrap();
    c.abort(17, "out of cheese").unwrap();
    let evs = events_until(&srv, |e| matches!(e, ServerEvent::Abort { .. }));
    assert_eq!(evs.last().unwrap(), &ServerEvent::Abort { rank: 2, code: 17, message: "out of cheese".into() });
}

#[test]
fn bad_hellos_are_refused() {
    let (sock, _srv) = serve(2);
    let _c0 = BootstrapClient::connect(&sock.path, 0, 2, &secret()).unwrap();
    let e = BootstrapClient::connect(&sock.path, 0, 2, &secret()).unwrap_err();
    assert!(e.to_string().contains("already connected"), "{e}");
    let e = BootstrapClient::connect(&sock.path, 1, 3, &secret()).unwrap_err();
    assert!(e.to_string().contains("3 ranks"), "{e}");
    assert!(BootstrapClient::connect(&sock.path, 2, 2, &secret()).is_err());
    // Rank 1 may still connect after the refusals.
    BootstrapClient::connect(&sock.path, 1, 2, &secret()).unwrap();
}

#[test]
fn fence_fails_when_a_rank_leaves() {
    let (sock, _srv) = serve(3);
    let path = sock.path.clone();
    let waiter = std::thread::spawn(move || {
        let mut c = BootstrapClient::connect(&path, 0, 3, &secret()).unwrap();
        c.fence()
    });
    let c1 = BootstrapClient::connect(&sock.path, 1, 3, &secret()).unwrap();
    let _c2 = BootstrapClient::connect(&sock.path, 2, 3, &secret()).unwrap();
    drop(c1); // rank 1 dies without finalize
    let e = waiter.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("rank 1 is gone"), "{e}");
}

#[test]
fn deadlocked_get_errors_instead_of_hanging() {
    let (sock, _srv) = serve(2);
    let path = sock.path.clone();
    let t = std::thread::spawn(move || {
        let mut c = BootstrapClient::connect(&path, 0, 2, &secret()).unwrap();
        c.get("never")
    });
    let mut c1 = BootstrapClient::connect(&sock.path, 1, 2, &secret()).unwrap();
    c1.finalize().unwrap();
    let e = t.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("never"), "{e}");
}

#[test]
fn server_gone_is_an_error() {
    let (sock, srv) = serve(2);
    let path = sock.path.clone();
    let t = std::thread::spawn(move || {
        let mut c = BootstrapClient::connect(&path, 0, 2, &secret()).unwrap();
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
    let mut good = BootstrapClient::connect(&sock.path, 0, 2, &secret()).unwrap();
    let mut raw = UnixStream::connect(&sock.path).unwrap();
    // Declared length far above the cap.
    raw.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert!(refused_and_closed(&mut raw), "server closes the bad connection");
    // Garbage body with a sane length.
    let mut raw = UnixStream::connect(&sock.path).unwrap();
    raw.write_all(&[3, 0, 0, 0, 0x42, 1, 2]).unwrap();
    assert!(refused_and_closed(&mut raw));
    // Before a hello, a malformed frame is a stranger's: refused, with the pid of the test.
    let evs = events_until(&srv, |e| matches!(e, ServerEvent::Refused { .. }));
    assert!(matches!(evs.last(), Some(ServerEvent::Refused { pid: Some(p), .. }) if *p == std::process::id() as i32), "{evs:?}");
    good.put("k", b"v").unwrap();
    assert_eq!(good.get("k").unwrap(), b"v");
}

/// Whether the server closed `raw` after its challenge and at most one error reply (what a
/// stranger gets).
fn refused_and_closed(raw: &mut (impl Read + ReadTimeout)) -> bool {
    raw.timeout(Duration::from_secs(10));
    let mut got = Vec::new();
    let r = raw.read_to_end(&mut got);
    if got.len() >= auth::CHALLENGE_LEN && got.starts_with(Purpose::Bootstrap.magic()) {
        got.drain(..auth::CHALLENGE_LEN);
    }
    match r {
        Ok(_) | Err(_) if got.is_empty() => true,
        Ok(_) => {
            let mut buf = got;
            matches!(proto::take_frame(&mut buf).map(|b| b.map(|b| Reply::decode(&b))), Ok(Some(Ok(Reply::Err(_))))) && buf.is_empty()
        }
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[test]
fn strangers_are_refused_and_change_nothing() {
    let (sock, srv) = serve(2);
    // A wrong secret, for a rank nobody has taken yet.
    let wrong = JobSecret::from_bytes(*b"not-the-secret!!");
    let e = BootstrapClient::connect(&sock.path, 1, 2, &wrong).unwrap_err();
    assert!(e.to_string().contains("closed the connection") || e.to_string().contains("secret"), "{e}");
    let evs = events_until(&srv, |e| matches!(e, ServerEvent::Refused { .. }));
    assert!(matches!(evs.last(), Some(ServerEvent::Refused { reason, .. }) if reason.contains("secret")), "{evs:?}");
    // A stranger that floods before any hello is cut off after one hello's worth of bytes.
    let mut raw = UnixStream::connect(&sock.path).unwrap();
    let _ = raw.write_all(&[0x11; 4096]);
    assert!(refused_and_closed(&mut raw), "server closes the flooding stranger");
    let evs = events_until(&srv, |e| matches!(e, ServerEvent::Refused { .. }));
    assert!(!evs.iter().any(|e| matches!(e, ServerEvent::Lost { .. } | ServerEvent::Connected { .. })), "{evs:?}");
    // Both real ranks still get in, and the fence works: no slot was taken, nothing broken.
    let path = sock.path.clone();
    let t = std::thread::spawn(move || {
        let mut c = BootstrapClient::connect(&path, 1, 2, &secret()).unwrap();
        c.fence()
    });
    let mut c0 = BootstrapClient::connect(&sock.path, 0, 2, &secret()).unwrap();
    c0.fence().unwrap();
    t.join().unwrap().unwrap();
}

#[test]
fn admitted_pids_and_their_descendants_only() {
    let s = TmpSock::new();
    let me = std::process::id() as i32;
    // Only pid 1's descendants (everything) would pass; a pid that is not an ancestor of
    // this test process must not.
    let mut srv = BootstrapServer::bind(&s.path, 1, secret()).unwrap();
    srv.admit_pids(vec![i32::MAX - 7]);
    let srv = srv.spawn().unwrap();
    let e = BootstrapClient::connect(&s.path, 0, 1, &secret()).unwrap_err();
    assert!(e.to_string().contains("closed the connection"), "{e}");
    let evs = events_until(&srv, |e| matches!(e, ServerEvent::Refused { .. }));
    assert!(
        matches!(evs.last(), Some(ServerEvent::Refused { pid: Some(p), reason }) if *p == me && reason.contains("not a rank")),
        "{evs:?}"
    );
    drop(srv);
    drop(s);
    // This process's parent admitted: the test (a descendant) gets in.
    let s = TmpSock::new();
    let mut srv = BootstrapServer::bind(&s.path, 1, secret()).unwrap();
    srv.admit_pids(vec![server::parent_of_for_tests(me).expect("parent pid")]);
    let _srv = srv.spawn().unwrap();
    let mut c = BootstrapClient::connect(&s.path, 0, 1, &secret()).unwrap();
    c.finalize().unwrap();
    assert!(server::descends_from(me, &[me]));
    assert!(!server::descends_from(me, &[i32::MAX - 7]));
}

#[test]
fn large_values_cross_intact() {
    let (sock, _srv) = serve(1);
    let mut c = BootstrapClient::connect(&sock.path, 0, 1, &secret()).unwrap();
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
    let hex = secret().to_hex();
    let ok = [
        ("TMPI_RANK", "2"),
        ("TMPI_SIZE", "4"),
        ("TMPI_JOBID", jobid),
        ("TMPI_SHM_NAME", shm),
        ("TMPI_BOOTSTRAP", "/tmp/x.sock"),
        ("TMPI_JOB_SECRET", hex.as_str()),
    ];
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
        ("TMPI_JOB_SECRET", "0123"),
        ("TMPI_JOB_SECRET", "zz23456789abcdef0123456789abcdef"),
    ] {
        let mut vars = ok.to_vec();
        vars.retain(|(n, _)| *n != var);
        vars.push((var, bad));
        let err = BootstrapEnv::from_lookup(env_of(&vars)).unwrap_err().to_string();
        assert!(err.contains(var), "{var}={bad}: {err}");
    }
    for var in ["TMPI_BOOTSTRAP", "TMPI_JOB_SECRET"] {
        let missing: Vec<_> = ok.iter().copied().filter(|(n, _)| *n != var).collect();
        let err = BootstrapEnv::from_lookup(env_of(&missing)).unwrap_err().to_string();
        assert!(err.contains(var), "{err}");
    }
    assert_eq!(e.secret, secret());
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
        "TMPI_SHM_PAIRS_MAX",
        "TMPI_SHM_LIMIT",
        "TMPI_MR_CACHE_MAX_COUNT",
        "TMPI_MR_CACHE_MAX_SIZE",
        "TMPI_MR_CACHE_MONITOR",
        "TMPI_POLL_SPIN",
        "TMPI_UNEXPECTED_MAX",
    ] {
        assert!(KNOBS.iter().any(|k| k.name == name), "{name} missing");
    }
}

#[test]
fn tcp_clients_meet_unix_clients_and_strangers_are_refused() {
    let s = TmpSock::new();
    let mut server = BootstrapServer::bind(&s.path, 2, secret()).unwrap();
    assert!(server.listen_tcp("0.0.0.0".parse().unwrap()).is_err(), "the wildcard address is refused");
    let addr = server.listen_tcp("127.0.0.1".parse().unwrap()).unwrap();
    assert!(server.listen_tcp("127.0.0.1".parse().unwrap()).is_err(), "one TCP listener");
    let srv = server.spawn().unwrap();
    let tcp = BootstrapAddr::parse(Path::new(&format!("tcp:{addr}"))).unwrap();
    assert_eq!(tcp, BootstrapAddr::Tcp(addr));
    assert_eq!(BootstrapAddr::parse(&PathBuf::from(tcp.to_env())).unwrap(), tcp);

    // A stranger over TCP: refused, and no rank slot is taken.
    let wrong = JobSecret::from_bytes(*b"not-the-secret!!");
    let e = BootstrapClient::connect_to(&tcp, 1, 2, &wrong).unwrap_err().to_string();
    assert!(e.contains("wrong job secret"), "{e}");
    let mut raw = std::net::TcpStream::connect(addr).unwrap();
    let _ = raw.write_all(&[0xff; 4096]);
    drop(raw);

    let path = s.path.clone();
    let local = std::thread::spawn(move || {
        let mut c = BootstrapClient::connect(&path, 0, 2, &secret()).unwrap();
        c.put("k0", b"unix").unwrap();
        c.fence().unwrap();
        let v = c.get("k1").unwrap();
        c.finalize().unwrap();
        v
    });
    let mut c = BootstrapClient::connect_to(&tcp, 1, 2, &secret()).unwrap();
    c.put("k1", b"tcp").unwrap();
    c.fence().unwrap();
    assert_eq!(c.get("k0").unwrap(), b"unix");
    c.finalize().unwrap();
    assert_eq!(local.join().unwrap(), b"tcp");
    let evs = events_until(&srv, |e| matches!(e, ServerEvent::Refused { .. }));
    assert!(evs.iter().any(|e| matches!(e, ServerEvent::Refused { pid: None, reason } if reason.contains("wrong job secret"))), "{evs:?}");
    srv.stop().unwrap();
}

#[test]
fn bootstrap_addresses_are_checked() {
    assert_eq!(BootstrapAddr::parse(Path::new("/tmp/x.sock")).unwrap(), BootstrapAddr::Unix("/tmp/x.sock".into()));
    assert_eq!(BootstrapAddr::parse(Path::new("tcp:[::1]:7")).unwrap(), BootstrapAddr::Tcp("[::1]:7".parse().unwrap()));
    for bad in ["", "tcp:", "tcp:host:1", "tcp:1.2.3.4", "tcp:1.2.3.4:99999"] {
        let e = BootstrapAddr::parse(Path::new(bad)).unwrap_err().to_string();
        assert!(e.contains("TMPI_BOOTSTRAP"), "{bad}: {e}");
    }
}

/// Streams whose read timeout the tests set.
trait ReadTimeout {
    fn timeout(&self, t: Duration);
}

impl ReadTimeout for UnixStream {
    fn timeout(&self, t: Duration) {
        self.set_read_timeout(Some(t)).unwrap();
    }
}

impl ReadTimeout for TcpStream {
    fn timeout(&self, t: Duration) {
        self.set_read_timeout(Some(t)).unwrap();
    }
}

/// Reads the server's challenge on `s` and returns the whole `hello` frame a client of
/// `rank` of `size` that knows `secret` would send, with the client's nonce.
fn hello_frame(s: &mut impl Read, secret: &JobSecret, rank: u32, size: u32) -> (Vec<u8>, [u8; auth::NONCE_LEN]) {
    let mut ch = [0u8; auth::CHALLENGE_LEN];
    s.read_exact(&mut ch).unwrap();
    let nonce = auth::nonce().unwrap();
    let ans = auth::answer(Purpose::Bootstrap, secret, &ch, rank, size, &nonce).expect("a bootstrap challenge");
    let mut mac = [0u8; auth::MAC_LEN];
    mac.copy_from_slice(&ans[8 + auth::NONCE_LEN..]);
    let mut out = Vec::new();
    proto::Request::Hello { version: proto::VERSION, rank, size, nonce, mac }.encode(&mut out).unwrap();
    (out, nonce)
}

/// One reply frame from `s`.
fn read_reply(s: &mut impl Read) -> Reply {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    Reply::decode(&body).unwrap()
}

#[test]
fn the_secret_never_travels_and_answers_cannot_be_replayed() {
    let s = TmpSock::new();
    let mut server = BootstrapServer::bind(&s.path, 2, secret()).unwrap();
    let addr = server.listen_tcp("127.0.0.1".parse().unwrap()).unwrap();
    let srv = server.spawn().unwrap();
    let hello = honest_hello(&srv, addr);
    // The same hello replayed on a new connection (another challenge): refused, closed,
    // counted, and it takes no slot (rank 0 was never claimed by it).
    for claim in [0u32, 1] {
        let mut b = TcpStream::connect(addr).unwrap();
        let mut ch = [0u8; auth::CHALLENGE_LEN];
        b.read_exact(&mut ch).unwrap();
        let mut replay = hello.clone();
        replay[9..13].copy_from_slice(&claim.to_le_bytes());
        b.write_all(if claim == 1 { &hello } else { &replay }).unwrap();
        assert!(refused_and_closed(&mut b), "a replayed hello was answered");
        expect_refused(&srv, "wrong job secret");
    }
    wrong_answers(&srv, &s.path, addr);
    // Rank 0 still gets in, and the job works.
    let mut c0 = BootstrapClient::connect(&s.path, 0, 2, &secret()).unwrap();
    c0.put("k", b"v").unwrap();
    srv.stop().unwrap();
}

/// The next connection `srv` reports is refused for a reason that contains `why`, and none
/// was admitted before it.
fn expect_refused(srv: &ServerThread, why: &str) {
    let evs = events_until(srv, |e| matches!(e, ServerEvent::Refused { .. }));
    assert!(matches!(evs.last(), Some(ServerEvent::Refused { reason, .. }) if reason.contains(why)), "{evs:?}");
    assert!(!evs.iter().any(|e| matches!(e, ServerEvent::Connected { .. })), "{evs:?}");
}

/// An honest raw client over TCP as rank 1: its hello holds no byte string of the secret,
/// and the server answers with a proof that checks. Returns the hello.
fn honest_hello(srv: &ServerThread, addr: std::net::SocketAddr) -> Vec<u8> {
    let mut a = TcpStream::connect(addr).unwrap();
    let (hello, nonce) = hello_frame(&mut a, &secret(), 1, 2);
    assert!(!hello.windows(auth::NONCE_LEN).any(|w| w == secret().as_bytes()), "the secret is on the wire");
    a.write_all(&hello).unwrap();
    match read_reply(&mut a) {
        Reply::Value(p) => {
            let p: [u8; auth::MAC_LEN] = p.as_slice().try_into().unwrap();
            assert!(auth::check_accept(Purpose::Bootstrap, &secret(), &nonce, auth::SERVICE_RANK, 2, &p));
        }
        r => panic!("hello answered {r:?}"),
    }
    let evs = events_until(srv, |e| matches!(e, ServerEvent::Connected { .. }));
    assert_eq!(evs.last(), Some(&ServerEvent::Connected { rank: 1 }));
    hello
}

/// Wrong answers: the MAC made with another secret (over the Unix socket `path`), a MAC with
/// a bit flipped (over TCP), and the old hello with the secret in clear; each refused.
fn wrong_answers(srv: &ServerThread, path: &std::path::Path, addr: std::net::SocketAddr) {
    let mut u = UnixStream::connect(path).unwrap();
    let (bad, _) = hello_frame(&mut u, &JobSecret::from_bytes(*b"not-the-secret!!"), 0, 2);
    u.write_all(&bad).unwrap();
    assert!(refused_and_closed(&mut u));
    expect_refused(srv, "wrong job secret");
    let mut t = TcpStream::connect(addr).unwrap();
    let (mut flipped, _) = hello_frame(&mut t, &secret(), 0, 2);
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    t.write_all(&flipped).unwrap();
    assert!(refused_and_closed(&mut t));
    expect_refused(srv, "wrong job secret");
    // The old hello, with the secret in clear, is no hello at all.
    let mut old = TcpStream::connect(addr).unwrap();
    let mut ch = [0u8; auth::CHALLENGE_LEN];
    old.read_exact(&mut ch).unwrap();
    let mut v2 = vec![29, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0];
    v2.extend_from_slice(secret().as_bytes());
    old.write_all(&v2).unwrap();
    assert!(refused_and_closed(&mut old));
    expect_refused(srv, "");
}

#[test]
fn a_service_without_the_secret_is_not_trusted() {
    // A "tmpirun" that challenges properly but cannot prove the job's secret.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let impostor = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(&auth::challenge(Purpose::Bootstrap, &auth::nonce().unwrap())).unwrap();
        let mut hello = [0u8; proto::HELLO_FRAME_LEN];
        s.read_exact(&mut hello).unwrap();
        let mut out = Vec::new();
        Reply::Value(vec![7; auth::MAC_LEN]).encode(&mut out);
        s.write_all(&out).unwrap();
        // Whatever the rank would say next is not read.
        std::thread::sleep(Duration::from_millis(200));
    });
    let e = BootstrapClient::connect_to(&BootstrapAddr::Tcp(addr), 0, 2, &secret()).unwrap_err().to_string();
    assert!(e.contains("did not prove the job secret"), "{e}");
    impostor.join().unwrap();
    // A listener that says nothing at all is not waited for forever either (HELLO_TIMEOUT),
    // and one that speaks another protocol is refused at once.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let other = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(&auth::challenge(Purpose::Fabric, &[0; auth::NONCE_LEN])).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    });
    let e = BootstrapClient::connect_to(&BootstrapAddr::Tcp(addr), 0, 2, &secret()).unwrap_err().to_string();
    assert!(e.contains("bad challenge"), "{e}");
    other.join().unwrap();
}

#[test]
fn ofi_provider_values() {
    let table: &[(&str, Option<Option<&str>>)] = &[
        ("auto", Some(None)),
        ("", Some(None)),
        (" tcp ", Some(Some("tcp"))),
        ("tcp;ofi_rxm", Some(Some("tcp;ofi_rxm"))),
        ("psm3", Some(Some("psm3"))),
        ("not-a-value", None),
        ("TCP", None),
        ("tcp;", None),
        ("tcp ofi", None),
    ];
    for &(v, want) in table {
        assert_eq!(super::parse_ofi_provider(v), want.map(|o| o.map(String::from)), "{v:?}");
    }
}

/// Issue 55 item 3: strangers beyond the ranks still missing (and a margin) are closed, the
/// oldest first, as soon as newcomers arrive; a rank still gets in through the flood.
#[test]
fn a_flood_of_strangers_is_capped_and_a_rank_still_gets_in() {
    let s = TmpSock::new();
    let mut server = BootstrapServer::bind(&s.path, 2, secret()).unwrap();
    server.set_peer_timeout(Some(Duration::from_secs(20)));
    let addr = server.listen_tcp("127.0.0.1".parse().unwrap()).unwrap();
    let srv = server.spawn().unwrap();
    let extra = 40;
    let flood: Vec<std::net::TcpStream> =
        (0..2 + server::STRANGERS_BEYOND_RANKS + extra).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
    let mut refused = 0;
    while refused < extra {
        let ev = srv.events().recv_timeout(Duration::from_secs(30)).expect("strangers beyond the cap are closed at once");
        if let ServerEvent::Refused { reason, .. } = &ev {
            assert!(reason.contains("too many connections waiting"), "{ev:?}");
            refused += 1;
        }
    }
    // The first ones were closed: reading them ends.
    let mut first = &flood[0];
    first.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = Vec::new();
    let _ = std::io::Read::read_to_end(&mut first, &mut buf);
    let tcp = BootstrapAddr::Tcp(addr);
    let mut c = BootstrapClient::connect_to(&tcp, 1, 2, &secret()).expect("a rank gets in through the flood");
    c.put("k", b"v").unwrap();
    let evs = events_until(&srv, |e| matches!(e, ServerEvent::Connected { .. }));
    assert_eq!(evs.last(), Some(&ServerEvent::Connected { rank: 1 }));
    drop(flood);
    drop(c);
    srv.stop().unwrap();
}

/// Issue 55 item 3: a connection that says nothing is closed after HELLO_DEADLINE (10 s, was
/// 60 s), without any other event to wake the server.
#[test]
fn a_silent_stranger_is_closed_after_the_hello_deadline() {
    let s = TmpSock::new();
    let mut server = BootstrapServer::bind(&s.path, 2, secret()).unwrap();
    let addr = server.listen_tcp("127.0.0.1".parse().unwrap()).unwrap();
    let srv = server.spawn().unwrap();
    let t = std::time::Instant::now();
    let mut quiet = std::net::TcpStream::connect(addr).unwrap();
    let ev = srv.events().recv_timeout(Duration::from_secs(40)).expect("the silent stranger is closed");
    let took = t.elapsed();
    assert!(matches!(&ev, ServerEvent::Refused { pid: None, reason } if reason.contains("no hello within 10 s")), "{ev:?}");
    assert!(took >= server::HELLO_DEADLINE, "closed after {took:?}");
    let mut rest = Vec::new();
    quiet.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = std::io::Read::read_to_end(&mut quiet, &mut rest);
    assert!(rest.starts_with(auth::Purpose::Bootstrap.magic()), "it got its challenge, then the end");
    eprintln!("bootstrap: a silent stranger was closed after {took:?}");
    srv.stop().unwrap();
}

#[test]
fn a_live_tcp_rank_owes_no_answer_and_strangers_set_a_wake_up() {
    let s = TmpSock::new();
    let mut server = BootstrapServer::bind(&s.path, 2, secret()).unwrap();
    server.set_peer_timeout(Some(Duration::from_secs(3)));
    let addr = server.listen_tcp("127.0.0.1".parse().unwrap()).unwrap();
    assert_eq!(server.next_wake(), None, "nothing timed to do");
    let tcp = BootstrapAddr::Tcp(addr);
    let client = std::thread::spawn(move || {
        let mut c = BootstrapClient::connect_to(&tcp, 0, 2, &secret()).unwrap();
        c.put("k", b"v").unwrap();
        c
    });
    let _stranger = std::net::TcpStream::connect(addr).unwrap();
    let t = std::time::Instant::now();
    let mut connected = false;
    while !connected || server.next_wake().is_none() {
        connected |= server.wait(Some(Duration::from_millis(100))).unwrap().contains(&ServerEvent::Connected { rank: 0 });
        assert!(t.elapsed() < Duration::from_secs(30), "the rank never connected");
    }
    while !client.is_finished() {
        server.wait(Some(Duration::from_millis(100))).unwrap();
        assert!(t.elapsed() < Duration::from_secs(30), "the rank's put was never answered");
    }
    let c = client.join().unwrap();
    let wake = server.next_wake().expect("a stranger's deadline");
    assert!(wake > std::time::Instant::now() && wake <= std::time::Instant::now() + server::HELLO_DEADLINE + Duration::from_secs(1));
    // Its host answers: nothing is owed once the last reply was acknowledged.
    let t = std::time::Instant::now();
    while !server.unanswered_ranks().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", server.unanswered_ranks());
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(c);
}

/// The clock request answers with the server's `CLOCK_MONOTONIC`: on one host the answer lies
/// between the client's readings before and after (the same clock; no timing is assumed).
#[test]
fn clock_answers_inside_the_round_trip() {
    let (sock, _srv) = serve(1);
    let mut c = BootstrapClient::connect(&sock.path, 0, 1, &secret()).unwrap();
    let now = || {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec for the call.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    for _ in 0..3 {
        let (t0, server, t3) = c.clock(now).unwrap();
        assert!(t0 <= server && server <= t3, "{t0} {server} {t3}");
    }
    c.finalize().unwrap();
    assert!(c.clock(now).is_err(), "no clock after finalize");
}

/// Drives `srv` in this thread until it reports a spawn; returns the rank and request.
fn spawn_event(srv: &mut BootstrapServer) -> (usize, spawn::SpawnRequest) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < until {
        for ev in srv.wait(Some(Duration::from_millis(50))).unwrap() {
            assert!(!matches!(ev, ServerEvent::Rejected { .. } | ServerEvent::Refused { .. }), "{ev:?}");
            if let ServerEvent::Spawn { rank, request } = ev {
                return (rank, request);
            }
        }
    }
    panic!("no spawn request in 10 s");
}

/// A spawn waits for the launcher's answer (a fence of the other rank is not taken for a
/// deadlock meanwhile), and the answer reaches the client: the bridge, or tmpirun's reason.
#[test]
fn a_spawn_waits_for_the_launchers_answer() {
    let s = TmpSock::new();
    let mut srv = BootstrapServer::bind(&s.path, 2, secret()).unwrap();
    let app = spawn::SpawnApp { program: "prog".into(), args: vec!["x".into()], env: vec![], cwd: None, procs: 2 };
    let req = spawn::SpawnRequest { parents: 2, apps: vec![app] };
    let (p0, p1, r0) = (s.path.clone(), s.path.clone(), req.clone());
    let root = std::thread::spawn(move || {
        let mut c = BootstrapClient::connect(&p0, 0, 2, &secret()).unwrap();
        let first = c.spawn(r0.clone());
        let second = c.spawn(r0);
        c.fence().unwrap();
        (first, second)
    });
    let other = std::thread::spawn(move || BootstrapClient::connect(&p1, 1, 2, &secret()).unwrap().fence());
    let bridge = spawn::Bridge {
        jobid: "0123456789abcdef".into(),
        shm_name: "tmpi-0123456789abcdef-0123456789abcdef".into(),
        parents: 2,
        size: 4,
        bootstrap: BootstrapAddr::Unix("/tmp/b.sock".into()),
    };
    let (rank, got) = spawn_event(&mut srv);
    assert_eq!((rank, &got), (0, &req));
    srv.answer_spawn(0, Ok(bridge.to_env()));
    let (rank, _) = spawn_event(&mut srv);
    srv.answer_spawn(rank, Err("no program \"prog\"".into()));
    // Answers to a rank that waits for none, or to no rank, change nothing.
    srv.answer_spawn(1, Ok(String::new()));
    srv.answer_spawn(7, Ok(String::new()));
    while !root.is_finished() || !other.is_finished() {
        srv.wait(Some(Duration::from_millis(20))).unwrap();
    }
    let (first, second) = root.join().unwrap();
    assert_eq!(first.unwrap(), bridge);
    assert!(matches!(second, Err(Error::Bootstrap(m)) if m == "no program \"prog\""));
    other.join().unwrap().unwrap();
}
