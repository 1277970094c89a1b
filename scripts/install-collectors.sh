#!/usr/bin/env bash
# Installs the trace collector the observability tests send spans to: Jaeger v2 (`cmd/jaeger`
# of github.com/jaegertracing/jaeger v1.76.0, the v1.76.0/v2.13.0 release), built from the Go
# module proxy through our scratch module tests/collectors (go.mod + go.sum pin every module)
# into $COLLECTORS_HOME/bin (default /opt/collectors-test/jaeger-v1.76.0). With no flags it
# serves its query API and UI on 16686, OTLP on 4317 (gRPC) and 4318 (HTTP) and Zipkin on 9411.
# Idempotent: a stamp names what was built; nothing is rebuilt while it matches.
#   scripts/install-collectors.sh          install unless the stamp matches
#   scripts/install-collectors.sh --print  print the directory and exit
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULE="$ROOT/tests/collectors"
JAEGER_VERSION="v1.76.0"
COLLECTORS_HOME="${COLLECTORS_HOME:-/opt/collectors-test/jaeger-${JAEGER_VERSION}}"
STAMP="$COLLECTORS_HOME/.stamp"

say() { echo "install-collectors: $*"; }
if [ "${1:-}" = --print ]; then echo "$COLLECTORS_HOME"; exit 0; fi

want() { echo "jaeger@${JAEGER_VERSION} go.sum=$(sha256sum "$MODULE/go.sum" | cut -c1-16)"; }
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(want)" ] && [ -x "$COLLECTORS_HOME/bin/jaeger" ]; then
  say "Jaeger ${JAEGER_VERSION}: present in $COLLECTORS_HOME"
  exit 0
fi
command -v go >/dev/null || { echo "install-collectors: go is not installed (the Go toolchain builds Jaeger)" >&2; exit 1; }

mkdir -p "$COLLECTORS_HOME/bin"
say "building jaeger ${JAEGER_VERSION} from the Go module proxy into $COLLECTORS_HOME/bin: minutes the first time"
start=$SECONDS
(cd "$MODULE" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" \
  -o "$COLLECTORS_HOME/bin/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger)
say "jaeger built in $((SECONDS - start)) s"
"$COLLECTORS_HOME/bin/jaeger" --help >/dev/null \
  || { echo "install-collectors: $COLLECTORS_HOME/bin/jaeger does not run" >&2; exit 1; }
want > "$STAMP"
say "Jaeger ${JAEGER_VERSION}: installed in $COLLECTORS_HOME"
