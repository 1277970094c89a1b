#!/usr/bin/env bash
# Installs Istio's own pilot-agent, pilot-discovery and istioctl from the Go module proxy, pinned,
# into $ISTIO_HOME/bin (default /opt/istio-oracle/VERSION), with the Istio envoy bootstrap
# template their pilot-agent reads and the samples the Kubernetes tests apply (samples/). Idempotent: a stamp names what was built; nothing is rebuilt
# while it matches. The tests find the binaries there (tests/src/istio.rs) and fail without them.
#   scripts/install-istio.sh          install unless the stamp matches
#   scripts/install-istio.sh --print  print the directory and exit
set -euo pipefail

# The release-1.31 branch build (VERSION 1.31): istio.io/istio has no tag this proxy serves whole.
ISTIO_MODULE_VERSION="v0.0.0-20260827124520-eed52ebb66ad"
ISTIO_BUILD_VERSION="1.31-eed52ebb66ad"
ISTIO_HOME="${ISTIO_HOME:-/opt/istio-oracle/${ISTIO_BUILD_VERSION}}"
PKGS=(pilot/cmd/pilot-agent pilot/cmd/pilot-discovery istioctl/cmd/istioctl)
STAMP="$ISTIO_HOME/.stamp"
WANT="istio.io/istio@${ISTIO_MODULE_VERSION} buildVersion=${ISTIO_BUILD_VERSION} ${PKGS[*]}"

say() { echo "install-istio: $*"; }
if [ "${1:-}" = --print ]; then echo "$ISTIO_HOME"; exit 0; fi

# What the module gives besides the binaries: pilot-agent reads its Envoy bootstrap template from
# ./var/lib/istio/envoy/envoy_bootstrap_tmpl.json (Istio's proxy image puts this file there), and
# the Kubernetes tests apply Istio's samples verbatim (Bookinfo, its networking and Gateway API
# samples, curl, tcp-echo, the multicluster samples of the VM guide's east-west gateway).
files_present() {
  [ -f "$ISTIO_HOME/envoy_bootstrap_tmpl.json" ] && [ -f "$ISTIO_HOME/samples/bookinfo/platform/kube/bookinfo.yaml" ] \
    && [ -f "$ISTIO_HOME/samples/curl/curl.yaml" ] && [ -f "$ISTIO_HOME/samples/bookinfo/gateway-api/bookinfo-gateway.yaml" ] \
    && [ -f "$ISTIO_HOME/samples/tcp-echo/tcp-echo.yaml" ] \
    && [ -f "$ISTIO_HOME/samples/multicluster/gen-eastwest-gateway.sh" ]
}
copy_files() {
  local mod
  mod="$(GOFLAGS= go list -m -f "{{.Dir}}" "istio.io/istio@${ISTIO_MODULE_VERSION}")"
  install -m 0644 "$mod/tools/packaging/common/envoy_bootstrap.json" "$ISTIO_HOME/envoy_bootstrap_tmpl.json"
  rm -rf "$ISTIO_HOME/samples"
  mkdir -p "$ISTIO_HOME/samples/bookinfo/platform" "$ISTIO_HOME/samples/curl" "$ISTIO_HOME/samples/tcp-echo"
  cp -r "$mod/samples/bookinfo/platform/kube" "$ISTIO_HOME/samples/bookinfo/platform/kube"
  cp -r "$mod/samples/bookinfo/networking" "$ISTIO_HOME/samples/bookinfo/networking"
  cp -r "$mod/samples/bookinfo/gateway-api" "$ISTIO_HOME/samples/bookinfo/gateway-api"
  cp "$mod/samples/curl/curl.yaml" "$ISTIO_HOME/samples/curl/curl.yaml"
  cp "$mod/samples/tcp-echo/"*.yaml "$ISTIO_HOME/samples/tcp-echo/"
  cp -r "$mod/samples/multicluster" "$ISTIO_HOME/samples/multicluster"
  chmod -R u+w,a+rX "$ISTIO_HOME/samples"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
  && [ -x "$ISTIO_HOME/bin/pilot-agent" ] && [ -x "$ISTIO_HOME/bin/pilot-discovery" ] \
  && [ -x "$ISTIO_HOME/bin/istioctl" ]; then
  if ! files_present; then
    command -v go >/dev/null || { echo "install-istio: go is not installed (it fetches Istio's module for its samples)" >&2; exit 1; }
    GOFLAGS= go mod download "istio.io/istio@${ISTIO_MODULE_VERSION}"
    copy_files
  fi
  say "Istio ${ISTIO_BUILD_VERSION}: present in $ISTIO_HOME"
  exit 0
fi
command -v go >/dev/null || { echo "install-istio: go is not installed (the Go toolchain builds Istio's binaries)" >&2; exit 1; }

say "building Istio ${ISTIO_BUILD_VERSION} (${PKGS[*]}) from the Go module proxy into $ISTIO_HOME/bin: minutes the first time"
mkdir -p "$ISTIO_HOME/bin"
start=$SECONDS
args=()
for p in "${PKGS[@]}"; do args+=("istio.io/istio/${p}@${ISTIO_MODULE_VERSION}"); done
# GOFLAGS from the caller's environment (-mod=vendor and the like) do not apply to go install pkg@v.
GOFLAGS= GOBIN="$ISTIO_HOME/bin" go install -trimpath \
  -ldflags "-s -w -X istio.io/istio/pkg/version.buildVersion=${ISTIO_BUILD_VERSION}" "${args[@]}"
copy_files
[[ "$("$ISTIO_HOME/bin/pilot-agent" version --short 2>/dev/null)" == *"$ISTIO_BUILD_VERSION"* ]] \
  || { echo "install-istio: $ISTIO_HOME/bin/pilot-agent does not report ${ISTIO_BUILD_VERSION}" >&2; exit 1; }
echo "$WANT" > "$STAMP"
say "built in $((SECONDS - start)) s"
