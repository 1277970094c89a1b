//! The xDS proxy against a fake remote control plane that sends what a real one should not:
//! garbage, oversized messages, a name table that does not decode.

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::google::protobuf::Any;
use tokio::sync::mpsc;

use super::*;
use crate::config::RootCa;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const WAIT: Duration = Duration::from_secs(10);

/// One ADS method of the fake: sends `responses` (then nothing more) and reports every request.
struct FakeMethod {
    responses: Vec<Bytes>,
    seen: mpsc::UnboundedSender<Bytes>,
}

impl tonic::server::StreamingService<Bytes> for FakeMethod {
    type Response = Bytes;
    type ResponseStream = ByteStream;
    type Future = BoxFuture<tonic::Response<ByteStream>, Status>;

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let mut requests = request.into_inner();
        let seen = self.seen.clone();
        tokio::spawn(async move {
            while let Some(Ok(r)) = requests.next().await {
                if seen.send(r).is_err() {
                    break;
                }
            }
        });
        let out = futures::stream::iter(self.responses.clone().into_iter().map(Ok))
            .chain(futures::stream::pending());
        Box::pin(async move { Ok(tonic::Response::new(Box::pin(out) as ByteStream)) })
    }
}

#[derive(Clone)]
struct Fake {
    responses: Vec<Bytes>,
    seen: mpsc::UnboundedSender<Bytes>,
}

impl tonic::server::NamedService for Fake {
    const NAME: &'static str = ADS_SERVICE;
}

impl<B> tonic::codegen::Service<http::Request<B>> for Fake
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
        let method = FakeMethod {
            responses: self.responses.clone(),
            seen: self.seen.clone(),
        };
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(grpc.streaming(method, req).await)
        })
    }
}

/// A fake control plane on loopback sending `responses` on every stream; its receiver gets
/// every request it is sent.
async fn fake(responses: Vec<Bytes>) -> (SocketAddr, mpsc::UnboundedReceiver<Bytes>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(Fake { responses, seen })
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, rx)
}

/// The proxy forwarding to `upstream` with a response cap of `max`; returns Envoy's side.
async fn proxy(
    dir: &Path,
    upstream: SocketAddr,
    max: usize,
    dns: Option<DnsState>,
) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
    proxy_reporting(dir, upstream, max, dns, None).await
}

/// `proxy` with a health checker's verdicts to report.
async fn proxy_reporting(
    dir: &Path,
    upstream: SocketAddr,
    max: usize,
    dns: Option<DnsState>,
    health: Option<crate::health::HealthWatch>,
) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
    let path = dir.join("XDS");
    let listener = bind(&path, None).unwrap();
    let client = XdsClientConfig {
        tls: false,
        root_ca: RootCa::System,
        server_name: "istiod.istio-system.svc".into(),
        token_path: dir.join("no-token"),
        headers: Vec::new(),
        max_response_bytes: max,
        connect_timeout: crate::config::xds_client::DEFAULT_CONNECT_TIMEOUT,
    };
    tokio::spawn(serve(
        listener,
        crate::uds::allowed_uids(1337),
        Upstream::Remote {
            address: upstream.to_string(),
            client,
        },
        Arc::new(crate::metrics::Metrics::new()),
        dns,
        health,
        None,
        std::future::pending(),
    ));
    AggregatedDiscoveryServiceClient::new(crate::sds::connect(path).await.unwrap())
}

fn sotw(type_url: &str, version: &str, nonce: &str, resources: Vec<Any>) -> Bytes {
    Bytes::from(
        DiscoveryResponse {
            version_info: version.into(),
            resources,
            type_url: type_url.into(),
            nonce: nonce.into(),
            ..Default::default()
        }
        .encode_to_vec(),
    )
}

/// Opens a state-of-the-world stream asking for `type_url`; returns its responses.
async fn stream(
    client: &mut AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
    type_url: &str,
) -> Streaming<DiscoveryResponse> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(envoy_types::pb::envoy::config::core::v3::Node {
            id: "sidecar~10.0.0.1~a.demo~demo.svc.cluster.local".into(),
            ..Default::default()
        }),
        type_url: type_url.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    // Envoy's side of the stream stays open for as long as the test runs.
    std::mem::forget(tx);
    tokio::time::timeout(
        WAIT,
        client.stream_aggregated_resources(ReceiverStream::new(rx)),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner()
}

/// A message that is not a DiscoveryResponse ends Envoy's stream with an error naming it,
/// after what came before it was delivered; it is not dropped silently.
#[tokio::test]
async fn an_undecodable_response_closes_envoys_stream() {
    let dir = tempfile::tempdir().unwrap();
    let good = sotw(CLUSTER, "v1", "n1", vec![]);
    let (addr, _seen) = fake(vec![good, Bytes::from_static(b"\xff\xff\xff\xff")]).await;
    let mut client = proxy(dir.path(), addr, 1 << 20, None).await;
    let mut responses = stream(&mut client, CLUSTER).await;
    let first = tokio::time::timeout(WAIT, responses.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.nonce, "n1");
    let err = tokio::time::timeout(WAIT, responses.message())
        .await
        .expect("the stream was left open")
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
    assert!(
        err.message().contains("undecodable DiscoveryResponse"),
        "{err:?}"
    );
}

/// A response over XDS_MAX_RESPONSE_BYTES is refused and ends Envoy's stream with an error.
#[tokio::test]
async fn a_response_over_the_configured_cap_closes_envoys_stream() {
    let dir = tempfile::tempdir().unwrap();
    let big = Any {
        type_url: CLUSTER.into(),
        value: vec![0; 64 * 1024],
    };
    let (addr, _seen) = fake(vec![sotw(CLUSTER, "v1", "n1", vec![big])]).await;
    let mut client = proxy(dir.path(), addr, 16 * 1024, None).await;
    let mut responses = stream(&mut client, CLUSTER).await;
    let outcome = tokio::time::timeout(WAIT, responses.message())
        .await
        .expect("the stream was left open");
    let err = match outcome {
        Ok(r) => panic!(
            "a response over the cap reached Envoy (nonce {:?})",
            r.map(|r| r.nonce)
        ),
        Err(e) => e,
    };
    assert!(err.message().contains("too large"), "{err:?}");
}

/// The agent NACKs a name table it cannot decode (naming the version it keeps), and keeps
/// serving the last good one; a good table is ACKed.
#[tokio::test]
async fn an_undecodable_name_table_is_nacked() {
    use istio_proto::nds::{NameTable, TYPE_URL};
    let dir = tempfile::tempdir().unwrap();
    let mut table = NameTable::default();
    table.table.insert(
        "web.demo.svc.cluster.local".into(),
        istio_proto::nds::name_table::NameInfo {
            ips: vec!["10.96.0.1".into()],
            ..Default::default()
        },
    );
    let good = Any {
        type_url: TYPE_URL.into(),
        value: table.encode_to_vec(),
    };
    let broken = Any {
        type_url: TYPE_URL.into(),
        value: b"\xff\xff\xff".to_vec(),
    };
    let (addr, mut seen) = fake(vec![
        sotw(TYPE_URL, "v1", "n1", vec![good]),
        sotw(TYPE_URL, "v2", "n2", vec![broken]),
    ])
    .await;
    let (table_tx, table_rx) = tokio::sync::watch::channel(None);
    let dns = DnsState {
        table: table_tx,
        pod_namespace: "demo".into(),
        search: None,
    };
    let mut client = proxy(dir.path(), addr, 1 << 20, Some(dns)).await;
    let _responses = stream(&mut client, LISTENER_TYPE).await;
    let mut answers = std::collections::BTreeMap::new();
    while answers.len() < 2 {
        let request = tokio::time::timeout(WAIT, seen.recv())
            .await
            .expect("the agent answered both name tables")
            .unwrap();
        let Ok(r) = DiscoveryRequest::decode(request) else {
            continue;
        };
        if r.type_url == TYPE_URL && !r.response_nonce.is_empty() {
            answers.insert(r.response_nonce.clone(), r);
        }
    }
    let ack = &answers["n1"];
    assert!(ack.error_detail.is_none(), "{ack:?}");
    assert_eq!(ack.version_info, "v1");
    let nack = &answers["n2"];
    let detail = nack
        .error_detail
        .as_ref()
        .expect("the broken table was ACKed");
    assert!(
        detail.message.contains("undecodable NameTable"),
        "{detail:?}"
    );
    assert_eq!(nack.version_info, "v1", "a NACK names the version kept");
    let kept = table_rx.borrow().clone().unwrap();
    assert_eq!(kept.version, "v1");
    assert!(kept.to_json().get("web.demo.svc.cluster.local.").is_some());
}

/// A control plane whose response's gRPC length prefix claims 300 MiB; it sends 1 KiB of the
/// body and then nothing, holding the stream open.
#[derive(Clone)]
struct Claims300MiB;

impl tonic::server::NamedService for Claims300MiB {
    const NAME: &'static str = ADS_SERVICE;
}

impl<B> tonic::codegen::Service<http::Request<B>> for Claims300MiB
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

    fn call(&mut self, _req: http::Request<B>) -> Self::Future {
        let mut head = vec![0u8];
        head.extend_from_slice(&(300u32 << 20).to_be_bytes());
        head.extend_from_slice(&[0; 1024]);
        let frames = futures::stream::once(async move {
            Ok::<_, Status>(hyper::body::Frame::data(Bytes::from(head)))
        })
        .chain(futures::stream::pending());
        let response = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .body(tonic::body::Body::new(http_body_util::StreamBody::new(
                frames,
            )))
            .unwrap();
        Box::pin(async move { Ok(response) })
    }
}

/// A response whose length prefix says 300 MiB is refused from the prefix alone, at the
/// default cap: Envoy's stream ends with the error while the body is still (forever) missing,
/// so nothing waited for, or buffered, the 300 MiB.
#[tokio::test]
async fn a_length_prefix_over_the_cap_is_refused_before_the_body() {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(Claims300MiB)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let cap = crate::config::xds_client::DEFAULT_MAX_RESPONSE_BYTES;
    assert!(cap < 300 << 20);
    let mut client = proxy(dir.path(), addr, cap, None).await;
    let mut responses = stream(&mut client, CLUSTER).await;
    let outcome = tokio::time::timeout(WAIT, responses.message())
        .await
        .expect("the proxy waited for a 300 MiB body");
    let err = outcome.map(|r| r.map(|r| r.nonce)).unwrap_err();
    assert!(err.message().contains("too large"), "{err:?}");
    assert!(err.message().contains("314572800"), "{err:?}");
}

/// The next request the fake control plane was sent.
async fn next_request(seen: &mut mpsc::UnboundedReceiver<Bytes>) -> DiscoveryRequest {
    let got = tokio::time::timeout(WAIT, seen.recv())
        .await
        .unwrap()
        .unwrap();
    DiscoveryRequest::decode(got).unwrap()
}

/// A VM's health reports (Istio's `HealthInformation` requests) go upstream on Envoy's stream:
/// none before Envoy's first LDS request (istiod drops a report that precedes the proxy's
/// config), the latest verdict right after it, then each change as it comes.
#[tokio::test]
async fn health_reports_follow_the_first_lds_request_and_each_change() {
    use crate::health::{HEALTH_INFO_TYPE, Health};
    const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    let (addr, mut seen) = fake(vec![]).await;
    let dir = tempfile::tempdir().unwrap();
    let (verdicts, watch) = tokio::sync::watch::channel(Some(Health::Unhealthy("app down".into())));
    let mut client = proxy_reporting(dir.path(), addr, 1 << 20, None, Some(watch)).await;
    let (tx, rx) = mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(envoy_types::pb::envoy::config::core::v3::Node {
            id: "sidecar~10.0.0.9~vm.demo~demo.svc.cluster.local".into(),
            ..Default::default()
        }),
        type_url: CLUSTER.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let _responses = tokio::time::timeout(
        WAIT,
        client.stream_aggregated_resources(ReceiverStream::new(rx)),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(next_request(&mut seen).await.type_url, CLUSTER);
    // No report yet: the verdict waits for the first LDS request.
    tx.send(DiscoveryRequest {
        type_url: LISTENER.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(next_request(&mut seen).await.type_url, LISTENER);
    let report = next_request(&mut seen).await;
    assert_eq!(report.type_url, HEALTH_INFO_TYPE);
    let detail = report.error_detail.unwrap();
    assert_eq!((detail.code, detail.message.as_str()), (13, "app down"));
    assert!(report.node.is_none() && report.response_nonce.is_empty());
    verdicts.send_replace(Some(Health::Healthy));
    let report = next_request(&mut seen).await;
    assert_eq!(report.type_url, HEALTH_INFO_TYPE);
    assert!(report.error_detail.is_none());
    // A later LDS request carries no repeat.
    tx.send(DiscoveryRequest {
        type_url: LISTENER.into(),
        version_info: "1".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(next_request(&mut seen).await.type_url, LISTENER);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), seen.recv())
            .await
            .is_err(),
        "an unchanged verdict was sent again"
    );
}
