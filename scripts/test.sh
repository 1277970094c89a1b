#!/usr/bin/env bash
# The whole check: set-up, format, lints, and every test (unit and end-to-end with real
# iptables, network namespaces and Envoy). Run as root on Debian. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh --tests
# A clean CI build gains nothing from incremental state (1.9 GB on disk): leave it out there.
if [ "${CI:-false}" = true ]; then export CARGO_INCREMENTAL=0; fi
# cargo-deny checks the dependency graph of every platform (licenses and bans of Windows-only
# crates too), so it reads every platform's manifests: it runs first, with the usual CARGO_HOME.
echo "== cargo deny (deny.toml: advisories, bans, licenses, sources)"
./scripts/deny.sh
# A clean clone is not a clean machine: a developer's CARGO_HOME holds crates a fresh one lacks
# (other platforms' crates among them), which hid a build step that needed them. In CI every
# cargo command below runs offline against a CARGO_HOME of this run that holds only this
# platform's crates, as a fresh machine's would after one fetch; anything more fails here.
if [ "${CI:-false}" = true ] || [ "${FRESH_CARGO_HOME:-false}" = true ]; then
  ./scripts/fresh-cargo-home.sh "$PWD/target/cargo-home"
  export CARGO_HOME="$PWD/target/cargo-home" CARGO_NET_OFFLINE=true
fi
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== build scripts with only a build's crates (scripts/check-demo-build.sh)"
./scripts/check-demo-build.sh target/demo-build
echo "== build (once, for all tests; --lib: the proxy module libistio_module.so)"
cargo build --workspace --bins --tests --lib
echo "== images (from the debug binaries, for the pod tests)"
./scripts/image.sh --debug --tag test
echo "== VM package (from the debug binaries, for the VM test)"
./scripts/deb.sh --debug
echo "== tests"
# Root-only tests must run in CI; the harness fails them there if they cannot.
export CI="${CI:-false}"
# The control planes the tests start regenerate every cached resource and fail on a difference.
export ISTIOD_CACHE_CHECK="${ISTIOD_CACHE_CHECK:-true}"
cargo nextest run --workspace --no-fail-fast --test-threads 2
