#!/usr/bin/env bash
# Benchmarks, each reported as a ratio against a baseline measured in the same run.
#   istio-iptables apply: our whole process (backend detection + state check + one restore per
#   family) vs a bare iptables-restore/ip6tables-restore of the same payloads (the floor) vs one
#   iptables process per rule. Each run applies to a fresh network namespace with IPv4 and IPv6.
#   istio-iptables side by side: ours vs Istio's own (`pilot-agent istio-iptables`, the release
#   build of scripts/install-istio.sh), interleaved (ours, Istio's, ours, Istio's...), each process
#   to a fresh network namespace, with the injector's args; per backend (as detected, forced nft,
#   forced legacy, and Istio 1.27+'s --native-nftables) and per address family (a namespace with an IPv4 address only, or IPv4 and
#   IPv6). After every run the rules are read back with iptables-save and must be the expected
#   ones, the same for both, in the same backend.
# Usage: ./scripts/bench.sh [runs]   (default 15). Root required. Prints Markdown tables.
#   BIN=DIR            take istio-iptables from DIR instead of building it (no cargo build)
#   PARTS="floor side"  (the default) picks the parts to run
set -euo pipefail
[ -n "${BIN:-}" ] && BIN="$(realpath "$BIN")"
cd "$(dirname "$0")/.."
RUNS="${1:-15}"
PARTS="${PARTS:-floor side}"
part() { [[ " $PARTS " == *" $1 "* ]]; }
./scripts/setup.sh >/dev/null
if [ -n "${BIN:-}" ]; then
  IPT="$BIN/istio-iptables"
else
  cargo build --release --quiet -p istio-init
  IPT="$PWD/target/release/istio-iptables"
fi
[ -x "$IPT" ] || { echo "bench: no istio-iptables at $IPT" >&2; exit 1; }
TMP="$(mktemp -d)"
P="istbench-$$"
cleanup() {
  for ns in $(ip netns list | awk '{print $1}' | grep "^$P-" || true); do ip netns delete "$ns"; done
  rm -rf "$TMP"
}
trap cleanup EXIT

DEFAULT_ARGS=(-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" -b '*' -d "15090,15021,15020")
ports=$(seq 10001 10250 | paste -sd,)
cidrs=$(for i in $(seq 1 250); do echo "10.$((i / 250)).$((i % 250)).0/24"; done | paste -sd,)
LARGE_ARGS=(-p 15001 -z 15006 -u 1337 -m REDIRECT -i "$cidrs" -x "" -b "$ports")

new_ns() { # [v4|dual] (default dual); prints the name; called in a subshell, so names come from the clock
  local ns
  ns="$P-$(date +%s%N)"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" link add eth0 type veth peer name eth1
  ip -n "$ns" addr add 10.233.0.2/24 dev eth0
  [ "${1:-dual}" = v4 ] || ip -n "$ns" -6 addr add fd00:233::2/64 dev eth0 nodad
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
  ip netns exec "$(new_ns)" "$IPT" "$@" -n > "$TMP/dry" 2>/dev/null
  split_payloads "$TMP/dry"
  local rules
  rules=$(grep -c '^-[AI]' "$TMP/v4" "$TMP/v6" | awk -F: '{s+=$2} END {print s}')
  : > "$TMP/ours"; : > "$TMP/bare"; : > "$TMP/perrule"
  for _ in $(seq 1 "$RUNS"); do
    ns=$(new_ns); t=$(now)
    ip netns exec "$ns" "$IPT" "$@" 2>/dev/null
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
          *) # The rule's words are iptables arguments: split on purpose.
             # shellcheck disable=SC2086
             ip netns exec "$ns" $cmd -t "$table" $line ;;
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

if part floor; then
echo "istio-iptables apply, median of $RUNS runs, IPv4 + IPv6, $(iptables --version)"
echo
echo "| config | rules | istio-iptables | bare iptables-restore | one iptables per rule | ours / bare | per-rule / ours |"
echo "|---|---|---|---|---|---|---|"
bench_config "default sidecar" "${DEFAULT_ARGS[@]}"
bench_config "large (250 ports, 250 CIDRs)" "${LARGE_ARGS[@]}"
echo
fi

if part side; then
./scripts/install-istio.sh >/dev/null
ISTIO_HOME="$(./scripts/install-istio.sh --print)"
ISTIO_AGENT="$ISTIO_HOME/bin/pilot-agent"
# The injector's istio-init args (its template, and the injected pods in reference/injected/);
# the large config is the same with 250 inbound ports (-b) and 250 CIDRs (-i), as the
# includeInboundPorts and includeOutboundIPRanges annotations would set them.
SIDE_DEFAULT=("${DEFAULT_ARGS[@]}" --log_output_level=default:info)
SIDE_LARGE=("${LARGE_ARGS[@]}" --log_output_level=default:info)

# One process, timed inside its namespace from fork to exit (ip netns exec's own set-up, which
# grows with the number of namespaces, is outside the window). Prints nanoseconds.
timed_in() { # ns, env assignment, command...
  local ns="$1" envv="$2"; shift 2
  # shellcheck disable=SC2016 # the inner bash expands them
  ip netns exec "$ns" env "$envv" bash -c '
    s=${EPOCHREALTIME/./}; "$@" >/dev/null 2>"$ERR"; rc=$?; e=${EPOCHREALTIME/./}
    [ "$rc" = 0 ] || { echo "exit $rc: $*" >&2; cat "$ERR" >&2; exit 1; }
    echo $(( (e - s) * 1000 ))' _ "$@"
}
export ERR="$TMP/err"

# The rules in a namespace, per backend, family and table, as iptables-save prints them.
rules_in() { # ns
  local b f
  for b in nft legacy; do for f in iptables ip6tables; do
    ip netns exec "$1" "$f-$b-save" 2>/dev/null | awk -v k="$f-$b" '/^\*/ {t = $1} /^-A/ {print k, t, $0}'
  done; done
}
count() { # file, "iptables-nft"... -> number of -A lines there
  awk -v k="$2" '$1 == k {n++} END {print n + 0}' "$1"
}

# Verifies one run's rules: the expected count per family in the expected backend, none in
# the other; for "auto", wherever they landed, the same for ours and Istio's (compared below).
check_rules() { # state file, backend, v4 rules, v6 rules, label
  local f="$1" be="$2" e4="$3" e6="$4" n4 n6 o4 o6 other
  if [ "$be" = auto ]; then
    n4=$(( $(count "$f" iptables-nft) + $(count "$f" iptables-legacy) ))
    n6=$(( $(count "$f" ip6tables-nft) + $(count "$f" ip6tables-legacy) ))
    o4=0; o6=0
  else
    other=legacy; [ "$be" = legacy ] && other=nft
    n4=$(count "$f" "iptables-$be"); n6=$(count "$f" "ip6tables-$be")
    o4=$(count "$f" "iptables-$other"); o6=$(count "$f" "ip6tables-$other")
  fi
  if [ "$n4" != "$e4" ] || [ "$n6" != "$e6" ] || [ "$o4" != 0 ] || [ "$o6" != 0 ]; then
    echo "bench: $5: rules v4 $n4 v6 $n6 (expected $e4 and $e6), other backend v4 $o4 v6 $o6" >&2
    exit 1
  fi
}

# min median max of a file of nanoseconds, in ms
mmm() { sort -n "$1" | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.2f / %.2f / %.2f", a[1]/1e6, m/1e6, a[NR]/1e6}'; }
med() { sort -n "$1" | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; print m}'; }

CONFIGS=(default large)
# nftables: Istio 1.27+'s --native-nftables (its inet tables through nft, no iptables rule).
BACKENDS=(auto nft legacy nftables)
FAMILIES=(v4 dual)
declare -A E4 E6 ENFT
for c in "${CONFIGS[@]}"; do
  if [ "$c" = default ]; then args=("${SIDE_DEFAULT[@]}"); else args=("${SIDE_LARGE[@]}"); fi
  for fam in "${FAMILIES[@]}"; do
    ip netns exec "$(new_ns "$fam")" env ISTIO_DUAL_STACK=true "$IPT" "${args[@]}" -n > "$TMP/dry" 2>/dev/null
    E4[$c-$fam]=$(awk '/^# V4/{f=1;next} /^# V6/{f=0} f && /^-[AI]/ {n++} END {print n + 0}' "$TMP/dry")
    E6[$c-$fam]=$(awk '/^# V6/{f=1;next} /^# V4/{f=0} f && /^-[AI]/ {n++} END {print n + 0}' "$TMP/dry")
    ip netns exec "$(new_ns "$fam")" env ISTIO_DUAL_STACK=true "$IPT" "${args[@]}" --native-nftables -n > "$TMP/dry" 2>/dev/null
    ENFT[$c-$fam]=$(grep -cE '^(add|insert) rule ' "$TMP/dry")
    for be in "${BACKENDS[@]}"; do : > "$TMP/side-ours-$c-$be-$fam"; : > "$TMP/side-istio-$c-$be-$fam"; done
  done
done

# What a run left: iptables rules, or (nftables) the ruleset without counters and no iptables rule.
state_in() { # ns, backend
  rules_in "$1"
  [ "$2" = nftables ] && ip netns exec "$1" nft list ruleset | sed -E 's/counter packets [0-9]+ bytes [0-9]+/counter/'
  return 0
}
check_state() { # state file, backend, config-family, label
  if [ "$2" != nftables ]; then check_rules "$1" "$2" "${E4[$3]}" "${E6[$3]}" "$4"; return; fi
  local n; n=$(grep -cE '(^|[[:space:]])counter([[:space:]]|$)' "$1" || true)
  if [ "$n" != "${ENFT[$3]}" ] || grep -q '^ip' "$1"; then
    echo "bench: $4: $n nftables rules (expected ${ENFT[$3]}), iptables rules: $(grep -c '^ip' "$1")" >&2
    exit 1
  fi
}

for run in $(seq 1 "$RUNS"); do
  for c in "${CONFIGS[@]}"; do
    if [ "$c" = default ]; then args=("${SIDE_DEFAULT[@]}"); else args=("${SIDE_LARGE[@]}"); fi
    for be in "${BACKENDS[@]}"; do
      force=(); [ "$be" = auto ] || force=(--force-iptables-binary "$be")
      [ "$be" = nftables ] && force=(--native-nftables)
      for fam in "${FAMILIES[@]}"; do
        cell="$c-$be-$fam"
        # In a dual-stack mesh the injector gives istio-init ISTIO_DUAL_STACK=true (Istio writes
        # no IPv6 rules without it); ours reads it too. Both get it in every cell.
        ns=$(new_ns "$fam")
        timed_in "$ns" ISTIO_DUAL_STACK=true "$IPT" "${args[@]}" "${force[@]}" >> "$TMP/side-ours-$cell"
        state_in "$ns" "$be" > "$TMP/state-ours"
        check_state "$TMP/state-ours" "$be" "$c-$fam" "ours $cell run $run"
        ns=$(new_ns "$fam")
        timed_in "$ns" ISTIO_DUAL_STACK=true "$ISTIO_AGENT" istio-iptables "${args[@]}" "${force[@]}" \
          >> "$TMP/side-istio-$cell"
        state_in "$ns" "$be" > "$TMP/state-istio"
        check_state "$TMP/state-istio" "$be" "$c-$fam" "Istio's $cell run $run"
        [ "$be" = auto ] && [ -z "${AUTO_BE:-}" ] && AUTO_BE=$(awk '{sub(/^ip6?tables-/, "", $1); print $1; exit}' "$TMP/state-ours")
        if ! cmp -s "$TMP/state-ours" "$TMP/state-istio"; then
          echo "bench: $cell run $run: ours and Istio's left different rules:" >&2
          diff "$TMP/state-ours" "$TMP/state-istio" | head -20 >&2
          exit 1
        fi
      done
    done
  done
done

echo "istio-iptables side by side: ours vs Istio's \`pilot-agent istio-iptables\` ($(basename "$ISTIO_HOME")), $RUNS runs each, interleaved, $(iptables --version)"
echo
echo "| config | backend | pod addresses | rules (v4+v6) | ours: min / median / max (ms) | Istio's: min / median / max (ms) | ours / Istio's (medians) | per-run ratio min–max |"
echo "|---|---|---|---|---|---|---|---|"
for c in "${CONFIGS[@]}"; do
  cname="default sidecar (injector's args)"; [ "$c" = large ] && cname="large (250 ports, 250 CIDRs)"
  for be in "${BACKENDS[@]}"; do
    bname="$be (forced)"; [ "$be" = auto ] && bname="as detected ($AUTO_BE here)"
    [ "$be" = nftables ] && bname="native nftables (--native-nftables)"
    for fam in "${FAMILIES[@]}"; do
      fname="IPv4 + IPv6"; [ "$fam" = v4 ] && fname="IPv4 only"
      o="$TMP/side-ours-$c-$be-$fam"; i="$TMP/side-istio-$c-$be-$fam"
      ratios=$(paste "$o" "$i" | awk '{print $1 / $2}' | sort -n | awk '{a[NR]=$1} END {printf "%.2f–%.2f", a[1], a[NR]}')
      printf "| %s | %s | %s | %s | %s | %s | %.2f | %s |\n" "$cname" "$bname" "$fname" \
        "$(if [ "$be" = nftables ]; then echo "${ENFT[$c-$fam]} (inet)"; else echo "${E4[$c-$fam]}+${E6[$c-$fam]}"; fi)" "$(mmm "$o")" "$(mmm "$i")" \
        "$(echo "$(med "$o") / $(med "$i")" | bc -l)" "$ratios"
    done
  done
done
fi
