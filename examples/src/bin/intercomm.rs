//! Two groups joined by an intercommunicator: the world splits into a "client" half (the
//! first `n / 2` ranks) and a "server" half (the rest), and `intercomm_create` joins them
//! with rank 0 of each half as its leader.
//!
//! Across the intercommunicator, every client sends a request (its world rank) to server
//! `rank % servers`; each server takes its requests from any client (`ANY_SOURCE` over the
//! remote group) and answers each with the square. Then server 0 broadcasts a value to every
//! client (MPI's `ROOT`/`PROC_NULL` convention), a barrier spans both groups, and `merge` puts
//! the servers first (the clients pass `high = true`) in one intracommunicator, where an
//! allreduce and the new ranks are checked. Every rank checks its own results; a final
//! `allreduce` of the verdicts lets rank 0 speak for all. It needs at least 2 ranks.

use std::error::Error;

use tmpi::{InterComm, InterRoot, Op, ANY_SOURCE};
use tmpi_examples::check;

/// Tags of the requests and the answers.
const REQUEST: tmpi::Tag = 1;
const ANSWER: tmpi::Tag = 2;

fn serve(ic: &InterComm, world_rank: usize, bad: &mut Vec<String>) -> tmpi::Result<()> {
    let (me, servers, clients) = (ic.rank(), ic.size(), ic.remote_size());
    // Clients c with c % servers == me send here.
    let mine = (0..clients).filter(|c| c % servers == me).count();
    for _ in 0..mine {
        let mut req = [0u64];
        let st = ic.recv(&mut req, ANY_SOURCE, REQUEST)?;
        // A client's world rank is its rank in the client group (the clients come first).
        if req[0] as usize != st.source() {
            bad.push(format!("server {me}: request {} from client {}", req[0], st.source()));
        }
        ic.send(&[req[0] * req[0]], st.source(), ANSWER)?;
    }
    let mut b = [world_rank as u64 + 1000];
    ic.bcast(&mut b, if me == 0 { InterRoot::Root } else { InterRoot::ProcNull })?;
    Ok(())
}

fn ask(ic: &InterComm, world_rank: usize, n: usize, bad: &mut Vec<String>) -> tmpi::Result<()> {
    let server = ic.rank() % ic.remote_size();
    ic.send(&[world_rank as u64], server, REQUEST)?;
    let mut answer = [0u64];
    ic.recv(&mut answer, server, ANSWER)?;
    let w = world_rank as u64;
    if answer[0] != w * w {
        bad.push(format!("client {}: answer {} to {w}", ic.rank(), answer[0]));
    }
    let mut b = [0u64];
    ic.bcast(&mut b, InterRoot::Remote(0))?;
    // Server 0 is world rank n / 2.
    if b[0] != (n / 2) as u64 + 1000 {
        bad.push(format!("client {}: broadcast gave {}", ic.rank(), b[0]));
    }
    Ok(())
}

fn local_checks(world: &tmpi::Comm) -> Result<Vec<String>, tmpi::Error> {
    let (rank, n) = (world.rank(), world.size());
    let clients = n / 2;
    let client = rank < clients;
    let half = world.split(Some(u32::from(client)), 0)?.ok_or(tmpi::Error::State("split gave no communicator".into()))?;
    let ic = half.intercomm_create(0, world, if client { clients } else { 0 }, 77)?;
    let mut bad = Vec::new();
    let (size, remote) = if client { (clients, n - clients) } else { (n - clients, clients) };
    if ic.size() != size || ic.remote_size() != remote || ic.remote_group().size() != remote {
        bad.push(format!("sizes {} and {} remote, expected {size} and {remote}", ic.size(), ic.remote_size()));
    }
    if client {
        ask(&ic, rank, n, &mut bad)?;
    } else {
        serve(&ic, rank, &mut bad)?;
    }
    ic.barrier()?;
    // The servers pass high = false: they come first.
    let all = ic.merge(client)?;
    let want = if client { n - clients + rank } else { rank - clients };
    if all.size() != n || all.rank() != want {
        bad.push(format!("merged: rank {} of {}, expected {want} of {n}", all.rank(), all.size()));
    }
    let mut sum = [0u64];
    all.allreduce(&[rank as u64], &mut sum, Op::Sum)?;
    if sum[0] != (n * (n - 1) / 2) as u64 {
        bad.push(format!("merged allreduce gave {}", sum[0]));
    }
    Ok(bad)
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());
    if n < 2 {
        println!("intercomm needs at least 2 ranks (two groups)");
        return Ok(());
    }
    let bad = local_checks(&world)?;
    for b in &bad {
        eprintln!("intercomm: rank {rank}: {b}");
    }
    let mut failures = [0u32];
    world.allreduce(&[bad.len() as u32], &mut failures, Op::Sum)?;
    check(failures[0] == 0, || format!("{} failed checks across ranks", failures[0]))?;
    if rank == 0 {
        println!("intercomm: {n} ranks as {} clients and {} servers; requests, bcast, barrier and merge: OK", n / 2, n - n / 2);
    }
    world.finalize()?;
    Ok(())
}
