#!/usr/bin/env bash
# Runs every example at several rank counts with tmpirun and fails if any run fails.
#
# Usage: examples/run-examples.sh [PROFILE] [RANKS...]     (default: debug 1 2 3 8)
# Builds tmpi-examples and tmpirun in PROFILE first. Output of each run goes to
# target/examples-out/<example>.n<N>.txt; 8 ranks on a 2-core machine also exercises
# oversubscription. TMPIRUN_ARGS adds launcher flags (e.g. "--timeout 120").
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
profile="${1:-debug}"
shift || true
ranks=("$@")
[[ ${#ranks[@]} -eq 0 ]] && ranks=(1 2 3 8)
flag=()
[[ "$profile" == release ]] && flag=(--release)

cd "$root"
cargo build "${flag[@]}" -p tmpi-examples -p tmpi-launcher
bin="$root/target/$profile"
out="$root/target/examples-out"
mkdir -p "$out"

examples=(hello ring pingpong wildcard pi heat1d split offload)
failed=0
for ex in "${examples[@]}"; do
    for n in "${ranks[@]}"; do
        log="$out/$ex.n$n.txt"
        # shellcheck disable=SC2086
        if timeout 300 "$bin/tmpirun" -n "$n" --oversubscribe ${TMPIRUN_ARGS:-} "$bin/$ex" >"$log" 2>&1; then
            printf '%-10s n=%-2s ok    %s\n' "$ex" "$n" "$(grep -v '^Hello' "$log" | tail -n 1)"
        else
            printf '%-10s n=%-2s FAILED (see %s)\n' "$ex" "$n" "$log"
            failed=1
        fi
    done
done
exit "$failed"
