#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! `istiod-core serve`: in process on port 0, a real ADS request over gRPC and the debug port;
//! the binary exits 0 promptly on SIGTERM.

use std::time::Duration;

use clap::Parser;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use istiod_core::config::{ServeArgs, ServeConfig};

const MESH: &str = "kind: ServiceEntry\nmetadata: {name: web, namespace: shop}\nspec: {hosts: [web.shop.svc.cluster.local], ports: [{number: 80, name: http}], endpoints: [{address: 10.1.0.1}]}\n";

/// `serve`'s flags as the command line gives them.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

/// `istiod-core serve` on the directory `dir` (holding the MESH document) with the flags
/// `extra`, stopped when the returned sender is dropped or sent to.
async fn start(
    dir: &tempfile::TempDir,
    extra: &[&str],
) -> (tokio::sync::oneshot::Sender<()>, istiod_core::serve::Bound) {
    std::fs::write(dir.path().join("mesh.yaml"), MESH).unwrap();
    let mut argv = vec![
        "serve",
        "--config-dir",
        dir.path().to_str().unwrap(),
        "--grpc-addr",
        "127.0.0.1:0",
    ];
    argv.extend(extra);
    let cfg = ServeConfig::new(Cli::parse_from(argv).serve, &|_| None).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let bound = istiod_core::serve::serve(cfg, async {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    (stop, bound)
}

#[tokio::test]
async fn serves_ads_on_the_port_it_bound_until_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let (stop, bound) = start(&dir, &["--debug-addr", "127.0.0.1:0"]).await;
    let grpc = bound.grpc;
    assert_ne!(grpc.port(), 0);
    let debug = bound.debug.unwrap();
    assert_ne!(debug.port(), 0);
    let serving = tokio::spawn(bound.wait());

    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let request = DiscoveryRequest {
        node: Some(Node {
            id: "sidecar~10.9.0.1~p.shop~shop.svc.cluster.local".into(),
            ..Default::default()
        }),
        type_url: istiod_core::resource::CLUSTER_TYPE.into(),
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(request).await.unwrap();
    let mut responses = client
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let cds = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(cds.type_url, istiod_core::resource::CLUSTER_TYPE);
    assert!(
        cds.resources.iter().any(|r| {
            String::from_utf8_lossy(&r.value).contains("outbound|80||web.shop.svc.cluster.local")
        }),
        "the mesh's service is among the clusters"
    );

    let syncz = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(debug).await.unwrap();
        s.write_all(b"GET /debug/syncz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        text
    };
    assert!(syncz.starts_with("HTTP/1.1 200"), "{syncz}");
    assert!(syncz.contains("\"proxy\": \"p.shop\""), "{syncz}");

    // The stream is closed first: a graceful shutdown waits for open streams.
    drop((tx, responses, client));
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// A proxy keeps its ADS stream open for good: after the stop, the server closes it once
/// `--shutdown-duration` has passed instead of waiting on it forever (a SIGTERM that never ends).
#[tokio::test]
async fn a_stop_with_a_stream_still_open_ends_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let (stop, bound) = start(&dir, &["--shutdown-duration", "1s"]).await;
    let grpc = bound.grpc;
    let serving = tokio::spawn(bound.wait());
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(DiscoveryRequest {
        node: Some(Node {
            id: "sidecar~10.9.0.1~p.shop~shop.svc.cluster.local".into(),
            ..Default::default()
        }),
        type_url: istiod_core::resource::CLUSTER_TYPE.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut responses = client
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // The stream stays open (tx and responses are held) while the server stops.
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), serving)
        .await
        .expect("the server waited on the open stream past its grace")
        .unwrap()
        .unwrap();
    // The stream was closed by the server, not left hanging.
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match responses.message().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await;
    assert!(
        end.is_ok(),
        "the stream is still open after the server stopped"
    );
    drop(tx);
}

#[test]
fn sigterm_exits_zero_promptly() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), MESH).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_istiod-core"))
        .args(["serve", "--config-dir"])
        .arg(dir.path())
        .args(["--grpc-addr", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Serving (and so the signal handlers installed) once it says so.
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut lines = stderr.lines();
    let serving = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("serving xDS"));
    assert!(serving, "istiod-core serve ended before serving");
    std::thread::spawn(move || lines.for_each(drop));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running 10 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{status}");
}
