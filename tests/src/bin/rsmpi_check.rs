//! Checks of tmpi-rsmpi (the rsmpi-compatible `mpi` crate) beyond rsmpi's own examples: derived
//! types with padding, bool and nesting; datatypes with gaps; received bools checked;
//! non-commutative user operations in rank order; reductions on the generic path; request
//! collections handing back index, status and buffer; buffered sends that return before a
//! receive matches, and an attached buffer that is too small; attributes and names; varcount
//! collectives into datatypes with gaps; Cartesian grids at 4 ranks and more; immediate
//! reductions on the generic path that must not wait for the other ranks when they start.
//!
//! Run at any size through tmpirun; prints `rsmpi_check ok <checks>` on every rank.

use std::panic::{catch_unwind, AssertUnwindSafe};

use mpi::collective::{SystemOperation, UserOperation};
use mpi::datatype::{MutView, PartitionMut, UserDatatype, View};
use mpi::topology::{Color, GroupRelation};
use mpi::traits::*;

#[derive(Equivalence, Default, Debug, PartialEq, Clone, Copy)]
struct Inner(u8, f64);

#[derive(Equivalence, Default, Debug, PartialEq, Clone, Copy)]
struct Padded {
    flag: bool,
    x: f64,
    small: u16,
    arr: [i32; 3],
    inner: Inner,
    pair: (bool, i64),
}

fn padded(r: i32) -> Padded {
    Padded {
        flag: r % 2 == 0,
        x: f64::from(r) * 1.5,
        small: r as u16 + 7,
        arr: [r, -r, 2 * r],
        inner: Inner(r as u8, 0.25),
        pair: (r % 3 == 0, i64::from(r) << 40),
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Note(i32);
impl CommAttribute for Note {
    const CLONE_ON_DUP: bool = true;
}
#[derive(Clone, Debug, PartialEq)]
struct Local(i32);
impl CommAttribute for Local {}

/// Runs `f`, which must panic; returns the panic's message (the default hook stays quiet).
fn panic_message(f: impl FnOnce()) -> String {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    r.err().and_then(|e| e.downcast_ref::<String>().cloned()).unwrap_or_default()
}

struct Checks(u32);
impl Checks {
    fn ok(&mut self, cond: bool, what: &str) {
        assert!(cond, "rsmpi_check: {what}");
        self.0 += 1;
    }
}

fn main() {
    let mut universe = mpi::initialize().expect("first initialize");
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let mut c = Checks(0);
    c.ok(mpi::initialize().is_none(), "a second initialize returns None");

    derived_types(&world, &mut c);
    gaps_and_bools(&world, &mut c);
    reductions(&world, &mut c);
    collections(&world, &mut c);
    buffered(&world, &mut universe, &mut c);
    attributes(&world, &mut c);
    varcount_with_gaps(&world, &mut c);
    topologies(&world, &mut c);

    world.barrier();
    println!("rsmpi_check ok {} checks on rank {rank} of {size}", c.0);
}

fn derived_types(world: &impl Communicator, c: &mut Checks) {
    let rank = world.rank();
    let root = world.process_at_rank(0);
    let mut v = if rank == 0 { (0..5).map(padded).collect::<Vec<_>>() } else { vec![Padded::default(); 5] };
    root.broadcast_into(&mut v[..]);
    c.ok(v == (0..5).map(padded).collect::<Vec<_>>(), "broadcast of padded derived structs");
    let mut all = vec![Padded::default(); world.size() as usize];
    world.all_gather_into(&padded(rank), &mut all[..]);
    c.ok(all.iter().enumerate().all(|(i, p)| *p == padded(i as i32)), "all_gather of padded structs");
    let packed = world.pack(&padded(rank));
    let mut back = Padded::default();
    // SAFETY: `packed` holds one packed Padded.
    unsafe { world.unpack_into(&packed, &mut back, 0) };
    c.ok(back == padded(rank), "pack/unpack round trip");
    c.ok(packed.len() == 1 + 8 + 2 + 12 + 9 + 9, "packed size counts data bytes only");
}

fn gaps_and_bools(world: &impl Communicator, c: &mut Checks) {
    let (rank, size) = (world.rank(), world.size());
    let next = world.process_at_rank((rank + 1) % size);
    let prev = world.process_at_rank((rank + size - 1) % size);
    // Every second element of 8: the gaps keep what they held.
    let t = UserDatatype::vector(4, 1, 2, &i32::equivalent_datatype());
    let send: Vec<i32> = (0..8).map(|i| rank * 100 + i).collect();
    let mut recv = vec![-7i32; 8];
    {
        // SAFETY: both buffers hold 8 i32, which one element of `t` spans.
        let sv = unsafe { View::with_count_and_datatype(&send[..], 1, &t) };
        // SAFETY: as above.
        let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], 1, &t) };
        mpi::point_to_point::send_receive_into(&sv, &next, &mut rv, &prev);
    }
    let p = (rank + size - 1) % size;
    let want: Vec<i32> = (0..8).map(|i| if i % 2 == 0 { p * 100 + i } else { -7 }).collect();
    c.ok(recv == want, "vector datatype leaves the gaps alone");

    // A byte that is not a valid bool is refused on receipt.
    if size >= 2 {
        if rank == 0 {
            world.process_at_rank(1).send_with_tag(&2u8, 9);
        } else if rank == 1 {
            let msg = panic_message(|| {
                world.process_at_rank(0).receive_with_tag::<bool>(9);
            });
            c.ok(msg.contains("bool"), "a received 2 for a bool panics naming bool");
        }
        let mut flags = vec![false; size as usize];
        world.all_gather_into(&(rank % 2 == 1), &mut flags[..]);
        c.ok(flags.iter().enumerate().all(|(i, &f)| f == (i % 2 == 1)), "all_gather of bools");
    }
}

/// Affine maps x -> a*x + b; composing them is not commutative. `inout = in ∘ inout`.
fn compose(x: DynBuffer<'_>, y: DynBufferMut<'_>) {
    let x: &[i64] = x.downcast().expect("i64 operands");
    let y: &mut [i64] = y.downcast().expect("i64 operands");
    for (p, q) in x.chunks(2).zip(y.chunks_mut(2)) {
        // (in ∘ inout)(v) = in.a * (inout.a * v + inout.b) + in.b
        let (a, b) = (p[0] * q[0], p[0] * q[1] + p[1]);
        q[0] = a;
        q[1] = b;
    }
}
use mpi::datatype::{DynBuffer, DynBufferMut};

fn reductions(world: &impl Communicator, c: &mut Checks) {
    user_op_reductions(world, c);
    system_op_reductions(world, c);
    immediate_generic_reductions(world, c);
}

/// Immediate reductions on the generic path (a non-commutative user operation, `logical_xor`
/// of bools, a reduce to a root) started before a message that another rank waits for
/// before it starts them: the start must not wait for the other ranks (it did until
/// 2026-11-30, and such a program deadlocked).
fn immediate_generic_reductions(world: &impl Communicator, c: &mut Checks) {
    let (rank, size) = (world.rank(), world.size());
    let op = UserOperation::associative(compose);
    let mine = [i64::from(rank) + 2, i64::from(rank) + 1];
    let (mut all, mut x, mut at_root) = ([0i64; 2], false, [0i64; 2]);
    let (mut all_seq, first) = ([0i64; 2], rank == 0);
    world.all_reduce_into(&mine[..], &mut all_seq[..], &op);
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    mpi::request::scope(|sc| {
        if rank > 0 {
            let _token: (i32, _) = world.process_at_rank(prev).receive();
        }
        let a = world.immediate_all_reduce_into(sc, &mine[..], &mut all[..], &op);
        let b = world.immediate_all_reduce_into(sc, &first, &mut x, SystemOperation::logical_xor());
        let r = if rank == 0 {
            world.process_at_rank(0).immediate_reduce_into_root(sc, &mine[..], &mut at_root[..], &op)
        } else {
            world.process_at_rank(0).immediate_reduce_into(sc, &mine[..], &op)
        };
        if rank + 1 < size {
            world.process_at_rank(next).send(&rank);
        }
        a.wait();
        b.wait();
        r.wait();
    });
    c.ok(all == all_seq, "immediate non-commutative user op all_reduce started before a message others wait for");
    c.ok(x, "immediate logical_xor of bools");
    if rank == 0 {
        c.ok(at_root == all_seq, "immediate user op reduce at the root");
    }
}

/// A non-commutative user operation (composition of affine maps) through `all_reduce`,
/// `scan` and `reduce`: the result in rank order.
fn user_op_reductions(world: &impl Communicator, c: &mut Checks) {
    let (rank, size) = (world.rank(), world.size());
    let mine = [i64::from(rank) + 2, i64::from(rank) + 1];
    let op = UserOperation::associative(compose);
    let fold = |upto: i32| {
        let mut acc = [1i64, 0];
        for r in (0..upto).rev() {
            // acc = map_r ∘ acc
            let (a, b) = (i64::from(r) + 2, i64::from(r) + 1);
            acc = [a * acc[0], a * acc[1] + b];
        }
        acc
    };
    let mut all = [0i64; 2];
    world.all_reduce_into(&mine[..], &mut all[..], &op);
    c.ok(all == fold(size), "non-commutative user op all_reduce in rank order");
    let mut sc = [0i64; 2];
    world.scan_into(&mine[..], &mut sc[..], &op);
    c.ok(sc == fold(rank + 1), "non-commutative user op scan");
    let mut root = [0i64; 2];
    if rank == 0 {
        world.process_at_rank(0).reduce_into_root(&mine[..], &mut root[..], &op);
        c.ok(root == fold(size), "non-commutative user op reduce at the root");
    } else {
        world.process_at_rank(0).reduce_into(&mine[..], &op);
    }
}

/// System operations: on a datatype with gaps (the generic path), logical xor of bools and
/// integers, max on the native path, an exclusive scan with a user op, a complex product.
fn system_op_reductions(world: &impl Communicator, c: &mut Checks) {
    let (rank, size) = (world.rank(), world.size());
    let t = UserDatatype::vector(2, 1, 2, &i32::equivalent_datatype());
    let src = [rank, -1, 10 * rank, -1];
    let mut dst = [5, 5, 5, 5];
    {
        // SAFETY: four i32 hold one element of `t`.
        let sv = unsafe { View::with_count_and_datatype(&src[..], 1, &t) };
        // SAFETY: as above.
        let mut dv = unsafe { MutView::with_count_and_datatype(&mut dst[..], 1, &t) };
        world.all_reduce_into(&sv, &mut dv, SystemOperation::sum());
    }
    let s: i32 = (0..size).sum();
    c.ok(dst == [s, 5, 10 * s, 5], "sum over a vector datatype");
    let mut x = false;
    world.all_reduce_into(&(rank == 0), &mut x, SystemOperation::logical_xor());
    c.ok(x, "logical_xor of bools");
    let mut lx = 0i32;
    world.all_reduce_into(&1i32, &mut lx, SystemOperation::logical_xor());
    c.ok(lx == i32::from(size % 2 == 1), "logical_xor of integers");
    let mut m = 0u16;
    world.all_reduce_into(&(rank as u16), &mut m, SystemOperation::max());
    c.ok(m == size as u16 - 1, "max on the native path");
    let mut ex = -1i32;
    world.exclusive_scan_into(&1i32, &mut ex, op_sum());
    if rank > 0 {
        c.ok(ex == rank, "exclusive scan with a user op");
    }
    let mut cz = num_complex::Complex64::new(0.0, 0.0);
    world.all_reduce_into(&num_complex::Complex64::new(0.0, 1.0), &mut cz, SystemOperation::product());
    let mut want = num_complex::Complex64::new(1.0, 0.0);
    for _ in 0..size {
        want *= num_complex::Complex64::new(0.0, 1.0);
    }
    c.ok((cz - want).l1_norm() < 1e-12, "complex product");
}

fn op_sum() -> UserOperation<'static> {
    UserOperation::commutative(|x, y| {
        let x: &[i32] = x.downcast().expect("i32");
        let y: &mut [i32] = y.downcast().expect("i32");
        for (a, b) in x.iter().zip(y) {
            *b += a;
        }
    })
}

fn collections(world: &impl Communicator, c: &mut Checks) {
    let (rank, size) = (world.rank(), world.size());
    const N: usize = 16;
    let sends: Vec<i32> = (0..N as i32).map(|i| rank * 1000 + i).collect();
    let mut recvs = vec![-1i32; N];
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let mut seen = 0;
    mpi::request::multiple_scope(2 * N, |scope, coll| {
        for v in recvs.iter_mut() {
            coll.add(world.process_at_rank(prev).immediate_receive_into(scope, v));
        }
        for (i, v) in sends.iter().enumerate() {
            coll.add(world.process_at_rank(next).immediate_send_with_tag(scope, v, i as i32));
        }
        while let Some((idx, st, data)) = coll.wait_any() {
            if idx < N {
                // A receive: its buffer holds the message with the tag it was sent with.
                c.ok(st.source_rank() == prev && *data == prev * 1000 + st.tag(), "wait_any hands back the receive's status and buffer");
            } else {
                c.ok(*data == rank * 1000 + (idx - N) as i32, "wait_any hands back the send's buffer");
            }
            seen += 1;
        }
    });
    c.ok(seen == 2 * N, "every request reported once");
    let mut got: Vec<i32> = recvs.clone();
    got.sort_unstable();
    c.ok(got == (0..N as i32).map(|i| prev * 1000 + i).collect::<Vec<_>>(), "every message arrived");
}

fn buffered(world: &impl Communicator, universe: &mut mpi::environment::Universe, c: &mut Checks) {
    let (rank, size) = (world.rank(), world.size());
    if size < 2 {
        return;
    }
    let big = vec![rank as u8; 1 << 20];
    // Too small a buffer: refused with a message, nothing sent.
    universe.set_buffer_size(1024);
    if rank == 0 {
        let msg = panic_message(|| world.process_at_rank(1).buffered_send(&big[..]));
        c.ok(msg.contains("does not fit the attached buffer"), "a buffered send larger than the buffer is refused");
    }
    universe.set_buffer_size(4 << 20);
    c.ok(universe.buffer_size() == 4 << 20, "buffer_size");
    // Rank 0's buffered send returns before rank 1 posts its receive: rank 1 first waits for a
    // message rank 0 sends only after the buffered send returned.
    if rank == 0 {
        world.process_at_rank(1).buffered_send_with_tag(&big[..], 3);
        world.process_at_rank(1).send_with_tag(&7u32, 4);
    } else if rank == 1 {
        let (x, _) = world.process_at_rank(0).receive_with_tag::<u32>(4);
        let (v, _) = world.process_at_rank(0).receive_vec_with_tag::<u8>(3);
        c.ok(x == 7 && v.len() == 1 << 20 && v.iter().all(|&b| b == 0), "a buffered send completes before its receive is posted");
    }
    universe.detach_buffer();
    c.ok(universe.buffer_size() == 0, "detach_buffer");
}

fn attributes(world: &mpi::topology::SimpleCommunicator, c: &mut Checks) {
    let mut comm = world.duplicate();
    comm.set_attr(Note(5));
    comm.set_attr(Local(6));
    c.ok(comm.get_attr::<Note>() == Some(&Note(5)), "get_attr");
    let dup = comm.duplicate();
    c.ok(dup.get_attr::<Note>() == Some(&Note(5)) && dup.get_attr::<Local>().is_none(), "copy on dup only for CLONE_ON_DUP");
    c.ok(world.get_name() == "MPI_COMM_WORLD" && dup.get_name().is_empty(), "default names");
    dup.set_name("halves");
    c.ok(dup.get_name() == "halves", "set_name");
    let (major, _) = mpi::environment::version();
    c.ok(major >= 3, "version");
}

fn varcount_with_gaps(world: &impl Communicator, c: &mut Checks) {
    let (rank, size) = (world.rank(), world.size());
    // Rank r sends 2(r + 1) values; the root receives r + 1 elements of a type that covers
    // slots 0 and 2 of every 3 (extent 3 i32), so slot 1 of each keeps its -1.
    let msg: Vec<i32> = (0..2 * (rank + 1)).map(|i| rank * 100 + i).collect();
    let counts: Vec<i32> = (1..=size).collect();
    let displs: Vec<i32> = counts.iter().scan(0, |a, &x| Some(std::mem::replace(a, *a + x))).collect();
    let total: i32 = counts.iter().sum();
    let t = UserDatatype::vector(2, 1, 2, &i32::equivalent_datatype());
    let mut buf = vec![-1i32; 3 * total as usize];
    let root = world.process_at_rank(0);
    if rank == 0 {
        {
            // SAFETY: `buf` holds `total` elements of `t` (12 bytes apart).
            let mut v = unsafe { MutView::with_count_and_datatype(&mut buf[..], total, &t) };
            let mut p = PartitionMut::new(&mut v, &counts[..], &displs[..]);
            root.gather_varcount_into_root(&msg[..], &mut p);
        }
        let mut want = Vec::new();
        for r in 0..size {
            for e in 0..=r {
                want.extend([r * 100 + 2 * e, -1, r * 100 + 2 * e + 1]);
            }
        }
        c.ok(buf == want, "gather_varcount into a datatype with gaps");
    } else {
        root.gather_varcount_into(&msg[..]);
    }
}

fn topologies(world: &impl Communicator, c: &mut Checks) {
    let (rank, size) = (world.rank(), world.size());
    let g = world.group();
    let odd: Vec<i32> = (0..size).filter(|r| r % 2 == 1).collect();
    let og = g.include(&odd);
    let eg = g.difference(&og);
    let mine = if rank % 2 == 1 { &og } else { &eg };
    let sub = world.split_by_subgroup_collective(mine).expect("every rank is in one half");
    c.ok(sub.group().compare(mine) == GroupRelation::Identical, "split_by_subgroup_collective with disjoint groups");
    let byc = world.split_by_color(Color::with_value(rank % 2)).expect("colored");
    c.ok(byc.size() == mine.size(), "split_by_color");
    if size >= 4 {
        let cart = world.create_cartesian_communicator(&[2, 2], &[true, false], false);
        match cart {
            Some(cart) => {
                let l = cart.get_layout();
                c.ok(l.dims == [2, 2] && cart.coordinates_to_rank(&l.coords) == cart.rank(), "Cartesian layout");
                let (s, d) = cart.shift(0, 1);
                c.ok(s.is_some() && d.is_some(), "periodic shift has both neighbours");
                let (_, d1) = cart.shift(1, 1);
                c.ok(d1.is_some() == (l.coords[1] == 0), "non-periodic shift ends at the edge");
            }
            None => c.ok(rank >= 4, "only ranks past the grid get none"),
        }
        let m = world.cartesian_map(&[2, 2], &[false, false]);
        c.ok(m == (rank < 4).then_some(rank), "cartesian_map");
    }
}
