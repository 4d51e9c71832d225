//! Every `TMPI_*` environment variable the runtime and `tmpirun` read, with its default and
//! meaning: the one table ([`KNOBS`]) that `tmpirun --info` prints, `tmpi::config` parses
//! and README's configuration table must match (`tests/tests/readme.rs` checks it). It is
//! also reachable as `tmpi_transport::bootstrap::KNOBS` and `tmpi::config::KNOBS`.

/// A documented runtime knob: an environment variable, its default and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knob {
    /// Environment variable.
    pub name: &'static str,
    /// Default value, as text.
    pub default: &'static str,
    /// What it does and what it accepts.
    pub meaning: &'static str,
}

/// Every `TMPI_*` knob the runtime reads, as `tmpirun --info` lists them. This is the one
/// table: the runtime (`tmpi::config`, which parses and validates each of them) re-exports
/// it, and the launcher, which may not depend on the runtime, prints it.
pub const KNOBS: &[Knob] = &[
    Knob { name: "TMPI_STATS", default: "0", meaning: "1: each rank prints one `tmpi-stats rank=R key=value...` line to stderr at finalize (0 or 1)" },
    Knob { name: "TMPI_EAGER_LIMIT", default: "524288", meaning: "largest message (bytes) sent eagerly, i.e. copied through the ring and buffered at the receiver if unexpected; larger ones use rendezvous (64..=16777216)" },
    Knob { name: "TMPI_RNDV_THRESHOLD", default: "auto", meaning: "messages of at least this many bytes use rendezvous (register, RDMA read served by the sender after its key check, FIN), whatever TMPI_EAGER_LIMIT says; auto = 262144, except between ranks of one host that do not outnumber its cores (with TMPI_SINGLE_COPY_MIN=auto): there rendezvous starts at 16384 and each receiver tells its senders to go eager for the sizes where single copy does not beat the rings, up to 524287 bytes (1..=4294967295 or auto)" },
    Knob { name: "TMPI_UNEXPECTED_MAX", default: "67108864", meaning: "bytes of unexpected eager messages a rank buffers, shared out as credit among its peers; a sender whose credit is used up sends rendezvous requests until the receiver consumes what it sent (flow control) (4096..=2^40)" },
    Knob { name: "TMPI_TM_MAX_TAGS", default: "1023", meaning: "entries of the soft TM-SRQ tag list; 0 turns receive offload off (0..=65535)" },
    Knob { name: "TMPI_TM_THRESH", default: "16384", meaning: "smallest receive (bytes) offloaded to the soft TM-SRQ (>= 0); below 16 KiB its model costs more CPU than software matching" },
    Knob { name: "TMPI_SHM_RING_SIZE", default: "auto", meaning: "bytes of each shared-memory ring, one per ordered pair of ranks (jobs of up to TMPI_SHM_PAIRS_MAX ranks on a host); auto = 4 MiB up to 4 ranks, 1 MiB up to 8, 256 KiB up to 32, 64 KiB beyond (power of two, 4096..=1073741824, or auto)" },
    Knob { name: "TMPI_SHM_PAIRS_MAX", default: "64", meaning: "largest number of ranks on a host that get a shared-memory ring per ordered pair; more get one queue per rank and a pool of fragments per sender, whose memory grows with the ranks, not their square (1..=4096)" },
    Knob { name: "TMPI_SHM_LIMIT", default: "auto", meaning: "most bytes the shared-memory segment may take; init fails naming the figures if it needs more; auto = what the tmpfs, the host (MemAvailable) and the memory cgroup can give, which is checked whatever this says (bytes with an optional binary suffix k/m/g/t, or auto)" },
    Knob { name: "TMPI_POLL_SPIN", default: "auto", meaning: "idle polls before a waiting rank starts yielding the CPU, or, with TCP peers, sleeps in ppoll(2) on its sockets (TCP only) or yields then sleeps there (hybrid); auto = 20000, or 0 (yield at once) when ranks outnumber cores; with TCP peers 100 divided by the rank's TCP connections, at least 1 and at most 20000 (64 when ranks outnumber cores) (0..=10000000 or auto)" },
    Knob { name: "TMPI_MR_CACHE_MAX_COUNT", default: "1024", meaning: "most registrations the MR cache holds, in use or not; past it unused ones are flushed and the rest registered uncached; 0 disables the cache (0..=1073741824; FI_MR_CACHE_MAX_COUNT is read when unset)" },
    Knob { name: "TMPI_MR_CACHE_MAX_SIZE", default: "unlimited", meaning: "most bytes the MR cache's registrations cover, in use or not (bytes with an optional binary suffix k/m/g/t, or unlimited; FI_MR_CACHE_MAX_SIZE is read when unset)" },
    Knob { name: "TMPI_MR_CACHE_MONITOR", default: "userfaultfd", meaning: "how the MR cache learns of unmapped memory: userfaultfd (uffd, memhooks and kdreg2 select it too) or disabled, which turns caching off (FI_MR_CACHE_MONITOR is read when unset)" },
    Knob { name: "TMPI_SINGLE_COPY", default: "cma", meaning: "how rendezvous data moves once the sender's key check passed: cma = one kernel copy where the kernel permits it (the reader process_vm_readv's the first half, the sender process_vm_writev's the second half from 128 KiB on), else (and with none) a pipelined copy through the shared-memory rings" },
    Knob { name: "TMPI_FABRIC", default: "auto", meaning: "which fabric links ranks: auto = shared memory between ranks of one host and TCP between hosts (with the cargo feature ofi: libfabric between hosts instead when every rank finds the same hardware provider: verbs, efa, cxi, psm2, psm3, opx), shm = shared memory only (all ranks on one host), tcp = TCP between every pair of ranks, even on one host (for testing), ofi = libfabric between every pair of ranks, on TMPI_OFI_PROVIDER (builds with the cargo feature ofi only)" },
    Knob { name: "TMPI_TCP_IF", default: "auto", meaning: "interface name (eth0) or IP address the TCP fabric listens on; auto = loopback when all ranks run on one host, else the first IPv4 address of an interface that is up and not loopback (never the wildcard address); tmpirun also listens there for the bootstrap of ranks on other hosts (default there: the address that routes to the first remote host)" },
    Knob { name: "TMPI_PEER_TIMEOUT", default: "20", meaning: "seconds a peer on another host may leave its TCP connections unanswered (data or the kernel's keepalive probes unacknowledged) before it counts as gone: waits on it fail with PeerGone, and tmpirun ends the job naming a host whose connection to it stays silent as long (plain ssh gets ServerAliveInterval/ServerAliveCountMax to match); a rank busy computing is never taken for gone, its kernel answers; 0 = no limit (1..=86400, or 0)" },
    Knob { name: "TMPI_SINGLE_COPY_MIN", default: "auto", meaning: "smallest rendezvous read (bytes) that uses single copy; smaller ones stream through the rings; auto = each receiver times reads both ways per power-of-two size class and uses the faster, trying the other now and then (which wins depends on the host, by 2x either way: bench/results/adaptive-copy.md) (>= 0 or auto)" },
    Knob { name: "TMPI_SHARED_HEAP", default: "1073741824", meaning: "bytes of address space of each rank's shared heap (World::alloc_shared), a memory file that peers map on first use so a rendezvous from or into it is one plain memcpy; pages are taken only as blocks are written; 0 turns it off (allocations are then private memory) (0..=2^40; at least 65536 when not 0)" },
    Knob { name: "TMPI_SHM_COLL", default: "on", meaning: "on: barrier, bcast, reduce and allreduce of communicators of 2 to 64 ranks go through flags and slots in the shared-memory segment (up to 4 KiB of data; larger calls agree there, then use point-to-point); off: point-to-point algorithms only; must be the same on every rank (on or off)" },
    Knob { name: "TMPI_TRACE", default: "off", meaning: "a path ending in .json: record a timeline of every tmpi call and message of this rank in a ring file PATH.rankR (tmpirun --trace PATH merges them into PATH; a rank started alone writes PATH itself; tmpi-trace merge PATH merges the files of a job started otherwise), or off" },
    Knob { name: "TMPI_TRACE_EVENTS", default: "1048576", meaning: "events the trace ring of each rank holds (48 bytes each); when full the oldest are overwritten and the trace notes how many were dropped (1024..=1073741824)" },
    Knob { name: "TMPI_PROFILE", default: "off", meaning: "on: count time, calls and bytes per call kind and messages and bytes per destination; at finalize a rank started alone prints the report on stderr, a rank of a larger job writes tmpi-profile.rankR in the current directory (tmpirun --profile collects them); a directory: write the files there; off" },
    Knob { name: "TMPI_RECORD", default: "off", meaning: "an existing directory: record this rank's nondeterministic decisions (what each wildcard receive and probe matched, what each test answered, which request wait_any/wait_some/test_* reported) in DIR/rankR.tmpirec for TMPI_REPLAY (tmpirun --record DIR), or off" },
    Knob { name: "TMPI_REPLAY", default: "off", meaning: "a directory written by TMPI_RECORD: force the recorded decisions (a wildcard receive waits for the recorded message, a test answers as recorded) and fail with Error::Replay naming the rank and the call where the program departs from the record (tmpirun --replay DIR), or off" },
    Knob { name: "TMPI_OFI_PROVIDER", default: "auto", meaning: "builds with the cargo feature ofi: the libfabric provider of the OFI fabric, as fi_info -l names it (tcp, shm, verbs, efa, cxi, psm3; layered ones as tcp;ofi_rxm), or auto = the first that fi_getinfo offers for an RDM endpoint with FI_TAGGED | FI_RMA; used by TMPI_FABRIC=ofi, and by auto between hosts when it names a hardware provider (lowercase letters, digits, _ and ;, or auto)" },
    Knob { name: "TMPI_RSH", default: "ssh", meaning: "read by tmpirun, not by the ranks: the command that starts ranks on other hosts (--host/--hostfile), split on whitespace, given the host then a shell command; plain ssh gets -x -o BatchMode=yes and, unless TMPI_PEER_TIMEOUT is 0, ServerAliveInterval and ServerAliveCountMax; --launch-agent overrides it" },
];

/// Knobs of [`KNOBS`] that `tmpirun` reads itself and the ranks ignore: the runtime does not
/// parse them, and `tmpirun` does not pass them on to the ranks of other hosts.
pub const LAUNCHER_KNOBS: &[&str] = &["TMPI_RSH"];
