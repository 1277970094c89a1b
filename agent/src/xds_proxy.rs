//! The xDS proxy: Envoy's ADS streams (state of the world and Delta) arrive on the unix socket
//! `./etc/istio/proxy/XDS` and are forwarded to the control plane: istiod-core in process, or a
//! remote server over gRPC (TLS, bearer token, metadata; see `XdsClientConfig`).
//! Mirrors Istio's `pkg/istio-agent/xds_proxy.go` and `xds_proxy_delta.go`: one upstream stream
//! per Envoy stream, and an upstream error closes Envoy's stream so that Envoy reconnects while
//! serving its last config.
//!
//! Messages to and from a remote control plane are forwarded as bytes (a pass-through gRPC codec):
//! each response's envelope is checked (`envelope`: garbage ends Envoy's stream with an error)
//! and its `type_url` read, to drop types Envoy does not use.

mod envelope;

use mesh_common::grpc::{ADS_DELTA_PATH, ADS_SERVICE, ADS_SOTW_PATH};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes};
use futures::{Stream, StreamExt};
use prost::Message;
use tokio::net::UnixListener;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{Body, BoxFuture, StdError, http};
use tonic::{Status, Streaming};

use crate::config::XdsClientConfig;
use crate::grpc_client::{Backoff, dial};

/// Largest request Envoy may send the proxy: Envoy's requests name resources and carry its node,
/// far below this; anything larger is refused (RESOURCE_EXHAUSTED) rather than buffered.
pub const MAX_ENVOY_REQUEST_BYTES: usize = 4 * 1024 * 1024;

type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

#[derive(Debug, thiserror::Error)]
pub enum XdsProxyError {
    #[error("cannot prepare xDS socket {path}: {source}")]
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("xDS proxy server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// A gRPC codec that passes message bytes through untouched.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

#[derive(Debug, Clone, Copy, Default)]
pub struct RawEncoder;

#[derive(Debug, Clone, Copy, Default)]
pub struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Just the `type_url` of a (Delta)DiscoveryResponse: field 4 in both.
#[derive(Clone, PartialEq, prost::Message)]
struct TypeUrlOnly {
    #[prost(string, tag = "4")]
    type_url: String,
}

/// Response types Envoy may receive through the proxy; anything else is dropped.
fn forwarded(type_url: &str) -> bool {
    let ok = type_url.starts_with("type.googleapis.com/envoy.")
        || type_url.starts_with("type.googleapis.com/istio.workload.");
    if !ok {
        tracing::error!(
            type_url,
            "dropping an xDS response of a type Envoy does not use"
        );
    }
    ok
}

fn keep_response(msg: &Result<Bytes, Status>) -> bool {
    match msg {
        Ok(bytes) => TypeUrlOnly::decode(bytes.clone()).is_ok_and(|t| forwarded(&t.type_url)),
        Err(_) => true,
    }
}

/// Where Envoy's streams are forwarded.
#[derive(Clone)]
pub enum Upstream {
    /// istiod-core in this process.
    Embedded(crate::embedded::InProcess),
    /// A remote ADS server at `host:port`.
    Remote {
        address: String,
        client: XdsClientConfig,
    },
}

impl Upstream {
    /// Largest response passed on to Envoy: XDS_MAX_RESPONSE_BYTES for a remote control plane,
    /// what istiod-core sends at most in process.
    fn max_response_bytes(&self) -> usize {
        match self {
            Upstream::Embedded(_) => crate::embedded::MAX_RESPONSE_BYTES,
            Upstream::Remote { client, .. } => client.max_response_bytes,
        }
    }

    async fn open(
        &self,
        delta: bool,
        requests: ReceiverStream<Bytes>,
    ) -> Result<ByteStream, Status> {
        match self {
            Upstream::Embedded(server) => Ok(server.open(delta, requests)),
            Upstream::Remote { address, client } => {
                let channel = dial(address, client).await?;
                let mut grpc = tonic::client::Grpc::new(channel)
                    .max_decoding_message_size(client.max_response_bytes)
                    .max_encoding_message_size(MAX_ENVOY_REQUEST_BYTES);
                grpc.ready()
                    .await
                    .map_err(|e| Status::unavailable(format!("control plane {address}: {e}")))?;
                let path = http::uri::PathAndQuery::from_static(if delta {
                    ADS_DELTA_PATH
                } else {
                    ADS_SOTW_PATH
                });
                let resp = grpc
                    .streaming(tonic::Request::new(requests), path, RawCodec)
                    .await?;
                Ok(Box::pin(resp.into_inner().map(move |r| {
                    r.and_then(|bytes| envelope::checked(delta, bytes))
                })))
            }
        }
    }
}

/// Just the `type_url` of a request: field 4 of DiscoveryRequest.
#[derive(Clone, PartialEq, prost::Message)]
struct SotwRequestType {
    #[prost(string, tag = "4")]
    type_url: String,
}

/// Just the `type_url` of a request: field 2 of DeltaDiscoveryRequest.
#[derive(Clone, PartialEq, prost::Message)]
struct DeltaRequestType {
    #[prost(string, tag = "2")]
    type_url: String,
}

const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

fn request_type(delta: bool, bytes: &Bytes) -> String {
    if delta {
        DeltaRequestType::decode(bytes.clone())
            .map(|r| r.type_url)
            .unwrap_or_default()
    } else {
        SotwRequestType::decode(bytes.clone())
            .map(|r| r.type_url)
            .unwrap_or_default()
    }
}

/// A subscription to (or ACK of) the DNS name table, sent by the agent itself.
fn nds_request(delta: bool, version: &str, nonce: &str) -> Bytes {
    nds_answer(delta, version, nonce, None)
}

/// The agent's answer to a name table: an ACK, or with `error` a NACK (`version` is then the
/// last one accepted, as the xDS protocol asks).
fn nds_answer(delta: bool, version: &str, nonce: &str, error: Option<String>) -> Bytes {
    crate::xds_adapt::answer_upstream(delta, istio_proto::nds::TYPE_URL, version, nonce, error)
}

/// Forwards Envoy's request stream into `tx` until Envoy ends or errors. With DNS on, the first
/// LDS request is followed by the agent's own NDS subscription (as Istio's agent does). A request
/// that cannot be read (too large, broken framing) is reported on `failed`, which ends Envoy's
/// stream with that status: Envoy reconnects, rather than waiting on a stream that is deaf.
///
/// With a health checker (a VM's `readinessProbe`), its latest verdict follows the first LDS
/// request (istiod drops a health report that comes before the proxy is known, so a verdict
/// reached earlier waits for it, and each new upstream stream gets it again), and every later
/// change of verdict is sent as it comes (Istio's agent's `initialHealthRequest`).
fn forward(
    mut from: Streaming<Bytes>,
    tx: tokio::sync::mpsc::Sender<Bytes>,
    delta: bool,
    subscribe_nds: bool,
    mut health: Option<crate::health::HealthWatch>,
    metrics: Arc<crate::metrics::Metrics>,
    failed: tokio::sync::oneshot::Sender<Status>,
) {
    tokio::spawn(async move {
        let mut lds_seen = false;
        loop {
            let changed = async {
                match (&mut health, lds_seen) {
                    (Some(h), true) => h.changed().await.is_ok(),
                    _ => std::future::pending().await,
                }
            };
            let item = tokio::select! {
                item = from.next() => item,
                alive = changed => {
                    if !alive {
                        health = None;
                        continue;
                    }
                    let verdict = health.as_mut().and_then(|h| h.borrow_and_update().clone());
                    if let Some(verdict) = verdict
                        && tx.send(crate::health::request(delta, &verdict)).await.is_err()
                    {
                        break;
                    }
                    continue;
                }
            };
            let item = match item {
                Some(Ok(item)) => item,
                Some(Err(status)) => {
                    tracing::warn!(error = %status.message(), "unreadable request from Envoy; closing its stream");
                    let _ = failed.send(status);
                    break;
                }
                None => break,
            };
            metrics.xds_proxy_requests.inc();
            let first_lds = !lds_seen && request_type(delta, &item) == LISTENER_TYPE;
            if tx.send(item).await.is_err() {
                break;
            }
            if first_lds {
                lds_seen = true;
                if subscribe_nds && tx.send(nds_request(delta, "", "")).await.is_err() {
                    break;
                }
                let verdict = health.as_mut().and_then(|h| h.borrow_and_update().clone());
                if let Some(verdict) = verdict
                    && tx
                        .send(crate::health::request(delta, &verdict))
                        .await
                        .is_err()
                {
                    break;
                }
            }
        }
    });
}

/// If `msg` is an NDS response: publishes the table, queues the ACK and returns true.
fn consume_nds(
    delta: bool,
    msg: &Bytes,
    dns: &DnsState,
    ack: &tokio::sync::mpsc::Sender<Bytes>,
) -> bool {
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse,
    };
    let Ok(t) = TypeUrlOnly::decode(msg.clone()) else {
        return false;
    };
    if t.type_url != istio_proto::nds::TYPE_URL {
        return false;
    }
    let (version, nonce, any) = if delta {
        let Ok(r) = DeltaDiscoveryResponse::decode(msg.clone()) else {
            return true;
        };
        let any = r.resources.into_iter().find_map(|r| r.resource);
        (r.system_version_info, r.nonce, any)
    } else {
        let Ok(r) = DiscoveryResponse::decode(msg.clone()) else {
            return true;
        };
        (r.version_info, r.nonce, r.resources.into_iter().next())
    };
    let answer = match any.map(|a| istio_proto::nds::NameTable::decode(a.value.as_slice())) {
        Some(Ok(table)) => {
            let mut table = crate::dns::DnsTable::from_name_table(
                &table,
                &dns.pod_namespace,
                dns.search.as_deref(),
            );
            table.version = version.clone();
            tracing::info!(names = table.len(), version = %version, "DNS name table received");
            dns.table.send_replace(Some(Arc::new(table)));
            nds_request(delta, &version, &nonce)
        }
        Some(Err(e)) => {
            tracing::error!(error = %e, version = %version, "undecodable DNS name table; keeping the last one and rejecting it");
            let accepted = dns
                .table
                .borrow()
                .as_ref()
                .map(|t| t.version.clone())
                .unwrap_or_default();
            nds_answer(
                delta,
                &accepted,
                &nonce,
                Some(format!("undecodable NameTable (version {version}): {e}")),
            )
        }
        None => nds_request(delta, &version, &nonce),
    };
    if ack.try_send(answer).is_err() {
        tracing::warn!("could not answer the DNS name table");
    }
    true
}

/// Where the agent publishes the DNS name table it consumes from NDS.
#[derive(Clone)]
pub struct DnsState {
    pub table: tokio::sync::watch::Sender<Option<Arc<crate::dns::DnsTable>>>,
    pub pod_namespace: String,
    /// The first search domain of the pod's resolv.conf.
    pub search: Option<String>,
}

struct Inner {
    upstream: Upstream,
    /// The adaptation of responses for upstream Envoy, when on (`xds_adapt`).
    adapt: Option<Arc<crate::xds_adapt::Adapter>>,
    metrics: Arc<crate::metrics::Metrics>,
    dns: Option<DnsState>,
    /// The VM health checker's verdicts, reported upstream.
    health: Option<crate::health::HealthWatch>,
    /// Consecutive failed dials to the control plane.
    failures: AtomicU32,
}

impl Inner {
    async fn proxy(&self, delta: bool, requests: Streaming<Bytes>) -> Result<ByteStream, Status> {
        tracing::info!(
            protocol = if delta { "delta" } else { "state of the world" },
            "Envoy connected to the xDS proxy ({})",
            if delta { "delta" } else { "state of the world" }
        );
        tokio::time::sleep(Backoff::CONTROL_PLANE.after(self.failures.load(Ordering::Relaxed)))
            .await;
        let metrics = self.metrics.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let (failed_tx, failed_rx) = tokio::sync::oneshot::channel();
        forward(
            requests,
            tx.clone(),
            delta,
            self.dns.is_some(),
            self.health.clone(),
            metrics.clone(),
            failed_tx,
        );
        // Envoy's side failing ends the response stream with its status.
        let failure =
            futures::stream::once(failed_rx).filter_map(|r| std::future::ready(r.ok().map(Err)));
        let dns = self.dns.clone();
        let (adapt, nack_tx) = (self.adapt.clone(), tx.clone());
        match self.upstream.open(delta, ReceiverStream::new(rx)).await {
            Ok(responses) => {
                self.failures.store(0, Ordering::Relaxed);
                let responses = responses.filter(move |r| {
                    let consumed = match (&dns, r) {
                        (Some(dns), Ok(bytes)) => consume_nds(delta, bytes, dns, &tx),
                        _ => false,
                    };
                    let keep = !consumed && keep_response(r);
                    if keep {
                        metrics.xds_proxy_responses.inc();
                    }
                    async move { keep }
                });
                let responses = responses.filter_map(move |r| {
                    let r = crate::xds_adapt::apply(adapt.as_deref(), delta, r, &nack_tx);
                    std::future::ready(r)
                });
                // Ends when the upstream's responses end (Envoy then reconnects), or with the
                // status of a request Envoy sent that could not be read.
                let merged = futures::stream::select(
                    responses
                        .map(Some)
                        .chain(futures::stream::once(std::future::ready(None))),
                    failure.map(Some),
                )
                .take_while(|item| std::future::ready(item.is_some()))
                .filter_map(std::future::ready);
                Ok(Box::pin(merged))
            }
            Err(e) => {
                let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(error = %e.message(), failures = n, "control plane unreachable");
                Err(e)
            }
        }
    }
}

/// One method of the proxy as a tonic streaming service over raw bytes.
struct Method {
    inner: Arc<Inner>,
    delta: bool,
}

impl tonic::server::StreamingService<Bytes> for Method {
    type Response = Bytes;
    type ResponseStream = ByteStream;
    type Future = BoxFuture<tonic::Response<ByteStream>, Status>;

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let inner = self.inner.clone();
        let delta = self.delta;
        Box::pin(async move {
            let responses = inner.proxy(delta, request.into_inner()).await?;
            Ok(tonic::Response::new(responses))
        })
    }
}

/// The ADS service Envoy talks to.
#[derive(Clone)]
struct ProxyService {
    inner: Arc<Inner>,
}

impl tonic::server::NamedService for ProxyService {
    const NAME: &'static str = ADS_SERVICE;
}

impl<B> tonic::codegen::Service<http::Request<B>> for ProxyService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let delta = match req.uri().path() {
            ADS_SOTW_PATH => false,
            ADS_DELTA_PATH => true,
            _ => {
                return Box::pin(async {
                    Ok(Status::unimplemented("not an ADS method").into_http())
                });
            }
        };
        let max_response = self.inner.upstream.max_response_bytes();
        let method = Method {
            inner: self.inner.clone(),
            delta,
        };
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RawCodec)
                .apply_max_message_size_config(Some(MAX_ENVOY_REQUEST_BYTES), Some(max_response));
            Ok(grpc.streaming(method, req).await)
        })
    }
}

/// Binds the socket (replacing a stale one): 0600, owned by Envoy's uid when given
/// (`uds::bind`; its directory, the config dir, is shared with the bootstrap and stays as it is).
pub fn bind(path: &Path, envoy_uid: Option<u32>) -> Result<UnixListener, XdsProxyError> {
    crate::uds::bind(path, envoy_uid, false).map_err(|source| XdsProxyError::Socket {
        path: path.to_path_buf(),
        source,
    })
}

/// Serves connections from `allowed_uids` (SO_PEERCRED) until `shutdown` resolves.
#[allow(clippy::too_many_arguments)] // what the proxy serves with, each optional part its own
pub async fn serve(
    listener: UnixListener,
    allowed_uids: Vec<u32>,
    upstream: Upstream,
    metrics: Arc<crate::metrics::Metrics>,
    dns: Option<DnsState>,
    health: Option<crate::health::HealthWatch>,
    adapt: Option<Arc<crate::xds_adapt::Adapter>>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), XdsProxyError> {
    let service = ProxyService {
        inner: Arc::new(Inner {
            upstream,
            adapt,
            metrics,
            dns,
            health,
            failures: AtomicU32::new(0),
        }),
    };
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(
            crate::uds::authorized(listener, allowed_uids, "xDS"),
            shutdown,
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod bounds_tests;

#[cfg(test)]
mod stream_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// A request over MAX_ENVOY_REQUEST_BYTES on the Envoy side is refused and ends that
    /// stream; a normal request on a new stream is still answered.
    #[tokio::test]
    async fn an_oversized_envoy_request_is_refused() {
        use envoy_types::pb::envoy::config::core::v3::Node;
        use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
        use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("XDS");
        let listener = bind(&path, None).unwrap();
        tokio::spawn(serve(
            listener,
            crate::uds::allowed_uids(1337),
            Upstream::Embedded(crate::embedded::InProcess::in_memory().unwrap()),
            Arc::new(crate::metrics::Metrics::new()),
            None,
            None,
            None,
            std::future::pending(),
        ));
        let channel = crate::sds::connect(path).await.unwrap();
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        let node = Some(Node {
            id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local".into(),
            ..Default::default()
        });
        let request = |names: Vec<String>| DeltaDiscoveryRequest {
            node: node.clone(),
            type_url: crate::xds_proxy::tests::CLUSTER.to_string(),
            resource_names_subscribe: names,
            ..Default::default()
        };
        let huge = vec!["x".repeat(1024); 5 * 1024];
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(request(huge)).await.unwrap();
        let outcome = match client
            .delta_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
        {
            Err(status) => status,
            Ok(resp) => resp.into_inner().message().await.unwrap_err(),
        };
        assert_eq!(outcome.code(), tonic::Code::OutOfRange, "{outcome:?}");
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(request(vec![])).await.unwrap();
        let mut ok = client
            .delta_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let first = tokio::time::timeout(std::time::Duration::from_secs(10), ok.message())
            .await
            .unwrap()
            .unwrap();
        assert!(first.is_some());
    }

    const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse,
    };

    #[test]
    fn only_envoy_and_workload_types_pass() {
        let sotw = |t: &str| {
            Ok(Bytes::from(
                DiscoveryResponse {
                    type_url: t.into(),
                    nonce: "n".into(),
                    ..Default::default()
                }
                .encode_to_vec(),
            ))
        };
        let delta = |t: &str| {
            Ok(Bytes::from(
                DeltaDiscoveryResponse {
                    type_url: t.into(),
                    system_version_info: "v".into(),
                    ..Default::default()
                }
                .encode_to_vec(),
            ))
        };
        assert!(keep_response(&sotw(
            "type.googleapis.com/envoy.config.cluster.v3.Cluster"
        )));
        assert!(keep_response(&delta(
            "type.googleapis.com/istio.workload.Address"
        )));
        assert!(!keep_response(&sotw(
            "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"
        )));
        assert!(!keep_response(&delta(
            "type.googleapis.com/istio.networking.nds.v1.NameTable"
        )));
    }
}
