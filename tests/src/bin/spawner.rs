//! Dynamic processes through `tmpirun` (issue 59 item 7), run by `tests/tests/groupcomm.rs`.
//! The first argument picks the case; a spawned copy of this program gets `child-<case>`.
//!
//! - `multi`: `spawn_multiple` of two commands (2 processes with an argument and a variable
//!   set, then 1 with another argument and a directory): each child checks its world (3
//!   ranks), `appnum`, argument, variable and directory, and sends them to parent 0, which
//!   checks them all; then a second spawn (1 process) from the same parents: two bridges at
//!   once, each intercommunicator carrying its own messages.
//! - `missing`: a spawn of a program that does not exist: `Error::Spawn` naming it on every
//!   rank, and the world goes on (an allreduce).
//! - `mismatch`: `spawn_multiple` with 2 commands and 1 count at the root: `Error::Spawn` on
//!   every rank.
//! - `childfail`: the child exits with code 3 after it joined: tmpirun ends the job with it.
//! - `notmpi`: a spawn of `true` (no tmpi program: it never joins): `Error::Spawn` saying a
//!   spawned process ended before it joined, on every rank, and the world goes on.
//! - `srun` (run by `tests/tests/slurm.rs` under `srun`): `Error::Spawn` saying Slurm cannot
//!   grow the job, on every rank.
//!
//! Prints `spawner: <case>: ... OK` from parent rank 0.

use std::error::Error as StdError;
use std::process::Command;

use tmpi::{Error, InterComm, Op};

type Res = Result<(), Box<dyn StdError>>;

fn fail(m: String) -> Box<dyn StdError> {
    m.into()
}

fn me() -> Command {
    Command::new(std::env::current_exe().expect("this program's path"))
}

/// A child of `multi`: reports `[appnum, world size, arg ok, var ok, dir ok]` to parent 0.
fn child_multi(world: &tmpi::World, parents: &InterComm, arg: &str) -> Res {
    let app = tmpi::appnum().ok_or_else(|| fail("no appnum".into()))?;
    let var = std::env::var("SPAWNER_VAR").ok();
    let dir = std::env::current_dir()?;
    let want_arg = if app == 0 { "first" } else { "second" };
    let report = [
        app as u64,
        world.size() as u64,
        u64::from(arg == want_arg),
        u64::from(var.as_deref() == (app == 0).then_some("v=1")),
        u64::from((app == 1) == (dir == std::path::Path::new("/"))),
    ];
    parents.send(&report, 0, 1)?;
    Ok(())
}

fn parent_multi(world: &tmpi::World) -> Res {
    let (mut a, mut b) = (me(), me());
    a.args(["child-multi", "first"]).env("SPAWNER_VAR", "v=1");
    b.args(["child-multi", "second"]).current_dir("/");
    let kids = world.spawn_multiple(0, &[a, b], &[2, 1])?;
    let mut second = me();
    second.args(["child-echo"]);
    let echo = world.spawn(world.size() - 1, &second, 1)?;
    if kids.remote_size() != 3 || echo.remote_size() != 1 {
        return Err(fail(format!("remote sizes {} and {}", kids.remote_size(), echo.remote_size())));
    }
    if world.rank() == 0 {
        let mut apps = Vec::new();
        for c in 0..3 {
            let mut r = [0u64; 5];
            kids.recv(&mut r, c, 1)?;
            if r[1..] != [3, 1, 1, 1] {
                return Err(fail(format!("child {c} reported {r:?}")));
            }
            apps.push(r[0]);
        }
        if apps != [0, 0, 1] {
            return Err(fail(format!("appnums {apps:?}")));
        }
        echo.send(&[41u32], 0, 2)?;
        let mut back = [0u32];
        echo.recv(&mut back, 0, 3)?;
        if back[0] != 42 {
            return Err(fail(format!("echo gave {}", back[0])));
        }
    }
    Ok(())
}

/// The child of the second spawn of `multi`: answers parent 0 with its value plus one.
fn child_echo(parents: &InterComm) -> Res {
    let mut x = [0u32];
    parents.recv(&mut x, 0, 2)?;
    parents.send(&[x[0] + 1], 0, 3)?;
    Ok(())
}

/// `Error::Spawn` on every rank, holding `needle`; then the world still works.
fn refused(world: &tmpi::World, r: tmpi::Result<InterComm>, needle: &str) -> Res {
    match r {
        Err(Error::Spawn(m)) if m.contains(needle) => {}
        Err(e) => return Err(fail(format!("rank {}: {e}, expected a spawn error naming {needle:?}", world.rank()))),
        Ok(_) => return Err(fail("the spawn worked".into())),
    }
    let mut s = [0u32];
    world.allreduce(&[1u32], &mut s, Op::Sum)?;
    if s[0] as usize != world.size() {
        return Err(fail(format!("allreduce after the refusal gave {}", s[0])));
    }
    Ok(())
}

fn parent(world: &tmpi::World, case: &str) -> Res {
    match case {
        "multi" => parent_multi(world)?,
        "missing" => refused(world, world.spawn(0, &Command::new("/nonexistent/spawned-prog"), 2), "/nonexistent/spawned-prog")?,
        "mismatch" => refused(world, world.spawn_multiple(0, &[me(), me()], &[1]), "2 commands but 1 process counts")?,
        "srun" => refused(world, world.spawn(0, &me(), 1), "Slurm cannot grow a running job")?,
        "notmpi" => refused(world, world.spawn(0, &Command::new("true"), 2), "ended before it joined its parents")?,
        "childfail" => {
            let mut c = me();
            c.arg("child-fail");
            let kids = world.spawn(0, &c, 1)?;
            // The child exits 3 once it joined; tmpirun ends the job (this waits for that).
            let mut x = [0u8];
            kids.recv(&mut x, 0, 9)?;
        }
        _ => return Err(fail(format!("unknown case {case:?}"))),
    }
    if world.rank() == 0 {
        println!("spawner: {case}: {} ranks: OK", world.size());
    }
    Ok(())
}

fn main() -> Res {
    let world = tmpi::init()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let case = args.first().map(String::as_str).unwrap_or("");
    match (tmpi::parent(), case) {
        (Some(p), "child-multi") => child_multi(&world, &p, args.get(1).map_or("", String::as_str))?,
        (Some(p), "child-echo") => child_echo(&p)?,
        (Some(_), "child-fail") => std::process::exit(3),
        (Some(_), c) => return Err(fail(format!("a child with case {c:?}"))),
        (None, c) => parent(&world, c)?,
    }
    world.finalize()?;
    Ok(())
}
