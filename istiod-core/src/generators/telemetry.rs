//! Istio's standard metrics without Istio's `istio.stats` filter: every sidecar HTTP connection
//! manager and tcp_proxy gets an OpenTelemetry access logger (upstream Envoy's
//! `envoy.access_loggers.open_telemetry`) that sends, per request or connection, the facts the
//! metrics' labels come from (peer and local URI SANs, cluster, authority, response code and
//! flags, duration, bytes) to the agent over gRPC. The agent turns them into
//! `istio_requests_total` and the rest (`pilot_agent::telemetry`). Mirrors where Istio puts its
//! stats filter (`pilot/pkg/networking/core/..., model/telemetry.go`): inbound listeners report as
//! `destination`, outbound ones as `source`.
//!
//! The OpenTelemetry logger rather than the gRPC access-log service (ALS): ALS entries carry the
//! downstream TLS peer but not the upstream one, so a client sidecar could not report the
//! server's identity; the OpenTelemetry logger takes Envoy's format commands
//! (`%UPSTREAM_PEER_URI_SAN%`), so each side reports both identities as Istio's filter does.

use envoy_types::pb::envoy::config::accesslog::v3::{AccessLog, access_log};
use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::access_loggers::open_telemetry::v3::OpenTelemetryAccessLogConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
use envoy_types::pb::opentelemetry::proto::common::v1::{
    AnyValue, KeyValue, KeyValueList, any_value,
};
use envoy_types::util::pack_any;
use prost::Message;

use crate::config_store::MeshConfigSpec;

/// The static cluster of the agent's bootstrap that reaches the agent's telemetry socket.
pub const CLUSTER: &str = "agent-telemetry";

/// Envoy's name of the access logger.
const LOGGER: &str = "envoy.access_loggers.open_telemetry";

/// How often a long TCP connection reports its bytes so far (Istio's default
/// `tcp_reporting_duration`, 15 s).
const TCP_REPORT_SECONDS: i64 = 15;

/// The attribute names of each log record, shared with the agent that reads them.
pub mod attr {
    /// `source` (an outbound listener) or `destination` (inbound): Istio's `reporter`.
    pub const REPORTER: &str = "reporter";
    /// `http` or `tcp`.
    pub const KIND: &str = "kind";
    /// The URI SANs (comma-separated) of the other side's certificate: the client's on inbound,
    /// the server's on outbound.
    pub const PEER_SAN: &str = "peer_san";
    /// The URI SANs of this side's own certificate on that connection.
    pub const LOCAL_SAN: &str = "local_san";
    pub const CLUSTER: &str = "cluster";
    /// Istio's endpoint metadata `istio.workload` (`name;namespace;service;revision;cluster`),
    /// where a control plane sets it.
    pub const ENDPOINT: &str = "endpoint";
    /// Istio's cluster metadata `istio.services` (a JSON list of `{host, name, namespace}`),
    /// where a control plane sets it: the service of an inbound cluster.
    pub const SERVICES: &str = "services";
    pub const AUTHORITY: &str = "authority";
    pub const CONTENT_TYPE: &str = "content_type";
    pub const RESPONSE_CODE: &str = "response_code";
    pub const GRPC_STATUS: &str = "grpc_status";
    pub const RESPONSE_FLAGS: &str = "response_flags";
    pub const DURATION_MS: &str = "duration_ms";
    pub const RECEIVED_BYTES: &str = "received_bytes";
    pub const SENT_BYTES: &str = "sent_bytes";
    /// TCP: `TcpPeriodic` or `TcpConnectionEnd`.
    pub const LOG_TYPE: &str = "log_type";
    /// TCP: Envoy's downstream connection id, to relate a connection's records.
    pub const CONNECTION: &str = "connection";
}

/// Which side of a request a listener reports as (Istio's `reporter` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reporter {
    /// An outbound listener: the client's sidecar.
    Source,
    /// An inbound listener: the server's sidecar.
    Destination,
}

impl Reporter {
    pub fn label(self) -> &'static str {
        match self {
            Reporter::Source => "source",
            Reporter::Destination => "destination",
        }
    }
}

fn string(value: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(value.to_string())),
    }
}

fn attributes(reporter: Reporter, kind: &str, extra: &[(&str, &str)]) -> KeyValueList {
    // The TLS peer is the downstream client on inbound, the upstream server on outbound.
    let (peer, local) = match reporter {
        Reporter::Destination => ("%DOWNSTREAM_PEER_URI_SAN%", "%DOWNSTREAM_LOCAL_URI_SAN%"),
        Reporter::Source => ("%UPSTREAM_PEER_URI_SAN%", "%UPSTREAM_LOCAL_URI_SAN%"),
    };
    let common = [
        (attr::REPORTER, reporter.label()),
        (attr::KIND, kind),
        (attr::PEER_SAN, peer),
        (attr::LOCAL_SAN, local),
        // The cluster's name: `%UPSTREAM_CLUSTER%` is its `alt_stat_name`, which istiod sets to
        // the name plus `;` (its stats delimiter).
        (attr::CLUSTER, "%UPSTREAM_CLUSTER_RAW%"),
        (attr::ENDPOINT, "%UPSTREAM_METADATA(istio:workload)%"),
        (attr::SERVICES, "%CLUSTER_METADATA(istio:services)%"),
        (attr::RESPONSE_FLAGS, "%RESPONSE_FLAGS%"),
        (attr::RECEIVED_BYTES, "%DOWNSTREAM_WIRE_BYTES_RECEIVED%"),
        (attr::SENT_BYTES, "%DOWNSTREAM_WIRE_BYTES_SENT%"),
    ];
    KeyValueList {
        values: common
            .iter()
            .chain(extra)
            .map(|(k, v)| KeyValue {
                key: k.to_string(),
                value: Some(string(v)),
                ..Default::default()
            })
            .collect(),
    }
}

fn logger(reporter: Reporter, attributes: KeyValueList) -> AccessLog {
    let config = OpenTelemetryAccessLogConfig {
        grpc_service: Some(GrpcService {
            target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                grpc_service::EnvoyGrpc {
                    cluster_name: CLUSTER.to_string(),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        log_name: match reporter {
            Reporter::Source => "outbound",
            Reporter::Destination => "inbound",
        }
        .to_string(),
        // Node name, zone and cluster on every batch: the agent knows them already.
        disable_builtin_labels: true,
        attributes: Some(attributes),
        // Batches of up to 64 KiB, at least once a second (Envoy's defaults are 16 KiB, 1 s).
        buffer_size_bytes: Some(UInt32Value { value: 64 * 1024 }),
        ..Default::default()
    };
    AccessLog {
        name: LOGGER.to_string(),
        config_type: Some(access_log::ConfigType::TypedConfig(pack_any(config))),
        ..Default::default()
    }
}

/// The access logger of an HTTP connection manager reporting as `reporter`.
pub fn http_access_log(reporter: Reporter) -> AccessLog {
    logger(
        reporter,
        attributes(
            reporter,
            "http",
            &[
                (attr::AUTHORITY, "%REQ(:AUTHORITY)%"),
                (attr::CONTENT_TYPE, "%REQ(CONTENT-TYPE)%"),
                (attr::RESPONSE_CODE, "%RESPONSE_CODE%"),
                (attr::GRPC_STATUS, "%GRPC_STATUS_NUMBER%"),
                (attr::DURATION_MS, "%DURATION%"),
            ],
        ),
    )
}

/// The access logger of a tcp_proxy reporting as `reporter`. The tcp_proxy must also log every
/// so often (`tcp_access_log_options`), or a long connection reports nothing until it closes.
pub fn tcp_access_log(reporter: Reporter) -> AccessLog {
    logger(
        reporter,
        attributes(
            reporter,
            "tcp",
            &[
                (attr::LOG_TYPE, "%ACCESS_LOG_TYPE%"),
                (attr::CONNECTION, "%CONNECTION_ID%"),
            ],
        ),
    )
}

/// The tcp_proxy options that make it report a connection every [`TCP_REPORT_SECONDS`] while
/// it lasts, not only when it closes. Not when the upstream connects: on an inbound mTLS chain
/// tcp_proxy dials the app before the client's TLS handshake is done, so that record would
/// carry no client certificate (Istio's filter likewise waits for the peer, or the close).
pub fn tcp_access_log_options() -> tcp_proxy::TcpAccessLogOptions {
    tcp_proxy::TcpAccessLogOptions {
        access_log_flush_interval: Some(Duration {
            seconds: TCP_REPORT_SECONDS,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// Whether the mesh wants Istio's standard metrics: MeshConfig `defaultProviders.metrics` unset
/// (Istio's default is Prometheus) or naming `prometheus`. `defaultProviders: {metrics: []}`
/// turns them off, as it turns off Istio's stats filter.
pub fn enabled(mesh: &MeshConfigSpec) -> bool {
    match mesh
        .rest
        .get("defaultProviders")
        .and_then(|p| p.get("metrics"))
    {
        None | Some(serde_json::Value::Null) => true,
        Some(serde_json::Value::Array(names)) => {
            names.iter().any(|n| n.as_str() == Some("prometheus"))
        }
        Some(_) => true,
    }
}

/// Adds the access logger to every HTTP connection manager and tcp_proxy of `listener`.
pub fn instrument(listener: &mut Listener, reporter: Reporter) {
    for chain in &mut listener.filter_chains {
        for f in &mut chain.filters {
            let Some(filter::ConfigType::TypedConfig(any)) = &mut f.config_type else {
                continue;
            };
            let added = match f.name.as_str() {
                "envoy.filters.network.http_connection_manager" => {
                    HttpConnectionManager::decode(any.value.as_slice())
                        .ok()
                        .map(|mut hcm| {
                            hcm.access_log.push(http_access_log(reporter));
                            hcm.encode_to_vec()
                        })
                }
                "envoy.filters.network.tcp_proxy" => {
                    TcpProxy::decode(any.value.as_slice()).ok().map(|mut tcp| {
                        tcp.access_log.push(tcp_access_log(reporter));
                        tcp.access_log_options = Some(tcp_access_log_options());
                        tcp.encode_to_vec()
                    })
                }
                _ => None,
            };
            if let Some(value) = added {
                any.value = value;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn mesh(yaml: &str) -> MeshConfigSpec {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn default_providers_turn_metrics_off() {
        assert!(enabled(&MeshConfigSpec::default()));
        assert!(enabled(&mesh("defaultProviders: {metrics: [prometheus]}")));
        assert!(!enabled(&mesh("defaultProviders: {metrics: []}")));
        assert!(!enabled(&mesh(
            "defaultProviders: {metrics: [stackdriver]}"
        )));
    }

    #[test]
    fn each_side_reports_the_other_sides_certificate() {
        let attrs = |log: AccessLog| {
            let Some(access_log::ConfigType::TypedConfig(any)) = log.config_type else {
                panic!("untyped");
            };
            let cfg = OpenTelemetryAccessLogConfig::decode(any.value.as_slice()).unwrap();
            cfg.attributes
                .unwrap()
                .values
                .into_iter()
                .map(|kv| match kv.value.and_then(|v| v.value) {
                    Some(any_value::Value::StringValue(s)) => (kv.key, s),
                    other => panic!("{other:?}"),
                })
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let inbound = attrs(http_access_log(Reporter::Destination));
        assert_eq!(inbound[attr::PEER_SAN], "%DOWNSTREAM_PEER_URI_SAN%");
        assert_eq!(inbound[attr::REPORTER], "destination");
        let outbound = attrs(tcp_access_log(Reporter::Source));
        assert_eq!(outbound[attr::PEER_SAN], "%UPSTREAM_PEER_URI_SAN%");
        assert_eq!(outbound[attr::LOG_TYPE], "%ACCESS_LOG_TYPE%");
    }
}
