#!/usr/bin/env bash
# Data-path cost of the generated config (BENCHMARKS.md "Data path"): HTTP through two sidecars
# (client app -> iptables -> client Envoy -> mTLS -> iptables -> server Envoy -> app), the same
# two Envoys, the same capture and the same app, with two configs measured in one run:
#   - ours: pilot-agent (embedded control plane) writes the bootstrap and serves the generated
#     config, with a VirtualService and a DestinationRule in force;
#   - hand-minimal: each Envoy started on a static config with one listener, one route, one
#     cluster and the same TLS (ECDSA P-256 certificates, mutual TLS), nothing else.
# The app is a third Envoy answering 200 with a 1 KiB body. Proxies and app are pinned to core 0,
# the load generator (wrk, closed loop: C connections on 1 thread) to core 1.
# Usage: ./scripts/bench-datapath.sh [seconds] [connections] [rounds] [mode] (default 10 16 3 minimal).
# BENCH_CPU=1 adds where the CPU of each measured load went: microseconds of CPU per request for each
# process of each side (Envoy, pilot-agent, the app), from /proc (medians over rounds).
# Root. mode `authz`: instead of the hand-minimal config, ours is measured with and without an
# AuthorizationPolicy of 100 ALLOW rules on the server (the request matches only the last, so Envoy
# evaluates them all), alternating in the same run. Mode `gateway`: the client side is an ingress
# gateway instead of a sidecar (no capture there; wrk in the same namespace sends Host
# app.example.com to its port 8080): ours is `pilot-agent proxy router` serving a Gateway and a
# VirtualService bound to it, to the server's sidecar over mTLS; hand-minimal is an Envoy with one
# listener on 8080, one route and the same TLS cluster. Mode `telemetry`: ours with Istio's
# standard metrics (the default: every HCM and tcp_proxy has the proxy module's istio.stats) and
# ours with them off (MeshConfig `defaultProviders: {metrics: []}`: no istio.stats filter),
# alternating in the same run. Mode `accesslog`: ours with MeshConfig `accessLogFile` (a file,
# Istio's default text format) and ours without, alternating. Mode `tracing`: ours with a
# Telemetry tracing to a Zipkin provider at 1% sampling (the collectors: Jaeger v2 from
# scripts/install-collectors.sh, one in each namespace) and ours with `enableTracing: false`.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-10}"; CONNS="${2:-16}"; ROUNDS="${3:-3}"; MODE="${4:-minimal}"
case "$MODE" in minimal|authz|gateway|telemetry|accesslog|tracing) ;; *) echo "mode: minimal, authz, gateway, telemetry, accesslog or tracing, not $MODE" >&2; exit 2 ;; esac
./scripts/setup.sh >/dev/null
command -v wrk >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
# BIN=DIR: prebuilt release binaries (pilot-agent, istio-iptables) instead of a build.
[ -n "${BIN:-}" ] || cargo build --release --quiet -p pilot-agent --bin pilot-agent -p istio-init --bin istio-iptables -p istio-module --lib
BIN="${BIN:-$PWD/target/release}"
ENVOY=/usr/local/bin/envoy
WORK="$(mktemp -d /tmp/istbench-datapath.XXXXXX)"; chmod 0755 "$WORK"
C="istbench-dp-c-$$"; S="istbench-dp-s-$$"
VIP=10.78.0.10; CIP=10.77.0.1; SIP=10.77.0.2
cleanup() {
  for ns in "$C" "$S"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns delete "$ns" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
ip netns add "$C"; ip netns add "$S"
ip link add "dpc$$" type veth peer name "dps$$"
ip link set "dpc$$" netns "$C"; ip link set "dps$$" netns "$S"
ip -n "$C" addr add "$CIP/24" dev "dpc$$"; ip -n "$S" addr add "$SIP/24" dev "dps$$"
for ns in "$C" "$S"; do ip -n "$ns" link set lo up; done
ip -n "$C" link set "dpc$$" up; ip -n "$S" link set "dps$$" up
ip -n "$C" route add default dev "dpc$$"
# Where wrk sends its requests, and the client-side listener of the hand-minimal config.
URL="http://$VIP:8000/"; HOSTHDR="app.bench.svc.cluster.local"; MIN_PORT=15001; CAPTURED=("$C" "$S")
if [ "$MODE" = gateway ]; then
  URL="http://$CIP:8080/"; HOSTHDR="app.example.com"; MIN_PORT=8080; CAPTURED=("$S")
fi
# The capture exactly as Istio's injector asks for it (a gateway has none).
for ns in "${CAPTURED[@]}"; do
  ip netns exec "$ns" "$BIN/istio-iptables" -p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" -b '*' \
    -d 15090,15021,15020 >/dev/null
done

# The app: 200 with a 1 KiB body, on the server's :8000.
BODY="$(head -c 1024 /dev/zero | tr '\0' 'x')"
cat > "$WORK/app.yaml" <<EOF
static_resources:
  listeners:
  - address: {socket_address: {address: 0.0.0.0, port_value: 8000}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: app
          http_filters: [{name: envoy.filters.http.router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}]
          route_config:
            virtual_hosts: [{name: app, domains: ["*"], routes: [{match: {prefix: /}, direct_response: {status: 200, body: {inline_string: "$BODY"}}}]}]
EOF
ip netns exec "$S" taskset -c 0 setpriv --reuid 1000 --regid 1000 --clear-groups -- \
  "$ENVOY" -c "$WORK/app.yaml" --concurrency 1 --disable-hot-restart --base-id 7 -l error \
  >"$WORK/app.log" 2>&1 &

# Certificates for the hand-minimal configs (the agents get theirs from the embedded CA).
openssl ecparam -name prime256v1 -genkey -noout -out "$WORK/ca.key" 2>/dev/null
openssl req -x509 -new -key "$WORK/ca.key" -subj /CN=bench-ca -days 2 -out "$WORK/ca.pem" 2>/dev/null
for who in client server; do
  openssl ecparam -name prime256v1 -genkey -noout -out "$WORK/$who.key" 2>/dev/null
  openssl req -new -key "$WORK/$who.key" -subj "/CN=$who" -out "$WORK/$who.csr" 2>/dev/null
  printf 'subjectAltName=URI:spiffe://cluster.local/ns/bench/sa/%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$who" > "$WORK/$who.ext"
  openssl x509 -req -in "$WORK/$who.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" -CAcreateserial \
    -days 2 -extfile "$WORK/$who.ext" -out "$WORK/$who.pem" 2>/dev/null
done
chmod 0644 "$WORK"/*.key

tls() { # kind(upstream|downstream) who
  cat <<EOF
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.$1TlsContext
          common_tls_context:
            tls_certificates: [{certificate_chain: {filename: $WORK/$2.pem}, private_key: {filename: $WORK/$2.key}}]
            validation_context: {trusted_ca: {filename: $WORK/ca.pem}}
EOF
}
cat > "$WORK/min-client.yaml" <<EOF
static_resources:
  listeners:
  - address: {socket_address: {address: 0.0.0.0, port_value: $MIN_PORT}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: out
          http_filters: [{name: envoy.filters.http.router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}]
          route_config:
            virtual_hosts: [{name: all, domains: ["*"], routes: [{match: {prefix: /}, route: {cluster: server}}]}]
  clusters:
  - name: server
    type: STATIC
    load_assignment: {cluster_name: server, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: $SIP, port_value: 8000}}}}]}]}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
$(tls Upstream client)
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 15000}}}
EOF
cat > "$WORK/min-server.yaml" <<EOF
static_resources:
  listeners:
  - address: {socket_address: {address: 0.0.0.0, port_value: 15006}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
$(tls Downstream server | sed 's/^/  /')
            require_client_certificate: true
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: in
          http_filters: [{name: envoy.filters.http.router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}]
          route_config:
            virtual_hosts: [{name: all, domains: ["*"], routes: [{match: {prefix: /}, route: {cluster: app}}]}]
  clusters:
  - name: app
    type: STATIC
    upstream_bind_config: {source_address: {address: 127.0.0.6, port_value: 0}}
    load_assignment: {cluster_name: app, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8000}}}}]}]}
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 15000}}}
EOF

# Our mesh: the service, its workload, a VirtualService and a DestinationRule in force.
mkdir -p "$WORK/mesh"
cat > "$WORK/mesh/mesh.yaml" <<EOF
kind: ServiceEntry
metadata: {name: app, namespace: bench}
spec:
  hosts: [app.bench.svc.cluster.local]
  addresses: [$VIP]
  location: MESH_INTERNAL
  ports: [{number: 8000, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: app}}
---
kind: WorkloadEntry
metadata: {name: app, namespace: bench}
spec: {address: $SIP, labels: {app: app, version: v1}, serviceAccount: server}
---
kind: DestinationRule
metadata: {name: app, namespace: bench}
spec:
  host: app
  trafficPolicy: {connectionPool: {http: {http2MaxRequests: 10000}}}
  subsets: [{name: v1, labels: {version: v1}}]
---
kind: VirtualService
metadata: {name: app, namespace: bench}
spec:
  hosts: [app]
  http:
  - match: [{headers: {x-canary: {exact: "1"}}}]
    route: [{destination: {host: app, subset: v1}}]
  - route: [{destination: {host: app, subset: v1}}]
    timeout: 10s
EOF
if [ "$MODE" = gateway ]; then
  cat > "$WORK/mesh/gateway.yaml" <<EOF
kind: Gateway
metadata: {name: edge, namespace: bench}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: [app.example.com]}]
---
kind: VirtualService
metadata: {name: edge, namespace: bench}
spec:
  hosts: [app.example.com]
  gateways: [edge]
  http:
  - route: [{destination: {host: app.bench.svc.cluster.local, port: {number: 8000}}}]
    timeout: 10s
EOF
fi

wait_ok() { # ns url
  for _ in $(seq 1 600); do
    [ "$(ip netns exec "$1" setpriv --reuid 1000 --regid 1000 --clear-groups -- curl -s --max-time 2 -H "Host: $HOSTHDR" -o /dev/null -w '%{http_code}' "$2")" = 200 ] && return 0
    sleep 0.05
  done
  echo "no 200 from $2" >&2; tail -n 20 "$WORK"/*.log >&2; return 1
}
stop_proxies() {
  for ns in "$C" "$S"; do
    for pid in $(ip netns pids "$ns"); do
      comm="$(cat "/proc/$pid/comm" 2>/dev/null || true)"
      args="$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null || true)"
      case "$args" in *app.yaml*) continue ;; esac
      [ "$comm" = envoy ] || [ "$comm" = pilot-agent ] && kill -TERM "$pid" 2>/dev/null || true
    done
  done
  sleep 1
}
start_ours() {
  for side in client server; do
    ns="$C"; ip="$CIP"; [ "$side" = server ] && { ns="$S"; ip="$SIP"; }
    kind=sidecar; [ "$MODE" = gateway ] && [ "$side" = client ] && kind=router
    mkdir -p "$WORK/$side/etc/istio/pod"; chmod -R 0755 "$WORK/$side"
    [ "$kind" = router ] && echo 'istio="ingressgateway"' > "$WORK/$side/etc/istio/pod/labels"
    (cd "$WORK/$side" && ip netns exec "$ns" taskset -c 0 env POD_NAME="$side" POD_NAMESPACE=bench \
      INSTANCE_IP="$ip" SERVICE_ACCOUNT="$side" ISTIO_META_CLUSTER_ID=Kubernetes \
      PROXY_CONFIG='{"concurrency": 1, "terminationDrainDuration": "0s"}' \
      "$BIN/pilot-agent" proxy "$kind" --configDir "$WORK/mesh" --proxyLogLevel=error \
      >"$WORK/$side.log" 2>&1 &)
  done
}
start_minimal() {
  ip netns exec "$C" taskset -c 0 setpriv --reuid 1337 --regid 1337 --clear-groups -- \
    "$ENVOY" -c "$WORK/min-client.yaml" --concurrency 1 --disable-hot-restart --base-id 8 -l error \
    >"$WORK/min-client.log" 2>&1 &
  ip netns exec "$S" taskset -c 0 setpriv --reuid 1337 --regid 1337 --clear-groups -- \
    "$ENVOY" -c "$WORK/min-server.yaml" --concurrency 1 --disable-hot-restart --base-id 9 -l error \
    >"$WORK/min-server.log" 2>&1 &
}
# CPU time (clock ticks) of every process in the pods' namespaces: "ns comm pid ticks" lines.
cpu_ticks() {
  for ns in "$C" "$S"; do
    for pid in $(ip netns pids "$ns"); do
      [ -r "/proc/$pid/stat" ] || continue
      echo "$ns $(cat "/proc/$pid/comm" 2>/dev/null) $pid $(awk '{print $14+$15}' "/proc/$pid/stat" 2>/dev/null)"
    done
  done
}
# Where the CPU of the measured load went, per side and process (microseconds per request);
# appended to $WORK/cpu-<label>.txt, printed at the end (BENCH_CPU=1).
cpu_split() { # label before-file after-file rps
  local hz; hz="$(getconf CLK_TCK)"
  awk -v hz="$hz" -v n="$(awk -v r="$4" -v s="$SECS" 'BEGIN {print r*s}')" -v c="$C" '
    NR==FNR {before[$3]=$4; next}
    ($3 in before) {
      side = ($1 == c) ? "client" : "server"; d = ($4 - before[$3]) * 1e6 / hz / n
      key = side " " $2; cpu[key] += d
    }
    END {for (k in cpu) printf "%s %.1f\n", k, cpu[k]}' "$2" "$3" | sort >> "$WORK/cpu-$1.txt"
}

load() { # -> "p50 p90 p99 rps" (ms, ms, ms, requests/s)
  ip netns exec "$C" taskset -c 1 setpriv --reuid 1000 --regid 1000 --clear-groups -- \
    wrk -t1 -c"$CONNS" -d2s -H "Host: $HOSTHDR" "$URL" >/dev/null
  [ -n "${BENCH_CPU:-}" ] && cpu_ticks > "$WORK/ticks-before.txt"
  ip netns exec "$C" taskset -c 1 setpriv --reuid 1000 --regid 1000 --clear-groups -- \
    wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -H "Host: $HOSTHDR" "$URL" > "$WORK/wrk.txt"
  if [ -n "${BENCH_CPU:-}" ]; then
    cpu_ticks > "$WORK/ticks-after.txt"
    cpu_split "${LOAD_LABEL:-run}" "$WORK/ticks-before.txt" "$WORK/ticks-after.txt" \
      "$(awk '/Requests\/sec/ {print $2}' "$WORK/wrk.txt")"
  fi
  grep -q "Non-2xx\|Socket errors" "$WORK/wrk.txt" && { cat "$WORK/wrk.txt" >&2; echo "errors in the run" >&2; return 1; }
  ms() { awk -v k="$1" '$1==k {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; printf "%.3f", v}' "$WORK/wrk.txt"; }
  echo "$(ms 50%) $(ms 90%) $(ms 99%) $(awk '/Requests\/sec/ {print $2}' "$WORK/wrk.txt")"
}

# 100 ALLOW rules: 99 for other callers and paths, the last for the client (authz mode).
python3 - "$WORK/authz.yaml.off" <<'PY'
import sys
rules = "".join(
    f"  - from: [{{source: {{principals: [cluster.local/ns/bench/sa/caller-{i}]}}}}]\n"
    f"    to: [{{operation: {{methods: [GET, POST], paths: [/api/v{i}/*]}}}}]\n"
    for i in range(99))
rules += "  - from: [{source: {principals: [cluster.local/ns/bench/sa/client]}}]\n    to: [{operation: {methods: [GET], paths: ['/*']}}]\n"
open(sys.argv[1], "w").write(
    "kind: AuthorizationPolicy\nmetadata: {name: app, namespace: bench}\nspec:\n"
    "  selector: {matchLabels: {app: app}}\n  rules:\n" + rules)
PY

# accesslog and tracing modes: the mesh config of the measured side (A) and of the baseline (B).
case "$MODE" in
  accesslog)
    : > "$WORK/access.log"; chown 1337:1337 "$WORK/access.log"
    printf 'kind: MeshConfig\nmetadata: {name: mesh, namespace: istio-system}\nspec:\n  accessLogFile: %s\n' \
      "$WORK/access.log" > "$WORK/ab.yaml.on"
    : > "$WORK/ab.yaml.off" ;;
  tracing)
    JAEGER="$(./scripts/install-collectors.sh --print)/bin/jaeger"
    [ -x "$JAEGER" ] || { echo "tracing mode needs Jaeger: run scripts/install-collectors.sh" >&2; exit 1; }
    # One collector per side, on its loopback (each sidecar reports its own spans).
    for ns in "$C" "$S"; do ip netns exec "$ns" taskset -c 1 "$JAEGER" >"$WORK/jaeger-$ns.log" 2>&1 & done
    cat > "$WORK/ab.yaml.on" <<YAML
kind: MeshConfig
metadata: {name: mesh, namespace: istio-system}
spec:
  extensionProviders:
  - name: zipkin
    zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}
---
kind: ServiceEntry
metadata: {name: zipkin, namespace: istio-system}
spec:
  hosts: [zipkin.istio-system.svc.cluster.local]
  ports: [{number: 9411, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1}]
---
kind: Telemetry
metadata: {name: mesh-default, namespace: istio-system}
spec:
  tracing:
  - providers: [{name: zipkin}]
    randomSamplingPercentage: ${TRACING_PERCENT:-1.0}
YAML
    printf 'kind: MeshConfig\nmetadata: {name: mesh, namespace: istio-system}\nspec:\n  enableTracing: false\n' \
      > "$WORK/ab.yaml.off" ;;
esac

declare -a OURS MIN
for r in $(seq 1 "$ROUNDS"); do
  if [ "$MODE" = accesslog ] || [ "$MODE" = tracing ]; then
    cp "$WORK/ab.yaml.on" "$WORK/mesh/ab.yaml"
    start_ours; wait_ok "$C" "$URL"
    LOAD_LABEL=on; OURS+=("$(load)"); stop_proxies
    cp "$WORK/ab.yaml.off" "$WORK/mesh/ab.yaml"
    start_ours; wait_ok "$C" "$URL"
    LOAD_LABEL=off; MIN+=("$(load)"); stop_proxies
    continue
  fi
  if [ "$MODE" = authz ]; then
    cp "$WORK/authz.yaml.off" "$WORK/mesh/authz.yaml"
    start_ours; wait_ok "$C" "$URL"
    OURS+=("$(load)"); stop_proxies
    rm -f "$WORK/mesh/authz.yaml"
    start_ours; wait_ok "$C" "$URL"
    MIN+=("$(load)"); stop_proxies
    continue
  fi
  if [ "$MODE" = telemetry ]; then
    rm -f "$WORK/mesh/no-metrics.yaml"
    start_ours; wait_ok "$C" "$URL"
    LOAD_LABEL=metrics; OURS+=("$(load)")
    # The records reached the agent: its 15020 counts the requests.
    ip netns exec "$S" curl -s -o "$WORK/scrape.txt" "http://127.0.0.1:15020/stats/prometheus"
    grep -q '^istio_requests_total{reporter="destination"' "$WORK/scrape.txt" \
      || { echo "no istio_requests_total on the server's 15020" >&2; exit 1; }
    stop_proxies
    printf 'kind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |-\n    defaultProviders: {metrics: []}\n' \
      > "$WORK/mesh/no-metrics.yaml"
    start_ours; wait_ok "$C" "$URL"
    LOAD_LABEL=off; MIN+=("$(load)"); stop_proxies
    continue
  fi
  start_ours; wait_ok "$C" "$URL"
  LOAD_LABEL=ours; OURS+=("$(load)"); stop_proxies
  start_minimal; wait_ok "$C" "$URL"
  LOAD_LABEL=minimal; MIN+=("$(load)"); stop_proxies
done
if [ "$MODE" = authz ]; then
  A="ours, 100 ALLOW rules"; B="ours, no policy"
elif [ "$MODE" = gateway ]; then
  A="ours, gateway"; B="hand-minimal gateway"
elif [ "$MODE" = telemetry ]; then
  A="ours, standard metrics"; B="ours, metrics off"
elif [ "$MODE" = accesslog ]; then
  A="ours, access log to a file"; B="ours, no access log"
  [ -s "$WORK/access.log" ] || { echo "the access log file stayed empty" >&2; exit 1; }
elif [ "$MODE" = tracing ]; then
  A="ours, Zipkin tracing at 1%"; B="ours, tracing off"
else
  A="ours"; B="hand-minimal"
fi
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
col() { local i="$1"; shift; for x in "$@"; do echo "$x" | awk -v i="$i" '{print $i}'; done | median; }
echo "| measure (median of $ROUNDS rounds, ${SECS}s, $CONNS connections) | $A | $B | ratio |"
echo "|---|---|---|---|"
for i in 1 2 3 4; do
  name=("" "p50 latency (ms)" "p90 latency (ms)" "p99 latency (ms)" "throughput (requests/s)")
  o="$(col "$i" "${OURS[@]}")"; m="$(col "$i" "${MIN[@]}")"
  echo "| ${name[$i]} | $o | $m | $(awk -v o="$o" -v m="$m" 'BEGIN {printf "%.3f", o/m}') |"
done
echo
echo "rounds, $A: ${OURS[*]}"
echo "rounds, $B: ${MIN[*]}"
if [ -n "${BENCH_CPU:-}" ]; then
  # Median over the rounds of each process's CPU per request.
  for f in "$WORK"/cpu-*.txt; do
    echo "CPU per request (us), $(basename "$f" .txt | sed 's/^cpu-//'), median of rounds:"
    awk '{k=$1" "$2; v[k]=v[k]" "$3} END {for (k in v) print k, v[k]}' "$f" | while read -r side comm vals; do
      echo "  $side $comm $(echo "$vals" | tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}')"
    done | sort
  done
fi
if [ "$MODE" = tracing ]; then
  # The sampled requests' spans reached the collectors (both sides report).
  for ns in "$C" "$S"; do
    services="$(ip netns exec "$ns" curl -s "http://127.0.0.1:16686/api/services")"
    traces="$(ip netns exec "$ns" curl -s "http://127.0.0.1:16686/api/traces?service=istio-proxy.bench&limit=1000&lookback=1h" \
      | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"] or []))')"
    echo "collector in $ns: services $services, $traces traces (at most 1000 listed)"
    echo "$services" | grep -q '"data":\["' || { echo "no spans reached the collector in $ns" >&2; exit 1; }
  done
fi
