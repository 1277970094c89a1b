#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Control-plane authorization over TLS (Istio's `checkConnectionIdentity`): a client
//! certificate speaks for its own namespace only. `istiod-core serve` runs in process with its
//! CA (so TLS with optional client certificates) and a workload asks for a node of another
//! namespace.

use std::time::Duration;

use clap::Parser;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use istiod_core::ca::{Ca, DEFAULT_TTL};
use istiod_core::config::{ServeArgs, ServeConfig};
use mesh_common::identity::Identity;
use rcgen::{CertificateParams, KeyPair};

const MESH: &str = "kind: ServiceEntry\nmetadata: {name: web, namespace: shop}\nspec: {hosts: [web.shop.svc.cluster.local], ports: [{number: 80, name: http}], endpoints: [{address: 10.1.0.1}]}\n";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

/// The first answer on an ADS stream that asks CDS for `node_id`, as `identity`.
async fn first_answer(
    addr: std::net::SocketAddr,
    ca: &Ca,
    identity: Option<&Identity>,
    node_id: &str,
) -> Result<(), tonic::Status> {
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .domain_name("istiod.istio-system.svc")
        .ca_certificate(tonic::transport::Certificate::from_pem(ca.root_pem()));
    if let Some(id) = identity {
        let key = KeyPair::generate().unwrap();
        let csr = CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap();
        let chain = ca.sign(&csr, id, 3600).unwrap();
        tls = tls.identity(tonic::transport::Identity::from_pem(
            chain[0].clone(),
            key.serialize_pem(),
        ));
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(DiscoveryRequest {
        node: Some(Node {
            id: node_id.into(),
            ..Default::default()
        }),
        type_url: istiod_core::resource::CLUSTER_TYPE.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut responses = AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .unwrap()?;
    assert!(first.is_some(), "stream closed without an answer");
    Ok(())
}

#[tokio::test]
async fn a_client_certificate_may_only_ask_for_its_own_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = dir.path().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    std::fs::write(mesh.join("mesh.yaml"), MESH).unwrap();
    let ca_dir = dir.path().join("cacerts");
    let ca = Ca::load_or_create(&ca_dir, "cluster.local", DEFAULT_TTL).unwrap();
    let jwt_key = dir.path().join("sa-signer.pub");
    std::fs::write(&jwt_key, KeyPair::generate().unwrap().public_key_pem()).unwrap();
    let args = Cli::parse_from([
        "serve",
        "--config-dir",
        mesh.to_str().unwrap(),
        "--grpc-addr",
        "127.0.0.1:0",
        "--ca-dir",
        ca_dir.to_str().unwrap(),
        "--jwt-public-key",
        jwt_key.to_str().unwrap(),
    ])
    .serve;
    let cfg = ServeConfig::new(args, &|_| None).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let bound = istiod_core::serve::serve(cfg, async {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let addr = bound.grpc;
    let serving = tokio::spawn(bound.wait());

    let shop_node = "sidecar~10.9.0.1~p.shop~shop.svc.cluster.local";
    let other = Identity::new("cluster.local", "other", "default").unwrap();
    let err = first_answer(addr, &ca, Some(&other), shop_node)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(
        err.message()
            .contains("spiffe://cluster.local/ns/other/sa/default")
            && err.message().contains("names namespace shop"),
        "{err}"
    );

    // Its own namespace is served; so is a caller without a certificate (plaintext or a bearer
    // token authenticate those streams, not a namespace).
    let shop = Identity::new("cluster.local", "shop", "web").unwrap();
    first_answer(addr, &ca, Some(&shop), shop_node)
        .await
        .unwrap();
    first_answer(addr, &ca, None, shop_node).await.unwrap();

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// The lines `istiod-core serve` logs until it says it is serving, with `extra` flags.
fn startup_log(extra: &[&str]) -> String {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), MESH).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_istiod-core"))
        .args(["serve", "--config-dir"])
        .arg(dir.path())
        .args(["--grpc-addr", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    for line in stderr.lines().map_while(Result::ok) {
        log.push_str(&line);
        log.push('\n');
        if line.contains("serving xDS") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    log
}

#[test]
fn plaintext_without_a_token_warns_at_start() {
    let log = startup_log(&[]);
    assert!(log.contains("serving xDS"), "{log}");
    assert!(
        log.contains("WARN") && log.contains("UNAUTHENTICATED xDS"),
        "{log}"
    );
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "s3cret\n").unwrap();
    let log = startup_log(&["--token-file", token.path().to_str().unwrap()]);
    assert!(log.contains("serving xDS"), "{log}");
    assert!(!log.contains("UNAUTHENTICATED"), "{log}");
}
