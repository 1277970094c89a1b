#!/usr/bin/env bash
# Where the standard metrics' cost goes inside one Envoy: the per-request cost of each way of
# getting a request's facts out, Envoy alone on core 0 (`--concurrency 1`), wrk (1 thread,
# 16 connections) and an upstream Envoy answering 200 on core 1. CPU per request is the Envoy
# process's CPU time (/proc) over the measured load divided by the requests served; variants
# alternate within each round. Variants (hand-written configs, no agent, no TLS):
#   none         a connection manager routing to the upstream (the floor)
#   peer         + the peer exchange's two filters (header_to_metadata, header_mutation)
#   otel         + the OpenTelemetry access logger with the metrics' 16 record attributes as of
#                2026-11-24, to a gRPC sink (the upstream Envoy answering OK)
#   otel-batch   the same with the logger's constant attributes once a batch and no endpoint
#                metadata (what an inbound logger sends since 2026-11-25)
#   otel-nosvc   otel without `%CLUSTER_METADATA(istio:services)%` (a JSON list per record)
#   otel8        otel with only the 8 attributes that are not metadata, headers or constants
#   stats        upstream's `envoy.access_loggers.stats`: Istio's 4 HTTP metrics counted inside
#                Envoy, 25 tags each (response code, flags, grpc status and the cluster's
#                service formatted per request, the rest literals)
# Usage: ./scripts/bench-metrics-record.sh [rounds] [seconds] [variant...]. Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"; SECS="${2:-5}"; shift 2 2>/dev/null || shift $#
VARIANTS=("$@"); [ ${#VARIANTS[@]} -gt 0 ] || VARIANTS=(none peer otel otel-batch otel-nosvc otel8 stats)
ENVOY="${ENVOY:-/usr/local/bin/envoy}"
command -v wrk >/dev/null || { echo "wrk is missing: ./scripts/setup.sh --tests" >&2; exit 1; }
WORK="$(mktemp -d /tmp/istbench-record.XXXXXX)"
UP=""; E=""
cleanup() { for p in $E $UP; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
LABELS = ["reporter", "source_workload", "source_canonical_service", "source_canonical_revision",
          "source_workload_namespace", "source_principal", "source_app", "source_version",
          "source_cluster", "destination_workload", "destination_workload_namespace",
          "destination_principal", "destination_app", "destination_version", "destination_service",
          "destination_canonical_service", "destination_canonical_revision",
          "destination_service_name", "destination_service_namespace", "destination_cluster",
          "request_protocol", "response_flags", "connection_security_policy", "response_code",
          "grpc_response_status"]
RECORD = [("reporter", "destination"), ("kind", "http"), ("peer_san", "%DOWNSTREAM_PEER_URI_SAN%"),
          ("local_san", "%DOWNSTREAM_LOCAL_URI_SAN%"), ("cluster", "%UPSTREAM_CLUSTER_RAW%"),
          ("endpoint", "%UPSTREAM_METADATA(istio:workload)%"),
          ("services", "%CLUSTER_METADATA(istio:services)%"), ("response_flags", "%RESPONSE_FLAGS%"),
          ("received_bytes", "%DOWNSTREAM_WIRE_BYTES_RECEIVED%"),
          ("sent_bytes", "%DOWNSTREAM_WIRE_BYTES_SENT%"), ("authority", "%REQ(:AUTHORITY)%"),
          ("peer", "%DYNAMIC_METADATA(istio.peer:peer)%"), ("content_type", "%REQ(CONTENT-TYPE)%"),
          ("response_code", "%RESPONSE_CODE%"), ("grpc_status", "%GRPC_STATUS_NUMBER%"),
          ("duration_ms", "%DURATION%")]
def kvs(pairs):
    return {"values": [{"key": k, "value": {"string_value": v}} for k, v in pairs]}
def otel(record, batch=()):
    cfg = {"@type": "type.googleapis.com/envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig",
           "grpc_service": {"envoy_grpc": {"cluster_name": "sink"}}, "log_name": "inbound",
           "disable_builtin_labels": True, "buffer_size_bytes": 65536, "attributes": kvs(record)}
    if batch:
        cfg["resource_attributes"] = kvs(batch)
    return {"name": "envoy.access_loggers.open_telemetry", "typed_config": cfg}
def stats():
    per_request = {"response_code": "%RESPONSE_CODE%", "response_flags": "%RESPONSE_FLAGS%",
                   "grpc_response_status": "%GRPC_STATUS_NUMBER%",
                   "destination_service": "%CLUSTER_METADATA(istio:host)%"}
    tags = [{"name": l, "value_format": per_request.get(l, "v-" + l)} for l in LABELS]
    stat = lambda n: {"name": n, "tags": tags}
    return {"name": "envoy.access_loggers.stats", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.stats.v3.Config", "stat_prefix": "istio",
        "counters": [{"stat": stat("requests_total"), "value_fixed": 1}],
        "histograms": [{"stat": stat("request_duration_milliseconds"), "unit": "Milliseconds", "value_format": "%DURATION%"},
                       {"stat": stat("request_bytes"), "unit": "Bytes", "value_format": "%BYTES_RECEIVED%"},
                       {"stat": stat("response_bytes"), "unit": "Bytes", "value_format": "%BYTES_SENT%"}]}}
PEER = [
    {"name": "learn", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config",
     "request_rules": [{"header": "x-istio-peer", "on_header_present": {"metadata_namespace": "istio.peer", "key": "peer"}, "remove": True}]}},
    {"name": "announce", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
     "mutations": {"response_mutations": [{"append": {"header": {"key": "x-istio-peer", "value": "%ENVIRONMENT(ISTIO_PEER)%"},
                                                      "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}]}}}]
VARIANTS = {
    "none": ([], []),
    "peer": (PEER, []),
    "otel": ([], [otel(RECORD)]),
    "otel-batch": ([], [otel([r for r in RECORD if r[0] not in ("reporter", "kind", "endpoint")],
                             [("reporter", "destination"), ("kind", "http")])]),
    "otel-nosvc": ([], [otel([r for r in RECORD if r[0] != "services"])]),
    "otel8": ([], [otel([r for r in RECORD if r[0] in ("peer_san", "cluster", "response_flags", "received_bytes",
                                                       "sent_bytes", "response_code", "duration_ms", "peer")])]),
    "stats": ([], [stats()]),
}
def hcm(prefix, filters, logs, route, codec=None):
    h = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
         "stat_prefix": prefix, "access_log": logs,
         "http_filters": filters + [{"name": "envoy.filters.http.router", "typed_config": {
             "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
         "route_config": {"virtual_hosts": [{"name": "a", "domains": ["*"], "routes": [dict(match={"prefix": "/"}, **route)]}]}}
    if codec:
        h["codec_type"] = codec
    return h
def listener(name, port, h):
    return {"name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{"name": "hcm", "typed_config": h}]}]}
def static(port, name, metadata=None, endpoint_metadata=None, h2=False):
    c = {"name": name, "type": "STATIC", "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}
    if metadata:
        c["metadata"] = {"filter_metadata": {"istio": metadata}}
    if endpoint_metadata:
        c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["metadata"] = {"filter_metadata": {"istio": endpoint_metadata}}
    if h2:
        c["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return c
host = "app.bench.svc.cluster.local"
for name, (filters, logs) in VARIANTS.items():
    cfg = {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 19100}}},
           "static_resources": {
               "listeners": [listener("l", 19101, hcm("in", filters, logs, {"route": {"cluster": "app"}}))],
               "clusters": [static(19102, "app", {"host": host, "services": [{"host": host, "name": "app", "namespace": "bench"}]},
                                   {"workload": "app-v1;bench;app;v1;Kubernetes"}),
                            static(19103, "sink", h2=True)]}}
    json.dump(cfg, open(f"{work}/{name}.json", "w"))
ok = {"direct_response": {"status": 200, "body": {"inline_string": "ok"}}}
grpc_ok = {"direct_response": {"status": 200}, "response_headers_to_add": [
    {"header": {"key": "content-type", "value": "application/grpc"}}, {"header": {"key": "grpc-status", "value": "0"}}]}
json.dump({"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 19104}}},
           "static_resources": {"listeners": [listener("app", 19102, hcm("app", [], [], ok)),
                                              listener("sink", 19103, hcm("sink", [], [], grpc_ok, "HTTP2"))]}},
          open(f"{work}/upstream.json", "w"))
PY
for v in "${VARIANTS[@]}"; do
  [ -f "$WORK/$v.json" ] || { echo "unknown variant $v" >&2; exit 2; }
done
# The peer's announcement as a sidecar sends it (about 110 bytes).
PEER_HEADER="n=client-v1,ns=bench,sa=client,app=client,ver=v1,cs=client,cr=v1,cl=Kubernetes"
export ISTIO_PEER="n=app-v1,ns=bench,sa=app,app=app,ver=v1,cs=app,cr=v1,cl=Kubernetes"
taskset -c 1 "$ENVOY" -c "$WORK/upstream.json" --concurrency 1 --base-id 31 --disable-hot-restart -l error \
  >"$WORK/upstream.log" 2>&1 & UP=$!
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz="$(getconf CLK_TCK)"
for _ in $(seq 1 "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    taskset -c 0 "$ENVOY" -c "$WORK/$v.json" --concurrency 1 --base-id 32 --disable-hot-restart -l error \
      >"$WORK/envoy.log" 2>&1 & E=$!
    for _ in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:19101/ && break; sleep 0.1; done
    taskset -c 1 wrk -t1 -c16 -d2s -H "x-istio-peer: $PEER_HEADER" http://127.0.0.1:19101/ >/dev/null
    before=$(ticks "$E")
    out=$(taskset -c 1 wrk -t1 -c16 -d"${SECS}s" -H "x-istio-peer: $PEER_HEADER" http://127.0.0.1:19101/)
    after=$(ticks "$E")
    n=$(echo "$out" | awk '/requests in/ {print $1}')
    echo "$v $(awk -v a="$before" -v b="$after" -v n="$n" -v hz="$hz" 'BEGIN {printf "%.2f", (b - a) * 1e6 / hz / n}') $(echo "$out" | awk '/Requests\/sec/ {print $2}')" >> "$WORK/results"
    kill "$E"; wait "$E" 2>/dev/null || true; E=""
  done
done
echo "Envoy CPU per request (us), $ROUNDS rounds of ${SECS}s: min / median / max, and the minimum over the floor's"
echo
echo "| variant | CPU per request (us) | over none (mins) | requests/s (median) |"
echo "|---|---|---|---|"
floor=$(awk '$1 == "none" {print $2}' "$WORK/results" | sort -n | head -1)
for v in "${VARIANTS[@]}"; do
  cpu=$(awk -v v="$v" '$1 == v {print $2}' "$WORK/results" | sort -n | awk '{a[NR] = $1}
    END {m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.1f / %.1f / %.1f %.1f", a[1], m, a[NR], a[1]}')
  rps=$(awk -v v="$v" '$1 == v {print $3}' "$WORK/results" | sort -n | awk '{a[NR] = $1}
    END {printf "%.0f", (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
  printf "| %s | %s | %+.1f | %s |\n" "$v" "${cpu% *}" "$(echo "${cpu##* } - ${floor:-0}" | bc -l)" "$rps"
done
