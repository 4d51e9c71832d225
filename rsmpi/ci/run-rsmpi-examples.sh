#!/usr/bin/env bash
# Builds rsmpi's own examples (and tests/derive_tests.rs), unchanged, against tmpi-rsmpi and
# runs each example at 2 and 3 ranks under target/release/tmpirun.
#
# The `mpi` 0.8 package is fetched from crates.io at run time (nothing of it is committed):
# a scratch cargo project under target/rsmpi-examples depends on `mpi = "=0.8.x"` only to
# have cargo download its source, then a second scratch project copies its examples/ and
# tests/derive_tests.rs and builds them with `mpi = { package = "tmpi-rsmpi", path = ... }`.
#
# Usage: rsmpi/ci/run-rsmpi-examples.sh [--build-only]
# Env: RSMPI_VERSION (default 0.8.2), TMPIRUN (default target/release/tmpirun).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
ver="${RSMPI_VERSION:-0.8.2}"
work="$root/target/rsmpi-examples"
tmpirun="${TMPIRUN:-$root/target/release/tmpirun}"
# Examples that cannot pass here, with the reason (see rsmpi/README.md): none now.
declare -A EXCLUDED=()

mkdir -p "$work/fetch/src" "$work/build"
cat >"$work/fetch/Cargo.toml" <<TOML
[package]
name = "rsmpi-fetch"
version = "0.0.0"
edition = "2021"
publish = false
[dependencies]
mpi = { version = "=$ver", default-features = false }
[workspace]
TOML
echo 'fn main() {}' >"$work/fetch/src/main.rs"
# `cargo fetch` downloads the package's source into cargo's registry cache (no build: the
# real crate needs a C MPI to build).
(cd "$work/fetch" && cargo fetch --quiet)
src="$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d -name "mpi-$ver" | head -n1)"
if [ -z "$src" ] || [ ! -d "$src/examples" ]; then
  echo "rsmpi examples: mpi-$ver's source (with examples/) not found after cargo fetch" >&2
  exit 1
fi

b="$work/build"
rm -rf "$b/examples" "$b/tests"
mkdir -p "$b/src" "$b/examples" "$b/tests"
# -p: the copies keep the package's times, so an unchanged example is not rebuilt.
cp -p "$src"/examples/*.rs "$b/examples/"
cp -p "$src/tests/derive_tests.rs" "$b/tests/"
echo '' >"$b/src/lib.rs"
{
  cat <<TOML
[package]
name = "rsmpi-examples"
version = "0.0.0"
edition = "2021"
publish = false
autoexamples = false
[dependencies]
mpi = { package = "tmpi-rsmpi", path = "$root/rsmpi" }
num-complex = { version = "0.4", default-features = false }
# rsmpi's examples test these features as the mpi package's own: the same names here, on.
[features]
default = ["derive", "complex", "user-operations"]
derive = ["mpi/derive"]
complex = ["mpi/complex"]
user-operations = ["mpi/user-operations"]
# rsmpi's build script declares cfg(msmpi) (Microsoft MPI); never set here.
[lints.rust]
unexpected_cfgs = { level = "warn", check-cfg = ['cfg(msmpi)'] }
[[test]]
name = "derive_tests"
path = "tests/derive_tests.rs"
[workspace]
# Optimized like the workspace's release build, without its link-time optimization and with
# line tables only: 56 programs link in seconds instead of minutes. These are the values
# .ci/run gives the workspace's release profile through CARGO_PROFILE_RELEASE_*, so that in
# CI this project reuses the workspace's build of tmpi (one target directory).
[profile.release]
debug = "line-tables-only"
lto = false
codegen-units = 16
TOML
  for f in "$b"/examples/*.rs; do
    n="$(basename "$f" .rs)"
    printf '[[example]]\nname = "%s"\npath = "examples/%s.rs"\n' "$n" "$n"
  done
} >"$b/Cargo.toml"

# The workspace's lock file pins the versions the workspace builds with.
cp "$root/Cargo.lock" "$b/Cargo.lock"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
# --keep-going: an example that does not compile is reported below as a failure of its own,
# and the others still build and run. The executables cargo reports (built now or up to
# date) are the ones that exist.
built=0
(cd "$b" && cargo build --release --examples --keep-going --quiet --message-format=json-render-diagnostics) >"$work/build.json" || built=$?
grep -o '"executable":"[^"]*"' "$work/build.json" | sed 's/^"executable":"//; s/"$//' >"$work/built.txt" || true
(cd "$b" && cargo test --release --test derive_tests --quiet)
if [ "${1:-}" = "--build-only" ]; then
  exit "$built"
fi

pass=0 fail=0 skip=0 failed=()
for f in "$b"/examples/*.rs; do
  n="$(basename "$f" .rs)"
  if [ -n "${EXCLUDED[$n]:-}" ]; then
    echo "skip $n: ${EXCLUDED[$n]}"
    skip=$((skip + 2))
    continue
  fi
  exe="$(grep -m1 "/examples/$n\$" "$work/built.txt" || true)"
  if [ -z "$exe" ]; then
    fail=$((fail + 2))
    failed+=("$n(build)")
    echo "FAIL $n: it did not build (see the cargo output above)" >&2
    continue
  fi
  for np in 2 3; do
    if "$tmpirun" -n "$np" --timeout 120 "$exe" >"$work/$n.$np.log" 2>&1; then
      pass=$((pass + 1))
    else
      fail=$((fail + 1))
      failed+=("$n@$np")
      echo "FAIL $n at $np ranks:" >&2
      tail -n 20 "$work/$n.$np.log" >&2
    fi
  done
done
echo "rsmpi examples: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ] || { echo "failed: ${failed[*]}" >&2; exit 1; }
