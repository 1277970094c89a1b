#!/usr/bin/env bash
# Makes DIR a CARGO_HOME holding only the crates this platform's build of the workspace needs
# (`cargo fetch --target HOST`), the registry a fresh machine has after its first build. Tools
# installed by setup.sh stay where they are (on PATH). Used by scripts/test.sh in CI, so a
# build step that needs more (another platform's crate, a download at build time) fails there.
#   scripts/fresh-cargo-home.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:?usage: $0 DIR}"
host="$(rustc -vV | sed -n 's/^host: //p')"
[ -n "$host" ] || { echo "fresh-cargo-home: rustc -vV names no host" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"
echo "fresh-cargo-home: fetching the crates for $host only into $dir"
CARGO_HOME="$dir" cargo fetch --locked --target "$host" --quiet
