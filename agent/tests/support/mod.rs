//! A fake control plane for the agent's integration tests: a real gRPC ADS server on loopback
//! (TLS with certificates made here, or plaintext) that counts the connections it accepts and
//! the ADS calls it receives, and answers each state-of-the-world request with responses that
//! name the stream they belong to. Also what several tests build the same way: a sidecar's
//! agent config from env, and the Envoy binary for `envoy --mode validate`.

#![allow(clippy::unwrap_used, dead_code)] // test code: a panic is the failure report

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::{Stream, StreamExt};
use pilot_agent::config::{RootCa, XdsClientConfig};
use tonic::{Request, Response, Status, Streaming};

pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// The server name the agent expects of istiod by default.
pub const ISTIOD_SAN: &str = "istiod.istio-system.svc";
/// Responses the fake sends for each request.
pub const PUSHES: usize = 3;
/// A resource name starting with this makes the fake send one response and then fail the
/// stream, as a control plane going away mid-push would.
pub const CLOSE_PREFIX: &str = "close-";

/// A root certificate (PEM) and a server certificate with `sans` signed by it.
pub struct Pki {
    pub root_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl Pki {
    pub fn new(org: &str, sans: &[&str]) -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::OrganizationName, org);
        let root = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        Pki {
            root_pem: root.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// What the fake control plane saw.
#[derive(Default)]
pub struct Counts {
    /// TCP connections accepted (a TLS handshake may follow).
    pub connections: AtomicUsize,
    /// ADS calls (streams) that reached the service: only after TLS and HTTP/2 succeeded.
    pub streams: AtomicUsize,
    /// Discovery requests read from those streams.
    pub requests: AtomicUsize,
    /// Streams whose response side has been dropped (the stream is over on the server).
    pub closed: AtomicUsize,
}

impl Counts {
    pub fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }
}

struct FakeAds {
    counts: Arc<Counts>,
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Counts the end of a response stream when dropped.
struct OnDrop(Arc<Counts>);
impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.closed.fetch_add(1, Ordering::SeqCst);
    }
}

/// The responses to one request: `PUSHES` of them, each with the request's first resource name
/// as its version and `<name>-<i>` as its nonce, so a client can tell whose they are.
fn answer(req: &DiscoveryRequest) -> Vec<Result<DiscoveryResponse, Status>> {
    let name = req.resource_names.first().cloned().unwrap_or_default();
    let response = |i: usize| DiscoveryResponse {
        version_info: name.clone(),
        type_url: req.type_url.clone(),
        nonce: format!("{name}-{i}"),
        ..Default::default()
    };
    if name.starts_with(CLOSE_PREFIX) {
        return vec![
            Ok(response(0)),
            Err(Status::unavailable("control plane going away")),
        ];
    }
    (0..PUSHES).map(|i| Ok(response(i))).collect()
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for FakeAds {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        self.counts.streams.fetch_add(1, Ordering::SeqCst);
        let counts = self.counts.clone();
        let guard = OnDrop(self.counts.clone());
        let out = request
            .into_inner()
            .take_while(|r| std::future::ready(r.is_ok()))
            .filter_map(move |r| {
                let r = r.ok().filter(|r| r.response_nonce.is_empty());
                if r.is_some() {
                    counts.requests.fetch_add(1, Ordering::SeqCst);
                }
                std::future::ready(r)
            })
            .flat_map(|r| futures::stream::iter(answer(&r)))
            // An error ends the stream, as a gRPC server's would.
            .scan(false, |failed, r| {
                let item = (!*failed).then_some(r);
                *failed = item.as_ref().is_some_and(Result::is_err);
                std::future::ready(item)
            })
            .map(move |r| {
                let _alive = &guard;
                r
            });
        Ok(Response::new(Box::pin(out)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        self.counts.streams.fetch_add(1, Ordering::SeqCst);
        Err(Status::unimplemented("state of the world only"))
    }
}

/// A running fake control plane.
pub struct FakeControlPlane {
    pub addr: SocketAddr,
    pub counts: Arc<Counts>,
}

impl FakeControlPlane {
    /// Serves on 127.0.0.1 (a free port), over TLS with `pki`'s server certificate when given.
    pub async fn start(pki: Option<&Pki>) -> FakeControlPlane {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Arc::new(Counts::default());
        let accepted = counts.clone();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).inspect(move |c| {
            if let Ok(c) = c {
                accepted.connections.fetch_add(1, Ordering::SeqCst);
                // As tonic's own listener does: no Nagle delay on small gRPC frames.
                let _ = c.set_nodelay(true);
            }
        });
        let mut server = tonic::transport::Server::builder();
        if let Some(pki) = pki {
            let identity = tonic::transport::Identity::from_pem(&pki.cert_pem, &pki.key_pem);
            server = server
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .unwrap();
        }
        let service = AggregatedDiscoveryServiceServer::new(FakeAds {
            counts: counts.clone(),
        });
        tokio::spawn(server.add_service(service).serve_with_incoming(incoming));
        FakeControlPlane { addr, counts }
    }
}

/// Dial options for the fake: TLS against the root in `root_file` with server name `san`, or
/// plaintext when `root_file` is `None`.
pub fn client_config(root_file: Option<&Path>, san: &str) -> XdsClientConfig {
    XdsClientConfig {
        tls: root_file.is_some(),
        root_ca: RootCa::Files(root_file.map(Path::to_path_buf).into_iter().collect()),
        server_name: san.to_string(),
        token_path: PathBuf::from("/nonexistent/istio-token"),
        headers: Vec::new(),
        connect_timeout: pilot_agent::config::xds_client::DEFAULT_CONNECT_TIMEOUT,
        max_response_bytes: pilot_agent::config::xds_client::DEFAULT_MAX_RESPONSE_BYTES,
    }
}

/// A state-of-the-world request for `name` of the cluster type.
pub fn request(name: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: CLUSTER.to_string(),
        resource_names: vec![name.to_string()],
        ..Default::default()
    }
}

/// The xDS proxy on a unix socket in `dir`, forwarding to `upstream`; returns the socket path.
pub fn start_proxy(dir: &Path, upstream: pilot_agent::xds_proxy::Upstream) -> PathBuf {
    let path = dir.join("XDS");
    let listener = pilot_agent::xds_proxy::bind(&path, None).unwrap();
    tokio::spawn(pilot_agent::xds_proxy::serve(
        listener,
        pilot_agent::uds::allowed_uids(1337),
        upstream,
        Arc::new(pilot_agent::metrics::Metrics::new()),
        None,
        None,
        None,
        std::future::pending(),
    ));
    path
}

/// An ADS client on the proxy's socket, as Envoy connects.
pub async fn envoy_client(
    socket: &Path,
) -> envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient<tonic::transport::Channel>{
    let channel = pilot_agent::sds::connect(socket.to_path_buf())
        .await
        .unwrap();
    envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient::new(channel)
}

/// Opens a stream through the proxy and sends `first`; returns the sender for more requests
/// and the response stream, or the status the stream failed with.
pub async fn open_stream(
    client: &mut envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
    first: DiscoveryRequest,
) -> Result<
    (
        tokio::sync::mpsc::Sender<DiscoveryRequest>,
        Streaming<DiscoveryResponse>,
    ),
    Status,
> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(first).await.unwrap();
    let resp = client
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?;
    Ok((tx, resp.into_inner()))
}

/// A sidecar's agent config for pods of `domain` from `env` (as the container's environment
/// would give it) and the proxy args `extra`.
pub fn sidecar_config(
    domain: &str,
    env: &[(&str, &str)],
    extra: pilot_agent::config::ProxyArgs,
) -> pilot_agent::config::Config {
    let vars: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = vars.clone();
    pilot_agent::config::Config::from_env(
        &pilot_agent::config::ProxyArgs {
            proxy_type: "sidecar".into(),
            domain: Some(domain.into()),
            config_dir: Some("/etc/istio/mesh.d".into()),
            proxy_log_level: "warning".into(),
            ..extra
        },
        &move |k| lookup.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
        &vars,
        &|_| Some(1337),
    )
    .expect("valid config")
}

/// Envoy for `envoy --mode validate` (ENVOY_BIN, else /usr/local/bin/envoy). Missing, it fails
/// the test unless skipping was asked for with SKIP_E2E=1 (then `None`, said loudly).
pub fn envoy() -> Option<PathBuf> {
    let p =
        PathBuf::from(std::env::var("ENVOY_BIN").unwrap_or_else(|_| "/usr/local/bin/envoy".into()));
    if p.exists() {
        return Some(p);
    }
    // Skipping is asked for (SKIP_E2E=1), never the default.
    assert!(
        std::env::var("SKIP_E2E").is_ok_and(|v| v == "1"),
        "needs Envoy at {} (scripts/setup.sh installs it), or SKIP_E2E=1 to skip explicitly",
        p.display()
    );
    eprintln!("!!!!! SKIPPED (SKIP_E2E=1): envoy not installed, no `envoy --mode validate` !!!!!");
    None
}
