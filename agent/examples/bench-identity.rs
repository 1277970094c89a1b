//! Workload-certificate benchmarks, run by `scripts/bench-identity.sh` (release build):
//! - first certificate ready in embedded mode: key + CSR + signature by the in-process CA +
//!   checks + SDS push over the unix socket to a subscribed client, for ECDSA P-256 and RSA 2048;
//! - CA signing throughput on one thread, against a plain rcgen signing loop of the same CSRs
//!   (parse the CSR, sign it with the same issuer: no identity, checks or chain) as the floor.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use futures::StreamExt;
use istiod_core::ca::Ca;
use mesh_common::identity::Identity;
use pilot_agent::config::{CertSource, IdentityConfig, KeyAlgorithm};
use pilot_agent::embedded::EmbeddedSigner;
use pilot_agent::identity::{issue, key_and_csr};
use pilot_agent::sds;

fn median(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[v.len() * 9 / 10])
}

async fn first_cert(ca: Arc<Ca>, alg: KeyAlgorithm, runs: usize) -> (Duration, Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let identity = Identity::new("cluster.local", "bench", "app").expect("identity");
    let cfg = IdentityConfig {
        identity: identity.clone(),
        key: alg,
        ttl: Duration::from_secs(24 * 3600),
        grace_ratio: 0.5,
        grace_jitter: 0.01,
        source: CertSource::Embedded {
            ca_dir: dir.path().to_path_buf(),
        },
        output_dir: None,
        file_allow_dirs: vec![],
    };
    let signer = EmbeddedSigner { ca, identity };
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        // A fresh agent each time: SDS socket bound, Envoy's stream waiting for `default`.
        let path = dir.path().join("socket");
        let listener = sds::bind(&path, None).expect("bind");
        let (tx, rx) = tokio::sync::watch::channel(None);
        let me = nix::unistd::geteuid().as_raw();
        let server = tokio::spawn(sds::serve(
            listener,
            vec![me],
            rx,
            vec![],
            std::future::pending(),
        ));
        let channel = sds::connect(path.clone()).await.expect("connect");
        let (req_tx, req_rx) = tokio::sync::mpsc::channel(1);
        req_tx
            .send(DiscoveryRequest {
                resource_names: vec!["default".into(), "ROOTCA".into()],
                type_url: sds::SECRET_TYPE.into(),
                ..Default::default()
            })
            .await
            .expect("send");
        let mut responses = SecretDiscoveryServiceClient::new(channel)
            .stream_secrets(tokio_stream::wrappers::ReceiverStream::new(req_rx))
            .await
            .expect("stream")
            .into_inner();
        let start = Instant::now();
        let cert = issue(&cfg, &signer).await.expect("issue");
        tx.send_replace(Some(Arc::new(cert)));
        let resp = responses.next().await.expect("response").expect("ok");
        samples.push(start.elapsed());
        assert_eq!(resp.resources.len(), 2);
        server.abort();
        drop(req_tx);
    }
    median(samples)
}

fn signing(ca: &Ca, n: usize) -> (f64, f64) {
    let identity = Identity::new("cluster.local", "bench", "app").expect("identity");
    let csrs: Vec<String> = (0..n)
        .map(|_| {
            key_and_csr(KeyAlgorithm::EcdsaP256, &identity)
                .expect("csr")
                .1
        })
        .collect();
    let start = Instant::now();
    for csr in &csrs {
        ca.sign(csr, &identity, 3600).expect("sign");
    }
    let ours = n as f64 / start.elapsed().as_secs_f64();
    // The floor: rcgen alone, same CSRs and the same issuer key.
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let issuer = rcgen::Issuer::new(params, key);
    let start = Instant::now();
    for csr in &csrs {
        let req = rcgen::CertificateSigningRequestParams::from_pem(csr).expect("parse");
        req.signed_by(&issuer).expect("sign");
    }
    let floor = n as f64 / start.elapsed().as_secs_f64();
    (ours, floor)
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Arc::new(
        Ca::load_or_create(
            dir.path(),
            "cluster.local",
            Duration::from_secs(7 * 24 * 3600),
        )
        .expect("ca"),
    );
    let (ec50, ec90) = rt.block_on(first_cert(ca.clone(), KeyAlgorithm::EcdsaP256, runs));
    let rsa_runs = (runs / 10).max(5);
    let (rsa50, rsa90) = rt.block_on(first_cert(ca.clone(), KeyAlgorithm::Rsa(2048), rsa_runs));
    println!("first certificate ready (embedded CA, SDS push over the socket):");
    println!("  ECDSA P-256: median {ec50:.2?}, p90 {ec90:.2?} ({runs} runs)");
    println!("  RSA 2048:    median {rsa50:.2?}, p90 {rsa90:.2?} ({rsa_runs} runs)");
    let n = runs * 10;
    let (ours, floor) = signing(&ca, n);
    println!("CA signing on one thread ({n} ECDSA CSRs):");
    println!(
        "  istiod-core Ca::sign: {ours:.0}/s; plain rcgen loop: {floor:.0}/s; ours/floor = {:.2}",
        ours / floor
    );
}
