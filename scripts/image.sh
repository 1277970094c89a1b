#!/usr/bin/env bash
# Builds the container images without pulling any base image (no registry is needed):
#   localhost/istio-rs/proxyv2:TAG  pilot-agent (ENTRYPOINT), istio-iptables, Envoy, iptables
#                                   (legacy and nft), ip6tables, nft, iproute2; Istio's paths and the
#                                   istio-proxy user 1337 (Dockerfile at the top of the repo)
#   localhost/istio-rs/istiod:TAG   istiod-core (images/istiod/Dockerfile)
# Each root filesystem is made from Debian packages with `mmdebstrap --variant=extract` (only the
# packages in images/NAME/packages and their dependencies, no maintainer scripts, no shell), then
# pruned, completed from images/ (users, symlinks, directories) and packed as a tar with sorted
# names, numeric owners and every mtime clamped to the last commit's time; `podman build` puts it
# into a FROM-scratch image with that timestamp. Two runs over the same Debian packages give the
# same tar (the script prints its sha256).
# Usage: ./scripts/image.sh [--debug] [--tag TAG] [proxyv2|istiod|all]   (root; default: release, latest, all)
#   --debug packs the debug binaries the test suite built (target/debug), without building.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=release; TAG=latest; WHICH=all
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) PROFILE=debug ;;
    --tag) TAG="${2:?--tag needs a value}"; shift ;;
    proxyv2|istiod|all) WHICH="$1" ;;
    *) echo "image.sh: unknown argument '$1' (expected --debug, --tag TAG, proxyv2, istiod or all)" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "image.sh: must run as root (owners in the root filesystem, podman)" >&2; exit 1; }
for tool in mmdebstrap podman runc; do
  command -v "$tool" >/dev/null || { echo "image.sh: $tool missing: run ./scripts/setup.sh" >&2; exit 1; }
done
ENVOY=/usr/local/bin/envoy
[ -x "$ENVOY" ] || { echo "image.sh: $ENVOY missing: run ./scripts/setup.sh" >&2; exit 1; }

SUITE=bookworm
EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
export SOURCE_DATE_EPOCH="$EPOCH"
OUT="$PWD/target/images"
if [ "$PROFILE" = release ]; then
  cargo build --release --quiet -p pilot-agent --bin pilot-agent -p istio-init --bin istio-iptables \
    -p istiod-core --bin istiod-core -p istio-module --lib
else
  # The test suite's binaries as `cargo build --workspace --bins --tests` made them: building
  # only these packages here would resolve features differently and replace them.
  for b in pilot-agent istio-iptables istiod-core libistio_module.so; do
    [ -x "target/debug/$b" ] || { echo "${0##*/}: target/debug/$b missing: run cargo build --workspace --bins --tests --lib" >&2; exit 1; }
  done
fi
BIN="$PWD/target/$PROFILE"
# Both images carry the sha256 of the binaries and the proxy module (label istio-rs.binaries), so a test can
# tell an image built from other binaries than its own.
BINARIES_SHA="$(cat "$BIN/pilot-agent" "$BIN/istio-iptables" "$BIN/istiod-core" "$BIN/libistio_module.so" | sha256sum | cut -d' ' -f1)"

# A root filesystem from the Debian packages listed in images/$1/packages, without what a
# container never runs (documentation, locales, iconv modules, debconf, package databases).
debian_rootfs() { # name -> $OUT/name/rootfs
  local name="$1" dir="$OUT/$1/rootfs" pkgs
  pkgs="$(grep -v '^#' "images/$name/packages" | tr -s ' \n' ',' | sed 's/^,//; s/,$//')"
  rm -rf "$dir"; mkdir -p "$OUT/$name"
  mmdebstrap --quiet --variant=extract --include="$pkgs" "$SUITE" "$dir" >/dev/null
  rm -rf "$dir"/usr/share/{doc,man,info,locale,lintian,debconf,bug,bash-completion,pkgconfig} \
    "$dir"/usr/lib/x86_64-linux-gnu/gconv "$dir"/usr/include "$dir"/var/cache/* "$dir"/var/lib/* \
    "$dir"/var/log/* "$dir"/usr/bin/debconf* "$dir"/usr/sbin/dpkg-* "$dir"/etc/apt "$dir"/etc/dpkg
  # Users and name lookup: root and istio-proxy (1337), files only.
  install -m 0644 "images/common/passwd" "$dir/etc/passwd"
  install -m 0644 "images/common/group" "$dir/etc/group"
  install -m 0644 "images/common/nsswitch.conf" "$dir/etc/nsswitch.conf"
  install -d -m 1777 "$dir/tmp"
  ln -sfn /run "$dir/var/run"
  install -d -m 0755 "$dir/run" "$dir/usr/local/bin"
}

# Packs a root filesystem reproducibly; prints its size and sha256.
pack() { # name
  local dir="$OUT/$1/rootfs"
  find "$dir" -newermt "@$EPOCH" -exec touch -h -d "@$EPOCH" {} +
  tar --sort=name --numeric-owner --mtime="@$EPOCH" --clamp-mtime \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$dir" -cf "$OUT/$1/rootfs.tar" .
  echo "image.sh: $1 root filesystem $(du -sh --apparent-size "$dir" | cut -f1), tar sha256 $(sha256sum "$OUT/$1/rootfs.tar" | cut -c1-16)"
}

build() { # name dockerfile
  local ref="localhost/istio-rs/$1:$TAG" old new
  old="$(podman image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)"
  podman --runtime runc build --quiet --timestamp "$EPOCH" --label "istio-rs.binaries=$BINARIES_SHA" \
    -f "$2" -t "$ref" "$OUT" >/dev/null
  new="$(podman image inspect --format '{{.Id}}' "$ref")"
  # The image this tag named before is removed (unless a container uses it): rebuilds do not pile up.
  if [ -n "$old" ] && [ "$old" != "$new" ]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
  echo "image.sh: $ref $(podman image inspect --format '{{.Size}}' "$ref" | awk '{printf "%.1f MB", $1/1e6}')"
}

if [ "$WHICH" = all ] || [ "$WHICH" = proxyv2 ]; then
  debian_rootfs proxyv2
  R="$OUT/proxyv2/rootfs"
  install -m 0755 "$BIN/pilot-agent" "$BIN/istio-iptables" "$R/usr/local/bin/"
  install -m 0755 "$ENVOY" "$R/usr/local/bin/envoy"
  # The proxy module (Istio's extensions), where pilot-agent looks for it: ../lib/istio.
  install -d -m 0755 "$R/usr/local/lib/istio"
  install -m 0755 "$BIN/libistio_module.so" "$R/usr/local/lib/istio/"
  # iptables and ip6tables name the nft backend, as Debian's alternatives do by default; the
  # -legacy and -nft names stay for istio-iptables' backend detection.
  for fam in iptables ip6tables; do
    for suffix in "" -save -restore; do ln -sfn "$fam-nft$suffix" "$R/usr/sbin/$fam$suffix"; done
  done
  # Istio's paths: /etc/istio/proxy and /var/lib/istio/data writable by the proxy (emptyDirs in a
  # pod; a read-only root filesystem needs them mounted), mount points for the pod's files.
  install -d -m 0755 -o 1337 -g 1337 "$R/etc/istio/proxy" "$R/var/lib/istio/data" "$R/var/lib/istio/envoy" \
    "$R/etc/certs"
  install -d -m 0755 "$R/etc/istio/pod" "$R/etc/istio/config" "$R/run/secrets/istio" \
    "$R/run/secrets/tokens" "$R/run/secrets/workload-spiffe-uds" "$R/run/secrets/credential-uds" \
    "$R/run/secrets/workload-spiffe-credentials"
  pack proxyv2
  build proxyv2 Dockerfile
fi
if [ "$WHICH" = all ] || [ "$WHICH" = istiod ]; then
  debian_rootfs istiod
  R="$OUT/istiod/rootfs"
  install -m 0755 "$BIN/istiod-core" "$R/usr/local/bin/"
  install -d -m 0755 -o 1337 -g 1337 "$R/var/lib/istio" "$R/etc/cacerts"
  pack istiod
  build istiod images/istiod/Dockerfile
fi
