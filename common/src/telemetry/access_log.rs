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
use envoy_types::pb::envoy::extensions::access_loggers::open_telemetry::v3::OpenTelemetryAccessLogConfig;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy;
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
use envoy_types::pb::opentelemetry::proto::common::v1::{
    AnyValue, KeyValue, KeyValueList, any_value,
};
use envoy_types::util::pack_any;

use super::{MetricsPlan, Reporter, Shape, attr, shape};

/// The static cluster of the agent's bootstrap that reaches the agent's telemetry socket.
pub const CLUSTER: &str = "agent-telemetry";

/// Envoy's name of the access logger.
const LOGGER: &str = "envoy.access_loggers.open_telemetry";

/// How often a long TCP connection reports its bytes so far (Istio's default
/// `tcp_reporting_duration`, 15 s).
const TCP_REPORT_SECONDS: i64 = 15;

/// A string attribute (a record's or a batch's): a literal or an Envoy command.
fn attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
        ..Default::default()
    }
}

/// The attributes of each record. What is the same for every record of a logger (the
/// reporter, the kind) goes once per batch instead ([`batch_attributes`]): every attribute is
/// formatted and encoded per request, on the request's core.
fn attributes(reporter: Reporter, extra: &[(&str, &str)]) -> KeyValueList {
    // The TLS peer is the downstream client on inbound, the upstream server on outbound.
    let (peer, local) = match reporter {
        Reporter::Destination => ("%DOWNSTREAM_PEER_URI_SAN%", "%DOWNSTREAM_LOCAL_URI_SAN%"),
        Reporter::Source => ("%UPSTREAM_PEER_URI_SAN%", "%UPSTREAM_LOCAL_URI_SAN%"),
    };
    let common = [
        (attr::PEER_SAN, peer),
        (attr::LOCAL_SAN, local),
        // The cluster's name: `%UPSTREAM_CLUSTER%` is its `alt_stat_name`, which istiod sets to
        // the name plus `;` (its stats delimiter).
        (attr::CLUSTER, "%UPSTREAM_CLUSTER_RAW%"),
        (attr::SERVICES, "%CLUSTER_METADATA(istio:services)%"),
        (attr::RESPONSE_FLAGS, "%RESPONSE_FLAGS%"),
        (attr::RECEIVED_BYTES, "%DOWNSTREAM_WIRE_BYTES_RECEIVED%"),
        (attr::SENT_BYTES, "%DOWNSTREAM_WIRE_BYTES_SENT%"),
    ];
    // The server's endpoint metadata names the server's workload: outbound only (an inbound
    // cluster's endpoint is the app, which has none).
    let endpoint = (reporter == Reporter::Source)
        .then_some((attr::ENDPOINT, "%UPSTREAM_METADATA(istio:workload)%"));
    KeyValueList {
        values: common
            .iter()
            .chain(endpoint.iter())
            .chain(extra)
            .map(|(k, v)| attribute(k, v))
            .collect(),
    }
}

/// The attributes of a logger's batches (OpenTelemetry resource attributes): its reporter and
/// kind, then the metrics' shape where overrides apply.
fn batch_attributes(reporter: Reporter, kind: &str, shape: &Shape) -> KeyValueList {
    let mut values = vec![
        attribute(attr::REPORTER, reporter.label()),
        attribute(attr::KIND, kind),
    ];
    if !shape.metrics.is_empty() {
        values.push(attribute(
            attr::SHAPE,
            &serde_json::to_string(shape).unwrap_or_default(),
        ));
    }
    KeyValueList { values }
}

fn logger(
    reporter: Reporter,
    kind: &str,
    mut attributes: KeyValueList,
    plan: &MetricsPlan,
) -> AccessLog {
    let (shape, commands) = shape(plan);
    attributes
        .values
        .extend(commands.iter().map(|(k, v)| attribute(k, v)));
    let resource_attributes = Some(batch_attributes(reporter, kind, &shape));
    let config = OpenTelemetryAccessLogConfig {
        grpc_service: Some(crate::envoy::envoy_grpc(CLUSTER, "")),
        log_name: match reporter {
            Reporter::Source => "outbound",
            Reporter::Destination => "inbound",
        }
        .to_string(),
        // Node name, zone and cluster on every batch: the agent knows them already.
        disable_builtin_labels: true,
        attributes: Some(attributes),
        resource_attributes,
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
pub fn http_access_log(reporter: Reporter, plan: &MetricsPlan) -> AccessLog {
    logger(
        reporter,
        "http",
        attributes(
            reporter,
            &[
                (attr::AUTHORITY, "%REQ(:AUTHORITY)%"),
                (attr::PEER, super::peer::COMMAND),
                (attr::CONTENT_TYPE, "%REQ(CONTENT-TYPE)%"),
                (attr::RESPONSE_CODE, "%RESPONSE_CODE%"),
                (attr::GRPC_STATUS, "%GRPC_STATUS_NUMBER%"),
                (attr::DURATION_MS, "%DURATION%"),
            ],
        ),
        plan,
    )
}

/// The access logger of a tcp_proxy reporting as `reporter`. The tcp_proxy must also log every
/// so often (`tcp_access_log_options`), or a long connection reports nothing until it closes.
pub fn tcp_access_log(reporter: Reporter, plan: &MetricsPlan) -> AccessLog {
    logger(
        reporter,
        "tcp",
        attributes(
            reporter,
            &[
                (attr::LOG_TYPE, "%ACCESS_LOG_TYPE%"),
                (attr::CONNECTION, "%CONNECTION_ID%"),
            ],
        ),
        plan,
    )
}

/// The tcp_proxy options that make it report a connection every [`TCP_REPORT_SECONDS`] while
/// it lasts, not only when it closes. Not when the upstream connects: on an inbound mTLS chain
/// tcp_proxy dials the app before the client's TLS handshake is done, so that record would
/// carry no client certificate (Istio's filter likewise waits for the peer, or the close).
pub fn tcp_access_log_options(plan: &MetricsPlan) -> tcp_proxy::TcpAccessLogOptions {
    tcp_proxy::TcpAccessLogOptions {
        access_log_flush_interval: Some(plan.reporting_interval.map_or(
            Duration {
                seconds: TCP_REPORT_SECONDS,
                nanos: 0,
            },
            crate::envoy::proto_duration,
        )),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use prost::Message;

    fn config(log: AccessLog) -> OpenTelemetryAccessLogConfig {
        let Some(access_log::ConfigType::TypedConfig(any)) = log.config_type else {
            panic!("untyped");
        };
        OpenTelemetryAccessLogConfig::decode(any.value.as_slice()).unwrap()
    }

    fn strings(list: Option<KeyValueList>) -> std::collections::BTreeMap<String, String> {
        list.unwrap()
            .values
            .into_iter()
            .map(|kv| match kv.value.and_then(|v| v.value) {
                Some(any_value::Value::StringValue(s)) => (kv.key, s),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn each_side_reports_the_other_sides_certificate() {
        let inbound = config(http_access_log(
            Reporter::Destination,
            &MetricsPlan::default(),
        ));
        let records = strings(inbound.attributes);
        assert_eq!(records[attr::PEER_SAN], "%DOWNSTREAM_PEER_URI_SAN%");
        // An inbound cluster's endpoint is the app: no workload metadata to read per request.
        assert!(!records.contains_key(attr::ENDPOINT), "{records:?}");
        let batches = strings(inbound.resource_attributes);
        assert_eq!(batches[attr::REPORTER], "destination");
        assert_eq!(batches[attr::KIND], "http");
        let outbound = config(tcp_access_log(Reporter::Source, &MetricsPlan::default()));
        let records = strings(outbound.attributes);
        assert_eq!(records[attr::PEER_SAN], "%UPSTREAM_PEER_URI_SAN%");
        assert_eq!(records[attr::LOG_TYPE], "%ACCESS_LOG_TYPE%");
        assert_eq!(
            records[attr::ENDPOINT],
            "%UPSTREAM_METADATA(istio:workload)%"
        );
        // What every record of a logger shares is sent once a batch, not once a request.
        assert!(!records.contains_key(attr::REPORTER) && !records.contains_key(attr::KIND));
        let batches = strings(outbound.resource_attributes);
        assert_eq!(
            (
                batches[attr::REPORTER].as_str(),
                batches[attr::KIND].as_str()
            ),
            ("source", "tcp")
        );
    }
}
