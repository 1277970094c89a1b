#!/usr/bin/env bash
# Benchmarks, each reported as a ratio against a baseline measured in the same run.
#   istio-iptables apply: our whole process (backend detection + state check + one restore per
#   family) vs a bare iptables-restore/ip6tables-restore of the same payloads (the floor) vs one
#   iptables process per rule. Each run applies to a fresh network namespace with IPv4 and IPv6.
# Usage: ./scripts/bench.sh [runs]   (default 15). Root required. Prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-15}"
./scripts/setup.sh >/dev/null
cargo build --release --quiet -p istio-init
BIN="$PWD/target/release/istio-iptables"
TMP="$(mktemp -d)"
P="istbench-$$"
cleanup() {
  for ns in $(ip netns list | awk '{print $1}' | grep "^$P-" || true); do ip netns delete "$ns"; done
  rm -rf "$TMP"
}
trap cleanup EXIT

DEFAULT_ARGS=(-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" -b '*' -d 15090,15021,15020)
ports=$(seq 10001 10250 | paste -sd,)
cidrs=$(for i in $(seq 1 250); do echo "10.$((i / 250)).$((i % 250)).0/24"; done | paste -sd,)
LARGE_ARGS=(-p 15001 -z 15006 -u 1337 -m REDIRECT -i "$cidrs" -x "" -b "$ports")

new_ns() { # prints the name; called in a subshell, so names come from the clock
  local ns="$P-$(date +%s%N)"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" link add eth0 type veth peer name eth1
  ip -n "$ns" addr add 10.233.0.2/24 dev eth0
  ip -n "$ns" -6 addr add fd00:233::2/64 dev eth0 nodad
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set eth1 up
  echo "$ns"
}

now() { date +%s%N; }
median_ms() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.2f", m/1e6}'; }

split_payloads() { # $1: dry-run output -> $TMP/v4 $TMP/v6
  awk -v d="$TMP" '/^# V4/{f=d"/v4";next} /^# V6/{f=d"/v6";next} f{print > f}' "$1"
}

bench_config() { # name, args...
  local name="$1"; shift
  ip netns exec "$(new_ns)" "$BIN" "$@" -n > "$TMP/dry" 2>/dev/null
  split_payloads "$TMP/dry"
  local rules
  rules=$(grep -c '^-[AI]' "$TMP/v4" "$TMP/v6" | awk -F: '{s+=$2} END {print s}')
  : > "$TMP/ours"; : > "$TMP/bare"; : > "$TMP/perrule"
  for _ in $(seq 1 "$RUNS"); do
    ns=$(new_ns); t=$(now)
    ip netns exec "$ns" "$BIN" "$@" 2>/dev/null
    echo $(( $(now) - t )) >> "$TMP/ours"

    ns=$(new_ns); t=$(now)
    ip netns exec "$ns" sh -c "iptables-restore --noflush < $TMP/v4 && ip6tables-restore --noflush < $TMP/v6"
    echo $(( $(now) - t )) >> "$TMP/bare"

    ns=$(new_ns); t=$(now)
    for fam in v4 v6; do
      cmd=iptables; [ "$fam" = v6 ] && cmd=ip6tables
      table=""
      while read -r line; do
        case "$line" in
          "* "*) table="${line#* }" ;;
          COMMIT|"") ;;
          *) ip netns exec "$ns" $cmd -t "$table" $line ;;
        esac
      done < "$TMP/$fam"
    done
    echo $(( $(now) - t )) >> "$TMP/perrule"
  done
  local ours bare per
  ours=$(median_ms < "$TMP/ours"); bare=$(median_ms < "$TMP/bare"); per=$(median_ms < "$TMP/perrule")
  printf "| %s | %s | %s ms | %s ms | %s ms | %.2f | %.1f |\n" "$name" "$rules" "$ours" "$bare" "$per" \
    "$(echo "$ours / $bare" | bc -l)" "$(echo "$per / $ours" | bc -l)"
}

echo "istio-iptables apply, median of $RUNS runs, IPv4 + IPv6, $(iptables --version)"
echo
echo "| config | rules | istio-iptables | bare iptables-restore | one iptables per rule | ours / bare | per-rule / ours |"
echo "|---|---|---|---|---|---|---|"
bench_config "default sidecar" "${DEFAULT_ARGS[@]}"
bench_config "large (250 ports, 250 CIDRs)" "${LARGE_ARGS[@]}"
