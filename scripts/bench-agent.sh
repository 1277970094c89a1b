#!/usr/bin/env bash
# pilot-agent benchmarks with a real Envoy and a standalone istiod-core serving a 1000-service
# mesh, inside a network namespace. Each figure is compared with a baseline from the same run:
#   - start to ready: agent start -> :15020/healthz/ready 200, vs a bare Envoy connected directly
#     to the same istiod-core (no agent) -> CDS and LDS accepted (the xDS proxy's overhead), and
#     vs a bare Envoy started with the same config as static resources -> LIVE (the floor);
#   - agent memory: the agent's RSS (Envoy excluded) with the 1000-service mesh proxied, vs with
#     a 1-service mesh.
#   - side by side with Istio's agent (PARTS=stats): our sidecar with Istio's stats inclusion
#     list, with every stat kept (`proxyStatsMatcher: {inclusionRegexps: [".*"]}`, what ours did
#     before it had the list), and Istio's own pilot-agent (scripts/install-istio.sh) with the
#     same Envoy and the same istiod-core, interleaved within each run: start to ready, series and
#     bytes on 15090, the agent's RSS (Envoy excluded), Envoy's RSS; min / median / max.
# Usage: ./scripts/bench-agent.sh [runs] (default 5). Root required. Prints Markdown.
#   PARTS="ready stats" (the default) picks the parts to run.
#   BIN=DIR takes pilot-agent and istiod-core from DIR instead of building them (no cargo build).
set -euo pipefail
[ -n "${BIN:-}" ] && BIN="$(realpath "$BIN")"
cd "$(dirname "$0")/.."
RUNS="${1:-5}"
SERVICES="${SERVICES:-1000}"
PARTS="${PARTS:-ready stats}"
part() { [[ " $PARTS " == *" $1 "* ]]; }
./scripts/setup.sh >/dev/null
if part stats; then ./scripts/install-istio.sh >/dev/null; fi
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet -p pilot-agent -p istiod-core -p istio-module
  BIN="$PWD/target/release"
fi
for b in pilot-agent istiod-core; do
  [ -x "$BIN/$b" ] || { echo "bench-agent: no $b in $BIN" >&2; exit 1; }
done
[ -f "$BIN/libistio_module.so" ] || { echo "bench-agent: no libistio_module.so in $BIN" >&2; exit 1; }
# The bare Envoys load the proxy module the generated config names, as the agent's Envoy does.
export ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$BIN"
WORK="$(mktemp -d /tmp/istbench-agent.XXXXXX)"; chmod 0755 "$WORK"
NS="istbench-agent-$$"
cleanup() {
  for pid in $(ip netns pids "$NS" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  ip netns delete "$NS" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
in_ns() { ip netns exec "$NS" "$@"; }

gen_mesh() { # dir, count
  mkdir -p "$1"
  python3 - "$1" "$2" <<'PY'
import sys
d, n = sys.argv[1], int(sys.argv[2])
with open(f"{d}/mesh.yaml", "w") as f:
    for i in range(n):
        f.write(f"""---
kind: ServiceEntry
metadata: {{name: svc{i}, namespace: bench}}
spec:
  hosts: [svc{i}.bench.svc.cluster.local]
  addresses: [10.{100 + i // 65536}.{(i // 256) % 256}.{i % 256}]
  ports: [{{number: 8080, name: http, protocol: HTTP}}, {{number: 9090, name: tcp, protocol: TCP}}]
  endpoints: [{{address: 10.200.{(i // 256) % 256}.{i % 256}}}, {{address: 10.201.{(i // 256) % 256}.{i % 256}}}]
""")
PY
}
gen_mesh "$WORK/mesh-big" "$SERVICES"
gen_mesh "$WORK/mesh-small" 1

now() { date +%s%N; }
median_ms() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.1f", m/1e6}'; }
wait_http() { # url -> waits for 200
  for _ in $(seq 1 3000); do
    [ "$(in_ns curl -s -o /dev/null -w '%{http_code}' "$1")" = 200 ] && return 0
    sleep 0.01
  done
  echo "timeout waiting for $1" >&2; return 1
}
xds_accepted() { # both cds and lds update_success > 0 on Envoy admin
  in_ns curl -s "http://127.0.0.1:15000/stats?filter=^(cluster_manager.cds|listener_manager.lds).update_success%24" \
    | awk -F': ' '$2 > 0 {n++} END {exit !(n == 2)}'
}
stop_all() { for pid in $(ip netns pids "$NS"); do kill -KILL "$pid" 2>/dev/null || true; done; sleep 0.2; }

start_istiod() { # mesh dir
  in_ns "$BIN/istiod-core" serve --config-dir "$1" --grpc-addr 127.0.0.1:15010 >"$WORK/istiod.log" 2>&1 &
  for _ in $(seq 1 500); do in_ns bash -c 'exec 3<>/dev/tcp/127.0.0.1/15010' 2>/dev/null && return; sleep 0.01; done
}
# The workload certificate comes from mounted files (the benchmark's istiod-core has no CA):
# a throwaway root and a leaf for spiffe://cluster.local/ns/bench/sa/default, made with openssl.
mint_certs() { # dir
  mkdir -p "$1"
  openssl ecparam -name prime256v1 -genkey -noout -out "$WORK/root-key.pem" 2>/dev/null
  openssl req -x509 -new -key "$WORK/root-key.pem" -subj /O=bench -days 2 -out "$1/root-cert.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
  openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null | openssl pkcs8 -topk8 -nocrypt -out "$1/key.pem"
  openssl req -new -key "$1/key.pem" -subj /O=bench -out "$WORK/leaf.csr" 2>/dev/null
  printf 'subjectAltName=URI:spiffe://cluster.local/ns/bench/sa/default\nbasicConstraints=CA:FALSE\n' > "$WORK/leaf.ext"
  openssl x509 -req -in "$WORK/leaf.csr" -CA "$1/root-cert.pem" -CAkey "$WORK/root-key.pem" -days 1 \
    -extfile "$WORK/leaf.ext" -out "$1/cert-chain.pem" 2>/dev/null
}
start_agent() { # [extra PROXY_CONFIG fields, e.g. ', "proxyStatsMatcher": {...}'] [agent binary] [env...]
  local extra="${1:-}" agent="${2:-$BIN/pilot-agent}"
  shift 2 2>/dev/null || shift $#
  mkdir -p "$WORK/pod"; chmod 0755 "$WORK/pod"
  # The mounted certificates, where our agent and Istio's each look first.
  [ -f "$WORK/pod/var/run/secrets/workload-spiffe-credentials/key.pem" ] || \
    mint_certs "$WORK/pod/var/run/secrets/workload-spiffe-credentials"
  mkdir -p "$WORK/pod/etc"; rm -rf "$WORK/pod/etc/certs"
  cp -r "$WORK/pod/var/run/secrets/workload-spiffe-credentials" "$WORK/pod/etc/certs"
  chmod -R a+rX "$WORK/pod"
  (cd "$WORK/pod" && env -i PATH="$PATH" POD_NAME=bench POD_NAMESPACE=bench INSTANCE_IP=10.233.0.2 "$@" \
    PROXY_CONFIG="{\"discoveryAddress\": \"127.0.0.1:15010\", \"terminationDrainDuration\": \"0s\", \"controlPlaneAuthPolicy\": \"NONE\"$extra}" \
    ip netns exec "$NS" "$agent" proxy sidecar >"$WORK/agent.log" 2>&1 &)
}
agent_pid() { for p in $(ip netns pids "$NS"); do [ "$(cat "/proc/$p/comm")" = pilot-agent ] && echo "$p"; done; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
# The certificates are minted once, before any timing (start_agent would mint them in its first run).
mint_certs "$WORK/pod/var/run/secrets/workload-spiffe-credentials"

: > "$WORK/agent_ready"; : > "$WORK/direct_ready"; : > "$WORK/static_ready"; : > "$WORK/rss_big"; : > "$WORK/rss_small"
if part ready; then
for _ in $(seq 1 "$RUNS"); do
  # Agent + Envoy, 1000 services.
  start_istiod "$WORK/mesh-big"
  t=$(now); start_agent; wait_http http://127.0.0.1:15020/healthz/ready
  echo $(( $(now) - t )) >> "$WORK/agent_ready"
  sleep 1; rss_kib "$(agent_pid)" >> "$WORK/rss_big"
  cp "$WORK/pod/etc/istio/proxy/envoy-rev.json" "$WORK/direct.json"
  in_ns curl -s "http://127.0.0.1:15000/config_dump?include_eds" > "$WORK/dump.json"
  stop_all
  # The same config as static resources: EDS inlined, RDS inlined, no xDS at all.
  python3 - "$WORK/direct.json" "$WORK/dump.json" "$WORK/static.json" <<'PY'
import json, sys
boot, dump = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
by_type = {c["@type"].rsplit(".", 1)[-1]: c for c in dump["configs"]}
def bare(m):  # the dump wraps each resource as an Any; a bootstrap wants the message itself
    m.pop("@type", None)
    return m
eds = {e["endpoint_config"]["cluster_name"]: bare(e["endpoint_config"])
       for e in by_type["EndpointsConfigDump"].get("dynamic_endpoint_configs", [])}
routes = {r["route_config"]["name"]: bare(r["route_config"])
          for r in by_type["RoutesConfigDump"].get("dynamic_route_configs", [])}
clusters = []
for c in by_type["ClustersConfigDump"].get("dynamic_active_clusters", []):
    c = bare(c["cluster"])
    if c.get("type") == "EDS":
        c["type"] = "STATIC"
        c.pop("eds_cluster_config", None)
        c["load_assignment"] = eds.get(c["name"], {"cluster_name": c["name"]})
        for loc in c["load_assignment"].get("endpoints", []):
            loc.pop("load_balancing_weight", None)  # the dump shows the default, which is invalid
    clusters.append(c)
def inline(node):
    if isinstance(node, dict):
        if "rds" in node:
            node["route_config"] = routes[node.pop("rds")["route_config_name"]]
        for v in node.values():
            inline(v)
    elif isinstance(node, list):
        for v in node:
            inline(v)
listeners = [bare(l["active_state"]["listener"]) for l in by_type["ListenersConfigDump"].get("dynamic_listeners", [])]
inline(listeners)
boot.pop("dynamic_resources", None)
boot["static_resources"]["clusters"] += clusters
boot["static_resources"]["listeners"] += listeners
json.dump(boot, open(sys.argv[3], "w"))
PY
  t=$(now)
  in_ns /usr/local/bin/envoy -c "$WORK/static.json" --disable-hot-restart -l warning >"$WORK/envoy-static.log" 2>&1 &
  for _ in $(seq 1 3000); do
    [ "$(in_ns curl -s http://127.0.0.1:15000/ready)" = LIVE ] && break; sleep 0.01
  done
  if [ "$(in_ns curl -s http://127.0.0.1:15000/ready)" != LIVE ]; then
    echo "static Envoy did not start:" >&2; tail -5 "$WORK/envoy-static.log" >&2; exit 1
  fi
  echo $(( $(now) - t )) >> "$WORK/static_ready"
  stop_all
  # Bare Envoy connected straight to istiod-core, same bootstrap otherwise.
  python3 - "$WORK/direct.json" <<'PY'
import json, sys
p = sys.argv[1]
b = json.load(open(p))
for c in b["static_resources"]["clusters"]:
    if c["name"] == "xds-grpc":
        c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] = {
            "socket_address": {"address": "127.0.0.1", "port_value": 15010}}
json.dump(b, open(p, "w"))
PY
  start_istiod "$WORK/mesh-big"
  t=$(now)
  in_ns /usr/local/bin/envoy -c "$WORK/direct.json" --disable-hot-restart -l warning >"$WORK/envoy.log" 2>&1 &
  for _ in $(seq 1 3000); do xds_accepted && break; sleep 0.01; done
  echo $(( $(now) - t )) >> "$WORK/direct_ready"
  stop_all
  # Agent with a 1-service mesh, for the memory baseline.
  start_istiod "$WORK/mesh-small"
  start_agent; wait_http http://127.0.0.1:15020/healthz/ready; sleep 1
  rss_kib "$(agent_pid)" >> "$WORK/rss_small"
  stop_all
done
agent=$(median_ms < "$WORK/agent_ready"); direct=$(median_ms < "$WORK/direct_ready")
static=$(median_ms < "$WORK/static_ready")
big=$(sort -n "$WORK/rss_big" | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]/1024}')
small=$(sort -n "$WORK/rss_small" | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]/1024}')
echo "pilot-agent with Envoy $(/usr/local/bin/envoy --version | awk 'NF {print $3}' | cut -d/ -f2), $SERVICES services (2 ports, 2 endpoints each), Delta xDS, median of $RUNS runs"
echo
echo "| measure | agent | baseline | ratio |"
echo "|---|---|---|---|"
printf "| start to ready (ms): agent+Envoy vs Envoy direct to istiod-core | %s | %s | %.2f |\n" "$agent" "$direct" "$(echo "$agent / $direct" | bc -l)"
printf "| start to ready (ms): agent+Envoy vs Envoy with the same config static | %s | %s | %.2f |\n" "$agent" "$static" "$(echo "$agent / $static" | bc -l)"
printf "| agent RSS (MiB), Envoy excluded: %s services vs 1 service | %s | %s | %.2f |\n" "$SERVICES" "$big" "$small" "$(echo "$big / $small" | bc -l)"
echo
fi

if part stats; then
ISTIO_HOME="$(./scripts/install-istio.sh --print)"
envoy_pid() { for p in $(ip netns pids "$NS"); do [ "$(cat "/proc/$p/comm")" = envoy ] && echo "$p"; done; }
# One sidecar at a time: start to ready, then (after a settle) 15090's series and bytes, the
# agent's RSS (its own process, Envoy excluded) and Envoy's RSS.
measure() { # label, then start_agent's arguments
  local label="$1"; shift
  start_istiod "$WORK/mesh-big"
  local t; t=$(now); start_agent "$@"; wait_http http://127.0.0.1:15021/healthz/ready
  echo $(( $(now) - t )) >> "$WORK/stats_ready_$label"
  sleep 2
  in_ns curl -s http://127.0.0.1:15090/stats/prometheus > "$WORK/scrape"
  grep -vc '^#' "$WORK/scrape" >> "$WORK/stats_series_$label"
  wc -c < "$WORK/scrape" >> "$WORK/stats_bytes_$label"
  rss_kib "$(envoy_pid)" >> "$WORK/stats_rss_$label"
  rss_kib "$(agent_pid)" >> "$WORK/stats_agentrss_$label"
  # The agent's resident memory by kind: anonymous (heap, stacks) and file pages (its binary's
  # text and data, shared libraries).
  awk '/^Anonymous:/ {print $2}' "/proc/$(agent_pid)/smaps_rollup" >> "$WORK/stats_agentanon_$label"
  awk '/^Rss:/ {r=$2} /^Anonymous:/ {a=$2} END {print r - a}' "/proc/$(agent_pid)/smaps_rollup" \
    >> "$WORK/stats_agentfile_$label"
  stop_all
}
KINDS="ready series bytes rss agentrss agentanon agentfile"
for label in istio ours all; do for f in $KINDS; do : > "$WORK/stats_${f}_$label"; done; done
for _ in $(seq 1 "$RUNS"); do
  measure ours
  measure all ', "proxyStatsMatcher": {"inclusionRegexps": [".*"]}'
  # Istio's agent passes its environment to Envoy: the same Envoy loads the same proxy module
  # istiod-core's config names.
  measure istio '' "$ISTIO_HOME/bin/pilot-agent" CLOUD_PLATFORM=none \
    ISTIO_BOOTSTRAP="$ISTIO_HOME/envoy_bootstrap_tmpl.json" ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$BIN"
done
# min / median / max of a file, scaled and formatted
mmm() { # file, divisor, printf format
  sort -n "$1" | awk -v d="$2" -v f="$3" '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2
    printf f " / " f " / " f, a[1]/d, m/d, a[NR]/d}'
}
med() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
echo "Side by side with Istio's pilot-agent ($(basename "$ISTIO_HOME")): $SERVICES services, $RUNS runs (min / median / max), the three sidecars alternating within each run; same Envoy $(/usr/local/bin/envoy --version | awk 'NF {print $3}' | cut -d/ -f2), same istiod-core"
echo
echo "| measure | ours (Istio's list) | ours, every stat | Istio's pilot-agent | ours / Istio's (medians) | per-run ratio min–max |"
echo "|---|---|---|---|---|---|"
row() { # name, file kind, scale divisor, format
  local o="$WORK/stats_$2_ours" a="$WORK/stats_$2_all" i="$WORK/stats_$2_istio" ratios
  ratios=$(paste "$o" "$i" | awk '{print $1 / $2}' | sort -n | awk '{a[NR]=$1} END {printf "%.2f–%.2f", a[1], a[NR]}')
  printf "| %s | %s | %s | %s | %.2f | %s |\n" "$1" "$(mmm "$o" "$3" "$4")" "$(mmm "$a" "$3" "$4")" \
    "$(mmm "$i" "$3" "$4")" "$(echo "$(med "$o") / $(med "$i")" | bc -l)" "$ratios"
}
row "start to ready (ms)" ready 1000000 "%.0f"
row "agent RSS (MiB), Envoy excluded" agentrss 1024 "%.1f"
row "of which anonymous (MiB)" agentanon 1024 "%.1f"
row "of which file pages (MiB)" agentfile 1024 "%.1f"
row "Envoy RSS (MiB)" rss 1024 "%.1f"
row "15090 series per scrape" series 1 "%.0f"
row "15090 bytes per scrape (KB)" bytes 1000 "%.1f"
fi
