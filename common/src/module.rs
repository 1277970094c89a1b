//! What the proxy module (`module/`, the `libistio_module.so` Envoy loads) and the programs that
//! configure it agree on: its name and how Envoy finds it, the names of its filters, the JSON of
//! each filter's config (Istio's own protos in their JSON form, so a config istiod wrote passes
//! through as it is), the node description the agent hands it, and the CEL tag values its
//! standard metrics compute. Plain data (serde): the module does not link the Envoy protos.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The module's name in `dynamic_module_config` (Envoy loads `lib<name>.so`).
pub const NAME: &str = "istio_module";
/// The shared library's file name.
pub const LIBRARY: &str = "libistio_module.so";
/// The directory Envoy looks for the library in.
pub const SEARCH_PATH_ENV: &str = "ENVOY_DYNAMIC_MODULES_SEARCH_PATH";
/// The environment variable of Envoy's that describes this proxy to the module ([`Node`], JSON;
/// dynamic modules cannot read Envoy's own node).
pub const NODE_ENV: &str = "ISTIO_MODULE_NODE";
/// The runtime flag that keeps module metrics' names as they are (`istio_requests_total`, not
/// `envoy_dynamicmodulescustom_...`).
pub const STRIP_PREFIX_FLAG: &str =
    "envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix";
/// The metrics namespace the module's configs use (stripped by [`STRIP_PREFIX_FLAG`]).
pub const METRICS_NAMESPACE: &str = "istiocustom";
/// The Envoy build the module's ABI declarations were written for (`envoy --version`).
pub const ENVOY_BUILD: &str = "9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0";
/// The ABI version string of that build.
pub const ABI_VERSION: &str = "v0.2.0";

/// Which side reports (Istio's `reporter` label): what istiod-core and the agent tell the
/// module's `istio.stats`, and what the module labels with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reporter {
    /// A client sidecar (outbound listeners) or a gateway.
    Source,
    /// A server sidecar (inbound listeners).
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

/// Cluster metadata (`filter_metadata`) the module reads, in strings: what Istio's filters read
/// from the cluster itself or from the list `istio.services`, which the module's metadata
/// getters cannot reach. istiod-core writes it; the agent adds it to an istiod's clusters.
pub mod cluster {
    pub const NAMESPACE: &str = "istio_module";
    /// `istio.services[0]` as `HOST;NAME;NAMESPACE` (one string, so the metadata encodes the
    /// same every time).
    pub const SERVICE: &str = "service";
    /// The protocol the cluster speaks upstream: `HTTP2`, `HTTP11` (the default for a cluster
    /// with this metadata) or `downstream` (as the request came), for `istio.alpn`. A cluster
    /// without any of this metadata keeps its own ALPN.
    pub const UPSTREAM_PROTOCOL: &str = "upstream_protocol";

    /// The value of [`SERVICE`].
    pub fn service(host: &str, name: &str, namespace: &str) -> String {
        format!("{host};{name};{namespace}")
    }

    /// The name and namespace of a service host: `NAME.NAMESPACE.svc...` names both (a
    /// Kubernetes service); any other host is its own name, in no namespace it tells.
    pub fn name_of(host: &str) -> (&str, &str) {
        let mut labels = host.splitn(4, '.');
        match (labels.next(), labels.next(), labels.next()) {
            (Some(name), Some(ns), Some("svc")) => (name, ns),
            _ => (host, ""),
        }
    }

    /// [`SERVICE`]'s parts: host, name, namespace.
    pub fn parse_service(value: &str) -> Option<(&str, &str, &str)> {
        let mut p = value.splitn(3, ';');
        let host = p.next().filter(|h| !h.is_empty())?;
        Some((
            host,
            p.next().unwrap_or_default(),
            p.next().unwrap_or_default(),
        ))
    }
}

/// The module's filters, by the `filter_name` of their Envoy config.
pub mod filter {
    /// HTTP: Istio's peer metadata exchange (`io.istio.http.peer_metadata.Config`).
    /// Network, on an inbound chain: the TCP exchange's server side
    /// (`envoy.tcp.metadataexchange.config.MetadataExchange`).
    pub const METADATA_EXCHANGE: &str = "istio.metadata_exchange";
    /// Network, on an outbound listener: the TCP exchange's client side, which Istio runs as a
    /// cluster filter (dynamic modules are not cluster filters in Envoy 1.40).
    pub const METADATA_EXCHANGE_UPSTREAM: &str = "istio.metadata_exchange.upstream";
    /// HTTP and network: the standard metrics (`stats.PluginConfig`).
    pub const STATS: &str = "istio.stats";
    /// HTTP: the upstream ALPN by protocol (`istio.envoy.config.filter.http.alpn.v2alpha1`).
    pub const ALPN: &str = "istio.alpn";
    /// HTTP, on the Prometheus listener: moves the TCP metrics counted since the last scrape
    /// into Envoy's labelled counters (network filters' metrics take no labels in Envoy 1.40).
    pub const STATS_FLUSH: &str = "istio.stats_flush";
}

/// This proxy as the module sees it: Envoy's node id and the node metadata Istio's filters read
/// (`NAME`, `NAMESPACE`, `WORKLOAD_NAME`, `CLUSTER_ID`, `LABELS`, `OWNER`, `ISTIO_VERSION`, ...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Node {
    pub id: String,
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The node's locality (region, zone), exchanged when the metadata has none.
    pub region: String,
    pub zone: String,
}

/// `io.istio.http.peer_metadata.Config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeerMetadata {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub downstream_discovery: Vec<Discovery>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstream_discovery: Vec<Discovery>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub downstream_propagation: Vec<Propagation>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstream_propagation: Vec<Propagation>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shared_with_upstream: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub additional_labels: Vec<String>,
}

/// One way of learning the peer (the proto's oneof, one key set).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Discovery {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub istio_headers: Option<IstioHeaders>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_discovery: Option<Empty>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baggage: Option<Empty>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_filter_state: Option<UpstreamFilterState>,
}

/// One way of announcing this proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Propagation {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub istio_headers: Option<IstioHeaders>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baggage: Option<Empty>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IstioHeaders {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub skip_external_clusters: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamFilterState {
    pub peer_metadata_key: String,
}

impl PeerMetadata {
    /// What istiod 1.31 writes for a sidecar's outbound listeners (and a gateway's).
    pub fn client() -> PeerMetadata {
        PeerMetadata {
            upstream_discovery: vec![Discovery::istio_headers(), Discovery::workload()],
            upstream_propagation: vec![Propagation::istio_headers()],
            ..PeerMetadata::default()
        }
    }

    /// What istiod 1.31 writes for a sidecar's inbound listeners.
    pub fn server() -> PeerMetadata {
        PeerMetadata {
            downstream_discovery: vec![Discovery::istio_headers(), Discovery::workload()],
            downstream_propagation: vec![Propagation::istio_headers()],
            ..PeerMetadata::default()
        }
    }
}

impl Discovery {
    pub fn istio_headers() -> Discovery {
        Discovery {
            istio_headers: Some(IstioHeaders::default()),
            ..Discovery::default()
        }
    }
    pub fn workload() -> Discovery {
        Discovery {
            workload_discovery: Some(Empty {}),
            ..Discovery::default()
        }
    }
}

impl Propagation {
    pub fn istio_headers() -> Propagation {
        Propagation {
            istio_headers: Some(IstioHeaders::default()),
            ..Propagation::default()
        }
    }
}

/// The TCP exchange's ALPN.
pub const PEER_EXCHANGE_ALPN: &str = "istio-peer-exchange";

/// `envoy.tcp.metadataexchange.config.MetadataExchange`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpExchange {
    pub protocol: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub enable_discovery: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub additional_labels: Vec<String>,
    /// Ours: the server side's chain takes only connections that negotiated [`protocol`]
    /// (its `filter_chain_match` says so), so it announces itself on its first bytes as Istio's
    /// does; without it the server answers only a client that sent its frame first.
    ///
    /// [`protocol`]: TcpExchange::protocol
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub negotiated: bool,
}

impl TcpExchange {
    /// What istiod 1.31 writes.
    pub fn istio() -> TcpExchange {
        TcpExchange {
            protocol: PEER_EXCHANGE_ALPN.to_string(),
            enable_discovery: true,
            additional_labels: Vec::new(),
            negotiated: false,
        }
    }
}

/// `istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Alpn {
    pub alpn_override: Vec<AlpnOverride>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlpnOverride {
    /// `HTTP10` (the proto's default, often omitted), `HTTP11` or `HTTP2`.
    pub upstream_protocol: UpstreamProtocol,
    pub alpn_override: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(clippy::upper_case_acronyms)]
pub enum UpstreamProtocol {
    #[default]
    HTTP10,
    HTTP11,
    HTTP2,
}

impl Alpn {
    /// What istiod 1.31 writes (`pilot/pkg/xds/filters`).
    pub fn istio() -> Alpn {
        let o = |p, list: [&str; 3]| AlpnOverride {
            upstream_protocol: p,
            alpn_override: list.iter().map(|s| s.to_string()).collect(),
        };
        Alpn {
            alpn_override: vec![
                o(
                    UpstreamProtocol::HTTP10,
                    ["istio-http/1.0", "istio", "http/1.0"],
                ),
                o(
                    UpstreamProtocol::HTTP11,
                    ["istio-http/1.1", "istio", "http/1.1"],
                ),
                o(UpstreamProtocol::HTTP2, ["istio-h2", "istio", "h2"]),
            ],
        }
    }
}

/// `stats.PluginConfig` (the fields Istio 1.31 reads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Stats {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub disable_host_header_fallback: bool,
    /// A protobuf JSON duration (`"5s"`). The module counts TCP traffic as it passes and each
    /// scrape flushes it, so this is accepted and has nothing left to pace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_reporting_duration: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub definitions: Vec<MetricDefinition>,
    /// `UNSPECIFIED` (the listener's direction decides) or `SERVER_GATEWAY` (a waypoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reporter: Option<String>,
    /// Deprecated in Istio and not read by it; accepted so an istiod config passes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotation_interval: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graceful_deletion_interval: Option<String>,
    /// Ours: the reporter when the config says it (`source` or `destination`); otherwise the
    /// listener's traffic direction decides, as in Istio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub side: Option<String>,
}

/// `stats.MetricConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricConfig {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub dimensions: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags_to_remove: Vec<String>,
    #[serde(rename = "match", skip_serializing_if = "String::is_empty")]
    pub match_: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub drop: bool,
}

/// `stats.MetricDefinition` (istiod never writes one; read so a hand-written config is named
/// in the module's error instead of failing to parse).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricDefinition {
    pub name: String,
    pub value: String,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

/// The standard metrics' short names (Istio's `stats.MetricConfig.name`).
pub const HTTP_METRICS: [&str; 4] = [
    "requests_total",
    "request_duration_milliseconds",
    "request_bytes",
    "response_bytes",
];
pub const GRPC_METRICS: [&str; 2] = ["request_messages_total", "response_messages_total"];
pub const TCP_METRICS: [&str; 4] = [
    "tcp_connections_opened_total",
    "tcp_connections_closed_total",
    "tcp_sent_bytes_total",
    "tcp_received_bytes_total",
];

/// A CEL attribute a metric tag may take its value from, among those the module computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribute {
    RequestHost,
    RequestMethod,
    RequestPath,
    RequestScheme,
    RequestProtocol,
    RequestUserAgent,
    RequestId,
    ResponseCode,
    DestinationPort,
    SourcePort,
    SourceAddress,
    ClusterName,
}

/// The CEL names of [`Attribute`].
pub const ATTRIBUTES: [(&str, Attribute); 12] = [
    ("request.host", Attribute::RequestHost),
    ("request.method", Attribute::RequestMethod),
    ("request.path", Attribute::RequestPath),
    ("request.scheme", Attribute::RequestScheme),
    ("request.protocol", Attribute::RequestProtocol),
    ("request.useragent", Attribute::RequestUserAgent),
    ("request.id", Attribute::RequestId),
    ("response.code", Attribute::ResponseCode),
    ("destination.port", Attribute::DestinationPort),
    ("source.port", Attribute::SourcePort),
    ("source.address", Attribute::SourceAddress),
    ("xds.cluster_name", Attribute::ClusterName),
];

/// What a tag's CEL `value` reads: the CEL Istio's Telemetry examples and istioctl write for
/// metric tags (a string literal, an attribute, a request header, each optionally in
/// `string(...)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagValue {
    Literal(String),
    Attribute(Attribute),
    RequestHeader(String),
}

impl TagValue {
    /// `expr` as a value, or why it cannot be computed here.
    pub fn parse(expr: &str) -> Result<TagValue, String> {
        let e = expr.trim();
        // string(x) is x as text: every value here is text already.
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
        if let Some((_, a)) = ATTRIBUTES.iter().find(|(name, _)| *name == inner) {
            return Ok(TagValue::Attribute(*a));
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
            return Ok(TagValue::RequestHeader(name.to_ascii_lowercase()));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tag_values() {
        use TagValue::*;
        let v = |e: &str| TagValue::parse(e).unwrap();
        assert_eq!(v("request.host"), Attribute(super::Attribute::RequestHost));
        assert_eq!(
            v("string(destination.port)"),
            Attribute(super::Attribute::DestinationPort)
        );
        assert_eq!(
            v("request.headers['X-User']"),
            RequestHeader("x-user".into())
        );
        assert_eq!(v("'fixed'"), Literal("fixed".into()));
        assert_eq!(v("\"fixed\""), Literal("fixed".into()));
        assert!(TagValue::parse("request.headers['a%b']").is_err());
        assert!(TagValue::parse("request.host + 'x'").is_err());
    }

    #[test]
    fn istiods_configs_read_as_istiod_writes_them() {
        // The JSON of istiod 1.31's TypedStructs and Any (tests/fixtures/istiod-1.31).
        let mx: PeerMetadata = serde_json::from_str(
            r#"{"upstream_discovery":[{"istio_headers":{}},{"workload_discovery":{}}],
                "upstream_propagation":[{"istio_headers":{}}]}"#,
        )
        .unwrap();
        assert_eq!(mx, PeerMetadata::client());
        let tcp: TcpExchange = serde_json::from_str(
            r#"{"enable_discovery": true, "protocol": "istio-peer-exchange"}"#,
        )
        .unwrap();
        assert_eq!(tcp, TcpExchange::istio());
        let alpn: Alpn = serde_json::from_str(
            r#"{"alpn_override":[{"alpn_override":["istio-http/1.0","istio","http/1.0"]},
                {"upstream_protocol":"HTTP11","alpn_override":["istio-http/1.1","istio","http/1.1"]},
                {"upstream_protocol":"HTTP2","alpn_override":["istio-h2","istio","h2"]}]}"#,
        )
        .unwrap();
        assert_eq!(alpn, Alpn::istio());
        let stats: Stats =
            serde_json::from_str(r#"{"disable_host_header_fallback":true}"#).unwrap();
        assert!(stats.disable_host_header_fallback);
        assert!(serde_json::from_str::<Stats>(r#"{"nonsense":1}"#).is_err());
    }
}
