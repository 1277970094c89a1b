//! The bootstrap pieces of Istio 1.28–1.31's agent features (`config::features`): the mTLS
//! metrics listeners and the `local_cluster` of self discovery, as Istio's template writes them.

use serde_json::{Value, json};

use crate::config::features::{EnvoyFeatures, Service};

/// SDS from the agent (the `sds-grpc` cluster) for secret `name`, as Istio's template asks it.
fn sds(name: &str) -> Value {
    json!({
        "name": name,
        "sds_config": {
            "api_config_source": {
                "api_type": "GRPC",
                "grpc_services": [{ "envoy_grpc": { "cluster_name": "sds-grpc" } }],
                "set_node_on_first_message_only": true,
                "transport_api_version": "V3"
            },
            "resource_api_version": "V3"
        }
    })
}

/// A metrics listener that takes only TLS from a client with a certificate of the mesh (any
/// identity chaining to the mesh root, as Istio: no SAN check), serving `routes` (path prefix,
/// cluster). Like 15090 it bypasses the connection limits.
fn secure_listener(port: u16, stat_prefix: &str, routes: &[(&str, &str)]) -> Value {
    json!({
        "name": format!("0.0.0.0_{port}"),
        "address": { "socket_address": { "protocol": "TCP", "address": "0.0.0.0", "port_value": port } },
        "ignore_global_conn_limit": true,
        "bypass_overload_manager": true,
        "listener_filters": [{
            "name": "envoy.filters.listener.tls_inspector",
            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector" }
        }],
        "filter_chains": [{
            "filter_chain_match": { "transport_protocol": "tls" },
            "transport_socket": {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                    "require_client_certificate": true,
                    "common_tls_context": {
                        "tls_certificate_sds_secret_configs": [sds("default")],
                        "combined_validation_context": {
                            "default_validation_context": {},
                            "validation_context_sds_secret_config": sds("ROOTCA")
                        }
                    }
                }
            },
            "filters": [super::http_connection_manager(stat_prefix, routes, Vec::new())]
        }]
    })
}

/// ENVOY_SECURE_METRICS_PORT (Envoy's 15090 content) and ENVOY_SECURE_MERGED_METRICS_PORT (the
/// agent's merged metrics) as mTLS listeners.
pub fn add_secure_metrics_listeners(b: &mut Value, f: &EnvoyFeatures) {
    let mut added = Vec::new();
    if let Some(port) = f.secure_metrics_port {
        added.push(secure_listener(
            port,
            "secure_stats",
            &[("/stats/prometheus", "prometheus_stats")],
        ));
    }
    if let Some(port) = f.secure_merged_metrics_port {
        added.push(secure_listener(
            port,
            "secure_merged_stats",
            &[("/stats/prometheus", "agent"), ("/metrics", "agent")],
        ));
    }
    if let Some(listeners) = b
        .pointer_mut("/static_resources/listeners")
        .and_then(Value::as_array_mut)
    {
        listeners.extend(added);
    }
}

/// ISTIO_META_ENABLE_SELF_DISCOVERY: `local_cluster`, the proxy's own service from istiod's EDS,
/// named as Envoy's local cluster so zone-aware load balancing can weigh localities by it.
pub fn add_local_cluster(b: &mut Value) {
    let cluster = json!({
        "name": "local_cluster",
        "alt_stat_name": "local_cluster;",
        "type": "EDS",
        "connect_timeout": "1s",
        "eds_cluster_config": {
            "eds_config": { "ads": {}, "resource_api_version": "V3" },
            "service_name": "local_cluster"
        },
        "load_balancing_policy": { "policies": [{ "typed_extension_config": {
            "name": "envoy.load_balancing_policies.least_request",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
                "locality_lb_config": { "zone_aware_lb_config": { "min_cluster_size": "1" } }
            }
        } }] }
    });
    if let Some(clusters) = b
        .pointer_mut("/static_resources/clusters")
        .and_then(Value::as_array_mut)
    {
        clusters.push(cluster);
    }
    if let Some(obj) = b.as_object_mut() {
        obj.insert(
            "cluster_manager".into(),
            json!({ "local_cluster_name": "local_cluster", "enable_deferred_cluster_creation": true }),
        );
    }
}

/// A STRICT_DNS gRPC cluster (HTTP/2) for a ProxyConfig remote service, as Istio's template
/// writes `envoy_accesslog_service` and `envoy_metrics_service`.
fn service_cluster(name: &str, s: &Service) -> Value {
    let mut c = json!({
        "name": name,
        "alt_stat_name": super::alt_stat_name(name),
        "type": "STRICT_DNS",
        "respect_dns_ttl": true,
        "dns_lookup_family": "V4_ONLY",
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "typed_extension_protocol_options": super::http2_only(),
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": {
                "socket_address": { "address": s.host, "port_value": s.port }
            } } }] }]
        }
    });
    if let Some((probes, time, interval)) = s.keepalive {
        let mut k = serde_json::Map::new();
        // Istio's template writes the wrappers as objects; Envoy takes them.
        for (key, v) in [
            ("keepalive_probes", probes.map(u64::from)),
            ("keepalive_time", time),
            ("keepalive_interval", interval),
        ] {
            if let Some(v) = v {
                k.insert(key.into(), json!({ "value": v }));
            }
        }
        c["upstream_connection_options"] = json!({ "tcp_keepalive": k });
    }
    c
}

/// ProxyConfig statsdUdpAddress, envoyAccessLogService and envoyMetricsService: their clusters
/// and stats sinks. A statsd host is resolved once, here, as Istio's agent does; one that does
/// not resolve gets no sink (as Istio).
pub fn add_remote_services(b: &mut Value, f: &EnvoyFeatures) {
    let mut clusters = Vec::new();
    let mut sinks = Vec::new();
    if let Some(s) = &f.access_log_service {
        clusters.push(service_cluster("envoy_accesslog_service", s));
    }
    if let Some(s) = &f.metrics_service {
        clusters.push(service_cluster("envoy_metrics_service", s));
        sinks.push(json!({
            "name": "envoy.stat_sinks.metrics_service",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.metrics.v3.MetricsServiceConfig",
                "transport_api_version": "V3",
                "grpc_service": { "envoy_grpc": { "cluster_name": "envoy_metrics_service" } }
            }
        }));
    }
    if let Some((host, port)) = &f.statsd_udp_address {
        let resolved = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), *port))
            .ok()
            .and_then(|mut a| a.next());
        match resolved {
            Some(addr) => sinks.push(json!({
                "name": "envoy.stat_sinks.statsd",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.config.metrics.v3.StatsdSink",
                    "address": { "socket_address": { "address": addr.ip().to_string(), "port_value": addr.port() } }
                }
            })),
            None => tracing::warn!(%host, port, "statsdUdpAddress does not resolve: no statsd sink"),
        }
    }
    if let Some(list) = b
        .pointer_mut("/static_resources/clusters")
        .and_then(Value::as_array_mut)
    {
        list.extend(clusters);
    }
    if !sinks.is_empty() {
        b["stats_sinks"] = Value::Array(sinks);
    }
}
