#!/usr/bin/env bash
# Benchmarks of what pilot-agent serves locally, each against a baseline from the same run:
#   - DNS proxy: queries per second for name-table hits (1000 mesh names), agent vs dnsmasq answering
#     the same names from a hosts file; both servers pinned to core 0, dnsperf on core 1.
#   - merged stats: the agent's peak RSS while serving one /stats/prometheus scrape whose Envoy part
#     is large (1000 services), vs its RSS just before.
# Usage: ./scripts/bench-status.sh [seconds per DNS run] (default 10). Root required.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-10}"
N=1000
./scripts/setup.sh >/dev/null
command -v dnsperf >/dev/null || { apt-get install -y -qq dnsperf >/dev/null; }
cargo build --release --quiet -p pilot-agent -p istio-module
BIN="$PWD/target/release"
WORK="$(mktemp -d /tmp/istbench-status.XXXXXX)"; chmod 0755 "$WORK"
NS="istbench-status-$$"
cleanup() {
  for pid in $(ip netns pids "$NS" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  ip netns delete "$NS" 2>/dev/null || true
  rm -rf "$WORK" "/etc/netns/$NS"
}
trap cleanup EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
mkdir -p "/etc/netns/$NS"
echo "nameserver 127.0.0.1" > "/etc/netns/$NS/resolv.conf"
in_ns() { ip netns exec "$NS" "$@"; }

mkdir -p "$WORK/mesh" "$WORK/pod"; chmod 0755 "$WORK/pod"
: > "$WORK/hosts"; : > "$WORK/queries"
for i in $(seq 0 $((N - 1))); do
  ip="10.$((100 + i / 65536)).$(((i / 256) % 256)).$((i % 256))"
  cat >> "$WORK/mesh/mesh.yaml" <<YAML
---
kind: ServiceEntry
metadata: {name: svc$i, namespace: bench}
spec:
  hosts: [svc$i.bench.svc.cluster.local]
  addresses: [$ip]
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: 10.200.$(((i / 256) % 256)).$((i % 256))}]
YAML
  echo "$ip svc$i.bench.svc.cluster.local" >> "$WORK/hosts"
  echo "svc$i.bench.svc.cluster.local A" >> "$WORK/queries"
done

(cd "$WORK/pod" && env -i PATH="$PATH" POD_NAME=bench POD_NAMESPACE=bench INSTANCE_IP=10.233.0.2 \
  ISTIO_META_DNS_CAPTURE=true PROXY_CONFIG='{"terminationDrainDuration": "0s", "concurrency": 1}' \
  taskset -c 0 ip netns exec "$NS" "$BIN/pilot-agent" proxy sidecar --configDir "$WORK/mesh" \
  >"$WORK/agent.log" 2>&1 &)
for _ in $(seq 1 600); do
  [ "$(in_ns curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:15020/healthz/ready)" = 200 ] && break
  sleep 0.1
done
taskset -c 0 ip netns exec "$NS" /usr/sbin/dnsmasq --keep-in-foreground --no-resolv --no-hosts \
  --addn-hosts="$WORK/hosts" --listen-address=127.0.0.1 --port=5353 --bind-interfaces \
  --cache-size=10000 --user=root --pid-file= >"$WORK/dnsmasq.log" 2>&1 &
sleep 1

qps() { # port
  in_ns taskset -c 1 dnsperf -s 127.0.0.1 -p "$1" -d "$WORK/queries" -l "$SECS" -c 1 -T 1 -q 100 2>/dev/null \
    | awk '/Queries per second/ {print $4}'
}
lost() { in_ns taskset -c 1 dnsperf -s 127.0.0.1 -p "$1" -d "$WORK/queries" -n 1 -c 1 -T 1 2>/dev/null | awk '/Queries lost/ {print $3}'; }
ours=$(qps 15053); theirs=$(qps 5353)

agent=$(for p in $(ip netns pids "$NS"); do if [ "$(cat /proc/$p/comm)" = pilot-agent ]; then echo "$p"; fi; done)
size=$(in_ns curl -s http://127.0.0.1:15090/stats/prometheus | wc -c)
before=$(awk '/^VmRSS/ {print $2}' "/proc/$agent/status")
echo 5 > "/proc/$agent/clear_refs"   # reset the peak-RSS mark
merged=$(in_ns curl -s http://127.0.0.1:15020/stats/prometheus | wc -c)
peak=$(awk '/^VmHWM/ {print $2}' "/proc/$agent/status")

echo "pilot-agent status-side benchmarks, $N mesh names/services"
echo
echo "| measure | agent | baseline | ratio |"
echo "|---|---|---|---|"
printf "| DNS queries/s, table hits, 1 core (agent vs dnsmasq, hosts file) | %.0f | %.0f | %.2f |\n" "$ours" "$theirs" "$(echo "$ours / $theirs" | bc -l)"
printf "| agent RSS during one /stats/prometheus scrape (KiB; Envoy part %s bytes, merged %s bytes) vs before | %s | %s | +%s KiB |\n" \
  "$size" "$merged" "$peak" "$before" "$((peak - before))"
echo
echo "lost queries in a 1-pass check: agent $(lost 15053), dnsmasq $(lost 5353)"
