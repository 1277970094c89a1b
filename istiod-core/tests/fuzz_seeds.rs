#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! The cheap fuzz targets' inputs replayed in the stable suite: every committed seed under
//! `fuzz/seeds/<target>` (and, when a local fuzzing run left one, up to `MAX_CORPUS` files of
//! `fuzz/corpus/<target>` and the reproducers in `fuzz/artifacts/<target>`) goes through the
//! same entry points and the same assertions as `fuzz/fuzz_targets/<target>.rs`, so a
//! regression on a known input fails `cargo test` without nightly or cargo-fuzz. Keep each
//! function in step with its target.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use futures::StreamExt;
use http_body::Frame;
use istiod_core::ControlPlane;
use istiod_core::ads_http::AdsHttp;
use istiod_core::ca::Ca;
use istiod_core::config_store::{ConfigError, ConfigSet, parse_file};
use istiod_core::generators::{cds, eds, nds};
use istiod_core::model::Proxy;
use istiod_core::push_context::PushContext;
use mesh_common::grpc::{ADS_DELTA_PATH, ADS_SOTW_PATH};
use mesh_common::identity::{Identity, uri_sans};
use prost::Message;
use tower::Service;
use x509_parser::prelude::FromDer;

/// Files taken from a local (uncommitted) corpus, so the suite stays within seconds in debug.
const MAX_CORPUS: usize = 200;

/// The inputs for `target`, each with its path (for the failure message). The seeds must be
/// there: a replay of nothing would pass quietly.
fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let files = |dir: PathBuf, cap: usize| -> Vec<(PathBuf, Vec<u8>)> {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut paths: Vec<PathBuf> = entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        paths.sort();
        paths.truncate(cap);
        paths
            .into_iter()
            .map(|p| {
                let data = std::fs::read(&p).unwrap();
                (p, data)
            })
            .collect()
    };
    let seeds = files(fuzz.join("seeds").join(target), usize::MAX);
    assert!(
        !seeds.is_empty(),
        "no seeds in fuzz/seeds/{target} (python3 fuzz/seeds.py writes them)"
    );
    let mut all = seeds;
    all.extend(files(fuzz.join("corpus").join(target), MAX_CORPUS));
    all.extend(files(fuzz.join("artifacts").join(target), MAX_CORPUS));
    all
}

/// Runs `one` on every input, naming the input that panicked.
fn replay(target: &str, one: impl Fn(&[u8])) -> usize {
    let inputs = inputs(target);
    for (path, data) in &inputs {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| one(data))).is_err() {
            panic!("{target}: {} panicked (see above)", path.display());
        }
    }
    inputs.len()
}

const PROXIES: [&str; 2] = [
    "sidecar~10.1.0.50~client-1.default~default.svc.cluster.local",
    "router~10.1.0.60~ingress-1.istio-system~istio-system.svc.cluster.local",
];

/// fuzz_targets/config_store.rs; returns whether the generators ran.
fn config_store(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let resources = match parse_file(Path::new("fuzz.yaml"), text) {
        Ok(r) => r,
        Err(ConfigError::Invalid { doc, reason, .. }) => {
            assert!(doc >= 1 && !reason.is_empty());
            return false;
        }
        Err(e) => panic!("parse_file reads no files, yet: {e}"),
    };
    if resources.is_empty() {
        return false;
    }
    let config = Arc::new(ConfigSet { resources });
    let Ok(push) = PushContext::build(config, "cluster.local", "fuzz".into()) else {
        return false;
    };
    let named = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# proxy: "))
        .map(str::trim);
    for id in PROXIES.iter().copied().chain(named) {
        let Ok(proxy) = Proxy::from_node_id(id) else {
            continue;
        };
        let clusters = cds::generate(&push, &proxy);
        let _ = istiod_core::generators::listeners(&push, &proxy);
        let eds_names: Vec<String> = clusters
            .iter()
            .filter_map(|n| Cluster::decode(n.resource.value.as_slice()).ok())
            .map(|c| c.name)
            .collect();
        let _ = eds::generate(&push, &proxy, &eds_names);
        let _ = istiod_core::generators::routes(&push, &proxy, &push.route_names());
        let _ = nds::generate(&push, &proxy);
    }
    true
}

#[test]
fn config_store_seeds_replay_without_a_panic() {
    let generated = std::sync::atomic::AtomicUsize::new(0);
    let n = replay("config_store", |data| {
        if config_store(data) {
            generated.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(n >= 10, "only {n} inputs");
    let generated = generated.into_inner();
    eprintln!("config_store: {n} inputs, {generated} generated for");
    // The seeds are the repo's configs: most must get through validation to the generators.
    assert!(
        generated * 2 > n,
        "only {generated} of {n} seeds reach the generators"
    );
}

fn check_responses<M: Message + Default>(mut data: Bytes) {
    while data.has_remaining() {
        assert!(data.len() >= 5, "a partial gRPC header: {data:?}");
        assert_eq!(data[0], 0, "uncompressed");
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        data.advance(5);
        assert!(data.len() >= len, "a message shorter than its header says");
        M::decode(data.split_to(len)).expect("our response decodes");
    }
}

/// fuzz_targets/ads_request.rs, on a control plane loaded with the demo mesh.
fn ads_request(runtime: &tokio::runtime::Runtime, control_plane: &ControlPlane, data: &[u8]) {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let delta = mode & 1 == 1;
    let piece = match usize::from(mode >> 1) {
        0 => body.len().max(1),
        n => n,
    };
    let server = control_plane.xds();
    let chunks: Vec<Result<Frame<Bytes>, Infallible>> = body
        .chunks(piece)
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    let request_body = tonic::body::Body::new(http_body_util::StreamBody::new(
        futures::stream::iter(chunks),
    ));
    let request = http::Request::builder()
        .uri(if delta { ADS_DELTA_PATH } else { ADS_SOTW_PATH })
        .body(request_body)
        .unwrap();
    runtime.block_on(async {
        let mut service = AdsHttp {
            server,
            token_auth: None,
        };
        let response = service.call(request).await.expect("infallible");
        let mut frames = http_body_util::BodyStream::new(response.into_body());
        let mut data = BytesMut::new();
        let mut status = None;
        // A bound the fuzz target has not: a stream that never ends fails here, not hangs.
        let read = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(frame) = frames.next().await {
                let frame = frame.expect("infallible");
                if frame.is_data() {
                    assert!(status.is_none(), "data after the trailers");
                    data.extend_from_slice(&frame.into_data().unwrap());
                } else if let Ok(trailers) = frame.into_trailers() {
                    status = Some(trailers.get("grpc-status").cloned().expect("grpc-status"));
                }
            }
        })
        .await;
        assert!(read.is_ok(), "the stream did not end within 20 s");
        assert!(status.is_some(), "the stream ends with its status");
        if delta {
            check_responses::<DeltaDiscoveryResponse>(data.freeze());
        } else {
            check_responses::<DiscoveryResponse>(data.freeze());
        }
    });
}

#[test]
fn ads_request_seeds_replay_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = include_str!("../../examples/demo-mesh/mesh.yaml");
    std::fs::write(dir.path().join("mesh.yaml"), mesh).unwrap();
    let control_plane = ControlPlane::load(dir.path(), "cluster.local").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let n = replay("ads_request", |data| {
        ads_request(&runtime, &control_plane, data)
    });
    assert!(n >= 5, "only {n} inputs");
}

/// The CSR as PEM, as fuzz_targets/ca_csr.rs wraps a DER input.
fn pem_of(der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE REQUEST-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE REQUEST-----\n");
    out
}

/// fuzz_targets/ca_csr.rs; returns whether a chain was signed.
fn ca_csr(ca: &Ca, data: &[u8]) -> bool {
    let Some((&mode, rest)) = data.split_first() else {
        return false;
    };
    let Some((ttl, rest)) = rest.split_first_chunk::<4>() else {
        return false;
    };
    let ttl = i64::from(i32::from_be_bytes(*ttl));
    let (uri, csr) = match rest.iter().position(|b| *b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let identity = std::str::from_utf8(uri)
        .ok()
        .and_then(|u| Identity::parse(u).ok())
        .unwrap_or_else(|| Identity::new("cluster.local", "default", "default").unwrap());
    let csr_pem = if mode & 1 == 1 {
        pem_of(csr)
    } else {
        match std::str::from_utf8(csr) {
            Ok(text) => text.to_string(),
            Err(_) => return false,
        }
    };
    let Ok(chain) = ca.sign(&csr_pem, &identity, ttl) else {
        return false;
    };
    assert!(chain.len() >= 2, "leaf and root");
    let (_, leaf_pem) = x509_parser::pem::parse_x509_pem(chain[0].as_bytes()).unwrap();
    let leaf = leaf_pem.parse_x509().unwrap();
    assert_eq!(uri_sans(&leaf), vec![identity.to_string()]);
    assert!(!leaf.is_ca(), "a workload certificate is never a CA");
    let csr_block = pem::parse(&csr_pem).expect("a CSR the CA accepted is PEM");
    let (_, request) = x509_parser::certification_request::X509CertificationRequest::from_der(
        csr_block.contents(),
    )
    .expect("a CSR the CA accepted parses");
    assert_eq!(
        leaf.public_key().raw,
        request.certification_request_info.subject_pki.raw,
        "the leaf carries the CSR's key"
    );
    true
}

#[test]
fn ca_csr_seeds_replay_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let ca =
        Ca::load_or_create(dir.path(), "cluster.local", Duration::from_secs(48 * 3600)).unwrap();
    let signed = std::sync::atomic::AtomicUsize::new(0);
    let n = replay("ca_csr", |data| {
        if ca_csr(&ca, data) {
            signed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(n >= 5, "only {n} inputs");
    // The seeds include good CSRs: the replay reaches the signing path, not only the errors.
    assert!(
        signed.into_inner() > 0,
        "no seed was signed: the seeds no longer reach Ca::sign's success path"
    );
}
