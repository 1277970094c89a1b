#!/usr/bin/env bash
# Generation side by side (BENCHMARKS.md "istiod-core"): Istio's own `go test -bench` of
# pilot/pkg/xds (Route, Cluster, Listener and Endpoint generation, InitPushContext) at the
# release-1.31 build the tests use, and our examples/bench-generation on the same inputs, both on
# one core (taskset, GOMAXPROCS=1), run interleaved ROUNDS times; prints a Markdown table per case
# and generator with min / median / max of each side and the ratio of the medians.
#
# Istio's side is its test binary, built once through our scratch module tests/istio-bench
# (go.mod/go.sum pin istio.io/istio and its test dependencies) into $ISTIO_BENCH_HOME with the
# benchmark inputs it reads (testdata/benchmarks, from the module) and our renderer
# (tests/istio-bench/render: executes one of those templates as Istio's benchmark does).
# Idempotent: a stamp names what was built; nothing is rebuilt while it matches.
# Our side reads the same rendered documents (`bench-generation NAME=FILE`), plus the one
# extension provider Istio's benchmark adds to its mesh config (envoy-json).
#
# Usage: scripts/bench-generation-istio.sh [rounds]   (default 5)
#   BIN=/path         a prebuilt bench-generation (the file, or a directory holding it): no cargo
#   CASES="..."       Istio's cases to compare (default: http tcp virtualservice
#                     authorizationpolicy telemetry-api); EDS=0 leaves out the endpoint grid
#   BENCHTIME=1s      Go's -test.benchtime per benchmark
#   CPU=0             the core both sides are pinned to
#   BENCH_LOCK=FILE   a file to flock(1) around each build and each benchmark run (machines
#                     whose cores are shared with other measurements)
#   OUT=DIR           where the raw outputs, inputs and the table go (default: a new /tmp dir, kept)
#   --install         only install Istio's test binary (and exit)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULE="$ROOT/tests/istio-bench"
ISTIO_MODULE_VERSION="v0.0.0-20260827124520-eed52ebb66ad"
ISTIO_BUILD_VERSION="1.31-eed52ebb66ad"
ISTIO_BENCH_HOME="${ISTIO_BENCH_HOME:-/opt/istio-oracle/${ISTIO_BUILD_VERSION}/bench}"
STAMP="$ISTIO_BENCH_HOME/.stamp"
CASES="${CASES:-http tcp virtualservice authorizationpolicy telemetry-api}"
EDS="${EDS:-1}"
BENCHTIME="${BENCHTIME:-1s}"
CPU="${CPU:-0}"
ROUNDS=5

say() { echo "bench-generation-istio: $*" >&2; }
die() { echo "bench-generation-istio: $*" >&2; exit 1; }
locked() { # command...: under BENCH_LOCK when set
  if [ -n "${BENCH_LOCK:-}" ]; then flock "$BENCH_LOCK" "$@"; else "$@"; fi
}
one_core() { locked env GOMAXPROCS=1 taskset -c "$CPU" "$@"; }

INSTALL_ONLY=""
case "${1:-}" in
  --install) INSTALL_ONLY=1 ;;
  "") ;;
  *) [[ "$1" =~ ^[1-9][0-9]*$ ]] || die "rounds must be a positive number, got '$1'"; ROUNDS="$1" ;;
esac

# --- Istio's test binary --------------------------------------------------------------------
want() {
  echo "istio.io/istio@${ISTIO_MODULE_VERSION} pilot/pkg/xds.test go.sum=$(sha256sum "$MODULE/go.sum" | cut -c1-16)" \
    "render=$(sha256sum "$MODULE/render/main.go" | cut -c1-16)"
}
installed() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(want)" ] && [ -x "$ISTIO_BENCH_HOME/xds.test" ] \
    && [ -x "$ISTIO_BENCH_HOME/render" ] && [ -f "$ISTIO_BENCH_HOME/testdata/benchmarks/http.yaml" ]
}
install_istio_bench() {
  if installed; then
    say "Istio ${ISTIO_BUILD_VERSION} benchmark binary: present in $ISTIO_BENCH_HOME"
    return
  fi
  if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then PATH="$PATH:/usr/local/go/bin"; fi
  command -v go >/dev/null || die "go is not installed (it builds Istio's test binary)"
  say "building Istio ${ISTIO_BUILD_VERSION}'s pilot/pkg/xds test binary into $ISTIO_BENCH_HOME: minutes the first time"
  local start=$SECONDS mod
  mkdir -p "$ISTIO_BENCH_HOME"
  rm -f "$STAMP"
  # GOFLAGS from the caller's environment do not apply; go.sum must already hold every module.
  (cd "$MODULE" && locked env GOFLAGS="-mod=readonly -buildvcs=false" go test -c -trimpath \
    -o "$ISTIO_BENCH_HOME/xds.test" istio.io/istio/pilot/pkg/xds)
  (cd "$MODULE" && locked env GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath \
    -o "$ISTIO_BENCH_HOME/render" ./render)
  # The benchmark reads its inputs from ./testdata/benchmarks: a copy of the module's, beside it.
  mod="$(cd "$MODULE" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' istio.io/istio)"
  [ -d "$mod/pilot/pkg/xds/testdata/benchmarks" ] || die "no testdata/benchmarks in $mod"
  rm -rf "$ISTIO_BENCH_HOME/testdata"
  mkdir -p "$ISTIO_BENCH_HOME/testdata"
  cp -r "$mod/pilot/pkg/xds/testdata/benchmarks" "$ISTIO_BENCH_HOME/testdata/"
  chmod -R u+w,a+rX "$ISTIO_BENCH_HOME/testdata"
  local listed
  listed="$("$ISTIO_BENCH_HOME/xds.test" -test.list '^BenchmarkRouteGeneration$' 2>/dev/null)"
  [[ "$listed" == *BenchmarkRouteGeneration* ]] \
    || die "$ISTIO_BENCH_HOME/xds.test does not list BenchmarkRouteGeneration"
  want > "$STAMP"
  say "built in $((SECONDS - start)) s"
}
install_istio_bench
[ -n "$INSTALL_ONLY" ] && exit 0

# --- our bench-generation -------------------------------------------------------------------
if [ -n "${BIN:-}" ]; then
  OURS="$BIN"
  [ -d "$OURS" ] && OURS="$OURS/bench-generation"
  [ -x "$OURS" ] || die "BIN=$BIN: no bench-generation there"
else
  (cd "$ROOT" && locked cargo build --release --quiet -p istiod-core --example bench-generation)
  OURS="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/bench-generation"
fi
command -v python3 >/dev/null || die "python3 is needed for the table"
command -v taskset >/dev/null || die "taskset (util-linux) is needed to pin both sides to one core"

OUT="${OUT:-$(mktemp -d /tmp/bench-generation-istio.XXXXXX)}"
mkdir -p "$OUT/inputs" "$OUT/raw"
say "raw outputs in $OUT"

# A bench-generation that reads cases from files prints B/op; an older one only has its
# built-in cases (http, tcp and virtualservice, close to Istio's inputs but not the same).
FILE_MODE=""
header="$("$OURS" no-such-case)" || die "$OURS does not run"
if [[ "$header" == *"B/op"* ]]; then FILE_MODE=1; fi

ours_args=()
for c in $CASES; do
  [ -f "$ISTIO_BENCH_HOME/testdata/benchmarks/$c.yaml" ] || die "Istio has no benchmark input '$c'"
  # Services: 100, as Istio's testCases give these cases.
  {
    "$ISTIO_BENCH_HOME/render" "$ISTIO_BENCH_HOME/testdata/benchmarks/$c.yaml" 100
    printf '\n---\n# Istio'"'"'s benchmark adds this provider to its mesh config (setupTest)\n'
    printf 'kind: MeshConfig\nmetadata: {name: benchmark}\nspec:\n  extensionProviders:\n'
    printf '  - name: envoy-json\n    envoyFileAccessLog: {path: /dev/stdout, logFormat: {labels: {}}}\n'
  } > "$OUT/inputs/$c.yaml"
  if [ -n "$FILE_MODE" ]; then
    ours_args+=("$c=$OUT/inputs/$c.yaml")
  elif [[ " http tcp virtualservice " == *" $c "* ]]; then
    ours_args+=("$c")
  fi
done
[ -n "$FILE_MODE" ] || say "$OURS reads no case files: its built-in http/tcp/virtualservice stand in (not Istio's exact inputs)"
[ "$EDS" = 1 ] && ours_args+=(eds)

cases_re="$(echo "$CASES" | tr -s ' ' '|')"
gen_re="^Benchmark(RouteGeneration|ClusterGeneration|ListenerGeneration|InitPushContext)\$/^(${cases_re})\$"

run_istio() { # round
  (cd "$ISTIO_BENCH_HOME" && one_core ./xds.test -test.run '^$' -test.bench "$gen_re" -test.benchmem \
    -test.cpu 1 -test.benchtime "$BENCHTIME") > "$OUT/raw/istio.$1.txt" 2>&1
  if [ "$EDS" = 1 ]; then
    (cd "$ISTIO_BENCH_HOME" && one_core ./xds.test -test.run '^$' -test.bench '^BenchmarkEndpointGeneration$' \
      -test.benchmem -test.cpu 1 -test.benchtime "$BENCHTIME") >> "$OUT/raw/istio.$1.txt" 2>&1
  fi
  grep -q '^PASS' "$OUT/raw/istio.$1.txt" || die "Istio's benchmark failed (round $1): $OUT/raw/istio.$1.txt"
}
run_ours() { # round
  one_core "$OURS" "${ours_args[@]}" > "$OUT/raw/ours.$1.txt" 2>&1 \
    || die "bench-generation failed (round $1): $OUT/raw/ours.$1.txt"
}

for r in $(seq 1 "$ROUNDS"); do
  say "round $r/$ROUNDS"
  # Interleaved, the side that goes first alternating.
  if (( r % 2 )); then run_istio "$r"; run_ours "$r"; else run_ours "$r"; run_istio "$r"; fi
done

python3 - "$OUT" "$ROUNDS" "$CASES" "${FILE_MODE:-0}" <<'PY' | tee "$OUT/table.md"
import re, statistics, sys
out, rounds, cases, file_mode = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4] == "1"

GEN = {"InitPushContext": "PushContext build", "ClusterGeneration": "CDS",
       "ListenerGeneration": "LDS", "RouteGeneration": "RDS", "EndpointGeneration": "EDS"}
ORDER = ["PushContext build", "CDS", "LDS", "RDS", "EDS"]
istio, ours = {}, {}  # (case, generator) -> list of dicts, one per round

def add(table, key, row):
    table.setdefault(key, []).append(row)

for r in range(1, rounds + 1):
    for line in open(f"{out}/raw/istio.{r}.txt"):
        m = re.match(r"^Benchmark(\w+)/(\S+?)(?:-\d+)?\s+\d+\s+(.*)$", line)
        if not m or m.group(1) not in GEN:
            continue
        vals = dict((u, float(v)) for v, u in re.findall(r"([\d.]+) (\S+)", m.group(3)))
        case = m.group(2)
        if m.group(1) == "EndpointGeneration":
            case = f"EDS {case}"
        add(istio, (case, GEN[m.group(1)]), {
            "ns": vals["ns/op"], "kb": vals.get("kb/msg"), "res": vals.get("resources/msg"),
            "bytes": vals.get("B/op"), "allocs": vals.get("allocs/op")})
    header = None
    for line in open(f"{out}/raw/ours.{r}.txt"):
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        row = dict(zip(header, cells))
        gen = row["generator"]
        if gen not in ORDER:
            continue
        def ns(s):
            v, unit = s.split()
            return float(v) * {"µs": 1e3, "ms": 1e6, "s": 1e9}[unit]
        num = lambda k: None if row.get(k, "-") in ("-", "", None) else float(row[k])
        add(ours, (row["case"], gen), {
            # Go's ns/op is a mean over b.N runs: ours too when the bench gives it.
            "ns": ns(row.get("time/op (mean)") or row["time/op (median)"]),
            "kb": None if num("kB/msg") is None else num("kB/msg") * 1.024,  # KiB -> kB
            "res": num("resources/msg"), "bytes": num("B/op"), "allocs": num("allocs/op")})

def t(ns):
    return f"{ns / 1e6:.2f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} µs" if ns >= 1e3 else f"{ns:.0f} ns"

def spread(rows):
    v = sorted(x["ns"] for x in rows)
    return statistics.median(v), f"{t(v[0])} / **{t(statistics.median(v))}** / {t(v[-1])}"

def size(rows):
    x = rows[0]
    if x["kb"] is None:
        return "-"
    return f"{x['kb']:.1f} kB, {x['res']:.0f}"

def alloc(rows):
    x = rows[0]
    if x["bytes"] is None:
        return "-"
    return f"{x['bytes'] / 1e3:.0f} kB, {x['allocs']:.0f}"

# Istio's benchmarks pick generators per case (no RDS for tcp, only LDS for authorizationpolicy):
# the rows are Istio's.
keys = [(c, g) for c in cases for g in ORDER if (c, g) in istio]
keys += sorted(k for k in istio if k[0].startswith("EDS "))
print(f"Istio release-1.31 (eed52ebb66ad) `go test -bench` vs our bench-generation, one core, "
      f"{rounds} interleaved rounds; time/op min / **median** / max over the rounds "
      f"(Istio: ns/op, a mean over b.N; ours: {'mean' if file_mode else 'median'} of its timed runs). "
      f"kB/msg in 1000 bytes; allocations per op.")
print()
print("| case | generator | Istio time/op | ours time/op | Istio / ours | Istio kB/msg, resources | "
      "ours kB/msg, resources | Istio B/op, allocs/op | ours B/op, allocs/op |")
print("|---|---|---|---|---|---|---|---|---|")
for case, gen in keys:
    i, o = istio.get((case, gen)), ours.get((case, gen))
    im, its = spread(i) if i else (None, "-")
    om, ots = spread(o) if o else (None, "-")
    ratio = f"{im / om:.1f}" if im and om else "-"
    if i and o and i[0]["res"] is not None and o[0]["res"] is not None and i[0]["res"] != o[0]["res"]:
        ratio += " †"
    if case.startswith("EDS ") and i and (i[0]["res"] or 0) == 0:
        ratio = "n/a (Istio: 0 resources)"
    print(f"| {case} | {gen} | {its} | {ots} | {ratio} | {size(i) if i else '-'} | "
          f"{size(o) if o else '-'} | {alloc(i) if i else '-'} | {alloc(o) if o else '-'} |")
print()
print("† the two sides generate a different number of resources for this input (see resources/msg).")
PY
say "table: $OUT/table.md"
