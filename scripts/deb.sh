#!/usr/bin/env bash
# Builds the VM package target/debian/istio-sidecar_VERSION_amd64.deb with dpkg-deb, in the layout
# of Istio's istio-sidecar.deb: /usr/local/bin/{pilot-agent,istio-iptables,envoy,istio-start.sh},
# the systemd unit /lib/systemd/system/istio.service, and maintainer scripts (images/vm/) that
# create the istio-proxy user and Istio's VM directories (/var/lib/istio/envoy, /etc/certs,
# /var/run/secrets/tokens, /etc/istio/config), remove the capture rules on removal, and the
# state on purge. File times are the last commit's (SOURCE_DATE_EPOCH): same inputs, same .deb.
# Usage: ./scripts/deb.sh [--debug]   (--debug packs the debug binaries the tests built, no build)
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=release
case "${1:-}" in
  --debug) PROFILE=debug ;;
  "") ;;
  *) echo "deb.sh: unknown argument '$1' (expected --debug)" >&2; exit 2 ;;
esac
ENVOY=/usr/local/bin/envoy
[ -x "$ENVOY" ] || { echo "deb.sh: $ENVOY missing: run ./scripts/setup.sh" >&2; exit 1; }
if [ "$PROFILE" = release ]; then
  cargo build --release --quiet -p pilot-agent --bin pilot-agent -p istio-init --bin istio-iptables \
    -p istio-module --lib
else
  # The test suite's binaries as `cargo build --workspace --bins --tests` made them: building
  # only these packages here would resolve features differently and replace them.
  for b in pilot-agent istio-iptables libistio_module.so; do
    [ -x "target/debug/$b" ] || { echo "${0##*/}: target/debug/$b missing: run cargo build --workspace --bins --tests --lib" >&2; exit 1; }
  done
fi
BIN="target/$PROFILE"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
export SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
STAGE="target/debian/istio-sidecar"
rm -rf "$STAGE"; mkdir -p "$STAGE/DEBIAN" "$STAGE/usr/local/bin" "$STAGE/usr/local/lib/istio" "$STAGE/lib/systemd/system"
install -m 0755 "$BIN/pilot-agent" "$BIN/istio-iptables" "$ENVOY" images/vm/istio-start.sh "$STAGE/usr/local/bin/"
install -m 0755 "$BIN/libistio_module.so" "$STAGE/usr/local/lib/istio/"
install -m 0644 images/vm/istio.service "$STAGE/lib/systemd/system/"
sed "s/@VERSION@/$VERSION/" images/vm/control > "$STAGE/DEBIAN/control"
install -m 0755 images/vm/postinst images/vm/prerm images/vm/postrm "$STAGE/DEBIAN/"
find "$STAGE" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
DEB="target/debian/istio-sidecar_${VERSION}_amd64.deb"
# xz for a release package (smallest); gzip for the test build (fast).
Z=xz; [ "$PROFILE" = debug ] && Z=gzip
dpkg-deb --root-owner-group -Z"$Z" --build "$STAGE" "$DEB" >/dev/null
echo "deb.sh: $DEB $(du -h --apparent-size "$DEB" | cut -f1), sha256 $(sha256sum "$DEB" | cut -c1-16)"
