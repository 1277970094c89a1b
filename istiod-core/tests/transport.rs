#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! The xDS port under the attacks of issue #29, against the `istiod-core serve` binary: idle
//! connections beyond the open-file limit, connections that never finish their handshake, and a
//! stream whose client never reads. Each was unbounded before (file descriptors exhausted, the
//! config reload failing, a stream's responses held forever).

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
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

/// One server at a time: the attacks take both cores, and the tests that time a deadline
/// (handshake, send timeout) would feel them.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _one = ONE_AT_A_TIME.lock().await;
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
    let (_tx, mut responses) = ads(server.grpc, request(istiod_core::resource::CLUSTER_TYPE)).await;
    let cds = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .unwrap_or_else(|_| panic!("no CDS within 10 s\n{}", server.log()))
        .unwrap()
        .unwrap();
    assert!(names_cluster(&cds, "web.shop.svc.cluster.local"));
    // The reload still has descriptors: a new service arrives on the same stream.
    edit_is_pushed(dir.path(), &mut responses, &server).await;
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
    let _one = ONE_AT_A_TIME.lock().await;
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
    let (_tx, mut responses) = ads(server.grpc, request(istiod_core::resource::CLUSTER_TYPE)).await;
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
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // CDS of 600 services is far over the client's 64 KiB window.
    let mesh: String = (0..600).map(|i| service(&format!("svc{i}"), i)).collect();
    std::fs::write(dir.path().join("mesh.yaml"), mesh).unwrap();
    let server = Server::start(dir.path(), 4096, &["--send-timeout", "1s"]);
    let (tx, mut responses) = ads(server.grpc, request(istiod_core::resource::CLUSTER_TYPE)).await;
    // More requests, each answered, while nothing is read.
    for t in [
        istiod_core::resource::LISTENER_TYPE,
        istiod_core::resource::CLUSTER_TYPE,
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

/// The server's resident memory, from /proc (the child is istiod-core itself: prlimit execs it).
fn rss_kib(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    assert!(
        status.contains("istiod-core"),
        "not the server's process: {status:.200}"
    );
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// RSS growth allowed across an attack: generous (allocator caches, the demo config), far
/// under what an unbounded queue of streams or frames reaches.
const RSS_GROWTH_KIB: u64 = 200 * 1024;

/// A proxy that connects now gets its CDS within 10 s. Streams an attack reset give their slots
/// back as their tasks see the reset, just after: a refusal for the stream limit (only that) is
/// tried again within those 10 s.
async fn still_serves(server: &Server, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let cds = loop {
        let (_tx, mut responses) = tokio::time::timeout_at(
            deadline,
            ads(server.grpc, request(istiod_core::resource::CLUSTER_TYPE)),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: no ADS stream within 10 s\n{}", server.log()));
        match tokio::time::timeout_at(deadline, responses.message()).await {
            Err(_) => panic!("{what}: no CDS within 10 s\n{}", server.log()),
            Ok(Err(e)) if e.code() == tonic::Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(got) => {
                break got
                    .unwrap_or_else(|e| panic!("{what}: {e}\n{}", server.log()))
                    .unwrap();
            }
        }
    };
    assert!(names_cluster(&cds, "web.shop.svc.cluster.local"), "{what}");
}

/// Adds the `api` service to `dir` and asserts that `responses` gets it within 20 s.
async fn edit_is_pushed(
    dir: &Path,
    responses: &mut tonic::Streaming<DiscoveryResponse>,
    server: &Server,
) {
    std::fs::write(dir.join("api.yaml"), service("api", 2)).unwrap();
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
}

/// One gRPC frame of a CDS request, as a proxy's first message.
fn grpc_frame(req: &DiscoveryRequest) -> bytes::Bytes {
    let body = prost::Message::encode_to_vec(req);
    let mut frame = vec![0];
    frame.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(&body);
    frame.into()
}

/// HTTP/2 rapid reset (CVE-2023-44487): streams opened, each with a real ADS request, and
/// cancelled at once, 20000 of them over as many connections as the server allows. The server
/// may send GOAWAY (hyper's limit on pending resets) but must neither fall over nor hold the
/// streams: a proxy still gets its config, its memory stays bounded, and the xDS stream slots
/// (`--max-streams`) are all given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_leaves_the_server_serving_with_bounded_memory() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), service("web", 1)).unwrap();
    // Few stream slots: reset streams that kept theirs would soon leave none for a proxy.
    let mut server = Server::start(dir.path(), 4096, &["--max-streams", "200"]);
    // A proxy connected through the attack, which must still get pushes after it.
    let (_tx, mut watching) = ads(server.grpc, request(istiod_core::resource::CLUSTER_TYPE)).await;
    assert!(watching.message().await.unwrap().is_some());
    let before = rss_kib(&server);
    let uri = format!("http://{}{}", server.grpc, mesh_common::grpc::ADS_SOTW_PATH);
    let first = grpc_frame(&request(istiod_core::resource::CLUSTER_TYPE));
    let started = std::time::Instant::now();
    let (mut reset, mut connections, mut goaway) = (0u32, 0u32, 0u32);
    let mut ends = std::collections::BTreeMap::<String, u32>::new();
    'attack: while reset < 20_000 && started.elapsed() < Duration::from_secs(60) {
        let tcp = tokio::net::TcpStream::connect(server.grpc).await.unwrap();
        let Ok((mut client, conn)) = h2::client::handshake(tcp).await else {
            continue;
        };
        connections += 1;
        tokio::spawn(conn);
        loop {
            if reset >= 20_000 {
                break 'attack;
            }
            client = match client.ready().await {
                Ok(c) => c,
                Err(e) => {
                    if e.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM) {
                        goaway += 1;
                    }
                    *ends.entry(e.to_string()).or_insert(0) += 1;
                    continue 'attack;
                }
            };
            let req = http::Request::post(uri.as_str())
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .unwrap();
            let (_response, mut stream) = match client.send_request(req, false) {
                Ok(sent) => sent,
                Err(e) => {
                    if e.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM) {
                        goaway += 1;
                    }
                    *ends.entry(format!("send: {e}")).or_insert(0) += 1;
                    continue 'attack;
                }
            };
            let _ = stream.send_data(first.clone(), false);
            stream.send_reset(h2::Reason::CANCEL);
            reset += 1;
        }
    }
    assert!(
        reset >= 20_000,
        "only {reset} streams reset in 60 s over {connections} connections"
    );
    // Whether the server ends such connections with GOAWAY ENHANCE_YOUR_CALM (hyper's limit on
    // streams reset before they were served) depends on how far ahead of it the resets run, so
    // it is reported, not asserted; what is asserted is what the attack must not win: the
    // server serving, its stream slots back, its memory bounded.
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server exited\n{}",
        server.log()
    );
    still_serves(&server, "after 20000 reset streams").await;
    // The 20000 reset streams gave their slots back: a hundred proxies at once, half the
    // --max-streams, are all served. A reset stream's slot is freed when its handler has seen
    // the reset, which may trail the attack's end, so the hundred get 10 s to be served.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut held = Vec::new();
        for _ in 0..100 {
            held.push(ads(server.grpc, request(istiod_core::resource::CLUSTER_TYPE)).await);
        }
        let mut refused = None;
        for (_, responses) in &mut held {
            let got = tokio::time::timeout(Duration::from_secs(10), responses.message()).await;
            if !matches!(got, Ok(Ok(Some(_)))) {
                refused = Some(format!("{got:?}"));
                break;
            }
        }
        drop(held);
        match refused {
            None => break,
            Some(got) if std::time::Instant::now() >= deadline => panic!(
                "a proxy was still refused 10 s after the attack: {got}\n{}",
                server.log()
            ),
            Some(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    // The proxy connected throughout still gets the next edit.
    edit_is_pushed(dir.path(), &mut watching, &server).await;
    let after = rss_kib(&server);
    eprintln!(
        "rapid reset: {reset} streams over {connections} connections ({goaway} ended by the \
         server) in {:?}; RSS {before} KiB -> {after} KiB; connections ended by {ends:?}",
        started.elapsed()
    );
    assert!(
        after < before + RSS_GROWTH_KIB,
        "RSS grew from {before} KiB to {after} KiB"
    );
}

/// An HTTP/2 frame header and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// PING and SETTINGS floods (CVE-2019-9512/9515): eight connections each write PING and
/// SETTINGS frames as fast as the server takes them and never read the PING ACKs and SETTINGS
/// ACKs it owes. The server must push back (stop reading) rather than queue the answers, keep
/// serving a proxy during the flood, and keep its memory bounded: tighter than after rapid
/// reset (measured: about 2 MiB of growth for some 50 MiB of frames in a debug build), as
/// queued answers would grow with what the flood writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_settings_floods_leave_the_server_serving_with_bounded_memory() {
    let _one = ONE_AT_A_TIME.lock().await;
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), service("web", 1)).unwrap();
    let server = Server::start(dir.path(), 4096, &[]);
    still_serves(&server, "before the flood").await;
    let before = rss_kib(&server);
    // 64 KiB of frames: PING, SETTINGS (INITIAL_WINDOW_SIZE and MAX_FRAME_SIZE changes), PING...
    let mut batch = Vec::new();
    let mut n = 0u64;
    while batch.len() < 64 * 1024 {
        batch.extend(h2_frame(6, 0, 0, &n.to_be_bytes()));
        let window = 65_535 + (n % 2) as u32;
        let mut settings = vec![0, 4];
        settings.extend_from_slice(&window.to_be_bytes());
        settings.extend_from_slice(&[0, 5]);
        settings.extend_from_slice(&(16_384 + (n % 3) as u32).to_be_bytes());
        batch.extend(h2_frame(4, 0, 0, &settings));
        n += 1;
    }
    let batch = std::sync::Arc::new(batch);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut floods = Vec::new();
    for _ in 0..8 {
        let (batch, stop, addr) = (batch.clone(), stop.clone(), server.grpc);
        floods.push(tokio::spawn(async move {
            let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                .await
                .unwrap();
            tcp.write_all(&h2_frame(4, 0, 0, &[])).await.unwrap();
            let mut written = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // A write that cannot finish is the server pushing back; the flood goes on
                // trying until it is told to stop, or until the server closes the connection.
                match tokio::time::timeout(Duration::from_millis(500), tcp.write_all(&batch)).await
                {
                    Ok(Ok(())) => written += batch.len() as u64,
                    Ok(Err(_)) => break,
                    Err(_) => {}
                }
            }
            written
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    still_serves(&server, "during the flood").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = rss_kib(&server);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut written = 0;
    for f in floods {
        written += f.await.unwrap();
    }
    still_serves(&server, "after the flood").await;
    let after = rss_kib(&server);
    eprintln!(
        "flood: {} MiB of PING/SETTINGS written over 8 connections; RSS {before} KiB -> \
         {during} KiB (flooding) -> {after} KiB",
        written / (1024 * 1024)
    );
    assert!(written > 0, "the flood wrote nothing");
    for rss in [during, after] {
        assert!(
            rss < before + 64 * 1024,
            "RSS grew from {before} KiB to {rss} KiB"
        );
    }
}

/// The TLS port (`--tls-cert`), where the attacks of the plaintext tests meet the TLS layer
/// first: a connection that starts a handshake and stalls is closed at `--handshake-timeout`,
/// and rapid reset over TLS leaves the server serving a TLS proxy, its memory bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_port_closes_stalled_handshakes_and_survives_rapid_reset() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), service("web", 1)).unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert_pem, key_pem) = (certified.cert.pem(), certified.signing_key.serialize_pem());
    let tls_dir = tempfile::tempdir().unwrap();
    let (cert, key) = (
        tls_dir.path().join("cert.pem"),
        tls_dir.path().join("key.pem"),
    );
    std::fs::write(&cert, &cert_pem).unwrap();
    std::fs::write(&key, &key_pem).unwrap();
    let server = Server::start(
        dir.path(),
        4096,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--max-streams",
            "200",
            "--handshake-timeout",
            "2s",
        ],
    );
    // A handshake begun and never finished: half a ClientHello record.
    let mut stalled = tokio::net::TcpStream::connect(server.grpc).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stalled, &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), stalled.read_to_end(&mut buf)).await;
    assert!(
        closed.is_ok(),
        "a stalled TLS handshake was kept open\n{}",
        server.log()
    );

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(
            certified.cert.der().to_vec(),
        ))
        .unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let before = rss_kib(&server);
    let uri = format!("https://localhost{}", mesh_common::grpc::ADS_SOTW_PATH);
    let first = grpc_frame(&request(istiod_core::resource::CLUSTER_TYPE));
    let started = std::time::Instant::now();
    let (mut reset, mut connections) = (0u32, 0u32);
    'attack: while reset < 5_000 && started.elapsed() < Duration::from_secs(60) {
        let tcp = tokio::net::TcpStream::connect(server.grpc).await.unwrap();
        let Ok(tls) = connector.connect(name.clone(), tcp).await else {
            continue;
        };
        let Ok((mut client, conn)) = h2::client::handshake(tls).await else {
            continue;
        };
        connections += 1;
        tokio::spawn(conn);
        while reset < 5_000 {
            client = match client.ready().await {
                Ok(c) => c,
                Err(_) => continue 'attack,
            };
            let req = http::Request::post(uri.as_str())
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .unwrap();
            let Ok((_response, mut stream)) = client.send_request(req, false) else {
                continue 'attack;
            };
            let _ = stream.send_data(first.clone(), false);
            stream.send_reset(h2::Reason::CANCEL);
            reset += 1;
        }
    }
    assert!(
        reset >= 5_000,
        "only {reset} streams reset over {connections} TLS connections"
    );
    // A proxy over TLS is served after the attack.
    let channel = tonic::transport::Endpoint::from_shared(format!(
        "https://localhost:{}",
        server.grpc.port()
    ))
    .unwrap()
    .tls_config(
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&cert_pem))
            .domain_name("localhost"),
    )
    .unwrap()
    .connect()
    .await
    .unwrap_or_else(|e| panic!("no TLS connection after the attack: {e}\n{}", server.log()));
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    // The reset streams give their slots back as their tasks see the reset: a refusal for the
    // stream limit (only that) is tried again within 10 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let cds = loop {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(request(istiod_core::resource::CLUSTER_TYPE))
            .await
            .unwrap();
        let opened = client
            .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await;
        let got = match opened {
            Ok(streaming) => {
                let mut responses = streaming.into_inner();
                tokio::time::timeout_at(deadline, responses.message())
                    .await
                    .unwrap_or_else(|_| {
                        panic!("no CDS over TLS after the attack\n{}", server.log())
                    })
            }
            Err(status) => Err(status),
        };
        match got {
            Err(e)
                if e.code() == tonic::Code::ResourceExhausted
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => break other.unwrap().unwrap(),
        }
    };
    assert!(names_cluster(&cds, "web.shop.svc.cluster.local"));
    let after = rss_kib(&server);
    eprintln!(
        "TLS rapid reset: {reset} streams over {connections} connections in {:?}; RSS {before} KiB -> {after} KiB",
        started.elapsed()
    );
    assert!(
        after < before + RSS_GROWTH_KIB,
        "RSS grew from {before} KiB to {after} KiB"
    );
}
