#!/usr/bin/env bash
# The soak: steady HTTP and TCP traffic between two sidecars over mTLS with 20 s certificates,
# a config edit every 4 s and a control-plane restart (`istiod-core serve` with its CA, dialed
# over TLS) every minute, for MINUTES (default 10). Fails on any failed request or on growing
# fds/RSS of an agent; prints the fd and RSS figures of both agents and istiod-core.
# The test is tests/tests/soak_e2e.rs (ignored by default; run here with --ignored), on the
# debug binaries the end-to-end tests use. Root required.
#   ./scripts/soak.sh [MINUTES]
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES="${1:-10}"
case "$MINUTES" in
  ''|*[!0-9]*) echo "usage: $0 [MINUTES] (a whole number; got '$MINUTES')" >&2; exit 2 ;;
esac
./scripts/setup.sh >/dev/null
cargo build --workspace --bins --tests
SOAK_MINUTES="$MINUTES" cargo test -p e2e-tests --test soak_e2e -- --ignored --nocapture
