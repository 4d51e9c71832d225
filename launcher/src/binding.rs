//! Process placement: which CPUs each rank may run on.
//!
//! A "core" here is a logical CPU that `tmpirun` itself may run on (its affinity mask, so
//! `taskset` and cgroup cpusets are respected); sockets come from
//! `/sys/devices/system/cpu/cpuN/topology/physical_package_id` (socket 0 when unknown).
//!
//! - `--map-by core`: rank r gets the r-th CPU, CPUs ordered socket by socket.
//! - `--map-by socket`: rank r goes to socket `r % sockets`, on that socket's next CPU.
//! - `--bind-to core`: the rank may run only on its CPU; `socket`: on every CPU of its
//!   socket; `none`: anywhere. With more ranks than CPUs (`--oversubscribe`) the layout wraps
//!   around. The default is `core` when ranks <= CPUs, else `none`.
//!
//! The binding is applied by setting `tmpirun`'s own thread affinity just before spawning
//! the rank (a child inherits it, also through `posix_spawn`) and restoring it afterwards.

use crate::cli::{BindTo, MapBy};
use crate::error::Result;
use crate::sys;

/// The CPUs available to the job, grouped by socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// For each socket (ascending id), its CPUs (ascending).
    pub sockets: Vec<(usize, Vec<usize>)>,
}

impl Topology {
    /// Reads the calling thread's affinity mask and the socket of each CPU.
    ///
    /// # Errors
    /// `sched_getaffinity` fails.
    pub fn detect() -> Result<Self> {
        let cpus = sys::allowed_cpus()?;
        let socket_of = |c: usize| -> usize {
            std::fs::read_to_string(format!(
                "/sys/devices/system/cpu/cpu{c}/topology/physical_package_id"
            ))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
        };
        Ok(Self::from_cpus(cpus.into_iter().map(|c| (c, socket_of(c)))))
    }

    /// Builds a topology from `(cpu, socket)` pairs.
    pub fn from_cpus(cpus: impl IntoIterator<Item = (usize, usize)>) -> Self {
        let mut sockets: Vec<(usize, Vec<usize>)> = Vec::new();
        for (cpu, sock) in cpus {
            match sockets.iter_mut().find(|(s, _)| *s == sock) {
                Some((_, v)) => v.push(cpu),
                None => sockets.push((sock, vec![cpu])),
            }
        }
        sockets.sort();
        for (_, v) in &mut sockets {
            v.sort_unstable();
            v.dedup();
        }
        Topology { sockets }
    }

    /// Number of CPUs.
    pub fn ncpus(&self) -> usize {
        self.sockets.iter().map(|(_, v)| v.len()).sum()
    }
}

/// Where one rank runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The CPUs it may use; `None` = not bound.
    pub cpus: Option<Vec<usize>>,
    /// The socket it was mapped to.
    pub socket: usize,
}

impl Placement {
    /// One line for `--report-bindings`.
    pub fn describe(&self, rank: usize) -> String {
        match &self.cpus {
            None => format!("tmpirun: rank {rank} not bound"),
            Some(c) if c.len() == 1 => {
                format!(
                    "tmpirun: rank {rank} bound to cpu {} (socket {})",
                    c[0], self.socket
                )
            }
            Some(c) => format!(
                "tmpirun: rank {rank} bound to cpus {} (socket {})",
                cpu_list(c),
                self.socket
            ),
        }
    }
}

/// `0-3,6,8-9` style list of ascending CPUs.
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// The placement of each of `n` ranks. `bind` `None` picks the default (see module docs).
pub fn plan(topo: &Topology, n: usize, bind: Option<BindTo>, map: MapBy) -> Vec<Placement> {
    let ncpus = topo.ncpus();
    let bind = bind.unwrap_or(if n <= ncpus {
        BindTo::Core
    } else {
        BindTo::None
    });
    if ncpus == 0 {
        return vec![
            Placement {
                cpus: None,
                socket: 0
            };
            n
        ];
    }
    let flat: Vec<(usize, usize)> = topo
        .sockets
        .iter()
        .flat_map(|(s, v)| v.iter().map(move |&c| (*s, c)))
        .collect();
    let nsock = topo.sockets.len();
    (0..n)
        .map(|r| {
            let (socket, cpu) = match map {
                MapBy::Core => flat[r % ncpus],
                MapBy::Socket => {
                    let (s, cpus) = &topo.sockets[r % nsock];
                    (*s, cpus[(r / nsock) % cpus.len()])
                }
            };
            let cpus = match bind {
                BindTo::Core => Some(vec![cpu]),
                BindTo::Socket => topo
                    .sockets
                    .iter()
                    .find(|(s, _)| *s == socket)
                    .map(|(_, v)| v.clone()),
                BindTo::None => None,
            };
            Placement { cpus, socket }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_sockets() -> Topology {
        Topology::from_cpus([(0, 0), (1, 0), (2, 1), (3, 1)])
    }

    #[test]
    fn default_binds_to_core_when_it_fits() {
        let p = plan(&two_sockets(), 4, None, MapBy::Core);
        let cpus: Vec<_> = p.iter().map(|p| p.cpus.clone().unwrap()[0]).collect();
        assert_eq!(cpus, [0, 1, 2, 3]);
        assert_eq!(p[2].socket, 1);
        let p = plan(&two_sockets(), 5, None, MapBy::Core);
        assert!(p.iter().all(|p| p.cpus.is_none()));
    }

    #[test]
    fn map_by_socket_alternates() {
        let p = plan(&two_sockets(), 4, Some(BindTo::Core), MapBy::Socket);
        let cpus: Vec<_> = p.iter().map(|p| p.cpus.clone().unwrap()[0]).collect();
        assert_eq!(cpus, [0, 2, 1, 3]);
        let p = plan(&two_sockets(), 2, Some(BindTo::Socket), MapBy::Socket);
        assert_eq!(p[1].cpus, Some(vec![2, 3]));
        assert_eq!(
            p[1].describe(1),
            "tmpirun: rank 1 bound to cpus 2-3 (socket 1)"
        );
    }

    #[test]
    fn explicit_core_binding_wraps_when_oversubscribed() {
        let p = plan(&two_sockets(), 6, Some(BindTo::Core), MapBy::Core);
        assert_eq!(p[5].cpus, Some(vec![1]));
        assert_eq!(
            p[5].describe(5),
            "tmpirun: rank 5 bound to cpu 1 (socket 0)"
        );
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(cpu_list(&[]), "");
    }

    #[test]
    fn detect_sees_at_least_one_cpu() {
        assert!(Topology::detect().unwrap().ncpus() >= 1);
    }
}
