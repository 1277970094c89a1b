#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! The xDS port under the attacks of issue #29, against the `istiod-core serve` binary: idle
//! connections beyond the open-file limit, connections that never finish their handshake, and a
//! stream whose client never reads. Each was unbounded before (file descriptors exhausted, the
//! config reload failing, a stream's responses held forever).

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tokio::io::AsyncReadExt;

fn service(name: &str, ip: u32) -> String {
    format!(
        "---\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{hosts: [{name}.shop.svc.cluster.local], ports: [{{number: 80, name: http}}], resolution: STATIC, endpoints: [{{address: 10.1.{}.{}}}]}}\n",
        ip / 250,
        ip % 250 + 1
    )
}

/// A log line without its colours.
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            out.push(c);
        }
    }
    out
}

/// A running `istiod-core serve` and its xDS address; killed on drop.
struct Server {
    child: Child,
    grpc: SocketAddr,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Serves `dir` with at most `nofile` open files, and `flags`.
    fn start(dir: &Path, nofile: u32, flags: &[&str]) -> Server {
        let mut child = Command::new("prlimit")
            .arg(format!("--nofile={nofile}:{nofile}"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_istiod-core"))
            .args(["serve", "--config-dir"])
            .arg(dir)
            .args(["--grpc-addr", "127.0.0.1:0"])
            .args(flags)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("prlimit (util-linux) runs istiod-core");
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut grpc = None;
        for line in lines.by_ref().map_while(Result::ok) {
            let line = plain(&line);
            log.lock().unwrap().push_str(&line);
            log.lock().unwrap().push('\n');
            if line.contains("serving xDS") {
                grpc = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("addr="))
                    .and_then(|a| a.parse().ok());
                break;
            }
        }
        let grpc = grpc.unwrap_or_else(|| panic!("not serving: {}", log.lock().unwrap()));
        let keep = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut l = keep.lock().unwrap();
                l.push_str(&plain(&line));
                l.push('\n');
            }
        });
        Server { child, grpc, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

/// Raises this test process's open-file limit so that it can hold many connections.
fn raise_nofile() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    hard
}

fn request(type_url: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(Node {
            id: "sidecar~10.9.0.1~p.shop~shop.svc.cluster.local".into(),
            ..Default::default()
        }),
        type_url: type_url.into(),
        ..Default::default()
    }
}

/// Opens an ADS stream and sends `first`; returns the request sender and the responses.
async fn ads(
    grpc: SocketAddr,
    first: DiscoveryRequest,
) -> (
    tokio::sync::mpsc::Sender<DiscoveryRequest>,
    tonic::Streaming<DiscoveryResponse>,
) {
    // Windows of 64 KiB (HTTP/2's default; tonic's client asks for more): a client that stops
    // reading stops the server's sending soon.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(first).await.unwrap();
    let responses = client
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, responses)
}

fn names_cluster(resp: &DiscoveryResponse, host: &str) -> bool {
    resp.resources
        .iter()
        .any(|r| String::from_utf8_lossy(&r.value).contains(&format!("outbound|80||{host}")))
}

/// 3000 idle connections against a server allowed 1024 open files: before, they took every
/// descriptor (accept failed, the config reload could not open its files, a proxy got nothing).
/// Now a new connection takes the place of the oldest that never sent a request, and a proxy
/// that connects afterwards gets its config and the next edit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_leave_room_for_a_proxy_and_the_config_reload() {
    assert!(raise_nofile() > 4000, "the test needs 4000 open files");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), service("web", 1)).unwrap();
    let server = Server::start(dir.path(), 1024, &["--handshake-timeout", "5m"]);
    let mut idle = Vec::new();
    for _ in 0..3000 {
        match tokio::net::TcpStream::connect(server.grpc).await {
            Ok(s) => idle.push(s),
            Err(e) => panic!("connect failed: {e}\n{}", server.log()),
        }
    }
    let (_tx, mut responses) =
        ads(server.grpc, request(istiod_core::generators::CLUSTER_TYPE)).await;
    let cds = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .unwrap_or_else(|_| panic!("no CDS within 10 s\n{}", server.log()))
        .unwrap()
        .unwrap();
    assert!(names_cluster(&cds, "web.shop.svc.cluster.local"));
    // The reload still has descriptors: a new service arrives on the same stream.
    std::fs::write(dir.path().join("api.yaml"), service("api", 2)).unwrap();
    let pushed = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(resp)) = responses.message().await {
            if names_cluster(&resp, "api.shop.svc.cluster.local") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        pushed,
        Ok(true),
        "the edit was not pushed\n{}",
        server.log()
    );
    let log = server.log();
    assert!(!log.contains("Too many open files"), "{log}");
    assert!(log.contains("connections over the limit"), "{log}");
    // The oldest idle connections were closed by the server (after its SETTINGS frame).
    let mut closed = 0;
    for s in idle.iter_mut().take(100) {
        let mut buf = Vec::new();
        if tokio::time::timeout(Duration::from_millis(50), s.read_to_end(&mut buf))
            .await
            .is_ok()
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 100, "the oldest idle connections are still open");
}

/// A connection that sends nothing, or only the start of a TLS ClientHello, is closed at
/// `--handshake-timeout`; before, it was held forever.
#[tokio::test]
async fn a_connection_without_a_request_is_closed_at_the_handshake_deadline() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), service("web", 1)).unwrap();
    let server = Server::start(dir.path(), 4096, &["--handshake-timeout", "1s"]);
    let mut silent = tokio::net::TcpStream::connect(server.grpc).await.unwrap();
    let mut preface = tokio::net::TcpStream::connect(server.grpc).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    for s in [&mut silent, &mut preface] {
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
        assert!(
            read.is_ok(),
            "a connection without a request was kept open\n{}",
            server.log()
        );
    }
    // A proxy that sends its request in time is served, and kept past the deadline.
    let (_tx, mut responses) =
        ads(server.grpc, request(istiod_core::generators::CLUSTER_TYPE)).await;
    assert!(responses.message().await.unwrap().is_some());
    tokio::time::sleep(Duration::from_secs(2)).await;
    std::fs::write(dir.path().join("api.yaml"), service("api", 2)).unwrap();
    let next = tokio::time::timeout(Duration::from_secs(20), responses.message()).await;
    assert!(
        matches!(next, Ok(Ok(Some(_)))),
        "a served connection was closed: {next:?}\n{}",
        server.log()
    );
}

/// A client that opens a stream and stops reading: its responses wait in the server. Before,
/// forever (about 1 MiB a stream); now the stream and its connection are closed after
/// `--send-timeout`.
#[tokio::test]
async fn a_stream_that_never_reads_is_closed_after_the_send_timeout() {
    let dir = tempfile::tempdir().unwrap();
    // CDS of 600 services is far over the client's 64 KiB window.
    let mesh: String = (0..600).map(|i| service(&format!("svc{i}"), i)).collect();
    std::fs::write(dir.path().join("mesh.yaml"), mesh).unwrap();
    let server = Server::start(dir.path(), 4096, &["--send-timeout", "1s"]);
    let (tx, mut responses) =
        ads(server.grpc, request(istiod_core::generators::CLUSTER_TYPE)).await;
    // More requests, each answered, while nothing is read.
    for t in [
        istiod_core::generators::LISTENER_TYPE,
        istiod_core::generators::CLUSTER_TYPE,
    ] {
        tx.send(request(t)).await.unwrap();
    }
    std::fs::write(dir.path().join("api.yaml"), service("api", 700)).unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match responses.message().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await;
    assert!(
        matches!(ended, Ok(Err(_))),
        "the stream was not closed: {ended:?}\n{}",
        server.log()
    );
    assert!(
        server.log().contains("within the send timeout"),
        "{}",
        server.log()
    );
}
