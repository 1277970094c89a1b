//! telemetry.istio.io Telemetry: which access loggers, tracers and metrics a workload's sidecar
//! uses (istio/api `telemetry/v1/telemetry.proto`). Typed whole, checked as Istio checks it;
//! a field this control plane does not know is an error naming it, and what it knows but
//! cannot apply (a custom metric, a CEL value our metrics cannot compute) is refused by name.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::authorization::TargetRef;
use super::selector::PolicySelector;
use super::values::Percentage;

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct TelemetrySpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<PolicySelector>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<TargetRef>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<TargetRef>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tracing: Vec<Tracing>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<Metrics>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub access_logging: Vec<AccessLogging>,
}

/// A provider by its MeshConfig `extensionProviders` name.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderRef {
    pub name: String,
}

/// Which side of a call a rule applies to; `CLIENT_AND_SERVER` when unset.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WorkloadMode {
    #[default]
    ClientAndServer,
    Client,
    Server,
}

impl WorkloadMode {
    /// Whether a rule of this mode applies on the `client` side (outbound) or the server side.
    pub fn covers(self, client: bool) -> bool {
        match self {
            WorkloadMode::ClientAndServer => true,
            WorkloadMode::Client => client,
            WorkloadMode::Server => !client,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ModeSelector {
    pub mode: WorkloadMode,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct AccessLogging {
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub matches: Option<ModeSelector>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<LogFilter>,
}

/// `filter.expression`: a CEL expression, evaluated by Envoy's CEL access-log filter.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct LogFilter {
    pub expression: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Tracing {
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub matches: Option<ModeSelector>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_sampling_percentage: Option<Percentage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_span_reporting: Option<bool>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub custom_tags: BTreeMap<String, CustomTag>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_request_id_for_trace_sampling: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_istio_tags: Option<bool>,
}

/// A span tag: exactly one of a literal, an environment variable of the proxy, a request header.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct CustomTag {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub literal: Option<Literal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment: Option<FromName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<FromName>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Literal {
    pub value: String,
}

/// An environment variable or a request header, with the value when it is absent.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct FromName {
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub default_value: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Metrics {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderRef>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<MetricsOverride>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reporting_interval: Option<super::values::GoDuration>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsOverride {
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub matches: Option<MetricSelector>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tag_overrides: BTreeMap<String, TagOverride>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricSelector {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric: Option<IstioMetric>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom_metric: Option<String>,
    pub mode: WorkloadMode,
}

/// Istio's standard metrics by their Telemetry API name.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum IstioMetric {
    #[default]
    AllMetrics,
    RequestCount,
    RequestDuration,
    RequestSize,
    ResponseSize,
    TcpOpenedConnections,
    TcpClosedConnections,
    TcpSentBytes,
    TcpReceivedBytes,
    GrpcRequestMessages,
    GrpcResponseMessages,
}

impl IstioMetric {
    /// Each standard metric with its name in the Telemetry API (Istio orders a proxy's metric
    /// overrides by it) and its Prometheus name without the `istio_` prefix (Istio's stats
    /// filter's names).
    pub const STANDARD: [(IstioMetric, &'static str, &'static str); 10] = [
        (IstioMetric::RequestCount, "REQUEST_COUNT", "requests_total"),
        (
            IstioMetric::RequestDuration,
            "REQUEST_DURATION",
            "request_duration_milliseconds",
        ),
        (IstioMetric::RequestSize, "REQUEST_SIZE", "request_bytes"),
        (IstioMetric::ResponseSize, "RESPONSE_SIZE", "response_bytes"),
        (
            IstioMetric::TcpOpenedConnections,
            "TCP_OPENED_CONNECTIONS",
            "tcp_connections_opened_total",
        ),
        (
            IstioMetric::TcpClosedConnections,
            "TCP_CLOSED_CONNECTIONS",
            "tcp_connections_closed_total",
        ),
        (
            IstioMetric::TcpSentBytes,
            "TCP_SENT_BYTES",
            "tcp_sent_bytes_total",
        ),
        (
            IstioMetric::TcpReceivedBytes,
            "TCP_RECEIVED_BYTES",
            "tcp_received_bytes_total",
        ),
        (
            IstioMetric::GrpcRequestMessages,
            "GRPC_REQUEST_MESSAGES",
            "request_messages_total",
        ),
        (
            IstioMetric::GrpcResponseMessages,
            "GRPC_RESPONSE_MESSAGES",
            "response_messages_total",
        ),
    ];
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TagOperation {
    #[default]
    Upsert,
    Remove,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TagOverride {
    pub operation: TagOperation,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub value: String,
}

/// A Prometheus label name.
fn is_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl TelemetrySpec {
    /// Bound by targetRef(s): for gateways and waypoints, never a sidecar.
    pub fn targeted(&self) -> bool {
        self.target_ref.is_some() || !self.target_refs.is_empty()
    }
}

/// Istio's checks, and ours for what cannot be applied; the error starts with the field.
pub fn validate_telemetry(spec: &TelemetrySpec) -> Result<(), String> {
    if spec.selector.is_some() && spec.targeted() {
        return Err("selector: a Telemetry has a selector or targetRefs, not both".into());
    }
    let named = |field: String, providers: &[ProviderRef]| {
        providers
            .iter()
            .enumerate()
            .find(|(_, p)| p.name.is_empty())
            .map_or(Ok(()), |(i, _)| {
                Err(format!("{field}.providers[{i}].name: required"))
            })
    };
    for (i, t) in spec.tracing.iter().enumerate() {
        named(format!("tracing[{i}]"), &t.providers)?;
        for (name, tag) in &t.custom_tags {
            let at = format!("tracing[{i}].customTags.{name}");
            let set = [
                tag.literal.is_some(),
                tag.environment.is_some(),
                tag.header.is_some(),
            ];
            if set.iter().filter(|s| **s).count() != 1 {
                return Err(format!(
                    "{at}: exactly one of literal, environment, header is required"
                ));
            }
            for (what, from) in [("environment", &tag.environment), ("header", &tag.header)] {
                if from.as_ref().is_some_and(|f| f.name.is_empty()) {
                    return Err(format!("{at}.{what}.name: required"));
                }
            }
        }
    }
    for (i, m) in spec.metrics.iter().enumerate() {
        named(format!("metrics[{i}]"), &m.providers)?;
        for (j, o) in m.overrides.iter().enumerate() {
            let at = format!("metrics[{i}].overrides[{j}]");
            if let Some(custom) = o.matches.as_ref().and_then(|s| s.custom_metric.as_ref()) {
                return Err(format!(
                    "{at}.match.customMetric: {custom:?}: only Istio's standard metrics are \
                     produced here, so a custom metric cannot be shaped"
                ));
            }
            for (tag, over) in &o.tag_overrides {
                if !is_label_name(tag) {
                    return Err(format!("{at}.tagOverrides.{tag}: not a metric label name"));
                }
                if over.operation == TagOperation::Upsert {
                    if over.value.is_empty() {
                        return Err(format!(
                            "{at}.tagOverrides.{tag}.value: required for UPSERT"
                        ));
                    }
                    mesh_common::module::TagValue::parse(&over.value)
                        .map_err(|e| format!("{at}.tagOverrides.{tag}.value: {e}"))?;
                }
            }
        }
    }
    for (i, a) in spec.access_logging.iter().enumerate() {
        named(format!("accessLogging[{i}]"), &a.providers)?;
        if let Some(f) = &a.filter
            && f.expression.trim().is_empty()
        {
            return Err(format!("accessLogging[{i}].filter.expression: required"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_store::check_spec;

    fn check(yaml: &str) -> Result<(), String> {
        check_spec(yaml, validate_telemetry)
    }

    #[test]
    fn istios_examples_are_accepted() {
        check("accessLogging: [{providers: [{name: envoy}]}]").unwrap();
        check(
            "selector: {matchLabels: {app: reviews}}\ntracing:\n- providers: [{name: zipkin}]\n  \
             randomSamplingPercentage: 10.00\n  customTags:\n    my_new_foo_tag: {literal: {value: foo}}\n    \
             env: {environment: {name: HOSTNAME, defaultValue: unknown}}\n    ua: {header: {name: user-agent}}",
        )
        .unwrap();
        check(
            "metrics:\n- providers: [{name: prometheus}]\n  overrides:\n  - match: {metric: REQUEST_COUNT, mode: CLIENT}\n    \
             tagOverrides:\n      request_protocol: {operation: REMOVE}\n      request_host: {value: request.host}\n      \
             destination_port: {value: string(destination.port)}\n  - match: {metric: REQUEST_DURATION}\n    disabled: true",
        )
        .unwrap();
        check("accessLogging: [{filter: {expression: 'response.code >= 400'}}]").unwrap();
    }

    #[test]
    fn what_cannot_be_applied_is_refused_by_field() {
        let e = check("metrics: [{overrides: [{match: {customMetric: my_metric}}]}]").unwrap_err();
        assert!(
            e.starts_with("metrics[0].overrides[0].match.customMetric"),
            "{e}"
        );
        let e = check("metrics: [{overrides: [{tagOverrides: {x: {value: 'upstream_peer.labels[\"app\"]'}}}]}]")
            .unwrap_err();
        assert!(
            e.starts_with("metrics[0].overrides[0].tagOverrides.x.value"),
            "{e}"
        );
        let e = check("tracing: [{customTags: {t: {literal: {value: a}, header: {name: b}}}}]")
            .unwrap_err();
        assert!(e.starts_with("tracing[0].customTags.t"), "{e}");
        let e = check("tracing: [{randomSamplingPercentage: 101}]").unwrap_err();
        assert!(e.contains("between 0 and 100"), "{e}");
        let e = check("accessLogging: [{providers: [{}]}]").unwrap_err();
        assert!(e.starts_with("accessLogging[0].providers[0].name"), "{e}");
        assert!(
            check("tracing: [{sampling: 3}]")
                .unwrap_err()
                .contains("sampling")
        );
    }

    #[test]
    fn standard_metrics_carry_their_api_names() {
        for (m, api_name, _) in IstioMetric::STANDARD {
            assert_eq!(serde_json::to_value(m).unwrap(), api_name);
        }
    }
}
