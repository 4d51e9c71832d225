//! Dynamic processes: the job's ranks spawn two more copies of this program as a job of
//! their own (`Comm::spawn`), and talk to them over the intercommunicator it returns. Each
//! child sends its world rank to parent `rank % parents` and gets back its square; then
//! parents and children `merge` into one communicator (parents first) and check an
//! allreduce over all of them. The children find their parents with `tmpi::parent()`.
//!
//! Started alone (no `tmpirun`), there is no launcher to start processes: it says so.

use std::error::Error;
use std::process::Command;

use tmpi::{InterComm, Op, ANY_SOURCE};
use tmpi_examples::check;

/// Children spawned.
const CHILDREN: usize = 2;
const REQUEST: tmpi::Tag = 1;
const ANSWER: tmpi::Tag = 2;

/// A parent answers the children that are its own (`child % parents == rank`).
fn serve(ic: &InterComm) -> tmpi::Result<()> {
    let mine = (0..ic.remote_size()).filter(|c| c % ic.size() == ic.rank()).count();
    for _ in 0..mine {
        let mut x = [0u64];
        let st = ic.recv(&mut x, ANY_SOURCE, REQUEST)?;
        ic.send(&[x[0] * x[0]], st.source(), ANSWER)?;
    }
    Ok(())
}

/// A child asks its parent; `Err` names a wrong answer.
fn ask(ic: &InterComm) -> Result<(), Box<dyn Error>> {
    let (me, parent) = (ic.rank() as u64, ic.rank() % ic.remote_size());
    ic.send(&[me + 10], parent, REQUEST)?;
    let mut y = [0u64];
    ic.recv(&mut y, parent, ANSWER)?;
    check(y[0] == (me + 10) * (me + 10), || format!("child {me}: answer {}", y[0]))?;
    Ok(())
}

/// Both sides: the merged communicator holds parents then children, and sums every rank.
fn merged(ic: &InterComm, child: bool) -> Result<(), Box<dyn Error>> {
    let all = ic.merge(child)?;
    let n = ic.size() + ic.remote_size();
    let want = if child { ic.remote_size() + ic.rank() } else { ic.rank() };
    check(all.size() == n && all.rank() == want, || format!("merged: rank {} of {}, expected {want} of {n}", all.rank(), all.size()))?;
    let mut sum = [0u64];
    all.allreduce(&[all.rank() as u64], &mut sum, Op::Sum)?;
    check(sum[0] == (n * (n - 1) / 2) as u64, || format!("merged allreduce gave {}", sum[0]))?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    if let Some(parents) = tmpi::parent() {
        check(tmpi::appnum() == Some(0) && parents.size() == world.size(), || "child: wrong appnum or size".to_string())?;
        ask(&parents)?;
        merged(&parents, true)?;
        return Ok(world.finalize()?);
    }
    let me = Command::new(std::env::current_exe()?);
    let children = match world.spawn(0, &me, CHILDREN) {
        Err(tmpi::Error::Spawn(why)) if why.contains("not started by tmpirun") => {
            println!("spawn: no launcher to start processes (run it with tmpirun)");
            return Ok(());
        }
        r => r?,
    };
    check(children.remote_size() == CHILDREN && children.size() == world.size(), || "parent: wrong sizes".to_string())?;
    serve(&children)?;
    merged(&children, false)?;
    if world.rank() == 0 {
        println!("spawn: {} ranks spawned {CHILDREN} children: requests, merge and allreduce: OK", world.size());
    }
    world.finalize()?;
    Ok(())
}
