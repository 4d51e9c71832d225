#!/usr/bin/env bash
# netns-tcp.sh — tmpi's TCP fabric against Open MPI's TCP BTL between two "hosts": two network
# namespaces joined by veth on this machine (tests/harness/netns.sh, an sshd in each).
#
# Usage (root): bench/netns-tcp.sh [RUNS]        (default 3)
#
# Per run, interleaved: tmpi osu_latency, Open MPI lat, tmpi osu_bw, Open MPI bw. Rank 0 runs
# in the first namespace (where the launcher runs), rank 1 in the second, started through the
# harness's ssh:
#   tmpi      tmpirun --host A1:1,A2:1 target/release/osu_{latency,bw}    (TMPI_RSH = the ssh)
#   Open MPI  mpirun.openmpi --allow-run-as-root -np 2 --host A1:1,A2:1 --mca btl tcp,self
#             --mca plm_rsh_agent SSH --mca btl_tcp_if_include NET/24 --mca oob_tcp_if_include
#             NET/24  target/peers/openmpi/{lat,bw}      (orted in the second namespace is
#             started by that ssh; the *_if_include keep both on the veth subnet)
# Sizes: LAT_SIZES (default 8:8), BW_SIZES (default 4096:4194304). Iterations, kept short for
# a shared machine: LAT_ARGS (default "-i 2000 -x 200"), BW_ARGS (default "-i 20 -x 5").
# Variants: PIN=CPU runs every rank of both under `taskset -c CPU` (both ranks on one CPU: the
# case where a rank that spins keeps its partner, or ksoftirqd, off the CPU until the scheduler
# tick); OMPI_ARGS adds mpirun arguments (e.g. "--mca mpi_yield_when_idle 1"); BIN is the
# directory of tmpi's binaries (default target/release; another build's copy to compare).
# FABRIC=ofi compares over libfabric's tcp provider instead (issue 57 item 7): tmpi with
# TMPI_FABRIC=ofi TMPI_OFI_PROVIDER=tcp (BIN must then hold a build with the feature ofi:
# cargo build --release --features ofi -p tmpi-bench -p tmpi-launcher --bins, and its
# target/release), Open MPI with --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include tcp;
# results then go to bench/results/ofi-netns.md.
#
# Needs: target/release/{tmpirun,osu_latency,osu_bw} (cargo build --release --workspace --bins),
# target/peers/openmpi/{lat,bw} (bench/peers.sh build), mpirun.openmpi, root, iproute2, sshd.
# Raw outputs: target/netns-tcp/<impl>.<prog>.<run>.txt; medians and ratios:
# bench/results/tcp-netns.md (OUT to change). The namespaces are removed on exit; their
# addresses exist only inside them, so no traffic leaves them.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
runs="${1:-3}"
lat_sizes="${LAT_SIZES:-8:8}"
bw_sizes="${BW_SIZES:-4096:4194304}"
lat_args="${LAT_ARGS:--i 2000 -x 200}"
bw_args="${BW_ARGS:--i 20 -x 5}"
fabric="${FABRIC:-tcp}"
case "$fabric" in
    tcp) out="${OUT:-$root/bench/results/tcp-netns.md}" ;;
    ofi) out="${OUT:-$root/bench/results/ofi-netns.md}" ;;
    *) echo "netns-tcp.sh: FABRIC=$fabric: tcp or ofi" >&2; exit 2 ;;
esac
raw="$root/target/netns-tcp"
rel="${BIN:-$root/target/release}"
pin="${PIN:-}"
ompi_args="${OMPI_ARGS:-}"
pin_cmd=()
[[ -n "$pin" ]] && pin_cmd=(taskset -c "$pin")
ompi="$root/target/peers/openmpi"

[[ $(id -u) -eq 0 ]] || { echo "netns-tcp.sh: needs root (network namespaces)" >&2; exit 3; }
for f in "$rel/tmpirun" "$rel/osu_latency" "$rel/osu_bw"; do
    [[ -x "$f" ]] || { echo "netns-tcp.sh: no $f (cargo build --release --workspace --bins)" >&2; exit 3; }
done
for f in "$ompi/lat" "$ompi/bw"; do
    [[ -x "$f" ]] || { echo "netns-tcp.sh: no $f (bench/peers.sh build)" >&2; exit 3; }
done
command -v mpirun.openmpi >/dev/null || { echo "netns-tcp.sh: no mpirun.openmpi (apt-get install openmpi-bin)" >&2; exit 3; }

state="$(mktemp -d /tmp/tmpi-nb.XXXXXX)"
trap '"$root/tests/harness/netns.sh" down "$state"' EXIT
"$root/tests/harness/netns.sh" up "$state" 2 >/dev/null
{ read -r ns1 a1; read -r _ns2 a2; } <"$state/hosts"
rsh="$(cat "$state/rsh")"
net="${a1%.*}.0/24"
mkdir -p "$raw"
rm -f "$raw"/*.txt

tmpi_env=()
ompi_net=(--mca btl tcp,self)
if [[ "$fabric" == ofi ]]; then
    tmpi_env=(TMPI_FABRIC=ofi TMPI_OFI_PROVIDER=tcp)
    ompi_net=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include tcp)
fi

run_tmpi() { # prog sizes file args
    # shellcheck disable=SC2086
    env "${tmpi_env[@]}" TMPI_RSH="$rsh" timeout 600 ip netns exec "$ns1" "$rel/tmpirun" --host "$a1:1,$a2:1" --timeout 590 \
        "${pin_cmd[@]}" "$rel/$1" -m "$2" $4 >"$3" 2>"$3.err" </dev/null || echo "netns-tcp.sh: tmpi $1 FAILED (see $3.err)" >&2
}

run_ompi() { # prog sizes file args
    # shellcheck disable=SC2086
    timeout 600 ip netns exec "$ns1" mpirun.openmpi --allow-run-as-root -np 2 --host "$a1:1,$a2:1" \
        "${ompi_net[@]}" --mca plm_rsh_agent "$rsh" --mca btl_tcp_if_include "$net" --mca oob_tcp_if_include "$net" \
        $ompi_args "${pin_cmd[@]}" "$ompi/$1" -m "$2" $4 >"$3" 2>"$3.err" </dev/null || echo "netns-tcp.sh: Open MPI $1 FAILED (see $3.err)" >&2
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
started="$(date -u '+%Y-%m-%d %H:%M UTC')"
for r in $(seq 1 "$runs"); do
    echo "netns-tcp.sh: run $r of $runs" >&2
    run_tmpi osu_latency "$lat_sizes" "$raw/tmpi.lat.$r.txt" "$lat_args"
    run_ompi lat "$lat_sizes" "$raw/ompi.lat.$r.txt" "$lat_args"
    run_tmpi osu_bw "$bw_sizes" "$raw/tmpi.bw.$r.txt" "$bw_args"
    run_ompi bw "$bw_sizes" "$raw/ompi.bw.$r.txt" "$bw_args"
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$raw" "$runs" "$out" "$started" "$load_before" "$load_after" "$(nproc)" "$lat_args" "$bw_args" "$pin" "$ompi_args" "$fabric" <<'EOF'
import os, statistics, sys
raw, runs, out, started, lb, la, cpus, lat_args, bw_args, pin, ompi_args, fabric = sys.argv[1:13]
runs = int(runs)

def table(impl, prog):
    t = {}
    for r in range(1, runs + 1):
        p = os.path.join(raw, f"{impl}.{prog}.{r}.txt")
        if not os.path.exists(p):
            continue
        for line in open(p):
            f = line.split()
            if len(f) >= 2 and f[0].isdigit():
                t.setdefault(int(f[0]), []).append(float(f[1]))
    return t

over = {"tcp": ("TCP", "TCP fabric", "--mca btl tcp,self"),
        "ofi": ("libfabric's tcp provider", "`TMPI_FABRIC=ofi TMPI_OFI_PROVIDER=tcp`",
                "--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include tcp")}[fabric]
lines = [
    f"# {over[0]} between two network namespaces: tmpi against Open MPI",
    "",
    f"`FABRIC={fabric} bench/netns-tcp.sh {runs}`, {started}: two network namespaces joined by veth (through a",
    "bridge in the first) on this machine, rank 0 in the first, rank 1 in the second, started over",
    f"ssh. tmpi: `tmpirun --host A1:1,A2:1` ({over[1]} between the hosts). Open MPI 4.1.4:",
    f"`mpirun.openmpi {over[2]} --host A1:1,A2:1` with `btl_tcp_if_include` and",
    "`oob_tcp_if_include` on the veth subnet, orted started through the same ssh; the C programs",
    "of `bench/peers.sh` (same loops and output as tmpi's). Interleaved (tmpi lat, Open MPI lat,",
    f"tmpi bw, Open MPI bw) {runs} times; medians. {cpus} CPUs shared with other work: load average",
    f"{lb} before, {la} after. Iterations: latency `{lat_args}`, bandwidth `{bw_args}`",
    "(window 64)." + (f" Every rank pinned to CPU {pin} (`PIN={pin}`)." if pin else "")
    + (f" Open MPI with `{ompi_args}`." if ompi_args else ""),
    "",
]
goals = {"lat": ("latency (us, lower is better)", "tmpi/Open MPI", lambda a, b: a / b, "<= 0.9" if fabric == "tcp" else "<= 1.0"),
         "bw": ("bandwidth (MB/s, higher is better)", "tmpi/Open MPI", lambda a, b: a / b, ">= 1.0")}
for prog in ("lat", "bw"):
    what, ratio_name, ratio, goal = goals[prog]
    tm, om = table("tmpi", prog), table("ompi", prog)
    lines += [f"## {prog}: {what}", "",
              f"| size (B) | tmpi median | tmpi runs | Open MPI median | Open MPI runs | {ratio_name} (goal {goal}) |",
              "|---:|---:|---|---:|---|---:|"]
    for size in sorted(set(tm) | set(om)):
        t, o = tm.get(size, []), om.get(size, [])
        mt = statistics.median(t) if t else None
        mo = statistics.median(o) if o else None
        x = ratio(mt, mo) if mt and mo else None
        r = "n/a" if x is None else f"{x:.2f}" if x >= 0.1 else f"{x:.4f}"
        fmt = lambda v: f"{v:.2f}" if v is not None else "n/a"
        runs_t = ", ".join(f"{v:.2f}" for v in t) or "none"
        runs_o = ", ".join(f"{v:.2f}" for v in o) or "none"
        lines.append(f"| {size} | {fmt(mt)} | {runs_t} | {fmt(mo)} | {runs_o} | {r} |")
    lines.append("")
text = "\n".join(lines)
marker = "<!-- notes -->"
if os.path.exists(out):
    old = open(out).read()
    if marker in old:
        text += "\n" + old[old.index(marker):]
open(out, "w").write(text if text.endswith("\n") else text + "\n")
print(text)
EOF
