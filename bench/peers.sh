#!/usr/bin/env bash
# Builds the C peer benchmarks (bench/c/) against Open MPI and MPICH and runs them, so that
# tmpi's OSU-style binaries can be compared with established MPI libraries on this machine.
#
# Usage: bench/peers.sh [build|run|all|summary] [RUNS]        (default: all 3)
#
# Output goes under target/peers/ (never into git):
#   target/peers/<impl>/{lat,bw,bibw,msgrate}      binaries (impl = openmpi | mpich)
#   target/peers/cacheline                          cache-line ping-pong (no MPI)
#   target/peers/results/<config>/<prog>.<run>.txt  raw outputs
#   target/peers/results/summary.txt                medians over the runs
# Configurations:
#   ompi        mpirun.openmpi --allow-run-as-root --oversubscribe -np 2
#   ompi-nosc   the same with --mca btl_vader_single_copy_mechanism none
#   mpich       mpirun.mpich -np 2
# Environment: PEER_SIZES (the -m argument of lat/bw/bibw, default 0:4194304),
#              PEER_ARGS (extra arguments for every program, e.g. "-i 1000").
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="$root/target/peers"
mode="${1:-all}"
runs="${2:-3}"
sizes="${PEER_SIZES:-0:4194304}"
extra="${PEER_ARGS:-}"
progs=(lat bw bibw msgrate)

build() {
    local impl cc
    for impl in openmpi mpich; do
        cc="mpicc.$impl"
        if ! command -v "$cc" >/dev/null; then
            echo "peers.sh: $cc not found (apt-get install libopenmpi-dev libmpich-dev)" >&2
            exit 1
        fi
        mkdir -p "$out/$impl"
        for p in "${progs[@]}"; do
            "$cc" -O2 -Wall -Wextra -Wno-stringop-overflow -o "$out/$impl/$p" "$here/c/$p.c"
        done
    done
    cc -O2 -Wall -Wextra -pthread -o "$out/cacheline" "$here/c/cacheline.c"
    echo "peers.sh: built into $out"
}

launcher() { # config -> launcher command line (without the program)
    case "$1" in
        ompi) echo "mpirun.openmpi --allow-run-as-root --oversubscribe -np 2" ;;
        ompi-nosc) echo "mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 --mca btl_vader_single_copy_mechanism none" ;;
        mpich) echo "mpirun.mpich -np 2" ;;
    esac
}

impl_of() { case "$1" in ompi*) echo openmpi ;; *) echo mpich ;; esac; }

run_all() {
    local cfg p r dir args
    mkdir -p "$out/results"
    { date -u; echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"; } >"$out/results/load.txt"
    for cfg in ompi ompi-nosc mpich; do
        dir="$out/results/$cfg"
        mkdir -p "$dir"
        for p in "${progs[@]}"; do
            args="$extra"
            [[ "$p" != msgrate ]] && args="-m $sizes $args"
            for r in $(seq 1 "$runs"); do
                echo "peers.sh: $cfg $p run $r" >&2
                # shellcheck disable=SC2046
                timeout 900 $(launcher "$cfg") "$out/$(impl_of "$cfg")/$p" $args \
                    >"$dir/$p.$r.txt" 2>"$dir/$p.$r.err" || echo "peers.sh: $cfg $p run $r FAILED" >&2
            done
        done
    done
    for r in $(seq 1 "$runs"); do
        "$out/cacheline" 1000000 >"$out/results/cacheline.$r.txt"
    done
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/results/load.txt"
}

summarize() { # medians per (config, program, size) over the runs
    python3 - "$out/results" "$runs" <<'EOF'
import os, re, statistics, sys
res, runs = sys.argv[1], int(sys.argv[2])
lines = []
for cfg in ("ompi", "ompi-nosc", "mpich"):
    for prog in ("lat", "bw", "bibw", "msgrate"):
        table = {}
        for r in range(1, runs + 1):
            path = os.path.join(res, cfg, f"{prog}.{r}.txt")
            if not os.path.exists(path):
                continue
            for line in open(path):
                if line.startswith("#") or not line.strip():
                    continue
                f = line.split()
                table.setdefault(int(f[0]), []).append([float(x) for x in f[1:]])
        unit = {"lat": "us", "bw": "MB/s", "bibw": "MB/s", "msgrate": "MB/s, msg/s"}[prog]
        lines.append(f"## {cfg} {prog} ({unit}), median of {runs}")
        for size in sorted(table):
            cols = list(zip(*table[size]))
            med = "  ".join(f"{statistics.median(c):14.2f}" for c in cols)
            lines.append(f"{size:<10}{med}   (n={len(table[size])})")
cl = []
for r in range(1, runs + 1):
    p = os.path.join(res, f"cacheline.{r}.txt")
    if os.path.exists(p):
        m = re.search(r"median ([0-9.]+)", open(p).read())
        if m:
            cl.append(float(m.group(1)))
if cl:
    lines.append(f"## cacheline one-way ns, median of {len(cl)} runs: {statistics.median(cl):.1f}")
load = os.path.join(res, "load.txt")
if os.path.exists(load):
    lines = ["# " + l.rstrip() for l in open(load)] + lines
text = "\n".join(lines) + "\n"
open(os.path.join(res, "summary.txt"), "w").write(text)
print(text, end="")
EOF
}

case "$mode" in
    build) build ;;
    run) run_all; summarize ;;
    summary) summarize ;;
    all) build; run_all; summarize ;;
    *) echo "usage: $0 [build|run|all|summary] [RUNS]" >&2; exit 2 ;;
esac
