#!/usr/bin/env bash
# Installs a Kubernetes control plane for tests, without kubelet or containers: kube-apiserver,
# kube-controller-manager and kubectl built from k8s.io/kubernetes (pinned by tests/kube/go.mod
# and go.sum) into $KUBE_HOME/bin (default /opt/kube-test/VERSION), and Debian's etcd (package etcd-server),
# linked there as etcd. Idempotent: a stamp names what was built (the version and the go.sum
# hash); nothing is rebuilt while it matches.
#   scripts/install-kube.sh          install unless the stamp matches
#   scripts/install-kube.sh --print  print the directory and exit
#
# How to run them: see scripts/record-istiod.sh (etcd, kube-apiserver and istiod on loopback).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULE="$ROOT/tests/kube"
KUBE_VERSION="v1.36.3"
KUBE_MINOR="36"
KUBE_HOME="${KUBE_HOME:-/opt/kube-test/${KUBE_VERSION}}"
CMDS=(kube-apiserver kube-controller-manager kubectl)
STAMP="$KUBE_HOME/.stamp"

say() { echo "install-kube: $*"; }
if [ "${1:-}" = --print ]; then echo "$KUBE_HOME"; exit 0; fi

want() {
  echo "k8s.io/kubernetes@${KUBE_VERSION} ${CMDS[*]} go.sum=$(sha256sum "$MODULE/go.sum" | cut -c1-16)"
}
present() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(want)" ] || return 1
  for c in "${CMDS[@]}" etcd; do [ -x "$KUBE_HOME/bin/$c" ] || return 1; done
}

# etcd: Debian's etcd-server (3.4) serves this kube-apiserver; installed first, it is cheap.
if ! command -v etcd >/dev/null 2>&1; then
  command -v apt-get >/dev/null || { echo "install-kube: etcd is missing and apt-get is not here to install etcd-server" >&2; exit 1; }
  say "installing etcd (Debian etcd-server)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server >/dev/null \
    || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server >/dev/null; }
fi

if present; then
  say "Kubernetes ${KUBE_VERSION}: present in $KUBE_HOME"
  exit 0
fi
command -v go >/dev/null || { echo "install-kube: go is not installed (the Go toolchain builds kube-apiserver)" >&2; exit 1; }

mkdir -p "$KUBE_HOME/bin"
ln -sf "$(command -v etcd)" "$KUBE_HOME/bin/etcd"
say "building ${CMDS[*]} ${KUBE_VERSION} from the Go module proxy into $KUBE_HOME/bin: minutes the first time"
# Without the version in ldflags the binaries report v0.0.0-master+$Format:%H$, which clients
# (istiod's, kubectl) that parse the server version reject.
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${KUBE_VERSION}"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${KUBE_MINOR}"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
for c in "${CMDS[@]}"; do
  start=$SECONDS
  # One go build at a time: each already uses every core. GOFLAGS from the caller (-mod=vendor
  # and the like) do not apply to this module; go.sum must already hold every module.
  (cd "$MODULE" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "$ldflags" \
    -o "$KUBE_HOME/bin/$c" "k8s.io/kubernetes/cmd/$c")
  say "$c built in $((SECONDS - start)) s"
done
[ "$("$KUBE_HOME/bin/kube-apiserver" --version)" = "Kubernetes ${KUBE_VERSION}" ] \
  || { echo "install-kube: $KUBE_HOME/bin/kube-apiserver does not report ${KUBE_VERSION}" >&2; exit 1; }
want > "$STAMP"
say "Kubernetes ${KUBE_VERSION}: installed in $KUBE_HOME"
