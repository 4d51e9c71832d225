//! The topology and bindings through hwloc (cargo feature `hwloc`, crate `hwlocality`).

use hwlocality::cpu::binding::CpuBindingFlags;
use hwlocality::cpu::cpuset::CpuSet;
use hwlocality::object::types::ObjectType;
use hwlocality::topology::builder::{BuildFlags, TypeFilter};
use hwlocality::Topology;
use std::sync::Mutex;

use super::Pu;
use crate::error::{Error, Result};

/// hwloc's list of plugins not to load.
const PLUGINS_BLACKLIST: &str = "HWLOC_PLUGINS_BLACKLIST";
/// The plugins Debian's hwloc ships; none matters for CPU binding.
const IO_PLUGINS: &str = "hwloc_pci,hwloc_opencl,hwloc_gl,hwloc_cuda,hwloc_nvml,hwloc_rsmi,\
                          hwloc_levelzero,hwloc_xml_libxml";

/// Held while a topology loads (hwloc reads its environment then; see [`Hwloc::new`]).
pub(super) static LOADING: Mutex<()> = Mutex::new(());

/// A loaded hwloc topology: packages, cores and PUs only (caches, NUMA details and I/O
/// devices are filtered out, which keeps loading fast).
pub struct Hwloc {
    topo: Topology,
}

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Binding(format!("{what}: {e}"))
}

impl Hwloc {
    /// Loads the topology of this machine.
    ///
    /// # Errors
    /// hwloc fails to configure or load it.
    pub fn new() -> Result<Self> {
        // hwloc reads its environment while it loads; one load at a time in this process, so
        // that the variable below is never changed while hwloc (C code, which does not take
        // Rust's environment lock) reads it.
        let _one = LOADING.lock().unwrap_or_else(|e| e.into_inner());
        // hwloc dlopen()s every plugin it finds (PCI, OpenCL, GL: only for I/O devices, which
        // are filtered out below), which costs more than the rest of the load together.
        // Unless the user chose otherwise, skip them for this load only, so that the ranks
        // still see the user's environment.
        let skip_plugins = std::env::var_os(PLUGINS_BLACKLIST).is_none();
        if skip_plugins {
            std::env::set_var(PLUGINS_BLACKLIST, IO_PLUGINS);
        }
        let topo = Self::load();
        if skip_plugins {
            std::env::remove_var(PLUGINS_BLACKLIST);
        }
        Ok(Hwloc { topo: topo? })
    }

    fn load() -> Result<Topology> {
        Topology::builder()
            // Keep PUs outside tmpirun's cgroup, so that core numbers are machine-wide
            // like the sysfs back-end's; the allowed set is applied afterwards.
            .with_flags(BuildFlags::INCLUDE_DISALLOWED)
            .map_err(|e| err("hwloc build flags", e))?
            // The x86 back-end runs cpuid on every CPU in turn (binding this thread to each):
            // slow, and Linux's sysfs already says which CPUs share a core and a package.
            .without_component("x86")
            .map_err(|e| err("hwloc components", e))?
            .with_common_type_filter(TypeFilter::KeepNone)
            .map_err(|e| err("hwloc type filter", e))?
            .with_type_filter(ObjectType::Package, TypeFilter::KeepAll)
            .map_err(|e| err("hwloc type filter", e))?
            .with_type_filter(ObjectType::Core, TypeFilter::KeepAll)
            .map_err(|e| err("hwloc type filter", e))?
            .build()
            .map_err(|e| err("hwloc topology load", e))
    }

    /// For `--info`.
    pub fn describe(&self) -> String {
        let v = hwlocality::hwloc_api_version();
        format!("hwloc (API {}.{}.{}, through hwlocality), hwloc_set_cpubind", v >> 16, (v >> 8) & 0xff, v & 0xff)
    }

    /// Every PU with its package and core.
    pub fn pus(&self) -> Vec<Pu> {
        self.topo
            .objects_with_type(ObjectType::PU)
            .filter_map(|pu| {
                Some(Pu {
                    cpu: pu.os_index()?,
                    socket: pu.first_ancestor_with_type(ObjectType::Package).and_then(|p| p.os_index()).unwrap_or(0),
                    core: pu.first_ancestor_with_type(ObjectType::Core).map(|c| c.global_persistent_index()),
                })
            })
            .collect()
    }

    /// The calling thread's binding.
    ///
    /// # Errors
    /// `hwloc_get_cpubind` fails.
    pub fn thread_cpus(&self) -> Result<Vec<usize>> {
        let set = self.topo.cpu_binding(CpuBindingFlags::THREAD).map_err(|e| err("hwloc_get_cpubind", e))?;
        Ok(set.iter_set().map(usize::from).collect())
    }

    /// Binds the calling thread to `cpus`.
    ///
    /// # Errors
    /// A CPU number hwloc cannot represent, or `hwloc_set_cpubind` fails.
    pub fn bind_thread(&self, cpus: &[usize]) -> Result<()> {
        let mut set = CpuSet::new();
        for &c in cpus {
            let idx = hwlocality::bitmap::BitmapIndex::try_from(c).map_err(|e| err(&format!("cpu {c}"), e))?;
            set.set(idx);
        }
        self.topo.bind_cpu(&set, CpuBindingFlags::THREAD).map_err(|e| err("hwloc_set_cpubind", e))
    }
}
