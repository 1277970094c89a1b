#!/usr/bin/env bash
# cargo-deny over the workspace's dependency graph (deny.toml). The RustSec advisory database is
# a git repository on GitHub, which these machines cannot reach: when a copy is present (where
# `cargo deny fetch` puts it, deny.toml's db-path) advisories are checked against it without
# fetching; otherwise the advisories check is skipped and the output says so. Bans, licenses and
# sources are checked either way.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-deny >/dev/null 2>&1; then
  echo "deny: cargo-deny is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi
db="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
if compgen -G "$db/*/crates" >/dev/null; then
  echo "deny: advisories checked against the local RustSec database in $db (not fetched)"
  cargo deny check --disable-fetch advisories bans licenses sources
else
  echo "deny: ADVISORIES SKIPPED: offline, no RustSec database under $db"
  echo "deny: (where github.com is reachable: 'cargo deny fetch', then run this again)"
  cargo deny check bans licenses sources
fi
