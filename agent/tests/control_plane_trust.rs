//! The agent's TLS to a remote control plane refuses what it must: a server whose certificate
//! chains to another root, or carries another name than the expected istiod SAN, gets a TCP
//! connection (and a handshake) but never an ADS request, and the refusal names the root file
//! and the server name; a plaintext server at the address is never spoken to in plaintext; a root
//! file replaced on disk is used by the next dial.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod support;

use std::path::Path;
use std::time::Duration;

use pilot_agent::xds_proxy::Upstream;
use support::{Counts, FakeControlPlane, ISTIOD_SAN, Pki, client_config, request};

/// Opens one Envoy stream through the proxy to the fake and returns its first response, or the
/// status it failed with.
async fn first_response(socket: &Path, name: &str) -> Result<String, tonic::Status> {
    let mut client = support::envoy_client(socket).await;
    let (_tx, mut responses) = support::open_stream(&mut client, request(name)).await?;
    let first = tokio::time::timeout(Duration::from_secs(30), responses.message())
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("no response within 30 s"))??;
    Ok(first.map(|r| r.nonce).unwrap_or_default())
}

/// Waits (generously) until the fake has accepted a connection: the refusal happened at the
/// TLS layer, not because nothing dialed.
async fn wait_connected(counts: &Counts) {
    for _ in 0..300 {
        if Counts::get(&counts.connections) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the agent never connected to the fake control plane");
}

fn write_root(dir: &Path, pem: &str) -> std::path::PathBuf {
    let path = dir.join("root-cert.pem");
    // Replaced by rename, as a mounted ConfigMap or Secret is updated.
    let tmp = dir.join(".root-cert.pem.tmp");
    std::fs::write(&tmp, pem).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_chaining_to_another_root_gets_no_ads_request() {
    let dir = tempfile::tempdir().unwrap();
    let server = Pki::new("the real mesh", &[ISTIOD_SAN]);
    let other = Pki::new("another mesh", &[ISTIOD_SAN]);
    let cp = FakeControlPlane::start(Some(&server)).await;
    let root = write_root(dir.path(), &other.root_pem);
    let socket = support::start_proxy(
        dir.path(),
        Upstream::Remote {
            address: cp.addr.to_string(),
            client: client_config(Some(&root), ISTIOD_SAN),
        },
    );

    let refused = first_response(&socket, "a").await.unwrap_err();
    wait_connected(&cp.counts).await;
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    let message = refused.message();
    assert!(
        message.contains("invalid peer certificate")
            && message.contains(&root.display().to_string())
            && message.contains(ISTIOD_SAN),
        "the refusal should say why and name the root file and the server name: {message}"
    );
    assert_eq!(Counts::get(&cp.counts.streams), 0);
    assert_eq!(Counts::get(&cp.counts.requests), 0);

    // The direct dial refuses too, with the same explanation.
    let err = pilot_agent::grpc_client::dial(
        &cp.addr.to_string(),
        &client_config(Some(&root), ISTIOD_SAN),
    )
    .await
    .map(|_| ())
    .unwrap_err();
    assert!(err.message().contains("certificate"), "{}", err.message());
    assert_eq!(Counts::get(&cp.counts.streams), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_another_name_gets_no_ads_request() {
    let dir = tempfile::tempdir().unwrap();
    // Signed by the trusted root, but for another service.
    let server = Pki::new("the real mesh", &["not-istiod.attacker.svc"]);
    let cp = FakeControlPlane::start(Some(&server)).await;
    let root = write_root(dir.path(), &server.root_pem);
    let socket = support::start_proxy(
        dir.path(),
        Upstream::Remote {
            address: cp.addr.to_string(),
            client: client_config(Some(&root), ISTIOD_SAN),
        },
    );

    let refused = first_response(&socket, "a").await.unwrap_err();
    wait_connected(&cp.counts).await;
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    let message = refused.message();
    assert!(
        message.contains("not valid for name")
            && message.contains(ISTIOD_SAN)
            && message.contains(&root.display().to_string()),
        "the refusal should name the expected server name and the root: {message}"
    );
    assert_eq!(Counts::get(&cp.counts.streams), 0);
    assert_eq!(Counts::get(&cp.counts.requests), 0);
}

/// A plaintext gRPC server where istiod should be: every dial fails the TLS handshake, however
/// often Envoy reconnects, and the agent never falls back to plaintext (the server gets no ADS
/// call, so the proxy never gets config and stays unready).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_server_gets_no_ads_request_however_often_envoy_retries() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("the real mesh", &[ISTIOD_SAN]);
    let cp = FakeControlPlane::start(None).await;
    let root = write_root(dir.path(), &pki.root_pem);
    let socket = support::start_proxy(
        dir.path(),
        Upstream::Remote {
            address: cp.addr.to_string(),
            client: client_config(Some(&root), ISTIOD_SAN),
        },
    );
    for attempt in 0..3 {
        let refused = first_response(&socket, "a").await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
        assert!(
            refused.message().contains(ISTIOD_SAN),
            "attempt {attempt}: {}",
            refused.message()
        );
    }
    wait_connected(&cp.counts).await;
    assert_eq!(Counts::get(&cp.counts.streams), 0, "spoken to in plaintext");
    assert_eq!(Counts::get(&cp.counts.requests), 0);
    // The same server is answered by a plaintext client: the refusal above is the TLS check.
    let plain = dir.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let socket = support::start_proxy(
        &plain,
        Upstream::Remote {
            address: cp.addr.to_string(),
            client: client_config(None, ISTIOD_SAN),
        },
    );
    first_response(&socket, "a").await.unwrap();
    assert!(Counts::get(&cp.counts.streams) > 0);
}

/// The positive control for the two above, and the rotation: the same proxy, refused while the
/// root file holds another root, is answered once the right root replaces it, without a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_root_file_is_used_by_the_next_dial() {
    let dir = tempfile::tempdir().unwrap();
    let server = Pki::new("the real mesh", &[ISTIOD_SAN]);
    let old = Pki::new("the old mesh", &[ISTIOD_SAN]);
    let cp = FakeControlPlane::start(Some(&server)).await;
    let root = write_root(dir.path(), &old.root_pem);
    let socket = support::start_proxy(
        dir.path(),
        Upstream::Remote {
            address: cp.addr.to_string(),
            client: client_config(Some(&root), ISTIOD_SAN),
        },
    );

    let refused = first_response(&socket, "before").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert_eq!(Counts::get(&cp.counts.requests), 0);

    write_root(dir.path(), &server.root_pem);
    let nonce = first_response(&socket, "after").await.unwrap();
    assert_eq!(nonce, "after-0");
    assert_eq!(Counts::get(&cp.counts.streams), 1);
    assert_eq!(Counts::get(&cp.counts.requests), 1);
}
