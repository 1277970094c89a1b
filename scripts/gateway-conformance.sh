#!/usr/bin/env bash
# Runs the upstream Gateway API conformance suite (v1.6.0, unmodified) on the test cluster with
# Istio's own flags and profiles (GATEWAY-HTTP, -TLS, -GRPC, -TCP, MESH-HTTP), Istio's istiod as
# the Gateway API controller and our data plane (gateway and sidecars), and keeps its report:
#   tests/gateway-conformance/reports/istiod.yaml        the suite's conformance report
#   tests/gateway-conformance/reports/istiod.yaml.tests  every test's verdict (PASS/FAIL/SKIP)
# About 10 minutes on 2 cores. scripts/test.sh runs a short form of it (tests/kube/tests/
# gateway_conformance.rs). Needs root and scripts/setup.sh --tests.
#   scripts/gateway-conformance.sh            the whole suite
#   scripts/gateway-conformance.sh REGEX      only the tests REGEX selects (go test -run, e.g.
#                                             'TestConformance/^HTTPRouteWeight$')
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p tests/gateway-conformance/reports
out="$PWD/tests/gateway-conformance/reports/istiod.yaml"
export GATEWAY_CONFORMANCE_FULL=1 GATEWAY_CONFORMANCE_REPORT="$out"
if [ -n "${1:-}" ]; then
  export GATEWAY_CONFORMANCE_RUN="$1" GATEWAY_CONFORMANCE_REPORT="/tmp/gateway-conformance-istiod.yaml"
fi
cargo build --workspace --bins --tests
cargo nextest run -p kube-cluster --test gateway_conformance --no-capture
echo "report: $GATEWAY_CONFORMANCE_REPORT"
