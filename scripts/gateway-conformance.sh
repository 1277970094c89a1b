#!/usr/bin/env bash
# Runs the upstream Gateway API conformance suite (v1.6.0, unmodified) on the test cluster with
# Istio's own flags and profiles (GATEWAY-HTTP, -TLS, -GRPC, -TCP, MESH-HTTP) against each
# Gateway API controller, our data plane (gateway and sidecars) in both runs, and keeps the
# reports:
#   tests/gateway-conformance/reports/istiod.yaml       Istio's istiod as the controller
#   tests/gateway-conformance/reports/istiod-core.yaml  istiod-core as the controller (no mesh
#                                                       tests: istiod-core runs no injector)
#   *.yaml.tests                                        every test's verdict (PASS/FAIL/SKIP)
# About 4 minutes per controller with a working data plane (a failing test costs 30 s or more).
# scripts/test.sh runs a short form (tests/kube/tests/gateway_conformance.rs). Needs root and
# scripts/setup.sh --tests.
#   scripts/gateway-conformance.sh                      both controllers, every test
#   scripts/gateway-conformance.sh istiod|istiod-core   one controller
#   scripts/gateway-conformance.sh CONTROLLER REGEX     the tests REGEX selects (go test -run, e.g.
#                                                       'TestConformance/^HTTPRouteWeight$'); the
#                                                       report then goes to /tmp
set -euo pipefail
cd "$(dirname "$0")/.."
reports="$PWD/tests/gateway-conformance/reports"
mkdir -p "$reports"
export GATEWAY_CONFORMANCE_FULL=1 GATEWAY_CONFORMANCE_REPORT="$reports"
if [ -n "${1:-}" ]; then export GATEWAY_CONFORMANCE_CONTROLLER="$1"; fi
if [ -n "${2:-}" ]; then
  mkdir -p /tmp/gateway-conformance
  export GATEWAY_CONFORMANCE_RUN="$2" GATEWAY_CONFORMANCE_REPORT=/tmp/gateway-conformance
fi
cargo build --workspace --bins --tests
# One controller at a time: each run is a cluster and ~40 pods on 2 cores.
cargo nextest run -p kube-cluster --test gateway_conformance --no-capture --test-threads 1
echo "reports: $GATEWAY_CONFORMANCE_REPORT"
