//! The ADS server (state of the world): one task per stream that tracks, per type, what the proxy
//! subscribed to, the nonce last sent and what was ACKed or NACKed, and pushes every subscribed
//! type when a new PushContext is published. Mirrors istiod's `pilot/pkg/xds/ads.go`.
//!
//! `XdsServer::open` serves any request stream, so the agent embeds the server in process and
//! `ads_http` serves it over gRPC; both take the responses as they go on the wire (`Outgoing`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use mesh_common::xds::{Answer, Step as SotwStep, Subscription, answer};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status};

use crate::autoregister::{AutoRegistration, Caller};
use crate::generators;
use crate::intern;
use crate::model::Proxy;
use crate::push_context::{Change, PushContext};
use crate::resource::{
    CLUSTER_TYPE, ENDPOINT_TYPE, EXTENSION_CONFIG_TYPE, LISTENER_TYPE, Named, ROUTE_TYPE,
    SECRET_TYPE,
};
use crate::wire::Outgoing;
pub use crate::xds_debug::{ProxySync, TypeSync};

/// Order in which types are pushed, so Envoy never sees a reference before its target.
const PUSH_ORDER: [&str; 7] = [
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    SECRET_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    EXTENSION_CONFIG_TYPE,
    istio_proto::nds::TYPE_URL,
];

/// A stream's responses as they go on the wire (resources shared with the snapshot).
pub type WireStream = ReceiverStream<Result<Outgoing, Status>>;

/// One ADS stream's requests, in either flavour.
pub enum Requests {
    /// State of the world (`StreamAggregatedResources`).
    Sotw(BoxStream<'static, Result<DiscoveryRequest, Status>>),
    /// Delta (`DeltaAggregatedResources`): per type, Envoy's subscriptions and the version of
    /// each resource it holds; a push sends only what changed, plus the names that went away.
    Delta(BoxStream<'static, Result<DeltaDiscoveryRequest, Status>>),
}

/// Counters of the server's ACK/NACK traffic, for tests and debugging.
#[derive(Debug, Default)]
pub struct XdsStats {
    pub pushes: AtomicU64,
    pub acks: AtomicU64,
    pub nacks: AtomicU64,
}

#[derive(Clone)]
pub struct XdsServer {
    push: watch::Receiver<Arc<PushContext>>,
    stats: Arc<XdsStats>,
    shared: Arc<Shared>,
    autoregister: Option<Arc<AutoRegistration>>,
    /// Largest response sent (MAX_RESPONSE_BYTES unless a test lowers it).
    max_response: usize,
    /// How long a response may wait for its proxy to take it (`--send-timeout`).
    send_timeout: std::time::Duration,
    /// The xDS port's connections, to close the one of a stream whose proxy stopped reading.
    connections: Option<Arc<mesh_common::conn_slots::Slots>>,
    /// `control_plane.identifier` of debug responses (`xds_debug::identifier`).
    identifier: Arc<str>,
}

/// How long a response may wait for its proxy to take it before the stream and its connection
/// are closed (istiod's PILOT_XDS_SEND_TIMEOUT; here on by default): a client that opens a
/// stream and never reads would otherwise hold its responses forever.
pub const DEFAULT_SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a push may keep its throttle permit while a slow proxy takes its responses.
const THROTTLE_HOLD: std::time::Duration = std::time::Duration::from_millis(500);

/// Largest xDS request accepted (Istio's ISTIO_GPRC_MAXRECVMSGSIZE default).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Largest xDS response sent: one that would be larger ends its stream with RESOURCE_EXHAUSTED
/// instead (logged with its size), so no proxy is sent a message its agent refuses (the agent
/// accepts this much by default) or one whose size overflows the gRPC frame header. A mesh's
/// real pushes are far smaller.
pub const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;

/// State every stream task shares: sync status for /debug/syncz, the push throttle and the
/// stream limit.
struct Shared {
    syncs: std::sync::Mutex<std::collections::BTreeMap<u64, ProxySync>>,
    next_id: AtomicU64,
    throttle: tokio::sync::Semaphore,
    streams: Arc<tokio::sync::Semaphore>,
}

#[derive(Debug, Default)]
struct Watch {
    sub: Subscription<Arc<str>>,
    sync: TypeSync,
}

impl TypeSync {
    /// Records (and counts, and logs a rejection of) the proxy's answer to our last response
    /// of `type_url`; false when the request is to be ignored (stale, or a NACK). A rejection
    /// is reported against the EnvoyFilters `blame` names.
    fn record(
        &mut self,
        answer: &Answer,
        type_url: &str,
        stats: &XdsStats,
        blame: impl FnOnce() -> Vec<String>,
    ) -> bool {
        match answer {
            Answer::Fresh => true,
            Answer::Ack => {
                stats.acks.fetch_add(1, Ordering::Relaxed);
                self.acked = self.sent.clone();
                self.rejecting = false;
                self.nacked_envoy_filters.clear();
                true
            }
            Answer::Nack(why) => {
                stats.nacks.fetch_add(1, Ordering::Relaxed);
                self.nacked_envoy_filters = blame();
                if self.nacked_envoy_filters.is_empty() {
                    tracing::warn!(type_url, error = %why, "proxy rejected config (NACK)");
                } else {
                    tracing::warn!(envoy_filters = ?self.nacked_envoy_filters, type_url, error = %why,
                        "proxy rejected config patched by EnvoyFilters (NACK); it keeps its last accepted config");
                }
                self.nacked = Some(why.clone());
                self.rejecting = true;
                false
            }
            Answer::Stale => false,
        }
    }
}

/// A state-of-the-world request as a stream keeps it: its names interned (`crate::intern`)
/// as soon as it is read, so requests waiting for the push throttle hold no copies.
struct SotwRequest {
    node: Option<envoy_types::pb::envoy::config::core::v3::Node>,
    type_url: String,
    names: Vec<Arc<str>>,
    nonce: String,
    error: Option<envoy_types::pb::google::rpc::Status>,
}

impl From<DiscoveryRequest> for SotwRequest {
    fn from(req: DiscoveryRequest) -> Self {
        SotwRequest {
            node: req.node,
            type_url: req.type_url,
            names: intern::intern_all(req.resource_names),
            nonce: req.response_nonce,
            error: req.error_detail,
        }
    }
}

/// A Delta request as a stream keeps it (names interned).
struct DeltaRequest {
    node: Option<envoy_types::pb::envoy::config::core::v3::Node>,
    type_url: String,
    subscribe: Vec<Arc<str>>,
    unsubscribe: Vec<Arc<str>>,
    /// What Envoy already holds (on reconnection): name and our version, if it is one of ours.
    initial: Vec<(Arc<str>, Option<u64>)>,
    nonce: String,
    error: Option<envoy_types::pb::google::rpc::Status>,
}

impl From<DeltaDiscoveryRequest> for DeltaRequest {
    fn from(req: DeltaDiscoveryRequest) -> Self {
        DeltaRequest {
            node: req.node,
            type_url: req.type_url,
            subscribe: intern::intern_all(req.resource_names_subscribe),
            unsubscribe: intern::intern_all(req.resource_names_unsubscribe),
            initial: req
                .initial_resource_versions
                .iter()
                .map(|(name, version)| {
                    (intern::intern(name), u64::from_str_radix(version, 16).ok())
                })
                .collect(),
            nonce: req.response_nonce,
            error: req.error_detail,
        }
    }
}

struct Connection {
    proxy: Option<Arc<Proxy>>,
    /// Who is on the other end (`CallerScope::of`).
    scope: CallerScope,
    watches: HashMap<String, Watch>,
    next_nonce: u64,
}

/// Who a stream's caller is known to be: in process (trusted: its node's namespace), or the
/// identity of a verified client certificate (none without one, e.g. over plaintext or with a
/// bearer token only). A certificate binds the stream to its namespace (`identify`), and a
/// router reads the Secrets of its namespace only with one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum CallerScope {
    #[default]
    InProcess,
    Verified(Option<mesh_common::identity::Identity>),
}

impl CallerScope {
    fn of(caller: &Caller) -> CallerScope {
        match caller {
            Caller::InProcess => CallerScope::InProcess,
            Caller::Peer(identity) => CallerScope::Verified(identity.clone()),
        }
    }
}

/// Resources of `type_url` for `proxy`, or `None` for a type we do not serve.
fn generate(
    push: &PushContext,
    proxy: &Proxy,
    type_url: &str,
    names: &[Arc<str>],
) -> Option<Vec<Named>> {
    let mut out = generate_unpatched(push, proxy, type_url, names)?;
    crate::patch::apply(push, proxy, type_url, &mut out);
    Some(out)
}

/// `generate` before the EnvoyFilters are applied.
fn generate_unpatched(
    push: &PushContext,
    proxy: &Proxy,
    type_url: &str,
    names: &[Arc<str>],
) -> Option<Vec<Named>> {
    if type_url == EXTENSION_CONFIG_TYPE {
        return Some(crate::patch::extension_configs(push, proxy, names));
    }
    generators::generate(push, proxy, type_url, names)
}

/// The EnvoyFilters that patch what `proxy` gets of `type_url` (`names`): whom its rejection
/// is reported against.
fn blame(
    push: &PushContext,
    proxy: Option<&Proxy>,
    type_url: &str,
    names: &[Arc<str>],
) -> Vec<String> {
    let Some(proxy) = proxy else {
        return Vec::new();
    };
    let generated = generate_unpatched(push, proxy, type_url, names).unwrap_or_default();
    crate::patch::blame(push, proxy, type_url, names, &generated)
}

impl Connection {
    fn response(
        &mut self,
        push: &PushContext,
        type_url: &str,
        only: Option<&Names>,
    ) -> Option<Outgoing> {
        let proxy = self.proxy.as_ref()?;
        let watch = self.watches.get_mut(type_url)?;
        let resources = match only {
            // Envoy keeps the endpoints of the clusters a state-of-the-world EDS response
            // leaves out (EDS is not a full-state type), so the fast path sends the changed
            // ones alone, as istiod's incremental EDS does.
            Some(only) => {
                let names: Vec<Arc<str>> = watch
                    .sub
                    .names
                    .iter()
                    .filter(|n| only.contains(&***n))
                    .cloned()
                    .collect();
                generate(push, proxy, type_url, &names)?
            }
            None => generate(push, proxy, type_url, &watch.sub.names)?,
        };
        self.next_nonce += 1;
        let nonce = format!("{}-{}", push.version, self.next_nonce);
        let out = Outgoing::sotw(
            &push.version,
            type_url,
            &nonce,
            resources.into_iter().map(|n| n.resource).collect(),
        );
        watch.sub.nonce_sent = nonce;
        watch.sync.sent = Some(push.version.clone());
        watch.sync.sent_at = Some(std::time::SystemTime::now());
        Some(out)
    }
}

impl XdsServer {
    pub fn new(push: watch::Receiver<Arc<PushContext>>) -> Self {
        Self::with_limits(
            push,
            crate::config::DEFAULT_MAX_STREAMS,
            crate::config::default_push_throttle(),
        )
    }

    pub fn with_limits(
        push: watch::Receiver<Arc<PushContext>>,
        max_streams: usize,
        push_throttle: usize,
    ) -> Self {
        XdsServer {
            push,
            autoregister: None,
            max_response: MAX_RESPONSE_BYTES,
            send_timeout: DEFAULT_SEND_TIMEOUT,
            connections: None,
            identifier: crate::xds_debug::identifier("istiod-core").into(),
            stats: Arc::default(),
            shared: Arc::new(Shared {
                syncs: Default::default(),
                next_id: AtomicU64::new(1),
                throttle: tokio::sync::Semaphore::new(push_throttle.max(1)),
                streams: Arc::new(tokio::sync::Semaphore::new(max_streams)),
            }),
        }
    }

    /// Lowers the largest response sent (MAX_RESPONSE_BYTES); for tests of the bound.
    pub fn with_max_response_bytes(mut self, max: usize) -> Self {
        self.max_response = max.min(MAX_RESPONSE_BYTES);
        self
    }

    /// Bounds the time a response waits for its proxy, closing the stream's connection among
    /// `connections` (the xDS port's) when it passes.
    pub fn with_send_timeout(
        mut self,
        timeout: std::time::Duration,
        connections: Option<Arc<mesh_common::conn_slots::Slots>>,
    ) -> Self {
        self.send_timeout = timeout;
        self.connections = connections;
        self
    }

    /// Names this control plane `id` in debug responses (istioctl's ISTIOD column).
    pub fn with_identifier(mut self, id: &str) -> Self {
        self.identifier = crate::xds_debug::identifier(id).into();
        self
    }

    /// Lets proxies register their own WorkloadEntry (`autoregister`).
    pub fn with_auto_registration(mut self, registration: Arc<AutoRegistration>) -> Self {
        self.autoregister = Some(registration);
        self
    }

    /// Every connected proxy's sync state (/debug/syncz), by proxy id.
    pub fn syncz(&self) -> Vec<ProxySync> {
        let mut out: Vec<ProxySync> = self
            .shared
            .syncs
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.proxy.cmp(&b.proxy));
        out
    }

    /// What the connected proxy `proxy_id` (`POD.NAMESPACE`) is sent now, as Envoy's admin
    /// config dump sections (`xds_debug`), or `None` when it is not connected here.
    pub fn config_dump(
        &self,
        proxy_id: &str,
    ) -> Option<Vec<envoy_types::pb::google::protobuf::Any>> {
        let push = self.push.borrow().clone();
        crate::xds_debug::proxy_config_dump(
            &self.syncz(),
            proxy_id,
            &crate::xds_debug::Viewer::All,
            &|proxy, t, names| dump_resources(&push, proxy, t, names),
        )
    }

    pub fn stats(&self) -> Arc<XdsStats> {
        self.stats.clone()
    }

    /// Serves one ADS stream from `caller`: reads `requests`, returns the responses.
    pub fn open(&self, requests: Requests, caller: Caller) -> WireStream {
        self.open_from(requests, caller, None)
    }

    /// [`XdsServer::open`] for a stream on the connection from `remote`.
    pub fn open_from(
        &self,
        requests: Requests,
        caller: Caller,
        remote: Option<std::net::SocketAddr>,
    ) -> WireStream {
        let scope = CallerScope::of(&caller);
        match requests {
            Requests::Sotw(requests) => {
                let conn = Connection {
                    proxy: None,
                    scope,
                    watches: HashMap::new(),
                    next_nonce: 0,
                };
                let requests = requests.map(|r| r.map(SotwRequest::from));
                serve_stream(self, caller, remote, conn, requests)
            }
            Requests::Delta(requests) => {
                let conn = DeltaConnection {
                    scope,
                    ..Default::default()
                };
                let requests = requests.map(|r| r.map(DeltaRequest::from));
                serve_stream(self, caller, remote, conn, requests)
            }
        }
    }
}

/// The per-stream protocol state of one xDS flavour (state of the world or Delta).
trait StreamState: Send + 'static {
    type Request: Send + 'static;
    /// Handles a request from the proxy; may answer it (with more than one response when the
    /// answer obliges another type to follow, see `DeltaConnection::handle`).
    fn on_request(
        &mut self,
        push: &PushContext,
        req: Self::Request,
        stats: &XdsStats,
    ) -> Result<Vec<Outgoing>, Status>;
    /// What to send for `type_url` after a new snapshot, if anything.
    /// The response of `type_url` for `push`; with `only`, of those resources alone (the EDS
    /// fast path's changed clusters).
    fn on_push(
        &mut self,
        push: &PushContext,
        type_url: &str,
        only: Option<&Names>,
    ) -> Option<Outgoing>;
    fn proxy(&self) -> Option<&Proxy>;
    /// A request of an `istio.io/debug` type: its type and names. Answered apart
    /// (`xds_debug`), never subscribed to.
    fn debug_ask(&self, req: &Self::Request) -> Option<(String, Vec<Arc<str>>)>;
    /// Who is on the other end.
    fn scope(&self) -> &CallerScope;
    /// Whether the proxy holds or asked for any of `names` of `type_url`.
    fn watches_any(&self, type_url: &str, names: &std::collections::BTreeSet<String>) -> bool;
    fn sync(&self) -> Option<ProxySync>;
}

impl StreamState for Connection {
    type Request = SotwRequest;
    fn on_request(
        &mut self,
        push: &PushContext,
        req: SotwRequest,
        stats: &XdsStats,
    ) -> Result<Vec<Outgoing>, Status> {
        Ok(handle_request(self, push, req, stats)?
            .into_iter()
            .collect())
    }
    fn on_push(
        &mut self,
        push: &PushContext,
        type_url: &str,
        only: Option<&Names>,
    ) -> Option<Outgoing> {
        self.response(push, type_url, only)
    }
    fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_deref()
    }
    fn debug_ask(&self, req: &SotwRequest) -> Option<(String, Vec<Arc<str>>)> {
        crate::xds_debug::is_debug(&req.type_url).then(|| (req.type_url.clone(), req.names.clone()))
    }
    fn scope(&self) -> &CallerScope {
        &self.scope
    }
    fn watches_any(&self, type_url: &str, names: &std::collections::BTreeSet<String>) -> bool {
        self.watches
            .get(type_url)
            .is_some_and(|w| w.sub.names.iter().any(|n| names.contains(&**n)))
    }
    fn sync(&self) -> Option<ProxySync> {
        proxy_sync(
            self.proxy.as_ref(),
            false,
            &self.watches,
            |w| &w.sync,
            |w| w.sub.names.clone(),
        )
    }
}

impl StreamState for DeltaConnection {
    type Request = DeltaRequest;
    fn on_request(
        &mut self,
        push: &PushContext,
        req: DeltaRequest,
        stats: &XdsStats,
    ) -> Result<Vec<Outgoing>, Status> {
        self.handle(push, req, stats)
    }
    /// Delta sends only what changed anyway: `only` adds nothing.
    fn on_push(
        &mut self,
        push: &PushContext,
        type_url: &str,
        _only: Option<&Names>,
    ) -> Option<Outgoing> {
        self.response(push, type_url, false)
    }
    fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_deref()
    }
    /// istioctl asks its debug types over state of the world only.
    fn debug_ask(&self, _: &DeltaRequest) -> Option<(String, Vec<Arc<str>>)> {
        None
    }
    fn scope(&self) -> &CallerScope {
        &self.scope
    }
    fn watches_any(&self, type_url: &str, names: &std::collections::BTreeSet<String>) -> bool {
        self.watches.get(type_url).is_some_and(|w| {
            w.names
                .iter()
                .chain(w.sent.keys())
                .any(|n| names.contains(&**n))
        })
    }
    fn sync(&self) -> Option<ProxySync> {
        proxy_sync(
            self.proxy.as_ref(),
            true,
            &self.watches,
            |w| &w.sync,
            |w| w.names.iter().cloned().collect(),
        )
    }
}

/// The types to push to one proxy for the step from `last` to `push`. Full pushes send every
/// subscribed type in `PUSH_ORDER`. On the EDS fast path (only endpoints changed, and this
/// stream saw the previous snapshot) a proxy gets only EDS, and only if it watches a changed
/// cluster, and then (state of the world) only the changed clusters' endpoints; a proxy whose own workload is among the changed endpoints gets a full push (its
/// inbound listeners and clusters follow its endpoints).
fn push_types<C: StreamState>(
    conn: &C,
    last: &PushContext,
    push: &PushContext,
) -> (Vec<&'static str>, Option<Names>) {
    let Change::Endpoints(hosts) = &push.change else {
        return (PUSH_ORDER.to_vec(), None);
    };
    if push.generation != last.generation + 1 {
        return (PUSH_ORDER.to_vec(), None);
    }
    let Some(proxy) = conn.proxy() else {
        return (Vec::new(), None);
    };
    let owns_changed = [last, push].iter().any(|snapshot| {
        snapshot
            .services
            .iter()
            .filter(|s| hosts.contains(&s.hostname))
            .flat_map(|s| &s.endpoints)
            .any(|e| proxy.owns(e))
    });
    if owns_changed {
        return (PUSH_ORDER.to_vec(), None);
    }
    let clusters: Names = push
        .services
        .iter()
        .filter(|s| hosts.contains(&s.hostname))
        .flat_map(|s| {
            let subsets = push
                .subsets
                .get(&s.hostname)
                .map(Vec::as_slice)
                .unwrap_or_default();
            s.ports.iter().flat_map(move |p| {
                crate::model::port_clusters(p.port, &s.hostname, subsets).map(|(_, name)| name)
            })
        })
        .collect();
    if conn.watches_any(ENDPOINT_TYPE, &clusters) {
        (vec![ENDPOINT_TYPE], Some(clusters))
    } else {
        (Vec::new(), None)
    }
}

/// Resource names (the changed clusters of the EDS fast path).
type Names = std::collections::BTreeSet<String>;

/// One stream's task: answers requests and, on every new snapshot, pushes what changed for this
/// proxy (`push_types`). A stream that falls behind sees only the latest snapshot: pending
/// pushes of one proxy merge into one.
fn serve_stream<C, S>(
    server: &XdsServer,
    caller: Caller,
    remote: Option<std::net::SocketAddr>,
    mut conn: C,
    requests: S,
) -> ReceiverStream<Result<Outgoing, Status>>
where
    C: StreamState,
    S: Stream<Item = Result<C::Request, Status>> + Send + 'static,
{
    let mut push_rx = server.push.clone();
    let stats = server.stats.clone();
    let shared = server.shared.clone();
    let autoregister = server.autoregister.clone();
    let max_response = server.max_response;
    let identifier = server.identifier.clone();
    let mut debug_nonce = 0u64;
    let (send_timeout, connections) = (server.send_timeout, server.connections.clone());
    let (tx, rx) = mpsc::channel(1);
    let Ok(permit) = shared.streams.clone().try_acquire_owned() else {
        tracing::warn!("ADS stream refused: stream limit reached");
        let _ = tx.try_send(Err(Status::resource_exhausted(
            "too many xDS streams on this control plane; retry later or elsewhere",
        )));
        return ReceiverStream::new(rx);
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(async move {
        let _permit = permit;
        // This stream's WorkloadEntry registration, once its proxy is known.
        let mut registration: Option<Option<crate::autoregister::Registration>> = None;
        let mut requests = Box::pin(requests);
        let mut last = push_rx.borrow_and_update().clone();
        enum Step<R> {
            Request(R),
            Push(Arc<PushContext>, Vec<&'static str>, Option<Names>),
        }
        loop {
            let step = tokio::select! {
                req = requests.next() => match req {
                    Some(Ok(req)) => Step::Request(req),
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "xds stream ended with error");
                        break;
                    }
                    None => break,
                },
                changed = push_rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let push = push_rx.borrow_and_update().clone();
                    let (types, only) = push_types(&conn, &last, &push);
                    last = push.clone();
                    Step::Push(push, types, only)
                }
            };
            // Istio's push throttle: at most this many streams generate at once. The permit
            // is released before sending, so a proxy that stops reading blocks only its own
            // stream, never the pushes to others.
            let throttle = match shared.throttle.acquire().await {
                Ok(permit) => permit,
                Err(_) => break,
            };
            let mut out: Vec<Outgoing> = Vec::new();
            match step {
                Step::Request(req) => {
                    // Not marked seen: a snapshot that arrived meanwhile is still pushed in
                    // full later, even if this request was answered from it.
                    let push = push_rx.borrow().clone();
                    if let Some((type_url, names)) = conn.debug_ask(&req) {
                        debug_nonce += 1;
                        let nonce = format!("{}-debug-{debug_nonce}", push.version);
                        match debug_answer(
                            &shared,
                            conn.scope(),
                            &push,
                            &type_url,
                            &names,
                            &nonce,
                            &identifier,
                        ) {
                            Ok(resp) => out.push(resp),
                            Err(status) => {
                                tracing::info!(peer = ?remote, type_url, error = %status, "debug request refused");
                                drop(throttle);
                                let _ = tx.send(Err(status)).await;
                                break;
                            }
                        }
                    } else {
                        let mut handled = conn.on_request(&push, req, &stats);
                        if let (Ok(_), None, Some(proxy)) = (&handled, &registration, conn.proxy())
                        {
                            let registered = match &autoregister {
                                Some(reg) => reg.connect(&push, proxy, &caller),
                                None => Ok(None),
                            };
                            match registered {
                                Ok(r) => registration = Some(r),
                                Err(status) => handled = Err(status),
                            }
                        }
                        match handled {
                            Ok(resp) => out.extend(resp),
                            Err(status) => {
                                drop(throttle);
                                let _ = tx.send(Err(status)).await;
                                break;
                            }
                        }
                    }
                }
                Step::Push(push, types, only) => {
                    out.extend(
                        types
                            .iter()
                            .filter_map(|t| conn.on_push(&push, t, only.as_ref())),
                    );
                }
            }
            if let (Some(sync), Ok(mut syncs)) = (conn.sync(), shared.syncs.lock()) {
                syncs.insert(id, sync);
            }
            match send_all(&tx, out, throttle, &stats, max_response, send_timeout).await {
                Sent::All => {}
                Sent::Gone => break,
                Sent::Stalled => {
                    tracing::warn!(
                        proxy = conn.proxy().map(|p| p.id.as_str()),
                        peer = ?remote,
                        timeout = ?send_timeout,
                        "proxy took no xDS response within the send timeout; closing its stream and connection"
                    );
                    if let (Some(slots), Some(addr)) = (&connections, remote) {
                        slots.close(addr);
                    }
                    break;
                }
            }
        }
        if let Ok(mut syncs) = shared.syncs.lock() {
            syncs.remove(&id);
        }
    });
    ReceiverStream::new(rx)
}

/// What a config dump shows of `proxy`'s `type_url`: what it is sent, EnvoyFilters applied.
fn dump_resources(
    push: &PushContext,
    proxy: &Proxy,
    type_url: &str,
    names: &[Arc<str>],
) -> Option<Vec<Arc<envoy_types::pb::google::protobuf::Any>>> {
    generate(push, proxy, type_url, names).map(|v| v.into_iter().map(|n| n.resource).collect())
}

/// The answer to an `istio.io/debug` request (`xds_debug`) from the caller of `scope`.
fn debug_answer(
    shared: &Shared,
    scope: &CallerScope,
    push: &PushContext,
    type_url: &str,
    names: &[Arc<str>],
    nonce: &str,
    identifier: &str,
) -> Result<Outgoing, Status> {
    let viewer = match scope {
        CallerScope::InProcess => crate::xds_debug::Viewer::All,
        CallerScope::Verified(id) => {
            crate::xds_debug::Viewer::of(id.as_ref(), false, push.root_namespace())?
        }
    };
    let syncs: Vec<ProxySync> = shared
        .syncs
        .lock()
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    let generate =
        |proxy: &Proxy, t: &str, names: &[Arc<str>]| dump_resources(push, proxy, t, names);
    crate::xds_debug::answer(
        type_url,
        names,
        &viewer,
        &syncs,
        crate::xds_debug::Stamp {
            version: &push.version,
            nonce,
            identifier,
        },
        &generate,
    )
}

/// How [`send_all`] ended.
enum Sent {
    All,
    /// The stream is gone (or ended here, over the response limit).
    Gone,
    /// A response waited longer than the send timeout.
    Stalled,
}

/// Hands `out` to the proxy's connection. The throttle permit is kept meanwhile, so the memory
/// of pushes in flight stays bounded by the throttle; but only for THROTTLE_HOLD: a proxy that
/// stops reading then loses it and blocks only itself, until `send_timeout`.
async fn send_all(
    tx: &mpsc::Sender<Result<Outgoing, Status>>,
    out: Vec<Outgoing>,
    throttle: tokio::sync::SemaphorePermit<'_>,
    stats: &XdsStats,
    max_response: usize,
    send_timeout: std::time::Duration,
) -> Sent {
    let mut throttle = Some(throttle);
    let hold_until = tokio::time::Instant::now() + THROTTLE_HOLD;
    for resp in out {
        if resp.encoded_len() > max_response {
            let why = format!(
                "xDS response of {} bytes ({} resources) is over the {max_response}-byte limit; not sent",
                resp.encoded_len(),
                resp.resource_count()
            );
            tracing::error!("{why}; closing the stream");
            drop(throttle);
            let _ = tx.send(Err(Status::resource_exhausted(why))).await;
            return Sent::Gone;
        }
        stats.pushes.fetch_add(1, Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        let send = tx.send(Ok(resp));
        tokio::pin!(send);
        if throttle.is_some() {
            match tokio::time::timeout_at(hold_until, &mut send).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return Sent::Gone,
                Err(_) => throttle = None,
            }
        }
        match tokio::time::timeout_at(started + send_timeout, send).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Sent::Gone,
            Err(_) => return Sent::Stalled,
        }
    }
    Sent::All
}

/// A stream's sync state for /debug/syncz, once the proxy is known.
/// The subscribed names are kept for the types a config dump generates by name (routes,
/// secrets, extension configs): not for EDS, whose names (a proxy's every cluster) a dump
/// leaves out, so the sync state costs no copy of them.
fn proxy_sync<W>(
    proxy: Option<&Arc<Proxy>>,
    delta: bool,
    watches: &HashMap<String, W>,
    sync: impl Fn(&W) -> &TypeSync,
    names: impl Fn(&W) -> Vec<Arc<str>>,
) -> Option<ProxySync> {
    let proxy = proxy?;
    Some(ProxySync {
        proxy: proxy.id.clone(),
        delta,
        types: watches
            .iter()
            .map(|(t, w)| {
                let mut sync = sync(w).clone();
                if t != ENDPOINT_TYPE {
                    sync.names = names(w);
                }
                (t.clone(), sync)
            })
            .collect(),
        node: Some(proxy.clone()),
    })
}

/// On a stream's first request, learns which proxy is on the other end from its node id.
fn identify(
    proxy: &mut Option<Arc<Proxy>>,
    node: Option<&envoy_types::pb::envoy::config::core::v3::Node>,
    scope: &CallerScope,
) -> Result<(), Status> {
    if proxy.is_none() {
        let node = node.ok_or_else(|| Status::invalid_argument("first request carries no node"))?;
        let mut p =
            Proxy::from_node_id(&node.id).map_err(|e| Status::invalid_argument(e.to_string()))?;
        p.labels = node_labels(node);
        let l = node.locality.as_ref();
        p.locality = Proxy::stated_locality(
            &p.labels,
            [
                l.map(|l| l.region.as_str()).unwrap_or_default(),
                l.map(|l| l.zone.as_str()).unwrap_or_default(),
                l.map(|l| l.sub_zone.as_str()).unwrap_or_default(),
            ],
        );
        p.auto_register_group = node_string(node, "AUTO_REGISTER_GROUP");
        p.tracing_sampling = node_tracing_sampling(node);
        p.metadata = node_strings(node);
        // Istio's checkConnectionIdentity: a client certificate speaks for its namespace only,
        // so a workload of namespace A cannot ask for B's config (and B's Secrets) by naming B
        // in its node id.
        if let CallerScope::Verified(Some(id)) = scope
            && id.namespace != p.namespace
        {
            tracing::warn!(
                caller = %id,
                proxy = %node.id,
                caller_namespace = %id.namespace,
                proxy_namespace = %p.namespace,
                "xDS stream refused: the client certificate's namespace is not the node id's"
            );
            return Err(Status::permission_denied(format!(
                "the client certificate is {id} (namespace {}), but node id {} names namespace {}",
                id.namespace, node.id, p.namespace
            )));
        }
        p.reads_secrets = match scope {
            CallerScope::InProcess => true,
            CallerScope::Verified(id) => id.is_some(),
        };
        tracing::info!(proxy = %node.id, "xds stream connected");
        *proxy = Some(Arc::new(p));
    }
    Ok(())
}

/// One field of the node metadata.
fn node_field<'a>(
    node: &'a envoy_types::pb::envoy::config::core::v3::Node,
    key: &str,
) -> Option<&'a envoy_types::pb::google::protobuf::value::Kind> {
    node.metadata
        .as_ref()
        .and_then(|m| m.fields.get(key))
        .and_then(|v| v.kind.as_ref())
}

/// ProxyConfig `tracing.sampling` of the node metadata's `PROXY_CONFIG`, when set (0 or unset:
/// the mesh's, as Istio reads it).
fn node_tracing_sampling(
    node: &envoy_types::pb::envoy::config::core::v3::Node,
) -> Option<crate::config_store::values::Percentage> {
    use envoy_types::pb::google::protobuf::value::Kind;
    let Some(Kind::StructValue(pc)) = node_field(node, "PROXY_CONFIG") else {
        return None;
    };
    let Some(Kind::StructValue(tracing)) = pc.fields.get("tracing").and_then(|v| v.kind.as_ref())
    else {
        return None;
    };
    match tracing.fields.get("sampling").and_then(|v| v.kind.as_ref()) {
        // Over 100 is 1%, as Istio reads it.
        Some(Kind::NumberValue(n)) if n.is_finite() && *n > 0.0 => {
            Some(crate::config_store::values::Percentage(if *n > 100.0 {
                1.0
            } else {
                *n
            }))
        }
        _ => None,
    }
}

/// A string field of the node metadata.
fn node_string(node: &envoy_types::pb::envoy::config::core::v3::Node, key: &str) -> Option<String> {
    use envoy_types::pb::google::protobuf::value::Kind;
    match node_field(node, key) {
        Some(Kind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// Every string field of the node metadata.
fn node_strings(
    node: &envoy_types::pb::envoy::config::core::v3::Node,
) -> std::collections::BTreeMap<String, String> {
    use envoy_types::pb::google::protobuf::value::Kind;
    node.metadata
        .iter()
        .flat_map(|m| &m.fields)
        .filter_map(|(k, v)| match &v.kind {
            Some(Kind::StringValue(s)) => Some((k.clone(), s.clone())),
            _ => None,
        })
        .collect()
}

/// The workload labels the agent puts in its node metadata (`LABELS`, a map of strings).
fn node_labels(
    node: &envoy_types::pb::envoy::config::core::v3::Node,
) -> std::collections::BTreeMap<String, String> {
    use envoy_types::pb::google::protobuf::value::Kind;
    let Some(Kind::StructValue(labels)) = node_field(node, "LABELS") else {
        return Default::default();
    };
    labels
        .fields
        .iter()
        .filter_map(|(k, v)| match &v.kind {
            Some(Kind::StringValue(s)) => Some((k.clone(), s.clone())),
            _ => None,
        })
        .collect()
}

fn handle_request(
    conn: &mut Connection,
    push: &PushContext,
    req: SotwRequest,
    stats: &XdsStats,
) -> Result<Option<Outgoing>, Status> {
    identify(&mut conn.proxy, req.node.as_ref(), &conn.scope)?;
    let watch = conn.watches.entry(req.type_url.clone()).or_default();
    let error = req.error.as_ref().map(|e| e.message.as_str());
    let step = watch.sub.on_request(&req.nonce, error, req.names);
    let (SotwStep::Ignore(answer) | SotwStep::Respond(answer)) = &step;
    let names = &watch.sub.names;
    let proxy = conn.proxy.as_deref();
    watch.sync.record(answer, &req.type_url, stats, || {
        blame(push, proxy, &req.type_url, names)
    });
    match step {
        SotwStep::Respond(_) => Ok(conn.response(push, &req.type_url, None)),
        SotwStep::Ignore(_) => Ok(None),
    }
}

/// Types for which an empty subscription means "everything" (Envoy's legacy wildcard).
fn wildcard_by_default(type_url: &str) -> bool {
    matches!(
        type_url,
        CLUSTER_TYPE | LISTENER_TYPE | istio_proto::nds::TYPE_URL
    )
}

/// A resource's version: a digest of its encoded bytes, so an unchanged resource is not resent.
/// Sent to Envoy as 16 hex digits.
fn resource_version(resource: &envoy_types::pb::google::protobuf::Any) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    resource.value.hash(&mut h);
    h.finish()
}

#[derive(Debug, Default)]
struct DeltaWatch {
    wildcard: bool,
    names: std::collections::BTreeSet<Arc<str>>,
    /// What Envoy holds: name → version (`None`: a version that is not ours, from before a
    /// reconnection).
    sent: HashMap<Arc<str>, Option<u64>>,
    nonce_sent: String,
    /// The first response for a type is sent even when empty, so Envoy's init completes.
    responded: bool,
    sync: TypeSync,
}

#[derive(Default)]
struct DeltaConnection {
    proxy: Option<Arc<Proxy>>,
    scope: CallerScope,
    watches: HashMap<String, DeltaWatch>,
    next_nonce: u64,
}

impl DeltaConnection {
    fn handle(
        &mut self,
        push: &PushContext,
        req: DeltaRequest,
        stats: &XdsStats,
    ) -> Result<Vec<Outgoing>, Status> {
        identify(&mut self.proxy, req.node.as_ref(), &self.scope)?;
        let first = !self.watches.contains_key(&req.type_url);
        let watch = self.watches.entry(req.type_url.clone()).or_default();
        if first {
            watch.wildcard = wildcard_by_default(&req.type_url) && req.subscribe.is_empty();
            watch.sent = req.initial.into_iter().collect();
        }
        let error = req.error.as_ref().map(|e| e.message.as_str());
        let answer = answer(&req.nonce, &watch.nonce_sent, error);
        let proxy = self.proxy.as_deref();
        let subscribed = &watch.names;
        if !watch.sync.record(&answer, &req.type_url, stats, || {
            let names: Vec<Arc<str>> = subscribed.iter().cloned().collect();
            blame(push, proxy, &req.type_url, &names)
        }) {
            return Ok(Vec::new());
        }
        let mut changed = first;
        for name in req.subscribe {
            if &*name == "*" {
                changed |= !watch.wildcard;
                watch.wildcard = true;
            } else {
                changed |= watch.names.insert(name);
            }
        }
        for name in req.unsubscribe {
            if &*name == "*" {
                watch.wildcard = false;
            } else {
                watch.names.remove(&name);
            }
            // Envoy dropped it; forget that it holds it so a resubscribe resends it.
            watch.sent.remove(&name);
        }
        if !changed {
            return Ok(Vec::new());
        }
        let mut out: Vec<Outgoing> = self
            .response(push, &req.type_url, true)
            .into_iter()
            .collect();
        // Clusters re-sent here wait for their endpoints (`forget_endpoints_of`).
        if req.type_url == CLUSTER_TYPE {
            out.extend(self.response(push, ENDPOINT_TYPE, false));
        }
        Ok(out)
    }

    fn response(
        &mut self,
        push: &PushContext,
        type_url: &str,
        requested: bool,
    ) -> Option<Outgoing> {
        let proxy = self.proxy.as_ref()?;
        let watch = self.watches.get_mut(type_url)?;
        let names: Vec<Arc<str>> = watch.names.iter().cloned().collect();
        let generated = generate(push, proxy, type_url, &names)?;
        let wanted = |name: &str| watch.wildcard || watch.names.contains(name);
        let generated: Vec<Named> = generated.into_iter().filter(|n| wanted(&n.name)).collect();
        // What Envoy holds and we no longer generate goes away.
        let mut removed: Vec<Arc<str>> = {
            let present: std::collections::HashSet<&str> =
                generated.iter().map(|n| n.name.as_str()).collect();
            watch
                .sent
                .keys()
                .filter(|n| !present.contains(&***n))
                .cloned()
                .collect()
        };
        removed.sort();
        for name in &removed {
            watch.sent.remove(name);
        }
        // Only what changed is sent. A name is interned when Envoy first gets it, not on
        // every push.
        let mut resources = Vec::new();
        for named in generated {
            let version = resource_version(&named.resource);
            match watch.sent.get_mut(named.name.as_str()) {
                Some(held) if *held == Some(version) => continue,
                Some(held) => *held = Some(version),
                None => {
                    watch
                        .sent
                        .insert(intern::intern(&named.name), Some(version));
                }
            }
            resources.push((named.name, format!("{version:016x}"), named.resource));
        }
        if resources.is_empty() && removed.is_empty() && (watch.responded || !requested) {
            return None;
        }
        watch.responded = true;
        if type_url == CLUSTER_TYPE {
            let names: Vec<&str> = resources.iter().map(|(name, ..)| name.as_str()).collect();
            forget_endpoints_of(&mut self.watches, &names);
        }
        let watch = self.watches.get_mut(type_url)?;
        self.next_nonce += 1;
        let nonce = format!("{}-{}", push.version, self.next_nonce);
        let out = Outgoing::delta(&push.version, type_url, &nonce, resources, &removed);
        watch.nonce_sent = nonce;
        watch.sync.sent = Some(push.version.clone());
        watch.sync.sent_at = Some(std::time::SystemTime::now());
        Some(out)
    }
}

/// Envoy finishes warming an updated EDS cluster only when it receives the cluster's
/// ClusterLoadAssignment again, changed or not (Envoy's xDS protocol notes on resource warming);
/// until then it keeps the previous cluster, and the new settings never apply. So whenever
/// `clusters` are sent, what Envoy holds of their endpoints is forgotten, and the next EDS
/// response (the one that follows in the same push, or with the request's answer) re-sends
/// them. Only the clusters sent: an unchanged cluster keeps its endpoints unsent. Our EDS
/// clusters name their endpoints after themselves (empty `service_name`, or the same name).
fn forget_endpoints_of(watches: &mut HashMap<String, DeltaWatch>, clusters: &[&str]) {
    let Some(eds) = watches.get_mut(ENDPOINT_TYPE) else {
        return;
    };
    for name in clusters {
        if let Some(held) = eds.sent.get_mut(*name) {
            *held = None;
        }
    }
}

/// A gRPC interceptor that, given a token, admits only streams carrying
/// `authorization: Bearer <token>` (compared in constant time); without one it admits all.
pub fn bearer_check(
    token: Option<String>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| {
        let Some(expected) = &token else {
            return Ok(req);
        };
        let got = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let same = got.len() == expected.len()
            && got
                .bytes()
                .zip(expected.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(req)
        } else {
            tracing::warn!("xDS stream refused: missing or wrong bearer token");
            Err(Status::unauthenticated("a valid bearer token is required"))
        }
    }
}
