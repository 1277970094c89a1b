#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! DestinationRule edits reach a proxy's CDS: the soak's edit (a VirtualService timeout and a
//! DestinationRule connection pool, rewritten by rename in the watched directory) pushes the
//! outbound cluster again with the new circuit-breaker thresholds on every edit, over Delta
//! (what the agents speak) and state of the world, through `reload` and through the debounced
//! directory watch.

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::StreamExt;
use istiod_core::ControlPlane;
use istiod_core::autoregister::Caller;
use istiod_core::resource::{CLUSTER_TYPE, ENDPOINT_TYPE, ROUTE_TYPE};
use istiod_core::xds_server::{Requests, WireStream, XdsServer};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

const CLUSTER: &str = "outbound|8000||httpbin.demo.svc.cluster.local";

const SERVICES: &str = r#"kind: ServiceEntry
metadata: {name: httpbin, namespace: demo}
spec:
  hosts: [httpbin.demo.svc.cluster.local]
  addresses: [10.234.0.10]
  ports: [{number: 8000, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: httpbin}}
---
kind: WorkloadEntry
metadata: {name: httpbin-1, namespace: demo}
spec: {address: 10.1.0.3, labels: {app: httpbin}, serviceAccount: httpbin}
"#;

/// The soak's edit number `n` (tests/tests/soak_e2e.rs `routing`).
fn routing(n: u32) -> String {
    format!(
        r#"kind: VirtualService
metadata: {{name: httpbin, namespace: demo}}
spec:
  hosts: [httpbin.demo.svc.cluster.local]
  http:
  - timeout: {}s
    route: [{{destination: {{host: httpbin.demo.svc.cluster.local}}}}]
---
kind: DestinationRule
metadata: {{name: httpbin, namespace: demo}}
spec:
  host: httpbin.demo.svc.cluster.local
  trafficPolicy:
    connectionPool:
      tcp: {{maxConnections: {}}}
      http: {{http1MaxPendingRequests: {}}}
"#,
        10 + n % 20,
        1000 + n,
        1000 + n
    )
}

/// Rewrites routing.yaml as the soak does: a temporary file renamed over it.
fn edit(dir: &std::path::Path, n: u32) {
    let tmp = dir.join(".routing.yaml.tmp");
    std::fs::write(&tmp, routing(n)).unwrap();
    std::fs::rename(&tmp, dir.join("routing.yaml")).unwrap();
}

fn open(n: u32) -> (tempfile::TempDir, std::sync::Arc<ControlPlane>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("services.yaml"), SERVICES).unwrap();
    edit(dir.path(), n);
    let cp = ControlPlane::open(istiod_core::Settings {
        config_dir: Some(dir.path().to_path_buf()),
        cache_check: true,
        ..Default::default()
    })
    .unwrap();
    (dir, cp)
}

fn node() -> Node {
    Node {
        id: "sidecar~10.1.0.2~sleep-1.demo~demo.svc.cluster.local".to_string(),
        ..Default::default()
    }
}

/// (max_connections, max_pending_requests) of the cluster's first threshold.
fn thresholds(c: &Cluster) -> (u32, u32) {
    let t = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
    (
        t.max_connections.as_ref().unwrap().value,
        t.max_pending_requests.as_ref().unwrap().value,
    )
}

/// A Delta client subscribed to CDS (wildcard) and the httpbin cluster's EDS, ACKing all.
struct Delta {
    tx: mpsc::Sender<Result<DeltaDiscoveryRequest, Status>>,
    rx: WireStream,
}

impl Delta {
    async fn new(server: &XdsServer) -> (Delta, Vec<DeltaDiscoveryResponse>) {
        let (tx, rx) = mpsc::channel(16);
        let rx = server.open(
            Requests::Delta(Box::pin(ReceiverStream::new(rx))),
            Caller::InProcess,
        );
        let mut c = Delta { tx, rx };
        c.send(CLUSTER_TYPE, &[], "").await;
        let cds = c.next().await.unwrap();
        c.send(ENDPOINT_TYPE, &[CLUSTER], "").await;
        let eds = c.next().await.unwrap();
        (c, vec![cds, eds])
    }

    async fn send(&self, type_url: &str, subscribe: &[&str], nonce: &str) {
        self.tx
            .send(Ok(DeltaDiscoveryRequest {
                node: Some(node()),
                type_url: type_url.to_string(),
                resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
                response_nonce: nonce.to_string(),
                ..Default::default()
            }))
            .await
            .unwrap();
    }

    /// The next response within 2 s, ACKed.
    async fn next(&mut self) -> Option<DeltaDiscoveryResponse> {
        let out = tokio::time::timeout(Duration::from_secs(2), self.rx.next())
            .await
            .ok()??
            .unwrap();
        let resp: DeltaDiscoveryResponse = out.decode().unwrap();
        self.send(&resp.type_url, &[], &resp.nonce).await;
        Some(resp)
    }

    /// The httpbin cluster of the next CDS response (skipping others), if one comes.
    async fn next_cluster(&mut self) -> Option<Cluster> {
        while let Some(resp) = self.next().await {
            if resp.type_url != CLUSTER_TYPE {
                continue;
            }
            if let Some(c) = resp
                .resources
                .iter()
                .find(|r| r.name == CLUSTER)
                .and_then(|r| r.resource.as_ref())
            {
                return Some(Cluster::decode(c.value.as_slice()).unwrap());
            }
        }
        None
    }
}

/// A state-of-the-world client subscribed to CDS, ACKing all.
struct Sotw {
    tx: mpsc::Sender<Result<DiscoveryRequest, Status>>,
    rx: WireStream,
}

impl Sotw {
    async fn new(server: &XdsServer) -> Sotw {
        let (tx, rx) = mpsc::channel(16);
        let rx = server.open(
            Requests::Sotw(Box::pin(ReceiverStream::new(rx))),
            Caller::InProcess,
        );
        let c = Sotw { tx, rx };
        c.send("").await;
        c
    }

    async fn send(&self, nonce: &str) {
        self.tx
            .send(Ok(DiscoveryRequest {
                node: Some(node()),
                type_url: CLUSTER_TYPE.to_string(),
                response_nonce: nonce.to_string(),
                ..Default::default()
            }))
            .await
            .unwrap();
    }

    async fn next_cluster(&mut self) -> Option<Cluster> {
        let out = tokio::time::timeout(Duration::from_secs(2), self.rx.next())
            .await
            .ok()??
            .unwrap();
        let resp: DiscoveryResponse = out.decode().unwrap();
        self.send(&resp.nonce).await;
        resp.resources
            .iter()
            .map(|r| Cluster::decode(r.value.as_slice()).unwrap())
            .find(|c| c.name == CLUSTER)
    }
}

#[tokio::test]
async fn each_destination_rule_edit_pushes_its_thresholds_over_delta_and_sotw() {
    let (dir, cp) = open(0);
    let server = cp.xds();
    let (mut delta, first) = Delta::new(&server).await;
    let initial = first[0]
        .resources
        .iter()
        .find(|r| r.name == CLUSTER)
        .unwrap();
    let initial = Cluster::decode(initial.resource.as_ref().unwrap().value.as_slice()).unwrap();
    assert_eq!(thresholds(&initial), (1000, 1000));
    let mut sotw = Sotw::new(&server).await;
    assert_eq!(
        thresholds(&sotw.next_cluster().await.unwrap()),
        (1000, 1000)
    );
    for n in 1..=3 {
        edit(dir.path(), n);
        cp.reload().unwrap();
        let want = (1000 + n, 1000 + n);
        let c = delta.next_cluster().await.expect("a Delta CDS push");
        assert_eq!(thresholds(&c), want, "edit {n} over Delta");
        let c = sotw.next_cluster().await.expect("a SotW CDS push");
        assert_eq!(thresholds(&c), want, "edit {n} over SotW");
    }
}

/// Through the directory watch (inotify, the debounce, the fingerprint check), edits 4 s apart
/// as in the soak, here 300 ms apart.
#[tokio::test]
async fn watched_edits_each_push_a_modified_cluster() {
    let (dir, cp) = open(0);
    tokio::spawn(cp.clone().watch(istiod_core::Debounce {
        after: Duration::from_millis(20),
        max: Duration::from_secs(1),
    }));
    let server = cp.xds();
    let (mut delta, _) = Delta::new(&server).await;
    for n in 1..=5 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        edit(dir.path(), n);
        let c = delta.next_cluster().await.expect("a Delta CDS push");
        assert_eq!(thresholds(&c), (1000 + n, 1000 + n), "edit {n}");
    }
}

/// Envoy completes the warming of an updated EDS cluster only when it receives the cluster's
/// ClusterLoadAssignment again, even an unchanged one; over Delta, a push that re-sends a
/// cluster must therefore re-send its endpoints (the endpoints here never change).
#[tokio::test]
async fn a_delta_push_that_changes_a_cluster_resends_its_unchanged_endpoints() {
    let (dir, cp) = open(0);
    let server = cp.xds();
    let (mut delta, first) = Delta::new(&server).await;
    assert!(
        first[1].resources.iter().any(|r| r.name == CLUSTER),
        "the initial EDS response carries the cluster's endpoints"
    );
    for n in 1..=3 {
        edit(dir.path(), n);
        cp.reload().unwrap();
        let mut cds_at = None;
        let mut eds_at = None;
        let mut i = 0;
        while let Some(resp) = delta.next().await {
            let has = resp.resources.iter().any(|r| r.name == CLUSTER);
            if resp.type_url == CLUSTER_TYPE && has {
                cds_at.get_or_insert(i);
            }
            if resp.type_url == ENDPOINT_TYPE && has {
                eds_at.get_or_insert(i);
            }
            i += 1;
        }
        let cds_at = cds_at.unwrap_or_else(|| panic!("edit {n}: no CDS push of {CLUSTER}"));
        let eds_at = eds_at.unwrap_or_else(|| {
            panic!("edit {n}: the cluster was re-sent but its endpoints were not: Envoy keeps it warming")
        });
        assert!(
            eds_at > cds_at,
            "edit {n}: the endpoints follow the cluster"
        );
    }
}

/// The endpoints are re-sent only for the clusters that changed: an edit that leaves the
/// cluster as it was (the VirtualService timeout only) re-sends no endpoints.
#[tokio::test]
async fn a_delta_push_that_leaves_the_cluster_alone_does_not_resend_endpoints() {
    let (dir, cp) = open(0);
    let server = cp.xds();
    let (mut delta, _) = Delta::new(&server).await;
    delta.send(ROUTE_TYPE, &["8000"], "").await;
    let rds = delta.next().await.unwrap();
    assert_eq!(rds.type_url, ROUTE_TYPE);
    // The same DestinationRule, another timeout.
    let rule = routing(0).replace("timeout: 10s", "timeout: 11s");
    assert_ne!(rule, routing(0));
    let tmp = dir.path().join(".routing.yaml.tmp");
    std::fs::write(&tmp, rule).unwrap();
    std::fs::rename(&tmp, dir.path().join("routing.yaml")).unwrap();
    cp.reload().unwrap();
    let mut types = Vec::new();
    while let Some(resp) = delta.next().await {
        types.push(resp.type_url.clone());
        assert!(
            !(resp.type_url == ENDPOINT_TYPE && resp.resources.iter().any(|r| r.name == CLUSTER)),
            "unchanged cluster, unchanged endpoints: nothing to re-send"
        );
    }
    assert!(
        types.iter().any(|t| t == ROUTE_TYPE),
        "the timeout edit was pushed (as a route): {types:?}"
    );
}
