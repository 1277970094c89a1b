//! Istio's standard HTTP metrics (istio/proxy `istio_stats`, config `stats.PluginConfig`):
//! `istio_requests_total`, `istio_request_duration_milliseconds`, `istio_request_bytes` and
//! `istio_response_bytes`, labelled as Istio labels them ([`crate::labels`]) and shaped by the
//! config's `metrics` (Telemetry overrides: dropped metrics, removed tags, tags set to a CEL
//! value). Counted when the stream completes, as Istio counts at access-log time.
//!
//! Also the flush of the TCP metrics ([`FlushConfig`]): network filters cannot label their
//! metrics in Envoy 1.40, so they count in [`crate::tcp_metrics`] and a request to the
//! Prometheus listener moves those counts into labelled counters before Envoy answers it.

use std::time::Instant;

use mesh_common::module::{
    Attribute, HTTP_METRICS, MetricConfig, Stats, TCP_METRICS, TagValue, cluster,
};

use super::{ConfigResult, DOWNSTREAM_PEER, UPSTREAM_PEER};
use crate::envoy::attribute;
use crate::envoy::{HttpConfig, HttpStream, Phase};
use crate::labels::{
    Facts, HTTP_LABELS, PEER_LABELS, Reporter, ServiceMeta, TCP_LABELS, UNKNOWN, peer_labels,
    security_policy, without_port,
};
use crate::node::Own;

/// How one tag of a metric gets its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tag {
    /// The standard label at this index of the metric kind's standard labels.
    Standard(usize),
    Value(TagValue),
    /// A CEL value the module cannot compute: `unknown`, as Istio reports a failed evaluation.
    Unknown,
}

/// The tags of metric `name` whose standard labels are `standard`, after the config's
/// overrides in Istio's order, or `None` when the config drops it.
pub fn shape(
    name: &str,
    standard: &[&str],
    configs: &[MetricConfig],
) -> Option<Vec<(String, Tag)>> {
    if configs.iter().any(|c| c.drop && c.name == name) {
        return None;
    }
    let mut tags: Vec<(String, Tag)> = standard
        .iter()
        .enumerate()
        .map(|(i, n)| (n.to_string(), Tag::Standard(i)))
        .collect();
    let mut added: Vec<(String, Tag)> = Vec::new();
    for c in configs
        .iter()
        .filter(|c| c.name.is_empty() || c.name == name)
    {
        tags.retain(|(n, _)| !c.tags_to_remove.contains(n));
        for (tag, expr) in &c.dimensions {
            let value = TagValue::parse(expr);
            if let Some(slot) = tags.iter_mut().find(|(n, _)| n == tag) {
                slot.1 = match value {
                    Ok(v) => Tag::Value(v),
                    Err(_) => Tag::Unknown,
                };
            } else if standard.contains(&tag.as_str()) {
                // A standard tag removed above stays removed.
            } else {
                let t = match value {
                    Ok(v) => Tag::Value(v),
                    Err(_) => Tag::Unknown,
                };
                match added.iter_mut().find(|(n, _)| n == tag) {
                    Some(slot) => slot.1 = t,
                    None => added.push((tag.clone(), t)),
                }
            }
        }
    }
    added.sort_by(|a, b| a.0.cmp(&b.0));
    tags.extend(added);
    Some(tags)
}

/// The standard labels of the HTTP metrics, in Istio's order.
pub fn http_labels() -> Vec<&'static str> {
    PEER_LABELS
        .iter()
        .chain(HTTP_LABELS.iter())
        .copied()
        .collect()
}

/// The standard labels of the TCP metrics, in Istio's order.
pub fn tcp_labels() -> Vec<&'static str> {
    PEER_LABELS
        .iter()
        .chain(TCP_LABELS.iter())
        .copied()
        .collect()
}

/// A metric's Prometheus name.
pub fn metric_name(short: &str) -> String {
    format!("istio_{short}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Requests,
    Duration,
    RequestBytes,
    ResponseBytes,
}

struct Metric {
    kind: Kind,
    id: usize,
    tags: Vec<Tag>,
}

/// The reporter a config says, or `None` for the listener's direction to decide.
pub fn configured_reporter(c: &Stats) -> ConfigResult<Option<Reporter>> {
    match (c.side.as_deref(), c.reporter.as_deref()) {
        (Some("source"), _) => Ok(Some(Reporter::Source)),
        (Some("destination"), _) => Ok(Some(Reporter::Destination)),
        (Some(other), _) => Err(format!(
            "filter istio.stats: side {other:?} is neither \"source\" nor \"destination\""
        )),
        (None, None | Some("UNSPECIFIED")) => Ok(None),
        (None, Some(other)) => Err(format!(
            "filter istio.stats: reporter {other:?} is not supported by this module (only \
             UNSPECIFIED: waypoints are not sidecars)"
        )),
    }
}

pub struct Config {
    reporter: Option<Reporter>,
    host_fallback: bool,
    own: &'static Own,
    metrics: Vec<Metric>,
    /// The request headers custom tags read.
    headers: Vec<String>,
}

impl Config {
    pub fn new(c: Stats, own: &'static Own, envoy: &mut dyn HttpConfig) -> ConfigResult<Config> {
        if let Some(d) = c.definitions.first() {
            return Err(format!(
                "filter istio.stats: custom metric definitions ({:?}) are not supported by this \
                 module (istiod never writes them)",
                d.name
            ));
        }
        let reporter = configured_reporter(&c)?;
        let standard = http_labels();
        let mut metrics = Vec::new();
        let mut headers = Vec::new();
        for (short, kind) in HTTP_METRICS.iter().zip([
            Kind::Requests,
            Kind::Duration,
            Kind::RequestBytes,
            Kind::ResponseBytes,
        ]) {
            let Some(tags) = shape(short, &standard, &c.metrics) else {
                continue;
            };
            let names: Vec<&str> = tags.iter().map(|(n, _)| n.as_str()).collect();
            let name = metric_name(short);
            let id = if kind == Kind::Requests {
                envoy.define_counter(&name, &names)
            } else {
                envoy.define_histogram(&name, &names)
            }
            .ok_or_else(|| format!("filter istio.stats: Envoy refused the metric {name}"))?;
            for (_, t) in &tags {
                if let Tag::Value(TagValue::RequestHeader(h)) = t
                    && !headers.contains(h)
                {
                    headers.push(h.clone());
                }
            }
            metrics.push(Metric {
                kind,
                id,
                tags: tags.into_iter().map(|(_, t)| t).collect(),
            });
        }
        Ok(Config {
            reporter,
            host_fallback: !c.disable_host_header_fallback,
            own,
            metrics,
            headers,
        })
    }
}

pub struct Filter<'c> {
    config: &'c Config,
    start: Option<Instant>,
    authority: Option<String>,
    grpc: bool,
    headers: Vec<Option<String>>,
}

fn string(v: Option<Vec<u8>>) -> Option<String> {
    v.map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Envoy's short response flags for its bitmask (`CoreResponseFlag` order), `-` for none.
pub fn response_flags(mask: u64) -> String {
    const CODES: [&str; 30] = [
        "LH", "UH", "UT", "LR", "UR", "UF", "UC", "UO", "NR", "DI", "FI", "RL", "UAEX", "RLSE",
        "DC", "URX", "SI", "IH", "DPE", "UMSDR", "RFCF", "NFCF", "DT", "UPE", "NC", "OM", "DF",
        "DO", "DR", "UDO",
    ];
    let set: Vec<&str> = CODES
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1u64 << i) != 0)
        .map(|(_, c)| *c)
        .collect();
    if set.is_empty() {
        "-".to_string()
    } else {
        set.join(",")
    }
}

/// The gRPC status Istio reports for an HTTP status when the response carried none (Envoy's
/// `Grpc::Utility::httpToGrpcStatus`).
pub fn grpc_status_of_http(code: u64) -> u64 {
    match code {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => 14,
        _ => 2,
    }
}

/// The reporter of a stream or connection: the config's, else the listener's direction.
pub fn reporter(configured: Option<Reporter>, direction: Option<u64>) -> Reporter {
    configured.unwrap_or(if direction == Some(1) {
        Reporter::Destination
    } else {
        Reporter::Source
    })
}

impl<'c> Filter<'c> {
    pub fn new(config: &'c Config) -> Filter<'c> {
        Filter {
            config,
            start: None,
            authority: None,
            grpc: false,
            headers: Vec::new(),
        }
    }

    pub fn on(&mut self, phase: Phase, s: &mut dyn HttpStream) {
        match phase {
            Phase::RequestHeaders => {
                self.start = Some(Instant::now());
                self.authority = string(s.request_header(":authority"));
                self.grpc = s
                    .request_header("content-type")
                    .is_some_and(|c| c.starts_with(b"application/grpc"));
                self.headers = self
                    .config
                    .headers
                    .iter()
                    .map(|h| string(s.request_header(h)))
                    .collect();
            }
            Phase::ResponseHeaders => {}
            Phase::Complete => self.report(s),
        }
    }

    fn report(&mut self, s: &mut dyn HttpStream) {
        let c = self.config;
        if c.metrics.is_empty() {
            return;
        }
        let reporter = reporter(
            c.reporter,
            s.attribute_int(attribute::XDS_LISTENER_DIRECTION),
        );
        let server = reporter == Reporter::Destination;
        let announcement = s.filter_state_bytes(if server {
            DOWNSTREAM_PEER
        } else {
            UPSTREAM_PEER
        });
        let peer = announcement.as_deref().and_then(|a| super::peer(a, &[]));
        let (peer_san, local_san) = if server {
            (
                string(s.attribute_string(attribute::CONNECTION_URI_SAN_PEER)),
                string(s.attribute_string(attribute::CONNECTION_URI_SAN_LOCAL)),
            )
        } else {
            (
                string(s.attribute_string(attribute::UPSTREAM_URI_SAN_PEER)),
                string(s.attribute_string(attribute::UPSTREAM_URI_SAN_LOCAL)),
            )
        };
        let cluster_name = string(s.attribute_string(attribute::XDS_CLUSTER_NAME));
        let route = string(s.attribute_string(attribute::XDS_ROUTE_NAME));
        let service = string(s.cluster_metadata(cluster::NAMESPACE, cluster::SERVICE))
            .as_deref()
            .and_then(cluster::parse_service)
            .map(|(host, name, namespace)| ServiceMeta {
                host: host.to_string(),
                name: name.to_string(),
                namespace: namespace.to_string(),
            })
            // A cluster named as Istio names outbound clusters tells the service too.
            .or_else(|| {
                cluster_name
                    .as_deref()
                    .and_then(super::tcp::service_of_cluster)
            });
        let endpoint = if server {
            None
        } else {
            string(s.host_metadata("istio", "workload"))
        };
        let host = if c.host_fallback {
            self.authority.as_deref()
        } else {
            None
        };
        let facts = Facts {
            peer: peer.as_deref(),
            peer_san: peer_san.as_deref().filter(|v| !v.is_empty()),
            local_san: local_san.as_deref().filter(|v| !v.is_empty()),
            cluster: cluster_name.as_deref(),
            route: route.as_deref(),
            service,
            endpoint_workload: endpoint.as_deref(),
            host,
        };
        let mut standard = peer_labels(&c.own.workload, reporter, &facts);
        let code = s.attribute_int(attribute::RESPONSE_CODE).unwrap_or(0);
        let grpc_status = if self.grpc {
            s.attribute_int(attribute::RESPONSE_GRPC_STATUS)
                .or_else(|| (code != 0).then(|| grpc_status_of_http(code)))
                .map(|v| v.to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        standard.push(if self.grpc { "grpc" } else { "http" }.to_string());
        standard.push(code.to_string());
        standard.push(grpc_status);
        standard.push(response_flags(
            s.attribute_int(attribute::RESPONSE_FLAGS).unwrap_or(0),
        ));
        standard.push(security_policy(reporter, &facts).to_string());
        let duration = self
            .start
            .map(|t| u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let mut computed: Vec<(Attribute, String)> = Vec::new();
        for m in &c.metrics {
            let mut values: Vec<&str> = Vec::with_capacity(m.tags.len());
            // Values of attributes, computed once per request whatever the number of metrics.
            for t in &m.tags {
                if let Tag::Value(TagValue::Attribute(a)) = t
                    && !computed.iter().any(|(have, _)| have == a)
                {
                    let v = self.attribute(*a, s);
                    computed.push((*a, v));
                }
            }
            for t in &m.tags {
                values.push(match t {
                    Tag::Standard(i) => standard.get(*i).map_or(UNKNOWN, String::as_str),
                    Tag::Value(TagValue::Literal(l)) => l,
                    Tag::Value(TagValue::Attribute(a)) => computed
                        .iter()
                        .find(|(have, _)| have == a)
                        .map_or(UNKNOWN, |(_, v)| v.as_str()),
                    Tag::Value(TagValue::RequestHeader(h)) => c
                        .headers
                        .iter()
                        .position(|have| have == h)
                        .and_then(|i| self.headers.get(i)?.as_deref())
                        .unwrap_or(UNKNOWN),
                    Tag::Unknown => UNKNOWN,
                });
            }
            match m.kind {
                Kind::Requests => s.increment(m.id, &values, 1),
                Kind::Duration => s.record(m.id, &values, duration),
                Kind::RequestBytes => s.record(
                    m.id,
                    &values,
                    s.attribute_int(attribute::REQUEST_TOTAL_SIZE).unwrap_or(0),
                ),
                Kind::ResponseBytes => s.record(
                    m.id,
                    &values,
                    s.attribute_int(attribute::RESPONSE_TOTAL_SIZE).unwrap_or(0),
                ),
            }
        }
    }

    fn attribute(&self, a: Attribute, s: &dyn HttpStream) -> String {
        let text = |id| string(s.attribute_string(id));
        let int = |id| s.attribute_int(id).map(|v| v.to_string());
        match a {
            Attribute::RequestHost => self.authority.clone(),
            Attribute::RequestMethod => text(attribute::REQUEST_METHOD),
            Attribute::RequestPath => text(attribute::REQUEST_PATH),
            Attribute::RequestScheme => text(attribute::REQUEST_SCHEME),
            Attribute::RequestProtocol => text(attribute::REQUEST_PROTOCOL),
            Attribute::RequestUserAgent => text(attribute::REQUEST_USER_AGENT),
            Attribute::RequestId => text(attribute::REQUEST_ID),
            Attribute::ResponseCode => int(attribute::RESPONSE_CODE),
            Attribute::DestinationPort => int(attribute::DESTINATION_PORT),
            Attribute::SourcePort => int(attribute::SOURCE_PORT),
            Attribute::SourceAddress => {
                text(attribute::SOURCE_ADDRESS).map(|a| without_port(&a).to_string())
            }
            Attribute::ClusterName => text(attribute::XDS_CLUSTER_NAME),
        }
        .unwrap_or_else(|| UNKNOWN.to_string())
    }
}

/// The flush's config: the TCP metrics in their standard shape.
pub struct FlushConfig {
    /// Ids of the four TCP counters, in [`TCP_METRICS`] order.
    ids: [usize; 4],
}

impl FlushConfig {
    pub fn new(envoy: &mut dyn HttpConfig) -> ConfigResult<FlushConfig> {
        let labels = tcp_labels();
        let mut ids = [0usize; 4];
        for (slot, short) in ids.iter_mut().zip(TCP_METRICS) {
            let name = metric_name(short);
            *slot = envoy.define_counter(&name, &labels).ok_or_else(|| {
                format!("filter istio.stats_flush: Envoy refused the metric {name}")
            })?;
        }
        Ok(FlushConfig { ids })
    }

    /// Moves the TCP counts since the last flush into the labelled counters.
    pub fn flush(&self, s: &mut dyn HttpStream) {
        for (labels, counts) in crate::tcp_metrics::drain() {
            let values: Vec<&str> = labels.iter().map(String::as_str).collect();
            for (id, n) in self.ids.iter().zip(counts) {
                if n > 0 {
                    s.increment(*id, &values, n);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use super::*;
    use crate::filters::fake::{FakeConfig, FakeStream, own};
    use crate::peer::{Workload, WorkloadType};

    fn sleep() -> Workload {
        Workload {
            instance: "sleep-1".into(),
            namespace: "demo".into(),
            workload: "sleep".into(),
            workload_type: WorkloadType::Deployment,
            cluster: "Kubernetes".into(),
            canonical_name: "sleep".into(),
            canonical_revision: "latest".into(),
            app: "sleep".into(),
            ..Workload::default()
        }
    }

    fn labelled(
        defined: &[(String, Vec<String>, bool)],
        m: &(usize, Vec<String>, u64, bool),
    ) -> BTreeMap<String, String> {
        defined[m.0 - 1]
            .1
            .iter()
            .cloned()
            .zip(m.1.iter().cloned())
            .collect()
    }

    #[test]
    fn a_server_reports_the_announced_and_certified_client() {
        let mut envoy = FakeConfig::default();
        let config = Config::new(
            serde_json::from_str(r#"{"disable_host_header_fallback":true}"#).unwrap(),
            own("httpbin"),
            &mut envoy,
        )
        .unwrap();
        assert_eq!(envoy.defined.len(), 4);
        assert_eq!(envoy.defined[0].0, "istio_requests_total");
        assert_eq!(envoy.defined[0].1.len(), 25);
        let mut s = FakeStream::default();
        s.request.insert(":authority".into(), "httpbin:8000".into());
        s.ints.insert(attribute::XDS_LISTENER_DIRECTION, 1);
        s.ints.insert(attribute::RESPONSE_CODE, 200);
        s.ints.insert(attribute::REQUEST_TOTAL_SIZE, 120);
        s.strings.insert(
            attribute::CONNECTION_URI_SAN_PEER,
            "spiffe://cluster.local/ns/demo/sa/sleep".into(),
        );
        s.strings.insert(
            attribute::CONNECTION_URI_SAN_LOCAL,
            "spiffe://cluster.local/ns/demo/sa/httpbin".into(),
        );
        s.state
            .insert(DOWNSTREAM_PEER.into(), sleep().header_value().into_bytes());
        let mut f = Filter::new(&config);
        f.on(Phase::RequestHeaders, &mut s);
        f.on(Phase::Complete, &mut s);
        assert_eq!(s.metrics.len(), 4);
        let l = labelled(&envoy.defined, &s.metrics[0]);
        assert_eq!(l["reporter"], "destination");
        assert_eq!(l["source_workload"], "sleep");
        assert_eq!(
            l["source_principal"],
            "spiffe://cluster.local/ns/demo/sa/sleep"
        );
        assert_eq!(l["destination_workload"], "httpbin");
        // The Host header is not the service inbound (disable_host_header_fallback).
        assert_eq!(l["destination_service"], "httpbin");
        assert_eq!(l["response_code"], "200");
        assert_eq!(l["grpc_response_status"], "");
        assert_eq!(l["response_flags"], "-");
        assert_eq!(l["connection_security_policy"], "mutual_tls");
        assert_eq!(s.metrics[2].2, 120);
    }

    #[test]
    fn an_announcement_from_another_namespace_than_the_certificate_is_not_believed() {
        let mut envoy = FakeConfig::default();
        let config = Config::new(Stats::default(), own("httpbin"), &mut envoy).unwrap();
        let mut s = FakeStream::default();
        s.ints.insert(attribute::XDS_LISTENER_DIRECTION, 1);
        s.strings.insert(
            attribute::CONNECTION_URI_SAN_PEER,
            "spiffe://cluster.local/ns/other/sa/sleep".into(),
        );
        s.state
            .insert(DOWNSTREAM_PEER.into(), sleep().header_value().into_bytes());
        let mut f = Filter::new(&config);
        f.on(Phase::RequestHeaders, &mut s);
        f.on(Phase::Complete, &mut s);
        let l = labelled(&envoy.defined, &s.metrics[0]);
        assert_eq!(l["source_workload"], "unknown");
        assert_eq!(l["source_workload_namespace"], "other");
    }

    #[test]
    fn overrides_as_istio_applies_them() {
        let configs: Vec<MetricConfig> = serde_json::from_str(
            r#"[{"name":"requests_total","dimensions":{"request_host":"request.host","source_app":"'fixed'"},
                 "tags_to_remove":["response_flags"]},
                {"name":"request_bytes","drop":true},
                {"dimensions":{"bad":"request.host + 1"}}]"#,
        )
        .unwrap();
        let standard = http_labels();
        let t = shape("requests_total", &standard, &configs).unwrap();
        let names: Vec<&str> = t.iter().map(|(n, _)| n.as_str()).collect();
        assert!(!names.contains(&"response_flags"));
        assert_eq!(&names[names.len() - 2..], ["bad", "request_host"]);
        assert_eq!(
            t.iter().find(|(n, _)| n == "source_app").unwrap().1,
            Tag::Value(TagValue::Literal("fixed".into()))
        );
        assert_eq!(
            t.last().unwrap().1,
            Tag::Value(TagValue::Attribute(Attribute::RequestHost))
        );
        assert_eq!(t[t.len() - 2].1, Tag::Unknown);
        assert!(shape("request_bytes", &standard, &configs).is_none());
        assert_eq!(
            shape("response_bytes", &standard, &configs).unwrap().len(),
            26
        );
    }

    #[test]
    fn response_flags_and_grpc_statuses() {
        assert_eq!(response_flags(0), "-");
        assert_eq!(response_flags(1 << 5 | 1 << 15), "UF,URX");
        assert_eq!(response_flags(1 << 8), "NR");
        assert_eq!(grpc_status_of_http(503), 14);
        assert_eq!(grpc_status_of_http(200), 2);
    }
}
