#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Locality load balancing as traffic, Istio's two tasks
//! (istio.io `tasks/traffic-management/locality-load-balancing/`) in the shared mesh: `reviews`
//! has one endpoint in each of the tasks' localities (region1/zone1, region1/zone2,
//! region2/zone3, region3/zone4, from the WorkloadEntries' `istio-locality` label, as the
//! tasks label their pods) and the client is in region1/zone1 (its pod's label).
//! - Failover: the task's DestinationRule (`failover: region1 → region2`, outlier detection
//!   after one 5xx; `maxEjectionPercent: 100` as Istio's own locality test sets it, so each
//!   failed locality stays out): every request goes to region1/zone1; when it fails, to
//!   region1/zone2; then to region2/zone3 (the failover region, before region3); then to
//!   region3/zone4. An endpoint "fails" by answering 503 to `/fail/NAME`, which only it does.
//! - Distribution: the task's 70/20/10 over region1/zone1, region1/zone2 and region3/zone4:
//!   region2/zone3 gets nothing, the rest their share.

use std::collections::BTreeMap;
use std::time::Duration;

use harness::wait_until;

mod mesh;
use mesh::*;

const LOCALITIES: &[Backend] = &[
    (
        "r1z1",
        "app: reviews, version: v1, istio-locality: region1.zone1",
        &[],
    ),
    (
        "r1z2",
        "app: reviews, version: v1, istio-locality: region1.zone2",
        &[],
    ),
    (
        "r2z3",
        "app: reviews, version: v1, istio-locality: region2.zone3",
        &[],
    ),
    (
        "r3z4",
        "app: reviews, version: v1, istio-locality: region3.zone4",
        &[],
    ),
];

fn rule(policy: &str) -> String {
    format!(
        "kind: DestinationRule\nmetadata: {{name: reviews, namespace: {NS}}}\nspec:\n  host: reviews.{NS}.svc.cluster.local\n  trafficPolicy:\n{policy}"
    )
}

/// The mesh with the client in region1/zone1: its pod's labels (the downward-API file the
/// agent reads) carry `istio-locality`, as the tasks label the curl pod.
fn locality_mesh(test: &str, routing: &str) -> Option<Mesh> {
    mesh_with(test, LOCALITIES, routing, |net| {
        let pod_info = net.pods[CLIENT_POD].dir.join("etc/istio/pod");
        std::fs::create_dir_all(&pod_info).unwrap();
        std::fs::write(
            pod_info.join("labels"),
            "app=\"curl\"\nistio-locality=\"region1.zone1\"\n",
        )
        .unwrap();
    })
}

fn instances(m: &Mesh, n: usize) -> BTreeMap<String, usize> {
    count_by_instance(&m.get("/", n, &[]))
}

/// Waits until `n` requests in a row all go to `name` (and answer 200).
fn all_go_to(m: &Mesh, name: &str, what: &str) {
    let want = format!("200 {name}");
    let mut last = BTreeMap::new();
    assert!(
        wait_until(Duration::from_secs(15), || {
            last = instances(m, 10);
            last.len() == 1 && last.contains_key(&want)
        }),
        "{what}: not every request went to {name}: {last:?}\n{}",
        m.net.logs()
    );
}

/// Makes `name` fail outlier detection: a request it answers 503 (the others 200).
fn fail(m: &Mesh, name: &str) {
    let replies = m.get(&format!("/fail/{name}"), 1, &[]);
    assert_eq!(
        replies[0].code, 503,
        "/fail/{name} should have reached {name}: {replies:?}"
    );
}

#[test]
fn locality_failover_task() {
    let Some(m) = locality_mesh(
        "locality_failover_task",
        &rule(
            "    connectionPool: {http: {maxRequestsPerConnection: 1}}\n    loadBalancer:\n      simple: ROUND_ROBIN\n      localityLbSetting:\n        enabled: true\n        failover:\n        - {from: region1, to: region2}\n    outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 1m, maxEjectionPercent: 100}\n",
        ),
    ) else {
        return;
    };
    all_go_to(&m, "r1z1", "the client's own locality");
    for (failed, next, why) in [
        ("r1z1", "r1z2", "region1/zone1 failed: the same region"),
        ("r1z2", "r2z3", "region1 failed: the failover region"),
        ("r2z3", "r3z4", "region2 failed: the last region"),
    ] {
        fail(&m, failed);
        all_go_to(&m, next, why);
    }
}

#[test]
fn locality_weighted_distribution_task() {
    let Some(m) = locality_mesh(
        "locality_weighted_distribution_task",
        &rule(
            "    loadBalancer:\n      localityLbSetting:\n        enabled: true\n        distribute:\n        - from: region1/zone1/*\n          to:\n            \"region1/zone1/*\": 70\n            \"region1/zone2/*\": 20\n            \"region3/zone4/*\": 10\n    outlierDetection: {consecutive5xxErrors: 100, interval: 1s, baseEjectionTime: 1m}\n",
        ),
    ) else {
        return;
    };
    // The weights are in force once region2 gets nothing over a run.
    let mut counts = BTreeMap::new();
    assert!(
        wait_until(Duration::from_secs(15), || {
            counts = instances(&m, 20);
            !counts.contains_key("200 r2z3")
        }),
        "region2/zone3 still answers: {counts:?}"
    );
    let counts = instances(&m, 300);
    let n = |k: &str| counts.get(&format!("200 {k}")).copied().unwrap_or(0);
    assert_eq!(n("r1z1") + n("r1z2") + n("r3z4"), 300, "{counts:?}");
    assert_eq!(n("r2z3"), 0, "{counts:?}");
    // Binomial(300, p): 70% mean 210 sd 7.9, 20% mean 60 sd 6.9, 10% mean 30 sd 5.2; each
    // bound over 4.5 sd away.
    assert!((175..=245).contains(&n("r1z1")), "70%: {counts:?}");
    assert!((29..=91).contains(&n("r1z2")), "20%: {counts:?}");
    assert!((7..=54).contains(&n("r3z4")), "10%: {counts:?}");
    eprintln!("STEP 300 requests from region1/zone1 with 70/20/0/10: {counts:?}");
}
