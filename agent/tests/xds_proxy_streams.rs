//! Stream isolation in the xDS proxy (the idea of Istio's `TestXdsProxyReconnects`): a client
//! acting as Envoy on the unix socket, a fake control plane upstream. Envoy reconnecting a
//! thousand times leaks no file descriptor, memory or upstream stream; concurrent streams each get
//! only their own responses; an upstream failing mid-push ends that stream alone.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod support;

use std::path::Path;
use std::time::Duration;

use pilot_agent::xds_proxy::Upstream;
use support::{CLOSE_PREFIX, Counts, FakeControlPlane, PUSHES, client_config, request};
use tonic::Streaming;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;

/// The proxy in `dir`, forwarding in plaintext to `cp`.
fn proxy_to(dir: &Path, cp: &FakeControlPlane) -> std::path::PathBuf {
    support::start_proxy(
        dir,
        Upstream::Remote {
            address: cp.addr.to_string(),
            client: client_config(None, "unused"),
        },
    )
}

async fn next(responses: &mut Streaming<DiscoveryResponse>) -> DiscoveryResponse {
    tokio::time::timeout(Duration::from_secs(30), responses.message())
        .await
        .expect("no response within 30 s")
        .unwrap()
        .expect("the stream ended")
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// One Envoy connection: connect, open a stream, get the first response to `name`, leave.
async fn reconnect_once(socket: &Path, name: &str) {
    let mut client = support::envoy_client(socket).await;
    let (_tx, mut responses) = support::open_stream(&mut client, request(name))
        .await
        .unwrap();
    let first = next(&mut responses).await;
    assert_eq!(first.nonce, format!("{name}-0"));
}

/// Polls (generously) until `done`, for work the runtime finishes after a stream is dropped.
async fn settle(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..300 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_reconnects_leak_no_fd_memory_or_upstream_stream() {
    let dir = tempfile::tempdir().unwrap();
    let cp = FakeControlPlane::start(None).await;
    let socket = proxy_to(dir.path(), &cp);

    for i in 0..100 {
        reconnect_once(&socket, &format!("warm{i}")).await;
    }
    let counts = &cp.counts;
    assert!(settle(|| Counts::get(&counts.closed) == 100).await);
    let (fds, rss) = (open_fds(), rss_kib());

    for i in 0..1000 {
        reconnect_once(&socket, &format!("r{i}")).await;
    }
    // Every upstream stream the proxy opened has ended, one per Envoy stream.
    assert!(
        settle(|| Counts::get(&counts.closed) == 1100).await,
        "upstream streams still open: {} of {}",
        Counts::get(&counts.streams) - Counts::get(&counts.closed),
        Counts::get(&counts.streams)
    );
    assert_eq!(Counts::get(&counts.streams), 1100);
    // A leak of one descriptor per reconnect would show as ~1000 (a unix and a TCP socket each).
    let settled = settle(|| open_fds() <= fds + 16).await;
    assert!(
        settled,
        "fds after warm-up {fds}, after 1000 reconnects {}",
        open_fds()
    );
    // A leaked stream holds at least its buffers (tens of KiB): 1000 of them would pass this.
    let grown = rss_kib().saturating_sub(rss);
    assert!(
        grown < 24 * 1024,
        "RSS grew by {grown} KiB over 1000 reconnects (from {rss} KiB)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_get_only_their_own_responses() {
    let dir = tempfile::tempdir().unwrap();
    let cp = FakeControlPlane::start(None).await;
    let socket = proxy_to(dir.path(), &cp);
    const CONNECTIONS: usize = 8;
    const STREAMS_EACH: usize = 4;
    const REQUESTS: usize = 5;

    let mut tasks = Vec::new();
    for c in 0..CONNECTIONS {
        // Several streams share one connection, as well as several connections the proxy.
        let client = support::envoy_client(&socket).await;
        for s in 0..STREAMS_EACH {
            let mut client = client.clone();
            tasks.push(tokio::spawn(async move {
                let me = format!("c{c}s{s}");
                let (tx, mut responses) =
                    support::open_stream(&mut client, request(&format!("{me}-q0")))
                        .await
                        .unwrap();
                let mut seen = Vec::new();
                for q in 0..REQUESTS {
                    if q > 0 {
                        tx.send(request(&format!("{me}-q{q}"))).await.unwrap();
                    }
                    for _ in 0..PUSHES {
                        seen.push(next(&mut responses).await.nonce);
                    }
                }
                (me, seen)
            }));
        }
    }
    for task in tasks {
        let (me, seen) = task.await.unwrap();
        let expected: Vec<String> = (0..REQUESTS)
            .flat_map(|q| (0..PUSHES).map(move |i| (q, i)))
            .map(|(q, i)| format!("{me}-q{q}-{i}"))
            .collect();
        assert_eq!(seen, expected, "stream {me} got another stream's responses");
    }
    assert_eq!(Counts::get(&cp.counts.streams), CONNECTIONS * STREAMS_EACH);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_failing_mid_push_ends_only_that_stream() {
    let dir = tempfile::tempdir().unwrap();
    let cp = FakeControlPlane::start(None).await;
    let socket = proxy_to(dir.path(), &cp);
    let mut client = support::envoy_client(&socket).await;
    let (tx_a, mut a) = support::open_stream(&mut client, request("a"))
        .await
        .unwrap();
    let (tx_b, mut b) = support::open_stream(&mut client, request("b"))
        .await
        .unwrap();
    for i in 0..PUSHES {
        assert_eq!(next(&mut a).await.nonce, format!("a-{i}"));
        assert_eq!(next(&mut b).await.nonce, format!("b-{i}"));
    }

    // A's upstream sends one response, then fails: Envoy's stream A ends with the upstream's
    // status (Envoy reconnects), after the response that did arrive.
    tx_a.send(request(&format!("{CLOSE_PREFIX}a")))
        .await
        .unwrap();
    assert_eq!(next(&mut a).await.nonce, format!("{CLOSE_PREFIX}a-0"));
    let ended = tokio::time::timeout(Duration::from_secs(30), a.message())
        .await
        .unwrap();
    match ended {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert!(status.message().contains("going away"), "{status:?}");
        }
        Ok(other) => panic!("stream A should have ended with the upstream's error: {other:?}"),
    }

    // B, on the same connection, is untouched.
    tx_b.send(request("b2")).await.unwrap();
    for i in 0..PUSHES {
        assert_eq!(next(&mut b).await.nonce, format!("b2-{i}"));
    }
    assert!(settle(|| Counts::get(&cp.counts.closed) == 1).await);
    assert_eq!(Counts::get(&cp.counts.streams), 2);
}
