//! The vocabulary of Istio's standard metrics that the control plane and the agent share: the
//! metrics' plan as Istio's `istio.stats` config writes it (`MetricsPlan`, one `MetricConfig`
//! per metric touched), the CEL tag values computed here (`TagValue`), the reporter, and the
//! shape of the records Envoy's access loggers send the agent (`attr`, `Shape`). `access_log`
//! builds those loggers, `peer` the header exchange that names the other side's workload.

pub mod access_log;
pub mod module_filters;
pub mod peer;

use std::collections::BTreeMap;

pub use access_log::{CLUSTER, http_access_log, tcp_access_log, tcp_access_log_options};

/// The standard metrics' shape: what Istio writes into its `istio.stats` filter config, one
/// entry per metric it touches (Istio's `MetricConfig`), in Istio's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsPlan {
    pub metrics: Vec<MetricConfig>,
    /// `reportingInterval` (TCP), when set.
    pub reporting_interval: Option<std::time::Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricConfig {
    /// The Prometheus name without `istio_` (`requests_total`).
    pub name: String,
    pub drop: bool,
    pub tags_to_remove: Vec<String>,
    /// Tag → CEL value (checked when the Telemetry was read).
    pub dimensions: BTreeMap<String, String>,
}

/// What a tag's CEL `value` reads, among what the standard metrics here can compute: a
/// request attribute Envoy's access-log format commands give, or a string literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagValue {
    /// An Envoy access-log command (`%REQ(:AUTHORITY)%`), evaluated per request.
    Command(String),
    /// A constant.
    Literal(String),
}

/// The CEL attributes a tag value may name, and the Envoy command each is. `destination` is
/// the downstream connection's local side, as in Envoy's attributes (the original destination
/// on a client sidecar's outbound listener, the pod's own port inbound).
const ATTRIBUTES: [(&str, &str); 12] = [
    ("request.host", "%REQ(:AUTHORITY)%"),
    ("request.method", "%REQ(:METHOD)%"),
    ("request.path", "%REQ(:PATH)%"),
    ("request.scheme", "%REQ(:SCHEME)%"),
    ("request.protocol", "%PROTOCOL%"),
    ("request.useragent", "%REQ(USER-AGENT)%"),
    ("request.id", "%REQ(X-REQUEST-ID)%"),
    ("response.code", "%RESPONSE_CODE%"),
    ("destination.port", "%DOWNSTREAM_LOCAL_PORT%"),
    ("source.port", "%DOWNSTREAM_REMOTE_PORT%"),
    ("source.address", "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"),
    ("xds.cluster_name", "%UPSTREAM_CLUSTER_RAW%"),
];

impl TagValue {
    /// `expr` as a value, or why it cannot be computed here.
    pub fn parse(expr: &str) -> Result<TagValue, String> {
        let e = expr.trim();
        // string(x) is x as text: the access-log commands are text already.
        let inner = e
            .strip_prefix("string(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or(e)
            .trim();
        for quote in ['\'', '"'] {
            if let Some(text) = inner
                .strip_prefix(quote)
                .and_then(|r| r.strip_suffix(quote))
                .filter(|t| !t.contains(quote) && !t.contains('\\'))
            {
                return Ok(TagValue::Literal(text.to_string()));
            }
        }
        if let Some((_, cmd)) = ATTRIBUTES.iter().find(|(a, _)| *a == inner) {
            return Ok(TagValue::Command((*cmd).to_string()));
        }
        if let Some(name) = inner
            .strip_prefix("request.headers[")
            .and_then(|r| r.strip_suffix(']'))
            .map(str::trim)
            .and_then(|q| {
                ['\'', '"']
                    .iter()
                    .find_map(|c| q.strip_prefix(*c).and_then(|r| r.strip_suffix(*c)))
            })
            .filter(|n| is_header_name(n))
        {
            return Ok(TagValue::Command(format!("%REQ({name})%")));
        }
        let known: Vec<&str> = ATTRIBUTES.iter().map(|(a, _)| *a).collect();
        Err(format!(
            "CEL expression {expr:?} is not a value these metrics can compute (a string \
             literal, request.headers['NAME'], or one of {})",
            known.join(", ")
        ))
    }
}

fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The attribute names of each log record, shared with the agent that reads them.
pub mod attr {
    /// `source` (an outbound listener) or `destination` (inbound): Istio's `reporter`. This
    /// and [`KIND`] are batch (resource) attributes, the rest record attributes.
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
    /// The peer's announcement of its workload (`peer`), HTTP only.
    pub const PEER: &str = "peer";
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
    /// The batch attribute with the metrics' shape (Telemetry `metrics` overrides, Istio's
    /// `istio.stats` MetricConfigs): JSON, see [`Shape`].
    pub const SHAPE: &str = "istio.metrics";
    /// The record attributes of the shape's per-request dimension values: `dim.0`, `dim.1`, ...
    pub const DIMENSION_PREFIX: &str = "dim.";
}

/// The metrics' shape as the agent reads it from the [`attr::SHAPE`] resource attribute: per
/// metric (Prometheus name without `istio_`), whether it is dropped, the labels removed, and
/// the labels set, each to a literal or to a record attribute (`dim.N`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shape {
    pub metrics: Vec<MetricShape>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MetricShape {
    pub name: String,
    #[serde(default)]
    pub drop: bool,
    #[serde(default)]
    pub remove: Vec<String>,
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, Dimension>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    Literal(String),
    /// A record attribute, by key.
    Attribute(String),
}

/// The shape of `plan`, and the record attributes its dimensions need (key, Envoy command).
/// A CEL value that cannot be computed here is `unknown`, as Istio's filter reports a value it
/// cannot evaluate (a Telemetry's values were checked when it was read; an istiod's may not be).
pub fn shape(plan: &MetricsPlan) -> (Shape, Vec<(String, String)>) {
    let mut commands: Vec<(String, String)> = Vec::new();
    let metrics = plan
        .metrics
        .iter()
        .map(|m| MetricShape {
            name: m.name.clone(),
            drop: m.drop,
            remove: m.tags_to_remove.clone(),
            set: m
                .dimensions
                .iter()
                .map(|(tag, expr)| {
                    let d = match TagValue::parse(expr) {
                        Ok(TagValue::Literal(l)) => Dimension::Literal(l),
                        Ok(TagValue::Command(c)) => {
                            let key = match commands.iter().find(|(_, have)| *have == c) {
                                Some((k, _)) => k.clone(),
                                None => {
                                    let k = format!("{}{}", attr::DIMENSION_PREFIX, commands.len());
                                    commands.push((k.clone(), c));
                                    k
                                }
                            };
                            Dimension::Attribute(key)
                        }
                        Err(_) => Dimension::Literal("unknown".into()),
                    };
                    (tag.clone(), d)
                })
                .collect(),
        })
        .collect();
    (Shape { metrics }, commands)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tag_values() {
        use TagValue::*;
        let v = |e: &str| TagValue::parse(e).unwrap();
        assert_eq!(v("request.host"), Command("%REQ(:AUTHORITY)%".into()));
        assert_eq!(
            v("string(destination.port)"),
            Command("%DOWNSTREAM_LOCAL_PORT%".into())
        );
        assert_eq!(
            v("request.headers['x-user']"),
            Command("%REQ(x-user)%".into())
        );
        assert_eq!(v("'fixed'"), Literal("fixed".into()));
        assert_eq!(v("\"fixed\""), Literal("fixed".into()));
        assert!(TagValue::parse("request.headers['a%b']").is_err());
        assert!(TagValue::parse("request.host + 'x'").is_err());
    }
}
