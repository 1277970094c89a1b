#!/usr/bin/env bash
# Runs the workspace's build scripts the way a machine that only ran ./scripts/demo.sh has them:
# a CARGO_HOME holding the registry index and the crates a build downloads (the workspace's
# normal and build dependencies on this platform, and what cargo fetches before it builds),
# none of the dev-dependencies only the tests build. Then `cargo check --release --workspace
# --offline` (build scripts run, no code generation). A build script that wants more than a build
# downloaded (`cargo metadata` reads every dev-dependency's manifest) fails here, not on a user's
# machine. Reads the crates from $CARGO_HOME (default ~/.cargo).
#   scripts/check-demo-build.sh [DIR]    (DIR: where the CARGO_HOME and target go; default
#                                          target/demo-build)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-target/demo-build}"
from="${CARGO_HOME:-$HOME/.cargo}"
home="$dir/cargo-home"
host="$(rustc -vV | sed -n 's/^host: //p')"
[ -n "$host" ] || { echo "check-demo-build: rustc -vV names no host" >&2; exit 1; }
[ -d "$from/registry/index" ] || { echo "check-demo-build: $from has no registry index (fetch first)" >&2; exit 1; }
rm -rf "$home"
mkdir -p "$home/registry"
cp -a "$from/registry/index" "$home/registry/"

add() { # name version: copies the crate from $from
  local crate reg
  crate="$(find "$from/registry/cache" -maxdepth 2 -name "$1-$2.crate" -print -quit)"
  [ -n "$crate" ] || { echo "check-demo-build: $1 $2 is not in $from/registry/cache" >&2; exit 1; }
  reg="$(basename "$(dirname "$crate")")"
  mkdir -p "$home/registry/cache/$reg"
  cp "$crate" "$home/registry/cache/$reg/"
}
count=0
# The dependency graph without dev-dependencies: "name vX.Y.Z [(proc-macro)]"; path packages
# end with their path in parentheses.
while read -r name version rest; do
  [ -n "$name" ] || continue
  case "$rest" in "(/"*) continue ;; esac
  add "$name" "${version#v}"
  count=$((count + 1))
done < <(CARGO_HOME="$from" cargo tree --workspace --locked --offline -e normal,build \
  --target "$host" --prefix none --format '{p}' | sed 's/ (\*)$//' | sort -u)
# Cargo also fetches, before building, packages the graph lists but leaves unused (a
# dependency's optional dependencies): whatever it asks for at that stage, a build downloads.
for _ in $(seq 1 50); do
  out="$(CARGO_HOME="$home" CARGO_TARGET_DIR="$dir/target" cargo check --release --workspace \
    --offline --locked --quiet 2>&1)" && { echo "check-demo-build: $count crates; the workspace's build scripts ran"; exit 0; }
  missing="$(printf '%s\n' "$out" | sed -n 's/^error: failed to download `\([^ ]*\) v\([^`]*\)`$/\1 \2/p' | head -n1)"
  if [ -z "$missing" ]; then
    printf '%s\n' "$out" | tail -n 40 >&2
    echo "check-demo-build: cargo check failed with only a build's crates in $home" >&2
    exit 1
  fi
  add $missing
  count=$((count + 1))
done
echo "check-demo-build: cargo kept asking for crates" >&2
exit 1
