#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! `istiod-core serve` with a Kubernetes API server it cannot use: a clear error naming the
//! flag and what is wrong, a non-zero exit, and never a server that serves an empty mesh.

use std::process::Command;
use std::time::{Duration, Instant};

fn serve(args: &[&str]) -> (i32, String, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_istiod-core"))
        .arg("serve")
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

#[test]
fn a_kubeconfig_it_cannot_use_is_a_named_error() {
    let dir = tempfile::tempdir().unwrap();
    // No source at all.
    let (code, err, _) = serve(&["--grpc-addr", "127.0.0.1:0"]);
    assert_ne!(code, 0);
    assert!(err.contains("--config-dir"), "{err}");

    // A file that is not there, and one that is no kubeconfig.
    let missing = dir.path().join("missing");
    let (code, err, _) = serve(&[
        "--kubeconfig",
        missing.to_str().unwrap(),
        "--grpc-addr",
        "127.0.0.1:0",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("--kubeconfig {}", missing.display())) && err.contains("kubeconfig"),
        "{err}"
    );
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, "clusters: 7\n").unwrap();
    let (code, err, _) = serve(&[
        "--kubeconfig",
        garbage.to_str().unwrap(),
        "--grpc-addr",
        "127.0.0.1:0",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("--kubeconfig {}", garbage.display())),
        "{err}"
    );

    // A server that does not answer: the first request (the CA's Secrets) fails, named, at once.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let (code, err, took) = serve(&[
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--grpc-addr",
        "127.0.0.1:0",
    ]);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("Secret") && err.contains("istio-system"),
        "{err}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}: {err}");
}
