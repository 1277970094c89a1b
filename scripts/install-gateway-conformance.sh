#!/usr/bin/env bash
# Installs the Gateway API conformance suite the gateway tests run unmodified: the test binary of
# sigs.k8s.io/gateway-api/conformance v1.6.0 (the Gateway API version Istio release-1.31 uses;
# our scratch module tests/gateway-conformance, whose only test calls conformance.RunConformance),
# its echo backend (conformance/echo-basic, same module) and the Gateway API CRDs of
# sigs.k8s.io/gateway-api v1.6.0 (config/crd/standard and experimental, as published), and what
# the suite's echo-advanced image packages (Istio's echo server and client, `go install` of
# istio.io/istio/pkg/test/echo/cmd/{server,client} at the installed Istio version, and a
# self-signed serving certificate made here with openssl), into
# $GATEWAY_CONFORMANCE_HOME (default /opt/gateway-conformance/v1.6.0). Idempotent: a stamp names
# what was built (the version and the go.sum hash); nothing is rebuilt while it matches. The
# suite's own manifests (conformance/base, mesh and tests[/mesh]) are copied into manifests/, where
# the unit tests of istiod-core's Gateway API translation read them.
#   scripts/install-gateway-conformance.sh          install unless the stamp matches
#   scripts/install-gateway-conformance.sh --print  print the directory and exit
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULE="$ROOT/tests/gateway-conformance"
VERSION="v1.6.0"
# The Istio build scripts/install-istio.sh installs (its ISTIO_VERSION).
ISTIO_VERSION="$(sed -n 's/^ISTIO_MODULE_VERSION="\(.*\)"$/\1/p' "$ROOT/scripts/install-istio.sh")"
HOME_DIR="${GATEWAY_CONFORMANCE_HOME:-/opt/gateway-conformance/${VERSION}}"
STAMP="$HOME_DIR/.stamp"

say() { echo "install-gateway-conformance: $*"; }
if [ "${1:-}" = --print ]; then echo "$HOME_DIR"; exit 0; fi

want() { echo "sigs.k8s.io/gateway-api/conformance@${VERSION} go.sum=$(sha256sum "$MODULE/go.sum" | cut -c1-16) istio-echo@${ISTIO_VERSION} manifests"; }
present() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(want)" ] || return 1
  for f in bin/conformance.test bin/echo-basic crd/experimental crd/standard istio-echo/bin/server istio-echo/bin/client istio-echo/cert.crt manifests/base-manifests.yaml manifests/mesh-manifests.yaml manifests/tests; do [ -e "$HOME_DIR/$f" ] || return 1; done
}
if present; then
  say "Gateway API conformance ${VERSION}: present in $HOME_DIR"
  exit 0
fi
command -v go >/dev/null || { echo "install-gateway-conformance: go is not installed (the Go toolchain builds the suite)" >&2; exit 1; }

mkdir -p "$HOME_DIR/bin"
say "building the Gateway API conformance suite ${VERSION} from the Go module proxy into $HOME_DIR: about 2 min the first time"
start=$SECONDS
# One go build at a time: each already uses every core. go.sum must already hold every module.
(cd "$MODULE" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" \
  -o "$HOME_DIR/bin/echo-basic" sigs.k8s.io/gateway-api/conformance/echo-basic)
(cd "$MODULE" && GOFLAGS=-mod=readonly go test -c -trimpath -ldflags "-s -w" \
  -o "$HOME_DIR/bin/conformance.test" .)
GOBIN="$HOME_DIR/istio-echo/bin" go install -trimpath -ldflags "-s -w" \
  "istio.io/istio/pkg/test/echo/cmd/server@${ISTIO_VERSION}" "istio.io/istio/pkg/test/echo/cmd/client@${ISTIO_VERSION}"
openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=echo.gateway-conformance-mesh" \
  -addext "subjectAltName=DNS:*.gateway-conformance-mesh.svc.cluster.local,DNS:localhost" \
  -keyout "$HOME_DIR/istio-echo/cert.key" -out "$HOME_DIR/istio-echo/cert.crt" 2>/dev/null
say "built in $((SECONDS - start)) s"
# The CRDs, as the module publishes them (read from the module cache the build just filled).
api_dir="$(cd "$MODULE" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)"
[ -d "$api_dir/config/crd/experimental" ] \
  || { echo "install-gateway-conformance: $api_dir has no config/crd/experimental" >&2; exit 1; }
rm -rf "$HOME_DIR/crd" && mkdir -p "$HOME_DIR/crd"
for channel in standard experimental; do
  mkdir -p "$HOME_DIR/crd/$channel"
  cp "$api_dir/config/crd/$channel"/*.yaml "$HOME_DIR/crd/$channel/"
  rm -f "$HOME_DIR/crd/$channel/kustomization.yaml"
done
# The suite's manifests, as its tests apply them: base (the infra namespaces, backends and
# Gateways), mesh (GAMMA), and each test's own; where a mesh test's file has a gateway test's
# name, the gateway test's is kept.
conf_dir="$(cd "$MODULE" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)"
[ -f "$conf_dir/base/manifests.yaml" ] \
  || { echo "install-gateway-conformance: $conf_dir has no base/manifests.yaml" >&2; exit 1; }
rm -rf "$HOME_DIR/manifests" && mkdir -p "$HOME_DIR/manifests/tests"
cp "$conf_dir/base/manifests.yaml" "$HOME_DIR/manifests/base-manifests.yaml"
cp "$conf_dir/mesh/manifests.yaml" "$HOME_DIR/manifests/mesh-manifests.yaml"
cp "$conf_dir/tests/"*.yaml "$HOME_DIR/manifests/tests/"
for f in "$conf_dir/tests/mesh/"*.yaml; do
  [ -e "$HOME_DIR/manifests/tests/$(basename "$f")" ] || cp "$f" "$HOME_DIR/manifests/tests/"
done
cp "$conf_dir/LICENSE" "$HOME_DIR/manifests/LICENSE"
chmod -R a+rX "$HOME_DIR"
"$HOME_DIR/bin/conformance.test" -test.list 'TestConformance' | grep -qx TestConformance \
  || { echo "install-gateway-conformance: $HOME_DIR/bin/conformance.test does not list TestConformance" >&2; exit 1; }
want > "$STAMP"
say "Gateway API conformance ${VERSION}: installed in $HOME_DIR"
