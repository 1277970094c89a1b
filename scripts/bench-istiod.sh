#!/usr/bin/env bash
# istiod-core benchmarks (BENCHMARKS.md "istiod-core"):
#   1. generation, Istio's bench_test.go cases, one core (examples/bench-generation.rs);
#   2. convergence: `istiod-core serve` with 50 services (10 endpoints each) and 500 simulated
#      sidecars (examples/xds-load.rs, each its own connection and ADS stream, ACKing like Envoy):
#      a config edit -> debounce -> push -> every proxy has it, p50/p90/p99 after the debounce;
#   3. memory: the server's RSS with 1000 services and 10000 endpoints and 500 connected sidecars.
# Usage: ./scripts/bench-istiod.sh [rounds] (default 10). Loopback only.
# PARTS="generation convergence memory" (the default) picks the parts to run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-10}"
CLIENTS="${CLIENTS:-500}"
PARTS="${PARTS:-generation convergence memory}"
part() { [[ " $PARTS " == *" $1 "* ]]; }
# BIN=DIR: prebuilt release binaries (istiod-core, examples/bench-generation, examples/xds-load).
[ -n "${BIN:-}" ] || cargo build --release --quiet -p istiod-core --bin istiod-core --example bench-generation --example xds-load
BIN="${BIN:-$PWD/target/release}"
WORK="$(mktemp -d /tmp/istbench-istiod.XXXXXX)"
SERVER=""
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

if part generation; then
  echo "## generation (one core)"
  taskset -c 0 "$BIN/examples/bench-generation"
fi

gen_mesh() { python3 scripts/gen-mesh.py "$@"; } # file services endpoints

run() { # services endpoints-per-service rounds
  mkdir -p "$WORK/mesh"; rm -f "$WORK/mesh/"*
  gen_mesh "$WORK/mesh/mesh.yaml" "$1" "$2"
  PILOT_DEBOUNCE_AFTER=100ms "$BIN/istiod-core" serve --config-dir "$WORK/mesh" --grpc-addr 127.0.0.1:15710 \
    >"$WORK/istiod.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 500); do bash -c 'exec 3<>/dev/tcp/127.0.0.1/15710' 2>/dev/null && break; sleep 0.01; done
  "$BIN/examples/xds-load" 127.0.0.1:15710 "$CLIENTS" "$WORK/mesh/mesh.yaml" "$3" 100 "$SERVER"
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""
}

if part convergence; then
  echo
  echo "## convergence: 50 services x 10 endpoints, $CLIENTS sidecars, $ROUNDS rounds"
  run 50 10 "$ROUNDS"
fi
if part memory; then
  echo
  echo "## memory: 1000 services x 10 endpoints, $CLIENTS sidecars"
  run 1000 10 2
fi
