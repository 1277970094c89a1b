//! Istio's standard metrics (`istio_requests_total`, `istio_request_duration_milliseconds`,
//! `istio_request_bytes`, `istio_response_bytes`, `istio_tcp_*`) for an upstream Envoy, which
//! has no `istio.stats` filter: Envoy's OpenTelemetry access loggers (added to each listener by
//! `istiod_core::generators::telemetry`) send one record per request and per TCP connection event
//! to this OTLP logs server on a unix socket beside the xDS one; each record becomes a label set
//! as Istio's stats filter (istio/proxy `istio_stats.cc`) would label it, and the counters and
//! histograms are served in the agent's part of the 15020 exposition.
//!
//! Without Istio's metadata exchange the peer's workload, app, version, canonical service and
//! cluster are `unknown` (as Istio reports them for a peer without a sidecar), except where the
//! peer's certificate (`spiffe://TD/ns/NS/sa/SA`: principal and namespace) or the control plane's
//! endpoint metadata (`istio.workload`) tells them. The number of label sets is capped
//! ([`MAX_LABEL_SETS`]): records beyond it only count in an overflow counter, so a peer choosing
//! hosts or identities cannot grow the agent's memory without bound.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

use istio_proto::otlp_logs::logs_service_server::{LogsService, LogsServiceServer};
use istio_proto::otlp_logs::{
    AnyValue, ExportLogsServiceRequest, ExportLogsServiceResponse, KeyValue, any_value,
};
use mesh_common::telemetry::{Shape, attr};
use tokio::net::UnixListener;
use tonic::{Request, Response, Status};

use crate::config::Config;

mod shape;

/// Most label sets (series of all the metrics of one kind, HTTP or TCP) kept.
pub const MAX_LABEL_SETS: usize = 10_000;
/// Most TCP connections whose labels and bytes so far are remembered between their records.
pub const MAX_OPEN_CONNECTIONS: usize = 10_000;
/// Longest label value kept (longer ones, e.g. a hostile Host header, are cut).
pub const MAX_VALUE_BYTES: usize = 256;
/// Largest export request accepted from Envoy (it sends batches of 64 KiB).
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Envoy's default histogram buckets, which Istio's metrics use (milliseconds and bytes alike).
pub const BUCKETS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
];

const UNKNOWN: &str = "unknown";
const LATEST: &str = "latest";

/// The labels of every metric, in Istio's order; HTTP metrics add [`HTTP_ONLY`] before the
/// last two.
const LABELS: [&str; 23] = [
    "reporter",
    "source_workload",
    "source_canonical_service",
    "source_canonical_revision",
    "source_workload_namespace",
    "source_principal",
    "source_app",
    "source_version",
    "source_cluster",
    "destination_workload",
    "destination_workload_namespace",
    "destination_principal",
    "destination_app",
    "destination_version",
    "destination_service",
    "destination_canonical_service",
    "destination_canonical_revision",
    "destination_service_name",
    "destination_service_namespace",
    "destination_cluster",
    "request_protocol",
    "response_flags",
    "connection_security_policy",
];
const HTTP_ONLY: [&str; 2] = ["response_code", "grpc_response_status"];

/// A workload as the labels describe one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub name: String,
    pub namespace: String,
    pub canonical_service: String,
    pub canonical_revision: String,
    pub app: String,
    pub version: String,
    pub cluster: String,
}

impl Workload {
    /// A peer nothing is known of but what its certificate says.
    fn unknown(namespace: Option<&str>) -> Workload {
        Workload {
            name: UNKNOWN.into(),
            namespace: namespace.unwrap_or(UNKNOWN).into(),
            canonical_service: UNKNOWN.into(),
            canonical_revision: LATEST.into(),
            app: UNKNOWN.into(),
            version: UNKNOWN.into(),
            cluster: UNKNOWN.into(),
        }
    }

    /// The agent's own workload, from what the injector gives it (ISTIO_META_WORKLOAD_NAME,
    /// POD_NAMESPACE, the pod's labels, ISTIO_META_CLUSTER_ID), as Istio's filter reads them
    /// from the node metadata.
    pub fn own(cfg: &Config) -> Workload {
        let meta = |k: &str| {
            cfg.metadata
                .iter()
                .find(|(n, v)| n == k && !v.is_empty())
                .map(|(_, v)| v.clone())
        };
        let label = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| cfg.labels.get(*k).filter(|v| !v.is_empty()).cloned())
        };
        let name = meta("WORKLOAD_NAME").unwrap_or_else(|| UNKNOWN.into());
        Workload {
            canonical_service: label(&[
                "service.istio.io/canonical-name",
                "app.kubernetes.io/name",
                "app",
            ])
            .unwrap_or_else(|| name.clone()),
            canonical_revision: label(&[
                "service.istio.io/canonical-revision",
                "app.kubernetes.io/version",
                "version",
            ])
            .unwrap_or_else(|| LATEST.into()),
            app: label(&["app"]).unwrap_or_else(|| UNKNOWN.into()),
            version: label(&["version"]).unwrap_or_else(|| UNKNOWN.into()),
            cluster: meta("CLUSTER_ID").unwrap_or_else(|| UNKNOWN.into()),
            namespace: cfg.pod_namespace.clone(),
            name,
        }
    }

    /// Istio's endpoint metadata `istio.workload`: `name;namespace;service;revision;cluster`.
    fn from_endpoint(value: &str, san_namespace: Option<&str>) -> Option<Workload> {
        let mut parts = value.split(';');
        let mut next = |default: &str| match parts.next() {
            Some(p) if !p.is_empty() => p.to_string(),
            _ => default.to_string(),
        };
        let name = next(UNKNOWN);
        let namespace = next(UNKNOWN);
        let w = Workload {
            canonical_service: next(UNKNOWN),
            canonical_revision: next(LATEST),
            cluster: next(UNKNOWN),
            namespace: san_namespace.map(str::to_string).unwrap_or(namespace),
            app: UNKNOWN.into(),
            version: UNKNOWN.into(),
            name,
        };
        (w.name != UNKNOWN).then_some(w)
    }

    /// This workload's announcement in the peer exchange
    /// (`istiod_core::generators::telemetry::peer`): `key=value` pairs joined by `,`; a value
    /// that could not be read back (holding `,` or `=`) is left out.
    pub fn announcement(&self, service_account: &str) -> String {
        [
            ("n", self.name.as_str()),
            ("ns", &self.namespace),
            ("sa", service_account),
            ("app", &self.app),
            ("ver", &self.version),
            ("cs", &self.canonical_service),
            ("cr", &self.canonical_revision),
            ("cl", &self.cluster),
        ]
        .iter()
        .filter(|(_, v)| !v.is_empty() && !v.contains([',', '=']))
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
    }

    /// A peer's announcement, believed only when its namespace and service account are those of
    /// the peer's certificate on that connection (`peer_san`); `None` otherwise.
    fn from_announcement(value: &str, peer_san: Option<&str>) -> Option<Workload> {
        let id = mesh_common::identity::Identity::parse(peer_san?).ok()?;
        let (ns, sa) = (id.namespace.as_str(), id.service_account.as_str());
        let get = |key: &str| {
            value
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v)
                .filter(|v| !v.is_empty())
        };
        if get("ns") != Some(ns) || get("sa") != Some(sa) {
            return None;
        }
        let or = |key: &str, default: &str| bounded(get(key).unwrap_or(default)).into_string();
        Some(Workload {
            name: or("n", UNKNOWN),
            namespace: ns.to_string(),
            canonical_service: or("cs", UNKNOWN),
            canonical_revision: or("cr", LATEST),
            app: or("app", UNKNOWN),
            version: or("ver", UNKNOWN),
            cluster: or("cl", UNKNOWN),
        })
    }
}

/// One access-log record's attributes, in the order Envoy sent them, then its batch's (the
/// logger's reporter and kind), borrowed from the request (a record has about twenty: a scan
/// is cheaper than a map).
struct Record<'a>(Vec<(&'a str, Cow<'a, str>)>);

impl<'a> Record<'a> {
    fn of(attributes: &'a [KeyValue], batch: &'a [KeyValue]) -> Record<'a> {
        Record(
            attributes
                .iter()
                .chain(batch.iter().filter(|kv| kv.key != attr::SHAPE))
                .filter_map(|kv| Some((kv.key.as_str(), text(kv.value.as_ref()?)?)))
                .collect(),
        )
    }

    /// The attribute, `None` when Envoy had no value (`-`) or sent none.
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_ref())
            .filter(|v| !v.is_empty() && *v != "-")
    }

    fn number(&self, key: &str) -> u64 {
        self.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    /// Writes into `out` every attribute a series' labels can depend on (all but a record's
    /// own counts and times), so two records with the same bytes here have the same labels.
    fn label_inputs(&self, out: &mut Vec<u8>) {
        for (k, v) in &self.0 {
            if PER_RECORD.contains(k) {
                continue;
            }
            out.extend_from_slice(k.as_bytes());
            out.push(0);
            out.extend_from_slice(v.as_bytes());
            out.push(0);
        }
    }
}

/// The attributes that differ from one record to the next without changing its labels.
const PER_RECORD: [&str; 5] = [
    attr::DURATION_MS,
    attr::RECEIVED_BYTES,
    attr::SENT_BYTES,
    attr::CONNECTION,
    attr::LOG_TYPE,
];

/// An attribute's value as text (Envoy sends a command's number as a number or as text).
fn text(v: &AnyValue) -> Option<Cow<'_, str>> {
    Some(match v.value.as_ref()? {
        any_value::Value::StringValue(s) => Cow::Borrowed(s.as_str()),
        any_value::Value::IntValue(i) => Cow::Owned(i.to_string()),
        any_value::Value::DoubleValue(d) => Cow::Owned(format!("{d}")),
        any_value::Value::BoolValue(b) => Cow::Owned(b.to_string()),
    })
}

/// The namespace of a SPIFFE id `spiffe://TD/ns/NS/sa/SA`.
fn spiffe_namespace(id: &str) -> Option<&str> {
    let rest = id.split_once("/ns/")?.1;
    let ns = rest.split('/').next()?;
    (!ns.is_empty()).then_some(ns)
}

/// One entry of Istio's cluster metadata `istio.services`.
#[derive(Debug, serde::Deserialize)]
struct ServiceMeta {
    host: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
}

/// The first service of `%CLUSTER_METADATA(istio:services)%` (Envoy writes the list as JSON).
fn first_service(json: &str) -> Option<ServiceMeta> {
    serde_json::from_str::<Vec<ServiceMeta>>(json)
        .ok()?
        .into_iter()
        .find(|s| !s.host.is_empty())
}

/// The host of an Istio cluster name `outbound|PORT|SUBSET|HOST` (or `inbound|...`).
fn cluster_host(cluster: &str) -> Option<&str> {
    let mut parts = cluster.split('|');
    let direction = parts.next()?;
    if direction != "outbound" && direction != "inbound" {
        return None;
    }
    parts.nth(2).filter(|h| !h.is_empty())
}

/// A Host header without its port.
fn without_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority
            .split_once(']')
            .map_or(authority, |(h, _)| &authority[..h.len() + 1]);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

fn first(list: Option<&str>) -> Option<&str> {
    list.and_then(|l| l.split(',').next())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Cuts `value` to [`MAX_VALUE_BYTES`] at a character boundary.
fn bounded(value: &str) -> Box<str> {
    if value.len() <= MAX_VALUE_BYTES {
        return value.into();
    }
    let mut end = MAX_VALUE_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end].into()
}

/// The label values of one series, aligned with [`LABELS`] (then [`HTTP_ONLY`] for HTTP).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key(Box<[Box<str>]>);

/// The labels of `record` as Istio's stats filter sets them, for a sidecar whose own workload
/// is `own`.
fn labels(own: &Workload, r: &Record<'_>, http: bool) -> Key {
    let destination = r.get(attr::REPORTER) == Some("destination");
    let peer_san = first(r.get(attr::PEER_SAN));
    let local_san = first(r.get(attr::LOCAL_SAN));
    let peer_ns = peer_san.and_then(spiffe_namespace);
    let cluster = r.get(attr::CLUSTER);
    let authority = r.get(attr::AUTHORITY).map(without_port);
    let special = cluster.filter(|c| {
        matches!(
            *c,
            "BlackHoleCluster"
                | "PassthroughCluster"
                | "InboundPassthroughCluster"
                | "InboundPassthroughClusterIpv4"
                | "InboundPassthroughClusterIpv6"
        )
    });
    // The service: Istio's cluster metadata `services[0]` where the control plane set it (istiod
    // does on inbound clusters, whose names carry no host), else the cluster name's host, else
    // the request's Host (Istio's fallback). Its short name is the metadata's name, else a
    // Kubernetes service's first label, else the host itself (a ServiceEntry's).
    let meta_service = r.get(attr::SERVICES).and_then(first_service);
    let from_cluster = meta_service
        .as_ref()
        .map(|m| m.host.as_str())
        .or_else(|| cluster.and_then(cluster_host));
    let service_name = |service: &str| match (special, &meta_service) {
        (Some(s), _) => s.to_string(),
        (None, Some(m)) if m.host == service && !m.name.is_empty() => m.name.clone(),
        (None, _) if service.contains(".svc.") || service.ends_with(".svc") => {
            service.split('.').next().unwrap_or(service).to_string()
        }
        (None, _) => service.to_string(),
    };
    let unknown = || UNKNOWN.to_string();
    let (source, destination_workload, source_principal, destination_principal) = if destination {
        (
            r.get(attr::PEER)
                .and_then(|a| Workload::from_announcement(a, peer_san))
                .unwrap_or_else(|| Workload::unknown(peer_ns)),
            own.clone(),
            peer_san.map_or_else(unknown, str::to_string),
            local_san.map_or_else(unknown, str::to_string),
        )
    } else {
        let peer = r
            .get(attr::PEER)
            .and_then(|a| Workload::from_announcement(a, peer_san))
            .or_else(|| {
                r.get(attr::ENDPOINT)
                    .and_then(|e| Workload::from_endpoint(e, peer_ns))
            })
            .unwrap_or_else(|| Workload::unknown(peer_ns));
        (
            own.clone(),
            peer,
            local_san.map_or_else(unknown, str::to_string),
            peer_san.map_or_else(unknown, str::to_string),
        )
    };
    let service = if destination {
        from_cluster
            .or(authority)
            .map_or_else(|| own.canonical_service.clone(), str::to_string)
    } else {
        from_cluster
            .or(authority)
            .map_or_else(unknown, str::to_string)
    };
    let service_namespace = match &meta_service {
        Some(m) if !m.namespace.is_empty() => m.namespace.clone(),
        _ if destination => own.namespace.clone(),
        _ => destination_workload.namespace.clone(),
    };
    let protocol = if !http {
        "tcp"
    } else if r
        .get(attr::CONTENT_TYPE)
        .is_some_and(|c| c.starts_with("application/grpc"))
    {
        "grpc"
    } else {
        "http"
    };
    let security = if !destination {
        UNKNOWN
    } else if peer_san.is_some() && local_san.is_some() {
        "mutual_tls"
    } else {
        "none"
    };
    let d = &destination_workload;
    let mut values: Vec<String> = vec![
        if destination { "destination" } else { "source" }.into(),
        source.name,
        source.canonical_service,
        source.canonical_revision,
        source.namespace,
        source_principal,
        source.app,
        source.version,
        source.cluster,
        d.name.clone(),
        d.namespace.clone(),
        destination_principal,
        d.app.clone(),
        d.version.clone(),
        service.clone(),
        d.canonical_service.clone(),
        d.canonical_revision.clone(),
        service_name(&service),
        service_namespace,
        d.cluster.clone(),
        protocol.into(),
        r.get(attr::RESPONSE_FLAGS).unwrap_or("-").into(),
        security.into(),
    ];
    if http {
        let code = r.get(attr::RESPONSE_CODE).unwrap_or("0").to_string();
        let grpc = if protocol == "grpc" {
            r.get(attr::GRPC_STATUS).unwrap_or("").to_string()
        } else {
            String::new()
        };
        // response_code and grpc_response_status go before the last two, as in Istio.
        let tail = values.split_off(values.len() - 2);
        values.extend([code, grpc]);
        values.extend(tail);
    }
    Key(values.iter().map(|v| bounded(v)).collect())
}

/// Counts of one histogram: per bucket (not cumulative), then the sum and count.
#[derive(Debug, Clone, Default)]
struct Histogram {
    buckets: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn record(&mut self, value: u64) {
        #[allow(clippy::cast_precision_loss)]
        let v = value as f64;
        if let Some(i) = BUCKETS.iter().position(|b| v <= *b) {
            self.buckets[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }
}

#[derive(Debug, Clone, Default)]
struct HttpSeries {
    /// The Telemetry overrides the series' records came with (`None`: Istio's labels as is).
    shape: Option<Arc<Shape>>,
    requests: u64,
    duration: Histogram,
    request_bytes: Histogram,
    response_bytes: Histogram,
}

#[derive(Debug, Clone, Default)]
struct TcpSeries {
    shape: Option<Arc<Shape>>,
    opened: u64,
    closed: u64,
    sent: u64,
    received: u64,
}

/// A TCP connection between its records: its labels and the bytes already counted.
struct OpenConnection {
    key: Arc<Key>,
    sent: u64,
    received: u64,
}

/// A memo entry: the shape a key was worked out under, and the key.
type Memo = (Option<Arc<Shape>>, Arc<Key>);

#[derive(Default)]
struct State {
    http: HashMap<Arc<Key>, HttpSeries>,
    tcp: HashMap<Arc<Key>, TcpSeries>,
    open: HashMap<(bool, u64), OpenConnection>,
    overflow: u64,
    /// The labels of HTTP records already seen, by their label inputs
    /// ([`Record::label_inputs`]) and shape: most records repeat a recent one, and working
    /// out a label set (parsing identities, announcements and service metadata) costs more
    /// than the rest of a record. Emptied when it holds [`MAX_LABEL_SETS`] entries.
    /// Each entry holds its shape, so that no other shape can take the address it is keyed by.
    memo: HashMap<Box<[u8]>, Memo>,
    /// The buffer a record's label inputs are written to, reused.
    scratch: Vec<u8>,
}

impl State {
    fn full(&self) -> bool {
        self.http.len() + self.tcp.len() >= MAX_LABEL_SETS
    }

    fn http_series(&mut self, key: &Arc<Key>) -> Option<&mut HttpSeries> {
        let full = self.full();
        series(&mut self.http, key, full, &mut self.overflow)
    }

    fn tcp_series(&mut self, key: &Arc<Key>) -> Option<&mut TcpSeries> {
        let full = self.full();
        series(&mut self.tcp, key, full, &mut self.overflow)
    }
}

/// The series of `key` in `map`, added unless the label sets are at their cap (`full`: then
/// the record only counts in `overflow`).
fn series<'m, S: Default>(
    map: &'m mut HashMap<Arc<Key>, S>,
    key: &Arc<Key>,
    full: bool,
    overflow: &mut u64,
) -> Option<&'m mut S> {
    if !map.contains_key(key) {
        if full {
            *overflow += 1;
            return None;
        }
        map.insert(key.clone(), S::default());
    }
    map.get_mut(key)
}

/// The aggregated standard metrics of this sidecar.
pub struct StandardMetrics {
    own: Workload,
    state: Mutex<State>,
    shapes: shape::Shapes,
}

impl StandardMetrics {
    pub fn new(own: Workload) -> StandardMetrics {
        StandardMetrics {
            own,
            state: Mutex::new(State::default()),
            shapes: shape::Shapes::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves counts, never broken invariants: keep going.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts every log record of an export request.
    pub fn record(&self, request: &ExportLogsServiceRequest) {
        let mut state = self.state();
        for batch in &request.resource_logs {
            let resource = batch
                .resource
                .as_ref()
                .map_or(&[][..], |r| &r.attributes[..]);
            let shape = self.shapes.of(resource);
            for record in batch.scope_logs.iter().flat_map(|s| &s.log_records) {
                let r = Record::of(&record.attributes, resource);
                match r.get(attr::KIND) {
                    Some("http") => self.http(&mut state, &r, shape.as_ref()),
                    Some("tcp") => self.tcp(&mut state, &r, shape.as_ref()),
                    _ => {}
                }
            }
        }
    }

    /// The record's key: its standard labels, then (under a shape) its dimensions.
    fn key(&self, r: &Record<'_>, http: bool, shape: Option<&Arc<Shape>>) -> Key {
        let key = labels(&self.own, r, http);
        let Some(shape) = shape else {
            return key;
        };
        let mut values = key.0.into_vec();
        for (k, v) in shape::dimensions(shape, |a| r.get(a)) {
            values.push(k.into());
            values.push(bounded(&v));
        }
        Key(values.into_boxed_slice())
    }

    fn http(&self, state: &mut State, r: &Record<'_>, shape: Option<&Arc<Shape>>) {
        let key = self.http_key(state, r, shape);
        if let Some(s) = state.http_series(&key) {
            s.shape = shape.cloned();
            s.requests += 1;
            s.duration.record(r.number(attr::DURATION_MS));
            s.request_bytes.record(r.number(attr::RECEIVED_BYTES));
            s.response_bytes.record(r.number(attr::SENT_BYTES));
        }
    }

    /// An HTTP record's key, from the memo when a record with the same label inputs and shape
    /// came before.
    fn http_key(&self, state: &mut State, r: &Record<'_>, shape: Option<&Arc<Shape>>) -> Arc<Key> {
        let mut inputs = std::mem::take(&mut state.scratch);
        inputs.clear();
        // The shape by its address: the same logger's batches come with the same `Arc`
        // (`shape::Shapes`), and the memo keeps it alive.
        let shape_id = shape.map_or(0, |s| Arc::as_ptr(s) as usize);
        inputs.extend_from_slice(&shape_id.to_le_bytes());
        r.label_inputs(&mut inputs);
        let key = match state.memo.get(inputs.as_slice()) {
            Some((_, key)) => key.clone(),
            None => {
                let key = Arc::new(self.key(r, true, shape));
                if state.memo.len() >= MAX_LABEL_SETS {
                    state.memo.clear();
                }
                state
                    .memo
                    .insert(inputs.as_slice().into(), (shape.cloned(), key.clone()));
                key
            }
        };
        state.scratch = inputs;
        key
    }

    /// A TCP connection counts as opened at its first record (Envoy logs every 15 s and at the
    /// end), its bytes as they grow, and closed at its end. A record of the upstream connecting
    /// is ignored: an inbound one comes before the client's certificate is known.
    fn tcp(&self, state: &mut State, r: &Record<'_>, shape: Option<&Arc<Shape>>) {
        let kind = r.get(attr::LOG_TYPE);
        if kind == Some("TcpUpstreamConnected") {
            return;
        }
        let end = kind == Some("TcpConnectionEnd");
        let id = (
            r.get(attr::REPORTER) == Some("destination"),
            r.number(attr::CONNECTION),
        );
        let (sent, received) = (r.number(attr::SENT_BYTES), r.number(attr::RECEIVED_BYTES));
        let known = if end {
            state.open.remove(&id)
        } else {
            state.open.get(&id).map(|c| OpenConnection {
                key: c.key.clone(),
                sent: c.sent,
                received: c.received,
            })
        };
        let (key, before_sent, before_received) = match known {
            Some(c) => (c.key, c.sent, c.received),
            None => {
                let key = Arc::new(self.key(r, false, shape));
                if !end && state.open.len() >= MAX_OPEN_CONNECTIONS {
                    // Not remembered: counted once, at its end, in full.
                    return;
                }
                if let Some(s) = state.tcp_series(&key) {
                    s.opened += 1;
                }
                (key, 0, 0)
            }
        };
        if let Some(s) = state.tcp_series(&key) {
            s.shape = shape.cloned();
            s.sent += sent.saturating_sub(before_sent);
            s.received += received.saturating_sub(before_received);
            if end {
                s.closed += 1;
            }
        }
        if !end {
            state.open.insert(
                id,
                OpenConnection {
                    key,
                    sent: sent.max(before_sent),
                    received: received.max(before_received),
                },
            );
        }
    }

    /// The label sets held (HTTP and TCP).
    pub fn label_sets(&self) -> usize {
        let s = self.state();
        s.http.len() + s.tcp.len()
    }

    /// The metrics in the Prometheus text format, appended to `out` (tests and tools; the
    /// status port streams [`StandardMetrics::exposition`] instead).
    pub fn encode(&self, out: &mut String) {
        for chunk in self.exposition() {
            out.push_str(&chunk);
        }
    }

    /// The metrics in the Prometheus text format, in chunks of about [`CHUNK_BYTES`], written
    /// from a snapshot taken now (the label sets are shared, not copied): a scrape never holds
    /// the lock, nor the whole text, which for thousands of label sets is tens of megabytes.
    pub fn exposition(&self) -> Exposition {
        let state = self.state();
        let mut e = Exposition {
            http: state
                .http
                .iter()
                .map(|(k, s)| (k.clone(), s.clone()))
                .collect(),
            tcp: state
                .tcp
                .iter()
                .map(|(k, s)| (k.clone(), s.clone()))
                .collect(),
            overflow: state.overflow,
            projected: None,
            family: 0,
            series: 0,
        };
        drop(state);
        if e.http.iter().any(|(_, s)| s.shape.is_some())
            || e.tcp.iter().any(|(_, s)| s.shape.is_some())
        {
            e.projected = Some(projected(&e.http, &e.tcp));
        }
        e
    }
}

/// Chunk size of the streamed exposition.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// The HTTP metric families, in order: a counter, then three histograms.
const HTTP_FAMILIES: [&str; 4] = [
    "istio_requests_total",
    "istio_request_duration_milliseconds",
    "istio_request_bytes",
    "istio_response_bytes",
];
const TCP_FAMILIES: [&str; 4] = [
    "istio_tcp_sent_bytes_total",
    "istio_tcp_received_bytes_total",
    "istio_tcp_connections_opened_total",
    "istio_tcp_connections_closed_total",
];

/// A snapshot of the metrics being written out, family by family, series by series.
pub struct Exposition {
    http: Vec<(Arc<Key>, HttpSeries)>,
    tcp: Vec<(Arc<Key>, TcpSeries)>,
    overflow: u64,
    /// Under Telemetry overrides: each family's series with their labels as shaped (and
    /// series whose labels became equal added up), in place of `http` and `tcp`.
    projected: Option<Vec<Family>>,
    family: usize,
    series: usize,
}

impl Exposition {
    /// Writes the next series (or a family's header, or the trailer) to `out`; false when done.
    fn step(&mut self, out: &mut String) -> bool {
        if let Some(families) = &self.projected {
            let (f, i) = (self.family, self.series);
            if let Some(family) = families.get(f) {
                let Some((labels, value)) = family.series.get(i) else {
                    (self.family, self.series) = (f + 1, 0);
                    return true;
                };
                if i == 0 {
                    header(out, family.name, family.kind);
                }
                match value {
                    Sum::Count(n) => {
                        let _ = writeln!(out, "{}{{{labels}}} {n}", family.name);
                    }
                    Sum::Histogram(h) => shaped_histogram(out, family.name, labels, h),
                }
                self.series += 1;
                return true;
            }
            if f == families.len() {
                // The trailer, as below.
                self.family = 8;
            } else {
                return false;
            }
        }
        let http_labels = http_label_names();
        let (f, i) = (self.family, self.series);
        match f {
            0..=3 => {
                let name = HTTP_FAMILIES[f];
                let Some((k, s)) = self.http.get(i) else {
                    (self.family, self.series) = (f + 1, 0);
                    return true;
                };
                if i == 0 {
                    header(out, name, if f == 0 { "counter" } else { "histogram" });
                }
                match f {
                    0 => sample(out, name, &http_labels, k, None, s.requests),
                    1 => histogram(out, name, &http_labels, k, &s.duration),
                    2 => histogram(out, name, &http_labels, k, &s.request_bytes),
                    _ => histogram(out, name, &http_labels, k, &s.response_bytes),
                }
            }
            4..=7 => {
                let name = TCP_FAMILIES[f - 4];
                let Some((k, s)) = self.tcp.get(i) else {
                    (self.family, self.series) = (f + 1, 0);
                    return true;
                };
                if i == 0 {
                    header(out, name, "counter");
                }
                let value = [s.sent, s.received, s.opened, s.closed][f - 4];
                sample(out, name, &LABELS, k, None, value);
            }
            8 => {
                header(out, "istio_agent_standard_metrics_label_sets", "gauge");
                let _ = writeln!(
                    out,
                    "istio_agent_standard_metrics_label_sets {}",
                    self.http.len() + self.tcp.len()
                );
                header(
                    out,
                    "istio_agent_standard_metrics_overflow_total",
                    "counter",
                );
                let _ = writeln!(
                    out,
                    "istio_agent_standard_metrics_overflow_total {}",
                    self.overflow
                );
                (self.family, self.series) = (f + 1, 0);
                return true;
            }
            _ => return false,
        }
        self.series += 1;
        true
    }
}

/// One metric family as shaped: its series' rendered labels and values.
struct Family {
    name: &'static str,
    kind: &'static str,
    series: Vec<(String, Sum)>,
}

#[derive(Debug, Clone)]
enum Sum {
    Count(u64),
    Histogram(Histogram),
}

impl Sum {
    fn add(&mut self, other: &Sum) {
        match (self, other) {
            (Sum::Count(a), Sum::Count(b)) => *a += b,
            (Sum::Histogram(a), Sum::Histogram(b)) => {
                for (x, y) in a.buckets.iter_mut().zip(b.buckets) {
                    *x += y;
                }
                a.sum += b.sum;
                a.count += b.count;
            }
            _ => {}
        }
    }
}

/// The labels `k="v",...`, escaped.
fn render(labels: &[(String, String)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        escape(&mut out, v);
        out.push('"');
    }
    out
}

/// Every family with its series' labels shaped (see `shape`), equal label sets added up.
fn projected(http: &[(Arc<Key>, HttpSeries)], tcp: &[(Arc<Key>, TcpSeries)]) -> Vec<Family> {
    let http_labels = http_label_names();
    let split = |key: &Key, standard: usize| -> (Vec<Box<str>>, Vec<shape::Dim>) {
        let (std, rest) = key.0.split_at(standard.min(key.0.len()));
        let dims = rest
            .chunks_exact(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect();
        (std.to_vec(), dims)
    };
    let mut families = Vec::new();
    let mut add = |name: &'static str,
                   kind: &'static str,
                   names: &[&str],
                   series: Vec<(&Key, Option<&Arc<Shape>>, Sum)>| {
        let metric = name.trim_start_matches("istio_");
        let mut sums: std::collections::BTreeMap<String, Sum> = std::collections::BTreeMap::new();
        for (key, shape, value) in series {
            let (values, dims) = split(key, names.len());
            let labels = match shape {
                Some(shape) => match shape::project(shape, metric, names, &values, &dims) {
                    Some(l) => l,
                    None => continue,
                },
                None => names
                    .iter()
                    .zip(&values)
                    .map(|(n, v)| ((*n).to_string(), v.to_string()))
                    .collect(),
            };
            let rendered = render(&labels);
            match sums.get_mut(&rendered) {
                Some(sum) => sum.add(&value),
                None => {
                    sums.insert(rendered, value);
                }
            }
        }
        families.push(Family {
            name,
            kind,
            series: sums.into_iter().collect(),
        });
    };
    for (f, name) in HTTP_FAMILIES.iter().enumerate() {
        let series = http
            .iter()
            .map(|(k, s)| {
                let v = match f {
                    0 => Sum::Count(s.requests),
                    1 => Sum::Histogram(s.duration.clone()),
                    2 => Sum::Histogram(s.request_bytes.clone()),
                    _ => Sum::Histogram(s.response_bytes.clone()),
                };
                (&**k, s.shape.as_ref(), v)
            })
            .collect();
        add(
            name,
            if f == 0 { "counter" } else { "histogram" },
            &http_labels,
            series,
        );
    }
    for (f, name) in TCP_FAMILIES.iter().enumerate() {
        let series = tcp
            .iter()
            .map(|(k, s)| {
                let v = [s.sent, s.received, s.opened, s.closed][f];
                (&**k, s.shape.as_ref(), Sum::Count(v))
            })
            .collect();
        add(name, "counter", &LABELS, series);
    }
    families
}

/// A histogram's lines with rendered labels.
fn shaped_histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    let sep = if labels.is_empty() { "" } else { "," };
    let mut cumulative = 0;
    for (b, n) in BUCKETS.iter().zip(h.buckets) {
        cumulative += n;
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
}

/// The labels of the HTTP metrics: [`LABELS`] with [`HTTP_ONLY`] before the last two.
fn http_label_names() -> Vec<&'static str> {
    LABELS[..LABELS.len() - 2]
        .iter()
        .chain(&HTTP_ONLY)
        .chain(&LABELS[LABELS.len() - 2..])
        .copied()
        .collect()
}

impl Iterator for Exposition {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        let mut out = String::new();
        while out.len() < CHUNK_BYTES && self.step(&mut out) {}
        (!out.is_empty()).then_some(out)
    }
}

fn header(out: &mut String, name: &str, kind: &str) {
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// `name{labels[,le="le"]} value`.
fn sample(out: &mut String, name: &str, labels: &[&str], key: &Key, le: Option<&str>, value: u64) {
    out.push_str(name);
    out.push('{');
    for (i, (label, value)) in labels.iter().zip(key.0.iter()).enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(label);
        out.push_str("=\"");
        escape(out, value);
        out.push('"');
    }
    if let Some(le) = le {
        let _ = write!(out, ",le=\"{le}\"");
    }
    let _ = writeln!(out, "}} {value}");
}

fn histogram(out: &mut String, name: &str, labels: &[&str], key: &Key, h: &Histogram) {
    let bucket = format!("{name}_bucket");
    let mut cumulative = 0;
    for (b, n) in BUCKETS.iter().zip(h.buckets) {
        cumulative += n;
        sample(out, &bucket, labels, key, Some(&format!("{b}")), cumulative);
    }
    sample(out, &bucket, labels, key, Some("+Inf"), h.count);
    // The sum as Envoy writes it: a number, not `u64`.
    let mut line = String::new();
    sample(&mut line, &format!("{name}_sum"), labels, key, None, 0);
    if let Some(stripped) = line.strip_suffix(" 0\n") {
        let _ = writeln!(out, "{stripped} {}", h.sum);
    }
    sample(out, &format!("{name}_count"), labels, key, None, h.count);
}

/// Escapes a label value for the text format (backslash, double quote, newline).
fn escape(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// The OTLP logs service Envoy's access loggers export to.
struct Collector(Arc<StandardMetrics>);

#[tonic::async_trait]
impl LogsService for Collector {
    async fn export(
        &self,
        request: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        self.0.record(request.get_ref());
        Ok(Response::new(ExportLogsServiceResponse::default()))
    }
}

/// The telemetry socket's path: `TELEMETRY` beside the xDS socket.
pub fn socket_path(cfg: &Config) -> std::path::PathBuf {
    cfg.config_path.join("TELEMETRY")
}

#[derive(Debug, thiserror::Error)]
#[error("cannot prepare the telemetry socket {path}: {source}")]
pub struct TelemetryError {
    pub path: std::path::PathBuf,
    pub source: std::io::Error,
}

/// Binds the socket (replacing a stale one): 0600, owned by Envoy's uid when given (`uds::bind`).
pub fn bind(path: &Path, envoy_uid: Option<u32>) -> Result<UnixListener, TelemetryError> {
    crate::uds::bind(path, envoy_uid, false).map_err(|source| TelemetryError {
        path: path.to_path_buf(),
        source,
    })
}

/// Serves the OTLP logs service to connections from `allowed_uids` until `shutdown` resolves.
pub async fn serve(
    listener: UnixListener,
    allowed_uids: Vec<u32>,
    metrics: Arc<StandardMetrics>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(
            LogsServiceServer::new(Collector(metrics)).max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .serve_with_incoming_shutdown(
            crate::uds::authorized(listener, allowed_uids, "telemetry"),
            shutdown,
        )
        .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use istio_proto::otlp_logs::{LogRecord, ResourceLogs, ScopeLogs};
    use prost::Message;

    fn own() -> Workload {
        Workload {
            name: "b".into(),
            namespace: "ns-b".into(),
            canonical_service: "b".into(),
            canonical_revision: "v1".into(),
            app: "b".into(),
            version: "v1".into(),
            cluster: "Kubernetes".into(),
        }
    }

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.into())),
            }),
        }
    }

    /// An export request as Envoy sends it: encoded, then decoded as the server would.
    fn export(records: &[&[(&str, &str)]]) -> ExportLogsServiceRequest {
        let req = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: None,
                scope_logs: vec![ScopeLogs {
                    log_records: records
                        .iter()
                        .map(|attrs| LogRecord {
                            time_unix_nano: 1,
                            body: None,
                            attributes: attrs.iter().map(|(k, v)| kv(k, v)).collect(),
                        })
                        .collect(),
                }],
            }],
        };
        ExportLogsServiceRequest::decode(req.encode_to_vec().as_slice()).unwrap()
    }

    const A: &str = "spiffe://cluster.local/ns/ns-a/sa/a";
    const B: &str = "spiffe://cluster.local/ns/ns-b/sa/b";

    fn inbound_http(code: &str) -> Vec<(&'static str, String)> {
        vec![
            ("reporter", "destination".into()),
            ("kind", "http".into()),
            ("peer_san", A.into()),
            ("local_san", B.into()),
            ("cluster", "inbound|8080||".into()),
            ("authority", "b.ns-b.svc.cluster.local:8080".into()),
            ("content_type", "-".into()),
            ("response_code", code.into()),
            ("grpc_status", "-".into()),
            ("response_flags", "-".into()),
            ("duration_ms", "7".into()),
            ("received_bytes", "120".into()),
            ("sent_bytes", "2000".into()),
        ]
    }

    fn run(m: &StandardMetrics, records: &[Vec<(&'static str, String)>]) {
        let owned: Vec<Vec<(&str, &str)>> = records
            .iter()
            .map(|r| r.iter().map(|(k, v)| (*k, v.as_str())).collect())
            .collect();
        let slices: Vec<&[(&str, &str)]> = owned.iter().map(Vec::as_slice).collect();
        m.record(&export(&slices));
    }

    /// `record` with `key` set to `value` (replacing its earlier value).
    fn set(record: &mut Vec<(&'static str, String)>, key: &'static str, value: impl Into<String>) {
        record.retain(|(k, _)| *k != key);
        record.push((key, value.into()));
    }

    fn text(m: &StandardMetrics) -> String {
        let mut out = String::new();
        m.encode(&mut out);
        out
    }

    #[test]
    fn records_alike_but_for_their_counts_share_a_series_and_any_label_input_splits_one() {
        let m = StandardMetrics::new(own());
        let mut slower = inbound_http("200");
        set(&mut slower, "duration_ms", "900");
        let mut other_flags = inbound_http("200");
        set(&mut other_flags, "response_flags", "UF");
        run(
            &m,
            &[
                inbound_http("200"),
                slower,
                inbound_http("503"),
                other_flags,
            ],
        );
        run(&m, &[inbound_http("200")]);
        assert_eq!(m.label_sets(), 3, "{}", text(&m));
        let out = text(&m);
        let requests = |code: &str, flags: &str| {
            out.lines()
                .find(|l| {
                    l.starts_with("istio_requests_total{")
                        && l.contains(&format!("response_code=\"{code}\""))
                        && l.contains(&format!("response_flags=\"{flags}\""))
                })
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_string)
        };
        assert_eq!(requests("200", "-").as_deref(), Some("3"), "{out}");
        assert_eq!(requests("503", "-").as_deref(), Some("1"), "{out}");
        assert_eq!(requests("200", "UF").as_deref(), Some("1"), "{out}");
        // The slow request is in the 1000 ms bucket of the shared series, not a series of its own.
        assert!(
            out.lines().any(
                |l| l.starts_with("istio_request_duration_milliseconds_bucket{")
                    && l.contains("response_code=\"200\"")
                    && l.contains("response_flags=\"-\"")
                    && l.contains("le=\"500\"}")
                    && l.ends_with(" 2")
            ),
            "{out}"
        );
    }

    #[test]
    fn inbound_service_comes_from_istiods_cluster_metadata() {
        // istiod's inbound clusters carry no host in their name; their metadata names the
        // service, which wins over the request's Host (a short name here).
        let m = StandardMetrics::new(own());
        let mut r = inbound_http("200");
        set(&mut r, "authority", "b:8080");
        r.push((
            "services",
            r#"[{"host":"b.ns-b.svc.cluster.local","name":"b-svc","namespace":"ns-b"}]"#.into(),
        ));
        run(&m, &[r]);
        let out = text(&m);
        assert!(
            out.contains(
                "destination_service=\"b.ns-b.svc.cluster.local\",destination_canonical_service=\"b\",\
                 destination_canonical_revision=\"v1\",destination_service_name=\"b-svc\",\
                 destination_service_namespace=\"ns-b\""
            ),
            "{out}"
        );
        // Without the metadata, the Host header's name, as before.
        let m = StandardMetrics::new(own());
        let mut r = inbound_http("200");
        set(&mut r, "authority", "b:8080");
        r.push(("services", "-".into()));
        run(&m, &[r]);
        assert!(
            text(&m).contains("destination_service=\"b\","),
            "{}",
            text(&m)
        );
    }

    #[test]
    fn inbound_http_is_labelled_as_istio_does() {
        let m = StandardMetrics::new(own());
        run(
            &m,
            &[
                inbound_http("200"),
                inbound_http("200"),
                inbound_http("503"),
            ],
        );
        let out = text(&m);
        let expected = format!(
            "istio_requests_total{{reporter=\"destination\",source_workload=\"unknown\",\
             source_canonical_service=\"unknown\",source_canonical_revision=\"latest\",\
             source_workload_namespace=\"ns-a\",source_principal=\"{A}\",source_app=\"unknown\",\
             source_version=\"unknown\",source_cluster=\"unknown\",destination_workload=\"b\",\
             destination_workload_namespace=\"ns-b\",destination_principal=\"{B}\",\
             destination_app=\"b\",destination_version=\"v1\",\
             destination_service=\"b.ns-b.svc.cluster.local\",destination_canonical_service=\"b\",\
             destination_canonical_revision=\"v1\",destination_service_name=\"b\",\
             destination_service_namespace=\"ns-b\",destination_cluster=\"Kubernetes\",\
             request_protocol=\"http\",response_code=\"200\",grpc_response_status=\"\",\
             response_flags=\"-\",connection_security_policy=\"mutual_tls\"}} 2\n"
        );
        assert!(out.contains(&expected), "{out}");
        assert!(out.contains("response_code=\"503\""), "{out}");
        assert!(out.contains("# TYPE istio_request_duration_milliseconds histogram"));
        // 7 ms: in the 10 ms bucket, not the 5 ms one.
        assert!(
            out.lines().any(
                |l| l.starts_with("istio_request_duration_milliseconds_bucket")
                    && l.contains("response_code=\"200\"")
                    && l.ends_with("le=\"10\"} 2")
            ),
            "{out}"
        );
        assert!(
            out.lines().any(
                |l| l.starts_with("istio_request_duration_milliseconds_bucket")
                    && l.contains("response_code=\"200\"")
                    && l.ends_with("le=\"5\"} 0")
            ),
            "{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with("istio_response_bytes_sum") && l.ends_with(" 4000")),
            "{out}"
        );
    }

    #[test]
    fn a_peers_announcement_counts_only_when_its_certificate_vouches_for_it() {
        let client = Workload {
            name: "a-v1".into(),
            namespace: "ns-a".into(),
            canonical_service: "a".into(),
            canonical_revision: "v1".into(),
            app: "a".into(),
            version: "v1".into(),
            cluster: "c1".into(),
        };
        let said = client.announcement("a");
        assert_eq!(said, "n=a-v1,ns=ns-a,sa=a,app=a,ver=v1,cs=a,cr=v1,cl=c1");
        assert_eq!(
            Workload::from_announcement(&said, Some(A)),
            Some(client.clone())
        );
        // Another namespace's or service account's certificate, or none: not believed.
        assert_eq!(Workload::from_announcement(&said, Some(B)), None);
        let other_sa = "spiffe://cluster.local/ns/ns-a/sa/other";
        assert_eq!(Workload::from_announcement(&said, Some(other_sa)), None);
        assert_eq!(Workload::from_announcement(&said, None), None);
        // In a record: the inbound source labels come from it.
        let m = StandardMetrics::new(own());
        let mut r = inbound_http("200");
        r.push((attr::PEER, said));
        run(&m, &[r]);
        let t = text(&m);
        assert!(
            t.contains("source_workload=\"a-v1\",source_canonical_service=\"a\""),
            "{t}"
        );
        assert!(
            t.contains("source_app=\"a\",source_version=\"v1\",source_cluster=\"c1\""),
            "{t}"
        );
    }

    #[test]
    fn plaintext_inbound_is_policy_none_with_unknown_source() {
        let m = StandardMetrics::new(own());
        let mut r = inbound_http("200");
        r.retain(|(k, _)| *k != "peer_san");
        run(&m, &[r]);
        let out = text(&m);
        assert!(out.contains("source_principal=\"unknown\""), "{out}");
        assert!(
            out.contains("source_workload_namespace=\"unknown\""),
            "{out}"
        );
        assert!(out.contains("connection_security_policy=\"none\""), "{out}");
    }

    #[test]
    fn outbound_reports_the_servers_identity_and_the_clusters_service() {
        let m = StandardMetrics::new(own());
        run(
            &m,
            &[vec![
                ("reporter", "source".into()),
                ("kind", "http".into()),
                ("peer_san", A.into()),
                ("local_san", B.into()),
                ("cluster", "outbound|80|v2|a.ns-a.svc.cluster.local".into()),
                ("endpoint", "a-v2;ns-a;a;v2;Kubernetes".into()),
                ("authority", "a".into()),
                ("content_type", "application/grpc+proto".into()),
                ("response_code", "200".into()),
                ("grpc_status", "14".into()),
                ("response_flags", "UF".into()),
                ("duration_ms", "3".into()),
            ]],
        );
        let out = text(&m);
        for label in [
            "reporter=\"source\"",
            "source_workload=\"b\"",
            &format!("source_principal=\"{B}\""),
            &format!("destination_principal=\"{A}\""),
            "destination_workload=\"a-v2\"",
            "destination_workload_namespace=\"ns-a\"",
            "destination_canonical_revision=\"v2\"",
            "destination_service=\"a.ns-a.svc.cluster.local\"",
            "destination_service_name=\"a\"",
            "destination_service_namespace=\"ns-a\"",
            "request_protocol=\"grpc\"",
            "grpc_response_status=\"14\"",
            "response_flags=\"UF\"",
            "connection_security_policy=\"unknown\"",
        ] {
            assert!(out.contains(label), "{label} missing: {out}");
        }
    }

    fn tcp(kind: &str, id: &str, sent: &str, received: &str) -> Vec<(&'static str, String)> {
        vec![
            ("reporter", "destination".into()),
            ("kind", "tcp".into()),
            ("peer_san", A.into()),
            ("local_san", B.into()),
            ("cluster", "inbound|9000||".into()),
            ("log_type", kind.into()),
            ("connection", id.into()),
            ("response_flags", "-".into()),
            ("sent_bytes", sent.into()),
            ("received_bytes", received.into()),
        ]
    }

    #[test]
    fn tcp_connections_count_once_and_bytes_as_deltas() {
        let m = StandardMetrics::new(own());
        run(
            &m,
            &[
                tcp("TcpUpstreamConnected", "7", "0", "0"),
                tcp("TcpPeriodic", "7", "100", "10"),
                tcp("TcpPeriodic", "7", "120", "10"),
                tcp("TcpConnectionEnd", "7", "150", "30"),
                // A connection that never reached its upstream: only its end is logged.
                tcp("TcpConnectionEnd", "8", "0", "5"),
            ],
        );
        let out = text(&m);
        let value = |name: &str| {
            out.lines()
                .find(|l| l.starts_with(name) && l.contains("request_protocol=\"tcp\""))
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_string)
        };
        assert_eq!(
            value("istio_tcp_connections_opened_total").as_deref(),
            Some("2"),
            "{out}"
        );
        assert_eq!(
            value("istio_tcp_connections_closed_total").as_deref(),
            Some("2")
        );
        assert_eq!(value("istio_tcp_sent_bytes_total").as_deref(), Some("150"));
        assert_eq!(
            value("istio_tcp_received_bytes_total").as_deref(),
            Some("35")
        );
        assert!(
            !out.contains("response_code"),
            "TCP has no response code: {out}"
        );
        assert!(m.state().open.is_empty());
    }

    #[test]
    fn label_sets_are_capped_and_overflow_is_counted() {
        let m = StandardMetrics::new(own());
        for i in 0..MAX_LABEL_SETS + 5 {
            let mut r = inbound_http("200");
            set(&mut r, "authority", format!("host-{i}"));
            run(&m, &[r]);
        }
        assert_eq!(m.label_sets(), MAX_LABEL_SETS);
        let out = text(&m);
        assert!(
            out.contains("istio_agent_standard_metrics_overflow_total 5"),
            "overflow"
        );
    }

    #[test]
    fn the_exposition_streams_in_bounded_chunks() {
        let m = StandardMetrics::new(own());
        for i in 0..200 {
            let mut r = inbound_http("200");
            set(&mut r, "authority", format!("host-{i}"));
            run(&m, &[r, tcp("TcpConnectionEnd", &i.to_string(), "1", "1")]);
        }
        let chunks: Vec<String> = m.exposition().collect();
        assert!(chunks.len() > 10, "{}", chunks.len());
        // A chunk ends after the series that crossed the size: under the size plus one series.
        assert!(chunks.iter().all(|c| c.len() < CHUNK_BYTES + 32 * 1024));
        let text = chunks.concat();
        let count = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
        assert_eq!(count("istio_requests_total{"), 200);
        assert_eq!(count("istio_response_bytes_count{"), 200);
        assert_eq!(count("istio_tcp_connections_closed_total{"), 1);
        assert_eq!(count("# TYPE istio_request_bytes histogram"), 1);
        assert!(text.ends_with("istio_agent_standard_metrics_overflow_total 0\n"));
    }

    #[test]
    fn hostile_values_are_cut_and_escaped() {
        let m = StandardMetrics::new(own());
        let mut r = inbound_http("200");
        set(
            &mut r,
            "authority",
            format!("a\"b\\c\n{}", "x".repeat(1000)),
        );
        run(&m, &[r]);
        let out = text(&m);
        let line = out
            .lines()
            .find(|l| l.starts_with("istio_requests_total"))
            .unwrap();
        assert!(
            line.contains("destination_service=\"a\\\"b\\\\c\\nxxx"),
            "{line}"
        );
        assert!(line.len() < 2 * 1024, "{}", line.len());
    }

    #[test]
    fn helpers() {
        assert_eq!(spiffe_namespace(A), Some("ns-a"));
        assert_eq!(spiffe_namespace("spiffe://td/sa/x"), None);
        assert_eq!(cluster_host("outbound|80||h.ns.svc"), Some("h.ns.svc"));
        assert_eq!(cluster_host("inbound|80||"), None);
        assert_eq!(cluster_host("PassthroughCluster"), None);
        assert_eq!(without_port("h:80"), "h");
        assert_eq!(without_port("[::1]:80"), "[::1]");
        assert_eq!(without_port("h"), "h");
        assert_eq!(
            Workload::from_endpoint("w;ns;svc;;", None)
                .unwrap()
                .canonical_revision,
            "latest"
        );
    }
}
