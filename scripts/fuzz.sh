#!/usr/bin/env bash
# Fuzzes the parsers that take untrusted input (fuzz/fuzz_targets/*.rs) with cargo-fuzz
# (libFuzzer) on the nightly toolchain: builds every target, then runs each for
# SECONDS_PER_TARGET (default 60), one after another, and stops at the first crash, printing
# the reproducer and the command that replays it. Not part of scripts/test.sh (it takes
# minutes); run it by hand or nightly.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Environment:
#   FUZZ_RUNS_DIR     where per-target logs and summary.tsv go (default fuzz/runs)
#   FUZZ_KEEP_GOING=1 after a crash, go on with the next target (exit status 1 at the end)
#   FUZZ_RSS_MB       libFuzzer's memory limit per target (default 2048)
#   FUZZ_BUILD_LOCK   a file to flock(1) around the build (machines that share their cores)
#
# Each target fuzzes its corpus fuzz/corpus/<target> (kept between runs, not committed) starting
# from the committed seeds fuzz/seeds/<target> (python3 fuzz/seeds.py writes them). Crashes go
# to fuzz/artifacts/<target>/. Build flags: no sanitizer (the workspace forbids unsafe code, so
# AddressSanitizer would buy little for halving the speed) and debug assertions with overflow
# checks on, so an integer overflow is a crash, as it would be in a debug build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_PER_TARGET="${1:-60}"
shift || true
RUNS="${FUZZ_RUNS_DIR:-$ROOT/fuzz/runs}"
RSS_MB="${FUZZ_RSS_MB:-2048}"
FLAGS=(--sanitizer none --debug-assertions)

say() { echo "fuzz: $*"; }

case "$SECONDS_PER_TARGET" in
  '' | *[!0-9]*) echo "fuzz: SECONDS_PER_TARGET must be a whole number of seconds, not '$SECONDS_PER_TARGET'" >&2; exit 2 ;;
esac

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "fuzz: needs the nightly toolchain (rustup toolchain install nightly)" >&2
  exit 1
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  say "installing cargo-fuzz from crates.io"
  cargo install cargo-fuzz --locked
fi

cd "$ROOT/fuzz"
if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

say "building ${#targets[@]} targets"
build=(cargo +nightly fuzz build "${FLAGS[@]}")
if [ -n "${FUZZ_BUILD_LOCK:-}" ]; then
  build=(flock "$FUZZ_BUILD_LOCK" "${build[@]}")
fi
CARGO_INCREMENTAL=0 "${build[@]}"

mkdir -p "$RUNS"
summary="$RUNS/summary.tsv"
[ -f "$summary" ] || printf 'date\ttarget\tseconds\texecs\texecs_per_s\tcov\tft\tcorpus\tpeak_rss_mb\tresult\n' >"$summary"

failed=0
for t in "${targets[@]}"; do
  corpus="corpus/$t"
  mkdir -p "$corpus" "artifacts/$t"
  seeds=()
  [ -d "seeds/$t" ] && seeds=("seeds/$t")
  log="$RUNS/$t.log"
  say "$t: ${SECONDS_PER_TARGET}s, log $log"
  status=0
  cargo +nightly fuzz run "${FLAGS[@]}" "$t" "$corpus" "${seeds[@]}" -- \
    -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb="$RSS_MB" -timeout=20 \
    -print_final_stats=1 >"$log" 2>&1 || status=$?
  # The last status line (`#N DONE cov: C ft: F corp: U/S ...`) and the final stats.
  last="$(grep -E '^#[0-9]+' "$log" | tail -n1 || true)"
  stat() { grep -E "^stat::$1:" "$log" | tail -n1 | awk '{print $2}'; }
  field() { echo "$last" | grep -oE "$1: [0-9]+" | awk '{print $2}'; }
  corp="$(echo "$last" | grep -oE 'corp: [0-9]+' | awk '{print $2}')"
  result=ok
  if [ "$status" -ne 0 ]; then
    artifact="$(grep -oE "artifacts/$t/[a-z-]+-[0-9a-f]+" "$log" | tail -n1 || true)"
    result="crash ${artifact:+fuzz/$artifact}"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$t" "$SECONDS_PER_TARGET" \
    "$(stat number_of_executed_units)" "$(stat average_exec_per_sec)" "$(field cov)" "$(field ft)" \
    "${corp:-}" "$(stat peak_rss_mb)" "$result" >>"$summary"
  say "$t: $(tail -n1 "$summary" | cut -f4-)"
  if [ "$status" -ne 0 ]; then
    failed=1
    grep -E 'panicked at|^==[0-9]+== ERROR|Failing input|SUMMARY' "$log" | head -n 5 >&2 || true
    if [ -n "${artifact:-}" ]; then
      echo "fuzz: $t crashed; reproducer fuzz/$artifact" >&2
      echo "fuzz: replay: (cd fuzz && cargo +nightly fuzz run ${FLAGS[*]} $t $artifact)" >&2
    else
      echo "fuzz: $t failed (exit $status) without a reproducer; see $log" >&2
    fi
    [ "${FUZZ_KEEP_GOING:-0}" = 1 ] || exit 1
  fi
done
say "summary: $summary"
exit "$failed"
