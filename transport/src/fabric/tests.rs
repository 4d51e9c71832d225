//! What each fabric reports through the [`Fabric`] trait: the capabilities the engine acts on
//! instead of the fabric's kind.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;

use super::*;
use crate::bootstrap::JobSecret;
use crate::local::LocalFabric;
use crate::shm::ShmFabric;
use crate::tcp::{self, TcpFabric};

/// A hybrid job of three ranks on one machine: world ranks 0 and 1 share a segment (one
/// "host"), rank 2 is reached over TCP (loopback). Returns the hybrid fabrics of ranks 0 and 1
/// and the TCP fabric of rank 2.
fn hybrid_job() -> (AnyFabric, AnyFabric, TcpFabric) {
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let secret = JobSecret::new().expect("secret");
    let ls: Vec<TcpListener> = (0..3).map(|_| tcp::listen(lo).expect("listen")).collect();
    let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().expect("addr")).collect();
    let peers_of = |r: usize| -> Vec<(usize, SocketAddr)> {
        let ps: &[usize] = if r == 2 { &[0, 1] } else { &[2] };
        ps.iter().map(|&p| (p, addrs[p])).collect()
    };
    let mut tcps: Vec<TcpFabric> = std::thread::scope(|s| {
        let hs: Vec<_> = ls
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let (peers, secret) = (peers_of(r), secret.clone());
                s.spawn(move || TcpFabric::establish(r, 3, l, &peers, &secret, Duration::from_secs(30)).expect("establish"))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let name = format!("tmpi-fabric-caps-{}", std::process::id());
    let s0 = ShmFabric::create(&name, 0, 2, 1 << 16).expect("segment");
    let s1 = ShmFabric::open(&name, 1, 2).expect("segment");
    s0.unlink().expect("unlink");
    let t2 = tcps.pop().expect("rank 2");
    let t1 = tcps.pop().expect("rank 1");
    let t0 = tcps.pop().expect("rank 0");
    let h = |s, t| AnyFabric::Hybrid(Box::new(HybridFabric::new(s, t, 3, vec![0, 1]).expect("hybrid")));
    (h(s0, t0), h(s1, t1), t2)
}

#[test]
fn each_peer_of_a_hybrid_job_gets_the_caps_of_the_fabric_that_reaches_it() {
    let (mut h0, mut h1, mut t2) = hybrid_job();
    let shm = h0.peer_caps(1);
    assert_eq!((shm.max_parts, shm.single_copy, shm.pipelined), (usize::MAX, true, true), "the shared-memory peer");
    let net = h0.peer_caps(2);
    assert_eq!((net.max_parts, net.single_copy, net.pipelined), (tcp::MAX_PARTS, false, false), "the TCP peer");
    assert_eq!(net.max_packet, tcp::MAX_PACKET);
    assert_eq!(h0.max_packet(), shm.max_packet.min(net.max_packet), "the bound for every peer is the smallest");
    assert_eq!(h0.wakeup(), Wakeup::Sockets { all: false });
    assert_eq!(Fabric::wakeup(&t2), Wakeup::Sockets { all: true });
    assert!(h0.segment().is_none(), "the segment does not hold every rank under its world rank");
    assert_eq!((h0.polled_connections(), t2.polled_connections()), (1, 2));
    assert_eq!(h0.name(), "hybrid");

    // Five parts go to the shared-memory peer; the TCP peer takes three at most.
    let parts: [&[u8]; 5] = [b"a", b"b", b"c", b"d", b"e"];
    assert!(h0.try_send(1, PKT_WHOLE, 5, &parts).expect("to the ring"));
    assert!(h0.try_send(2, PKT_WHOLE, 5, &parts).is_err());
    assert!(h0.try_send(2, PKT_WHOLE, 3, &parts[..3]).expect("to the socket"));
    let mut got = Vec::new();
    while got.is_empty() {
        h1.poll(|p| {
            got.push((p.src, p.data.to_vec()));
            true
        })
        .expect("poll");
    }
    assert_eq!(got, [(0, b"abcde".to_vec())], "world ranks, not segment indices");
    let mut got = Vec::new();
    while got.is_empty() {
        Fabric::poll(&mut t2, |p| {
            got.push((p.src, p.data.to_vec()));
            true
        })
        .expect("poll");
    }
    assert_eq!(got, [(0, b"abc".to_vec())]);
    assert_eq!(h0.peer_pid(2), std::process::id(), "a peer on another host is watched through its connection");
    assert_eq!(h0.peer_state(1), PeerState::Alive);
}

#[test]
fn shared_memory_local_and_single_report_what_they_offer() {
    let name = format!("tmpi-fabric-caps1-{}", std::process::id());
    let s0 = ShmFabric::create(&name, 0, 2, 1 << 16).expect("segment");
    let _s1 = ShmFabric::open(&name, 1, 2).expect("segment");
    s0.unlink().expect("unlink");
    let shm = AnyFabric::Shm(s0);
    let local = AnyFabric::Local(LocalFabric::create(2, 4096).swap_remove(0));
    let single = AnyFabric::Single;
    for (f, name, wakeup, pipelined, segment) in [
        (&shm, "shm", Wakeup::Doorbell, true, true),
        (&local, "local", Wakeup::Nothing, false, false),
        (&single, "single", Wakeup::Nothing, false, false),
    ] {
        let c = f.peer_caps(1);
        assert_eq!((f.name(), f.wakeup(), c.pipelined, f.segment().is_some()), (name, wakeup, pipelined, segment));
        assert!(c.single_copy && c.max_parts == usize::MAX, "{name}");
        assert_eq!(c.max_packet, f.max_packet(), "{name}");
        assert_eq!(f.caps(), Caps::default(), "{name}: no fabric here matches tags or reads by itself");
        assert_eq!(f.polled_connections(), 0, "{name}");
    }
    assert_eq!(local.max_packet(), 4096);
}

#[test]
fn fabric_choices_parse_in_every_build() {
    let table = [("auto", Some(FabricChoice::Auto)), ("", Some(FabricChoice::Auto)), (" shm ", Some(FabricChoice::Shm))];
    let more = [("tcp", Some(FabricChoice::Tcp)), ("ofi", Some(FabricChoice::Ofi)), ("OFI", None), ("verbs", None)];
    for (v, want) in table.into_iter().chain(more) {
        assert_eq!(FabricChoice::parse(v).ok(), want, "{v:?}");
    }
    let e = FabricChoice::parse("ib").unwrap_err().to_string();
    assert!(e.contains("TMPI_FABRIC") && e.contains("ofi"), "{e}");
}
