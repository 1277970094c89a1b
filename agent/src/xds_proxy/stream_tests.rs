//! The proxy's streams against a fake remote control plane whose every upstream stream signs
//! its nonces (`g<server generation>-s<stream>-<n>`) and keeps pushing unasked: a port of
//! Istio's `TestXdsProxyReconnects` (pkg/istio-agent/xds_proxy_test.go), closer than the
//! integration tests in `agent/tests/xds_proxy_streams.rs` on two points: a stream Envoy left is
//! still pushing when Envoy's next one opens, and istiod going away and coming back on the same
//! port. Then the redial pace when the control plane is gone.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use tokio::sync::{mpsc, watch};

use super::*;
use crate::config::RootCa;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const WAIT: Duration = Duration::from_secs(10);
type Client = AggregatedDiscoveryServiceClient<tonic::transport::Channel>;

/// What one fake control plane's streams saw.
#[derive(Default)]
struct Ledger {
    opened: AtomicUsize,
    /// Streams that have ended on the fake's side.
    ended: Mutex<BTreeSet<usize>>,
    /// ACKs that named a nonce of another stream than the one they came on.
    misrouted: Mutex<Vec<String>>,
}

impl Ledger {
    fn opened(&self) -> usize {
        self.opened.load(Ordering::SeqCst)
    }

    /// Waits (generously) until upstream stream `id` has ended.
    async fn wait_ended(&self, id: usize) {
        let deadline = Instant::now() + WAIT;
        while !self.ended.lock().unwrap().contains(&id) {
            assert!(
                Instant::now() < deadline,
                "upstream stream {id} still open after Envoy's stream ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// One upstream stream: answers each subscription and pushes every 20 ms, until the proxy
/// drops it, or ends with UNAVAILABLE once `down` is true.
struct SigningMethod {
    generation: usize,
    ledger: Arc<Ledger>,
    down: watch::Receiver<bool>,
}

impl tonic::server::StreamingService<Bytes> for SigningMethod {
    type Response = Bytes;
    type ResponseStream = ByteStream;
    type Future = BoxFuture<tonic::Response<ByteStream>, Status>;

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let id = self.ledger.opened.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("g{}-s{id}-", self.generation);
        let ledger = self.ledger.clone();
        let mut down = self.down.clone();
        let mut requests = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut n = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            loop {
                let send = tokio::select! {
                    r = requests.next() => match r {
                        Some(Ok(bytes)) => {
                            let req = DiscoveryRequest::decode(bytes).unwrap_or_default();
                            let nonce = req.response_nonce;
                            if !nonce.is_empty() && !nonce.starts_with(&prefix) {
                                ledger.misrouted.lock().unwrap().push(format!("{nonce} on {prefix}"));
                            }
                            nonce.is_empty()
                        }
                        _ => break,
                    },
                    _ = tick.tick() => true,
                    _ = async { down.wait_for(|d| *d).await.map(|_| ()) } => {
                        let _ = tx.send(Err(Status::unavailable("istiod is shutting down"))).await;
                        break;
                    }
                };
                if send {
                    n += 1;
                    let msg = Bytes::from(
                        DiscoveryResponse {
                            version_info: "1".into(),
                            type_url: CLUSTER.into(),
                            nonce: format!("{prefix}{n}"),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    );
                    if tx.send(Ok(msg)).await.is_err() {
                        break;
                    }
                }
            }
            ledger.ended.lock().unwrap().insert(id);
        });
        let out: ByteStream = Box::pin(ReceiverStream::new(rx));
        Box::pin(async move { Ok(tonic::Response::new(out)) })
    }
}

#[derive(Clone)]
struct Signing {
    generation: usize,
    ledger: Arc<Ledger>,
    down: watch::Receiver<bool>,
}

impl tonic::server::NamedService for Signing {
    const NAME: &'static str = ADS_SERVICE;
}

impl<B> tonic::codegen::Service<http::Request<B>> for Signing
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
        let method = SigningMethod {
            generation: self.generation,
            ledger: self.ledger.clone(),
            down: self.down.clone(),
        };
        Box::pin(async move {
            Ok(tonic::server::Grpc::new(RawCodec)
                .streaming(method, req)
                .await)
        })
    }
}

/// A running fake istiod: its ledger, the switch that takes it down, and its server task.
struct Istiod {
    ledger: Arc<Ledger>,
    down: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
}

impl Istiod {
    /// Serves on `addr` (port 0 for any); retries the bind while a previous server's socket is
    /// being released.
    async fn start(addr: SocketAddr, generation: usize) -> (Istiod, SocketAddr) {
        let deadline = Instant::now() + WAIT;
        let listener = loop {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "port not free yet");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot bind {addr} again: {e}"),
            }
        };
        let addr = listener.local_addr().unwrap();
        let ledger = Arc::new(Ledger::default());
        let (down, down_rx) = watch::channel(false);
        let service = Signing {
            generation,
            ledger: ledger.clone(),
            down: down_rx.clone(),
        };
        let mut stopped = down_rx;
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async move {
                        let _ = stopped.wait_for(|d| *d).await;
                    },
                )
                .await;
        });
        (
            Istiod {
                ledger,
                down,
                server,
            },
            addr,
        )
    }

    /// Ends every stream with UNAVAILABLE and stops serving, as an istiod pod torn down.
    async fn stop(self) {
        self.down.send_replace(true);
        tokio::time::timeout(WAIT, self.server)
            .await
            .expect("the fake istiod did not stop")
            .unwrap();
    }
}

/// The proxy on a socket in `dir`, forwarding in plaintext to `upstream`.
fn proxy_to(dir: &Path, upstream: SocketAddr) -> PathBuf {
    let path = dir.join("XDS");
    let listener = bind(&path, None).unwrap();
    let client = XdsClientConfig {
        tls: false,
        root_ca: RootCa::System,
        server_name: "istiod.istio-system.svc".into(),
        token_path: dir.join("no-token"),
        headers: Vec::new(),
        max_response_bytes: 1 << 20,
        connect_timeout: Duration::from_secs(2),
    };
    tokio::spawn(serve(
        listener,
        crate::uds::allowed_uids(1337),
        Upstream::Remote {
            address: upstream.to_string(),
            client,
        },
        Arc::new(crate::metrics::Metrics::new()),
        None,
        None,
        None,
        std::future::pending(),
    ));
    path
}

/// A new connection to the proxy, as Envoy makes one.
async fn connect(socket: &Path) -> Client {
    AggregatedDiscoveryServiceClient::new(crate::sds::connect(socket.to_path_buf()).await.unwrap())
}

/// One Envoy stream: it subscribes to clusters and ACKs every response it reads.
struct EnvoyStream {
    tx: mpsc::Sender<DiscoveryRequest>,
    responses: Streaming<DiscoveryResponse>,
}

impl EnvoyStream {
    async fn open(client: &mut Client) -> Result<EnvoyStream, Status> {
        let (tx, rx) = mpsc::channel(8);
        tx.send(DiscoveryRequest {
            node: Some(envoy_types::pb::envoy::config::core::v3::Node {
                id: "sidecar~1.1.1.1~debug.default~default.svc.cluster.local".into(),
                ..Default::default()
            }),
            type_url: CLUSTER.into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let responses = tokio::time::timeout(
            WAIT,
            client.stream_aggregated_resources(ReceiverStream::new(rx)),
        )
        .await
        .map_err(|_| Status::deadline_exceeded("stream not opened in time"))??
        .into_inner();
        Ok(EnvoyStream { tx, responses })
    }

    /// The nonces of the next `n` responses (each ACKed).
    async fn take(&mut self, n: usize) -> Vec<String> {
        let mut nonces = Vec::new();
        while nonces.len() < n {
            let r = tokio::time::timeout(WAIT, self.responses.message())
                .await
                .expect("no response in time")
                .expect("the stream failed")
                .expect("the stream ended");
            let _ = self
                .tx
                .send(DiscoveryRequest {
                    type_url: CLUSTER.into(),
                    version_info: r.version_info.clone(),
                    response_nonce: r.nonce.clone(),
                    ..Default::default()
                })
                .await;
            nonces.push(r.nonce);
        }
        nonces
    }
}

/// The one upstream stream (`g<gen>-s<id>`) all `nonces` came from.
fn upstream_of(nonces: &[String]) -> String {
    let of = |n: &String| n.rsplit_once('-').map(|(s, _)| s.to_string()).unwrap();
    let first = of(&nonces[0]);
    for n in nonces {
        assert_eq!(
            of(n),
            first,
            "one Envoy stream got responses of two upstream streams: {nonces:?}"
        );
    }
    first
}

fn stream_id(upstream: &str) -> usize {
    upstream.rsplit_once("-s").unwrap().1.parse().unwrap()
}

/// "Envoy close and open stream": the stream Envoy leaves ends upstream too (it was pushing
/// every 20 ms), and the next stream on the same connection gets a fresh upstream stream and
/// never a response of the old one.
#[tokio::test]
async fn envoy_closes_and_reopens_a_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (istiod, addr) = Istiod::start("127.0.0.1:0".parse().unwrap(), 0).await;
    let socket = proxy_to(dir.path(), addr);
    let mut client = connect(&socket).await;

    let mut first = EnvoyStream::open(&mut client).await.unwrap();
    let old = upstream_of(&first.take(3).await);
    drop(first);
    istiod.ledger.wait_ended(stream_id(&old)).await;

    let mut second = EnvoyStream::open(&mut client).await.unwrap();
    let new = upstream_of(&second.take(10).await);
    assert_ne!(
        new, old,
        "the new Envoy stream reused the old upstream stream"
    );
    assert_eq!(istiod.ledger.opened(), 2);
    assert!(istiod.ledger.misrouted.lock().unwrap().is_empty());
}

/// "Envoy opens multiple stream", "Envoy closes connection" and "Envoy sends concurrent
/// requests": streams on one connection and on another each have their own upstream stream,
/// ACKs go to the stream that sent the response, and closing one stream, then a whole
/// connection, leaves the others flowing on the upstream streams they had.
#[tokio::test]
async fn concurrent_streams_and_connections_stay_apart() {
    let dir = tempfile::tempdir().unwrap();
    let (istiod, addr) = Istiod::start("127.0.0.1:0".parse().unwrap(), 0).await;
    let socket = proxy_to(dir.path(), addr);
    let mut conn_a = connect(&socket).await;
    let mut conn_b = connect(&socket).await;

    let mut a1 = EnvoyStream::open(&mut conn_a).await.unwrap();
    let mut a2 = EnvoyStream::open(&mut conn_a).await.unwrap();
    let mut b1 = EnvoyStream::open(&mut conn_b).await.unwrap();
    let (ua1, ua2, ub1) = (
        upstream_of(&a1.take(3).await),
        upstream_of(&a2.take(3).await),
        upstream_of(&b1.take(3).await),
    );
    let distinct: BTreeSet<_> = [&ua1, &ua2, &ub1].into_iter().collect();
    assert_eq!(distinct.len(), 3, "{ua1} {ua2} {ub1}");

    // One stream of connection A closes: the others keep their upstream streams.
    drop(a1);
    istiod.ledger.wait_ended(stream_id(&ua1)).await;
    assert_eq!(upstream_of(&a2.take(5).await), ua2);
    assert_eq!(upstream_of(&b1.take(5).await), ub1);

    // Connection A closes altogether: B goes on, and a new connection starts afresh.
    drop(a2);
    drop(conn_a);
    istiod.ledger.wait_ended(stream_id(&ua2)).await;
    assert_eq!(upstream_of(&b1.take(5).await), ub1);
    let mut conn_c = connect(&socket).await;
    let mut c1 = EnvoyStream::open(&mut conn_c).await.unwrap();
    let uc1 = upstream_of(&c1.take(5).await);
    assert!(![&ua1, &ua2, &ub1].contains(&&uc1), "{uc1} was used before");

    assert_eq!(istiod.ledger.opened(), 4);
    let misrouted = istiod.ledger.misrouted.lock().unwrap().clone();
    assert!(
        misrouted.is_empty(),
        "ACKs reached another upstream stream: {misrouted:?}"
    );
}

/// "Istiod closes connection": istiod stops (its streams end with UNAVAILABLE) and a new one
/// comes up on the same port. Envoy's stream ends with the error (so Envoy reconnects while
/// serving its last config); the stream it opens next is served by the new istiod alone.
#[tokio::test]
async fn istiod_going_away_ends_envoys_stream_and_the_next_one_reaches_the_new_istiod() {
    let dir = tempfile::tempdir().unwrap();
    let (istiod, addr) = Istiod::start("127.0.0.1:0".parse().unwrap(), 0).await;
    let socket = proxy_to(dir.path(), addr);
    let mut client = connect(&socket).await;
    let mut before = EnvoyStream::open(&mut client).await.unwrap();
    let old = upstream_of(&before.take(3).await);
    assert!(old.starts_with("g0-"));

    istiod.stop().await;
    let ended = loop {
        match tokio::time::timeout(WAIT, before.responses.message())
            .await
            .expect("Envoy's stream was left open after istiod went away")
        {
            Ok(Some(r)) => assert!(r.nonce.starts_with(&format!("{old}-")), "{}", r.nonce),
            Ok(None) => panic!("Envoy's stream ended without an error"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");

    let (istiod, again) = Istiod::start(addr, 1).await;
    assert_eq!(again, addr);
    let mut after = EnvoyStream::open(&mut client).await.unwrap();
    let nonces = after.take(10).await;
    let new = upstream_of(&nonces);
    assert!(
        new.starts_with("g1-"),
        "a response of the old istiod: {nonces:?}"
    );
    assert_eq!(istiod.ledger.opened(), 1);
}

/// The control plane refuses connections. Envoy reconnects at once every time its stream
/// fails; the proxy's dials are paced by `Backoff::CONTROL_PLANE`: over 10 s about six
/// (at 0, 0.2, 0.6, 1.4, 3.0, 6.2 s nominal), each gap the doubled delay within the jitter;
/// a busy loop would make thousands.
#[tokio::test]
async fn a_refusing_control_plane_is_redialed_with_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let refusing = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let socket = proxy_to(dir.path(), refusing);
    let mut client = connect(&socket).await;
    let start = Instant::now();
    let mut failed_at = Vec::new();
    while start.elapsed() < Duration::from_secs(10) {
        let outcome = tokio::time::timeout(Duration::from_secs(30), async {
            let mut s = EnvoyStream::open(&mut client).await?;
            s.responses.message().await.map(|_| ())
        })
        .await
        .expect("a dial to a refusing address hung");
        let status = outcome.expect_err("a refusing control plane answered");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        failed_at.push(start.elapsed());
        assert!(
            failed_at.len() <= 8,
            "dialed {} times in {:?}: {failed_at:?}",
            failed_at.len(),
            start.elapsed()
        );
    }
    assert!(
        failed_at.len() >= 5,
        "only {} dials in 10 s: {failed_at:?}",
        failed_at.len()
    );
    let b = Backoff::CONTROL_PLANE;
    for (i, pair) in failed_at.windows(2).enumerate() {
        let gap = pair[1] - pair[0];
        // The dial after `i + 1` consecutive failures waits `after(i + 1)`: first * 2^i, capped.
        let nominal = b.first.saturating_mul(1 << i).min(b.max);
        let low = nominal
            .mul_f64(1.0 - b.jitter)
            .saturating_sub(Duration::from_millis(20));
        let high = nominal.mul_f64(1.0 + b.jitter) + Duration::from_millis(500);
        assert!(
            (low..=high).contains(&gap),
            "gap {i} was {gap:?}, expected {nominal:?} ± {}%: {failed_at:?}",
            b.jitter * 100.0
        );
    }
    // The delay is capped, and spread: agents that lost istiod together do not redial in step.
    let capped: Vec<Duration> = (0..200)
        .map(|_| {
            std::thread::sleep(Duration::from_micros(37));
            b.after(40)
        })
        .collect();
    let (min, max) = (capped.iter().min().unwrap(), capped.iter().max().unwrap());
    assert!(*max <= b.max.mul_f64(1.0 + b.jitter), "{max:?}");
    assert!(*min >= b.max.mul_f64(1.0 - b.jitter), "{min:?}");
    assert!(
        *max - *min >= b.max.mul_f64(b.jitter),
        "not jittered: {min:?}..{max:?}"
    );
}
