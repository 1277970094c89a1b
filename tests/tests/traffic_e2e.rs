#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! VirtualService routing and DestinationRule traffic policy, observed as traffic: a client pod
//! calls `reviews` (two versions, each a pod with its sidecar) through real Envoys, with the
//! embedded control plane applying the YAML a user writes. Each test is one capability.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use harness::{Network, require_envoy, require_root, wait_until};

mod mesh;
use mesh::*;

const TWO_VERSIONS: &[Backend] = &[
    ("v1", "app: reviews, version: v1", &[]),
    ("v2", "app: reviews, version: v2", &[]),
];

fn subsets() -> String {
    format!(
        "kind: DestinationRule\nmetadata: {{name: reviews, namespace: {NS}}}\nspec:\n  host: reviews\n  subsets:\n  - {{name: v1, labels: {{version: v1}}}}\n  - {{name: v2, labels: {{version: v2}}}}\n"
    )
}

fn split(w1: u32, w2: u32) -> String {
    format!(
        "{}---\nkind: VirtualService\nmetadata: {{name: reviews, namespace: {NS}}}\nspec:\n  hosts: [reviews]\n  http:\n  - route:\n    - {{destination: {{host: reviews, subset: v1}}, weight: {w1}}}\n    - {{destination: {{host: reviews, subset: v2}}, weight: {w2}}}\n",
        subsets()
    )
}

#[test]
fn weighted_split_and_a_live_weight_change() {
    let Some(m) = mesh(
        "weighted_split_and_a_live_weight_change",
        TWO_VERSIONS,
        &split(80, 20),
    ) else {
        return;
    };
    let replies = m.get("/", 300, &[]);
    let counts = count_by_instance(&replies);
    let v1 = counts.get("200 v1").copied().unwrap_or(0);
    let v2 = counts.get("200 v2").copied().unwrap_or(0);
    assert_eq!(v1 + v2, 300, "{counts:?}");
    // Binomial(300, 0.2): mean 60, sd 6.9; 30..=95 is beyond 4.3 sd either way.
    assert!((30..=95).contains(&v2), "80/20 split gave {counts:?}");

    // A live edit moves traffic, and no request fails while it lands.
    let during = std::thread::scope(|s| {
        let load = s.spawn(|| m.send(&format!("http://{VIP}:{PORT}/"), 150, &[], 3));
        std::thread::sleep(Duration::from_millis(300));
        m.edit_routing(&split(0, 100));
        load.join().unwrap()
    });
    assert!(
        during.iter().all(|r| r.code == 200),
        "a request failed during the edit: {:?}",
        count_by_instance(&during)
    );
    let after = count_by_instance(&m.get("/", 40, &[]));
    assert_eq!(after.get("200 v2"), Some(&40), "{after:?}");
}

#[test]
fn header_match_rewrite_and_the_seed_canary() {
    // The seed's canary, as written in Istio's docs (prefix match, rewrite, 50/50, a default).
    let routing = format!(
        r#"{}---
kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews]
  http:
  - name: jason
    match:
    - headers: {{end-user: {{exact: jason}}}}
    route: [{{destination: {{host: reviews, subset: v2}}}}]
  - name: "reviews-v1-v2-canary-routes"
    match:
    - uri:
        prefix: "/wpcatalog"
    - uri:
        prefix: "/consumercatalog"
    rewrite:
      uri: "/newcatalog"
    route:
    - destination:
        host: reviews.{NS}.svc.cluster.local
        subset: v2
      weight: 50
    - destination:
        host: reviews.{NS}.svc.cluster.local
        subset: v1
      weight: 50
  - name: authority
    match: [{{uri: {{prefix: /host}}}}]
    rewrite: {{authority: reviews.internal}}
    route: [{{destination: {{host: reviews, subset: v1}}}}]
  - name: "reviews-v1-route"
    route:
    - destination:
        host: reviews
        subset: v1
"#,
        subsets()
    );
    let Some(m) = mesh(
        "header_match_rewrite_and_the_seed_canary",
        TWO_VERSIONS,
        &routing,
    ) else {
        return;
    };
    let jason = count_by_instance(&m.get("/", 20, &[("end-user", "jason")]));
    assert_eq!(jason.get("200 v2"), Some(&20), "{jason:?}");
    let others = count_by_instance(&m.get("/", 20, &[("end-user", "mallory")]));
    assert_eq!(others.get("200 v1"), Some(&20), "{others:?}");
    // The app sees the rewritten path, from both versions.
    let canary = m.get("/wpcatalog/item/7", 60, &[]);
    assert!(
        canary
            .iter()
            .all(|r| r.code == 200 && r.field("path") == Some("/newcatalog/item/7")),
        "{canary:?}"
    );
    let split = count_by_instance(&canary);
    assert!(
        split.len() == 2 && split.values().all(|n| *n >= 10),
        "{split:?}"
    );
    let other = m.get("/consumercatalog", 1, &[]);
    assert_eq!(other[0].field("path"), Some("/newcatalog"), "{other:?}");
    let host = m.get("/host", 1, &[("x-echo", "host")]);
    assert_eq!(host[0].field("host"), Some("reviews.internal"), "{host:?}");
}

#[test]
fn redirect_and_direct_response() {
    let routing = format!(
        r#"kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews]
  http:
  - match: [{{uri: {{exact: /old}}}}]
    redirect: {{uri: /new, authority: elsewhere.example, redirectCode: 308}}
  - match: [{{uri: {{regex: "/tea/[0-9]+"}}}}]
    directResponse: {{status: 418, body: {{string: "short and stout"}}}}
  - route: [{{destination: {{host: reviews}}}}]
"#
    );
    let Some(m) = mesh("redirect_and_direct_response", &TWO_VERSIONS[..1], &routing) else {
        return;
    };
    let r = &m.get("/old", 1, &[])[0];
    assert_eq!(r.code, 308, "{r:?}");
    assert_eq!(
        r.location.as_deref(),
        Some("http://elsewhere.example/new"),
        "{r:?}"
    );
    let r = &m.get("/tea/42", 1, &[])[0];
    assert_eq!((r.code, r.body.as_str()), (418, "short and stout"), "{r:?}");
    assert!(
        !m.app_log("v1").contains("/tea/42"),
        "a direct response reached the app"
    );
    assert_eq!(m.get("/tea/x", 1, &[])[0].code, 200);
}

#[test]
fn timeout_and_retries() {
    let routing = format!(
        r#"kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews]
  http:
  - match: [{{uri: {{prefix: /sleep}}}}]
    timeout: 500ms
    route: [{{destination: {{host: reviews}}}}]
  - match: [{{uri: {{prefix: /flaky}}, headers: {{x-retry: {{exact: "no"}}}}}}]
    retries: {{attempts: 0}}
    route: [{{destination: {{host: reviews}}}}]
  - match: [{{uri: {{prefix: /flaky}}}}]
    retries: {{attempts: 3, retryOn: "5xx", perTryTimeout: 2s}}
    route: [{{destination: {{host: reviews}}}}]
  - route: [{{destination: {{host: reviews}}}}]
"#
    );
    let Some(m) = mesh("timeout_and_retries", &TWO_VERSIONS[..1], &routing) else {
        return;
    };
    let r = &m.get("/sleep/3000", 1, &[])[0];
    assert_eq!(r.code, 504, "{r:?}");
    assert!(
        (0.4..2.5).contains(&r.secs),
        "504 after {}s, timeout 500ms",
        r.secs
    );
    // The app fails every other request: retried, every request succeeds.
    let retried = m.get("/flaky", 10, &[]);
    assert!(
        retried.iter().all(|r| r.code == 200),
        "{:?}",
        count_by_instance(&retried)
    );
    // With retries off, half of them fail.
    let bare = count_by_instance(&m.get("/flaky", 10, &[("x-retry", "no")]));
    assert_eq!(bare.get("503 v1"), Some(&5), "{bare:?}");
}

#[test]
fn fault_delay_and_abort() {
    let routing = format!(
        r#"kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews]
  http:
  - match: [{{uri: {{prefix: /abort}}}}]
    fault: {{abort: {{httpStatus: 418, percentage: {{value: 100}}}}}}
    route: [{{destination: {{host: reviews}}}}]
  - match: [{{uri: {{prefix: /half}}}}]
    fault: {{abort: {{httpStatus: 503, percentage: {{value: 50}}}}}}
    retries: {{attempts: 0}}
    route: [{{destination: {{host: reviews}}}}]
  - match: [{{uri: {{prefix: /delay}}}}]
    fault: {{delay: {{fixedDelay: 1s, percentage: {{value: 100}}}}}}
    route: [{{destination: {{host: reviews}}}}]
  - route: [{{destination: {{host: reviews}}}}]
"#
    );
    let Some(m) = mesh("fault_delay_and_abort", &TWO_VERSIONS[..1], &routing) else {
        return;
    };
    let aborted = m.get("/abort", 5, &[]);
    assert!(aborted.iter().all(|r| r.code == 418), "{aborted:?}");
    assert!(
        !m.app_log("v1").contains("/abort"),
        "an aborted request reached the app"
    );
    let half = count_by_instance(&m.get("/half", 200, &[]));
    let failed = half.get("503 ").copied().unwrap_or(0);
    // Binomial(200, 0.5): 60..=140 is beyond 5.6 sd either way.
    assert!((60..=140).contains(&failed), "{half:?}");
    let delayed = &m.get("/delay", 1, &[])[0];
    assert_eq!(delayed.code, 200);
    assert!(delayed.secs >= 0.95, "a 1s delay took {}s", delayed.secs);
    let quick = &m.get("/", 1, &[])[0];
    assert!(
        quick.secs < 0.9,
        "an undelayed request took {}s",
        quick.secs
    );
}

#[test]
fn mirror_sends_a_copy() {
    let routing = format!(
        r#"kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews]
  http:
  - route: [{{destination: {{host: reviews}}}}]
    mirror: {{host: mirror}}
    mirrorPercentage: {{value: 100}}
"#
    );
    let backends: &[Backend] = &[
        ("v1", "app: reviews, version: v1", &[]),
        ("shadow", "app: mirror", &[]),
    ];
    let Some(m) = mesh("mirror_sends_a_copy", backends, &routing) else {
        return;
    };
    let r = &m.get("/copy-me", 1, &[])[0];
    assert_eq!((r.code, r.instance()), (200, "v1"), "{r:?}");
    assert!(
        wait_until(Duration::from_secs(5), || m
            .app_log("shadow")
            .contains("/copy-me")),
        "the mirror never saw the request\n{}",
        m.net.logs()
    );
}

#[test]
fn consistent_hash_and_outlier_detection() {
    let routing = format!(
        r#"kind: DestinationRule
metadata: {{name: reviews, namespace: {NS}}}
spec:
  host: reviews
  trafficPolicy:
    loadBalancer: {{consistentHash: {{httpHeaderName: x-user}}}}
---
kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews]
  http:
  - route: [{{destination: {{host: reviews}}}}]
    retries: {{attempts: 0}}
"#
    );
    let Some(m) = mesh(
        "consistent_hash_and_outlier_detection",
        TWO_VERSIONS,
        &routing,
    ) else {
        return;
    };
    let mut seen = std::collections::BTreeSet::new();
    for user in ["ann", "bob", "cy", "dee", "eve", "fay", "gus", "hal"] {
        let by = count_by_instance(&m.get("/", 12, &[("x-user", user)]));
        assert_eq!(by.len(), 1, "user {user} was not sticky: {by:?}");
        seen.extend(by.into_keys());
    }
    // Eight users over two backends: both used (all on one has probability 2^-7).
    assert_eq!(seen.len(), 2, "{seen:?}");

    // Outlier detection: a backend that fails every request is ejected.
    let failing: &[Backend] = &[
        ("v1", "app: reviews, version: v1", &[]),
        ("bad", "app: reviews, version: v2", &[("FAIL", "1")]),
    ];
    let routing = format!(
        r#"kind: DestinationRule
metadata: {{name: reviews, namespace: {NS}}}
spec:
  host: reviews
  trafficPolicy:
    loadBalancer: {{simple: ROUND_ROBIN}}
    outlierDetection: {{consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 60s, maxEjectionPercent: 100}}
---
kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews]
  http:
  - route: [{{destination: {{host: reviews}}}}]
    retries: {{attempts: 0}}
"#
    );
    drop(m);
    let Some(m) = mesh("consistent_hash_and_outlier_detection", failing, &routing) else {
        return;
    };
    // The first request to reach the failing backend (this batch's, or the readiness check's
    // before it) ejects it.
    let first = count_by_instance(&m.get("/", 10, &[]));
    assert!(
        m.app_log("bad").contains("GET /"),
        "the failing backend was never tried: {first:?}"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let later = count_by_instance(&m.get("/", 20, &[]));
    assert_eq!(later.get("200 v1"), Some(&20), "not ejected: {later:?}");
    assert!(m.client().envoy_stat(&format!("cluster.outbound|{PORT}||reviews.{NS}.svc.cluster.local.outlier_detection.ejections_enforced_total")).unwrap() >= 1);
}

#[test]
fn connection_pool_overflow_is_a_503_uo() {
    let routing = format!(
        r#"kind: DestinationRule
metadata: {{name: reviews, namespace: {NS}}}
spec:
  host: reviews
  trafficPolicy:
    connectionPool:
      tcp: {{maxConnections: 1}}
      http: {{http1MaxPendingRequests: 1, maxRequestsPerConnection: 1}}
---
kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews]
  http:
  - route: [{{destination: {{host: reviews}}}}]
    retries: {{attempts: 0}}
"#
    );
    let Some(m) = mesh(
        "connection_pool_overflow_is_a_503_uo",
        &TWO_VERSIONS[..1],
        &routing,
    ) else {
        return;
    };
    let started = Instant::now();
    let replies = m.send(&format!("http://{VIP}:{PORT}/sleep/1000"), 8, &[], 8);
    let overflowed: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.code == 503 && r.overloaded)
        .collect();
    assert!(!overflowed.is_empty(), "no request overflowed: {replies:?}");
    assert!(replies.iter().any(|r| r.code == 200), "{replies:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
    let stat = format!(
        "cluster.outbound|{PORT}||reviews.{NS}.svc.cluster.local.upstream_rq_pending_overflow"
    );
    assert!(m.client().envoy_stat(&stat).unwrap() >= 1);
}

/// A connection pool added by editing the DestinationRule of a running mesh applies: the edit
/// changes the cluster and not its endpoints, and Envoy finishes warming an updated cluster
/// only once the endpoints are sent again (over Delta xDS, which istiod-core must re-send even
/// unchanged). Before that fix the new cluster stayed warming and the old one kept serving.
#[test]
fn a_connection_pool_added_by_an_edit_applies() {
    let routing = |pool: &str, timeout: u32| {
        format!(
            r#"kind: DestinationRule
metadata: {{name: reviews, namespace: {NS}}}
spec:
  host: reviews
{pool}---
kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews]
  http:
  - route: [{{destination: {{host: reviews}}}}]
    retries: {{attempts: 0}}
    timeout: {timeout}s
"#
        )
    };
    let Some(m) = mesh(
        "a_connection_pool_added_by_an_edit_applies",
        &TWO_VERSIONS[..1],
        &routing("", 30),
    ) else {
        return;
    };
    let url = format!("http://{VIP}:{PORT}/sleep/1000");
    let before = m.send(&url, 8, &[], 8);
    assert!(before.iter().all(|r| r.code == 200), "{before:?}");

    let cds = "cluster_manager.cds.update_success";
    let updates = m.client().envoy_stat(cds).unwrap();
    let pool = "  trafficPolicy:
    connectionPool:
      tcp: {maxConnections: 1}
      http: {http1MaxPendingRequests: 1, maxRequestsPerConnection: 1}
";
    m.edit_routing(&routing(pool, 31));
    assert!(
        wait_until(Duration::from_secs(20), || {
            m.client().envoy_stat(cds).unwrap_or(0) > updates
        }),
        "the DestinationRule edit never reached the client's CDS"
    );
    let warming = "cluster_manager.warming_clusters";
    assert!(
        wait_until(Duration::from_secs(10), || {
            m.client().envoy_stat(warming).ok() == Some(0)
        }),
        "the edited cluster stays warming: {} warming",
        m.client().envoy_stat(warming).unwrap_or(0)
    );
    let after = m.send(&url, 8, &[], 8);
    assert!(
        after.iter().any(|r| r.code == 503 && r.overloaded),
        "the new connection pool does not apply: {after:?}"
    );
}

#[test]
fn tcp_weighted_route() {
    let routing = format!(
        r#"kind: VirtualService
metadata: {{name: lines, namespace: {NS}}}
spec:
  hosts: [lines]
  tcp:
  - route:
    - {{destination: {{host: lines, subset: v1}}, weight: 25}}
    - {{destination: {{host: lines, subset: v2}}, weight: 75}}
"#
    );
    let Some(m) = mesh("tcp_weighted_route", TWO_VERSIONS, &routing) else {
        return;
    };
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..80 {
        *counts.entry(m.tcp_line()).or_insert(0) += 1;
    }
    let v2 = counts.get("v2").copied().unwrap_or(0);
    assert_eq!(
        counts.get("v1").copied().unwrap_or(0) + v2,
        80,
        "{counts:?}"
    );
    // Binomial(80, 0.75): mean 60, sd 3.9; 44..=76 is beyond 4 sd either way.
    assert!((44..=76).contains(&v2), "{counts:?}");
}

/// A client and one server outside the mesh (`ext`, no sidecar) whose dnsmasq answers
/// `*.external.test` with its own address; the client resolves through it. `app_env` is the
/// server app's env (TLS files).
fn external_mesh(
    test: &str,
    routing: &str,
    app_env: &'static [(&'static str, &'static str)],
    extra: impl FnOnce(&mut Network),
) -> Option<Mesh> {
    let outside: &[Backend] = &[("ext", "", app_env)];
    mesh_with(test, outside, routing, |net| {
        let ext_ip = net.pods[1].ip.to_string();
        assert!(net.pods[1].spawn_dnsmasq(&[&format!("/external.test/{ext_ip}")]));
        net.pods[CLIENT_POD]
            .set_resolv_conf(&format!("nameserver {ext_ip}\n"))
            .unwrap();
        extra(net);
    })
}

#[test]
fn dns_service_entry_reaches_a_server_outside_the_mesh() {
    let routing = format!(
        r#"kind: ServiceEntry
metadata: {{name: external-api, namespace: {NS}}}
spec:
  hosts: [api.external.test]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{{number: {PORT}, name: http, protocol: HTTP}}]
---
kind: VirtualService
metadata: {{name: external-api, namespace: {NS}}}
spec:
  hosts: [api.external.test]
  http:
  - route: [{{destination: {{host: api.external.test}}}}]
    headers: {{request: {{set: {{x-routed: by-mesh}}}}}}
"#
    );
    let test = "dns_service_entry_reaches_a_server_outside_the_mesh";
    let Some(m) = external_mesh(test, &routing, &[], |_| {}) else {
        return;
    };
    let replies = m.send(
        &format!("http://api.external.test:{PORT}/hello"),
        3,
        &[("x-echo", "x-routed")],
        1,
    );
    assert!(
        replies.iter().all(|r| r.code == 200
            && r.instance() == "ext"
            && r.field("x-routed") == Some("by-mesh")),
        "{replies:?}\n{}",
        m.net.logs()
    );
    // Through the STRICT_DNS cluster Envoy resolved itself, not a passthrough.
    let stat = format!("cluster.outbound|{PORT}||api.external.test.upstream_rq_2xx");
    assert!(
        m.client().envoy_stat(&stat).unwrap() >= 3,
        "{}",
        m.net.logs()
    );
}

/// A CA and a server certificate for `secure.external.test`, written as PEM files: (ca,
/// cert, key).
fn server_certs(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    let (ca, issuer) = mesh::test_ca("traffic-e2e test CA");
    let (cert, key) = mesh::leaf_cert(&issuer, "secure.external.test");
    std::fs::create_dir_all(dir).unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server-key.pem"),
    );
    std::fs::write(&paths.0, ca).unwrap();
    harness::write_readable(&paths.1, cert).unwrap();
    harness::write_readable(&paths.2, key).unwrap();
    (paths.0, paths.1, paths.2)
}

#[test]
fn tls_origination_to_an_https_server() {
    let test = "tls_origination_to_an_https_server";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    // The certificates live where both sides can read them: the server's under a shared
    // directory, the CA where the client agent's SDS may serve files from (./etc/certs of
    // its working directory, the pod directory).
    let shared = std::env::temp_dir().join(format!("tls-origination-{}", std::process::id()));
    let (ca, cert, key) = server_certs(&shared);
    let env: &'static [(&'static str, &'static str)] = Box::leak(Box::new([
        (
            "TLS_CERT",
            &*Box::leak(cert.display().to_string().into_boxed_str()),
        ),
        (
            "TLS_KEY",
            &*Box::leak(key.display().to_string().into_boxed_str()),
        ),
    ]));
    let routing_for = |ca_path: &str| {
        format!(
            r#"kind: ServiceEntry
metadata: {{name: secure, namespace: {NS}}}
spec:
  hosts: [secure.external.test]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{{number: {PORT}, name: http, protocol: HTTP}}]
---
kind: DestinationRule
metadata: {{name: secure, namespace: {NS}}}
spec:
  host: secure.external.test
  trafficPolicy:
    tls: {{mode: SIMPLE, caCertificates: {ca_path}, sni: secure.external.test, subjectAltNames: [secure.external.test]}}
"#
        )
    };
    // The client agent's SDS serves files from ./etc/certs of its working directory (the pod
    // directory): the CA goes there before the sidecars start.
    let Some(m) = external_mesh(test, "", env, |net| {
        let certs_dir = net.pods[CLIENT_POD].dir.join("etc/certs");
        std::fs::create_dir_all(&certs_dir).unwrap();
        let client_ca = certs_dir.join("ca.pem");
        std::fs::copy(&ca, &client_ca).unwrap();
        std::fs::write(
            net.dir().join("mesh/routing.yaml"),
            routing_for(&client_ca.display().to_string()),
        )
        .unwrap();
    }) else {
        return;
    };
    let url = format!("http://secure.external.test:{PORT}/over-tls");
    let last = m.send(&url, 3, &[], 1);
    assert!(
        last.iter().all(|r| r.code == 200 && r.instance() == "ext"),
        "{last:?}\n{}",
        m.net.logs()
    );
    assert!(m.app_log("ext").contains("/over-tls"));
    let stat = format!("cluster.outbound|{PORT}||secure.external.test.ssl.handshake");
    assert!(
        m.client().envoy_stat(&stat).unwrap() >= 1,
        "{}",
        m.net.logs()
    );
    let _ = std::fs::remove_dir_all(&shared);
}

/// Reads one HTTPS answer with SNI `host`: `verify` checks the server against `ca`.
const TLS_CLIENT: &str = r#"
import socket, ssl, sys
host, ca, verify = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
ctx = ssl.create_default_context(cafile=ca) if verify else ssl._create_unverified_context()
s = ctx.wrap_socket(socket.create_connection((host, 8443), 5), server_hostname=host)
s.sendall(f"GET /sni HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
print(data.decode().splitlines()[-1])
"#;

#[test]
fn tls_routes_by_sni_to_servers_without_a_vip() {
    let test = "tls_routes_by_sni_to_servers_without_a_vip";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let shared = std::env::temp_dir().join(format!("tls-sni-{}", std::process::id()));
    let (ca, cert, key) = server_certs(&shared);
    let env: &'static [(&'static str, &'static str)] = Box::leak(Box::new([
        (
            "TLS_CERT",
            &*Box::leak(cert.display().to_string().into_boxed_str()),
        ),
        (
            "TLS_KEY",
            &*Box::leak(key.display().to_string().into_boxed_str()),
        ),
    ]));
    // Two TLS services without addresses on one port (8443, served by the app's 8000): the
    // listener tells them apart by SNI; `alias` has a VirtualService sending its SNI to `secure`.
    let routing = format!(
        r#"kind: ServiceEntry
metadata: {{name: secure, namespace: {NS}}}
spec:
  hosts: [secure.external.test]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{{number: 8443, name: tls, protocol: TLS, targetPort: {PORT}}}]
---
kind: ServiceEntry
metadata: {{name: alias, namespace: {NS}}}
spec:
  hosts: [alias.external.test]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{{number: 8443, name: tls, protocol: TLS, targetPort: {PORT}}}]
---
kind: VirtualService
metadata: {{name: alias, namespace: {NS}}}
spec:
  hosts: [alias.external.test]
  tls:
  - match: [{{sniHosts: [alias.external.test]}}]
    route: [{{destination: {{host: secure.external.test}}}}]
"#
    );
    let Some(m) = external_mesh(test, &routing, env, |_| {}) else {
        return;
    };
    let script = m.net.dir().join("tls_client.py");
    std::fs::write(&script, TLS_CLIENT).unwrap();
    let call = |host: &str, verify: &str| {
        let out = m.python(&[script.to_str().unwrap(), host, ca.to_str().unwrap(), verify]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    };
    let via = |host: &str| {
        m.client()
            .envoy_stat(&format!("cluster.outbound|8443||{host}.upstream_cx_total"))
            .unwrap_or(0)
    };
    // The DNS clusters resolve their names once Envoy has them: wait for the first answer.
    let answered = wait_until(Duration::from_secs(15), || {
        call("secure.external.test", "1") == "instance=ext path=/sni"
    });
    assert!(
        answered,
        "{}\n{}",
        call("secure.external.test", "1"),
        m.net.logs()
    );
    // Through `secure`'s cluster, not a passthrough.
    let before = via("secure.external.test");
    assert!(before >= 1, "{}", m.net.logs());
    // The alias's SNI goes to `secure` by its TLS route.
    let aliased = call("alias.external.test", "0");
    assert_eq!(aliased, "instance=ext path=/sni", "{}", m.net.logs());
    assert_eq!(via("secure.external.test"), before + 1, "{}", m.net.logs());
    assert_eq!(via("alias.external.test"), 0);
    let _ = std::fs::remove_dir_all(&shared);
}

#[test]
fn cors_preflight_is_answered_by_the_route_policy() {
    let routing = format!(
        r#"kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews]
  http:
  - route: [{{destination: {{host: reviews}}}}]
    corsPolicy:
      allowOrigins: [{{exact: "https://a.example"}}]
      allowMethods: [GET, POST]
      maxAge: 1h
"#
    );
    let Some(m) = mesh(
        "cors_preflight_is_answered_by_the_route_policy",
        &TWO_VERSIONS[..1],
        &routing,
    ) else {
        return;
    };
    let preflight = |origin: &str| {
        let out = m
            .client()
            .exec_as(
                APP_UID,
                APP_UID,
                &[
                    "curl",
                    "-s",
                    "-i",
                    "--max-time",
                    "5",
                    "-X",
                    "OPTIONS",
                    "-H",
                    &format!("Origin: {origin}"),
                    "-H",
                    "Access-Control-Request-Method: GET",
                    &format!("http://{VIP}:{PORT}/"),
                ],
            )
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_ascii_lowercase()
    };
    let allowed = preflight("https://a.example");
    assert!(
        allowed.contains("access-control-allow-origin: https://a.example")
            && allowed.contains("access-control-max-age: 3600"),
        "{allowed}\n{}",
        m.net.logs()
    );
    let refused = preflight("https://evil.example");
    assert!(
        !refused.contains("access-control-allow-origin"),
        "{refused}"
    );
}

#[test]
fn a_delegate_virtual_service_routes_under_its_root() {
    let routing = format!(
        r#"{}---
kind: VirtualService
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews]
  http:
  - match: [{{uri: {{prefix: /v2}}}}]
    delegate: {{name: reviews-v2, namespace: {NS}}}
  - route: [{{destination: {{host: reviews, subset: v1}}}}]
---
kind: VirtualService
metadata: {{name: reviews-v2, namespace: {NS}}}
spec:
  http:
  - match: [{{uri: {{prefix: /v2/special}}}}]
    rewrite: {{uri: /special}}
    route: [{{destination: {{host: reviews, subset: v2}}}}]
  - route: [{{destination: {{host: reviews, subset: v2}}}}]
"#,
        subsets()
    );
    let Some(m) = mesh(
        "a_delegate_virtual_service_routes_under_its_root",
        TWO_VERSIONS,
        &routing,
    ) else {
        return;
    };
    let one = |path: &str| m.get(path, 1, &[]).remove(0);
    let special = one("/v2/special/x");
    assert_eq!(
        (special.code, special.instance(), special.field("path")),
        (200, "v2", Some("/special/x")),
        "{special:?}\n{}",
        m.net.logs()
    );
    let other = one("/v2/other");
    assert_eq!((other.code, other.instance()), (200, "v2"), "{other:?}");
    let rest = one("/elsewhere");
    assert_eq!((rest.code, rest.instance()), (200, "v1"), "{rest:?}");
}
