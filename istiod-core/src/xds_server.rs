//! The ADS server (state of the world): one task per stream that tracks, per type, what the proxy
//! subscribed to, the nonce last sent and what was ACKed or NACKed, and pushes every subscribed
//! type when a new PushContext is published. Mirrors istiod's `pilot/pkg/xds/ads.go`.
//!
//! `XdsServer::stream` works on any request stream, so the agent can embed the server in process
//! and the tonic service (`AdsService`) is a thin adapter over it.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::generators::{self, CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};
use crate::model::Proxy;
use crate::push_context::PushContext;

/// Order in which types are pushed, so Envoy never sees a reference before its target.
const PUSH_ORDER: [&str; 5] = [
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    istio_proto::nds::TYPE_URL,
];

pub type ResponseStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
pub type DeltaResponseStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

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
}

#[derive(Debug, Default)]
struct Watch {
    names: Vec<String>,
    nonce_sent: String,
    version_acked: Option<String>,
}

struct Connection {
    proxy: Option<Proxy>,
    watches: HashMap<String, Watch>,
    next_nonce: u64,
}

/// Resources of `type_url` for `proxy`, or `None` for a type we do not serve.
fn generate(
    push: &PushContext,
    proxy: &Proxy,
    type_url: &str,
    names: &[String],
) -> Option<Vec<generators::Named>> {
    Some(match type_url {
        CLUSTER_TYPE => generators::cds::generate(push, proxy),
        ENDPOINT_TYPE => generators::eds::generate(push, names),
        LISTENER_TYPE => generators::lds::generate(push, proxy),
        ROUTE_TYPE => generators::rds::generate(push, names),
        istio_proto::nds::TYPE_URL => generators::nds::generate(push),
        _ => return None,
    })
}

impl Connection {
    fn response(&mut self, push: &PushContext, type_url: &str) -> Option<DiscoveryResponse> {
        let proxy = self.proxy.as_ref()?;
        let watch = self.watches.get_mut(type_url)?;
        let resources = generate(push, proxy, type_url, &watch.names)?;
        self.next_nonce += 1;
        let nonce = format!("{}-{}", push.version, self.next_nonce);
        watch.nonce_sent = nonce.clone();
        Some(DiscoveryResponse {
            version_info: push.version.clone(),
            resources: resources.into_iter().map(|n| n.resource).collect(),
            type_url: type_url.to_string(),
            nonce,
            ..Default::default()
        })
    }
}

impl XdsServer {
    pub fn new(push: watch::Receiver<Arc<PushContext>>) -> Self {
        XdsServer {
            push,
            stats: Arc::default(),
        }
    }

    pub fn stats(&self) -> Arc<XdsStats> {
        self.stats.clone()
    }

    /// Serves one ADS stream: reads `requests`, returns the responses.
    pub fn stream<S>(&self, requests: S) -> ResponseStream
    where
        S: Stream<Item = Result<DiscoveryRequest, Status>> + Send + 'static,
    {
        let conn = Connection {
            proxy: None,
            watches: HashMap::new(),
            next_nonce: 0,
        };
        serve_stream(self.push.clone(), self.stats.clone(), conn, requests)
    }

    /// Serves one Delta ADS stream: per type, Envoy's subscriptions and the version of each
    /// resource it holds; a push sends only what changed, plus the names that went away.
    pub fn delta_stream<S>(&self, requests: S) -> DeltaResponseStream
    where
        S: Stream<Item = Result<DeltaDiscoveryRequest, Status>> + Send + 'static,
    {
        serve_stream(
            self.push.clone(),
            self.stats.clone(),
            DeltaConnection::default(),
            requests,
        )
    }

    /// The tonic service for serving this over gRPC.
    pub fn service(self) -> AggregatedDiscoveryServiceServer<AdsService> {
        AggregatedDiscoveryServiceServer::new(AdsService { server: self })
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }
}

/// The per-stream protocol state of one xDS flavour (state of the world or Delta).
trait StreamState: Send + 'static {
    type Request: Send + 'static;
    type Response: Send + 'static;
    /// Handles a request from the proxy; may answer it.
    fn on_request(
        &mut self,
        push: &PushContext,
        req: Self::Request,
        stats: &XdsStats,
    ) -> Result<Option<Self::Response>, Status>;
    /// What to send for `type_url` after a new snapshot, if anything.
    fn on_push(&mut self, push: &PushContext, type_url: &str) -> Option<Self::Response>;
}

impl StreamState for Connection {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    fn on_request(
        &mut self,
        push: &PushContext,
        req: DiscoveryRequest,
        stats: &XdsStats,
    ) -> Result<Option<DiscoveryResponse>, Status> {
        handle_request(self, push, req, stats)
    }
    fn on_push(&mut self, push: &PushContext, type_url: &str) -> Option<DiscoveryResponse> {
        self.response(push, type_url)
    }
}

impl StreamState for DeltaConnection {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    fn on_request(
        &mut self,
        push: &PushContext,
        req: DeltaDiscoveryRequest,
        stats: &XdsStats,
    ) -> Result<Option<DeltaDiscoveryResponse>, Status> {
        self.handle(push, req, stats)
    }
    fn on_push(&mut self, push: &PushContext, type_url: &str) -> Option<DeltaDiscoveryResponse> {
        self.response(push, type_url, false)
    }
}

/// One stream's task: answers requests and, on every new snapshot, pushes each subscribed type
/// in `PUSH_ORDER`.
fn serve_stream<C, S>(
    mut push_rx: watch::Receiver<Arc<PushContext>>,
    stats: Arc<XdsStats>,
    mut conn: C,
    requests: S,
) -> ReceiverStream<Result<C::Response, Status>>
where
    C: StreamState,
    S: Stream<Item = Result<C::Request, Status>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut requests = Box::pin(requests);
        loop {
            let out: Vec<C::Response> = tokio::select! {
                req = requests.next() => match req {
                    Some(Ok(req)) => {
                        let push = push_rx.borrow_and_update().clone();
                        match conn.on_request(&push, req, &stats) {
                            Ok(out) => out.into_iter().collect(),
                            Err(status) => {
                                let _ = tx.send(Err(status)).await;
                                return;
                            }
                        }
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "xds stream ended with error");
                        return;
                    }
                    None => return,
                },
                changed = push_rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let push = push_rx.borrow_and_update().clone();
                    PUSH_ORDER.iter().filter_map(|t| conn.on_push(&push, t)).collect()
                }
            };
            for resp in out {
                stats.pushes.fetch_add(1, Ordering::Relaxed);
                if tx.send(Ok(resp)).await.is_err() {
                    return;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

/// On a stream's first request, learns which proxy is on the other end from its node id.
fn identify(
    proxy: &mut Option<Proxy>,
    node: Option<&envoy_types::pb::envoy::config::core::v3::Node>,
) -> Result<(), Status> {
    if proxy.is_none() {
        let node = node.ok_or_else(|| Status::invalid_argument("first request carries no node"))?;
        let mut p =
            Proxy::from_node_id(&node.id).map_err(|e| Status::invalid_argument(e.to_string()))?;
        p.labels = node_labels(node);
        tracing::info!(proxy = %node.id, "xds stream connected");
        *proxy = Some(p);
    }
    Ok(())
}

/// The workload labels the agent puts in its node metadata (`LABELS`, a map of strings).
fn node_labels(
    node: &envoy_types::pb::envoy::config::core::v3::Node,
) -> std::collections::BTreeMap<String, String> {
    use envoy_types::pb::google::protobuf::value::Kind;
    let Some(Kind::StructValue(labels)) = node
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get("LABELS"))
        .and_then(|v| v.kind.as_ref())
    else {
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

/// Classifies a request that answers one of our responses: true for an ACK of the latest one;
/// false for a NACK (logged and counted) or an answer to a response since superseded.
fn acked(
    nonce: &str,
    nonce_sent: &str,
    error: Option<&envoy_types::pb::google::rpc::Status>,
    type_url: &str,
    stats: &XdsStats,
) -> bool {
    if nonce != nonce_sent {
        return false;
    }
    if let Some(err) = error {
        stats.nacks.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(type_url, error = %err.message, "proxy rejected config (NACK)");
        return false;
    }
    stats.acks.fetch_add(1, Ordering::Relaxed);
    true
}

fn handle_request(
    conn: &mut Connection,
    push: &PushContext,
    req: DiscoveryRequest,
    stats: &XdsStats,
) -> Result<Option<DiscoveryResponse>, Status> {
    identify(&mut conn.proxy, req.node.as_ref())?;
    let watch = conn.watches.entry(req.type_url.clone()).or_default();
    if !req.response_nonce.is_empty() {
        if !acked(
            &req.response_nonce,
            &watch.nonce_sent,
            req.error_detail.as_ref(),
            &req.type_url,
            stats,
        ) {
            return Ok(None);
        }
        watch.version_acked = Some(req.version_info.clone());
        if watch.names == req.resource_names {
            return Ok(None);
        }
    }
    watch.names = req.resource_names;
    Ok(conn.response(push, &req.type_url))
}

/// Types for which an empty subscription means "everything" (Envoy's legacy wildcard).
fn wildcard_by_default(type_url: &str) -> bool {
    matches!(
        type_url,
        CLUSTER_TYPE | LISTENER_TYPE | istio_proto::nds::TYPE_URL
    )
}

/// A resource's version: a digest of its encoded bytes, so an unchanged resource is not resent.
fn resource_version(resource: &envoy_types::pb::google::protobuf::Any) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    resource.value.hash(&mut h);
    format!("{:016x}", h.finish())
}

#[derive(Debug, Default)]
struct DeltaWatch {
    wildcard: bool,
    names: std::collections::BTreeSet<String>,
    /// What Envoy holds: name → version.
    sent: HashMap<String, String>,
    nonce_sent: String,
    /// The first response for a type is sent even when empty, so Envoy's init completes.
    responded: bool,
}

#[derive(Default)]
struct DeltaConnection {
    proxy: Option<Proxy>,
    watches: HashMap<String, DeltaWatch>,
    next_nonce: u64,
}

impl DeltaConnection {
    fn handle(
        &mut self,
        push: &PushContext,
        req: DeltaDiscoveryRequest,
        stats: &XdsStats,
    ) -> Result<Option<DeltaDiscoveryResponse>, Status> {
        identify(&mut self.proxy, req.node.as_ref())?;
        let first = !self.watches.contains_key(&req.type_url);
        let watch = self.watches.entry(req.type_url.clone()).or_default();
        if first {
            watch.wildcard =
                wildcard_by_default(&req.type_url) && req.resource_names_subscribe.is_empty();
            watch.sent = req.initial_resource_versions.clone().into_iter().collect();
        }
        if !req.response_nonce.is_empty()
            && !acked(
                &req.response_nonce,
                &watch.nonce_sent,
                req.error_detail.as_ref(),
                &req.type_url,
                stats,
            )
        {
            return Ok(None);
        }
        let mut changed = first;
        for name in req.resource_names_subscribe {
            if name == "*" {
                changed |= !watch.wildcard;
                watch.wildcard = true;
            } else {
                changed |= watch.names.insert(name);
            }
        }
        for name in req.resource_names_unsubscribe {
            if name == "*" {
                watch.wildcard = false;
            } else {
                watch.names.remove(&name);
            }
            // Envoy dropped it; forget that it holds it so a resubscribe resends it.
            watch.sent.remove(&name);
        }
        if !changed {
            return Ok(None);
        }
        Ok(self.response(push, &req.type_url, true))
    }

    fn response(
        &mut self,
        push: &PushContext,
        type_url: &str,
        requested: bool,
    ) -> Option<DeltaDiscoveryResponse> {
        let proxy = self.proxy.as_ref()?;
        let watch = self.watches.get_mut(type_url)?;
        let names: Vec<String> = watch.names.iter().cloned().collect();
        let generated = generate(push, proxy, type_url, &names)?;
        let wanted = |name: &str| watch.wildcard || watch.names.contains(name);
        let mut resources = Vec::new();
        let mut present = std::collections::HashSet::new();
        for named in generated.into_iter().filter(|n| wanted(&n.name)) {
            present.insert(named.name.clone());
            let version = resource_version(&named.resource);
            if watch.sent.get(&named.name) != Some(&version) {
                watch.sent.insert(named.name.clone(), version.clone());
                resources.push(envoy_types::pb::envoy::service::discovery::v3::Resource {
                    name: named.name,
                    version,
                    resource: Some(named.resource),
                    ..Default::default()
                });
            }
        }
        let mut removed: Vec<String> = watch
            .sent
            .keys()
            .filter(|n| !present.contains(*n))
            .cloned()
            .collect();
        removed.sort();
        for name in &removed {
            watch.sent.remove(name);
        }
        if resources.is_empty() && removed.is_empty() && (watch.responded || !requested) {
            return None;
        }
        watch.responded = true;
        self.next_nonce += 1;
        let nonce = format!("{}-{}", push.version, self.next_nonce);
        watch.nonce_sent = nonce.clone();
        Some(DeltaDiscoveryResponse {
            system_version_info: push.version.clone(),
            resources,
            type_url: type_url.to_string(),
            removed_resources: removed,
            nonce,
            ..Default::default()
        })
    }
}

/// The tonic adapter.
pub struct AdsService {
    server: XdsServer,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsService {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream =
        Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Ok(Response::new(self.server.stream(request.into_inner())))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Ok(Response::new(Box::pin(
            self.server.delta_stream(request.into_inner()),
        )))
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
