#!/usr/bin/env bash
# Workload-certificate benchmarks (BENCHMARKS.md "Workload identity"):
#   first certificate ready in embedded mode (key + CSR + CA signature + checks + SDS push over
#   the unix socket), ECDSA P-256 and RSA 2048; CA signing throughput against a plain rcgen loop.
#   ./scripts/bench-identity.sh [RUNS]   (default 200)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p pilot-agent --example bench-identity
# One core, as the targets are stated per core.
exec taskset -c 0 ./target/release/examples/bench-identity "${1:-200}"
