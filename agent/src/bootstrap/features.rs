//! The bootstrap pieces of Istio 1.28–1.31's agent features (`config::features`): the mTLS
//! metrics listeners and the `local_cluster` of self discovery, as Istio's template writes them.

use serde_json::{Value, json};

use crate::config::features::EnvoyFeatures;

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
