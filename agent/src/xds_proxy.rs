//! The xDS proxy: Envoy's ADS stream arrives on the unix socket `./etc/istio/proxy/XDS` and is
//! forwarded to the control plane, either istiod-core in process or a remote server over gRPC.
//! Mirrors Istio's `pkg/istio-agent/xds_proxy.go` (state-of-the-world path); one upstream stream
//! per Envoy stream, and an upstream error closes the downstream so Envoy reconnects.

use std::path::{Path, PathBuf};
use std::pin::Pin;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::{Stream, StreamExt};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::metadata::{Ascii, MetadataKey, MetadataValue};
use tonic::{Request, Response, Status, Streaming};

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponseStream =
    Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

/// Largest xDS message accepted or sent either way (Istio's agent allows MaxInt32).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// Forwards a tonic request stream into a channel until the peer ends or errors.
fn forward<T: Send + 'static>(mut from: Streaming<T>) -> tokio_stream::wrappers::ReceiverStream<T> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Some(Ok(item)) = from.next().await {
            if tx.send(item).await.is_err() {
                break;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

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

/// Where Envoy's streams are forwarded.
#[derive(Clone)]
pub enum Upstream {
    Embedded(istiod_core::xds_server::XdsServer),
    /// A remote ADS server at `host:port`.
    Remote {
        address: String,
        client: crate::config::XdsClientConfig,
    },
}

/// Adds the bearer token and the configured metadata to every call.
#[derive(Clone)]
struct CallMetadata(Vec<(MetadataKey<Ascii>, MetadataValue<Ascii>)>);

impl tonic::service::Interceptor for CallMetadata {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        for (k, v) in &self.0 {
            req.metadata_mut().insert(k.clone(), v.clone());
        }
        Ok(req)
    }
}

type RemoteClient = AggregatedDiscoveryServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, CallMetadata>,
>;

impl Upstream {
    async fn open<S>(&self, requests: S) -> Result<ResponseStream, Status>
    where
        S: Stream<Item = DiscoveryRequest> + Send + 'static,
    {
        match self {
            Upstream::Embedded(server) => Ok(Box::pin(server.stream(requests.map(Ok)))),
            Upstream::Remote {
                address,
                client: cfg,
            } => {
                let mut client = client(address, cfg).await?;
                let resp = client.stream_aggregated_resources(requests).await?;
                Ok(Box::pin(resp.into_inner()))
            }
        }
    }

    async fn open_delta<S>(&self, requests: S) -> Result<DeltaResponseStream, Status>
    where
        S: Stream<Item = DeltaDiscoveryRequest> + Send + 'static,
    {
        match self {
            Upstream::Embedded(server) => Ok(Box::pin(server.delta_stream(requests.map(Ok)))),
            Upstream::Remote {
                address,
                client: cfg,
            } => {
                let mut client = client(address, cfg).await?;
                let resp = client.delta_aggregated_resources(requests).await?;
                Ok(Box::pin(resp.into_inner()))
            }
        }
    }
}

/// Dials the control plane for one Envoy stream. The root certificate and the token are read
/// on every connect, so rotated files take effect without a restart.
async fn client(
    address: &str,
    cfg: &crate::config::XdsClientConfig,
) -> Result<RemoteClient, Status> {
    use crate::config::RootCa;
    let scheme = if cfg.tls { "https" } else { "http" };
    let uri = format!("{scheme}://{address}");
    let mut endpoint = tonic::transport::Endpoint::from_shared(uri.clone())
        .map_err(|e| Status::invalid_argument(format!("control plane address {address}: {e}")))?
        .connect_timeout(std::time::Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .http2_keep_alive_interval(std::time::Duration::from_secs(30))
        .keep_alive_timeout(std::time::Duration::from_secs(10));
    if cfg.tls {
        let mut tls = tonic::transport::ClientTlsConfig::new().domain_name(cfg.server_name.clone());
        tls = match &cfg.root_ca {
            RootCa::System => tls.with_native_roots(),
            RootCa::Files(files) => {
                let Some(pem) = files.iter().find_map(|f| std::fs::read(f).ok()) else {
                    return Err(Status::unavailable(format!(
                        "no root certificate to verify the control plane: tried {files:?} (set XDS_ROOT_CA)"
                    )));
                };
                tls.ca_certificate(tonic::transport::Certificate::from_pem(pem))
            }
        };
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| Status::internal(format!("TLS to {address}: {e}")))?;
    }
    let mut metadata = Vec::new();
    if let Ok(token) = std::fs::read_to_string(&cfg.token_path) {
        let value = format!("Bearer {}", token.trim());
        if let Ok(v) = value.parse() {
            metadata.push((MetadataKey::from_static("authorization"), v));
        }
    }
    for (k, v) in &cfg.headers {
        if let (Ok(k), Ok(v)) = (k.parse::<MetadataKey<Ascii>>(), v.parse()) {
            metadata.push((k, v));
        }
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| Status::unavailable(format!("control plane {uri}: {e}")))?;
    Ok(
        AggregatedDiscoveryServiceClient::with_interceptor(channel, CallMetadata(metadata))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    )
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

/// Delay before dialing again after `failures` consecutive failed dials: exponential from
/// 100 ms, capped at 15 s, with ±25% jitter so many agents do not reconnect in step.
fn backoff(failures: u32) -> std::time::Duration {
    if failures == 0 {
        return std::time::Duration::ZERO;
    }
    let base = 100u64.saturating_mul(1 << failures.min(8)).min(15_000);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let jitter = 0.75 + f64::from(nanos % 1000) / 2000.0;
    std::time::Duration::from_millis((base as f64 * jitter) as u64)
}

struct Proxy {
    upstream: Upstream,
    /// Consecutive failed dials to a remote control plane.
    failures: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl Proxy {
    async fn before_dial(&self) {
        let failures = self.failures.load(std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(backoff(failures)).await;
    }

    fn after_dial<T>(&self, result: &Result<T, Status>) {
        use std::sync::atomic::Ordering;
        match result {
            Ok(_) => self.failures.store(0, Ordering::Relaxed),
            Err(e) => {
                let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(error = %e.message(), failures = n, "control plane unreachable");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_jitters() {
        assert_eq!(backoff(0), std::time::Duration::ZERO);
        let one = backoff(1).as_millis();
        assert!((150..=250).contains(&one), "{one}");
        let many = backoff(30).as_millis();
        assert!((11_250..=18_750).contains(&many), "{many}");
        assert!(forwarded(
            "type.googleapis.com/envoy.config.cluster.v3.Cluster"
        ));
        assert!(forwarded("type.googleapis.com/istio.workload.Address"));
        assert!(!forwarded(
            "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"
        ));
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Proxy {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream = DeltaResponseStream;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        tracing::info!("Envoy connected to the xDS proxy (state of the world)");
        self.before_dial().await;
        let responses = self.upstream.open(forward(request.into_inner())).await;
        self.after_dial(&responses);
        let responses = responses?.filter(|r| {
            let keep = r.as_ref().map_or(true, |r| forwarded(&r.type_url));
            async move { keep }
        });
        Ok(Response::new(Box::pin(responses)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        tracing::info!("Envoy connected to the xDS proxy (delta)");
        let responses = self
            .upstream
            .open_delta(forward(request.into_inner()))
            .await?;
        Ok(Response::new(responses))
    }
}

/// Binds the socket (replacing a stale one) and makes it usable by Envoy's uid.
pub fn bind(path: &Path, envoy_uid: Option<u32>) -> Result<UnixListener, XdsProxyError> {
    let fail = |source| XdsProxyError::Socket {
        path: path.to_path_buf(),
        source,
    };
    if path.exists() {
        std::fs::remove_file(path).map_err(fail)?;
    }
    let listener = UnixListener::bind(path).map_err(fail)?;
    if let Some(uid) = envoy_uid {
        std::os::unix::fs::chown(path, Some(uid), Some(uid)).map_err(fail)?;
    }
    Ok(listener)
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    listener: UnixListener,
    upstream: Upstream,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), XdsProxyError> {
    let service = AggregatedDiscoveryServiceServer::new(Proxy {
        upstream,
        failures: Default::default(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}
