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

use tokio::sync::{mpsc, watch};

use tokio_stream::wrappers::ReceiverStream;

use tonic::{Request, Status};

use crate::autoregister::{AutoRegistration, Caller};

use crate::generators;

use crate::model::Proxy;

use crate::push_context::{Change, PushContext};

use crate::resource::{
    CLUSTER_TYPE, ENDPOINT_TYPE, EXTENSION_CONFIG_TYPE, LISTENER_TYPE, Named, ROUTE_TYPE,
    SECRET_TYPE,
};

use crate::wire::Outgoing;

pub use crate::xds_debug::{ProxySync, TypeSync};

mod debug;
mod delta;
mod node;
mod sotw;

use debug::*;
use delta::*;
use node::*;
use sotw::*;

pub use node::bearer_check;

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

/// A request's health report, if it is one: healthy without an error detail, else the
/// detail's message (its code when it has none).
fn health_report(
    type_url: &str,
    error: Option<&envoy_types::pb::google::rpc::Status>,
) -> Option<Result<(), String>> {
    (type_url == mesh_common::xds::HEALTH_INFO_TYPE).then(|| match error {
        None => Ok(()),
        Some(e) if e.message.is_empty() => Err(format!("unhealthy (code {})", e.code)),
        Some(e) => Err(e.message.clone()),
    })
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
    /// A health report (`istio.v1.HealthInformation`): healthy, or the reason it is not.
    /// Never a subscription, never answered.
    fn health_report(&self, req: &Self::Request) -> Option<Result<(), String>>;
    /// Who is on the other end.
    fn scope(&self) -> &CallerScope;
    /// Whether the proxy holds or asked for any of `names` of `type_url`.
    fn watches_any(&self, type_url: &str, names: &std::collections::BTreeSet<String>) -> bool;
    fn sync(&self) -> Option<ProxySync>;
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
                    if let Some(report) = conn.health_report(&req) {
                        // As istiod: a report before the proxy is known (its first request)
                        // is dropped; so is one of a proxy that registered nothing.
                        match (conn.proxy(), &registration) {
                            (Some(proxy), Some(Some(reg))) => {
                                let (healthy, message) = match report {
                                    Ok(()) => (true, String::new()),
                                    Err(why) => (false, why),
                                };
                                tracing::debug!(proxy = %proxy.id, healthy, "health report");
                                reg.report(healthy, message);
                            }
                            (None, _) => tracing::warn!(
                                peer = ?remote,
                                "health report before any xDS request: dropped"
                            ),
                            (Some(proxy), _) => tracing::debug!(
                                proxy = %proxy.id,
                                "health report of a proxy with no registered WorkloadEntry: dropped"
                            ),
                        }
                        continue;
                    }
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
