#!/usr/bin/env bash
# Times `hello` jobs of N ranks on this host (oversubscribed: ranks may outnumber cores) under
# tmpirun, Open MPI's mpirun and MPICH's mpirun, one after another, REPS times each, and prints
# one line per run: `launcher ranks seconds exit-status hellos`.
#
#   bench/launch-scale.sh [REPS] [N...]        (defaults: 3 repetitions, N = 256 1024)
#
# Needs `cargo build --release --workspace --bins` (tmpirun, hello) and, for the peers,
# `apt-get install openmpi-bin libopenmpi-dev mpich libmpich-dev` (a peer that is missing is
# skipped, saying so). Timing on a loaded host says little: report the load with the figures
# (the script prints the load average before and after).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
reps="${1:-3}"
shift || true
counts=("${@:-256 1024}")
# shellcheck disable=SC2206
counts=(${counts[*]})
tmp="$(mktemp -d /tmp/launch-scale.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

runners=("tmpi")
if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
    mpicc.openmpi -O2 -o "$tmp/hello_ompi" "$root/bench/c/hello.c"
    runners+=("openmpi")
else
    echo "# Open MPI not found: skipped" >&2
fi
if command -v mpicc.mpich >/dev/null && command -v mpirun.mpich >/dev/null; then
    mpicc.mpich -O2 -o "$tmp/hello_mpich" "$root/bench/c/hello.c"
    runners+=("mpich")
else
    echo "# MPICH not found: skipped" >&2
fi

cmd() {
    local who="$1" n="$2"
    case "$who" in
        tmpi) echo "$root/target/release/tmpirun -n $n --timeout 900 $root/target/release/hello" ;;
        openmpi) echo "mpirun.openmpi --allow-run-as-root --oversubscribe -n $n $tmp/hello_ompi" ;;
        mpich) echo "mpirun.mpich -n $n $tmp/hello_mpich" ;;
    esac
}

echo "# $(date -u +%FT%TZ) $(uname -r), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# launcher ranks seconds status hellos"
for n in "${counts[@]}"; do
    for rep in $(seq "$reps"); do
        for who in "${runners[@]}"; do
            start=$(date +%s.%N)
            status=0
            # shellcheck disable=SC2046
            timeout 1200 $(cmd "$who" "$n") >"$tmp/out" 2>"$tmp/err" </dev/null || status=$?
            end=$(date +%s.%N)
            hellos=$(grep -c '^Hello from rank ' "$tmp/out" || true)
            printf '%s %d %.2f %d %d\n' "$who" "$n" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" "$status" "$hellos"
            if [[ $status -ne 0 ]]; then
                tail -3 "$tmp/err" | sed 's/^/#   /'
            fi
        done
    done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
