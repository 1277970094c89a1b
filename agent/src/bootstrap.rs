//! Envoy's bootstrap (`./etc/istio/proxy/envoy-rev.json`), laid out as Istio's
//! `tools/packaging/common/envoy_bootstrap.json` renders it: admin on loopback, ADS over the
//! agent's unix socket, the `prometheus_stats`/`agent`/`xds-grpc`/`sds-grpc` static clusters and
//! the 15090 (stats; the proxy module's `istio.stats_flush` first, so a scrape sees the TCP
//! metrics up to itself) and 15021 (readiness) listeners.
//!
//! Built as a JSON value, never by text templating, so env- or annotation-derived strings
//! (pod name, metadata) cannot add fields.

mod features;

use serde_json::{Value, json};

use crate::config::Config;
use crate::config::features::CompliancePolicy;

pub use crate::config::ports::{ENVOY_STATUS as ENVOY_STATUS_PORT, PROMETHEUS as PROMETHEUS_PORT};
const SDS_SOCKET: &str = "./var/run/secrets/workload-spiffe-uds/socket";

fn socket_address(ip: &str, port: u16) -> Value {
    json!({ "socket_address": { "protocol": "TCP", "address": ip, "port_value": port } })
}

/// Istio ends every stat prefix it writes with `;` (its tag regexes rely on it): a static
/// cluster's stats are `cluster.NAME;.*`, so they get the `cluster_name` tag.
fn alt_stat_name(name: &str) -> String {
    format!("{name};")
}

fn static_cluster(name: &str, ip: &str, port: u16) -> Value {
    json!({
        "name": name,
        "alt_stat_name": alt_stat_name(name),
        "type": "STATIC",
        "connect_timeout": "0.250s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": socket_address(ip, port) } }] }]
        }
    })
}

/// A gRPC cluster's upstream protocol: HTTP/2 only.
fn http2_only() -> Value {
    json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": { "http2_protocol_options": {} }
        }
    })
}

fn pipe_cluster(name: &str, path: &str, extra: Value) -> Value {
    let mut c = json!({
        "name": name,
        "alt_stat_name": alt_stat_name(name),
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "typed_extension_protocol_options": http2_only(),
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": { "pipe": { "path": path } } } }] }]
        }
    });
    if let (Some(obj), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        obj.extend(extra.clone());
    }
    c
}

/// A protobuf JSON duration: `10s` for whole seconds (as Istio writes them), else
/// `10.500000000s`.
fn proto_duration(d: std::time::Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
    }
}

/// ProxyConfig tracing.zipkin as Istio's bootstrap writes it: a STRICT_DNS `zipkin` cluster
/// (refreshed at `--dnsRefreshRate`, 30s unset) and Envoy's Zipkin tracer posting JSON v2 spans to
/// it. The tracer only records spans of HTTP listeners whose connection manager turns tracing on.
fn zipkin(address: &str, cfg: &Config, ipv6: bool) -> Option<(Value, Value)> {
    let (host, port) = address.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let cluster = json!({
        "name": "zipkin",
        "alt_stat_name": alt_stat_name("zipkin"),
        "type": "STRICT_DNS",
        "respect_dns_ttl": true,
        "dns_lookup_family": if ipv6 { "V6_ONLY" } else { "V4_ONLY" },
        "dns_refresh_rate": proto_duration(cfg.dns_refresh_rate),
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": "zipkin",
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address":
                { "socket_address": { "address": host, "port_value": port } } } }] }]
        }
    });
    let tracing = json!({
        "http": {
            "name": "envoy.tracers.zipkin",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig",
                "collector_cluster": "zipkin",
                "collector_endpoint": "/api/v2/spans",
                "collector_endpoint_version": "HTTP_JSON",
                "trace_id_128bit": true,
                "shared_span_context": false
            }
        }
    });
    Some((cluster, tracing))
}

/// A static HTTP listener routing one path prefix to one cluster. In a pod with an IPv6
/// address it listens on `::` and also accepts IPv4 (`ipv4_compat`), so kubelet can probe 15021
/// over either family.
fn static_listener(
    port: u16,
    stat_prefix: &str,
    prefix: &str,
    cluster: &str,
    ipv6: bool,
    filters: Vec<Value>,
) -> Value {
    let address = if ipv6 {
        json!({ "socket_address": { "protocol": "TCP", "address": "::", "port_value": port, "ipv4_compat": true } })
    } else {
        socket_address("0.0.0.0", port)
    };
    json!({
        "name": format!("0.0.0.0_{port}"),
        "address": address,
        "ignore_global_conn_limit": true,
        "bypass_overload_manager": true,
        "filter_chains": [{ "filters": [http_connection_manager(stat_prefix, &[(prefix, cluster)], filters)] }]
    })
}

/// The connection manager of a static listener: `routes` (path prefix, cluster) on any host,
/// `filters` then the router.
fn http_connection_manager(
    stat_prefix: &str,
    routes: &[(&str, &str)],
    filters: Vec<Value>,
) -> Value {
    let router = json!({
        "name": "envoy.filters.http.router",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
    });
    let routes: Vec<Value> = routes
        .iter()
        .map(|(prefix, cluster)| json!({ "match": { "prefix": prefix }, "route": { "cluster": cluster } }))
        .collect();
    json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "codec_type": "AUTO",
            "stat_prefix": stat_prefix,
            "route_config": { "virtual_hosts": [{ "name": "backend", "domains": ["*"], "routes": routes }] },
            "http_filters": filters.into_iter().chain([router]).collect::<Vec<_>>()
        }
    })
}

/// 15021, Envoy's readiness through the agent; with ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL it
/// also takes (never requires) a PROXY protocol header, as from a load balancer's health check.
fn status_listener(cfg: &Config, ipv6: bool) -> Value {
    let mut l = static_listener(
        ENVOY_STATUS_PORT,
        "agent",
        "/healthz/ready",
        "agent",
        ipv6,
        Vec::new(),
    );
    if cfg.features.status_port_proxy_protocol {
        l["listener_filters"] = json!([{
            "name": "envoy.listener.proxy_protocol",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol",
                "allow_requests_without_proxy_protocol": true
            }
        }]);
    }
    l
}

/// Istio's tag extraction (tools/packaging/common/envoy_bootstrap.json): the tags ahead of the
/// extra stat tags, then those after them. Envoy's default tags are off, as in Istio.
const TAGS_BEFORE: [(&str, &str); 9] = [
    ("cluster_name", r"^cluster(\.(.+);)"),
    (
        "http_conn_manager_prefix",
        r"^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)",
    ),
    ("thread_name", r"^server(\.(.+))\.watchdog"),
    ("tcp_prefix", r"^tcp\.((.*?)\.)\w+?$"),
    ("response_code", r"_rq(_(\d{3}))$"),
    ("response_code_class", r"_rq(_(\dxx))$"),
    (
        "http_conn_manager_listener_prefix",
        r"^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
    ),
    (
        "listener_address",
        r"^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
    ),
    (
        "mongo_prefix",
        r"^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$",
    ),
];
const TAGS_AFTER: [(&str, &str); 7] = [
    ("cache", r"(cache\.(.+?)\.)"),
    ("component", r"(component\.(.+?)\.)"),
    ("tag", r"(tag\.(.+?);\.)"),
    ("wasm_filter", r"(wasm_filter\.(.+?)\.)"),
    ("authz_enforce_result", r"rbac(\.(allowed|denied))"),
    ("authz_dry_run_action", r"(\.istio_dry_run_(allow|deny)_)"),
    ("authz_dry_run_result", r"(\.shadow_(allowed|denied))"),
];

/// `stats_config`: Istio's tag extraction and inclusion list (`config::stats`). The template's
/// own entries frame the list: `reporter=` (Istio's standard metrics) first, `component` and
/// `istio` last.
fn stats_config(cfg: &Config) -> Value {
    let s = &cfg.stats;
    let tag = |name: &str, regex: &str| json!({ "tag_name": name, "regex": regex });
    let extra = s
        .extra_tags
        .iter()
        .map(|t| tag(t, &format!(r"({t}=\.=(.*?);\.;)")));
    let stats_tags: Vec<Value> = TAGS_BEFORE
        .iter()
        .map(|(n, r)| tag(n, r))
        .chain(extra)
        .chain(TAGS_AFTER.iter().map(|(n, r)| tag(n, r)))
        .collect();
    let patterns: Vec<Value> = std::iter::once(json!({ "prefix": "reporter=" }))
        .chain(s.prefixes.iter().map(|p| json!({ "prefix": p })))
        .chain(s.suffixes.iter().map(|p| json!({ "suffix": p })))
        .chain(
            s.regexps
                .iter()
                .map(|r| json!({ "safe_regex": { "regex": r } })),
        )
        .chain([
            json!({ "prefix": "component" }),
            json!({ "prefix": "istio" }),
        ])
        .collect();
    let mut config = json!({
        "use_all_default_tags": false,
        "stats_tags": stats_tags,
        "stats_matcher": { "inclusion_list": { "patterns": patterns } }
    });
    if !s.histogram_buckets.is_empty() {
        config["histogram_bucket_settings"] = s
            .histogram_buckets
            .iter()
            .map(|(prefix, buckets)| {
                // Whole bounds as integers, as Istio writes them (`1`, not `1.0`).
                let buckets: Vec<Value> = buckets
                    .iter()
                    .map(|b| {
                        if b.fract() == 0.0 && b.abs() < 1e15 {
                            json!(*b as i64)
                        } else {
                            json!(b)
                        }
                    })
                    .collect();
                json!({ "match": { "prefix": prefix }, "buckets": buckets })
            })
            .collect();
    }
    config
}

/// Istio compresses what 15090 serves when the scraper accepts it (ProxyConfig statsCompression,
/// default on): brotli, zstd, gzip, in Istio's order.
fn stats_compressors() -> Vec<Value> {
    [
        ("brotli", "brotli.compressor.v3.Brotli"),
        ("zstd", "zstd.compressor.v3.Zstd"),
        ("gzip", "gzip.compressor.v3.Gzip"),
    ]
    .iter()
    .map(|(name, library)| {
        json!({
            "name": format!("envoy.filters.http.compressor.{name}"),
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor",
                "compressor_library": {
                    "name": format!("stats_{name}"),
                    "typed_config": { "@type": format!("type.googleapis.com/envoy.extensions.compression.{library}") }
                },
                "response_direction_config": { "common_config": { "content_type": [
                    "text/plain", "application/vnd.google.protobuf",
                    "application/openmetrics-text", "application/openmetrics-protobuf"
                ] } }
            }
        })
    })
    .collect()
}

/// The version of Istio whose control plane and config this sidecar is proven against (the
/// release-1.31 build the tests run): istiod decides by the proxy's ISTIO_VERSION what it may
/// send, so the crate's own version (0.x) would make it send the oldest forms.
pub const ISTIO_COMPAT_VERSION: &str = "1.31.0";

/// Envoy runtime: Istio's defaults (pkg/bootstrap/config.go `extractRuntimeFlags`), then
/// ProxyConfig runtimeValues (`"true"`/`"false"` as booleans, `""` removes a default).
fn runtime_flags(cfg: &Config) -> Value {
    let mut flags = json!({
        // The proxy module's metrics under their own names (`istio_requests_total`).
        mesh_common::module::STRIP_PREFIX_FLAG: true,
        "re2.max_program_size.error_level": "32768",
        "envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst": true,
        "envoy.reloadable_features.http_reject_path_with_fragment": false,
        "envoy.reloadable_features.fixed_heap_use_allocated": true,
        "envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update": false
    });
    if let Some(flags) = flags.as_object_mut() {
        if cfg.features.compliance == Some(CompliancePolicy::Fips1402) {
            flags.insert(
                "envoy.reloadable_features.google_grpc_disable_tls_13".into(),
                true.into(),
            );
        }
        for (k, v) in &cfg.runtime_values {
            let value = match v.as_str() {
                "" => {
                    flags.remove(k);
                    continue;
                }
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                other => other.into(),
            };
            flags.insert(k.clone(), value);
        }
    }
    flags
}

/// The overload manager's global downstream connection cap: the node metadata's
/// GLOBAL_DOWNSTREAM_MAX_CONNECTIONS (`ISTIO_META_...`, Istio 1.29), else ProxyConfig
/// runtimeValues `overload.global_downstream_max_connections`, else unlimited (as Istio).
fn global_downstream_max_connections(cfg: &Config) -> i64 {
    let parsed = |v: &str| v.trim().parse::<i64>().ok();
    cfg.metadata
        .iter()
        .find(|(k, _)| k == "GLOBAL_DOWNSTREAM_MAX_CONNECTIONS")
        .and_then(|(_, v)| parsed(v))
        .or_else(|| {
            cfg.runtime_values
                .get("overload.global_downstream_max_connections")
                .and_then(|v| parsed(v))
        })
        .unwrap_or(i64::from(i32::MAX))
}

/// `node.locality` with only the keys that are set, as Istio writes it.
fn locality(cfg: &Config) -> Value {
    let l = &cfg.locality;
    let keys = [
        ("region", &l.region),
        ("zone", &l.zone),
        ("sub_zone", &l.sub_zone),
    ];
    Value::Object(
        keys.iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect(),
    )
}

/// This proxy as the proxy module is told it (Envoy's node id, metadata and locality).
pub fn module_node(cfg: &Config) -> mesh_common::module::Node {
    let mut metadata = match node_metadata(cfg) {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    // The canonical labels Istio's injector puts on a pod, for a workload started without them.
    let own = crate::workload::Workload::own(cfg);
    if let Value::Object(labels) = metadata
        .entry("LABELS")
        .or_insert_with(|| Value::Object(serde_json::Map::new()))
    {
        for (k, v) in [
            (crate::workload::CANONICAL_NAME, &own.canonical_service),
            (crate::workload::CANONICAL_REVISION, &own.canonical_revision),
        ] {
            labels.entry(k).or_insert_with(|| v.clone().into());
        }
    }
    mesh_common::module::Node {
        id: cfg.node_id(),
        metadata,
        region: cfg.locality.region.clone(),
        zone: cfg.locality.zone.clone(),
    }
}

/// The proxy module's filter that moves the TCP metrics counted since the last scrape into
/// Envoy's labelled counters, ahead of the Prometheus listener's router.
fn stats_flush() -> Value {
    use mesh_common::module::{METRICS_NAMESPACE, NAME, filter};
    json!({
        "name": filter::STATS_FLUSH,
        "typed_config": {
            "@type": mesh_common::telemetry::module_filters::HTTP_TYPE,
            "dynamic_module_config": {
                "name": NAME,
                "do_not_close": true,
                "metrics_namespace": METRICS_NAMESPACE
            },
            "filter_name": filter::STATS_FLUSH
        }
    })
}

fn node_metadata(cfg: &Config) -> Value {
    let mut meta = serde_json::Map::new();
    for (k, v) in &cfg.metadata {
        meta.insert(k.clone(), Value::String(v.clone()));
    }
    let ips: Vec<String> = cfg.instance_ips.iter().map(ToString::to_string).collect();
    meta.insert("NAME".into(), cfg.pod_name.clone().into());
    meta.insert("NAMESPACE".into(), cfg.pod_namespace.clone().into());
    meta.insert("SERVICE_ACCOUNT".into(), cfg.service_account.clone().into());
    meta.insert("INSTANCE_IPS".into(), ips.join(",").into());
    meta.insert("ENVOY_STATUS_PORT".into(), ENVOY_STATUS_PORT.into());
    meta.insert("ENVOY_PROMETHEUS_PORT".into(), PROMETHEUS_PORT.into());
    meta.insert("ISTIO_VERSION".into(), ISTIO_COMPAT_VERSION.into());
    // What Istio's agent adds to every proxy's metadata.
    if cfg.features.skip_deprecated_logs {
        meta.insert("ENVOY_SKIP_DEPRECATED_LOGS".into(), "true".into());
    }
    for (key, port) in [
        (
            "ENVOY_SECURE_METRICS_PORT",
            cfg.features.secure_metrics_port,
        ),
        (
            "ENVOY_SECURE_MERGED_METRICS_PORT",
            cfg.features.secure_merged_metrics_port,
        ),
    ] {
        if let Some(port) = port {
            meta.insert(key.into(), port.into());
        }
    }
    meta.insert("METADATA_DISCOVERY".into(), "false".into());
    meta.insert("WORKLOAD_IDENTITY_SOCKET_FILE".into(), "socket".into());
    if let Some(client) = cfg.xds_client.as_ref().filter(|c| c.tls) {
        meta.insert("PILOT_SAN".into(), json!([client.server_name]));
    }
    // Istio leaves out what is empty.
    if !cfg.labels.is_empty() {
        meta.insert("LABELS".into(), json!(cfg.labels));
    }
    if !cfg.annotations.is_empty() {
        meta.insert("ANNOTATIONS".into(), json!(cfg.annotations));
    }
    meta.insert("PROXY_CONFIG".into(), cfg.proxy_config_json.clone());
    if cfg.exit_on_zero_active_connections {
        meta.insert("EXIT_ON_ZERO_ACTIVE_CONNECTIONS".into(), "true".into());
    }
    for (k, v) in &cfg.metadata_json {
        meta.insert(k.clone(), v.clone());
    }
    Value::Object(meta)
}

/// Merges `overlay` into `base`: objects key by key, anything else replaced.
fn deep_merge(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                deep_merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// The bootstrap for `cfg`, with the custom template fragment (if any) merged over it.
pub fn render(cfg: &Config) -> Value {
    let mut b = render_default(cfg);
    if let Some(t) = &cfg.bootstrap_template {
        deep_merge(&mut b, t);
    }
    b
}

fn render_default(cfg: &Config) -> Value {
    let ipv6 = cfg.instance_ips.iter().any(std::net::IpAddr::is_ipv6);
    let mut b = render_base(cfg, ipv6);
    if let Some((cluster, tracing)) = cfg
        .zipkin_address
        .as_deref()
        .and_then(|a| zipkin(a, cfg, ipv6))
    {
        if let Some(clusters) = b
            .pointer_mut("/static_resources/clusters")
            .and_then(Value::as_array_mut)
        {
            clusters.push(cluster);
        }
        if let Some(obj) = b.as_object_mut() {
            obj.insert("tracing".into(), tracing);
        }
    }
    b
}

fn render_base(cfg: &Config, ipv6: bool) -> Value {
    let xds_socket = cfg.xds_socket_path().display().to_string();
    let ads_source =
        json!({ "ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3" });
    let mut b = json!({
        "application_log_config": {
            "log_format": { "text_format": "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t" }
        },
        "bootstrap_extensions": [{
            "name": "envoy.bootstrap.internal_listener",
            "typed_config": {
                "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
                "type_url": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener",
                "value": { "buffer_size_kb": 64 }
            }
        }],
        "stats_config": stats_config(cfg),
        // Stats objects are created on first use: Istio's setting, less memory per cluster.
        "deferred_stat_options": { "enable_deferred_creation_stats": true },
        "node": {
            "id": cfg.node_id(),
            "cluster": cfg.service_cluster,
            "locality": locality(cfg),
            "metadata": node_metadata(cfg)
        },
        "layered_runtime": {
            "layers": [
                { "name": "global config", "static_layer": runtime_flags(cfg) },
                { "name": "admin", "admin_layer": {} }
            ]
        },
        "overload_manager": {
            "resource_monitors": [{
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                    "max_active_downstream_connections": global_downstream_max_connections(cfg)
                }
            }]
        },
        "admin": {
            "access_log": [{
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": "/dev/null"
                }
            }],
            "profile_path": "/var/lib/istio/data/envoy.prof",
            "address": { "socket_address": { "address": "127.0.0.1", "port_value": cfg.admin_port } }
        },
        "dynamic_resources": {
            "lds_config": ads_source,
            "cds_config": ads_source,
            "ads_config": {
                "api_type": if cfg.delta_xds { "DELTA_GRPC" } else { "GRPC" },
                "set_node_on_first_message_only": true,
                "transport_api_version": "V3",
                "grpc_services": [{ "envoy_grpc": { "cluster_name": "xds-grpc" } }]
            }
        },
        "static_resources": {
            "clusters": [
                static_cluster("prometheus_stats", "127.0.0.1", cfg.admin_port),
                static_cluster("agent", "127.0.0.1", cfg.status_port),
                pipe_cluster("sds-grpc", SDS_SOCKET, json!({})),
                pipe_cluster("xds-grpc", &xds_socket, json!({
                    "circuit_breakers": { "thresholds": [
                        { "priority": "DEFAULT", "max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000 },
                        { "priority": "HIGH", "max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000 }
                    ] },
                    "upstream_connection_options": { "tcp_keepalive": { "keepalive_time": 300 } },
                    "max_requests_per_connection": 1,
                    "connect_timeout": cfg.connect_timeout.map_or_else(|| "1s".to_string(), proto_duration)
                })),
            ],
            "listeners": [
                static_listener(PROMETHEUS_PORT, "stats", "/stats/prometheus", "prometheus_stats", ipv6,
                    std::iter::once(stats_flush())
                        .chain(cfg.features.stats_compression.then(stats_compressors).into_iter().flatten())
                        .collect()),
                status_listener(cfg, ipv6),
            ]
        }
    });
    features::add_secure_metrics_listeners(&mut b, &cfg.features);
    features::add_remote_services(&mut b, &cfg.features);
    if cfg.features.self_discovery {
        features::add_local_cluster(&mut b);
    }
    if let Some(obj) = b.as_object_mut() {
        if let Some(d) = cfg.stats.flush_interval {
            obj.insert("stats_flush_interval".into(), proto_duration(d).into());
        }
        if let Some(d) = cfg.stats.eviction_interval {
            obj.insert("stats_eviction_interval".into(), proto_duration(d).into());
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ProxyArgs};

    fn config(env: &[(&str, &str)]) -> Config {
        let vars: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = vars.clone();
        Config::from_env(
            &ProxyArgs {
                proxy_type: "sidecar".into(),
                config_dir: Some("/m".into()),
                ..Default::default()
            },
            &move |k| lookup.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            &vars,
            &|_| None,
        )
        .unwrap()
    }

    #[test]
    fn hostile_strings_stay_strings() {
        let evil = "x\",\"admin\":{\"address\":\"0.0.0.0\"},\"y\":\"{{";
        let b = render(&config(&[("POD_NAME", evil), ("ISTIO_META_FOO", evil)]));
        let text = serde_json::to_string(&b).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["node"]["metadata"]["NAME"], evil);
        assert_eq!(back["node"]["metadata"]["FOO"], evil);
        assert_eq!(
            back["admin"]["address"]["socket_address"]["address"],
            "127.0.0.1"
        );
    }

    #[test]
    fn zipkin_and_connect_timeout_as_istio_1_5_wrote_them() {
        let mut cfg = config(&[]);
        let b = render(&cfg);
        assert!(b.get("tracing").is_none());
        assert_eq!(
            b["static_resources"]["clusters"][3]["connect_timeout"],
            "1s"
        );
        cfg.zipkin_address = Some("zipkin.istio-system:9411".into());
        cfg.connect_timeout = Some(std::time::Duration::from_millis(10_500));
        cfg.dns_refresh_rate = std::time::Duration::from_secs(30);
        let b = render(&cfg);
        let clusters = b["static_resources"]["clusters"].as_array().unwrap();
        assert_eq!(clusters[3]["name"], "xds-grpc");
        assert_eq!(clusters[3]["connect_timeout"], "10.500000000s");
        let zipkin = clusters.iter().find(|c| c["name"] == "zipkin").unwrap();
        assert_eq!(zipkin["type"], "STRICT_DNS");
        assert_eq!(zipkin["dns_refresh_rate"], "30s");
        assert_eq!(
            zipkin["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
                ["address"],
            "zipkin.istio-system"
        );
        assert_eq!(
            b["tracing"]["http"]["typed_config"]["collector_cluster"],
            "zipkin"
        );
    }

    #[test]
    fn dynamic_resources_do_not_block_startup() {
        let b = render(&config(&[]));
        assert_eq!(
            b["dynamic_resources"]["lds_config"]["initial_fetch_timeout"],
            "0s"
        );
        assert_eq!(
            b["dynamic_resources"]["cds_config"]["initial_fetch_timeout"],
            "0s"
        );
        assert_eq!(
            b["static_resources"]["clusters"][3]["load_assignment"]["endpoints"][0]["lb_endpoints"]
                [0]["endpoint"]["address"]["pipe"]["path"],
            "./etc/istio/proxy/XDS"
        );
    }
}
