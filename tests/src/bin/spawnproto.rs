//! Spawns through `tmpirun` with the bootstrap protocol alone (no runtime): the launcher's
//! side of dynamic processes (`tests/tests/launch.rs`).
//!
//! `spawnproto MODE` under `tmpirun -n P`: rank 0 asks `tmpirun` to start this program again as
//! children, passes the bridge to the other parents through its job's key-value store, and
//! every parent wires up the bridge with the children (put, fence, get) and finalizes.
//! - `two`: two commands: 2 children with `child a b` and `SPAWN_K=v1`, then 1 with
//!   `child x`, `SPAWN_K=v2` in directory `/tmp`. Rank 0 prints `CHILD j: <what child j saw>`
//!   for each; every child prints `hello from child j` on stdout.
//! - `missing`: the program does not exist; rank 0 prints `REFUSED <tmpirun's reason>`.
//! - `across`: as `missing` for a job across hosts (a spawn that `tmpirun` refuses there).
//! - `exit3`, `kill`, `sleep`: one child that wires up, finalizes both jobs and then exits
//!   with 3, is killed by SIGKILL, or sleeps for a minute (it prints `CHILD_PID <pid>` first);
//!   the parents then sleep for a minute (`exit3`, `kill`) or end at once (`sleep`).
//! - `abort`: one child that wires up, then aborts its job with code 5 (`child gave up`);
//!   the parents sleep for a minute.
//! - `nested`: one child, which spawns a grandchild (`child leaf`) the same way and prints
//!   `CHILD 0: <what the grandchild saw>`.
//!
//! Any unexpected failure exits with 1 and a message.

use std::time::Duration;

use tmpi_transport::bootstrap::spawn::{Bridge, SpawnApp, SpawnRequest, ENV_APPNUM, ENV_PARENT};
use tmpi_transport::bootstrap::{BootstrapClient, BootstrapEnv};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn app(program: &str, args: &[&str], k: &str, cwd: Option<&str>, procs: u32) -> SpawnApp {
    SpawnApp {
        program: program.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: vec![("SPAWN_K".into(), k.into())],
        cwd: cwd.map(Into::into),
        procs,
    }
}

fn parent(mode: &str) -> Res<()> {
    let (mut job, env) = BootstrapClient::from_env()?.ok_or("not started by tmpirun")?;
    let me = std::env::current_exe()?.to_string_lossy().into_owned();
    let apps = match mode {
        "two" => vec![app(&me, &["child", "a b"], "v1", None, 2), app(&me, &["child", "x"], "v2", Some("/tmp"), 1)],
        "missing" => vec![app("no-such-program-for-spawn", &[], "v", None, 1)],
        m => vec![app(&me, &["child", m], "v", None, 1)],
    };
    spawn_and_wire(&mut job, &env, apps, matches!(mode, "missing" | "across"))?;
    if matches!(mode, "exit3" | "kill" | "abort") {
        std::thread::sleep(Duration::from_secs(60));
    }
    job.finalize()?;
    Ok(())
}

/// Rank 0 of `job` spawns `apps` (a refusal is printed when `refusal_expected`), and every rank
/// wires up with the children through the bridge; rank 0 prints what each child saw.
fn spawn_and_wire(job: &mut BootstrapClient, env: &BootstrapEnv, apps: Vec<SpawnApp>, refusal_expected: bool) -> Res<()> {
    if env.rank == 0 {
        match job.spawn(SpawnRequest { parents: env.size as u32, apps }) {
            Ok(b) => job.put("bridge", b.to_env().as_bytes())?,
            Err(e) if refusal_expected => {
                println!("REFUSED {e}");
                job.put("bridge", b"none")?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    job.fence()?;
    let text = String::from_utf8(job.get("bridge")?)?;
    if text == "none" {
        return Ok(());
    }
    let bridge = Bridge::parse(&text)?;
    let mut b = BootstrapClient::connect_to(&bridge.bootstrap, env.rank, bridge.size, &env.secret)?;
    b.put(&format!("p{}", env.rank), b"parent")?;
    b.fence()?;
    for j in 0..bridge.size - bridge.parents {
        let seen = String::from_utf8(b.get(&format!("c{j}"))?)?;
        if env.rank == 0 {
            println!("CHILD {j}: {seen}");
        }
    }
    b.finalize()?;
    Ok(())
}

fn child(args: &[String]) -> Res<()> {
    let (mut job, env) = BootstrapClient::from_env()?.ok_or("a child not started by tmpirun")?;
    let bridge = Bridge::parse(&std::env::var(ENV_PARENT)?)?;
    let appnum = std::env::var(ENV_APPNUM)?;
    let me = bridge.parents + env.rank;
    let mut b = BootstrapClient::connect_to(&bridge.bootstrap, me, bridge.size, &env.secret)?;
    let k = std::env::var("SPAWN_K").unwrap_or_default();
    let cwd = std::env::current_dir()?;
    let seen = format!("rank {} of {} appnum {appnum} args {:?} SPAWN_K={k} cwd={}", env.rank, env.size, &args[1..], cwd.display());
    b.put(&format!("c{}", env.rank), seen.as_bytes())?;
    b.fence()?;
    if b.get("p0")? != b"parent" {
        return Err("parent 0's key is wrong".into());
    }
    b.finalize()?;
    if args.get(1).is_some_and(|a| a == "nested") {
        let me = std::env::current_exe()?.to_string_lossy().into_owned();
        spawn_and_wire(&mut job, &env, vec![app(&me, &["child", "leaf"], "g", None, 1)], false)?;
    }
    if args.get(1).is_some_and(|a| a == "abort") {
        job.abort(5, "child gave up")?;
        std::thread::sleep(Duration::from_secs(60));
    }
    job.finalize()?;
    println!("hello from child {}", env.rank);
    match args.get(1).map(String::as_str) {
        Some("exit3") => std::process::exit(3),
        // SAFETY: raise sends a signal to this process; nothing is borrowed.
        Some("kill") => unsafe {
            libc::raise(libc::SIGKILL);
        },
        Some("sleep") => {
            println!("CHILD_PID {}", std::process::id());
            std::thread::sleep(Duration::from_secs(60));
        }
        _ => {}
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("child") => child(&args),
        Some(mode) => parent(mode),
        None => Err("usage: spawnproto MODE".into()),
    };
    if let Err(e) = r {
        eprintln!("spawnproto: {e}");
        std::process::exit(1);
    }
}
