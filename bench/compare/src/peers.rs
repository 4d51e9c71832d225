//! Building the C peers (bench/c/) and the cache-line probe, as bench/peers.sh does.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::run::run;
use crate::spec::{Bench, Peer};

/// Where things are.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The tmpi checkout (holds bench/c and bench/compare).
    pub root: PathBuf,
    /// tmpi's release binaries (`tmpirun`, `osu_*`, `hello`).
    pub bin_dir: PathBuf,
    /// Build directory of the peers: `<target>/peers`, as bench/peers.sh uses.
    pub peers_dir: PathBuf,
}

impl Paths {
    /// The C peer `bench` built against `peer`.
    pub fn peer_bin(&self, peer: Peer, prog: &str) -> PathBuf {
        self.peers_dir.join(peer.suffix()).join(prog)
    }

    /// The peer program of `bench` built against `peer`.
    pub fn peer_bench(&self, peer: Peer, bench: Bench) -> PathBuf {
        self.peer_bin(peer, bench.peer_bin())
    }
}

/// The full path of `name` found in `PATH`, if any.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Whether `out` is missing or older than any of `inputs`.
fn stale(out: &Path, inputs: &[PathBuf]) -> bool {
    let Some(t) = mtime(out) else {
        return true;
    };
    inputs.iter().any(|i| mtime(i).is_none_or(|ti| ti > t))
}

/// Compiles `src` into `out` with `cc` and `flags` unless `out` is newer than `deps`.
fn compile(cc: &str, flags: &[&str], src: &Path, deps: &[PathBuf], out: &Path) -> Result<(), Error> {
    if !src.is_file() {
        return Err(Error::Missing { path: src.to_path_buf(), hint: "the tmpi checkout is incomplete (use --root)".into() });
    }
    let mut inputs = deps.to_vec();
    inputs.push(src.to_path_buf());
    if !stale(out, &inputs) {
        return Ok(());
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    }
    let mut argv: Vec<String> = vec![cc.to_string()];
    argv.extend(flags.iter().map(|s| s.to_string()));
    argv.extend(["-o".to_string(), out.display().to_string(), src.display().to_string()]);
    run(&argv, Duration::from_secs(300))?.check(&argv.join(" "))?;
    Ok(())
}

/// Builds the peer programs (lat, bw, bibw, msgrate, coll, depth, hello) of `peer`.
///
/// # Errors
/// [`Error::Missing`] with install instructions when its compiler wrapper or launcher is
/// absent (nothing is installed); [`Error::Run`] when compiling fails.
pub fn build_peer(paths: &Paths, peer: Peer) -> Result<(), Error> {
    for tool in ["mpicc", "mpirun"] {
        let name = format!("{tool}.{}", peer.suffix());
        if which(&name).is_none() {
            return Err(Error::Missing {
                path: PathBuf::from(name),
                hint: format!(
                    "{} is not installed; install it with `apt-get install {}` \
                     (tmpi-compare installs nothing)",
                    peer.label(),
                    peer.packages()
                ),
            });
        }
    }
    let cc = format!("mpicc.{}", peer.suffix());
    let c = paths.root.join("bench/c");
    let common = vec![c.join("common.h")];
    let flags = ["-O2", "-Wall", "-Wextra", "-Wno-stringop-overflow"];
    let mut progs: Vec<&str> = Bench::ALL.iter().map(|b| b.peer_bin()).collect();
    progs.dedup();
    for prog in progs {
        compile(&cc, &flags, &c.join(format!("{prog}.c")), &common, &paths.peer_bin(peer, prog))?;
    }
    compile(&cc, &flags, &paths.root.join("bench/compare/hello.c"), &[], &paths.peer_bin(peer, "hello"))
}

/// Builds `<peers>/cacheline` from bench/c/cacheline.c with `cc` and returns its path.
///
/// # Errors
/// [`Error::Missing`] when there is no C compiler, [`Error::Run`] when compiling fails.
pub fn build_cacheline(paths: &Paths) -> Result<PathBuf, Error> {
    if which("cc").is_none() {
        return Err(Error::Missing { path: "cc".into(), hint: "no C compiler; install one with `apt-get install gcc`".into() });
    }
    let out = paths.peers_dir.join("cacheline");
    compile("cc", &["-O2", "-Wall", "-Wextra", "-pthread"], &paths.root.join("bench/c/cacheline.c"), &[], &out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staleness_follows_modification_times() {
        let dir = std::env::temp_dir().join(format!("tmpi-compare-stale-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let (src, out) = (dir.join("a.c"), dir.join("a"));
        let _ = std::fs::write(&src, "int main(void){return 0;}\n");
        assert!(stale(&out, std::slice::from_ref(&src)));
        let _ = std::fs::write(&out, "x");
        let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let f = std::fs::File::options().write(true).open(&src);
        assert!(f.and_then(|f| f.set_modified(old)).is_ok());
        assert!(!stale(&out, std::slice::from_ref(&src)));
        assert!(stale(&out, &[dir.join("missing.h")]));
        assert!(which("sh").is_some());
        assert!(which("surely-not-a-program-name").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
