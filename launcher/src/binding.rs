//! Process placement: which CPUs each rank may run on.
//!
//! The machine is seen as sockets of cores of logical CPUs (hardware threads). Two
//! back-ends discover it and apply bindings, behind one [`Binder`]:
//!
//! - with the `hwloc` cargo feature, [hwloc](https://www.open-mpi.org/projects/hwloc/)
//!   through the `hwlocality` crate (`hwloc_set_cpubind` to bind);
//! - otherwise (or when hwloc cannot load the topology), `/sys/devices/system/cpu/cpuN/topology`
//!   (`physical_package_id`, `core_id`) and `sched_setaffinity`.
//!
//! Both produce the same [`Topology`]: sockets ascending by id; cores numbered 0.. over the
//! whole machine, socket by socket, in order of their lowest CPU (hwloc's logical order); and
//! only the CPUs `tmpirun` itself may run on (its affinity mask, so `taskset` and cgroup
//! cpusets are respected). A core none of whose CPUs is allowed is left out.
//!
//! - `--map-by core`: rank r gets the r-th core, cores ordered socket by socket.
//! - `--map-by socket`: rank r goes to socket `r % sockets`, on that socket's next core.
//! - `--bind-to core`: the rank may run only on the CPUs of its core (all its hardware
//!   threads); `socket`: on every CPU of its socket; `none`: anywhere. With more ranks than
//!   cores the layout wraps around. The default is `core` when ranks <= cores, else `none`
//!   (as Open MPI does).
//!
//! The binding is applied by binding `tmpirun`'s own (main) thread just before spawning the
//! rank (a child inherits it through `fork` and `exec`) and restoring it afterwards, so the
//! rank is bound before it runs its first instruction.

mod sysfs;

#[cfg(feature = "hwloc")]
mod hwloc;

use crate::cli::{BindTo, MapBy};
use crate::error::Result;

/// One logical CPU as a back-end reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pu {
    /// The OS number of the CPU (as in `sched_setaffinity` and `/proc/cpuinfo`).
    pub cpu: usize,
    /// The id of its socket (package).
    pub socket: usize,
    /// Identifies its core among the cores of its socket; `None`: a core of its own.
    pub core: Option<u64>,
}

/// A core: its machine-wide index and the CPUs of it that `tmpirun` may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Core {
    /// Index over all cores of the machine (hwloc's logical index).
    pub index: usize,
    /// Its allowed CPUs, ascending (never empty).
    pub cpus: Vec<usize>,
}

/// A socket and its cores with at least one allowed CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Socket {
    /// The socket (package) id.
    pub id: usize,
    /// Its cores, ascending by index (never empty).
    pub cores: Vec<Core>,
}

/// The CPUs available to the job, by socket and core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Sockets ascending by id.
    pub sockets: Vec<Socket>,
}

impl Topology {
    /// Builds a topology from every CPU of the machine and the set `tmpirun` may use.
    pub fn from_pus(all: &[Pu], allowed: &[usize]) -> Self {
        // Group the CPUs into cores: (socket, core key) -> cpus.
        let mut cores: Vec<(usize, Vec<usize>)> = Vec::new();
        let mut keys: Vec<(usize, Option<u64>)> = Vec::new();
        for pu in all {
            let key = (pu.socket, pu.core);
            match keys.iter().position(|k| pu.core.is_some() && *k == key) {
                Some(i) => cores[i].1.push(pu.cpu),
                None => {
                    keys.push(key);
                    cores.push((pu.socket, vec![pu.cpu]));
                }
            }
        }
        for (_, cpus) in &mut cores {
            cpus.sort_unstable();
            cpus.dedup();
        }
        cores.sort_by_key(|(s, cpus)| (*s, cpus[0]));
        let mut sockets: Vec<Socket> = Vec::new();
        for (index, (socket, cpus)) in cores.into_iter().enumerate() {
            let cpus: Vec<usize> = cpus.into_iter().filter(|c| allowed.contains(c)).collect();
            if cpus.is_empty() {
                continue;
            }
            let core = Core { index, cpus };
            match sockets.last_mut() {
                Some(s) if s.id == socket => s.cores.push(core),
                _ => sockets.push(Socket { id: socket, cores: vec![core] }),
            }
        }
        Topology { sockets }
    }

    /// Number of cores with an allowed CPU.
    pub fn ncores(&self) -> usize {
        self.sockets.iter().map(|s| s.cores.len()).sum()
    }

    /// Number of allowed CPUs.
    pub fn ncpus(&self) -> usize {
        self.cores().map(|(_, c)| c.cpus.len()).sum()
    }

    /// Every core with its socket id, socket by socket.
    fn cores(&self) -> impl Iterator<Item = (usize, &Core)> {
        self.sockets.iter().flat_map(|s| s.cores.iter().map(move |c| (s.id, c)))
    }
}

/// Discovers the topology and binds threads: hwloc when built with the `hwloc` feature and
/// it works here, else sysfs and `sched_setaffinity`.
pub enum Binder {
    /// `/sys/devices/system/cpu` and `sched_{get,set}affinity`.
    Sysfs,
    /// hwloc, through `hwlocality`.
    #[cfg(feature = "hwloc")]
    Hwloc(hwloc::Hwloc),
}

impl Binder {
    /// The best back-end available. With the `hwloc` feature, a topology hwloc cannot load
    /// is reported on stderr and the sysfs back-end is used instead.
    pub fn new() -> Self {
        #[cfg(feature = "hwloc")]
        match hwloc::Hwloc::new() {
            Ok(h) => return Binder::Hwloc(h),
            Err(e) => eprintln!("tmpirun: hwloc: {e}; binding with sched_setaffinity instead"),
        }
        Binder::Sysfs
    }

    /// What discovers the topology and binds, for `--info`.
    pub fn describe(&self) -> String {
        match self {
            Binder::Sysfs => {
                let why =
                    if cfg!(feature = "hwloc") { "hwloc could not load the topology" } else { "tmpirun built without the hwloc feature" };
                format!("sysfs topology, sched_setaffinity ({why})")
            }
            #[cfg(feature = "hwloc")]
            Binder::Hwloc(h) => h.describe(),
        }
    }

    /// The topology as this back-end sees it, restricted to the calling thread's CPUs.
    ///
    /// # Errors
    /// The calling thread's binding cannot be read.
    pub fn topology(&self) -> Result<Topology> {
        let allowed = self.thread_cpus()?;
        let all = match self {
            Binder::Sysfs => sysfs::pus(&allowed),
            #[cfg(feature = "hwloc")]
            Binder::Hwloc(h) => h.pus(),
        };
        Ok(Topology::from_pus(&all, &allowed))
    }

    /// The CPUs the calling thread may run on, ascending.
    ///
    /// # Errors
    /// The binding cannot be read.
    pub fn thread_cpus(&self) -> Result<Vec<usize>> {
        match self {
            Binder::Sysfs => crate::sys::allowed_cpus(),
            #[cfg(feature = "hwloc")]
            Binder::Hwloc(h) => h.thread_cpus(),
        }
    }

    /// Binds the calling thread to `cpus` (children it starts inherit the binding).
    ///
    /// # Errors
    /// The OS refuses (e.g. no CPU of `cpus` is allowed).
    pub fn bind_thread(&self, cpus: &[usize]) -> Result<()> {
        match self {
            Binder::Sysfs => crate::sys::set_affinity(&crate::sys::cpu_set(cpus)),
            #[cfg(feature = "hwloc")]
            Binder::Hwloc(h) => h.bind_thread(cpus),
        }
    }
}

/// What a rank is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Not bound: the OS places it.
    Nothing,
    /// One core (all its allowed hardware threads).
    Core,
    /// Every allowed CPU of a socket.
    Socket,
}

/// Where one rank runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// What the binding covers.
    pub bound: Bound,
    /// The socket the rank was mapped to.
    pub socket: usize,
    /// Indices of the cores it may use (empty when not bound).
    pub cores: Vec<usize>,
    /// The CPUs it may use; `None` = not bound.
    pub cpus: Option<Vec<usize>>,
}

impl Placement {
    /// One line for `--report-bindings`, e.g.
    /// `tmpirun: rank 1 bound to core 1 (cpu 1) on socket 0`.
    pub fn describe(&self, rank: usize) -> String {
        let cpus = self.cpus.as_deref().unwrap_or_default();
        let cpus = match cpus {
            [c] => format!("cpu {c}"),
            _ => format!("cpus {}", cpu_list(cpus)),
        };
        match self.bound {
            Bound::Nothing => format!("tmpirun: rank {rank} not bound"),
            Bound::Core => format!("tmpirun: rank {rank} bound to core {} ({cpus}) on socket {}", cpu_list(&self.cores), self.socket),
            Bound::Socket => format!("tmpirun: rank {rank} bound to socket {}: cores {} ({cpus})", self.socket, cpu_list(&self.cores)),
        }
    }
}

/// `0-3,6,8-9` style list of ascending numbers.
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
        i = j + 1;
    }
    out.join(",")
}

/// The placement of each of `n` ranks. `bind` `None` picks the default (see module docs).
pub fn plan(topo: &Topology, n: usize, bind: Option<BindTo>, map: MapBy) -> Vec<Placement> {
    let ncores = topo.ncores();
    let bind = bind.unwrap_or(if n <= ncores { BindTo::Core } else { BindTo::None });
    if ncores == 0 {
        let unbound = Placement { bound: Bound::Nothing, socket: 0, cores: Vec::new(), cpus: None };
        return vec![unbound; n];
    }
    let flat: Vec<(usize, &Core)> = topo.cores().collect();
    let nsock = topo.sockets.len();
    (0..n)
        .map(|r| {
            let (socket, core) = match map {
                MapBy::Core => flat[r % ncores],
                MapBy::Socket => {
                    let s = &topo.sockets[r % nsock];
                    (s.id, &s.cores[(r / nsock) % s.cores.len()])
                }
            };
            match bind {
                BindTo::Core => Placement { bound: Bound::Core, socket, cores: vec![core.index], cpus: Some(core.cpus.clone()) },
                BindTo::Socket => {
                    let cores: Vec<&Core> = flat.iter().filter(|(s, _)| *s == socket).map(|(_, c)| *c).collect();
                    let mut cpus: Vec<usize> = cores.iter().flat_map(|c| c.cpus.iter().copied()).collect();
                    cpus.sort_unstable();
                    Placement { bound: Bound::Socket, socket, cores: cores.iter().map(|c| c.index).collect(), cpus: Some(cpus) }
                }
                BindTo::None => Placement { bound: Bound::Nothing, socket, cores: Vec::new(), cpus: None },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pu(cpu: usize, socket: usize, core: u64) -> Pu {
        Pu { cpu, socket, core: Some(core) }
    }

    /// Two sockets of two cores, no SMT: cpus 0,1 on socket 0, 2,3 on socket 1.
    fn two_sockets() -> Topology {
        let all = [pu(0, 0, 0), pu(1, 0, 1), pu(2, 1, 0), pu(3, 1, 1)];
        Topology::from_pus(&all, &[0, 1, 2, 3])
    }

    /// One socket, two cores of two hardware threads numbered Linux-style: core 0 = cpus
    /// 0 and 2, core 1 = cpus 1 and 3.
    fn smt() -> Vec<Pu> {
        vec![pu(0, 0, 0), pu(1, 0, 1), pu(2, 0, 0), pu(3, 0, 1)]
    }

    #[test]
    fn cores_group_hardware_threads_and_respect_the_allowed_set() {
        let t = Topology::from_pus(&smt(), &[0, 1, 2, 3]);
        assert_eq!(t.ncores(), 2);
        assert_eq!(t.ncpus(), 4);
        assert_eq!(t.sockets[0].cores[1].cpus, [1, 3]);
        // taskset -c 1,3: only core 1 is left, and it keeps its machine-wide index.
        let t = Topology::from_pus(&smt(), &[1, 3]);
        assert_eq!(t.sockets, [Socket { id: 0, cores: vec![Core { index: 1, cpus: vec![1, 3] }] }]);
        // CPUs without a known core are cores of their own.
        let loose = [0, 1].map(|cpu| Pu { cpu, socket: 0, core: None });
        assert_eq!(Topology::from_pus(&loose, &[0, 1]).ncores(), 2);
    }

    #[test]
    fn core_numbering_is_socket_major_by_lowest_cpu() {
        // Socket ids and core keys in an odd order: numbering follows (socket, lowest cpu).
        let all = [pu(3, 1, 9), pu(2, 1, 4), pu(1, 0, 7), pu(0, 0, 8)];
        let t = Topology::from_pus(&all, &[0, 1, 2, 3]);
        let flat: Vec<(usize, usize, Vec<usize>)> = t.cores().map(|(s, c)| (s, c.index, c.cpus.clone())).collect();
        assert_eq!(flat, [(0, 0, vec![0]), (0, 1, vec![1]), (1, 2, vec![2]), (1, 3, vec![3])]);
    }

    #[test]
    fn default_binds_to_core_when_it_fits() {
        let p = plan(&two_sockets(), 4, None, MapBy::Core);
        let cpus: Vec<_> = p.iter().map(|p| p.cpus.clone().unwrap()[0]).collect();
        assert_eq!(cpus, [0, 1, 2, 3]);
        assert_eq!(p[2].socket, 1);
        assert_eq!(p[2].bound, Bound::Core);
        let p = plan(&two_sockets(), 5, None, MapBy::Core);
        assert!(p.iter().all(|p| p.cpus.is_none() && p.bound == Bound::Nothing));
        // With SMT the default counts cores, not hardware threads.
        let t = Topology::from_pus(&smt(), &[0, 1, 2, 3]);
        let p = plan(&t, 2, None, MapBy::Core);
        assert_eq!(p[0].cpus, Some(vec![0, 2]));
        assert_eq!(p[0].describe(0), "tmpirun: rank 0 bound to core 0 (cpus 0,2) on socket 0");
        assert!(plan(&t, 3, None, MapBy::Core)[0].cpus.is_none());
    }

    #[test]
    fn map_by_socket_alternates() {
        let p = plan(&two_sockets(), 4, Some(BindTo::Core), MapBy::Socket);
        let cpus: Vec<_> = p.iter().map(|p| p.cpus.clone().unwrap()[0]).collect();
        assert_eq!(cpus, [0, 2, 1, 3]);
        let p = plan(&two_sockets(), 2, Some(BindTo::Socket), MapBy::Socket);
        assert_eq!(p[1].cpus, Some(vec![2, 3]));
        assert_eq!(p[1].describe(1), "tmpirun: rank 1 bound to socket 1: cores 2-3 (cpus 2-3)");
    }

    #[test]
    fn explicit_core_binding_wraps_when_oversubscribed() {
        let p = plan(&two_sockets(), 6, Some(BindTo::Core), MapBy::Core);
        assert_eq!(p[5].cpus, Some(vec![1]));
        assert_eq!(p[5].describe(5), "tmpirun: rank 5 bound to core 1 (cpu 1) on socket 0");
        let p = plan(&two_sockets(), 1, Some(BindTo::None), MapBy::Core);
        assert_eq!(p[0].describe(0), "tmpirun: rank 0 not bound");
    }

    #[test]
    fn nothing_allowed_means_nothing_bound() {
        let t = Topology::from_pus(&smt(), &[]);
        assert_eq!(t.ncores(), 0);
        let p = plan(&t, 2, Some(BindTo::Core), MapBy::Socket);
        assert!(p.iter().all(|p| p.cpus.is_none()));
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(cpu_list(&[]), "");
    }

    #[test]
    fn detect_sees_this_threads_cpus() {
        let b = Binder::new();
        let t = b.topology().unwrap();
        assert!(t.ncores() >= 1);
        assert_eq!(t.ncpus(), crate::sys::allowed_cpus().unwrap().len());
    }

    #[test]
    fn binding_a_thread_applies_and_restores() {
        let b = Binder::new();
        let before = b.thread_cpus().unwrap();
        let first = before[0];
        std::thread::scope(|s| {
            s.spawn(|| {
                b.bind_thread(&[first]).unwrap();
                assert_eq!(b.thread_cpus().unwrap(), [first]);
                assert_eq!(crate::sys::allowed_cpus().unwrap(), [first]);
                b.bind_thread(&before).unwrap();
                assert_eq!(b.thread_cpus().unwrap(), before);
            });
        });
    }

    /// Both back-ends must see this machine alike.
    #[cfg(feature = "hwloc")]
    #[test]
    fn hwloc_and_sysfs_agree() {
        // Read under the lock that loads hold: other tests may be loading meanwhile.
        let blacklist = || {
            let _l = hwloc::LOADING.lock().unwrap_or_else(|e| e.into_inner());
            std::env::var_os("HWLOC_PLUGINS_BLACKLIST")
        };
        let user_blacklist = blacklist();
        let h = Binder::new();
        // The plugin blacklist set for the load is the user's again (ranks inherit it).
        assert_eq!(blacklist(), user_blacklist);
        assert!(matches!(h, Binder::Hwloc(_)), "hwloc failed to load here");
        assert_eq!(h.topology().unwrap(), Binder::Sysfs.topology().unwrap());
        assert!(h.describe().starts_with("hwloc"), "{}", h.describe());
    }
}
